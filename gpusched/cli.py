"""The ``gpusched`` command line.

``gpusched simulate`` replays a trace through the placement policies, with
no arguments on the bundled demo cluster and workload; ``run`` is the scheduler
itself, ``explain`` says why a pod waits, ``report`` reports what GPUs cost.  Every
input problem is reported on one line with what to change, exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import ssl
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import structlog
from rich.console import Console

from gpusched import __version__, logs
from gpusched.config import (
    ConfigError,
    GpuschedConfig,
    load_config,
    read_yaml,
    read_yaml_documents,
)
from gpusched.entry import EXIT_INTERRUPTED
from gpusched.metrics.cost import render_report, report_json
from gpusched.metrics.source import DEFAULT_GPU_LABEL, DEFAULT_NODE_LABEL, default_query
from gpusched.sim.report import render_extended_table, render_table
from gpusched.sim.runner import (
    PLOT_FILE,
    SUMMARY_FILE,
    TYPICAL_SOURCES,
    SimulationError,
    normalize_policies,
    run_simulation,
)
from gpusched.sim.trace import TraceError
from gpusched.solver.params import SolverParams
from gpusched.solver.registry import POLICIES

if TYPE_CHECKING:
    from gpusched.kube.client import ApiError

__all__ = ["main", "parse_seeds"]

EXIT_USAGE = 2

DEMO_POLICIES = ("cpsat", "fgd", "bestfit")
DEMO_SEEDS = "42-43"
DEMO_BATCH = 16
DEMO_OUT = "gpusched-demo"
TRACE_OUT = "gpusched-sim"
MAX_SEEDS = 1000
MAX_SEED = 2**31 - 1
"""The largest seed: the solver takes a signed 32-bit one."""


class UsageError(Exception):
    """A bad command line; the message is one line that says how to fix it."""


class _Parser(argparse.ArgumentParser):
    """Reports errors on one line (``prog: error: ...; see prog --help``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,43`` or a mix (``42-45,50``) as a list of distinct seeds, in order."""
    seeds: list[int] = []
    known: set[int] = set()
    for item in text.split(","):
        part = item.strip()
        if not part:
            raise ValueError(f"empty item in {text!r}")
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range of seeds") from None
        if not 0 <= min(lo, hi) <= max(lo, hi) <= MAX_SEED:  # CP-SAT takes a 32-bit seed
            raise ValueError(f"{part!r}: seeds run from 0 to {MAX_SEED}")
        if lo > hi:
            raise ValueError(f"range {part!r} runs backwards; write {hi}-{lo}")
        if hi - lo + 1 > MAX_SEEDS:
            raise ValueError(f"more than {MAX_SEEDS} seeds")
        fresh = [s for s in range(lo, hi + 1) if s not in known]
        seeds.extend(fresh)
        known.update(fresh)
        if len(seeds) > MAX_SEEDS:
            raise ValueError(f"more than {MAX_SEEDS} seeds")
    return seeds


def _seeds_arg(text: str) -> list[int]:
    try:
        return parse_seeds(text)
    except ValueError as exc:
        hint = "" if "; write " in str(exc) else "; use a range like 42-51 or a list like 42,43"
        raise argparse.ArgumentTypeError(f"bad seeds {text!r}: {exc}{hint}") from None


def _policies_arg(text: str) -> list[str]:
    try:
        return normalize_policies(text.split(","))
    except SimulationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _name(text: str) -> str:
    """A name that must not be empty (a scheduler name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _name_problem(name: str, what: str, *, subdomain: bool = True) -> str | None:
    """Why ``name`` cannot name a Kubernetes ``what``, or None when it can: a DNS-1123 subdomain
    (a pod, a Lease, a ConfigMap) or, with ``subdomain=False``, a DNS-1123 label (a namespace)."""
    longest = 253 if subdomain else 63
    pattern = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*" if subdomain else _DNS_LABEL
    if len(name) <= longest and re.fullmatch(pattern, name):
        return None
    chars = "lower-case letters, digits, '-' and '.'" if subdomain else "lower-case letters, digits and '-'"
    rule = f"{what} names are {chars}, starting and ending with a letter or digit, at most {longest} characters"
    lower = name.lower()
    if lower != name and len(lower) <= longest and re.fullmatch(pattern, lower):
        rule += f" (did you mean {lower!r}?)"
    return f"{name!r} is not a {what} name: {rule}"


def _namespace(text: str) -> str:
    problem = _name_problem(_name(text), "namespace", subdomain=False)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _scheduler_name(text: str) -> str:
    """A pod's ``spec.schedulerName`` can only be a DNS-1123 subdomain: another name is one no
    pod may name, and a scheduler of it would place nothing, silently."""
    problem = _name_problem(_name(text), "scheduler")
    if problem:
        raise argparse.ArgumentTypeError(problem + " (a pod's spec.schedulerName must be one)")
    return text


def _lease_name(text: str) -> str:
    problem = _name_problem(_name(text), "Lease")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (0 picks a free port), got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be 0..100 (a percentage), got {text!r}")
    return value


MAX_TUNE = 10.0
"""Largest ``--tune``: ten times the cluster's GPUs is far past saturation already."""


def _tune(text: str) -> float:
    if text.strip().endswith("%"):
        raise argparse.ArgumentTypeError(
            f"{text} is a percent; --tune is a multiple of the cluster's GPUs: write 1.3 for 130 %"
        )
    value = _positive_float(text)
    if value > MAX_TUNE:
        raise argparse.ArgumentTypeError(
            f"{text} times the cluster's GPUs is more than {MAX_TUNE:g}; it is a multiple, not a percent: "
            f"write 1.3 for 130 %"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = _Parser(prog="gpusched", description="A secondary Kubernetes scheduler that packs GPUs.")
    parser.add_argument("--version", action="version", version=f"gpusched {__version__}")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=logs.LEVELS,
        help="log level for the structured log on stderr (default: info for run, warning otherwise)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    sim = sub.add_parser(
        "simulate",
        help="replay a trace through placement policies",
        description=(
            "Replay an openb-format trace (Alibaba GPU trace v2023) with the FGD paper's protocol and "
            "compare policies. With no --nodes/--pods it runs the bundled demo sample."
        ),
    )
    sim.add_argument("--nodes", type=Path, metavar="CSV", help="node list (sn,cpu_milli,memory_mib,gpu,model)")
    sim.add_argument(
        "--pods", type=Path, metavar="CSV", help="pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)"
    )
    sim.add_argument(
        "--policy",
        type=_policies_arg,
        default=list(DEMO_POLICIES),
        metavar="LIST",
        help=f"comma-separated policies from {', '.join(POLICIES)} (default: {','.join(DEMO_POLICIES)})",
    )
    sim.add_argument(
        "--batch",
        type=_positive_int,
        default=DEMO_BATCH,
        metavar="K",
        help="pods per placement decision; 1 is the published protocol (default: %(default)s)",
    )
    sim.add_argument(
        "--seeds",
        type=_seeds_arg,
        default=parse_seeds(DEMO_SEEDS),
        metavar="SEEDS",
        help=f"seeds as a range (42-51) or a list (42,43) (default: {DEMO_SEEDS})",
    )
    sim.add_argument(
        "--tune",
        type=_tune,
        default=1.3,
        help="GPU demand of the workload as a multiple of cluster capacity (default: %(default)s)",
    )
    sim.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"output directory for summary.json and allocation.png "
        f"(default: ./{DEMO_OUT} for the demo, ./{TRACE_OUT} otherwise)",
    )
    sim.add_argument("--config", type=Path, metavar="YAML", help="solver configuration (weights and limits)")
    sim.add_argument(
        "--typical",
        choices=TYPICAL_SOURCES,
        default="online",
        help="CP-SAT's typical pods: learnt from the pods placed so far, as the daemon does, or the whole "
        "trace's, as FGD is given (default: %(default)s)",
    )
    sim.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        metavar="N",
        help="runs in parallel processes (default: %(default)s)",
    )
    sim.add_argument(
        "--published",
        type=Path,
        metavar="CSV",
        help="published results (trace,policy,alloc_pct_at_arrival130,...) to show next to openb traces",
    )
    sim.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    sim.add_argument("--log-level", default=argparse.SUPPRESS, choices=logs.LEVELS, help="as gpusched --log-level")
    sim.set_defaults(handler=_simulate)

    run = sub.add_parser(
        "run",
        help="run the scheduler daemon",
        description=(
            "Schedule pods with spec.schedulerName=gpu-scheduler: watch, batch, solve, bind. "
            "In a pod it uses the service account; elsewhere pass --kubeconfig."
        ),
    )
    _cluster_args(run)
    run.add_argument(
        "--config",
        metavar="configmap/NAME|FILE",
        help="solver configuration: a ConfigMap in --namespace (followed and hot-reloaded) or a YAML file "
        "(read once); default: built-in defaults",
    )
    run.add_argument(
        "--identity",
        default="",
        help="leader-election identity (default: $POD_NAME, else the host name, and a random suffix)",
    )
    run.add_argument("--no-leader-elect", action="store_true", help="schedule without holding the Lease")
    run.add_argument(
        "--lease-name",
        type=_lease_name,
        default="gpu-scheduler",
        help="Lease name in --namespace (default: %(default)s); a second gpusched in the same namespace needs "
        "its own, which its Role must grant by name",
    )
    run.add_argument(
        "--lease-duration",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="how long a Lease holds without renewal (default: 15)",
    )
    run.add_argument(
        "--renew-deadline",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="the leader steps down when it cannot renew for this long (default: 10)",
    )
    run.add_argument(
        "--retry-period",
        type=_positive_float,
        default=2.0,
        metavar="S",
        help="how often the Lease is renewed or tried for (default: 2)",
    )
    run.add_argument(
        "--metrics-host",
        default="",
        help="address for /metrics, /healthz, /readyz (default: every interface, IPv4 and IPv6)",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        default=8080,
        help="port for /metrics, /healthz, /readyz; 0 picks a free one (default: %(default)s)",
    )
    run.add_argument(
        "--kube-api-qps",
        type=_positive_float,
        default=50.0,
        help="request rate of each client: watches and Bindings; Events and conditions; the Lease (default: 50)",
    )
    run.add_argument("--kube-api-burst", type=_positive_int, default=100, help="burst of each client (default: 100)")
    run.add_argument("--policy", default="cpsat", choices=POLICIES, help="placement policy (default: %(default)s)")
    util = _utilisation_args(
        run,
        "Read GPU utilisation measured by DCGM from Prometheus; the ConfigMap's utilisation section "
        "says what it changes (see docs/deploy.md).",
    )
    util.add_argument(
        "--utilisation-poll",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="seconds between queries (default: 15)",
    )
    run.add_argument("--log-level", default=argparse.SUPPRESS, choices=logs.LEVELS, help="default: info")
    run.set_defaults(handler=_run, default_log_level="info")

    exp = sub.add_parser(
        "explain",
        help="explain where a pending pod fits, or why it does not",
        description="Read the cluster once and print, for one pod, the reasoning the scheduler's Events give.",
    )
    exp.add_argument("pod", metavar="[NAMESPACE/]POD", help="the pod (namespace defaults to 'default')")
    _cluster_args(exp, daemon=False)
    exp.add_argument(
        "--namespace",
        default=None,
        help="namespace of the pod, as NAMESPACE/ in front of POD does (default: default)",
    )
    exp.add_argument("--log-level", default=argparse.SUPPRESS, choices=logs.LEVELS, help="as gpusched --log-level")
    exp.set_defaults(handler=_explain)

    rep = sub.add_parser(
        "report",
        help="what the cluster's GPUs cost per hour: by namespace, held idle, on idle nodes",
        description=(
            "Read the cluster once (and Prometheus, with --prometheus-url) and print what the GPUs cost per "
            "hour: held by each namespace, held but idle, free on nodes in use, and on nodes nobody uses."
        ),
    )
    _cluster_args(rep, daemon=False, scheduler=False)
    rep.add_argument(
        "--prices",
        type=Path,
        metavar="YAML",
        help="price per GPU-hour by GPU product: {currency: USD, default: 1.0, gpuHour: {A100-SXM4-80GB: 3.0}} "
        "(default: 1.0 per GPU-hour for every product)",
    )
    rep.add_argument(
        "--idle-percent",
        type=_percent,
        default=5.0,
        metavar="PCT",
        help="a held GPU used less than this is idle (default: 5; the ConfigMap's utilisation.idlePercent "
        "is not read here: pass the same value)",
    )
    _utilisation_args(rep, "Read GPU utilisation once, to find the held GPUs that are idle.")
    rep.add_argument(
        "--gpu-indices-honoured",
        action="store_true",
        help="the device plugin gives each pod the GPUs gpusched.io/gpu-indices names, so a pod is idle on the "
        "GPUs it is booked on (default: as NVIDIA's device plugin, which chooses them itself: a node's idle "
        "GPUs are counted per node and split among its pods; the ConfigMap's utilisation.gpuIndicesHonoured)",
    )
    rep.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    rep.add_argument("--log-level", default=argparse.SUPPRESS, choices=logs.LEVELS, help="as gpusched --log-level")
    rep.set_defaults(handler=_report)

    chk = sub.add_parser(
        "check-config",
        help="validate a solver configuration before it is applied",
        description=(
            "Read a solver configuration as the scheduler reads its ConfigMap: one YAML document, or a ConfigMap "
            "manifest (its data key config.yaml; among several objects, or in a List, the one ConfigMap that has "
            "it). Exit 0 and list what differs from the defaults, or exit 2 naming the key and the reason."
        ),
    )
    chk.add_argument("file", type=Path, metavar="FILE", help="the YAML document or ConfigMap manifest")
    chk.add_argument("--log-level", default=argparse.SUPPRESS, choices=logs.LEVELS, help="as gpusched --log-level")
    chk.set_defaults(handler=_check_config)
    return parser


