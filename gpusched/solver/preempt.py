"""Preemption: which running pods of lower priority to evict so that a pending pod fits.

As kube-scheduler's DefaultPreemption chooses them, on the books as they are after a batch:

1. Only a pod that may preempt (``Pod.preempts``: its ``preemptionPolicy`` is not ``Never``)
   and only pods of strictly lower priority that are not being deleted already.
2. Per node with such pods: remove them all; if the pod then fits there, add them back one
   by one, those a PodDisruptionBudget protects first, each group highest priority first (and
   of equal priority, the one that started first), keeping each one the pod still fits beside
   (kube-scheduler's "reprieve"). What is left are the node's victims.  A victim is protected
   when evicting it (with those before it on the node) would take a budget it matches below
   zero (``status.disruptionsAllowed``); a pod with no labels matches none, as kube-scheduler
   reads them.  A running gang is such a budget too
   (``gang_budgets``), allowing the members beyond its minimum.
3. Of the nodes where the pod fits so, the one with the fewest protected victims, then the one
   whose most important victim has the lowest priority, then the lowest sum of victim
   priorities each raised by 2^31 (so that fewer victims come first), then the one whose most
   important victims started last, then the first in the cluster's order.  As kube-scheduler
   does, the search stops once it has ``max(min_candidates, 10 % of the nodes)`` candidate
   nodes.  Nodes are tried latest-started pod of the lowest priority first, so it stops sooner
   at a node where one unprotected pod of the lowest priority there is makes room once no node
   left holds such a pod that started later: none of them could beat it.

A gang (``find_gang_preemption``) has room for all its pending members, else for its minimum
(the members cheapest to place), or none: members are placed largest first, each where it fits
as things are or else as a single pod would preempt, against what the members before it took,
in each domain of its topology key in turn; the way with the least harm wins.

The result names the GPU indices the pod would take there, so that the scheduler can hold them
for it while its victims terminate.  As with kube-scheduler, a budget only steers the choice:
when every way to make room breaks one, one is broken.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpusched.model import Assignment, ClusterState, Plan, Pod
from gpusched.model.affinity import Requirement, label_selector_selects
from gpusched.model.cluster import BoolArray
from gpusched.model.pod import Gang
from gpusched.model.tenants import demand_of
from gpusched.solver.baselines.base import GPU_CHOICE, GreedyPolicy, domains_of, lowest_idle_gpus, mig_layout_for
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.validate import plan_problems

__all__ = [
    "MIN_CANDIDATES",
    "Budget",
    "Preemption",
    "elsewhere",
    "find_gang_preemption",
    "find_preemption",
    "gang_budgets",
    "harm",
    "plan_preemptions",
    "still_standing",
    "through_room",
]

MIN_CANDIDATES = 100
"""Candidate nodes to find before choosing among them (kube-scheduler's default), at least."""


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption reads it, or a running gang's (``gang_budgets``)."""

    namespace: str
    selector: tuple[Requirement, ...]
    """Its label selector; empty selects no pod (as kube-scheduler's preemption reads it)."""
    allowed: int
    """``status.disruptionsAllowed``: how many of its pods may go now."""
    disrupted: frozenset[str] = frozenset()
    """``status.disruptedPods``: pods whose eviction it has counted already."""
    gang: str = ""
    """A running gang's budget: it covers that gang's members (and ``selector`` is unused)."""
    everyone: bool = False
    """Its selector is empty (``{}``): preemption reads it as selecting no pod, as kube-scheduler
    does, but the Eviction API as selecting every pod of its namespace (``evicts``)."""

    def evicts(self, pod: Pod) -> bool:
        """Whether evicting ``pod`` through the Eviction API spends this budget."""
        if self.everyone:
            return pod.namespace == self.namespace and pod.name not in self.disrupted
        return self.covers(pod)

    def covers(self, pod: Pod) -> bool:
        """Whether evicting ``pod`` spends this budget."""
        if self.gang:
            return pod.gang is not None and pod.gang.name == self.gang
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


def gang_budgets(running: Sequence[Assignment], also: Iterable[Pod] = ()) -> list[Budget]:
    """A budget per running gang (members bound and not being deleted, at least its minimum)
    that lets preemption evict the members beyond its minimum: below it, the rest of a
    distributed job is of no use.  As with a PodDisruptionBudget, a way to make room that
    leaves a gang short is taken only when every way does.  A gang short already has none.
    ``also``: members that count toward the minimum though they are no victims (their Binding
    in flight, or on a node no preemption may touch)."""
    members: dict[str, list[Pod]] = defaultdict(list)
    for p in [a.pod for a in running] + list(also):
        if p.gang is not None and not p.terminating:
            members[p.gang.name].append(p)
    out = []
    for name, pods in sorted(members.items()):
        minimum = max(p.gang.min_members for p in pods if p.gang is not None)
        if len(pods) >= minimum:
            out.append(Budget(pods[0].namespace, (), len(pods) - minimum, gang=name))
    return out


def _rank(victims: Sequence[Assignment], violations: int, node: int) -> tuple[int, int, int, int, float, int]:
    prio = [v.pod.priority for v in victims]
    top = max(prio)
    # Then the node whose most important victims started last (the least work lost), as
    # kube-scheduler breaks ties: the earliest start among them, latest first.
    earliest = min(v.pod.started for v in victims if v.pod.priority == top)
    return (violations, top, sum(p + _SHIFT for p in prio), len(prio), -earliest, node)


def _importance(a: Assignment) -> tuple[int, float, str]:
    """Most important first: higher priority, then started earlier (kube-scheduler's order)."""
    return (-a.pod.priority, a.pod.started, a.pod.key)


def _protected(lower: Sequence[Assignment], budgets: Sequence[Budget], spent: Sequence[int]) -> set[int]:
    """Indices into ``lower`` (most important first) of the pods whose eviction, with those
    before them, would take a budget below zero (``spent``: what earlier preemptions of this
    round took from each)."""
    left = [b.allowed - s for b, s in zip(budgets, spent, strict=True)]
    # A pod with no labels is covered by no PodDisruptionBudget, as kube-scheduler's preemption
    # reads them, even by one whose selector (DoesNotExist, NotIn) would take it: only its
    # running gang's budget, if any.
    gangs = [j for j, b in enumerate(budgets) if b.gang]
    out = set()
    for i, a in enumerate(lower):
        look = range(len(budgets)) if a.pod.labels else gangs if a.pod.gang is not None else ()
        for j in look:
            b = budgets[j]
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
    allowed: BoolArray | None = None,
) -> Preemption | None:
    """The preemption that lets ``pod`` fit with the least harm, or None when evicting pods of
    lower priority cannot make room for it anywhere.  ``running``: the pods that may be evicted
    (bound, not being deleted), as they are counted in ``state``.  ``lowered``: ``state``
    without every pod ``pod`` may evict (found here when not given: a caller searching for
    several pods of one priority finds it once).  ``budgets``: the PodDisruptionBudgets, and
    ``spent`` how much of each earlier preemptions took (none when not given).  ``allowed``:
    the nodes it may go to (all when not given)."""
    if not pod.preempts:
        return None
    by_node: dict[int, list[Assignment]] = defaultdict(list)
    for a in _lower(pod, running):
        by_node[a.node].append(a)
    if not by_node:
        return None
    # Nodes where it cannot fit even with every pod of lower priority gone are not worth a look.
    # Gone everywhere at once, those pods may take away a peer its required pod affinity needs,
    # or unbalance the domains its spread constraints count: for such a pod only what it asks of
    # the node itself rules nodes out here (each node is checked exactly below, its own victims
    # gone and every other pod in place).
    if lowered is None:
        lowered = state.release(a for lower in by_node.values() for a in lower)
    possible = lowered.fit_mask(pod.shape) if pod.affinity or pod.spread else lowered.pod_mask(pod)
    if allowed is not None:
        possible = possible & allowed
    # One private state, updated in place node after node and left as it was after each one: a
    # state per trial would copy the whole cluster's arrays thousands of times.
    work = state.apply(())
    want = max(min_candidates, len(state.cluster) // 10)
    least = min(a.pod.priority for lower in by_node.values() for a in lower)
    unbeatable = (0, least, least + _SHIFT, 1)  # one unprotected victim of the lowest priority there is
    spent = [0] * len(budgets) if spent is None else spent
    best: tuple[tuple[int, int, int, int, float, int], Preemption] | None = None
    found = 0
    # Nodes whose pods of the lowest priority started last come first, so that the search can
    # stop at a node where one such pod makes room as soon as no later node's could have
    # started later (its start time decides between such nodes).
    latest = {
        n: max((a.pod.started for a in lower if a.pod.priority == least), default=-math.inf)
        for n, lower in by_node.items()
    }
    nodes = sorted((n for n in by_node if possible[n]), key=lambda n: (-latest[n], n))
    for at, node in enumerate(nodes):
        lower = sorted(by_node[node], key=_importance)
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
                placement = Assignment(pod, node, GPU_CHOICE.gpus(pod, work, node))
                best = (key, Preemption(placement, tuple(victims), violations))
        work = work.apply(victims, consume=True)
        if found >= want:
            break
        if best is not None and best[0][:4] == unbeatable and at + 1 < len(nodes):
            then = nodes[at + 1]  # and every node after it ranks at best (-latest[n], n) >= this
            if best[0][4:] < (-latest[then], then):
                break
    return None if best is None else best[1]


def through_room(
    pod: Pod,
    state: ClusterState,
    running: Sequence[Assignment],
    node: int,
    budgets: Sequence[Budget] = (),
) -> Preemption | None:
    """How ``pod`` fits on ``node`` taking over the room held there for another pod: ``state``
    has that room free and the pods it waits for gone.  As things are then, evicting no one, or
    else as ``find_preemption`` makes room there, evicting pods of ``running`` (``budgets``: as
    for it); None when neither does."""
    if state.pod_mask(pod)[node]:
        return Preemption(Assignment(pod, node, GPU_CHOICE.gpus(pod, state, node)), ())
    allowed = np.zeros(len(state.cluster), dtype=np.bool_)
    allowed[node] = True
    return find_preemption(pod, state, running, 1, budgets=budgets, allowed=allowed)


def harm(pre: Preemption) -> tuple[int, int, int, int, float]:
    """How much ``pre`` harms, as ``find_preemption`` weighs nodes (least first): protected
    victims, the most important victim's priority, the sum of victim priorities each raised by
    2^31, their number, then the latest start of its most important victims first.  Evicting
    no one harms least."""
    if not pre.victims:
        return (0, -_SHIFT, 0, 0, -math.inf)
    return _rank(pre.victims, pre.violations, pre.node)[:5]


def _take_room(state: ClusterState, pre: Preemption, *, consume: bool = False) -> ClusterState:
    """``state`` with ``pre``'s victims gone and its pod placed; a MIG pod that finds no free
    instance of its profile there takes an idle GPU partitioned for it, as the greedy policies
    partition one, so that the next pod cannot count that GPU as idle too."""
    state = state.release(pre.victims, consume=consume)
    a = pre.placement
    profile = a.pod.mig_profile
    if profile and state.mig_free[a.node, state.cluster.mig_index[profile]] <= 0:
        gpu = lowest_idle_gpus(state, a.node, 1)[0]
        state = state.partition(((a.node, gpu, mig_layout_for(state, a.node, profile)),))
    return state.apply([a], consume=True)


def _spend(
    pre: Preemption, budgets: Sequence[Budget], spent: list[int], left: Sequence[Assignment]
) -> list[Assignment]:
    """Count ``pre``'s victims against the budgets (``spent``, in place); ``left`` without them."""
    for j, b in enumerate(budgets):
        spent[j] += sum(1 for v in pre.victims if b.covers(v.pod))
    gone = {id(v) for v in pre.victims}
    return [a for a in left if id(a) not in gone]


def plan_preemptions(
    pods: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int = MIN_CANDIDATES,
    budgets: Sequence[Budget] = (),
    gangs: Sequence[Sequence[Pod]] = (),
    scope: Callable[[Pod], str] | None = None,
    allowance: Mapping[str, int] | None = None,
) -> list[Preemption]:
    """Preemptions for ``pods`` and for ``gangs`` (each all its pending members: room for all,
    else for its minimum, or none; ``find_gang_preemption``) in turn, highest priority first (a
    gang at its least important member's), each against the state the earlier ones leave
    (their victims gone, their pods placed, the budgets they spent): no two take the same
    room, and no pod is evicted twice.  ``scope``:
    a pod evicts only pods of its own scope (its tenant's); None: any.  ``allowance``: per
    scope, the GPU demand (thousandths) its pods may take beyond what their victims of that
    scope free (a tenant's limit); a preemption that needs more is not taken."""
    left_to_take = dict(allowance or {})
    out: list[Preemption] = []
    spent = [0] * len(budgets)
    left = list(running)
    level: tuple[int, str] | None = None
    lowered: ClusterState | None = None  # made here, so updated in place
    units: list[tuple[int, Pod | Sequence[Pod]]] = [(p.priority, p) for p in pods]
    units += [(min(m.priority for m in g), g) for g in gangs if g]
    for priority, unit in sorted(units, key=lambda u: -u[0]):
        mine = scope(unit if isinstance(unit, Pod) else unit[0]) if scope is not None else ""
        reach = left if scope is None else [a for a in left if scope(a.pod) == mine]
        if isinstance(unit, Pod):
            if (priority, mine) != level:  # the pods a pod of this priority may evict, all gone at once
                level = (priority, mine)
                lowered = state.release(_lower(unit, reach))
            one = find_preemption(unit, state, reach, min_candidates, lowered=lowered, budgets=budgets, spent=spent)
            found = [] if one is None else [one]
        else:
            found = find_gang_preemption(unit, state, reach, min_candidates, budgets=budgets, spent=spent) or []
        if found and scope is not None and mine in left_to_take:
            net = sum(demand_of(pre.pod) for pre in found)
            net -= sum(demand_of(v.pod) for pre in found for v in pre.victims if scope(v.pod) == mine)
            if net > left_to_take[mine]:
                continue  # its tenant would pass its limit
            left_to_take[mine] -= net
        for pre in found:
            out.append(pre)
            left = _spend(pre, budgets, spent, left)
            state = _take_room(state, pre)
            if lowered is not None:  # its victims, of lower priority, are out of it already
                lowered = _take_room(lowered, replace(pre, victims=()), consume=True)
    return out


def still_standing(kept: Sequence[Preemption], state: ClusterState) -> list[Preemption]:
    """Of ``kept`` (preemptions ``plan_preemptions`` found against ``state``, some of them
    dropped since), in order, those that still make room when only the ones kept before them
    have taken theirs: a preemption found in the room a dropped one was to leave must not
    evict its victims for nothing.  A gang keeps all its members' or none."""
    out = list(kept)
    while True:
        work, failed = state, set()
        for pre in out:
            trial = work.release(pre.victims)
            alone = replace(pre.placement, pod=replace(pre.pod, gang=None))  # the gang's rules held in the search
            if pre.pod.unit in failed or plan_problems(Plan((alone,), ()), trial):
                failed.add(pre.pod.unit)
                continue
            work = _take_room(work, pre)
        if not failed:
            return out
        out = [pre for pre in out if pre.pod.unit not in failed]


def elsewhere(
    refused: Sequence[Preemption],
    kept: Sequence[Preemption],
    state: ClusterState,
    running: Sequence[Assignment],
    accept: Callable[[Sequence[Preemption], Preemption], bool],
    min_candidates: int = MIN_CANDIDATES,
    budgets: Sequence[Budget] = (),
    tries: int = 3,
) -> list[Preemption]:
    """For the single pods of ``refused`` (answers of ``plan_preemptions`` against ``state``
    that the caller could not carry out), in priority order, the next best answers on other
    nodes, each found after ``kept`` and the ones before it have taken their room and spent
    their budgets; ``accept(taken, answer)``: whether the caller can carry out ``answer`` beside
    those already ``taken``.  At most ``tries`` nodes more per pod; a pod with none goes without."""
    work, left, spent = state, list(running), [0] * len(budgets)
    taken = list(kept)
    for pre in taken:
        left = _spend(pre, budgets, spent, left)
        work = _take_room(work, pre)
    out: list[Preemption] = []
    for first in sorted((p for p in refused if p.pod.gang is None), key=lambda p: -p.pod.priority):
        allowed = np.ones(len(state.cluster), dtype=np.bool_)
        allowed[first.node] = False
        for _ in range(tries):
            found = find_preemption(
                first.pod, work, left, min_candidates, budgets=budgets, spent=spent, allowed=allowed
            )
            if found is None:
                break
            if accept(taken, found):
                out.append(found)
                taken.append(found)
                left = _spend(found, budgets, spent, left)
                work = _take_room(work, found)
                break
            allowed[found.node] = False
    return out


def _gang_tries(gang: Gang, state: ClusterState) -> list[BoolArray | None]:
    """Where a gang may go, as the solver reads its topology: each domain of its key (only the
    one its members run in, when they do), those with the most free GPU first, and with no
    topology or a preferred one, anywhere (last)."""
    tries: list[BoolArray | None] = []
    if gang.topology_key:
        doms = [m for d, m in domains_of(state, gang.topology_key).items() if not gang.domain or d == gang.domain]
        free = [int(state.gpu_free[m].sum()) for m in doms]
        tries.extend(doms[i] for i in sorted(range(len(doms)), key=lambda i: -free[i]))  # stable: by name on ties
    if gang.topology != "required":
        tries.append(None)
    return tries


_Harm = tuple[int, int, int]
"""Protected victims, the most important victim's priority, the sum of (priority + 2^31)."""


def _harm(found: Sequence[Preemption]) -> _Harm:
    prio = [v.pod.priority for pre in found for v in pre.victims]
    return (sum(pre.violations for pre in found), max(prio, default=-_SHIFT), sum(p + _SHIFT for p in prio))


Narrow = Callable[[list[Assignment], list[Preemption]], list[Assignment]]
"""Which of the pods still running (first) the next member may evict, given what the members
before it found (second)."""


def find_gang_preemption(
    members: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int = MIN_CANDIDATES,
    *,
    budgets: Sequence[Budget] = (),
    spent: Sequence[int] | None = None,
    narrow: Narrow | None = None,
) -> list[Preemption] | None:
    """Room for every member of one gang at once (all its pending ``members``); else, when no
    room can be made for all, for its minimum (``Gang.min_members``, less its members running
    when ``members`` count them: ``Gang.beside``), the members cheapest to place (least GPU
    demand, then CPU, then memory); or None: no pod is evicted for fewer than its minimum.
    The members left without room wait, as the members beyond a gang's minimum do.  See
    ``_find_gang_room`` for how room is looked for."""
    found = _find_gang_room(members, state, running, min_candidates, budgets=budgets, spent=spent, narrow=narrow)
    gang = members[0].gang if members else None
    if found is not None or gang is None or not gang.min_members < len(members):
        return found
    cheapest = sorted(members, key=lambda p: (p.gpu_demand_milli, p.cpu_milli, p.memory_mib, p.key))
    return _find_gang_room(
        cheapest[: gang.min_members], state, running, min_candidates, budgets=budgets, spent=spent, narrow=narrow
    )


def _find_gang_room(
    members: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int = MIN_CANDIDATES,
    *,
    budgets: Sequence[Budget] = (),
    spent: Sequence[int] | None = None,
    narrow: Narrow | None = None,
) -> list[Preemption] | None:
    """Room for every one of ``members`` (of one gang) at once, or None.  Members are placed
    largest first, each where it fits as things are (best fit) or else as ``find_preemption``
    chooses, against what the members before it took and evicted; every member evicts only
    pods below the gang's least important member (a MIG member that partitions an idle GPU
    takes it for the rest of the search).  With a topology key each
    domain is tried on its own (a preferred topology also anywhere), and the way with the least
    harm is chosen: fewest protected victims, then the lowest most important victim, then the
    lowest sum of victim priorities each raised by 2^31, then a domain before anywhere, then the
    domain with the most free GPU.  A member placed without victims holds its room all the same.
    As for a single pod, the search stops once the domains where the gang found room hold
    ``max(min_candidates, 10 % of the nodes)`` nodes; a domain is left as soon as what its
    members evict already harms more than the best found.  ``narrow``: which of the pods still
    running a member may evict, given what the members before it took (default: all)."""
    gang = members[0].gang if members else None
    if gang is None or not all(m.preempts and m.gang == gang for m in members):
        return None
    if len(members) < gang.min_members:
        return None
    order = sorted(members, key=lambda p: (-p.num_gpu, -p.gpu_milli, -p.cpu_milli, -p.memory_mib, p.key))
    spent = [0] * len(budgets) if spent is None else spent
    lowest = min(m.priority for m in members)  # the gang preempts at its least important member's
    # Without every pod the gang may evict: where no member could ever go.
    base = state.release(_lower(replace(order[0], priority=lowest), running))
    tries = _gang_tries(gang, state)
    where = np.full(len(state.cluster), -1, dtype=np.int64)  # node -> its domain's try
    for t, allowed in enumerate(tries):
        if allowed is not None:
            where[allowed] = t
    by_try: dict[int, list[Assignment]] = defaultdict(list)
    for a in running:
        by_try[int(where[a.node])].append(a)
    want = max(min_candidates, len(state.cluster) // 10)
    covered = 0
    fit = BestFitPolicy()  # where a member goes that fits as things are; its own: ties break alike every time
    best: tuple[tuple[int, int, int, int], list[Preemption]] | None = None
    for rank, allowed in enumerate(tries):
        inside = list(running) if allowed is None else by_try[rank]
        if not any(a.pod.priority < lowest for a in inside):
            continue
        bound = None if best is None else best[0][:3]
        found = _gang_try(
            order, state, inside, min_candidates, base, budgets, list(spent), allowed, bound, lowest, fit, narrow
        )
        if found is None:
            continue
        if found:  # else it was left for harming more than the best: a candidate all the same
            if not any(pre.victims for pre in found):  # it fits as things are: nothing to preempt
                return None
            key = (*_harm(found), rank)
            if best is None or key < best[0]:
                best = (key, found)
        covered += len(state.cluster) if allowed is None else int(allowed.sum())
        if covered >= want:
            break
    return None if best is None else best[1]


def _gang_try(
    order: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    min_candidates: int,
    base: ClusterState,
    budgets: Sequence[Budget],
    spent: list[int],
    allowed: BoolArray | None,
    bound: _Harm | None,
    floor: int,
    fit: GreedyPolicy,
    narrow: Narrow | None = None,
) -> list[Preemption] | None:
    """``_find_gang_room`` within ``allowed`` (None: no room there), or an empty list once
    the harm reaches ``bound`` (what each member adds only raises it)."""
    work = state
    lowered = base.apply(())  # a private copy, updated member by member
    left = list(running)
    out: list[Preemption] = []
    for pod in order:
        fits = work.pod_mask(pod)
        if allowed is not None:
            fits = fits & allowed
        nodes = np.flatnonzero(fits)
        if nodes.size:
            node = fit.choose(pod, work, nodes)
            pre = Preemption(Assignment(pod, node, GPU_CHOICE.gpus(pod, work, node)), ())
        else:
            # Every member evicts only what the gang's least important member may: the gang
            # preempts at that priority, whatever order its members are searched in.
            found = find_preemption(
                replace(pod, priority=floor),
                work,
                left if narrow is None else narrow(left, out),
                min_candidates,
                lowered=lowered,
                budgets=budgets,
                spent=spent,
                allowed=allowed,
            )
            if found is None:
                return None
            pre = replace(found, placement=replace(found.placement, pod=pod))
        out.append(pre)
        if bound is not None and pre.victims and _harm(out) >= bound:
            return []
        left = _spend(pre, budgets, spent, left)
        work = _take_room(work, pre)
        lowered = _take_room(lowered, replace(pre, victims=()), consume=True)
    return out
