"""MIG demand that shifts: idle layouts set back sooner for the pods waiting, on one real API server.

    python benchmarks/mig_shift.py --nodes 4 --json

One control plane (etcd + kube-apiserver, as the tests start it) gets N fake nodes of 8 A100
80GB GPUs, all whole and labelled ``gpusched.io/mig-repartition=true``, and the script plays
NVIDIA's MIG manager and device plugin (``mig_repartition.mig_manager``: each layout, or
``all-disabled``, applied ``--mig-delay`` seconds after the node is labelled).  The same scenario
runs twice, side by side, with the nodes set up afresh in between: with
``mig.restoreForWaitingSeconds`` 0 (a layout is kept until ``restoreIdleSeconds``, 1800 s) and
with ``--restore-after`` seconds.

1. Inference: every node holds a layout of gpusched's of seven ``1g.10gb`` instances per GPU
   (set up by the script, as an earlier wave left it), and 56 ``1g.10gb`` pods per node come at
   once and are bound.  Once all are bound they are deleted: the inference wave is over.
2. Training and large inference, at once: ``--whole-pods`` pods of 8 whole GPUs and
   ``--big-pods`` ``3g.40gb`` pods.  No node offers whole GPUs or ``3g.40gb`` instances: every
   node still holds the idle ``1g.10gb`` layout of the first wave.

Measured per run for the second wave, once no pod has been bound for ``--settle`` seconds (or
``--timeout``): pods bound by kind, pods pending at the end (none may be lost), nodes set back to
whole GPUs, layouts asked for, and seconds from the wave's creation to its last bind.  Prints a
side-by-side table; ``--json`` prints the JSON object last, ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, report
from _off_on import GPUS_PER_NODE, gpusched, namespace, off_and_on, scheduler_name, table
from mig_repartition import _patch, mig_manager, mig_pod

from gpusched.kube.client import Kube
from tests.controlplane import REPO_ROOT, ControlPlane
from tests.e2e import kit

FIRST_PER_NODE = 7 * GPUS_PER_NODE
"""``1g.10gb`` pods of the first wave per node: every GPU of it as seven instances."""
LAYOUT = "gpusched-0000000000a1"
"""The name of the first wave's layout (gpusched names its layouts ``gpusched-<hash>``)."""
MIG_LABELS = (
    "nvidia.com/mig.config",
    "nvidia.com/mig.config.state",
    "gpusched.io/mig-requested-at",
    "gpusched.io/mig-previous",
)


