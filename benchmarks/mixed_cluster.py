"""A mixed GPU cluster with MIG, GPU islands and gangs: CP-SAT against every greedy baseline.

    python benchmarks/mixed_cluster.py --json

Generates (seeded) a cluster of ``--nodes`` nodes in racks of 16: H100 SXM x8
and A100-80GB x8 (NUMA islands 0-3 and 4-7; the A100 nodes may be
re-partitioned into MIG slices), L4 x4 (PCIe, islands 0-1 and 2-3) and T4 x2.
The workload mixes inference slices (MIG profiles on the A100s), single-GPU
jobs, 2/4/8-GPU training pods that require or prefer one island, and gangs of
2-16 training pods that require or prefer one rack.  Pods arrive in a seeded
order, in batches of ``--batch`` as the simulator closes them (a gang never
split), until the arrived GPU
demand reaches ``--saturation`` times the cluster's GPUs; every policy sees the
same arrivals.  Reports per policy the GPU demand placed, topology violations
(required islands and racks), partial gangs (placed below their minimum, which
here is every member), MIG slice utilisation and batch
solve times, prints a table, then one JSON object with ``cpsat_placed_gpu``,
``best_greedy_placed_gpu``, ``best_greedy_policy``, ``topology_violations``,
``partial_gangs``, ``mig_slice_util_pct``, ``solve_ms_p99``.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import save

from gpusched.model import GPU_MILLI, Cluster, ClusterState, Node, Plan, Pod, mig_plan
from gpusched.model.pod import Gang
from gpusched.model.topology import format_islands
from gpusched.sim.engine import batches, gang_outcomes, island_violations
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems

RACK = 16
"""Nodes per rack; a rack holds one node kind, as racks are bought and cabled."""
NODE_MIX = (  # (kind, share of nodes, GPUs, GPU product, islands, CPU cores, memory GiB, MIG re-partitionable)
    ("h100", 0.25, 8, "NVIDIA-H100-80GB-HBM3", (0, 0, 0, 0, 1, 1, 1, 1), 192, 2048, False),
    ("a100", 0.25, 8, "NVIDIA-A100-SXM4-80GB", (0, 0, 0, 0, 1, 1, 1, 1), 128, 1024, True),
    ("l4", 0.30, 4, "NVIDIA-L4", (0, 0, 1, 1), 64, 256, False),
    ("t4", 0.20, 2, "Tesla-T4", (0, 0), 32, 128, False),
)
H100, A100 = frozenset({"NVIDIA-H100-80GB-HBM3"}), frozenset({"NVIDIA-A100-SXM4-80GB"})
SMALL = frozenset({"NVIDIA-L4", "Tesla-T4"})
L4 = frozenset({"NVIDIA-L4"})
MIG_PROFILES = (("1g.10gb", 0.4), ("2g.20gb", 0.2), ("3g.40gb", 0.3), ("4g.40gb", 0.1))
POOLS = {  # pool -> GPU models, and the pod kinds that arrive for it with their weights
    "h100": (H100, (("gang", 0.2), ("train8", 0.15), ("train4", 0.25), ("train2", 0.15), ("single", 0.25))),
    "a100": (A100, (("slice", 0.7), ("single", 0.12), ("train2", 0.1), ("train4", 0.08))),
    "small": (SMALL, (("single", 0.5), ("train2", 0.35), ("train4", 0.15))),
}


def make_cluster(count: int, seed: int) -> Cluster:
    """``count`` nodes of ``NODE_MIX`` in racks of ``RACK`` nodes of one kind, racks in seeded order."""
    rng = random.Random(seed)
    racks: list[tuple[Any, ...]] = []
    for spec in NODE_MIX:
        racks.extend([spec] * max(1, round(spec[1] * count / RACK)))
    rng.shuffle(racks)
    kinds = [spec for spec in racks for _ in range(RACK)][:count]
    nodes = []
    for i, (kind, _, gpus, product, islands, cores, mem, mig) in enumerate(kinds):
        nodes.append(
            Node(
                f"{kind}-{i:04d}",
                cores * 1000,
                mem * 1024,
                gpu_count=gpus,
                gpu_model=product,
                labels={"rack": f"rack-{i // RACK:03d}"},
                gpu_islands=islands,
                mig_repartition=mig,
            )
        )
    return Cluster(nodes)


def _pick(rng: random.Random, weighted: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([w[0] for w in weighted], [w[1] for w in weighted])[0]


def make_workload(cluster: Cluster, saturation: float, seed: int) -> list[list[Pod]]:
    """Arrival units (a pod, or a whole gang) until their GPU demand reaches ``saturation`` x capacity.

    Each unit is for one pool of GPU models (H100 training, A100 inference and training, L4/T4
    small jobs); the next unit goes to the pool least asked for so far relative to its GPUs, so
    every pool is oversubscribed alike.
    """
    rng = random.Random(seed + 1)
    capacity = dict.fromkeys(POOLS, 0)
    for node in cluster.nodes:
        for pool, (models, _) in POOLS.items():
            capacity[pool] += node.gpu_count * (node.gpu_model in models)
    asked = dict.fromkeys(POOLS, 0)
    target = saturation * cluster.total_gpus * GPU_MILLI
    units: list[list[Pod]] = []
    demand = 0
    i = 0
    while demand < target:
        pool = min(POOLS, key=lambda p: asked[p] / max(capacity[p], 1))
        models, kinds = POOLS[pool]
        kind = _pick(rng, kinds)
        unit: list[Pod]
        if kind == "slice":
            profile = _pick(rng, MIG_PROFILES)
            c = int(profile[0])
            unit = [Pod(f"inf-{i}", 2000 * c, 8192 * c, mig_profile=profile, gpu_models=models)]
        elif kind == "single":
            unit = [Pod(f"job-{i}", 8000, 32768, num_gpu=1, gpu_milli=GPU_MILLI, gpu_models=models)]
        elif kind.startswith("train"):
            k = int(kind[5:])
            use = L4 if pool == "small" else models
            mode = (
                rng.choice(["required", "required", "preferred"]) if k < 8 and not (pool == "small" and k == 4) else ""
            )
            unit = [Pod(f"train-{i}", 6000 * k, 32768 * k, k, GPU_MILLI, use, island=mode)]
        else:
            size = rng.choice([2, 2, 4, 4, 8, 16])
            k = rng.choice([4, 8, 8])
            gang = Gang(f"gang-{i}", size, "rack", rng.choice(["required", "preferred"]))
            island = "required" if k < 8 else ""
            unit = [
                Pod(f"gang-{i}-{j}", 6000 * k, 32768 * k, k, GPU_MILLI, models, island=island, gang=gang)
                for j in range(size)
            ]
        units.append(unit)
        d = sum(p.gpu_demand_milli for p in unit)
        demand += d
        asked[pool] += d
        i += 1
    return units


@dataclass
class Outcome:
    policy: str
    placed_gpu: float = 0.0
    placed_pods: int = 0
    violations: int = 0
    partial_gangs: int = 0
    gangs_placed: int = 0
    gangs_rejected: int = 0
    mig_used: int = 0
    mig_offered: int = 0
    solve_ms: list[float] | None = None
    final: ClusterState | None = None

    def row(self, capacity: int) -> dict[str, Any]:
        ms = sorted(self.solve_ms or [0.0])
        return {
            "policy": self.policy,
            "placed_gpu": round(self.placed_gpu, 2),
            "alloc_pct": round(100 * self.placed_gpu / capacity, 2),
            "placed_pods": self.placed_pods,
            "topology_violations": self.violations,
            "partial_gangs": self.partial_gangs,
            "gangs_placed": self.gangs_placed,
            "gangs_rejected": self.gangs_rejected,
            "mig_slice_util_pct": round(100 * self.mig_used / self.mig_offered, 2) if self.mig_offered else 0.0,
            "solve_ms_p50": round(ms[len(ms) // 2], 1),
            "solve_ms_p99": round(ms[max(0, math.ceil(0.99 * len(ms)) - 1)], 1),
        }


def export(cluster: Cluster, pods: list[Pod], folder: Path) -> None:
    """The cluster and workload as simulator CSV files (docs/trace-format.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "nodes.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model", "gpu_islands", "mig_repartition", "labels"])
        for n in cluster.nodes:
            labels = ";".join(f"{k}={v}" for k, v in n.labels.items())
            islands = format_islands(n.islands)
            w.writerow(
                [
                    n.name,
                    n.cpu_milli,
                    n.memory_mib,
                    n.gpu_count,
                    n.gpu_model,
                    islands,
                    str(n.mig_repartition).lower(),
                    labels,
                ]
            )
    with (folder / "pods.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                *("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "mig_profile", "gpu_island"),
                *("gang", "gang_min", "gang_topology_key", "gang_topology"),
            ]
        )
        for p in pods:
            g = p.gang
            w.writerow(
                [p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "|".join(sorted(p.gpu_models))]
                + [p.mig_profile, p.island]
                + ([g.name, g.min_members, g.topology_key, g.topology] if g else ["", "", "", ""])
            )


