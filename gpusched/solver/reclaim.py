"""Reclaim: GPUs a tenant is guaranteed, taken back from tenants that borrowed beyond their quota.

Between tenants, quota decides, not priority.  A pending pod may reclaim when its tenant's usage
with it stays within the tenant's quota (``Tenants.guaranteed``); a gang when its minimum does,
for its minimum and for those of its other members that fit within the quota beside it.  It may evict only pods that
are all of the following:

* of another tenant that holds more than its quota;
* below ``Tenants.reclaim_below`` in priority;
* not a member of a gang (a distributed job is of no use short of a member);
* not being deleted already.

It may evict no more of a tenant than that tenant holds beyond its quota.  So no tenant is
pushed below its quota, and no pod gets past its own: nothing taken back is taken back again.

Per node, each tenant's pods are offered lowest priority first, and only as many as its
borrowed GPUs cover.  The node is chosen as ``find_preemption`` chooses one: fewest budgets
broken, then the least important victims, then the fewest.  Several pods reclaim in turn, each
against what the earlier ones took.  A gang reclaims for all its pending members within its
quota together, else for its minimum (``find_gang_preemption``), or not at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpusched.model import Assignment, ClusterState, Pod
from gpusched.model.tenants import Tenants, demand_of
from gpusched.solver.preempt import (
    MIN_CANDIDATES,
    Budget,
    Preemption,
    _spend,
    _take_room,
    find_gang_preemption,
    find_preemption,
    plan_preemptions,
    through_room,
)

__all__ = [
    "at_limit_searched",
    "gang_reclaimers",
    "plan_at_limit",
    "plan_reclaims",
    "reclaim_through_room",
    "reclaimable",
    "reclaimers",
]

_TOP = 2**31 - 1
"""The priority a pod reclaims at: every pod offered to it counts as below it."""


def reclaimable(
    running: Sequence[Assignment], tenants: Tenants, room: Mapping[str, int], exclude: str
) -> list[Assignment]:
    """The pods of ``running`` a pod of tenant ``exclude`` may evict, given ``room``: per tenant,
    how much of its usage may still be taken.  Per node and tenant, lowest priority first (then
    by key), as many as fit in that tenant's room."""
    per: dict[tuple[int, str], list[Assignment]] = defaultdict(list)
    for a in running:
        t = tenants.of(a.pod)
        wanted = t != exclude and room.get(t, 0) > 0 and a.pod.priority < tenants.reclaim_below
        # A member of a running gang is not offered: the rest would be of no use without it.
        if wanted and a.pod.gang is None and not a.pod.terminating and demand_of(a.pod):
            per[a.node, t].append(a)
    out: list[Assignment] = []
    for (_, t), pods in per.items():
        left = room[t]
        for a in sorted(pods, key=lambda a: (a.pod.priority, a.pod.key)):
            d = demand_of(a.pod)
            if d > left:
                break
            left -= d
            out.append(a)
    return out


def at_limit_searched(pods: Iterable[Pod]) -> list[Pod]:
    """The pods of ``pods`` ``plan_at_limit`` looks for alone: those that may preempt, but gang
    members (looked for as gangs)."""
    return [p for p in pods if p.preempts and p.gang is None]


def reclaimers(pods: Iterable[Pod]) -> list[Pod]:
    """The pods of ``pods`` that may reclaim if within their quota: pods alone (not gang
    members) that may preempt and ask for a GPU."""
    return [p for p in pods if p.gang is None and p.preempts and demand_of(p)]


def gang_reclaimers(gangs: Iterable[Sequence[Pod]], tenants: Tenants) -> list[Sequence[Pod]]:
    """The gangs of ``gangs`` (each its pending members) that may reclaim if within their
    quota: every member may preempt, they ask for a GPU, and they are of one tenant."""
    return [
        g
        for g in gangs
        if g and all(m.preempts for m in g) and sum(map(demand_of, g)) and len({tenants.of(m) for m in g}) == 1
    ]


def plan_at_limit(
    pods: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    tenants: Tenants,
    min_candidates: int = MIN_CANDIDATES,
    budgets: Sequence[Budget] = (),
    gangs: Sequence[Sequence[Pod]] = (),
) -> list[Preemption]:
    """Preemptions for pods, and ``gangs`` (each all its pending members: room for all, else for
    its minimum, or none), that their tenant's limit holds back: each evicts only pods of lower
    priority of its own tenant, and takes only GPU room its victims leave (the free room of
    every GPU counted as taken, every free MIG instance too), so its tenant holds no more after
    than before: a MIG pod takes the instance of a victim of its profile."""
    pods = at_limit_searched(pods)
    gangs = [g for g in gangs if g]
    if not pods and not gangs:
        return []
    cap = state.cluster.gpu_cap
    free = np.argwhere(state.gpu_used < cap)
    blocked = state.with_gpus_at(((int(i), int(g)) for i, g in free), int(cap.max(initial=0)))
    blocked = blocked.with_instances_taken()
    whole = [p for p in pods if not p.mig_profile]
    out = plan_preemptions(whole, blocked, running, min_candidates, budgets=budgets, gangs=gangs, scope=tenants.of)
    slices = [p for p in pods if p.mig_profile]
    if not slices:
        return out
    # A MIG pod looks only among pods on instances: a whole GPU its victim frees would have to be
    # re-partitioned for it, which a node never is while its GPUs are in use.
    gone = [v for pre in out for v in pre.victims]
    taken = {id(v) for v in gone}
    after = blocked.release(gone).apply([pre.placement for pre in out])
    on_instances = [a for a in running if a.pod.mig_slices and id(a) not in taken]
    left = [replace(b, allowed=b.allowed - sum(1 for v in gone if b.covers(v.pod))) for b in budgets]
    return out + plan_preemptions(slices, after, on_instances, min_candidates, budgets=left, scope=tenants.of)