def _utilisation_args(p: argparse.ArgumentParser, what: str) -> argparse._ArgumentGroup:
    util = p.add_argument_group("GPU utilisation", what)
    util.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus to read from, e.g. http://prometheus.monitoring:9090"
    )
    util.add_argument(
        "--utilisation-query",
        type=_query,
        metavar="PROMQL",
        help="instant query answering one sample per GPU, 0-100, labelled with the node and the GPU index "
        f"(default: {default_query()})",
    )
    util.add_argument(
        "--prometheus-bearer-token-file",
        type=Path,
        metavar="PATH",
        help="a file holding a bearer token sent with each query, read again at each poll (a Prometheus "
        "behind kube-rbac-proxy or an OAuth proxy: /var/run/secrets/kubernetes.io/serviceaccount/token)",
    )
    util.add_argument(
        "--prometheus-ca-file",
        type=Path,
        metavar="PATH",
        help="the CA bundle an https Prometheus's certificate is verified by (default: the system's)",
    )
    util.add_argument(
        "--utilisation-node-label",
        default=DEFAULT_NODE_LABEL,
        type=_label_name,
        metavar="LABEL",
        help="the label holding the node's name (default: %(default)s)",
    )
    util.add_argument(
        "--utilisation-gpu-label",
        default=DEFAULT_GPU_LABEL,
        type=_label_name,
        metavar="LABEL",
        help="the label holding the GPU's index on its node (default: %(default)s)",
    )
    return util


