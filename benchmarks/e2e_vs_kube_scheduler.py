"""gpusched and kube-scheduler side by side on one real kube-apiserver, with the same pod stream.

    python benchmarks/e2e_vs_kube_scheduler.py --nodes 1000 --pods 5000 --json

One control plane (etcd + kube-apiserver, as the tests start it) gets N fake GPU
nodes of the Alibaba trace's node mix.  The same P-pod stream (trace pods drawn
with replacement in a seeded random order) is created twice, in a fresh
namespace each time, once for kube-scheduler and once for gpusched, and the pods
are deleted in between.  Each scheduler runs as its own process with the same
client limits (``--qps``/``--burst``, kube-scheduler's defaults 50/100).  A
run's stream starts one second after its scheduler's ``/readyz`` says ok
(``ready_s``: how long that took from the process start).

kube-scheduler runs its best bin-packing: one profile with its own
``schedulerName``, NodeResourcesFit with the ``MostAllocated`` strategy over
``nvidia.com/gpu`` (weight 3), CPU and memory, and every node scored
(``percentageOfNodesToScore: 100``).  The stream's fractional pods (a share of
one GPU, about 38% of the trace) are left out of kube-scheduler's run, because
it cannot express them: ``nvidia.com/gpu`` is a whole-device count, and a
node-level extended resource could not keep a share within one GPU.  gpusched's
run has the whole stream, the fractional pods asking through the
``gpusched.io/gpu-milli`` annotation.  ``--whole-only`` leaves them out of both
runs, for a like-for-like comparison on the pods both can place.

Measured per scheduler: pods bound per second over the whole stream (first
pod created to last pod bound), latency from creation (the API's answer to the
create) to binding (the watch seeing ``spec.nodeName``) p50/p99, pods left
unschedulable, GPU allocation % (GPU demand bound, fractional shares counted as
their fraction, over all GPUs, and over the GPUs of the nodes in use), GPU nodes in use
(nodes holding any GPU pod)
and the scheduler's peak RSS (``VmHWM``); also the share of the client limit reached (at most
``burst + qps x t`` binds by ``t``) and the time of the first bind.  Prints a side-by-side table with
ratios; ``--json`` prints the JSON object last, ``--out`` writes it.
``--only gpusched`` runs one scheduler (for profiling).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, replicated_nodes, report, trace_pods

from gpusched.kube.client import ApiError, Kube
from gpusched.kube.convert import ANNOTATION_GPU_MILLI
from gpusched.kube.watch import Reflector
from gpusched.model import Node, Pod
from tests.controlplane import REPO_ROOT, ControlPlane, _free_ports, control_plane, find_assets
from tests.e2e import kit

GPU = "nvidia.com/gpu"


def node_obj(n: Node) -> dict[str, Any]:
    alloc = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi", "pods": "500", GPU: str(n.gpu_count)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n.name,
            "labels": {"kubernetes.io/hostname": n.name, "nvidia.com/gpu.product": n.gpu_model},
        },
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def pod_obj(p: Pod, scheduler: str) -> dict[str, Any]:
    limits = {"cpu": f"{max(p.cpu_milli, 1)}m", "memory": f"{max(p.memory_mib, 1)}Mi"}
    meta: dict[str, Any] = {"name": p.name}
    if p.is_fractional:
        meta["annotations"] = {ANNOTATION_GPU_MILLI: str(p.gpu_milli)}
    elif p.num_gpu:
        limits[GPU] = str(p.num_gpu)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}],
        },
    }


def stream(count: int, seed: int, whole_only: bool) -> list[Pod]:
    """``count`` trace pods (only those asking for whole GPUs or none if ``whole_only``), drawn with replacement."""
    pool = [p for p in trace_pods("default") if not (whole_only and p.is_fractional)]
    rng = random.Random(seed)
    out = []
    for i in range(count):
        p = rng.choice(pool)
        out.append(Pod(f"p-{i:05d}", p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_models))
    return out


@dataclass
class Tracker:
    """Watch handler: when each pod of the run was seen bound, and which are marked unschedulable."""

    bound_at: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    unschedulable: set[str] = field(default_factory=set)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        for o in objects:
            self.apply("ADDED", o)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        node = (obj.get("spec") or {}).get("nodeName")
        if kind == "DELETED":
            return
        if node and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
            self.node_of[name] = node
            self.unschedulable.discard(name)
        elif not node:
            for c in (obj.get("status") or {}).get("conditions") or ():
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    self.unschedulable.add(name)


def peak_rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


Started = tuple[subprocess.Popen[bytes], str]
"""A scheduler process and the URL of its ``/readyz``."""


def start_kube_scheduler(cp: ControlPlane, work: Path, name: str, qps: float, burst: int) -> Started:
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cp.admin_kubeconfig), "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": 100,
        "profiles": [
            {
                "schedulerName": name,
                "pluginConfig": [
                    {
                        "name": "NodeResourcesFit",
                        "args": {
                            "scoringStrategy": {
                                "type": "MostAllocated",
                                "resources": [
                                    {"name": "cpu", "weight": 1},
                                    {"name": "memory", "weight": 1},
                                    {"name": GPU, "weight": 3},
                                ],
                            }
                        },
                    }
                ],
            }
        ],
    }
    path = work / "kube-scheduler.yaml"
    path.write_text(json.dumps(cfg))
    (port,) = _free_ports(1)
    log = (work / "kube-scheduler.log").open("wb")
    proc = subprocess.Popen(
        [str(cp.assets / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1", f"--secure-port={port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, f"https://127.0.0.1:{port}/readyz"


def start_gpusched(cp: ControlPlane, work: Path, name: str, qps: float, burst: int) -> Started:
    log = (work / "gpusched.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [sys.executable, "-m", "gpusched", "run", "--kubeconfig", str(cp.scheduler_kubeconfig)]
    (port,) = _free_ports(1)
    argv += ["--scheduler-name", name, "--no-leader-elect", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
    argv += ["--kube-api-qps", str(qps), "--kube-api-burst", str(burst)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}/readyz"


async def wait_ready(proc: subprocess.Popen[bytes], url: str, work: Path, timeout: float = 60.0) -> float:
    """Poll the scheduler's ``/readyz`` until it answers 200; seconds it took.

    kube-scheduler serves it over TLS with a self-signed certificate and lets anyone read
    it; gpusched says ready once its watches have listed and its solver is loaded.
    """
    start = time.monotonic()
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - start < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the scheduler exited with {proc.returncode} before it was ready; see {work}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(url, ssl=insecure) as r:  # ignored for plain http
                    if r.status == 200:
                        return time.monotonic() - start
            await asyncio.sleep(0.05)
    raise SystemExit(f"{url} not ready after {timeout:.0f}s; see {work}")


async def run_one(
    kube: Kube,
    cp: ControlPlane,
    work: Path,
    who: str,
    pods: list[Pod],
    nodes: list[Node],
    qps: float,
    burst: int,
    empty_after: bool,
) -> dict[str, Any]:
    ns = f"bench-{who.replace('_', '-')}"
    sched_name = f"{who.replace('_', '-')}-bench"
    r = await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    assert r.ok, r.body
    proc, ready_url = (start_kube_scheduler if who == "kube_scheduler" else start_gpusched)(
        cp, work, sched_name, qps, burst
    )
    tracker = Tracker()
    watch = Reflector(kube, ns, f"/api/v1/namespaces/{ns}/pods", tracker)
    watch_task = asyncio.create_task(watch.run(), name=f"watch-{ns}")
    async with asyncio.timeout(30):
        await watch.synced.wait()
    ready_s = await wait_ready(proc, ready_url, work)
    await asyncio.sleep(1.0)  # then the same settling time for both
    created: dict[str, float] = {}
    sem = asyncio.Semaphore(64)
    path = f"/api/v1/namespaces/{ns}/pods"

    async def create(p: Pod) -> None:
        async with sem:
            resp = await kube.request("POST", path, body=pod_obj(p, sched_name))
            assert resp.status == 201, resp.body
            created[p.name] = time.monotonic()

    # Open the creator's connections before the clock starts, so that neither run's first
    # creates pay for TLS handshakes the other run's did not (idle connections close after
    # 15 s, and the second run starts minutes after the first).
    await asyncio.gather(*(kube.request("GET", path, {"limit": 1}) for _ in range(64)))
    t0 = time.monotonic()
    await asyncio.gather(*(create(p) for p in pods))
    last_change, seen = time.monotonic(), -1
    while True:
        done = len(tracker.bound_at) + len(tracker.unschedulable)
        if done != seen:
            seen, last_change = done, time.monotonic()
        if done >= len(pods) or time.monotonic() - last_change > 60:
            break
        if proc.poll() is not None:
            raise SystemExit(f"{who} exited with {proc.returncode}; see {work}")
        await asyncio.sleep(0.2)
    rss = peak_rss_mib(proc.pid)
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    if proc.poll() is None:
        proc.kill()
    watch_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch_task
    bound = tracker.bound_at
    end = max(bound.values(), default=t0)
    lat = sorted((bound[k] - created[k]) * 1000 for k in bound if k in created)
    milli_by_name = {p.name: p.gpu_demand_milli for p in pods}
    used: dict[str, int] = {}
    for pod_name, node_name in tracker.node_of.items():
        if milli_by_name[pod_name]:
            used[node_name] = used.get(node_name, 0) + milli_by_name[pod_name]
    total_milli = 1000 * sum(n.gpu_count for n in nodes)
    gpus_of = {n.name: n.gpu_count for n in nodes}
    used_milli = 1000 * sum(gpus_of.get(name, 0) for name in used)

    def pct(q: float) -> float:
        return lat[max(0, math.ceil(q / 100 * len(lat)) - 1)] if lat else math.nan

    # The stream runs from the first pod created (the API's answer to its create) to the
    # last pod bound.
    first = min(created.values(), default=t0)
    offsets = sorted(t - first for t in bound.values())
    rate = len(bound) / (end - first) if bound else 0.0
    # The client's token bucket allows at most burst + qps * t binds by t: the best rate.
    ceiling = len(bound) / max((len(bound) - burst) / qps, 1e-9) if bound else 0.0
    (work / f"{who}-bind-offsets.json").write_text(json.dumps([round(t, 4) for t in offsets]))
    result = {
        "pods_per_s": round(rate, 2),
        "ceiling_pods_per_s": round(ceiling, 2),
        "ceiling_pct": round(100 * rate / ceiling, 1) if ceiling else 0.0,
        "first_create_ms": round(1000 * (first - t0), 1),
        "first_bind_ms": round(1000 * offsets[0], 1) if offsets else math.nan,
        "created_s": round(max(created.values(), default=t0) - t0, 1),
        "p50_ms": round(pct(50), 1),
        "p99_ms": round(pct(99), 1),
        "alloc_pct": round(100 * sum(used.values()) / total_milli, 2),
        "alloc_used_pct": round(100 * sum(used.values()) / used_milli, 2) if used_milli else 0.0,
        "gpu_nodes_used": len(used),
        "unschedulable": len(pods) - len(bound),
        "rss_mib": round(rss, 1),
        "submitted": len(pods),
        "bound": len(bound),
        "stream_s": round(end - first, 1),
        "ready_s": round(ready_s, 2),
    }
    print(f"{who}: {json.dumps(result)}", file=sys.stderr, flush=True)
    if empty_after:
        await empty(kube, ns, path)
    return result


async def empty(kube: Kube, ns: str, path: str) -> None:
    """Delete the run's pods before the next run.

    A collection delete of 20,000 pods can outlast the server's request timeout (504), and a
    read while it runs can be cut short; both are repeated until the namespace is empty.
    """
    for _ in range(120):
        try:
            left = await kube.get(path, {"limit": 1})
            if not left.get("items"):
                return
            gone = await kube.request("DELETE", path, query={"gracePeriodSeconds": 0}, timeout=120)
        except ApiError as exc:
            if exc.status != 0:
                raise
            await asyncio.sleep(2.0)
            continue
        if not gone.ok and gone.status != 504:
            raise SystemExit(f"could not delete the pods of {ns}: {gone.error()}")
    raise SystemExit(f"the pods of {ns} were not deleted")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    nodes = replicated_nodes(args.nodes)
    pods = stream(args.pods, args.seed, args.whole_only)
    whole = [p for p in pods if not p.is_fractional]
    work = Path(tempfile.mkdtemp(prefix="gpusched-e2e-"))
    with control_plane(work / "cp", find_assets()) as cp:
        cp.kubectl("apply", "-k", str(REPO_ROOT / "manifests"))
        kube = await kit.admin(cp, qps=1000)
        try:
            await kit.create_all(kube, "/api/v1/nodes", [node_obj(n) for n in nodes], parallel=64)
            result: dict[str, Any] = {
                "nodes": args.nodes,
                "pods": args.pods,
                "gpus": sum(n.gpu_count for n in nodes),
                "gpu_demand": round(sum(p.gpu_demand_milli for p in pods) / 1000, 1),
                "fractional_pods": len(pods) - len(whole),
                "qps": args.qps,
                "burst": args.burst,
                "first": "gpusched" if args.gpusched_first else "kube_scheduler",
            }
            order = ("gpusched", "kube_scheduler") if args.gpusched_first else ("kube_scheduler", "gpusched")
            runs = [who for who in order if not args.only or who == args.only]
            for who in runs:
                print(f"running {who} ...", file=sys.stderr, flush=True)
                mine = whole if who == "kube_scheduler" else pods
                last = who == runs[-1]  # the control plane goes with the last run: nothing to empty
                result[who] = await run_one(kube, cp, work, who, mine, nodes, args.qps, args.burst, not last)
        finally:
            await kube.close()
    result["logs"] = str(work)
    return result


def table(r: dict[str, Any]) -> str:
    k, g = r.get("kube_scheduler"), r.get("gpusched")
    if k is None or g is None:
        return json.dumps(k or g)
    rows = [
        ("pods submitted", "submitted"),
        ("pods bound per s", "pods_per_s"),
        ("% of client limit", "ceiling_pct"),
        ("latency p50 ms", "p50_ms"),
        ("latency p99 ms", "p99_ms"),
        ("unschedulable", "unschedulable"),
        ("GPU allocation %", "alloc_pct"),
        ("  of nodes in use", "alloc_used_pct"),
        ("GPU nodes in use", "gpu_nodes_used"),
        ("peak RSS MiB", "rss_mib"),
    ]
    out = [
        f"{r['nodes']} nodes ({r['gpus']} GPUs), {r['pods']} pods ({r['gpu_demand']} GPUs, "
        f"{r['fractional_pods']} fractional), client qps {r['qps']} burst {r['burst']}",
        f"{'':<18} {'kube-scheduler':>15} {'gpusched':>10} {'gpusched/kube':>14}",
    ]
    for title, key in rows:
        ratio = g[key] / k[key] if k[key] else math.nan
        out.append(f"{title:<18} {k[key]:>15} {g[key]:>10} {ratio:>14.3f}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--qps", type=float, default=50.0, help="client QPS of both schedulers (default 50)")
    ap.add_argument("--burst", type=int, default=100, help="client burst of both schedulers (default 100)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--whole-only", action="store_true", help="leave fractional pods out of both runs")
    ap.add_argument("--only", choices=("kube_scheduler", "gpusched"), help="run one scheduler only")
    ap.add_argument(
        "--gpusched-first",
        action="store_true",
        help="run gpusched's stream first (the second stream meets a server that has just deleted the first)",
    )
    output_args(ap)
    args = ap.parse_args()
    return report(asyncio.run(bench(args)), table, args)


if __name__ == "__main__":
    raise SystemExit(main())
