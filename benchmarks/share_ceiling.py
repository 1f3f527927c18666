"""How much allocation the 810-thousandths shares of a trace leave on the table, by arithmetic.

    python benchmarks/share_ceiling.py --trace default --seeds 42-51 --json

A GPU holding a share of s > 500 thousandths can only be filled further by
shares of at most 1000 - s.  In the ``default`` trace the most common share
is 810, whose 190-thousandths gap only shares of 190 or less can fill, and
those are rare.  For a policy that places every such share arriving before
``--before`` of the capacity has been requested (any work-conserving policy
does, since the cluster is not full yet), the gaps they leave minus every
small share in the whole workload stay idle, which caps the allocation at
130 % arrival.  The ``ceiling_pct`` printed is that cap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, trace_path

from gpusched.cli import parse_seeds
from gpusched.model import GPU_MILLI, Cluster
from gpusched.sim.protocol import prepare_workload
from gpusched.sim.trace import read_nodes, read_pods


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="default")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--before", type=float, default=0.95, help="share of capacity requested so far")
    ap.add_argument("--share", type=int, default=810, help="shares at least this large leave the gaps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cluster = Cluster(read_nodes(trace_path("openb_node_list_gpu_node.csv")))
    pods = read_pods(trace_path(f"openb_pod_list_{args.trace}.csv"))
    cap = cluster.total_gpus * GPU_MILLI
    fill = GPU_MILLI - args.share
    ceilings = []
    for seed in parse_seeds(args.seeds):
        workload = prepare_workload(pods, cluster.total_gpus, seed=seed, tune=1.3)
        arrived = gaps = 0
        for p in workload:
            if arrived + p.gpu_demand_milli > args.before * cap:
                break
            arrived += p.gpu_demand_milli
            if p.is_fractional and p.gpu_milli >= args.share:
                gaps += GPU_MILLI - p.gpu_milli
        fillers = sum(p.gpu_milli for p in workload if p.is_fractional and p.gpu_milli <= fill)
        ceilings.append(100 * (1 - max(gaps - fillers, 0) / cap))
    result = {
        "trace": args.trace,
        "share": args.share,
        "before_pct": 100 * args.before,
        "ceiling_pct": round(statistics.mean(ceilings), 2),
        "ceiling_pct_max": round(max(ceilings), 2),
    }
    columns = [
        ("trace", "trace", "<10"),
        ("share", "share", ">5"),
        ("before %", "before_pct", ">8.0f"),
        ("ceiling %", "ceiling_pct", ">9"),
        ("max %", "ceiling_pct_max", ">6"),
    ]
    emit(result, columns, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
