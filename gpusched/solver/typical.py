"""Typical pods learnt from the workload seen so far, for policies that run online."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpusched.model import Cluster, Pod
from gpusched.solver.fragmentation import FragScorer, TypicalPods, TypicalShape

__all__ = ["TypicalTracker"]


class TypicalTracker:
    """Counts the shapes of every pod seen and keeps a ``FragScorer`` for the current typical set.

    The set is re-derived when the number of pods seen has grown by ``regrow``
    (25% by default) since it was last derived, so early batches adapt quickly
    and later ones keep their caches.
    """

    def __init__(self, cluster: Cluster, fixed: TypicalPods | None = None, regrow: float = 0.25) -> None:
        self.cluster = cluster
        self.fixed = fixed
        self.regrow = regrow
        self.counts: Counter[TypicalShape] = Counter()
        self.seen = 0
        self._derived_at = 0
        self._scorer: FragScorer | None = FragScorer(cluster, fixed) if fixed else None

    def observe(self, pods: Iterable[Pod]) -> None:
        """Count ``pods`` as seen."""
        for p in pods:
            self.counts[TypicalShape.of(p)] += 1
            self.seen += 1

    @property
    def scorer(self) -> FragScorer:
        """The scorer for the current typical set (re-derived when the workload has grown)."""
        stale = self._scorer is None or self.seen >= self._derived_at * (1 + self.regrow)
        if self.fixed is None and stale and self.counts:
            self._scorer = FragScorer(self.cluster, TypicalPods.from_counts(self.counts))
            self._derived_at = self.seen
        if self._scorer is None:
            raise ValueError("no typical pods yet: observe the batch before scoring it")
        return self._scorer
