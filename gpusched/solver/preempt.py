"""Preemption: which running pods of lower priority to evict so that a pending pod fits.

As kube-scheduler's DefaultPreemption chooses them, on the books as they are after a batch:

1. Only a pod that may preempt (``Pod.preempts``: its ``preemptionPolicy`` is not ``Never``)
   and only pods of strictly lower priority that are not being deleted already.
2. Per node with such pods: remove them all; if the pod then fits there, add them back one
   by one, those a PodDisruptionBudget protects first, each group highest priority first,
   keeping each one the pod still fits beside (kube-scheduler's "reprieve"). What is left are
   the node's victims.  A victim is protected when evicting it (with those before it on the
   node) would take a budget it matches below zero (``status.disruptionsAllowed``).
3. Of the nodes where the pod fits so, the one with the fewest protected victims, then the one
   whose most important victim has the lowest priority, then the lowest sum of victim
   priorities each raised by 2^31 (so that fewer victims come first), then the first in the
   cluster's order.  As kube-scheduler does, the search stops once it has
   ``max(min_candidates, 10 % of the nodes)`` candidate nodes, or sooner at a node where one
   unprotected pod of the lowest priority there is makes room, which no later node can beat.

The result names the GPU indices the pod would take there, so that the scheduler can hold them
for it while its victims terminate.  As with kube-scheduler, a budget only steers the choice:
when every way to make room breaks one, one is broken.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.model import Assignment, ClusterState, Pod
from gpusched.model.affinity import Requirement, label_selector_selects
from gpusched.solver.baselines.base import GreedyPolicy

__all__ = ["MIN_CANDIDATES", "Budget", "Preemption", "find_preemption", "plan_preemptions"]

MIN_CANDIDATES = 100
"""Candidate nodes to find before choosing among them (kube-scheduler's default), at least."""

_GPUS = GreedyPolicy()  # only its GPU choice on one node is used: stateless


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption reads it."""

    namespace: str
    selector: tuple[Requirement, ...]
    """Its label selector; empty selects no pod (as kube-scheduler's preemption reads it)."""
    allowed: int
    """``status.disruptionsAllowed``: how many of its pods may go now."""
    disrupted: frozenset[str] = frozenset()
    """``status.disruptedPods``: pods whose eviction it has counted already."""

    def covers(self, pod: Pod) -> bool:
        """Whether evicting ``pod`` spends this budget."""
        return (
            bool(self.selector)
            and pod.namespace == self.namespace
            and pod.name not in self.disrupted
            and label_selector_selects(self.selector, dict(pod.labels))
        )


@dataclass(frozen=True)
class Preemption:
    """Evict ``victims`` so that ``placement`` (the pending pod on their node) fits."""

    placement: Assignment
    victims: tuple[Assignment, ...]
    violations: int = 0
    """Victims whose eviction breaks a PodDisruptionBudget."""

    @property
    def pod(self) -> Pod:
        """The pod that preempts."""
        return self.placement.pod

    @property
    def node(self) -> int:
        """The node the victims leave."""
        return self.placement.node


_SHIFT = 2**31
"""Added to each victim's priority in the sum, as kube-scheduler does, so that the sum counts
victims first: fewer victims of higher priority beat more of lower priority."""


def _rank(victims: Sequence[Assignment], violations: int, node: int) -> tuple[int, int, int, int, int]:
    prio = [v.pod.priority for v in victims]
    return (violations, max(prio), sum(p + _SHIFT for p in prio), len(prio), node)


def _protected(lower: Sequence[Assignment], budgets: Sequence[Budget], spent: Sequence[int]) -> set[int]:
    """Indices into ``lower`` (most important first) of the pods whose eviction, with those
    before them, would take a budget below zero (``spent``: what earlier preemptions of this
    round took from each)."""
    left = [b.allowed - s for b, s in zip(budgets, spent, strict=True)]
    out = set()
    for i, a in enumerate(lower):
        if not a.pod.labels:
            continue
        for j, b in enumerate(budgets):
            if b.covers(a.pod):
                left[j] -= 1
                if left[j] < 0:
                    out.add(i)
    return out


def _lower(pod: Pod, running: Sequence[Assignment]) -> list[Assignment]:
    """The pods of ``running`` that ``pod`` may evict."""
    return [a for a in running if a.pod.priority < pod.priority and not a.pod.terminating]


def find_preemption(
    pod: Pod,
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int = MIN_CANDIDATES,
    *,
    lowered: ClusterState | None = None,
    budgets: Sequence[Budget] = (),
    spent: Sequence[int] | None = None,
) -> Preemption | None:
    """The preemption that lets ``pod`` fit with the least harm, or None when evicting pods of
    lower priority cannot make room for it anywhere.  ``running``: the pods that may be evicted
    (bound, not being deleted), as they are counted in ``state``.  ``lowered``: ``state``
    without every pod ``pod`` may evict (found here when not given: a caller searching for
    several pods of one priority finds it once).  ``budgets``: the PodDisruptionBudgets, and
    ``spent`` how much of each earlier preemptions took (none when not given)."""
    if not pod.preempts:
        return None
    by_node: dict[int, list[Assignment]] = defaultdict(list)
    for a in _lower(pod, running):
        by_node[a.node].append(a)
    if not by_node:
        return None
    # Nodes where it cannot fit even with every pod of lower priority gone are not worth a look.
    # (Gone everywhere at once, those pods may take a pod affinity peer away: such a node is
    # missed, never wrongly chosen, since each node is checked on its own below.)
    if lowered is None:
        lowered = state.release(a for lower in by_node.values() for a in lower)
    possible = lowered.pod_mask(pod)
    # One private state, updated in place node after node and left as it was after each one: a
    # state per trial would copy the whole cluster's arrays thousands of times.
    work = state.apply(())
    want = max(min_candidates, len(state.cluster) // 10)
    least = min(a.pod.priority for lower in by_node.values() for a in lower)
    unbeatable = (0, least, least + _SHIFT, 1)  # one unprotected victim of the lowest priority there is
    spent = [0] * len(budgets) if spent is None else spent
    best: tuple[tuple[int, int, int, int, int], Preemption] | None = None
    found = 0
    for node in sorted(n for n in by_node if possible[n]):
        lower = sorted(by_node[node], key=lambda a: (-a.pod.priority, a.pod.key))
        work = work.release(lower, consume=True)
        if not work.pod_mask(pod)[node]:
            work = work.apply(lower, consume=True)
            continue
        shielded = _protected(lower, budgets, spent) if budgets else set()
        order = sorted(range(len(lower)), key=lambda i: i not in shielded)  # stable: priority order kept
        victims: list[Assignment] = []
        violations = 0
        for i in order:  # reprieve: the protected first, then the rest, most important first
            work = work.apply([lower[i]], consume=True)
            if not work.pod_mask(pod)[node]:
                work = work.release([lower[i]], consume=True)
                victims.append(lower[i])
                violations += i in shielded
        if victims:  # else it fits without evicting anyone (the batch left it out for another reason)
            found += 1
            key = _rank(victims, violations, node)
            if best is None or key < best[0]:
                placement = Assignment(pod, node, _GPUS.gpus(pod, work, node))
                best = (key, Preemption(placement, tuple(victims), violations))
        work = work.apply(victims, consume=True)
        if found >= want or (best is not None and best[0][:4] == unbeatable):
            break
    return None if best is None else best[1]


def plan_preemptions(
    pods: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int = MIN_CANDIDATES,
    budgets: Sequence[Budget] = (),
) -> list[Preemption]:
    """Preemptions for ``pods`` in turn (highest priority first), each against the state the
    earlier ones leave (their victims gone, their pods placed, the budgets they spent): no two
    take the same room, and no pod is evicted twice."""
    out: list[Preemption] = []
    spent = [0] * len(budgets)
    left = list(running)
    level: int | None = None
    lowered = state
    for pod in sorted(pods, key=lambda p: -p.priority):
        if pod.priority != level:  # the pods a pod of this priority may evict, all gone at once
            level = pod.priority
            lowered = state.release(_lower(pod, left))
        found = find_preemption(pod, state, left, min_candidates, lowered=lowered, budgets=budgets, spent=spent)
        if found is None:
            continue
        out.append(found)
        for j, b in enumerate(budgets):
            spent[j] += sum(1 for v in found.victims if v.pod.labels and b.covers(v.pod))
        gone = {id(v) for v in found.victims}
        left = [a for a in left if id(a) not in gone]
        state = state.release(found.victims).apply([found.placement])
        lowered = lowered.apply([found.placement], consume=True)  # its victims are out of it already
    return out