def _cluster_args(p: argparse.ArgumentParser, daemon: bool = True, scheduler: bool = True) -> None:
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig file (default: the first file of $KUBECONFIG that exists, else in a pod its service "
        "account, else ~/.kube/config)",
    )
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    if not scheduler:
        return
    if daemon:
        p.add_argument(
            "--namespace",
            type=_namespace,
            default=os.environ.get("POD_NAMESPACE", "").strip() or "gpusched-system",
            help="namespace of the Lease and the ConfigMap (default: $POD_NAMESPACE or gpusched-system)",
        )
    p.add_argument(
        "--scheduler-name",
        type=_scheduler_name,
        default="gpu-scheduler",
        help="the spec.schedulerName of the pods gpusched places (default: %(default)s)",
    )


def _daemon_config(value: str | None) -> tuple[str | None, GpuschedConfig]:
    if value is None:
        return None, GpuschedConfig()
    if value.startswith("configmap/"):
        name = value.removeprefix("configmap/")
        if not name:
            raise UsageError("--config configmap/: name the ConfigMap, e.g. configmap/gpu-scheduler-config")
        problem = _name_problem(name, "ConfigMap")
        if problem:
            raise UsageError(f"--config configmap/{name}: {problem}")
        return name, GpuschedConfig()
    return None, _read_config(
        Path(value), "a solver configuration YAML file (or a ConfigMap manifest), or configmap/NAME"
    )[0]