def rack_violations(plan: Plan, state: ClusterState) -> int:
    """Gangs that require one rack placed across racks."""
    racks: dict[str, set[str]] = {}
    for a in plan.assignments:
        g = a.pod.gang
        if g is not None and g.topology == "required":
            racks.setdefault(g.name, set()).add(state.cluster.nodes[a.node].labels.get(g.topology_key, ""))
    return sum(1 for r in racks.values() if len(r) > 1)


def run(name: str, cluster: Cluster, arrivals: list[list[Pod]], typical: TypicalPods, params: SolverParams) -> Outcome:
    policy = make_policy(name, cluster, typical, 42, params)
    state = cluster.empty_state()
    out = Outcome(name, solve_ms=[])
    for batch in arrivals:
        start = time.perf_counter()
        plan = policy.place(batch, state)
        assert out.solve_ms is not None
        out.solve_ms.append((time.perf_counter() - start) * 1000)
        problems = plan_problems(plan, state, batch)
        out.violations += island_violations(plan.assignments, state) + rack_violations(plan, state)
        if problems:
            raise SystemExit(f"{name}: invalid plan: {problems[:3]}")
        enough, rejected, partial = gang_outcomes(batch, plan.assignments)
        out.gangs_placed += enough
        out.gangs_rejected += rejected
        out.partial_gangs += partial
        out.placed_gpu += plan.placed_gpu_milli / GPU_MILLI
        out.placed_pods += len(plan.assignments)
        state = state.partition(plan.partitions).apply(plan.assignments)
    offered = state.mig_free + state.mig
    out.mig_used, out.mig_offered = int(state.mig.sum()), int(offered.sum())
    out.final = state
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--saturation", type=float, default=1.3, help="arrived GPU demand / cluster GPUs")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--time-limit", type=float, default=0.4, help="CP-SAT seconds per batch")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--mig-plan", type=Path, help="write CP-SAT's MIG layouts as a MIG manager config here")
    ap.add_argument("--export", type=Path, help="write the cluster and workload as simulator CSVs here, then stop")
    args = ap.parse_args()

    cluster = make_cluster(args.nodes, args.seed)
    units = make_workload(cluster, args.saturation, args.seed)
    arrivals = batches([p for unit in units for p in unit], args.batch)
    pods = [p for b in arrivals for p in b]
    if args.export:
        export(cluster, pods, args.export)
        print(f"wrote {args.export / 'nodes.csv'} and {args.export / 'pods.csv'}", file=sys.stderr)
        return 0
    typical = TypicalPods.from_pods(pods)
    params = SolverParams(limits=Limits(time_limit_s=args.time_limit, workers=args.workers))
    print(
        f"{len(cluster)} nodes ({cluster.total_gpus} GPUs), {len(pods)} pods in {len(arrivals)} batches "
        f"({sum(p.gpu_demand_milli for p in pods) / GPU_MILLI:.0f} GPUs of demand), seed {args.seed}",
        file=sys.stderr,
    )
    rows = []
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        outcome = run(name, cluster, arrivals, typical, params)
        rows.append(outcome.row(cluster.total_gpus))
        if name == "cpsat" and args.mig_plan and outcome.final is not None:
            try:
                doc = mig_plan(cluster, outcome.final.partitions)
            except ValueError as exc:
                print(f"  no MIG plan written to {args.mig_plan}: {exc}", file=sys.stderr)
            else:
                args.mig_plan.parent.mkdir(parents=True, exist_ok=True)
                args.mig_plan.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"  {name}: done", file=sys.stderr)
    cols = list(rows[0])
    print(" ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>14}" for c in cols))
    greedy = [r for r in rows if r["policy"] != "cpsat"]
    cp = next((r for r in rows if r["policy"] == "cpsat"), None)
    best = max(greedy, key=lambda r: r["placed_gpu"]) if greedy else None
    result: dict[str, Any] = {
        "nodes": len(cluster),
        "gpus": cluster.total_gpus,
        "pods": len(pods),
        "batch": args.batch,
        "seed": args.seed,
        "time_limit_s": args.time_limit,
        "cpsat_placed_gpu": cp["placed_gpu"] if cp else None,
        "best_greedy_placed_gpu": best["placed_gpu"] if best else None,
        "best_greedy_policy": best["policy"] if best else None,
        "cpsat_over_best_greedy": round(cp["placed_gpu"] / best["placed_gpu"], 4) if cp and best else None,
        "topology_violations": sum(r["topology_violations"] for r in rows),
        "partial_gangs": sum(r["partial_gangs"] for r in rows),
        "mig_slice_util_pct": cp["mig_slice_util_pct"] if cp else None,
        "solve_ms_p99": cp["solve_ms_p99"] if cp else None,
        "policies": rows,
    }
    if cp and best:
        print(f"cpsat / best greedy ({best['policy']}): {result['cpsat_over_best_greedy']:.3f}")
    save(result, as_json=args.json, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
