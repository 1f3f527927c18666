"""An upper bound on the GPU allocation any policy can reach at a given arrival level.

    python benchmarks/upper_bound.py --trace default --seeds 42-51 --json

The offline LP relaxation of the whole tuned workload: every pod may be
placed fractionally (0..1) on the pooled capacity of the GPU models it
accepts, with CPU, memory and GPU pooled per model, and the placed GPU demand
is maximised.  No online policy can beat it, so results are also shown as a
fraction of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, trace_path
from ortools.linear_solver import pywraplp

from gpusched.cli import parse_seeds
from gpusched.model import Cluster, Pod
from gpusched.sim.protocol import prepare_workload
from gpusched.sim.trace import read_nodes, read_pods


def lp_bound(cluster: Cluster, pods: list[Pod]) -> float:
    """Largest GPU allocation (% of capacity) of the pooled LP relaxation."""
    solver = pywraplp.Solver.CreateSolver("GLOP")
    models = cluster.models
    cap = {m: [0, 0, 0] for m in models}
    for n in cluster.nodes:
        if n.gpu_count:
            c = cap[n.gpu_model]
            c[0] += n.cpu_milli
            c[1] += n.memory_mib
            c[2] += n.gpu_count * 1000
    # Pods of one shape are interchangeable: one variable per (shape, model) with the count as bound.
    shapes: dict[tuple[int, int, int, frozenset[str]], int] = defaultdict(int)
    for p in pods:
        shapes[(p.cpu_milli, p.memory_mib, p.gpu_demand_milli, p.gpu_models)] += 1
    use: dict[str, list[tuple[tuple[int, int, int], pywraplp.Variable]]] = defaultdict(list)
    objective = solver.Objective()
    for i, ((cpu, mem, gpu, accepted), count) in enumerate(shapes.items()):
        per = []
        for m in models:
            if accepted and m not in accepted:
                continue
            v = solver.NumVar(0, count, f"s{i}_{m}")
            use[m].append(((cpu, mem, gpu), v))
            per.append(v)
            objective.SetCoefficient(v, gpu)
        if per:
            solver.Add(sum(per) <= count)
    for m, items in use.items():
        for r in range(3):
            solver.Add(sum(req[r] * v for req, v in items) <= cap[m][r])
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise SystemExit("the LP relaxation did not solve to optimality")
    return 100.0 * float(objective.Value()) / (cluster.total_gpus * 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="default")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    cluster = Cluster(read_nodes(trace_path("openb_node_list_gpu_node.csv")))
    pods = read_pods(trace_path(f"openb_pod_list_{args.trace}.csv"))
    bounds = [lp_bound(cluster, prepare_workload(pods, cluster.total_gpus, seed=s, tune=args.tune)) for s in seeds]
    result = {
        "trace": args.trace,
        "tune": args.tune,
        "seeds": seeds,
        "alloc_pct_upper_bound": round(statistics.mean(bounds), 3),
        "alloc_pct_upper_bound_min": round(min(bounds), 3),
    }
    columns = [
        ("trace", "trace", "<12"),
        ("tune", "tune", ">5"),
        ("LP bound %", "alloc_pct_upper_bound", ">11"),
        ("min %", "alloc_pct_upper_bound_min", ">7"),
    ]
    emit(result, columns, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