async def partitioned(kube: Kube, nodes: int) -> None:
    """Every node as an earlier inference wave left it: a layout of gpusched's (``LAYOUT``, each
    GPU seven ``1g.10gb`` instances) applied, advertised and idle."""
    for i in range(nodes):
        path = f"/api/v1/nodes/gpu-{i:04d}"
        before = (await kube.request("GET", path)).body["status"]["allocatable"]
        alloc: dict[str, str | None] = {k: None for k in before if k.startswith("nvidia.com/mig-")}
        alloc |= {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": str(FIRST_PER_NODE)}
        await _patch(kube, f"{path}/status", {"status": {"allocatable": alloc, "capacity": alloc}})
        labels: dict[str, str | None] = dict.fromkeys(MIG_LABELS)
        labels |= {
            "gpusched.io/mig-repartition": "true",
            "nvidia.com/mig.config": LAYOUT,
            "nvidia.com/mig.config.state": "success",
        }
        await _patch(kube, path, {"metadata": {"labels": labels}})


async def bound_within(kube: Kube, pods: str, want: int, args: argparse.Namespace) -> tuple[int, float]:
    """Wait until ``want`` pods of ``pods`` are bound, or none was for ``--settle`` seconds: how
    many are, and the seconds from now to the last bind seen."""
    start = last = time.monotonic()
    bound = 0
    while time.monotonic() - start < args.timeout:
        await asyncio.sleep(0.5)
        now = sum(1 for p in await kit.list_all(kube, pods) if p["spec"].get("nodeName"))
        if now > bound:
            bound, last = now, time.monotonic()
        if now >= want or time.monotonic() - last >= args.settle:
            break
    return bound, last - start


async def run_one(kube: Kube, cp: ControlPlane, work: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cp.kubectl("create", "namespace", "gpu-operator", check=False)
    cp.kubectl("apply", "-f", str(REPO_ROOT / "manifests" / "mig-repartition.yaml"))
    await partitioned(kube, args.nodes)
    first_ns, second_ns = await namespace(kube, f"inference-{mode}"), await namespace(kube, f"training-{mode}")
    name = scheduler_name()
    sooner = args.restore_after if mode == "on" else 0
    config = (
        f"mig:\n  repartition: true\n  timeoutSeconds: {args.timeout:.0f}\n  configDelaySeconds: 0\n"
        f"  restoreForWaitingSeconds: {sooner:g}\n"
    )
    counts: Counter[str] = Counter()
    first = [mig_pod(f"i-{i:04d}", name, "1g.10gb") for i in range(FIRST_PER_NODE * args.nodes)]
    second = [kit.pod(f"w-{i:04d}", name, gpus=8, cpu="1", memory="1Gi") for i in range(args.whole_pods)]
    second += [mig_pod(f"b-{i:04d}", name, "3g.40gb") for i in range(args.big_pods)]
    try:
        async with gpusched(cp, work, mode, name, config, mig_manager(kube, args.mig_delay, counts)) as daemon:
            await kit.create_all(kube, first_ns, first, parallel=64)
            first_bound, first_s = await bound_within(kube, first_ns, len(first), args)
            if first_bound < len(first):
                raise SystemExit(f"{mode}: only {first_bound} of {len(first)} first-wave pods bound")
            await kube.request("DELETE", first_ns, query={"gracePeriodSeconds": "0"})
            while await kit.list_all(kube, first_ns):
                await asyncio.sleep(0.2)
            layouts_before = len(daemon.events("mig repartition"))
            await kit.create_all(kube, second_ns, second, parallel=64)
            bound, seconds = await bound_within(kube, second_ns, len(second), args)
            listed = await kit.list_all(kube, second_ns)
            set_back = len(daemon.events("mig restore"))
            layouts = len(daemon.events("mig repartition")) - layouts_before
    finally:
        for ns in (first_ns, second_ns):
            await kube.request("DELETE", ns, query={"gracePeriodSeconds": "0"})
            while await kit.list_all(kube, ns):
                await asyncio.sleep(0.5)
    on_node = [p for p in listed if p["spec"].get("nodeName")]
    return {
        "restore_for_waiting_s": sooner,
        "first_wave_bound": first_bound,
        "first_wave_s": round(first_s, 1),
        "whole_pods": args.whole_pods,
        "whole_bound": sum(1 for p in on_node if p["metadata"]["name"].startswith("w-")),
        "big_pods": args.big_pods,
        "big_bound": sum(1 for p in on_node if p["metadata"]["name"].startswith("b-")),
        "pending_end": len(listed) - len(on_node),
        "nodes_set_back": set_back,
        "layouts_asked": layouts,
        "seconds_to_last_bind": round(seconds, 1) if bound else None,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    head = {
        "nodes": args.nodes,
        "whole_pods": args.whole_pods,
        "big_pods": args.big_pods,
        "mig_delay_s": args.mig_delay,
        "restore_after_s": args.restore_after,
    }
    return await off_and_on(
        "gpusched-migshift-", args.nodes, head, lambda kube, cp, work, mode: run_one(kube, cp, work, mode, args)
    )


def show(r: dict[str, Any]) -> str:
    rows = [
        ("restoreForWaitingSeconds", "restore_for_waiting_s"),
        ("first wave: 1g.10gb pods bound", "first_wave_bound"),
        ("  seconds to bind them all", "first_wave_s"),
        ("second wave: 8-GPU pods bound", "whole_bound"),
        ("  3g.40gb pods bound", "big_bound"),
        ("  pods pending at the end", "pending_end"),
        ("  nodes set back to whole GPUs", "nodes_set_back"),
        ("  layouts asked for", "layouts_asked"),
        ("  seconds to the last bind", "seconds_to_last_bind"),
    ]
    title = (
        f"{r['nodes']} nodes x {GPUS_PER_NODE} A100 80GB; after a wave of 1g.10gb pods, {r['whole_pods']} 8-GPU "
        f"pods and {r['big_pods']} 3g.40gb pods; the MIG manager takes {r['mig_delay_s']} s per node"
    )
    return table(r, title, rows, ("kept", "sooner"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--whole-pods", type=int, default=2)
    ap.add_argument("--big-pods", type=int, default=8)
    ap.add_argument("--restore-after", type=float, default=15.0, help="restoreForWaitingSeconds of the second run")
    ap.add_argument("--mig-delay", type=float, default=5.0, help="seconds the MIG manager takes per node")
    ap.add_argument("--settle", type=float, default=60.0, help="seconds with no bind that end a wave")
    ap.add_argument("--timeout", type=float, default=300.0)
    output_args(ap)
    args = ap.parse_args()
    return report(asyncio.run(bench(args)), show, args)


if __name__ == "__main__":
    raise SystemExit(main())
