"""MIG pods on a cluster of whole GPUs: with live re-partitioning and without, on one real API server.

    python benchmarks/mig_repartition.py --nodes 20 --json

One control plane (etcd + kube-apiserver, as the tests start it) gets N fake nodes of 8 A100
80GB GPUs, all whole and labelled ``gpusched.io/mig-repartition=true``.  The same scenario runs
twice, side by side, with the cluster emptied in between: ``mig.repartition`` off, then on.

1. ``--mig-pods`` inference pods ask for one MIG instance each (seeded: 60 % ``1g.10gb``, 25 %
   ``2g.20gb``, 15 % ``3g.40gb``), and ``--whole-pods`` training pods for 8 whole GPUs each, all
   at once.
2. The script plays NVIDIA's MIG manager and device plugin: when a node's
   ``nvidia.com/mig.config`` names a layout of gpusched's, it sets the state ``pending``, waits
   ``--mig-delay`` seconds, advertises the layout's instances (and the GPUs left whole) as the
   device plugin would, and sets the state ``success``.

Measured per run, once no pod has been bound for ``--settle`` seconds (or ``--timeout``): pods
bound by kind, nodes re-partitioned and layouts asked for (one per node at most), GPUs given to
MIG against a lower bound on those the pods need (compute slices over 7, memory slices over 8),
the share of the instances advertised that pods use, pods pending at the end (none may be lost)
and the seconds to the last bind.  Prints a side-by-side table; ``--json`` prints the JSON
object last, ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, report
from _off_on import GPUS_PER_NODE, gpusched, namespace, off_and_on, scheduler_name, table

from gpusched.kube.client import MERGE_PATCH, Kube
from tests.controlplane import REPO_ROOT, ControlPlane
from tests.e2e import kit

CONFIG_MAP = "/api/v1/namespaces/gpu-operator/configmaps/gpusched-mig-parted-config"
MIX = (("1g.10gb", 0.60), ("2g.20gb", 0.25), ("3g.40gb", 0.15))
SLICES = {"1g.10gb": (1, 1), "2g.20gb": (2, 2), "3g.40gb": (3, 4)}
"""Compute and memory slices of each profile on an A100 80GB, which has 7 and 8."""


def fewest_gpus(profiles: list[str]) -> int:
    """A lower bound on the GPUs the MIG pods need: their compute slices over 7, their memory
    slices over 8 (valid layouts may need more)."""
    compute = sum(SLICES[p][0] for p in profiles)
    memory = sum(SLICES[p][1] for p in profiles)
    return max(-(-compute // 7), -(-memory // 8))


def mig_pod(name: str, scheduler: str, profile: str) -> dict[str, Any]:
    p = kit.pod(name, scheduler, cpu="100m", memory="128Mi")
    p["spec"]["containers"][0]["resources"]["limits"][f"nvidia.com/mig-{profile}"] = "1"
    return p


async def _patch(kube: Kube, path: str, body: dict[str, Any]) -> None:
    r = await kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
    if not r.ok:
        raise SystemExit(f"PATCH {path}: {r.status} {r.body}")


async def apply_layout(kube: Kube, node: str, config: str, delay: float, counts: Counter[str]) -> None:
    """The MIG manager's and the device plugin's part for one node: the layout ``config`` names
    (``all-disabled``: every GPU whole), advertised in place of the instances there before."""
    path = f"/api/v1/nodes/{node}"
    await _patch(kube, path, {"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}})
    await asyncio.sleep(delay)
    offered: Counter[str] = Counter()
    parted = 0
    if config != "all-disabled":
        doc = yaml.safe_load((await kube.request("GET", CONFIG_MAP)).body["data"]["config.yaml"])
        for entry in doc["mig-configs"][config]:
            devices = len(entry["devices"])
            if entry.get("mig-enabled"):
                parted += devices
                for profile, count in (entry.get("mig-devices") or {}).items():
                    offered[profile] += count * devices
    before = (await kube.request("GET", path)).body["status"]["allocatable"]
    alloc: dict[str, str | None] = {k: None for k in before if k.startswith("nvidia.com/mig-")}
    alloc |= {
        "nvidia.com/gpu": str(GPUS_PER_NODE - parted),
        **{f"nvidia.com/mig-{p}": str(c) for p, c in offered.items()},
    }
    await _patch(kube, f"{path}/status", {"status": {"allocatable": alloc, "capacity": alloc}})
    await _patch(kube, path, {"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})
    counts["gpus_partitioned"] += parted
    counts["instances"] += sum(offered.values())
    if config == "all-disabled":
        counts["set_back"] += 1


async def mig_manager(kube: Kube, delay: float, counts: Counter[str]) -> None:
    """Watch the nodes' ``nvidia.com/mig.config`` (by polling) and apply each request once: a
    layout of gpusched's, or ``all-disabled`` asked for by gpusched (``gpusched.io/mig-requested-at``)."""
    done: dict[str, str] = {}  # node -> the configuration last applied
    tasks: set[asyncio.Task[None]] = set()
    try:
        while True:
            for n in await kit.list_all(kube, "/api/v1/nodes"):
                name, labels = n["metadata"]["name"], n["metadata"]["labels"]
                config = labels.get("nvidia.com/mig.config", "")
                asked = labels.get("gpusched.io/mig-requested-at", "")
                if name not in done and labels.get("nvidia.com/mig.config.state") == "success":
                    done[name] = config  # applied before this script started
                ours = config.startswith("gpusched-") or (config == "all-disabled" and asked)
                if ours and done.get(name, "") != config:
                    done[name] = config
                    task = asyncio.create_task(apply_layout(kube, name, config, delay, counts))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()


