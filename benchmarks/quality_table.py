"""Merge packing-quality results into one side-by-side table (Markdown), with ratios to FGD.

    python benchmarks/quality_table.py results/greedy/quality.json results/cpsat-default/quality.json ...

Each input is a ``quality.json`` written by ``packing_quality.py``; rows are
keyed by (trace, policy label, batch).  The ratio column divides by our FGD
re-implementation's allocation on the same trace, the "paper" column is the
FGD paper's number, and "of bound" divides by the LP upper bound when
``--bound PCT`` is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _pct(value: float | None) -> str:
    """A percentage to two places; ``-`` for a figure no batch reached."""
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--label", action="append", default=[], help="FILE=LABEL: name the cpsat rows of FILE")
    ap.add_argument("--bound", type=float, default=None, help="upper bound on allocation %% at 130%%")
    args = ap.parse_args()
    labels = dict(x.split("=", 1) for x in args.label)
    rows: list[dict[str, Any]] = []
    for f in args.files:
        for r in json.loads(f.read_text()):
            name = r["policy"]
            if name == "cpsat" and str(f) in labels:
                name = f"cpsat ({labels[str(f)]})"
            rows.append({**r, "label": name})
    fgd = {r["trace"]: r["alloc_pct_130"] for r in rows if r["policy"] == "fgd"}
    paper_fgd = {r["trace"]: r.get("fgd_published_alloc_pct_130") for r in rows if r["policy"] == "fgd"}
    head = (
        "| trace | policy | batch | seeds | alloc % @100 | alloc % @130 | ± | paper (same policy) "
        "| vs our FGD | vs paper FGD | idle GPUs |"
    )
    if args.bound:
        head += " of bound |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        paper = r.get("fgd_published_alloc_pct_130")
        ratio = r["alloc_pct_130"] / fgd[r["trace"]] if r["trace"] in fgd else None
        pf = paper_fgd.get(r["trace"])
        vs_paper = r["alloc_pct_130"] / pf if pf else None
        line = (
            f"| {r['trace']} | {r['label']} | {r['batch']} | {len(r['seeds'])} | {_pct(r['alloc_pct_100'])} | "
            f"{r['alloc_pct_130']:.2f} | {r['alloc_pct_130_std']:.2f} | {paper if paper is not None else ''} | "
            f"{f'{ratio:.4f}' if ratio else ''} | {f'{vs_paper:.4f}' if vs_paper else ''} | "
            f"{r['unallocated_gpus_130']} |"
        )
        if args.bound:
            line += f" {r['alloc_pct_130'] / args.bound:.4f} |"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