def plan_reclaims(
    pods: Sequence[Pod],
    state: ClusterState,
    running: Sequence[Assignment],
    tenants: Tenants,
    usage: Mapping[str, int],
    min_candidates: int = MIN_CANDIDATES,
    budgets: Sequence[Budget] = (),
    allowance: Mapping[str, int] | None = None,
    gangs: Sequence[Sequence[Pod]] = (),
    searched: list[Pod] | None = None,
) -> list[Preemption]:
    """Reclaims for ``pods`` in the order given (the queue's), then for ``gangs`` (each all its
    pending members: when its minimum is within its tenant's quota, room for it and for those
    of its other members the quota also covers, else for its minimum, or none; when its
    minimum is not, none), each against the state the earlier ones leave;
    ``usage``: GPU demand per tenant now (``Cache.tenant_usage``).  A pod of a gang, one that
    may not preempt, or one that asks for no GPU does not reclaim alone (``reclaimers``,
    ``gang_reclaimers``).  ``allowance``: what each tenant with a limit may still take
    (``Tenants.allowance``, with the pods being deleted counted): a pod or gang whose tenant it
    would take past does not reclaim.  No tenant loses more than it holds beyond its quota.
    ``searched``: given, the pods of the pods and gangs that looked are added to it."""
    left_to_take = dict(allowance or {})
    room = dict(tenants.borrowed(usage))
    claimed: dict[str, int] = defaultdict(int)
    spent = [0] * len(budgets)
    left = list(running)
    out: list[Preemption] = []
    units: list[Sequence[Pod]] = [[p] for p in reclaimers(pods)] + gang_reclaimers(gangs, tenants)
    for whole in units:
        t = tenants.of(whole[0])
        # A gang by its minimum: its members beyond it reclaim only as far as the quota goes.
        within = tenants.guaranteed(whole, {t: usage.get(t, 0) + claimed[t]})
        unit = [m for m in whole if m.key in within]
        d = sum(map(demand_of, unit))
        if not d:  # nothing within the quota, or only a minimum that asks for no GPU
            continue
        if t in left_to_take and d > left_to_take[t]:
            continue
        if searched is not None:
            searched.extend(unit)
        offered = reclaimable(left, tenants, room, t)
        if not offered:
            continue
        top = [replace(m, priority=_TOP) for m in unit]
        if len(unit) == 1 and unit[0].gang is None:
            one = find_preemption(top[0], state, offered, min_candidates, budgets=budgets, spent=spent)
            found = [] if one is None else [one]
        else:
            lent = dict(room)

            def narrow(
                running: list[Assignment], before: list[Preemption], t: str = t, lent: dict[str, int] = lent
            ) -> list[Assignment]:
                """What the next member may evict: each lender's room less what the members
                before it took (so one lender's room is not spent twice)."""
                left_room = dict(lent)
                for v in (v for pre in before for v in pre.victims):
                    left_room[tenants.of(v.pod)] -= demand_of(v.pod)
                return reclaimable(running, tenants, left_room, t)

            found = (
                find_gang_preemption(top, state, offered, min_candidates, budgets=budgets, spent=spent, narrow=narrow)
                or []
            )
        taken: dict[str, int] = defaultdict(int)
        for v in (v for pre in found for v in pre.victims):
            taken[tenants.of(v.pod)] += demand_of(v.pod)
        if not found or any(c > room.get(owner, 0) for owner, c in taken.items()):
            continue  # (a gang's members, each on its own node, may together take past a room)
        members = {m.key: m for m in unit}
        d = sum(demand_of(members[one.pod.key]) for one in found)  # a gang's minimum, when not all
        claimed[t] += d
        if t in left_to_take:
            left_to_take[t] -= d
        for owner, c in taken.items():
            room[owner] -= c
        for one in found:
            pre = replace(one, placement=replace(one.placement, pod=members[one.pod.key]))
            out.append(pre)
            left = _spend(pre, budgets, spent, left)
            state = _take_room(state, pre)
    return out


def reclaim_through_room(
    pod: Pod,
    state: ClusterState,
    running: Sequence[Assignment],
    node: int,
    tenants: Tenants,
    room: Mapping[str, int],
    budgets: Sequence[Budget] = (),
) -> Preemption | None:
    """``through_room`` for a pod within its tenant's quota that takes over the room held on
    ``node`` for a pod of a tenant past its own: it evicts there, whatever their priority, only
    the pods ``reclaimable`` offers it (``room``: what each tenant may still lose, the room
    taken over counted already)."""
    offered = reclaimable(running, tenants, room, tenants.of(pod))
    found = through_room(replace(pod, priority=_TOP), state, offered, node, budgets)
    return None if found is None else replace(found, placement=replace(found.placement, pod=pod))
