"""Placements: which node and which GPU indices each pod gets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpusched.model.mig import MigLayout
from gpusched.model.pod import Pod, PodShape

__all__ = ["Assignment", "MigPartition", "Plan", "SolveStats"]

MigPartition = tuple[int, int, MigLayout]
"""A MIG layout chosen for idle GPU ``g`` of node ``n``: ``(n, g, layout)``."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """One pod on one node (by index into the cluster), on the listed GPU indices."""

    pod: Pod
    node: int
    gpus: tuple[int, ...] = ()

    @property
    def shape(self) -> PodShape:
        """The pod's resource shape."""
        return self.pod.shape


@dataclass(frozen=True, slots=True)
class SolveStats:
    """How a plan was found: solver status, objective, bound, gap and wall time."""

    policy: str
    status: str = "HEURISTIC"
    objective: float = 0.0
    bound: float = 0.0
    wall_ms: float = 0.0
    variables: int = 0

    @property
    def gap_pct(self) -> float:
        """Relative gap between objective and bound, in percent (0 when proven optimal, NaN when
        the solver found nothing and the plan is a fallback)."""
        if math.isnan(self.bound) or math.isnan(self.objective):
            return math.nan
        if self.bound == self.objective:
            return 0.0
        denom = max(abs(self.bound), abs(self.objective), 1e-9)
        return 100.0 * abs(self.bound - self.objective) / denom


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's answer for one batch: placed pods and pods it could not place."""

    assignments: tuple[Assignment, ...]
    unplaced: tuple[Pod, ...]
    stats: SolveStats = field(default_factory=lambda: SolveStats(policy="none"))
    partitions: tuple[MigPartition, ...] = ()
    """MIG layouts the plan needs on idle re-partitionable GPUs, applied before its assignments."""

    @property
    def placed_gpu_milli(self) -> int:
        """GPU demand placed by this plan, thousandths of a GPU."""
        return sum(a.pod.gpu_demand_milli for a in self.assignments)
