"""Run the replay protocol for several policies and seeds and write the results.

``run_simulation`` reads an openb node and pod list, derives the typical
pods from the trace, replays every (policy, seed) pair with the published
protocol (``prepare_workload`` then ``replay``), and writes
``summary.json`` (one object per policy) and ``allocation.png`` into the
output directory.  Runs can be spread over processes with ``jobs``.  The
baselines are deterministic per seed, whatever ``jobs`` is.  CP-SAT is not
quite: its workers race, and its solves stop at a wall-clock limit, so a busy
machine (more jobs than cores, say) may end a search elsewhere; runs of one
seed differ by a few tenths of a point (``solver.workers: 1`` narrows it).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gpusched.model import Cluster, Pod
from gpusched.model.pod import model_key
from gpusched.sim.engine import RunResult, replay
from gpusched.sim.protocol import prepare_workload
from gpusched.sim.report import group_by_policy, plot_allocation, summarize
from gpusched.sim.trace import TraceError, csv_rows, read_nodes, read_pods
from gpusched.solver.fragmentation import TypicalPods, typical_from
from gpusched.solver.params import SolverParams
from gpusched.solver.registry import POLICIES, make_policy

__all__ = [
    "TYPICAL_SOURCES",
    "SimulationError",
    "load_published",
    "normalize_policies",
    "run_simulation",
    "trace_name",
]

log = structlog.get_logger(__name__)

SUMMARY_FILE = "summary.json"
PLOT_FILE = "allocation.png"
TYPICAL_SOURCES = ("online", "trace")
"""Where CP-SAT's typical pods come from in a replay (``run_simulation(typical_source=...)``)."""
PUBLISHED_COLUMNS = ("trace", "policy", "alloc_pct_at_arrival130")
_TRACE_FILE = re.compile(r"^openb_pod_list_(?P<trace>[A-Za-z0-9_.-]+)\.csv$")


class SimulationError(ValueError):
    """Inputs the simulation cannot run with; the message says what to change."""


def normalize_policies(policies: Iterable[str]) -> list[str]:
    """Lower-cased, de-duplicated policy names in the given order; unknown names are rejected."""
    names: list[str] = []
    for raw in policies:
        name = raw.strip().lower()
        if not name:
            continue
        if name not in POLICIES:
            raise SimulationError(f"unknown policy {raw.strip()!r}; choose from {', '.join(POLICIES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise SimulationError(f"no policy given; choose from {', '.join(POLICIES)}")
    return names


def trace_name(pods_csv: str | Path) -> str | None:
    """``default`` for ``openb_pod_list_default.csv``; ``None`` for any other file name."""
    m = _TRACE_FILE.match(Path(pods_csv).name)
    return m.group("trace") if m else None


def load_published(path: str | Path) -> dict[tuple[str, str], float]:
    """Published allocation at 130% arrival, keyed by (trace, lower-case policy name).

    The file has at least the columns ``trace,policy,alloc_pct_at_arrival130``, read by the trace
    files' reader (``csv_rows``); what cannot be read raises ``TraceError`` with file and line.
    """
    p = Path(path)
    out: dict[tuple[str, str], float] = {}
    for line, row in csv_rows(p, PUBLISHED_COLUMNS):
        for column in ("trace", "policy"):
            if not row[column]:
                raise TraceError(p, line, column, f"empty; name the {column}")
        text = row["alloc_pct_at_arrival130"]
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise TraceError(p, line, "alloc_pct_at_arrival130", f"expected a number, got {text!r}")
        out[(row["trace"], row["policy"].lower())] = value
    return out


@dataclass(frozen=True, slots=True)
class _Task:
    index: int
    nodes_csv: str
    pods_csv: str
    policy: str
    seed: int
    batch: int
    tune: float
    params: SolverParams | None
    learn_typical: bool


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=4)
def _load_stamped(
    nodes_csv: str, _nodes_stamp: object, pods_csv: str, _pods_stamp: object
) -> tuple[Cluster, tuple[Pod, ...], TypicalPods]:
    cluster = Cluster(read_nodes(nodes_csv))
    pods = tuple(read_pods(pods_csv))
    return cluster, pods, typical_from(pods)


def _load(nodes_csv: str, pods_csv: str) -> tuple[Cluster, tuple[Pod, ...], TypicalPods]:
    """The cluster, pods and typical pods of a trace, read once per process while the files are unchanged."""
    return _load_stamped(nodes_csv, _stamp(nodes_csv), pods_csv, _stamp(pods_csv))


