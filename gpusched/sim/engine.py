"""Replay a workload through a policy, exactly as the daemon would place it.

Each batch goes ``snapshot -> policy -> validate -> apply``; the replay
records, after every arriving pod, the arrived GPU demand and the GPU
allocation (a pod that arrives while a batch is open sees the allocation from
before that batch; the batch's placements count from its last pod on), and
reduces those records the way the published analysis does:
the arrived share is rounded to a whole percent (half to even) and the
allocation at each percent is the mean of its records.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpusched.model import Cluster, Pod
from gpusched.solver.fragmentation import TypicalPods, cluster_frag_ratio
from gpusched.solver.policy import Policy
from gpusched.solver.validate import validate_plan

__all__ = ["RunResult", "allocation_curve", "replay"]

FRAG_POINTS = (70, 90)
"""Arrived-demand percentages at which the fragmentation ratio is recorded."""


@dataclass(frozen=True)
class RunResult:
    """One replay of one policy with one seed."""

    policy: str
    seed: int
    batch: int
    curve: dict[int, float]
    """Arrived GPU demand (% of capacity) -> GPU allocation (% of capacity)."""
    frag_ratio: dict[int, float]
    """Arrived GPU demand (%) -> fragmented / idle GPU share (%)."""
    placed: int
    failed: int
    solve_ms: list[float] = field(repr=False)
    gaps: list[float] = field(repr=False, default_factory=list)

    def alloc_at(self, pct: int) -> float:
        """Allocation at ``pct`` arrived, or at the nearest recorded point below it."""
        if pct in self.curve:
            return self.curve[pct]
        below = [k for k in self.curve if k <= pct]
        return self.curve[max(below)] if below else 0.0


def allocation_curve(records: Sequence[tuple[int, float]], top: int) -> dict[int, float]:
    """Mean allocation per arrived percent; a gap takes the records within one percent."""
    by_pct: dict[int, list[float]] = defaultdict(list)
    for pct, alloc in records:
        by_pct[pct].append(alloc)
    curve: dict[int, float] = {}
    for x in range(top + 1):
        rows = by_pct.get(x)
        if not rows:
            rows = [a for k in (x - 1, x, x + 1) for a in by_pct.get(k, ())]
        if rows:
            curve[x] = round(statistics.fmean(rows), 2)
    return curve


def replay(
    cluster: Cluster,
    workload: Sequence[Pod],
    policy: Policy,
    *,
    batch: int,
    typical: TypicalPods,
    seed: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> RunResult:
    """Place ``workload`` in arrival order, ``batch`` pods per solve; unplaced pods fail."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    state = cluster.empty_state()
    gpus = cluster.total_gpus
    arrived = 0
    records: list[tuple[int, float]] = []
    frag: dict[int, float] = {}
    solve_ms: list[float] = []
    gaps: list[float] = []
    placed = failed = 0
    alloc = 0.0
    for start in range(0, len(workload), batch):
        chunk = workload[start : start + batch]
        before = state
        plan = policy.place(chunk, state)
        validate_plan(plan, state, chunk)
        state = state.apply(plan.assignments)
        placed += len(plan.assignments)
        failed += len(plan.unplaced)
        solve_ms.append(plan.stats.wall_ms)
        gaps.append(plan.stats.gap_pct)
        # Pods arriving while a batch is open see the cluster as it was; the batch's
        # placements land when its last pod has arrived.
        alloc_before, alloc = alloc, round(state.gpu_allocated_milli / gpus / 10, 2)
        for i, pod in enumerate(chunk):
            last = i == len(chunk) - 1
            arrived += pod.gpu_demand_milli
            records.append((round(arrived / gpus / 10), alloc if last else alloc_before))
            for point in FRAG_POINTS:
                if point not in frag and arrived >= point * gpus * 10:
                    frag[point] = 100.0 * cluster_frag_ratio(state if last else before, typical)
        if on_batch is not None:
            on_batch(len(chunk))
    top = max((pct for pct, _ in records), default=0)
    return RunResult(
        policy=policy.name,
        seed=seed,
        batch=batch,
        curve=allocation_curve(records, top),
        frag_ratio=frag,
        placed=placed,
        failed=failed,
        solve_ms=solve_ms,
        gaps=gaps,
    )
