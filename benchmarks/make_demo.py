"""Build the bundled demo cluster and workload from the Alibaba GPU trace v2023 (openb).

Usage::

    python benchmarks/make_demo.py --source /path/to/alibaba-gpu-v2023/csv

Nodes are sampled stratified by node type (CPU, memory, GPU count and GPU
model), pods stratified by request class (CPU-only, fractional GPU, one whole
GPU, each multi-GPU count).  Each stratum gets its share of the sample by
largest remainder, and its rows are drawn without replacement with a seeded
generator, so the same source and seed always give byte-identical files.
Sampled rows keep their original names and appear in source order.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from fractions import Fraction
from pathlib import Path

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "gpusched" / "sim" / "demo"

Row = dict[str, str]


def read_rows(path: Path, columns: Sequence[str]) -> list[Row]:
    """Rows of ``path`` restricted to ``columns`` (every one must be present)."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"{path}: missing column(s) {', '.join(missing)}")
        return [{c: (row[c] or "").strip() for c in columns} for row in reader]


def apportion(sizes: dict[Hashable, int], total: int) -> dict[Hashable, int]:
    """Split ``total`` over strata in proportion to ``sizes`` (largest remainder, ties by key order)."""
    population = sum(sizes.values())
    if not 0 < total <= population:
        raise SystemExit(f"cannot sample {total} of {population} rows")
    exact = {k: Fraction(n * total, population) for k, n in sizes.items()}
    counts = {k: int(q) for k, q in exact.items()}
    order = sorted(exact, key=lambda k: (-(exact[k] - counts[k]), str(k)))
    for k in order[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def stratified_sample(
    rows: Sequence[Row], total: int, stratum: Callable[[Row], Hashable], rng: random.Random
) -> list[Row]:
    """``total`` rows drawn per stratum without replacement, returned in source order."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[stratum(row)].append(i)
    counts = apportion({k: len(v) for k, v in groups.items()}, total)
    picked: list[int] = []
    for key in sorted(groups, key=str):
        picked.extend(rng.sample(groups[key], counts[key]))
    return [rows[i] for i in sorted(picked)]


def node_type(row: Row) -> tuple[str, int, int, int]:
    return (row["model"], int(row["gpu"]), int(row["cpu_milli"]), int(row["memory_mib"]))


def pod_class(row: Row) -> str:
    gpus = int(row["num_gpu"] or 0)
    if gpus == 0:
        return "cpu-only"
    if gpus == 1:
        return "whole-1" if int(row["gpu_milli"]) >= 1000 else "fractional"
    return f"whole-{gpus}"


def write_rows(path: Path, columns: Sequence[str], rows: Sequence[Row]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def gpu_demand(rows: Sequence[Row]) -> float:
    return sum(int(r["num_gpu"] or 0) * int(r["gpu_milli"] or 0) for r in rows) / 1000


def readme(nodes: Sequence[Row], pods: Sequence[Row], seed: int, all_nodes: int, all_pods: int) -> str:
    gpus = sum(int(n["gpu"]) for n in nodes)
    by_type: dict[tuple[str, int, int, int], int] = defaultdict(int)
    for n in nodes:
        by_type[node_type(n)] += 1
    by_class: dict[str, int] = defaultdict(int)
    for p in pods:
        by_class[pod_class(p)] += 1
    type_rows = "\n".join(
        f"| {m} | {g} | {c // 1000} | {mem // 1024} | {k} |"
        for (m, g, c, mem), k in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    class_rows = "\n".join(f"| {c} | {k} |" for c, k in sorted(by_class.items(), key=lambda kv: -kv[1]))
    demand = gpu_demand(pods)
    return f"""# Demo cluster and workload

A small sample of the Alibaba GPU cluster trace v2023 (the "openb" trace), bundled
so that `gpusched simulate` runs with no arguments.

## Source and licence

- Data: Alibaba `cluster-trace-gpu-v2023`, <https://github.com/alibaba/clusterdata>
  (files `{NODE_FILE}` and `{POD_FILE}`).
- Paper: Qizhen Weng, Lingyun Yang, Yinghao Yu, Wei Wang, Xiaochuan Tang, Guodong Yang,
  Liping Zhang. "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
  Fragmentation Gradient Descent". USENIX ATC 2023.
- The trace is released for research and study use. Cite the paper above when you
  report results obtained with this data, including results on this sample.

## Contents

- `nodes.csv`: {len(nodes)} of the {all_nodes} GPU nodes, {gpus} GPUs
  (columns `{",".join(NODE_COLUMNS)}`).
- `pods.csv`: {len(pods)} of the {all_pods} pods of the `default` trace, {demand:.1f} GPUs of
  demand (columns `{",".join(POD_COLUMNS)}`).

Node types (sampled stratified, so the mix follows the full cluster):

| GPU model | GPUs | CPU cores | memory GiB | nodes |
|---|---|---|---|---|
{type_rows}

Pod classes (sampled stratified by class):

| class | pods |
|---|---|
{class_rows}

Numbers measured on this sample are not comparable with the published results for
the full trace; use the full files for that.

## Regenerating

```
python benchmarks/make_demo.py --source <dir with the openb csv files> --seed {seed}
```

The sampling is seeded and deterministic: the same source files and seed give the
same output byte for byte.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="directory with the openb CSV files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=120, help="GPU nodes to sample (default: %(default)s)")
    parser.add_argument("--pods", type=int, default=1000, help="pods to sample (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=2023, help="sampling seed (default: %(default)s)")
    args = parser.parse_args(argv)

    node_rows = [r for r in read_rows(args.source / NODE_FILE, NODE_COLUMNS) if int(r["gpu"] or 0) > 0]
    pod_rows = read_rows(args.source / POD_FILE, POD_COLUMNS)
    rng = random.Random(args.seed)
    nodes = stratified_sample(node_rows, args.nodes, node_type, rng)
    pods = stratified_sample(pod_rows, args.pods, pod_class, rng)

    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "nodes.csv", NODE_COLUMNS, nodes)
    write_rows(args.out / "pods.csv", POD_COLUMNS, pods)
    (args.out / "README.md").write_text(readme(nodes, pods, args.seed, len(node_rows), len(pod_rows)), encoding="utf-8")
    gpus = sum(int(n["gpu"]) for n in nodes)
    print(
        f"wrote {args.out}: {len(nodes)} nodes ({gpus} GPUs), {len(pods)} pods ({gpu_demand(pods):.1f} GPUs of demand)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
