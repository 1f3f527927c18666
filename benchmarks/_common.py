"""Shared helpers for the benchmarks: where the public trace lives, synthetic clusters."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpusched.model import Cluster, ClusterState, Node, Pod
from gpusched.sim.trace import read_nodes, read_pods
from gpusched.solver.baselines import BestFitPolicy

REPO = Path(__file__).resolve().parent.parent
TRACE_DIR = Path(os.environ.get("GPUSCHED_TRACE_DIR", REPO.parent / "shared" / "data" / "alibaba-gpu-v2023" / "csv"))


def trace_path(name: str) -> Path:
    """A file of the Alibaba GPU trace v2023 (openb); GPUSCHED_TRACE_DIR overrides the folder."""
    path = TRACE_DIR / name
    if not path.exists():
        raise SystemExit(
            f"{path} not found: set GPUSCHED_TRACE_DIR to the folder holding the openb CSV files "
            "(cluster-trace-gpu-v2023/csv of github.com/alibaba/clusterdata)"
        )
    return path


def replicated_nodes(count: int) -> list[Node]:
    """``count`` GPU nodes drawn round-robin from the trace's 1,213-node mix."""
    base = read_nodes(trace_path("openb_node_list_gpu_node.csv"))
    return [replace(base[i % len(base)], name=f"node-{i:05d}") for i in range(count)]


def trace_pods(trace: str = "default") -> list[Pod]:
    """The pods of one trace."""
    return read_pods(trace_path(f"openb_pod_list_{trace}.csv"))


def partly_filled(cluster: Cluster, pods: list[Pod], fill: float, seed: int) -> ClusterState:
    """``cluster`` with random trace pods placed best-fit until ``fill`` of its GPUs are allocated."""
    rng = random.Random(seed)
    state = cluster.empty_state()
    policy = BestFitPolicy(seed)
    target = fill * cluster.total_gpus * 1000
    i = 0
    while state.gpu_allocated_milli < target:
        chunk = [replace(rng.choice(pods), name=f"fill-{i + k}") for k in range(256)]
        i += 256
        plan = policy.place(chunk, state)
        if not plan.assignments:
            break
        state = state.apply(plan.assignments)
    return state


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def emit(
    result: dict[str, Any], columns: list[tuple[str, str, str]], *, as_json: bool, out: Path | None = None
) -> None:
    """Print ``result`` as a one-row table, then (``as_json``) as one JSON line; ``out`` also gets the JSON.

    ``columns`` are (header, key, format spec), e.g. ``("p99 ms", "p99_ms", ">8")``; the header
    takes the spec's alignment and width.
    """
    head = []
    for title, _, spec in columns:
        align = spec[0] if spec[:1] in "<>^" else ">"
        width = "".join(ch for ch in spec.lstrip("<>^").split(".")[0] if ch.isdigit())
        head.append(f"{title:{align}{width}}")
    print(" ".join(head))
    print(" ".join(f"{result[key]:{spec}}" for _, key, spec in columns))
    save(result, as_json=as_json, out=out)


def output_args(ap: argparse.ArgumentParser) -> None:
    """``--json`` and ``--out``, as every benchmark takes them."""
    ap.add_argument("--json", action="store_true", help="print the JSON object last")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")


def report(result: dict[str, Any], table: Callable[[dict[str, Any]], str], args: argparse.Namespace) -> int:
    """Print ``table(result)``, then ``save`` it as ``--json`` and ``--out`` ask; the exit code."""
    print(table(result))
    save(result, as_json=args.json, out=args.out)
    return 0


def save(result: dict[str, Any], *, as_json: bool, out: Path | None = None) -> None:
    """Write ``result`` to ``out`` (indented) when given, and print it as one JSON line when ``as_json``."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        print(json.dumps(result))
