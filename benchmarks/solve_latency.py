"""Batch solve latency of the CP-SAT policy on synthetic clusters of the Alibaba node mix.

    python benchmarks/solve_latency.py --nodes 1213 --pods 100 --json

Builds N nodes from the trace's node mix, fills them best-fit to ``--fill`` of
GPU capacity with trace pods, then times ``--repeats`` solves of P fresh trace
pods each.  The cluster is held in a steady state: each batch's placements
are applied and then released again (as many pods finish as start), so every
batch sees the same fill, as a long-running scheduler would.  Prints a table,
then one JSON object with ``nodes``, ``pods``, ``p50_ms``, ``p99_ms``,
``gap_pct`` (worst over the batches) and more.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, partly_filled, percentile, replicated_nodes, trace_pods

from gpusched.model import Cluster
from gpusched.solver.fragmentation import typical_from
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.solve import CpSatPolicy
from gpusched.solver.validate import validate_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1213)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--fill", type=float, default=0.6, help="GPU allocation before the timed batches")
    ap.add_argument("--time-limit", type=float, default=None, help="CP-SAT seconds per batch")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=24)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true", help="print the JSON object last")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    args = ap.parse_args()

    limit = args.time_limit if args.time_limit is not None else (0.2 if args.pods <= 100 else 1.5)
    pods = trace_pods("default")
    cluster = Cluster(replicated_nodes(args.nodes))
    state = partly_filled(cluster, pods, args.fill, args.seed)
    params = SolverParams(
        limits=Limits(time_limit_s=limit, workers=args.workers, candidates_per_pod=args.candidates),
        seed=args.seed,
    )
    policy = CpSatPolicy(cluster, params, typical_from(pods))
    rng = random.Random(args.seed)
    rows = []
    for r in range(args.repeats + 1):
        batch = [replace(rng.choice(pods), name=f"b{r}-{i}") for i in range(args.pods)]
        plan = policy.place(batch, state)
        validate_plan(plan, state, batch)
        state = state.apply(plan.assignments).release(plan.assignments)
        if r == 0:
            continue  # warm-up: imports, caches of the typical-pod scorer
        rows.append(plan.stats)
    ms = [s.wall_ms for s in rows]
    result = {
        "nodes": args.nodes,
        "pods": args.pods,
        "repeats": args.repeats,
        "fill_pct": round(100 * state.gpu_allocated_milli / (cluster.total_gpus * 1000), 1),
        "time_limit_s": limit,
        "workers": args.workers,
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
        "gap_pct": round(max((s.gap_pct for s in rows if math.isfinite(s.gap_pct)), default=math.nan), 4),
        "fallbacks": sum(1 for s in rows if not math.isfinite(s.gap_pct)),
        "variables_p50": int(statistics.median(s.variables for s in rows)),
        "statuses": sorted({s.status for s in rows}),
    }
    columns = [
        ("nodes", "nodes", ">7"),
        ("pods", "pods", ">5"),
        ("p50 ms", "p50_ms", ">8"),
        ("p99 ms", "p99_ms", ">8"),
        ("gap %", "gap_pct", ">8"),
        ("vars", "variables_p50", ">7"),
        ("fallbacks", "fallbacks", ">9"),
    ]
    print("solver statuses:", ", ".join(result["statuses"]))
    emit(result, columns, as_json=args.json, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
