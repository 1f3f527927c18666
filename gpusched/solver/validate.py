"""Independent checks of a plan, shared by tests and the binder.

Nothing here trusts the policy that made the plan: capacities are recomputed
from the state and the assignments alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from gpusched.model import GPU_MILLI, ClusterState, Plan, Pod

__all__ = ["PlanError", "plan_problems", "validate_plan"]


class PlanError(ValueError):
    """A plan that must not be written to the cluster."""


def plan_problems(plan: Plan, state: ClusterState, pods: Sequence[Pod] | None = None) -> list[str]:
    """Every reason ``plan`` is invalid against ``state`` (empty when valid)."""
    problems: list[str] = []
    cluster = state.cluster
    seen: set[str] = set()
    for p in [a.pod for a in plan.assignments] + list(plan.unplaced):
        if p.key in seen:
            problems.append(f"pod {p.key} appears more than once in the plan")
        seen.add(p.key)
    if pods is not None:
        expected = {p.key for p in pods}
        for k in sorted(expected - seen):
            problems.append(f"pod {k} is missing from the plan")
        for k in sorted(seen - expected):
            problems.append(f"pod {k} is in the plan but not in the batch")
    cpu: dict[int, int] = defaultdict(int)
    mem: dict[int, int] = defaultdict(int)
    gpu: dict[tuple[int, int], int] = defaultdict(int)
    whole: set[tuple[int, int]] = set()
    for a in plan.assignments:
        p = a.pod
        if not 0 <= a.node < len(cluster):
            problems.append(f"pod {p.key}: node index {a.node} is not in the cluster")
            continue
        node = cluster.nodes[a.node]
        cpu[a.node] += p.cpu_milli
        mem[a.node] += p.memory_mib
        if len(a.gpus) != p.num_gpu:
            problems.append(f"pod {p.key}: asked for {p.num_gpu} GPUs, got indices {list(a.gpus)}")
        if len(set(a.gpus)) != len(a.gpus):
            problems.append(f"pod {p.key}: GPU index repeated in {list(a.gpus)}")
        if p.num_gpu and not p.shape.accepts(node.gpu_model):
            problems.append(f"pod {p.key}: GPU model {node.gpu_model!r} on {node.name} is not accepted")
        for g in a.gpus:
            if not 0 <= g < node.gpu_count:
                problems.append(f"pod {p.key}: {node.name} has no GPU {g}")
                continue
            gpu[(a.node, g)] += p.gpu_milli
            if not p.is_fractional:
                if (a.node, g) in whole:
                    problems.append(f"pod {p.key}: GPU {g} on {node.name} is already taken whole")
                whole.add((a.node, g))
                if state.gpu_used[a.node, g] != 0:
                    problems.append(f"pod {p.key}: GPU {g} on {node.name} is not idle")
    for n, c in cpu.items():
        if c > state.cpu_free[n]:
            problems.append(f"{cluster.nodes[n].name}: CPU over-committed ({c}m > {state.cpu_free[n]}m free)")
    for n, m in mem.items():
        if m > state.mem_free[n]:
            problems.append(f"{cluster.nodes[n].name}: memory over-committed ({m}Mi > {state.mem_free[n]}Mi)")
    for (n, g), used in gpu.items():
        if g < cluster.nodes[n].gpu_count and used > state.gpu_free[n, g]:
            problems.append(
                f"{cluster.nodes[n].name}: GPU {g} over-committed ({used} > {state.gpu_free[n, g]} of {GPU_MILLI} free)"
            )
    return problems


def validate_plan(plan: Plan, state: ClusterState, pods: Sequence[Pod] | None = None) -> None:
    """Raise ``PlanError`` listing every problem when ``plan`` is invalid."""
    problems = plan_problems(plan, state, pods)
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PlanError(f"invalid plan from {plan.stats.policy}: {shown}{more}")
