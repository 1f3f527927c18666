"""GPU work spread thin over many nodes: with consolidation and without, on one real API server.

    python benchmarks/consolidation.py --nodes 40 --json

One control plane (etcd + kube-apiserver, as the tests start it) gets N fake nodes of 8 GPUs.
The same scenario runs twice, side by side, with the cluster emptied in between: once with
consolidation off and once on (``intervalSeconds: 1``, ``maxNodesPerRound: --per-round``).

1. Every node gets ``--per-node`` one-GPU pods, bound there already (as left behind by work that
   finished around them).  Each asks to be moved (``gpusched.io/consolidate: "true"``) and is
   owned by a controller.
2. The script plays the kubelet and the controller: for a pod that is evicted a new pod of the
   same request is created at once for gpusched to place, and the evicted pod is removed
   ``--grace`` seconds later (its termination grace period: it holds its GPU until then).

Measured per run, after ``--settle`` seconds with no eviction (or ``--timeout``): GPU nodes in
use, pods evicted, pods running and pending at the end (none may be lost), and how long it took.
Prints a side-by-side table; ``--json`` prints the JSON object last, ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, report
from _off_on import GPUS_PER_NODE, gpusched, namespace, off_and_on, scheduler_name, table

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit

JOB_UID = str(uuid.uuid4())


def batch_pod(name: str, scheduler: str, node: str = "", gpu: int = 0) -> dict[str, Any]:
    p = kit.pod(name, scheduler, gpus=1, cpu="100m", memory="128Mi", node_name=node)
    p["metadata"]["annotations"]["gpusched.io/consolidate"] = "true"
    if node:
        p["metadata"]["annotations"]["gpusched.io/gpu-indices"] = str(gpu)
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "work", "uid": JOB_UID, "controller": True}
    ]
    p["spec"]["terminationGracePeriodSeconds"] = 30
    return p


async def kubelet_and_controller(
    kube: Kube, ns: str, scheduler: str, counts: dict[str, float], grace: float = 0.0
) -> None:
    """For every pod being deleted, create its replacement at once (for gpusched to place), as a
    Job controller does, and remove the pod ``grace`` seconds later, as its kubelet does."""
    seen: dict[str, float] = {}  # pod being deleted -> when its replacement was made
    while True:
        now = time.monotonic()
        for p in await kit.list_all(kube, f"/api/v1/namespaces/{ns}/pods"):
            if not p["metadata"].get("deletionTimestamp"):
                continue
            name = p["metadata"]["name"]
            if name not in seen:
                seen[name] = now
                counts["evicted"] += 1
                counts["last"] = now
                fresh = batch_pod(f"r{int(counts['evicted'])}-{name.split('-', 1)[-1]}", scheduler)
                await kit.create_all(kube, f"/api/v1/namespaces/{ns}/pods", [fresh])
            if now - seen[name] >= grace:
                path = f"/api/v1/namespaces/{ns}/pods/{name}"
                await kube.request("DELETE", path, query={"gracePeriodSeconds": "0"})
        await asyncio.sleep(0.2)


def nodes_in_use(pods: list[dict[str, Any]]) -> int:
    return len({p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")})


async def run_one(kube: Kube, cp: ControlPlane, work: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    ns = f"spread-{mode}"
    pods = await namespace(kube, ns)
    name = scheduler_name()
    spread = [  # bound already, as gpusched bound them (it moves only pods it places)
        batch_pod(f"p-{i:04d}-{k}", name, node=f"gpu-{i:04d}", gpu=k)
        for i in range(args.nodes)
        for k in range(args.per_node)
    ]
    await kit.create_all(kube, pods, spread, parallel=64)
    before = nodes_in_use(await kit.list_all(kube, pods))
    config = (
        f"consolidation:\n  enabled: {'true' if mode == 'on' else 'false'}\n"
        f"  intervalSeconds: 1\n  maxNodesPerRound: {args.per_round}\n"
    )
    config += f"weights:\n  activeNodes: {args.active_nodes}\n" if args.active_nodes is not None else ""
    config += "batching:\n  quickStart: false\n" if args.no_quick_start else ""
    counts: dict[str, float] = {"evicted": 0, "last": time.monotonic()}
    try:
        helper = kubelet_and_controller(kube, ns, name, counts, args.grace)
        async with gpusched(cp, work, mode, name, config, helper) as daemon:
            start = time.monotonic()
            while time.monotonic() - start < args.timeout:
                await asyncio.sleep(1.0)
                quiet = time.monotonic() - max(counts["last"], start)
                pending = [p for p in await kit.list_all(kube, pods) if not p["spec"].get("nodeName")]
                if quiet >= args.settle and not pending:
                    break
            listed = await kit.list_all(kube, pods)
            emptied = len(daemon.events("consolidate"))
    finally:
        await kube.request("DELETE", pods, query={"gracePeriodSeconds": "0"})
        while await kit.list_all(kube, pods):
            await asyncio.sleep(0.5)
    running = [p for p in listed if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]
    return {
        "pods": len(spread),
        "gpu_nodes_before": before,
        "gpu_nodes_after": nodes_in_use(running),
        "evicted": int(counts["evicted"]),
        "running_end": len(running),
        "pending_end": len(listed) - len(running),
        "rounds": emptied,
        "seconds": round(counts["last"] - start, 1) if counts["evicted"] else 0.0,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    head = {
        "nodes": args.nodes,
        "per_node": args.per_node,
        "per_round": args.per_round,
        "active_nodes_weight": args.active_nodes,
        "quick_start": not args.no_quick_start,
        "grace_s": args.grace,
    }
    return await off_and_on(
        "gpusched-consolidation-", args.nodes, head, lambda kube, cp, work, mode: run_one(kube, cp, work, mode, args)
    )


def show(r: dict[str, Any]) -> str:
    rows = [
        ("pods (1 GPU each)", "pods"),
        ("GPU nodes in use before", "gpu_nodes_before"),
        ("GPU nodes in use after", "gpu_nodes_after"),
        ("pods evicted", "evicted"),
        ("pods running at end", "running_end"),
        ("pods pending at end", "pending_end"),
        ("nodes emptied", "rounds"),
        ("seconds to the last eviction", "seconds"),
    ]
    title = (
        f"{r['nodes']} nodes x {GPUS_PER_NODE} GPUs, {r['per_node']} pods on each; "
        f"up to {r['per_round']} nodes emptied per round, a round a second"
    )
    off, on = r["off"]["gpu_nodes_after"], r["on"]["gpu_nodes_after"]
    ratio = on / off if off else float("nan")
    return table(r, title, rows, ("off", "on")) + f"\nGPU nodes in use, on/off: {ratio:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--per-node", type=int, default=2, help="one-GPU pods bound on each node at the start")
    ap.add_argument("--per-round", type=int, default=4, help="consolidation.maxNodesPerRound")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds with no eviction that end a run")
    ap.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds an evicted pod stays (terminating) after its replacement is made (default: %(default)s)",
    )
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--no-quick-start", action="store_true", help="batching.quickStart: false for both runs")
    ap.add_argument(
        "--active-nodes", type=int, default=None, help="weights.activeNodes for both runs (default: the default)"
    )
    output_args(ap)
    args = ap.parse_args()
    return report(asyncio.run(bench(args)), show, args)


if __name__ == "__main__":
    raise SystemExit(main())