def _kubeconfig(path: Path | None) -> Path | None:
    """The kubeconfig to use: ``--kubeconfig``; else the first file of ``$KUBECONFIG`` that
    exists (only that one: files are not merged as kubectl merges them); else, in a pod, its
    service account (None); else ``~/.kube/config``."""
    if path is not None:
        return _existing_file(path, "--kubeconfig", "a kubeconfig file")
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for entry in listed:
        candidate = Path(entry)
        with contextlib.suppress(RuntimeError):  # "~" with no home directory
            candidate = candidate.expanduser()
        found = _lookup(candidate, "$KUBECONFIG entry", "a kubeconfig file in $KUBECONFIG, or --kubeconfig PATH")
        if found is not None and stat.S_ISREG(found.st_mode):
            return candidate
    if listed and not in_pod:
        raise UsageError(
            f"$KUBECONFIG names no file that exists ({os.pathsep.join(listed)}); fix it or pass --kubeconfig PATH"
        )
    if in_pod:
        return None
    try:
        home: Path | None = Path.home() / ".kube" / "config"
    except RuntimeError:  # no HOME, and no passwd entry for this user
        home = None
    if home is not None:
        found = _lookup(home, "kubeconfig", "a kubeconfig file with --kubeconfig PATH")
        if found is not None and stat.S_ISREG(found.st_mode):
            return home
    raise UsageError(
        "no kubeconfig ($KUBECONFIG is unset, ~/.kube/config does not exist) and not running in a pod "
        "(KUBERNETES_SERVICE_HOST is unset); pass --kubeconfig PATH"
    )