async def run_one(kube: Kube, cp: ControlPlane, work: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cp.kubectl("create", "namespace", "gpu-operator", check=False)
    cp.kubectl("apply", "-f", str(REPO_ROOT / "manifests" / "mig-repartition.yaml"))
    for i in range(args.nodes):
        await _patch(
            kube, f"/api/v1/nodes/gpu-{i:04d}", {"metadata": {"labels": {"gpusched.io/mig-repartition": "true"}}}
        )
    ns = f"mig-{mode}"
    pods = await namespace(kube, ns)
    name = scheduler_name()
    rng = random.Random(args.seed)
    profiles = rng.choices([p for p, _ in MIX], weights=[w for _, w in MIX], k=args.mig_pods)
    config = (
        f"mig:\n  repartition: {'true' if mode == 'on' else 'false'}\n"
        f"  timeoutSeconds: {args.timeout:.0f}\n  configDelaySeconds: 0\n"
    )
    counts: Counter[str] = Counter()
    try:
        async with gpusched(cp, work, mode, name, config, mig_manager(kube, args.mig_delay, counts)) as daemon:
            start = last = time.monotonic()
            created = [mig_pod(f"m-{i:04d}", name, profile) for i, profile in enumerate(profiles)]
            created += [kit.pod(f"w-{i:04d}", name, gpus=8, cpu="1", memory="1Gi") for i in range(args.whole_pods)]
            await kit.create_all(kube, pods, created, parallel=64)
            bound = 0
            while time.monotonic() - start < args.timeout:
                await asyncio.sleep(0.5)
                now = sum(1 for p in await kit.list_all(kube, pods) if p["spec"].get("nodeName"))
                if now > bound:
                    bound, last = now, time.monotonic()
                if now == len(created) or time.monotonic() - last >= args.settle:
                    break
            listed = await kit.list_all(kube, pods)
            asked = [line["node"] for line in daemon.events("mig repartition")]
    finally:
        await kube.request("DELETE", pods, query={"gracePeriodSeconds": "0"})
        while await kit.list_all(kube, pods):
            await asyncio.sleep(0.5)
    on_node = [p for p in listed if p["spec"].get("nodeName")]
    mig_bound = sum(1 for p in on_node if p["metadata"]["name"].startswith("m-"))
    return {
        "mig_pods": args.mig_pods,
        "mig_bound": mig_bound,
        "whole_pods": args.whole_pods,
        "whole_bound": sum(1 for p in on_node if p["metadata"]["name"].startswith("w-")),
        "pending_end": len(listed) - len(on_node),
        "nodes_repartitioned": len(set(asked)),
        "layouts_asked": len(asked),
        "gpus_partitioned": counts["gpus_partitioned"],
        "gpus_needed_at_least": fewest_gpus(profiles),
        "instance_use_pct": round(100 * mig_bound / counts["instances"], 1) if counts["instances"] else 0.0,
        "seconds_to_last_bind": round(last - start, 1) if bound else 0.0,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    head = {
        "nodes": args.nodes,
        "mig_pods": args.mig_pods,
        "whole_pods": args.whole_pods,
        "mig_delay_s": args.mig_delay,
        "seed": args.seed,
    }
    return await off_and_on(
        "gpusched-mig-", args.nodes, head, lambda kube, cp, work, mode: run_one(kube, cp, work, mode, args)
    )


def show(r: dict[str, Any]) -> str:
    rows = [
        ("MIG pods bound", "mig_bound"),
        ("8-GPU pods bound", "whole_bound"),
        ("pods pending at end", "pending_end"),
        ("nodes re-partitioned", "nodes_repartitioned"),
        ("layouts asked for", "layouts_asked"),
        ("GPUs given to MIG", "gpus_partitioned"),
        ("  at least needed", "gpus_needed_at_least"),
        ("MIG instances in use %", "instance_use_pct"),
        ("seconds to the last bind", "seconds_to_last_bind"),
    ]
    title = (
        f"{r['nodes']} nodes x {GPUS_PER_NODE} A100 80GB, all whole; {r['mig_pods']} MIG pods and "
        f"{r['whole_pods']} 8-GPU pods at once; the MIG manager takes {r['mig_delay_s']} s per node"
    )
    return table(r, title, rows, ("off", "on"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--mig-pods", type=int, default=120)
    ap.add_argument("--whole-pods", type=int, default=10)
    ap.add_argument("--mig-delay", type=float, default=5.0, help="seconds the MIG manager takes per node")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--settle", type=float, default=20.0, help="seconds with no bind that end a run")
    ap.add_argument("--timeout", type=float, default=300.0)
    output_args(ap)
    args = ap.parse_args()
    return report(asyncio.run(bench(args)), show, args)


if __name__ == "__main__":
    raise SystemExit(main())