def _workload(task: _Task) -> list[Pod]:
    cluster, pods, _ = _load(task.nodes_csv, task.pods_csv)
    return prepare_workload(pods, cluster.total_gpus, seed=task.seed, tune=task.tune)


def _run(task: _Task, on_batch: Callable[[int], None] | None) -> tuple[int, RunResult, float]:
    cluster, _, typical = _load(task.nodes_csv, task.pods_csv)
    workload = _workload(task)
    policy = make_policy(task.policy, cluster, typical, task.seed, task.params, learn_typical=task.learn_typical)
    start = time.perf_counter()
    result = replay(cluster, workload, policy, batch=task.batch, typical=typical, seed=task.seed, on_batch=on_batch)
    return task.index, result, time.perf_counter() - start


_progress_queue: Any = None
"""In a worker process: where placed-pod counts are reported (set by ``_init_worker``)."""

_FLUSH_PODS = 64


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue  # noqa: PLW0603 -- the per-process channel a Pool initializer sets up
    _progress_queue = progress_queue
    # Ctrl-C reaches the whole process group; the parent alone answers it, by ending the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while worker processes are started, so that they are born ignoring it
    (a Ctrl-C while they import would otherwise end each with a traceback of its own); from
    the main thread only, the one signal handlers can be set in."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def _run_in_worker(task: _Task) -> tuple[int, RunResult, float]:
    pending = 0

    def report(n: int) -> None:
        nonlocal pending
        pending += n
        if pending >= _FLUSH_PODS:
            _progress_queue.put(pending)
            pending = 0

    out = _run(task, report)
    if pending:
        _progress_queue.put(pending)
    return out


def _progress(enabled: bool) -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pods"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
    )


def _execute(tasks: Sequence[_Task], total_pods: int, jobs: int, progress: bool) -> list[tuple[int, RunResult, float]]:
    done: list[tuple[int, RunResult, float]] = []

    def finished(item: tuple[int, RunResult, float]) -> None:
        _, r, seconds = item
        done.append(item)
        extra: dict[str, Any] = {}
        if r.extended:
            extra = {
                "mig_util_pct": None if r.mig_util_pct is None else round(r.mig_util_pct, 2),
                "island_violations": r.island_violations,
                "gangs_placed": r.gangs_placed,
                "gangs_rejected": r.gangs_rejected,
                "gangs_partial": r.gangs_partial,
            }
        log.info(
            "run.done",
            policy=r.policy,
            seed=r.seed,
            batch=r.batch,
            alloc_pct_130=r.alloc_at(130),
            failed=r.failed,
            seconds=round(seconds, 3),
            run=f"{len(done)}/{len(tasks)}",
            **extra,
        )

    with _progress(progress) as bar:
        bar_id = bar.add_task("replaying", total=total_pods)
        if jobs <= 1 or len(tasks) <= 1:
            for task in tasks:
                bar.update(bar_id, description=f"{task.policy} seed {task.seed}")
                finished(_run(task, lambda n: bar.advance(bar_id, n)))
        else:
            ctx = multiprocessing.get_context("spawn")
            counts = ctx.Queue()
            with _sigint_ignored():
                pool = ctx.Pool(min(jobs, len(tasks)), initializer=_init_worker, initargs=(counts,))
            with pool:  # on the way out, Ctrl-C's KeyboardInterrupt too, the workers are terminated
                bar.update(bar_id, description=f"{len(tasks)} runs on {min(jobs, len(tasks))} processes")
                handles = [pool.apply_async(_run_in_worker, (task,)) for task in tasks]
                waiting = list(handles)
                while waiting:
                    with contextlib.suppress(queue.Empty):
                        bar.advance(bar_id, counts.get(timeout=0.1))
                    still: list[Any] = []
                    for h in waiting:
                        if h.ready():
                            finished(h.get())
                        else:
                            still.append(h)
                    waiting = still
            counts.close()
        bar.update(bar_id, completed=total_pods)
    return sorted(done, key=lambda item: item[0])