def _run(args: argparse.Namespace, console: Console) -> int:
    from gpusched.daemon import DaemonSettings, StartupError, run_daemon
    from gpusched.kube.client import CredentialsError
    from gpusched.kube.leader import timing_problem

    prometheus_url = _prometheus_url(args.prometheus_url)  # bad flags first: before the cluster is looked for
    token_file, ca_file = _prometheus_files(args, prometheus_url)
    config_map, config = _daemon_config(args.config)
    if timing_problem(args.lease_duration, args.renew_deadline, args.retry_period):
        raise UsageError(
            "leader election needs --lease-duration > --renew-deadline > --retry-period, got "
            f"{args.lease_duration:g} / {args.renew_deadline:g} / {args.retry_period:g} (the defaults are 15 / 10 / 2: "
            "change them together, e.g. --lease-duration 30 --renew-deadline 20 --retry-period 4, and raise the "
            "pod's terminationGracePeriodSeconds to at least the renew deadline + 20 s)"
        )
    settings = DaemonSettings(
        kubeconfig=_kubeconfig(args.kubeconfig),
        context=args.context,
        namespace=args.namespace,
        config_map=config_map,
        config=config,
        scheduler_name=args.scheduler_name,
        identity=args.identity,
        leader_elect=not args.no_leader_elect,
        lease_name=args.lease_name,
        lease_duration_s=args.lease_duration,
        renew_deadline_s=args.renew_deadline,
        retry_period_s=args.retry_period,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        kube_qps=args.kube_api_qps,
        kube_burst=args.kube_api_burst,
        policy=args.policy,
        prometheus_url=prometheus_url,
        utilisation_query=args.utilisation_query,
        utilisation_node_label=args.utilisation_node_label,
        utilisation_gpu_label=args.utilisation_gpu_label,
        utilisation_poll_s=args.utilisation_poll,
        prometheus_token_file=token_file,
        prometheus_ca_file=ca_file,
    )
    try:
        return asyncio.run(run_daemon(settings))
    except (CredentialsError, StartupError) as exc:
        raise UsageError(str(exc)) from None


def _prometheus_url(value: str | None) -> str | None:
    """``--prometheus-url``, checked: an http(s) address with a host.  A rejected address is
    echoed with any password in it masked."""
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    user, at, host = rest.rpartition("@")
    shown = f"{scheme}{sep}{user.split(':', 1)[0]}:***@{host}" if at and ":" in user else value
    expected = "expected http://HOST:PORT or https://HOST:PORT"
    try:
        url = urlsplit(value)
        _ = url.port  # a port that is not a number is refused here, not at the first query
    except ValueError:
        raise UsageError(
            f"--prometheus-url {shown!r}: not an address; {expected} (percent-encode '/', '#', '?' and '@' "
            "in a user name or password)"
        ) from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UsageError(f"--prometheus-url {shown!r}: {expected}")
    if url.query or url.fragment:
        raise UsageError(
            f"--prometheus-url {shown!r}: no ?query or #fragment; give the address its /api/v1/query is under "
            "(percent-encode '#' and '?' in a password)"
        )
    return value.rstrip("/")


def _prometheus_files(args: argparse.Namespace, url: str | None) -> tuple[Path | None, Path | None]:
    """``--prometheus-bearer-token-file`` and ``--prometheus-ca-file``, checked: files that are
    there, given with ``--prometheus-url``."""
    token, ca = args.prometheus_bearer_token_file, args.prometheus_ca_file
    for flag, given in (("--prometheus-bearer-token-file", token), ("--prometheus-ca-file", ca)):
        if given is not None and url is None:
            raise UsageError(f"{flag} needs --prometheus-url: it is how that Prometheus is read")
    if token is not None:
        _existing_file(token, "--prometheus-bearer-token-file", "a file holding the bearer token")
        if url is not None and "@" in urlsplit(url).netloc:
            raise UsageError(
                "--prometheus-bearer-token-file and a user and password in --prometheus-url: only one of them is "
                "sent (the password would replace the token); give one"
            )
    if ca is not None:
        what = "a PEM file of the CA certificates to trust"
        _existing_file(ca, "--prometheus-ca-file", what)
        if url is not None and not url.startswith("https://"):
            raise UsageError("--prometheus-ca-file is for an https Prometheus; --prometheus-url is not https://")
        try:  # read as each query will read it: a file that is no CA bundle is told now, not at the first query
            ssl.create_default_context(cafile=str(ca))
        except ssl.SSLError as exc:
            raise UsageError(
                f"--prometheus-ca-file {ca}: not a PEM file of CA certificates ({exc.reason or exc}); "
                f"pass {what} (-----BEGIN CERTIFICATE----- blocks)"
            ) from None
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--prometheus-ca-file {ca}: cannot read: {getattr(exc, 'strerror', None) or exc}; pass {what}"
            ) from None
    return token, ca


