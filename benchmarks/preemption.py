"""What a preemption search costs on a full cluster of the Alibaba node mix.

    python benchmarks/preemption.py --nodes 5000 --pods 16 --json

Builds N nodes from the trace's node mix, fills them best-fit to ``--fill`` of GPU capacity
with trace pods of random priority 0 to ``--levels`` - 1 (all of them may be evicted by a pod
of priority 100; ``--gpus K`` draws only preemptors of at least K GPUs),
then times ``--repeats`` searches (``plan_preemptions``) for P trace pods of priority 100 that
the cluster has no room for as it is.  With ``--gang K`` the P pods are P/K gangs of K alike
members (room for all or none); with ``--rack-size R`` too, nodes are labelled in racks of R and
each gang must stay in one rack.  Every preemption found is checked: its victims are of
lower priority, and once they are gone its pod fits where the search says.  Prints a table,
then one JSON object with ``nodes``, ``running``, ``pods``, ``p50_ms``, ``p99_ms`` (per search of
P pods), ``per_pod_ms`` (mean), ``found_pct`` and ``victims_per_pod``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, percentile, replicated_nodes, trace_pods

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod
from gpusched.model.pod import Gang
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.preempt import plan_preemptions
from gpusched.solver.validate import validate_plan


def filled(
    cluster: Cluster, pods: list[Pod], fill: float, seed: int, levels: int
) -> tuple[ClusterState, list[Assignment]]:
    """``cluster`` filled best-fit to ``fill`` of its GPUs with trace pods of priority 0 to ``levels`` - 1."""
    rng = random.Random(seed)
    state = cluster.empty_state()
    placed: list[Assignment] = []
    policy = BestFitPolicy(seed)
    i = 0
    while state.gpu_allocated_milli < fill * cluster.total_gpus * 1000:
        chunk = [replace(rng.choice(pods), name=f"run-{i + k}", priority=rng.randrange(levels)) for k in range(256)]
        i += len(chunk)
        plan = policy.place(chunk, state)
        if not plan.assignments:
            break
        state = state.apply(plan.assignments)
        placed += plan.assignments
    return state, placed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=16, help="pods of priority 100 per search")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fill", type=float, default=0.97, help="GPU allocation before the searches")
    ap.add_argument("--levels", type=int, default=10, help="priorities of the running pods: 0 to LEVELS - 1")
    ap.add_argument("--gpus", type=int, default=1, help="preemptors ask for at least this many GPUs")
    ap.add_argument("--gang", type=int, default=0, help="the pods form gangs of this many alike members")
    ap.add_argument("--rack-size", type=int, default=0, help="nodes per rack; each gang in one rack")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true", help="print the JSON object last")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    args = ap.parse_args()

    trace = trace_pods("default")
    nodes = replicated_nodes(args.nodes)
    if args.rack_size:
        nodes = [replace(n, labels={**n.labels, "rack": f"r{i // args.rack_size}"}) for i, n in enumerate(nodes)]
    cluster = Cluster(nodes)
    state, running = filled(cluster, trace, args.fill, args.seed, args.levels)
    rng = random.Random(args.seed + 1)
    gpu_pods = [p for p in trace if p.num_gpu >= args.gpus]
    times, found_pods, victims, asked = [], 0, 0, 0
    for r in range(args.repeats + 1):
        batch: list[Pod] = []
        while len(batch) < args.pods:  # only pods that fit nowhere as the cluster is
            p = replace(rng.choice(gpu_pods), name=f"urgent-{r}-{len(batch)}", priority=100)
            if state.pod_mask(p).any():
                continue
            if not args.gang:
                batch.append(p)
                continue
            topology = ("rack", "required") if args.rack_size else ("", "")
            gang = Gang(f"g-{r}-{len(batch)}", args.gang, *topology)
            batch += [replace(p, name=f"{p.name}-{k}", gang=gang) for k in range(args.gang)]
        start = time.perf_counter()
        if args.gang:
            gangs = [batch[i : i + args.gang] for i in range(0, len(batch), args.gang)]
            found = plan_preemptions([], state, running, gangs=gangs)
        else:
            found = plan_preemptions(batch, state, running)
        elapsed = (time.perf_counter() - start) * 1000
        gone = [v for pre in found for v in pre.victims]
        assert all(v.pod.priority < 100 for v in gone)
        assert len({id(v) for v in gone}) == len(gone)  # no pod evicted twice
        validate_plan(Plan(tuple(pre.placement for pre in found), ()), state.release(gone), [pre.pod for pre in found])
        if args.gang:  # whole gangs only
            assert all(n == args.gang for n in Counter(str(pre.pod.gang) for pre in found).values())
        if r == 0:
            continue  # warm-up: imports, the cluster's caches
        times.append(elapsed)
        asked += len(batch)
        found_pods += len(found)
        victims += len(gone)
    result = {
        "nodes": args.nodes,
        "running": len(running),
        "fill_pct": round(100 * state.gpu_allocated_milli / (cluster.total_gpus * 1000), 1),
        "levels": args.levels,
        "min_gpus": args.gpus,
        "gang": args.gang,
        "rack_size": args.rack_size,
        "pods": args.pods,
        "repeats": args.repeats,
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(percentile(times, 99), 1),
        "per_pod_ms": round(sum(times) / asked, 1),
        "found_pct": round(100 * found_pods / asked, 1),
        "victims_per_pod": round(victims / found_pods, 2) if found_pods else math.nan,
    }
    columns = [
        ("nodes", "nodes", ">6"),
        ("running", "running", ">8"),
        ("fill %", "fill_pct", ">6"),
        ("pods", "pods", ">5"),
        ("p50 ms", "p50_ms", ">8"),
        ("p99 ms", "p99_ms", ">8"),
        ("ms/pod", "per_pod_ms", ">7"),
        ("found %", "found_pct", ">7"),
        ("victims/pod", "victims_per_pod", ">11"),
    ]
    emit(result, columns, as_json=args.json, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