def run_simulation(
    nodes_csv: str | Path,
    pods_csv: str | Path,
    policies: Sequence[str],
    batch: int,
    seeds: Sequence[int],
    tune: float,
    out_dir: str | Path,
    params: SolverParams | None = None,
    progress: bool = True,
    jobs: int = 1,
    *,
    published: str | Path | None = None,
    trace: str | None = None,
    typical_source: str = "online",
) -> list[dict[str, Any]]:
    """Replay every policy with every seed; write ``summary.json`` and ``allocation.png``.

    ``trace`` names the workload in the summaries (default: ``<trace>`` of an
    ``openb_pod_list_<trace>.csv`` file name).  With ``published`` (a CSV of
    ``trace,policy,alloc_pct_at_arrival130``) each summary also carries the
    FGD paper's allocation for that trace and policy, when it lists one; without a trace
    name ``published`` is refused, since nothing could be matched.
    ``typical_source`` is where CP-SAT's typical pods come from: ``online``, learnt from the
    pods placed so far (as the daemon learns them), or ``trace``, the whole trace's, which is
    what FGD is given in the published protocol.
    Returns the summaries, one per policy, in the order given.
    """
    names = normalize_policies(policies)
    if batch < 1:
        raise SimulationError(f"batch must be at least 1, got {batch}")
    if jobs < 1:
        raise SimulationError(f"jobs must be at least 1, got {jobs}")
    cores = os.cpu_count() or 1
    if jobs > cores:
        log.warning(
            "more jobs than cores: solve times, and CP-SAT's time-limited searches, suffer",
            jobs=jobs,
            cores=cores,
            fix=f"--jobs {cores} or fewer",
        )
    if not tune > 0:
        raise SimulationError(f"tune must be positive, got {tune}")
    if typical_source not in TYPICAL_SOURCES:
        raise SimulationError(f"typical pods come from one of {', '.join(TYPICAL_SOURCES)}, got {typical_source!r}")
    seed_list = list(dict.fromkeys(seeds))
    if not seed_list:
        raise SimulationError("no seed given")
    trace = trace if trace is not None else trace_name(pods_csv)
    if published is not None and trace is None:
        raise SimulationError(
            f"{pods_csv}: published results are matched by trace name, which comes from a pod list "
            f"named openb_pod_list_<trace>.csv; rename the file that way or leave out the published results"
        )
    table = load_published(published) if published is not None else {}
    nodes_path, pods_path = str(Path(nodes_csv)), str(Path(pods_csv))

    cluster, pods, typical = _load(nodes_path, pods_path)
    if cluster.total_gpus == 0:
        raise SimulationError(
            f"{nodes_csv}: no node has GPUs outside MIG mode, so there is no GPU capacity to measure allocation against"
        )
    models = {n.gpu_model for n in cluster.nodes}
    keys = {model_key(m) for m in models if m}
    stranded = [p for p in pods if p.gpu_models and not {model_key(m) for m in p.gpu_models} & keys]
    if stranded:  # a typo (names are compared in any case, with or without the maker's prefix)
        log.warning(
            "pods accept only GPU models no node has; they will all fail",
            pods=len(stranded),
            models=sorted({m for p in stranded for m in p.gpu_models})[:5],
            nodes_have=sorted(m for m in models if m)[:8],
        )
    tasks = [
        _Task(i, nodes_path, pods_path, name, seed, batch, tune, params, typical_source == "online")
        for i, (name, seed) in enumerate((n, s) for n in names for s in seed_list)
    ]
    try:
        total_pods = sum(len(_workload(t)) for t in tasks)
    except ValueError as exc:
        raise SimulationError(f"{pods_csv}: {exc}") from None
    log.info(
        "simulation.start",
        nodes=len(cluster),
        gpus=cluster.total_gpus,
        pods=len(pods),
        typical_shapes=len(typical),
        policies=names,
        seeds=seed_list,
        batch=batch,
        tune=tune,
        jobs=jobs,
        trace=trace,
    )
    start = time.perf_counter()
    results = [r for _, r, _ in _execute(tasks, total_pods, jobs, progress)]
    groups = group_by_policy(results)
    summaries = [
        summarize(
            groups[name],
            cluster.total_gpus,
            trace=trace,
            published_alloc_130=table.get((trace, name)) if trace is not None else None,
        )
        for name in names
    ]
    for s in summaries:
        if s["policy"] == "cpsat":
            s["typical"] = typical_source
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / SUMMARY_FILE).write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
        plot_allocation(
            results,
            out / PLOT_FILE,
            title=f"{trace or Path(pods_csv).name}: GPU allocation vs arrived demand "
            f"({cluster.total_gpus} GPUs, batch {batch}, {len(seed_list)} seeds)",
        )
    except OSError as exc:
        raise SimulationError(f"cannot write the results to {out}: {exc}") from None
    log.info("simulation.done", out=str(out), seconds=round(time.perf_counter() - start, 3))
    return summaries
