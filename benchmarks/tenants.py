"""A tenant within its quota on a cluster another tenant has filled: with tenant rules and without.

    python benchmarks/tenants.py --nodes 50 --json

One control plane (etcd + kube-apiserver, as the tests start it) gets N fake nodes of 8 GPUs.
The same scenario runs twice, side by side, with the cluster emptied in between: once with no
``tenants`` section (``off``) and once with tenant B given a quota of ``--quota`` of the GPUs
(``on``).  Tenants are namespaces.

1. Tenant A creates one-GPU pods for every GPU and ``--backlog`` more (a queue of batch work).
   Its pods fill the cluster; the rest wait.
2. Tenant B then creates one-GPU pods up to its quota, all of one priority with A's.
3. The benchmark plays the kubelet: a pod the scheduler deletes (it has a 30 s grace period)
   stops at once and is removed.

Measured per run: B's pods bound within ``--timeout`` seconds, the seconds until B holds its
quota (None: it never did), A's pods evicted, what A holds at the end, and the GPUs allocated.
Without tenant rules B waits behind A's backlog and no pod may preempt another of its priority,
so B gets nothing until A's work ends; with them B reclaims what A borrowed beyond its quota of 0.
Prints a side-by-side table; ``--json`` prints the JSON object last, ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, report
from _off_on import GPUS_PER_NODE, gpusched, namespace, off_and_on, scheduler_name, table

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit


def one_gpu(name: str, scheduler: str) -> dict[str, Any]:
    p = kit.pod(name, scheduler, gpus=1, cpu="100m", memory="128Mi")
    p["spec"]["terminationGracePeriodSeconds"] = 30  # it lingers once deleted, until the "kubelet" below
    return p


async def kubelet(kube: Kube, namespaces: list[str], stopped: list[str]) -> None:
    """Remove every pod being deleted at once: its containers stop as soon as they are told."""
    while True:
        for ns in namespaces:
            for p in await kit.list_all(kube, f"/api/v1/namespaces/{ns}/pods"):
                if p["metadata"].get("deletionTimestamp"):
                    name = p["metadata"]["name"]
                    r = await kube.request(
                        "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", query={"gracePeriodSeconds": "0"}
                    )
                    if r.ok:
                        stopped.append(f"{ns}/{name}")
        await asyncio.sleep(0.2)


async def bound(kube: Kube, pods: str) -> int:
    return sum(1 for p in await kit.list_all(kube, pods) if p["spec"].get("nodeName"))


async def run_one(
    kube: Kube, cp: ControlPlane, work: Path, mode: str, args: argparse.Namespace, gpus: int
) -> dict[str, Any]:
    a, b = f"team-a-{mode}", f"team-b-{mode}"
    a_pods, b_pods = await namespace(kube, a), await namespace(kube, b)
    quota = max(1, round(args.quota * gpus))
    config = f"tenants:\n  quotas:\n    {b}: {{quotaGpus: {quota}}}\n" if mode == "on" else "{}\n"
    stopped: list[str] = []
    name = scheduler_name()
    try:
        async with gpusched(cp, work, mode, name, config, kubelet(kube, [a, b], stopped)) as daemon:
            backlog = round(args.backlog * gpus)
            await kit.create_all(kube, a_pods, [one_gpu(f"a-{i}", name) for i in range(gpus + backlog)])
            deadline = time.monotonic() + args.timeout
            while await bound(kube, a_pods) < gpus and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            filled = await bound(kube, a_pods)
            start = time.monotonic()
            await kit.create_all(kube, b_pods, [one_gpu(f"b-{i}", name) for i in range(quota)])
            to_quota: float | None = None
            while time.monotonic() - start < args.timeout:
                if await bound(kube, b_pods) >= quota:
                    to_quota = time.monotonic() - start
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # what settles right after
            b_bound, a_bound = await bound(kube, b_pods), await bound(kube, a_pods)
            reclaimed = sum(len(x.get("victims", ())) for x in daemon.events("reclaim"))
    finally:
        for pods in (a_pods, b_pods):
            await kube.request("DELETE", pods, query={"gracePeriodSeconds": "0"})
    return {
        "quota_gpus": quota,
        "a_filled": filled,
        "b_bound": b_bound,
        "b_seconds_to_quota": None if to_quota is None else round(to_quota, 2),
        "a_evicted": len([k for k in stopped if k.startswith(f"{a}/")]),
        "a_reclaim_victims": reclaimed,
        "a_bound_end": a_bound,
        "alloc_pct": round(100 * (a_bound + b_bound) / gpus, 1),
        "b_share_pct": round(100 * b_bound / gpus, 1),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    gpus = args.nodes * GPUS_PER_NODE
    head = {"nodes": args.nodes, "gpus": gpus, "backlog": args.backlog, "timeout_s": args.timeout}
    return await off_and_on(
        "gpusched-tenants-", args.nodes, head, lambda kube, cp, work, mode: run_one(kube, cp, work, mode, args, gpus)
    )


def show(r: dict[str, Any]) -> str:
    rows = [
        ("B's quota (GPUs)", "quota_gpus"),
        ("A's pods bound first", "a_filled"),
        ("B's pods bound", "b_bound"),
        ("s until B holds quota", "b_seconds_to_quota"),
        ("A's pods evicted", "a_evicted"),
        ("A's pods bound at end", "a_bound_end"),
        ("GPU allocation %", "alloc_pct"),
        ("B's share of GPUs %", "b_share_pct"),
    ]
    title = (
        f"{r['nodes']} nodes ({r['gpus']} GPUs); A asks {r['gpus']} + {r['backlog']:.0%} more; "
        f"B asks its quota; waited {r['timeout_s']} s"
    )
    return table(r, title, rows, ("no tenants", "tenants"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument(
        "--backlog", type=float, default=0.5, help="A's pods beyond the cluster's GPUs, as a fraction of them"
    )
    ap.add_argument("--quota", type=float, default=0.25, help="B's quota, as a fraction of the GPUs")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for B's pods")
    output_args(ap)
    args = ap.parse_args()
    return report(asyncio.run(bench(args)), show, args)


if __name__ == "__main__":
    raise SystemExit(main())