def _label_name(text: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    return text


def _query(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty query; leave the flag out for the default one")
    return text


def _pod_ref(text: str, namespace: str | None) -> tuple[str, str]:
    """``NAMESPACE/POD`` or ``POD`` (in ``--namespace``, else ``default``) as (namespace, name);
    each must be a name Kubernetes gives (a namespace a DNS-1123 label, a pod a subdomain): a
    '..' or a '?' would otherwise ask the API server for another object."""
    ns, sep, name = text.partition("/") if "/" in text else ("", "", text)
    if not name or "/" in name or (sep and not ns):
        raise UsageError(f"{text!r} is not a pod; pass POD or NAMESPACE/POD, e.g. default/train-2gpu")
    if namespace is not None and (problem := _name_problem(namespace, "namespace", subdomain=False)):
        raise UsageError(f"--namespace {problem}; pass the namespace as `kubectl get namespaces` lists it")
    if ns and (problem := _name_problem(ns, "namespace", subdomain=False)):
        raise UsageError(f"{text!r}: {problem}; pass NAMESPACE/POD as `kubectl get pods -A` lists them")
    if problem := _name_problem(name, "pod"):
        raise UsageError(f"{text!r}: {problem}; pass POD or NAMESPACE/POD as `kubectl get pods` lists them")
    if ns and namespace is not None and ns != namespace:
        raise UsageError(f"{text} is in namespace {ns!r}, but --namespace says {namespace!r}; give one of them")
    return ns or namespace or "default", name


def _cluster_unreadable(exc: ApiError, kubeconfig: Path | None) -> str:
    """What ``explain`` and ``report`` say when the API server cannot be reached or refuses to answer."""
    from gpusched.kube.client import (
        CERTIFICATE_NAME_MISMATCH,
        CERTIFICATE_OUT_OF_DATE,
        CERTIFICATE_UNTRUSTED,
        NOT_KUBERNETES,
    )

    cluster = f"the cluster of kubeconfig {kubeconfig} (of --context, or its current context)"
    if exc.reason == NOT_KUBERNETES:
        fix = (
            f"is the server of {cluster} a Kubernetes API server? give it the address `kubectl cluster-info` "
            "prints for the control plane"
            if kubeconfig is not None
            else "is KUBERNETES_SERVICE_HOST the address of the Kubernetes API server?"
        )
        return f"cannot read the cluster: {exc.message}; {fix}"
    if exc.reason == CERTIFICATE_UNTRUSTED:
        fix = (
            f"{cluster} must name the CA that signed the API server's certificate: certificate-authority "
            "(a file) or certificate-authority-data (base64 PEM), as `kubectl config view --raw` shows it"
            if kubeconfig is not None
            else "the pod's service account ca.crt must be the CA of this cluster's API server"
        )
    elif exc.reason == CERTIFICATE_NAME_MISMATCH:
        fix = (
            f"the server of {cluster} must be a name or address the certificate is issued for, or its "
            "tls-server-name must be one"
            if kubeconfig is not None
            else "the API server's certificate must be issued for KUBERNETES_SERVICE_HOST"
        )
    elif exc.reason == CERTIFICATE_OUT_OF_DATE:
        fix = "the API server's certificate must be renewed, or this machine's clock set right"
    elif exc.status == 0:
        fix = "check the server address of --kubeconfig (and --context) and that the API server is up"
    elif exc.status == 401:
        fix = "the API server refused the credentials of --kubeconfig: renew them"
    elif exc.status == 403:
        fix = (
            "the user of --kubeconfig needs get and list on pods and list on nodes (and on "
            "persistentvolumeclaims and persistentvolumes for a pod that mounts claims)"
        )
    else:
        fix = "try again, or check the API server"
    return f"cannot read the cluster: {exc.message if exc.status == 0 else exc}; {fix}"


def _explain(args: argparse.Namespace, console: Console) -> int:
    from gpusched.daemon import explain_pod
    from gpusched.kube.client import ApiError, CredentialsError

    ns, name = _pod_ref(args.pod, args.namespace)
    kubeconfig = _kubeconfig(args.kubeconfig)
    try:
        text, code = asyncio.run(explain_pod(kubeconfig, args.context, ns, name, args.scheduler_name))
    except CredentialsError as exc:
        raise UsageError(str(exc)) from None
    except ApiError as exc:
        raise UsageError(_cluster_unreadable(exc, kubeconfig)) from None
    if code == EXIT_USAGE:  # no such pod: an error, on stderr
        raise UsageError(text)
    print(text)
    return code


def _report(args: argparse.Namespace, console: Console) -> int:
    from gpusched.daemon import report_costs
    from gpusched.kube.client import ApiError, CredentialsError
    from gpusched.metrics.cost import Prices, parse_prices
    from gpusched.metrics.source import UtilisationSource

    url = _prometheus_url(args.prometheus_url)
    token_file, ca_file = _prometheus_files(args, url)
    prices = Prices()
    if args.prices is not None:
        path = _existing_file(args.prices, "--prices", "a YAML price list")
        try:
            data = read_yaml(_read_text(path, "--prices"), f"--prices {path}")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        try:
            prices = parse_prices(data, str(path))
        except ValueError as exc:
            raise UsageError(f"--prices {exc}") from None
    source = None
    if url is not None:
        source = UtilisationSource(
            url,
            query=args.utilisation_query,
            node_label=args.utilisation_node_label,
            gpu_label=args.utilisation_gpu_label,
            tell=False,  # its error comes as a note
            token_file=token_file,
            ca_file=ca_file,
        )
    kubeconfig = _kubeconfig(args.kubeconfig)
    try:
        report, notes = asyncio.run(
            report_costs(kubeconfig, args.context, prices, source, args.idle_percent, args.gpu_indices_honoured)
        )
    except CredentialsError as exc:
        raise UsageError(str(exc)) from None
    except ApiError as exc:
        raise UsageError(_cluster_unreadable(exc, kubeconfig)) from None
    if source is not None and source.refused:
        raise UsageError(f"--utilisation-query: {source.error}; fix the query (it is sent as given)")
    if source is not None and source.token_unreadable:
        raise UsageError(
            f"--prometheus-bearer-token-file: {source.error}; put the token alone in the file (as a service "
            "account's token file holds it), readable by this user"
        )
    if source is not None and not source.answered:  # asked for, and not had: no report that looks complete
        up = "" if source.not_prometheus else " and that Prometheus is up"
        raise UsageError(
            f"--prometheus-url: {source.error}; check the address (the one Prometheus answers /api/v1/query "
            f"under, e.g. http://prometheus.monitoring:9090){up}, or leave --prometheus-url out to report without "
            "idle GPUs"
        )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        render_report(report, console, "see the note above" if source is not None else "pass --prometheus-url")
    return 0


def _lookup(path: Path, flag: str, what: str) -> os.stat_result | None:
    """What is at ``path``, or None when nothing is.  A path that cannot be looked up (a name
    too long, a directory on the way this user may not search, a loop of links) is refused
    naming the cause: ``Path.exists()`` would raise it as a traceback."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"{flag} {path}: cannot use this path: {reason}; pass the path of {what}") from None


def _existing_file(path: Path, flag: str, what: str) -> Path:
    found = _lookup(path, flag, what)
    if found is None:
        raise UsageError(f"{flag} {path}: no such file; pass the path of {what}")
    if not stat.S_ISREG(found.st_mode):
        raise UsageError(f"{flag} {path}: not a file; pass the path of {what}")
    return path


def _read_text(path: Path, flag: str) -> str:
    """The text of a UTF-8 file given as ``flag``; what stops it being read is a UsageError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read: {exc.strerror or exc}; pass a file this user can read") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{flag} {path}: not UTF-8 text (byte {exc.start + 1}, on line {line}); save it as UTF-8"
        ) from None


def _is_object(doc: Any) -> bool:
    """Whether a document of a manifest stream is a Kubernetes object (a ConfigMap, a List of
    objects, or anything with an apiVersion and a kind), not a solver configuration."""
    return isinstance(doc, dict) and (doc.get("kind") in ("ConfigMap", "List") or {"apiVersion", "kind"} <= doc.keys())


def _read_config(path: Path, what: str, flag: str = "--config") -> tuple[GpuschedConfig, str]:
    """The configuration in ``path``, and what was read: the file is the solver document itself,
    read exactly as the scheduler reads its ConfigMap's ``config.yaml`` (``load_config``); or
    manifests (``kubectl get configmap -o yaml``, several objects as ``kubectl kustomize`` prints
    them, a List) among which one ConfigMap has ``data.config.yaml``, which is read so."""
    path = _existing_file(path, flag, what)
    text = _read_text(path, flag)
    docs = [d for d in read_yaml_documents(text, str(path)) if d is not None]
    if not any(_is_object(d) for d in docs):
        return load_config(text, str(path)), str(path)
    objects = [d for d in docs if isinstance(d, dict)]
    lists = [d.get("items") or [] for d in objects if d.get("kind") == "List"]
    if not all(isinstance(items, list) for items in lists):
        raise ConfigError(f"{path}: a List whose items are not a list of objects")
    objects += [i for items in lists for i in items if isinstance(i, dict)]
    maps = [
        d
        for d in objects
        if d.get("kind") == "ConfigMap" and isinstance(d.get("data"), dict) and "config.yaml" in d["data"]
    ]
    if len(docs) == 1 and not maps and docs[0].get("kind") not in ("ConfigMap", "List"):
        raise ConfigError(f"{path}: a {docs[0]['kind']}, not a solver configuration or a ConfigMap manifest")
    if len(docs) == 1 and not maps and docs[0].get("kind") == "ConfigMap":
        raise ConfigError(f"{path}: a ConfigMap without data.config.yaml, the key the scheduler reads")
    if len(maps) != 1:
        raise ConfigError(
            f"{path}: {len(maps)} ConfigMaps with data.config.yaml among its objects; pass a file with one"
        )
    inner = maps[0]["data"]["config.yaml"]
    if not isinstance(inner, str):
        raise ConfigError(f"{path}: data.config.yaml is not text; write the solver document under it as a string")
    source = f"{path} (data.config.yaml)"
    return load_config(inner, source=source), source


def _check_config(args: argparse.Namespace, console: Console) -> int:
    config, source = _read_config(args.file, "a solver configuration or a ConfigMap manifest", flag="file")
    changed = _changed(config.model_dump(by_alias=True), GpuschedConfig().model_dump(by_alias=True))
    console.print(f"{source}: valid", soft_wrap=True)
    for key, value in changed:
        console.print(f"  {key}: {json.dumps(value)}", soft_wrap=True, highlight=False)
    if not changed:
        console.print("  (every key at its default)")
    return 0


def _changed(mine: Any, default: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """The settings of ``mine`` that differ from ``default``, by dotted key."""
    if isinstance(mine, dict) and isinstance(default, dict) and mine and default:
        return [c for k, v in mine.items() for c in _changed(v, default.get(k), f"{prefix}{k}.")]
    return [] if mine == default else [(prefix.rstrip("."), mine)]


def _params(config: Path | None) -> SolverParams | None:
    if config is None:
        return None
    return _read_config(config, "a solver configuration YAML file (or a ConfigMap manifest)")[0].solver_params()


def _writable_dir(out: Path) -> None:
    """Make ``--out`` now, so a run does not end by failing to write its results."""
    what = "a directory to write the results in"
    found = _lookup(out, "--out", what)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise UsageError(f"--out {out}: is a file, not a directory; pass {what}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there: {exc.strerror or exc}; pass a writable directory") from None
    for name in (SUMMARY_FILE, PLOT_FILE):
        found = _lookup(out / name, "--out", what)
        if found is not None and stat.S_ISDIR(found.st_mode):
            raise UsageError(f"--out {out}: {name} there is a directory; remove it or pass another directory")


def _simulate(args: argparse.Namespace, console: Console) -> int:
    if (args.nodes is None) != (args.pods is None):
        given = "--nodes" if args.nodes is not None else "--pods"
        raise UsageError(f"{given} given alone; pass both --nodes and --pods, or neither to run the demo")
    params = _params(args.config)
    published = None
    if args.published is not None:
        published = _existing_file(args.published, "--published", "a published-results CSV")
    with ExitStack() as stack:
        if args.nodes is None:
            demo = resources.files("gpusched.sim") / "demo"
            nodes = stack.enter_context(resources.as_file(demo / "nodes.csv"))
            pods = stack.enter_context(resources.as_file(demo / "pods.csv"))
            trace: str | None = "demo"
            out = args.out or Path(DEMO_OUT)
        else:
            nodes = _existing_file(args.nodes, "--nodes", "an openb node list CSV")
            pods = _existing_file(args.pods, "--pods", "an openb pod list CSV")
            trace = None
            out = args.out or Path(TRACE_OUT)
        _writable_dir(out)
        start = time.perf_counter()
        summaries = run_simulation(
            nodes,
            pods,
            args.policy,
            args.batch,
            args.seeds,
            args.tune,
            out,
            params,
            progress=not args.no_progress,
            jobs=args.jobs,
            published=published,
            trace=trace,
            typical_source=args.typical,
        )
    console.print(render_table(summaries))
    extended = render_extended_table(summaries)
    if extended is not None:
        console.print(extended)
    console.print(
        f"wrote {out / 'summary.json'} and {out / 'allocation.png'} in {time.perf_counter() - start:.1f}s",
        soft_wrap=True,  # paths are not broken across lines
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level or getattr(args, "default_log_level", "warning"))
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    console = Console()
    try:
        code: int = args.handler(args, console)
    except (UsageError, SimulationError, TraceError, ConfigError) as exc:
        structlog.get_logger(__name__).debug("command.rejected", error=str(exc))
        print(f"gpusched {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what was under way is cut short (its workers ended), no traceback
        print(f"gpusched {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    raise SystemExit(main())
