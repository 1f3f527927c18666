"""Replay a workload through a policy, exactly as the daemon would place it.

Each batch goes ``snapshot -> policy -> validate -> apply``; the replay
records, after every arriving pod, the arrived GPU demand and the GPU
allocation (a pod that arrives while a batch is open sees the allocation from
before that batch; the batch's placements count from its last pod on), and
reduces those records the way the published analysis does:
the arrived share is rounded to a whole percent (half to even) and the
allocation at each percent is the mean of its records.

The members of a gang arrive together, where its first member comes in the
arrival order, and always go into one solve: a batch is closed once it holds
at least ``batch`` pods, so a batch that takes a gang may hold more.  A
plan's MIG partitions are applied before its assignments.  Besides the
allocation the replay counts MIG instances in use and offered at the end,
assignments that break a required GPU island, and gangs placed (at least
their minimum), rejected whole, or placed below their minimum (that check
must stay at 0).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpusched.model import Assignment, Cluster, ClusterState, Pod
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.fragmentation import TypicalPods, cluster_frag_ratio
from gpusched.solver.policy import Policy
from gpusched.solver.validate import island_problems, validate_plan

__all__ = ["RunResult", "allocation_curve", "arrival_units", "batches", "gang_outcomes", "island_violations", "replay"]

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
    extended: bool = False
    """The cluster or the workload uses MIG, GPU islands or gangs (the counters below matter)."""
    mig_in_use: int = 0
    """MIG instances taken by pods at the end of the run."""
    mig_offered: int = 0
    """MIG instances on offer at the end: advertised plus those of re-partitioned GPUs."""
    island_violations: int = 0
    """Placed pods that require one GPU island but got GPUs of several (must be 0)."""
    gangs_placed: int = 0
    """Gangs with at least their minimum of members placed."""
    gangs_rejected: int = 0
    """Gangs with no member placed."""
    gangs_partial: int = 0
    """Gangs with some members placed, but fewer than their minimum (must be 0)."""
    declined: int = 0
    """Of ``failed``, pods the policy left out although they fit the cluster after its batch
    (as many of them as best fit places there together)."""
    first_end: int = 0
    """Arrived GPU demand (%) when the first batch's placements landed: the curve below it is the
    empty cluster's."""
    batch_span_pct: float = 0.0
    """The most arrived GPU demand (% of capacity) one batch spanned, first pod to last: in that
    span its pods are counted as not placed yet (0 for one pod per batch)."""

    def reached(self, pct: int) -> bool:
        """Whether the curve says something at ``pct``: a batch had landed by then, and the
        workload arrived that far."""
        return self.first_end <= pct <= max(self.curve, default=0) and any(k <= pct for k in self.curve)

    @property
    def mig_util_pct(self) -> float | None:
        """MIG instances in use as a percentage of those offered; None when none are offered."""
        return 100.0 * self.mig_in_use / self.mig_offered if self.mig_offered else None

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


def _frag_at_points(records: Sequence[tuple[int, float]]) -> dict[int, float]:
    """The fragmentation ratio at each of ``FRAG_POINTS``: the mean of the records of that
    arrived percent, as the reference reduces them (a percent without records takes those within
    one percent, as ``allocation_curve``); none for a point the run did not come near."""
    by_pct: dict[int, list[float]] = defaultdict(list)
    for pct, value in records:
        by_pct[pct].append(value)
    out: dict[int, float] = {}
    for point in FRAG_POINTS:
        rows = by_pct.get(point) or [v for k in (point - 1, point, point + 1) for v in by_pct.get(k, ())]
        if rows:
            out[point] = statistics.fmean(rows)
    return out


def arrival_units(workload: Sequence[Pod]) -> list[list[Pod]]:
    """The workload as units that arrive together: one pod, or every member of a gang where its
    first member comes (members in arrival order)."""
    units: list[list[Pod]] = []
    gangs: dict[str, list[Pod]] = {}
    for pod in workload:
        if pod.gang is None:
            units.append([pod])
        elif pod.gang.name in gangs:
            gangs[pod.gang.name].append(pod)
        else:
            gangs[pod.gang.name] = [pod]
            units.append(gangs[pod.gang.name])
    return units


