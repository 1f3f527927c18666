"""What a pod's look through the rooms held for others costs the event loop.

    python benchmarks/room_lookup.py --nodes 5000 --rooms 1,50,200 --json

A pod the preemption search finds nothing for looks next at the rooms held for pods it
outranks (nominated nodes kept while their victims leave): it may take one over, evicting beside
it. That look runs on the event loop, so it must stay short on a large cluster.  The scheduler's
books get N nodes of 8 GPUs, each running 4 two-GPU pods of priority 5; R of those pods are being
preempted, each by a pod of priority 10 that holds room on its node.  Then ``--repeats`` pods of
priority 100 asking for 8 GPUs (room nowhere, as things are) each look through the rooms
(``Scheduler.rooms.room_through``, as the daemon calls it).  Prints one row per R and the JSON object
with ``nodes``, ``pods`` and, per R, ``p50_ms``, ``p99_ms`` and ``found_pct``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import output_args, percentile, report

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.client import Kube
from tests.doubles import IdleClient
from tests.e2e import kit

PER_NODE = 4


def _pod(name: str, priority: int, gpus: int, node: str = "", gpu: int = 0) -> dict[str, Any]:
    obj = kit.pod(name, "s", gpus=gpus, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    obj["spec"]["priority"] = priority
    if node:
        obj["metadata"]["annotations"]["gpusched.io/gpu-indices"] = ",".join(str(gpu + i) for i in range(gpus))
    return obj


def measure(nodes: int, rooms: int, repeats: int) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        settings = DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit")
        s = Scheduler(settings, cast(Kube, IdleClient()))
        handler = NodeHandler(s)
        names = [f"n{i:05d}" for i in range(nodes)]
        for name in names:
            handler.apply("ADDED", kit.node(name, 8, "A100"))
        for i, name in enumerate(names):
            for g in range(PER_NODE):
                s._bound.apply("ADDED", _pod(f"r{i}-{g}", 5, 2, name, 2 * g))
        running = {a.pod.key: a for a in s.cache.preemptible()}
        for i in range(rooms):
            preemptor = _pod(f"room{i}", 10, 2)
            s._pending.apply("ADDED", preemptor)
            record = s.queue.record(f"default/room{i}")
            assert record is not None
            victim = running[f"default/r{i}-0"]
            s.cache.nominate(record.pod, names[i], victim.gpus, [victim.pod])
        times: list[float] = []
        found = 0
        for k in range(repeats):
            s._pending.apply("ADDED", _pod(f"big{k}", 100, 8))
            record = s.queue.record(f"default/big{k}")
            assert record is not None
            start = time.perf_counter()
            got = s.rooms.room_through(record.pod, [record.pod.key], False)
            times.append((time.perf_counter() - start) * 1000)
            found += got is not None
        return {
            "rooms": rooms,
            "p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(percentile(times, 99), 1),
            "found_pct": round(100 * found / repeats, 1),
        }

    return asyncio.run(run())


def _table(result: dict[str, Any]) -> str:
    lines = [f"{result['nodes']} nodes, {result['pods']} running pods; one look per pod of priority 100"]
    lines.append(f"{'rooms':>6} {'p50 ms':>8} {'p99 ms':>8} {'found %':>8}")
    for r in result["runs"]:
        lines.append(f"{r['rooms']:>6} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['found_pct']:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rooms", default="1,50,200", help="room counts to measure, comma-separated")
    ap.add_argument("--repeats", type=int, default=8, help="pods that look, per room count")
    output_args(ap)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.rooms.split(",") if x.strip()]
    if args.nodes < 1 or args.repeats < 1 or not counts or min(counts) < 0 or max(counts) > args.nodes:
        ap.error("--nodes and --repeats must be positive, and each room count within 0..--nodes")
    runs = [measure(args.nodes, r, args.repeats) for r in counts]
    result = {"nodes": args.nodes, "pods": args.nodes * PER_NODE, "repeats": args.repeats, "runs": runs}
    return report(result, _table, args)


if __name__ == "__main__":
    raise SystemExit(main())
