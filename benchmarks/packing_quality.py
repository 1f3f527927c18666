"""Packing quality on the Alibaba GPU trace v2023, every policy side by side, against the FGD paper.

    python benchmarks/packing_quality.py --traces default --seeds 42-51 --out results/quality

For each trace: the six greedy baselines at batch 1 (the published protocol)
and CP-SAT at each ``--cpsat-batches`` size, all with the same seeds; prints
one table with the published FGD-paper number and the ratio to FGD, and writes
``OUT/quality.json`` (plus each run's summary.json and allocation.png under
``OUT/<trace>/``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import TRACE_DIR, trace_path

from gpusched.cli import parse_seeds
from gpusched.config import load_config
from gpusched.sim.runner import TYPICAL_SOURCES, run_simulation

GREEDY = ("fgd", "bestfit", "gpupacking", "gpuclustering", "dotprod", "random")
TRACES = (
    "default",
    "cpu050",
    "cpu200",
    "gpushare40",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "multigpu20",
    "multigpu30",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--seeds", default="42-51", help="seeds for the greedy baselines")
    ap.add_argument("--cpsat-seeds", default=None, help="seeds for CP-SAT (default: --seeds)")
    ap.add_argument("--cpsat-batches", default="16,64")
    ap.add_argument("--greedy", default=",".join(GREEDY))
    ap.add_argument("--config", type=Path, default=None, help="solver document for CP-SAT")
    ap.add_argument("--typical", choices=TYPICAL_SOURCES, default="online", help="CP-SAT's typical pods")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/quality"))
    args = ap.parse_args()

    params = load_config(args.config.read_text(), str(args.config)).solver_params() if args.config else None
    pub_path = TRACE_DIR.parent / "fgd_published_alloc.csv"
    rows: list[dict[str, Any]] = []
    nodes = trace_path("openb_node_list_gpu_node.csv")
    for trace in args.traces.split(","):
        pods = trace_path(f"openb_pod_list_{trace}.csv")
        runs = [(args.greedy.split(","), 1, parse_seeds(args.seeds))]
        runs += [
            (["cpsat"], int(b), parse_seeds(args.cpsat_seeds or args.seeds)) for b in args.cpsat_batches.split(",") if b
        ]
        for policies, batch, seeds in runs:
            if not policies or not policies[0]:
                continue
            name = f"{'-'.join(policies) if len(policies) == 1 else 'greedy'}-b{batch}"
            if args.typical == "trace" and policies == ["cpsat"]:
                name += "-typical-trace"
            out = args.out / trace / name
            summaries = run_simulation(
                nodes,
                pods,
                policies,
                batch,
                seeds,
                1.3,
                out,
                params,
                progress=False,
                jobs=args.jobs,
                published=pub_path if pub_path.exists() else None,
                trace=trace,
                typical_source=args.typical,
            )
            for s in summaries:
                s["trace"] = trace
                rows.append(s)
            (args.out / "quality.json").parent.mkdir(parents=True, exist_ok=True)
            (args.out / "quality.json").write_text(json.dumps(rows, indent=1))
    fgd = {(r["trace"]): r["alloc_pct_130"] for r in rows if r["policy"] == "fgd"}
    print(
        f"{'trace':<11} {'policy':<14} {'batch':>5} {'seeds':>5} {'alloc@130':>9} {'±':>5} {'paper':>6} "
        f"{'vs FGD':>7} {'idle GPUs':>9}"
    )
    for r in rows:
        paper = r.get("fgd_published_alloc_pct_130")
        ratio = r["alloc_pct_130"] / fgd[r["trace"]] if r["trace"] in fgd else float("nan")
        print(
            f"{r['trace']:<11} {r['policy']:<14} {r['batch']:>5} {len(r['seeds']):>5} "
            f"{r['alloc_pct_130']:>9.2f} {r['alloc_pct_130_std']:>5.2f} "
            f"{paper if paper is not None else '':>6} {ratio:>7.4f} "
            f"{r['unallocated_gpus_130']:>9}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