def batches(workload: Sequence[Pod], batch: int) -> list[list[Pod]]:
    """The solves of a replay: whole arrival units, each batch closed once it holds ``batch`` pods."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    out: list[list[Pod]] = []
    current: list[Pod] = []
    for unit in arrival_units(workload):
        current.extend(unit)
        if len(current) >= batch:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def island_violations(assignments: Iterable[Assignment], state: ClusterState) -> int:
    """Assignments of pods that require one island whose GPUs lie in more than one."""
    return len(island_problems(assignments, state))


def gang_outcomes(pods: Iterable[Pod], placed: Iterable[Assignment]) -> tuple[int, int, int]:
    """Gangs of ``pods`` with at least their minimum placed, with none placed, and with some but
    fewer than their minimum."""
    least: dict[str, int] = {}
    done: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.gang is not None:
            least[pod.gang.name] = pod.gang.min_members
    for a in placed:
        if a.pod.gang is not None:
            done[a.pod.gang.name] += 1
    enough = sum(1 for name, n in least.items() if done[name] >= n)
    rejected = sum(1 for name in least if not done[name])
    return enough, rejected, len(least) - enough - rejected


def _extended(cluster: Cluster, workload: Sequence[Pod]) -> bool:
    return any(p.mig_profile or p.island or p.gang is not None for p in workload) or any(
        n.gpu_islands or n.mig_slices or n.mig_repartition for n in cluster.nodes
    )


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
    """Place ``workload`` in arrival order, ``batch`` pods per solve (a gang whole in one solve);
    unplaced pods fail."""
    chunks = batches(workload, batch)
    state = cluster.empty_state()
    gpus = cluster.total_gpus
    arrived = 0
    records: list[tuple[int, float]] = []
    frag_records: list[tuple[int, float]] = []  # (arrived percent, fragmentation %) near FRAG_POINTS
    solve_ms: list[float] = []
    gaps: list[float] = []
    placed = failed = declined = violations = 0
    gang_pods: list[Pod] = []
    gang_assignments: list[Assignment] = []
    alloc = 0.0
    first_end: int | None = None
    span = 0.0
    for chunk in chunks:
        before = state
        plan = policy.place(chunk, state)
        validate_plan(plan, state, chunk)
        if plan.partitions:
            state = state.partition(plan.partitions)
        state = state.apply(plan.assignments)
        violations += island_violations(plan.assignments, state)
        gang_pods.extend(p for p in chunk if p.gang is not None)
        gang_assignments.extend(a for a in plan.assignments if a.pod.gang is not None)
        placed += len(plan.assignments)
        failed += len(plan.unplaced)
        # Of those, as many as still fit together (best fit) were turned away by the policy:
        # it may (a deferring objective, a time limit), but the replay offers no pod again.
        left = [p for p in plan.unplaced if p.gang is None and state.pod_mask(p).any()]
        if left:
            declined += len(BestFitPolicy().place(left, state).assignments)  # its own: ties alike every time
        solve_ms.append(plan.stats.wall_ms)
        gaps.append(plan.stats.gap_pct)
        # Pods arriving while a batch is open see the cluster as it was; the batch's
        # placements land when its last pod has arrived.
        alloc_before, alloc = alloc, round(state.gpu_allocated_milli / gpus / 10, 2)
        first_arrived = arrived + chunk[0].gpu_demand_milli
        ratio: dict[bool, float] = {}  # the state before the batch, and after it: each read once
        for i, pod in enumerate(chunk):
            last = i == len(chunk) - 1
            arrived += pod.gpu_demand_milli
            pct = round(arrived / gpus / 10)
            records.append((pct, alloc if last else alloc_before))
            if any(abs(pct - point) <= 1 for point in FRAG_POINTS):
                if last not in ratio:
                    ratio[last] = 100.0 * cluster_frag_ratio(state if last else before, typical)
                frag_records.append((pct, ratio[last]))
        span = max(span, (arrived - first_arrived) / gpus / 10)
        if first_end is None:
            first_end = round(arrived / gpus / 10)
        if on_batch is not None:
            on_batch(len(chunk))
    top = max((pct for pct, _ in records), default=0)
    in_use = int(state.mig.sum())
    whole, rejected, partial = gang_outcomes(gang_pods, gang_assignments)
    return RunResult(
        policy=policy.name,
        seed=seed,
        batch=batch,
        curve=allocation_curve(records, top),
        first_end=first_end or 0,
        batch_span_pct=round(span, 2),
        frag_ratio=_frag_at_points(frag_records),
        placed=placed,
        failed=failed,
        declined=declined,
        solve_ms=solve_ms,
        gaps=gaps,
        extended=_extended(cluster, workload),
        mig_in_use=in_use,
        mig_offered=int(state.mig_free.sum()) + in_use,
        island_violations=violations,
        gangs_placed=whole,
        gangs_rejected=rejected,
        gangs_partial=partial,
    )
