"""Preemption and the rooms it holds: a pod of high priority that no node takes evicts pods of
lower priority (or reclaims GPUs a tenant holds past its quota) on the node that frees room for
it with the least harm, and the room is held for it (``nominatedNodeName``) while its victims
leave.  A pod may take over the room held for a pod below it, or evict beside such a room."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import structlog

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Pod
from gpusched.model.tenants import demand_of
from gpusched.solver.baselines.base import GPU_CHOICE
from gpusched.solver.explain import Explanation
from gpusched.solver.preempt import (
    Budget,
    Preemption,
    elsewhere,
    gang_budgets,
    harm,
    plan_preemptions,
    still_standing,
    through_room,
)
from gpusched.solver.reclaim import (
    at_limit_searched,
    plan_at_limit,
    plan_reclaims,
    reclaim_through_room,
    reclaimable,
)
from gpusched.state.cache import Room, Snapshot

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.daemon")


ROOM_SEEKERS = 8
"""Pods of one search (the most important first) that look at the rooms held for others: each
look takes a snapshot per room, on the event loop, so a preemption wave is looked at in turns."""

ROOMS_TRIED = 16
"""Rooms held for others one pod tries (those of the lowest priority first)."""

GANG_MEMBER_GRACE_S = 60.0
"""How long the room held for a gang member deleted while its gang holds room (its victims
leaving) is kept for a pod created again under its name, as a job's controller replaces a
member: given up at once, it would go to other pods, and the gang, whole again, would preempt
again."""


_Why = TypeVar("_Why", bound="Explanation | Verdict")
"""Why a pod waits: a placement search's explanation, or a verdict reached without one."""


@dataclass(frozen=True)
class Verdict:
    """Why a pod waits, when no placement search said it (``Explanation`` is that search's)."""

    message: str
    reason: str


class Preemptor:
    """Preemption, reclaim and held rooms for one scheduler instance."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.kept: dict[str, tuple[str, float]] = {}
        """Deleted gang members whose room is kept for a namesake: key -> gang, until when
        (``time.monotonic``)."""

    def waits_for_victims(self, pod: Pod, e: Explanation, after: ClusterState, freed: Collection[str]) -> bool:
        """Whether ``pod`` preempted pods that are still leaving: it is told so and waits for
        them, and preempts no more.  Once they are gone and it still does not fit in the room
        they left (``freed``: the pods whose room the solve left free), or once its node could
        not take it anyway (gone, tainted, no longer selected), the room held for it is given
        up, and it may preempt again.  Should they go during the solve, it is drawn again at
        once, to its room.  Room is held likewise for a pod that preempted under another leader
        (``status.nominatedNodeName``), as kube-scheduler's nominator does."""
        held = self._held_room(pod)
        if held is None:
            return False
        node, _, left = held
        if not after.cluster.could_take(pod, node) or (not left and pod.key in freed):
            self.s.give_up_room(pod.key)
            return False
        if not left:  # its victims left during the solve, which counted them: its room was never tried
            self.s.queue.requeue(pod.key)
            return True
        message = f"{e.message} Waiting for {left} preempted pod(s) to leave node {node}."
        self.s.tell_unschedulable(pod, message, e.reason, nominated=node)
        return True

    def gang_waits_for_victims(
        self, told: dict[str, tuple[Pod, str]], after: ClusterState, freed: Collection[str]
    ) -> bool:
        """``waits_for_victims`` for the members of one gang left out (``told``: key -> member,
        why it is left out): while any member's victims are leaving, every member waits and the
        gang preempts no more.  Once they are all gone and the gang still does not fit in its
        room, or once a member's node could not take it anyway, every member's room is given up."""
        rooms = {k: held for k, (p, _) in told.items() if (held := self._held_room(p)) is not None}
        left = sum(held[2] for held in rooms.values())
        tried = all(k in freed for k in rooms)  # the solve left all its room free
        if (
            not rooms
            or (not left and tried)
            or any(not after.cluster.could_take(told[k][0], held[0]) for k, held in rooms.items())
        ):
            for k in rooms:
                self.s.give_up_room(k)
            return False
        if not left:  # the last victims left during the solve: drawn again at once, to its room
            for k in told:
                self.s.queue.requeue(k)
            return True
        nodes = ", ".join(sorted({held[0] for held in rooms.values()}))
        for k, (p, message) in told.items():
            node = rooms[k][0] if k in rooms else None
            self.s.tell_unschedulable(
                p, f"{message} Waiting for {left} preempted pod(s) to leave node(s) {nodes}.", "Gang", nominated=node
            )
        return True

    def _held_room(self, pod: Pod) -> tuple[str, tuple[int, ...], int] | None:
        """The room held for ``pod`` (``Cache.nomination``); held now when it preempted under
        another leader (``status.nominatedNodeName``) and its victims are still leaving."""
        held = self.s.cache.nomination(pod.key)
        record = self.s.queue.record(pod.key)
        if held is None and record is not None and record.nominated and self.adopt_room(pod, record.nominated):
            held = self.s.cache.nomination(pod.key)
        return held

    def keep_for_namesake(self, key: str) -> bool:
        """For the pending pod ``key``, deleted: keep the room held for it when it is a gang
        member, another member of its gang still holds room, and the rest of its gang (its
        members running and pending, with room or without) fall short of its minimum without
        it, for a pod created again under its name (``GANG_MEMBER_GRACE_S``); whether it is
        kept.  Only while leading.  When the rest meet the minimum, they go ahead without it:
        its room is not kept idle (a pending member without room of its own takes it)."""
        if key in self.kept:  # its deletion seen again (deletionTimestamp, then DELETED)
            return True
        record = self.s.queue.record(key)
        gang = record.pod.gang if record is not None else None
        if gang is None or not self.s.is_leader or self.s.cache.nomination(key) is None:
            return False
        others = [k for k in self.s.cache.gang_nominations(gang.name) if k != key and k not in self.kept]
        if not others or self._rest(gang.name, without=key) >= gang.min_members:
            return False
        self.kept[key] = (gang.name, time.monotonic() + GANG_MEMBER_GRACE_S)
        log.info("room kept for a gang member created again", pod=key, gang=gang.name, seconds=GANG_MEMBER_GRACE_S)
        return True

    def _rest(self, gang: str, without: str = "") -> int:
        """Members of ``gang`` running (on the books) and pending (not deleted), ``without`` that
        one (pending, not deleted yet)."""
        pending = self.s.queue.gang_live(gang) - (without in self.s.queue)
        return self.s.cache.gang_held({gang})[gang][0] + pending

    def kept_for(self, gang: str) -> list[str]:
        """Keys of the deleted members of ``gang`` whose room is kept for a namesake."""
        return [k for k, (g, _) in self.kept.items() if g == gang]

    def expire_kept(self, members: bool = True) -> None:
        """Give up the rooms kept for deleted gang members past their grace, or whose gang's
        other members hold room no longer, or (with ``members``: once per batch, as it counts the
        books) meet its minimum without them (a member created since, under another name); the
        parked pods look again."""
        now = time.monotonic()
        for key, (gang, until) in list(self.kept.items()):
            held = [k for k in self.s.cache.gang_nominations(gang) if k not in self.kept]
            short = True
            for k in held if members else ():
                member = self.s.queue.record(k)
                if member is not None and member.pod.gang is not None:
                    short = self._rest(gang) < member.pod.gang.min_members
                    break
            if until > now and held and short and self.s.cache.nomination(key) is not None:
                continue
            del self.kept[key]
            log.info("room kept for a gang member given up", pod=key, gang=gang)
            self.s.give_up_room(key)

    def _take_namesakes_room(self, pod: Pod) -> bool:
        """Whether ``pod``, pending, takes the room kept for its deleted namesake (a member of
        the same gang): then this instance's word, as the room was.  The room kept for a pod of
        another gang is given up."""
        kept = self.kept.pop(pod.key, None)
        if kept is None:
            return False
        if pod.gang is not None and pod.gang.name == kept[0] and self.s.cache.nomination(pod.key) is not None:
            self.s.placed_here.add(pod.key)
            log.info("room kept for a gang member taken by its namesake", pod=pod.key, gang=kept[0])
            return True
        self.s.give_up_room(pod.key)
        return False

    def follow_nomination(self, pod: Pod, node: str) -> None:
        """A pending pod's ``status.nominatedNodeName`` as the watch shows it: room held from
        another leader's word follows it (given up when it moves or is cleared, held again where
        it points); room this instance placed is its own business, and so is room kept for a
        deleted gang member of its name (``keep_for_namesake``), which it takes."""
        if self._take_namesakes_room(pod) or pod.key in self.s.placed_here:
            return
        held = self.s.cache.nomination(pod.key)
        if held is not None and held[0] != node:
            self.s.give_up_room(pod.key)
        if node:
            self.adopt_room(pod, node)

    def adopt_room(self, pod: Pod, node: str) -> bool:
        """Hold room for ``pod`` on ``node`` (its ``status.nominatedNodeName``) as the last leader
        held it: while pods it preempted there are leaving (``Cache.adopt_nomination``); for a
        gang member, which may have held room without victims, also where it fits as things are.
        True when room is now held.  Never for a pod whose nominatedNodeName this instance has
        written: room it gave up is not held again from its own status write, nor from an
        older one the watch shows late."""
        if pod.key in self.s.placed_here:
            return False
        if self.s.cache.adopt_nomination(pod, node):
            return True
        if pod.gang is None or self.s.cache.nomination(pod.key) is not None:
            return False
        snap = self.s.cache.snapshot()
        i = snap.cluster.index.get(node)
        if i is None or not snap.state.pod_mask(pod)[i]:
            return False
        self.s.cache.nominate(pod, node, GPU_CHOICE.gpus(pod, snap.state, i), ())
        return True

    async def preempt(
        self,
        pods: list[tuple[Pod, Explanation]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None = None,
        taken_over: bool = False,
    ) -> None:
        """Look for running pods of lower priority whose eviction lets each of ``pods`` fit, and
        each of ``gangs`` (key -> member, why it is left out) fit whole; evict them, hold their
        room, and tell every pod where it stands (``batch``: the batch's snapshot, for what it
        kept from the pods: busy GPUs, GPUs kept free).  With tenants, a pod within its
        tenant's quota first reclaims GPUs that other tenants borrowed, and preempts pods of
        lower priority (of its own tenant) only where that finds nothing.  First, each pod may
        take over a room held for one of lower priority (``take_over``), unless ``pods`` are
        those that did not already (``taken_over``)."""
        if not taken_over:
            pods = self.take_over(pods, batch)
        # Pods at the headroom's priority or more may have the kept GPUs; those below may not.
        # Searched together, the kept GPUs would be out of reach of both: the first look first
        # (reclaim, then preemption), and the others only if they evict nobody (else they look
        # again once victims left).
        if self.s.config.headroom.gpus:
            high = [(p, e) for p, e in pods if not self.s.below_headroom(p)]
            high_gangs = [g for g in gangs if not any(self.s.below_headroom(p) for p, _ in g.values())]
            low = [(p, e) for p, e in pods if self.s.below_headroom(p)]
            low_gangs = [g for g in gangs if any(self.s.below_headroom(p) for p, _ in g.values())]
            if (high or high_gangs) and (low or low_gangs):
                if await self._preempt_pass(high, high_gangs, batch_id, batch):
                    told_now = [(p, self.s.with_notes(p, e.message, batch), e.reason) for p, e in low]
                    told_now += [(p, message, "Gang") for told in low_gangs for p, message in told.values()]
                    for p, message, reason in told_now:  # as things are after the search
                        if self.s.cache.holds(p.key, p.uid):  # bound by someone else meanwhile
                            self.s.queue.done(p.key)
                        elif self.s.queue.current(p.key, p.uid):
                            self.s.tell_unschedulable(p, message, reason)
                        else:  # deleted, or created again under its name: the queue settles it
                            self.s.queue.requeue(p.key)
                    return
                pods, gangs = low, low_gangs
        await self._preempt_pass(pods, gangs, batch_id, batch)

    async def _preempt_pass(
        self,
        pods: list[tuple[Pod, Explanation]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None,
    ) -> bool:
        """One pass of ``preempt`` (pods all of one side of the headroom's priority, or the
        headroom off): with tenants, reclaims first, then preemption for what they left; whether
        anything is evicted."""
        evicting = False
        if (pods or gangs) and self.s.tenants.active and self.s.tenants.reclaim:
            left: list[tuple[Pod, Explanation]] = []
            left_gangs: list[dict[str, tuple[Pod, str]]] = []
            evicting = await self.preempt_for(pods, gangs, batch_id, batch, reclaim=left, reclaim_gangs=left_gangs)
            pods, gangs = left, left_gangs
        lowest = self.s.cache.lowest_priority()
        hopeless = [(p, e) for p, e in pods if lowest is None or p.priority <= lowest]
        for p, e in hopeless:  # every running pod matters as much: told as usual, at no cost
            self.s.tell_unschedulable(p, self.s.with_notes(p, e.message, batch), e.reason)
        pods = [(p, e) for p, e in pods if lowest is not None and p.priority > lowest]
        for told in [g for g in gangs if lowest is None or min(p.priority for p, _ in g.values()) <= lowest]:
            for p, message in told.values():
                self.s.tell_unschedulable(p, message, "Gang")
        gangs = [g for g in gangs if lowest is not None and min(p.priority for p, _ in g.values()) > lowest]
        if not pods and not gangs:
            return evicting
        return await self.preempt_for(pods, gangs, batch_id, batch) or evicting

    def take_over(
        self, pods: list[tuple[Pod, _Why]], batch: Snapshot | None, beside: Mapping[str, int] | None = None
    ) -> list[tuple[Pod, _Why]]:
        """Of ``pods``, those that do not take over room held for a pod of lower priority (not
        a gang's; of its own tenant, with tenants) while its victims leave: a pod that fits
        there, those victims gone, is nominated there in its place, evicting no one, and the
        pod of lower priority gives it up and looks again (kube-scheduler counts a nominated pod
        only against pods of no higher priority than its own, and clears the nominations it
        outranks).  So may a pod that may not preempt (``preemptionPolicy: Never``): taking the
        room evicts no one.  So may a pod its tenant's limit holds back, as ``_room_for`` keeps
        to it (``beside``: GPU demand by tenant the batch admitted besides, held to the limit
        too).  Pods look highest priority first; those left are in the order given (the
        batch's: reclaim follows it)."""
        took: set[str] = set()
        for p, e in sorted(pods, key=lambda pe: -pe[0].priority):
            live = self.s.queue.current(p.key, p.uid) and not self.s.cache.holds(p.key, p.uid)
            room = self._room_for(p, beside) if live and p.gang is None and self.s.is_leader else None
            if room is None:
                continue
            took.add(p.key)
            taken, node, gpus = room
            lower = taken.pod
            self.s.cache.unnominate(lower.key)
            self.s.placed_here.add(p.key)
            self.s.cache.nominate(p, node, gpus, [v.pod for v in taken.victims], self._reclaimed(taken))
            log.info(
                "room taken over",
                pod=p.key,
                priority=p.priority,
                node=node,
                from_pod=lower.key,
                from_priority=lower.priority,
                victims=[v.pod.key for v in taken.victims],
            )
            said = (
                f"The room held for it on node {node} was taken by pod {p.key}, of higher priority "
                f"({p.priority} > {lower.priority}); it looks again."
            )
            if self.s.queue.current(lower.key, lower.uid):
                self._tell_room_lost(lower, said, urgent=True)
            leaving = f", whose {len(taken.victims)} preempted pod(s) are leaving" if taken.victims else ""
            message = f"{e.message} Taking the room held on node {node} for pod {lower.key} of lower priority{leaving}."
            self.s.tell_unschedulable(
                p, self.s.with_notes(p, message, batch), e.reason, nominated=node, after=lower.key
            )
            if not taken.victims:  # its room is ready: bound there with the next batch
                self._wake_one(p.key)
        return [(p, e) for p, e in pods if p.key not in took]

    def _tell_room_lost(self, pod: Pod, message: str, wake: bool = True, urgent: bool = False) -> None:
        """``pod`` (queued, wherever it is) no longer holds room: its Event and condition say so,
        with no nominated node; and, parked, it looks again (with ``wake``).  Its nominatedNodeName
        is this instance's word from now on: the last leader's, until the cleared one reaches the
        watch, holds no room again (``adopt_room``).  ``urgent``: the room was taken over, and the
        clear is written at once, before the new holder's nomination (``write_verdict``)."""
        if self.s.is_leader:
            self.s.placed_here.add(pod.key)
        self.s.write_verdict(pod, message, None, urgent=urgent)
        if wake:
            self._wake_one(pod.key)

    def _wake_one(self, key: str) -> None:
        """The pod ``key``, parked, looks again at once."""
        self.s.queue.move_all(lambda r: r.key == key)

    def _room_for(self, pod: Pod, beside: Mapping[str, int] | None = None) -> tuple[Room, str, tuple[int, ...]] | None:
        """Room held for a pod of lower priority than ``pod`` that ``pod`` fits in once the
        victims it waits for are gone: the room (the lowest priority's first), its node and the
        GPUs ``pod`` would take there.  Not on a node with GPUs busy by utilisation (whose
        holders are not known to leave), nor across tenants (priority does not decide between
        them), nor where its tenant would pass its limit or, for room reclaimed, its quota
        (``_may_take``), nor, for a MIG pod, where no instance of its profile would be free."""
        mine = self.s.tenants.of(pod) if self.s.tenants.active else None
        busy = self.s.busy_gpus() or {}
        rooms = [
            r
            for r in self.s.cache.rooms()
            if r.pod.priority < pod.priority
            and r.pod.gang is None
            and r.pod.key != pod.key
            and not busy.get(r.node)
            and (mine is None or self.s.tenants.of(r.pod) == mine)
        ]
        if rooms and mine is not None:
            may = self._may_take(pod, beside)
            rooms = [r for r in rooms if may(r, 0)]
        if not rooms:
            return None
        # One look with every such room free (a superset of what any one leaves), then the
        # rooms that pass it one at a time.
        sealed = self.s.mig.sealed()
        every = self.s.cache.snapshot(
            free=[r.pod.key for r in rooms] + [pod.key], sealed=sealed, **self.s.keep_free([pod])
        )
        for room in sorted(rooms, key=lambda r: (r.pod.priority, r.pod.key)):
            i = every.cluster.index.get(room.node)
            if i is None or not every.cluster.could_take(pod, room.node):
                continue
            if not every.state.release(room.victims).pod_mask(pod)[i]:
                continue
            snap = self.s.cache.snapshot(free=[room.pod.key, pod.key], sealed=sealed, **self.s.keep_free([pod]))
            state = snap.state.release(room.victims)
            if not state.pod_mask(pod)[i]:
                continue
            gpus = GPU_CHOICE.gpus(pod, state, i)
            # Room held is bound as it is: a MIG pod only on an instance there, not on a GPU
            # that would have to be re-partitioned for it.
            if _on_instances([Preemption(Assignment(pod, i, gpus), ())], state):
                return room, room.node, gpus
        return None

    def _may_take(self, pod: Pod, beside: Mapping[str, int] | None = None) -> Callable[[Room, int], bool]:
        """Whether ``pod`` may take over a room held for a pod of its tenant (first), evicting
        pods of its tenant whose demand adds up to the second: if it takes its tenant further,
        within its limit, and for room reclaimed (``_reclaimed``), within its quota (GPUs
        reclaimed for a tenant's guarantee are not borrowed past it)."""
        mine = self.s.tenants.of(pod)
        left = self._limit_left(pod)
        if left is not None and beside:
            left -= beside.get(mine, 0)
        within: list[int] = []  # what the quota still covers, once asked for

        def may(room: Room, freed: int) -> bool:
            more = demand_of(pod) - demand_of(room.pod) - freed
            if more <= 0:
                return True
            if left is not None and more > left:
                return False
            if not self._reclaimed(room):
                return True
            if not within:
                usage = self.s.cache.tenant_usage(self.s.tenants, [pod.key])
                within.append(self.s.tenants.rule(mine).quota - usage.get(mine, 0))
            return more <= within[0]

        return may

    def _reclaimed(self, room: Room) -> bool:
        """Whether ``room`` holds GPUs reclaimed from other tenants: it was reclaimed (or taken
        over from a pod it was), or, held again after a fail-over, waits for pods of another tenant."""
        mine = self.s.tenants.of(room.pod)
        return room.reclaimed or any(self.s.tenants.of(v.pod) != mine for v in room.victims)

    def _limit_left(self, pod: Pod) -> int | None:
        """What ``pod``'s tenant may still take under its limit (None: it has none), beside what it
        holds now: the pods this batch bound, its pods being deleted, and the rooms held for its
        pods (but ``pod``'s own)."""
        t = self.s.tenants.of(pod)
        limit = self.s.tenants.rule(t).limit
        if limit is None:
            return None
        usage = self.s.cache.tenant_usage(
            self.s.tenants, [pod.key], terminating=True, moving=self.s.consolidator.moving
        )
        return limit - usage.get(t, 0)

    async def preempt_for(
        self,
        pods: Sequence[tuple[Pod, Explanation | Verdict]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None,
        reclaim: list[tuple[Pod, Explanation]] | None = None,
        at_limit: bool = False,
        reclaim_gangs: list[dict[str, tuple[Pod, str]]] | None = None,
    ) -> bool:
        """One search for ``pods`` and ``gangs``, carried out; whether anything is evicted.
        ``reclaim``: search for reclaims instead (``plan_reclaims``), and leave the pods it finds
        nothing for there, untold, for the preemption search; the gangs, in ``reclaim_gangs``.
        ``at_limit``: the pods are held back by their tenant's limit (``plan_at_limit``)."""
        # A busy GPU that no pod on the books holds stays out of reach: no eviction makes it less
        # busy.  One that pods hold is seen as the books have it, and room on it is taken only
        # where every pod holding it is evicted (``_busy_room_ok``).  The GPUs kept free stay
        # out of reach while any of these pods is below the headroom's priority.
        freeing = [p.key for p, _ in pods] + [k for g in gangs for k in g]
        busy = self.s.busy_gpus() or {}
        holders = self.s.cache.holders_of([(n, g) for n, gpus in busy.items() for g in gpus])
        outside = {n: frozenset(g for g in gpus if not holders.get((n, g))) for n, gpus in busy.items()}
        keep = self.s.keep_free([p for p, _ in pods] + [p for g in gangs for p, _ in g.values()])
        sealed = self.s.mig.sealed()
        snap = self.s.cache.snapshot(free=freeing, busy=outside, sealed=sealed, **keep)
        running = self.s.cache.preemptible()  # as counted in ``snap``: taken together
        if sealed:  # a node being re-partitioned is offered to no preemption: no victim there
            names = snap.cluster.nodes
            running = [a for a in running if names[a.node].name not in sealed]
        usage = self.s.cache.tenant_usage(self.s.tenants, without=freeing) if reclaim is not None else {}
        # What each tenant with a limit may still take, its pods being deleted counted.
        allowance = (
            self.s.tenants.allowance(
                self.s.cache.tenant_usage(self.s.tenants, without=freeing, terminating=True),
                [self.s.tenants.of(p) for p, _ in pods] + [self.s.tenants.of(p) for g in gangs for p, _ in g.values()],
            )
            if self.s.tenants.active
            else None
        )
        looked: list[Pod] = []  # the pods a reclaim search looked for
        budgets: list[Budget] = []
        try:
            budgets = self._budgets(running)
            if at_limit:
                found = await asyncio.to_thread(
                    plan_at_limit,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    self.s.tenants,
                    budgets=budgets,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                )
            elif reclaim is not None:
                found = await asyncio.to_thread(
                    plan_reclaims,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    self.s.tenants,
                    usage,
                    budgets=budgets,
                    allowance=allowance,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                    searched=looked,
                )
            else:
                found = await asyncio.to_thread(
                    plan_preemptions,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    budgets=budgets,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                    scope=self.s.scope(),
                    allowance=allowance,
                )
        except Exception as exc:
            log.error("preemption search failed", batch_id=batch_id, error=repr(exc))
            found = []
        if not self.s.is_leader:
            found = []
        searched = len(found)
        sought = Counter(pre.pod.unit for pre in found)  # per gang, the members it found room for
        # Not for pods bound or replaced during the search: the rest found room in theirs.
        live = [
            pre
            for pre in found
            if self.s.queue.current(pre.pod.key, pre.pod.uid) and not self.s.cache.holds(pre.pod.key, pre.pod.uid)
        ]

        def carried(taken: Sequence[Preemption]) -> list[Preemption]:
            """Of ``taken``, what can be carried out: room on a busy GPU only where all that hold
            it leave, and a MIG pod only on an instance there is."""
            return _on_instances(
                _busy_room_ok(list(taken), busy, holders, snap.cluster) if busy else list(taken), snap.state
            )

        found = carried(live)
        # A gang no longer whole (a member gone, changed or bound during the search, or its room
        # not to be carried out) is dropped before anything is: a pod found room in what its
        # victims were to leave must not evict its own for nothing.
        by_key = {pre.pod.key: pre for pre in found}
        broken = {k for told in gangs if not self._gang_whole(told, by_key, sought) for k in told}
        found = [pre for pre in found if pre.pod.key not in broken]
        # Single pods whose room stood before a broken gang was dropped: should it fall with the
        # gang's, the search is not their verdict, they look again soon.
        standing = {pre.pod.key for pre in found if pre.pod.gang is None} if broken else set()
        if len(found) < searched:  # some dropped: the others may have counted on their victims
            found = still_standing(found, snap.state)
            kept = {pre.pod.key for pre in found}
            refused = [pre for pre in live if pre.pod.key not in kept]  # ``elsewhere`` takes the single pods
            if refused and reclaim is None and not at_limit and not self.s.tenants.active:
                # The best answer could not be carried out: the next best, on another node.
                found += await asyncio.to_thread(
                    elsewhere,
                    refused,
                    found,
                    snap.state,
                    running,
                    lambda taken, answer: any(p is answer for p in carried([*taken, answer])),
                    budgets=budgets,
                )
                if not self.s.is_leader:
                    found = []
        chosen = {pre.pod.key: pre for pre in found}
        dropped = standing - chosen.keys()
        evicting = False
        evicted = 0  # victims of the preemptions carried out
        missed: list[tuple[Pod, Explanation | Verdict]] = []  # pods the search found nothing for
        for p, e in pods:
            pre = chosen.get(p.key)
            if self.s.cache.holds(p.key, p.uid):  # bound by someone else during the search
                self.s.queue.done(p.key)
                continue
            if pre is None and self.s.queue.current(p.key, p.uid):
                missed.append((p, e))
                continue
            if pre is None or not self.s.queue.current(p.key, p.uid):
                self.s.tell_unschedulable(p, self.s.with_notes(p, e.message, batch), e.reason)
                continue
            why = self._reclaim_note(pre) if reclaim is not None else ""
            node = self._carry_out(pre, snap.cluster, why, reclaimed=reclaim is not None)
            evicting = evicting or bool(pre.victims)
            evicted += len(pre.victims)
            self._log_carried_out(pre, node, batch_id, reclaim is not None)
            if reclaim is not None:
                owners = sorted({self.s.tenants.of(v.pod) for v in pre.victims})
                message = (
                    f"{e.message} Reclaiming the GPUs of {len(pre.victims)} pod(s) on node {node} from "
                    f"tenant(s) {', '.join(owners)}, past their quota: tenant {self.s.tenants.of(p)} is within its own."
                )
            else:
                message = f"{e.message} Preempting {len(pre.victims)} pod(s) of lower priority on node {node}."
            self.s.tell_unschedulable(p, message, e.reason, nominated=node)
        for told in gangs:
            group = [chosen.get(k) for k in told]
            for k, (p, _) in told.items():
                if self.s.cache.holds(p.key, p.uid):  # bound by someone else during the search
                    self.s.queue.done(k)
            chosen_group = [pre for pre in group if pre is not None]
            if not self._gang_whole(told, chosen, sought):
                if reclaim_gangs is not None and self._current(told):
                    reclaim_gangs.append(told)  # the preemption search looks next
                    continue
                for k, (p, message) in told.items():
                    if not self.s.cache.holds(k, p.uid):
                        self.s.tell_unschedulable(p, message, "Gang")
                continue
            nodes = {
                pre.pod.key: self._carry_out(
                    pre,
                    snap.cluster,
                    self._reclaim_note(pre) if reclaim is not None else "",
                    reclaimed=reclaim is not None,
                )
                for pre in chosen_group
            }
            victims = [v for pre in chosen_group for v in pre.victims]
            evicting = evicting or bool(victims)
            evicted += len(victims)
            log.info(
                "reclaim" if reclaim is not None else "preempt",
                batch_id=batch_id,
                gang=chosen_group[0].pod.unit.removeprefix("gang:"),
                pods=sorted(nodes),
                priority=min(pre.pod.priority for pre in chosen_group),
                nodes=sorted(set(nodes.values())),
                victims=[f"{v.pod.key}@{v.pod.priority}" for v in victims],
                violations=sum(pre.violations for pre in chosen_group),
            )
            where = ", ".join(sorted(set(nodes.values())))
            # Room for all its pending members, or for its minimum: the rest wait beside them.
            whom = (
                "the whole gang"
                if len(nodes) == len(told)
                else f"{len(nodes)} of its {len(told)} pending members, at least its minimum"
            )
            if reclaim is not None:
                lenders = ", ".join(sorted({self.s.tenants.of(v.pod) for v in victims}))
                doing = (
                    f"Reclaiming the GPUs of {len(victims)} pod(s) on node(s) {where} from tenant(s) {lenders}, past "
                    f"their quota, to make room for {whom}: tenant {self.s.tenants.of(chosen_group[0].pod)} "
                    "is within its own."
                )
            else:
                doing = (
                    f"Preempting {len(victims)} pod(s) of lower priority on node(s) {where} to make room for {whom}."
                )
            for k, (p, message) in told.items():
                if k in nodes:
                    self.s.tell_unschedulable(p, f"{message} {doing}", "Gang", nominated=nodes[k])
                else:  # no room made for it: it waits beside them, as a member beyond the minimum
                    beside = "This member is placed beside them once it fits."
                    self.s.tell_unschedulable(p, f"{message} {doing} {beside}", "Gang")
        if missed and not at_limit:  # what rooms held for pods they outrank add (carried out above: no two share)
            missed, more = self._through_rooms(missed, freeing, batch_id, reclaim is not None)
            evicting = evicting or bool(more)
            evicted += more
        for p, e in missed:
            if reclaim is not None:
                assert isinstance(e, Explanation)
                reclaim.append((p, e))  # the preemption search looks next
            else:
                message = self.s.with_notes(p, e.message, batch)
                self.s.tell_unschedulable(p, message, e.reason, retry=p.key in dropped)
        if reclaim is not None:  # counted: the pods (and gang members) within their tenant's quota that looked
            self.s.metrics.reclaim(len(looked), evicted)
        elif at_limit:
            self.s.metrics.preemption(len(at_limit_searched(p for p, _ in pods)) + sum(map(len, gangs)), evicted)
        else:
            self.s.metrics.preemption(len(pods) + sum(map(len, gangs)), evicted)
        return evicting

    def _gang_whole(
        self, told: Mapping[str, tuple[Pod, str]], chosen: Mapping[str, Preemption], sought: Counter[str]
    ) -> bool:
        """Whether the gang of ``told`` (its pending members) may be preempted for as ``chosen``
        has it: every member the search found room for (``sought``: all, or at least its
        minimum), or none.  A member gone or changed during the search, bound meanwhile, or
        whose room cannot be carried out leaves the gang short, and then no pod is evicted for it."""
        group = [pre for k in told if (pre := chosen.get(k)) is not None]
        gang = next(iter(told.values()))[0].gang
        assert gang is not None
        return (
            self._current(told)
            and bool(group)
            and len(group) == sought[group[0].pod.unit]
            and len(group) >= min(gang.min_members, len(told))
        )

    def _current(self, told: Mapping[str, tuple[Pod, str]]) -> bool:
        """Whether every member of ``told`` is still pending as drawn: not deleted, replaced nor
        bound meanwhile."""
        return all(self.s.queue.current(k, p.uid) and not self.s.cache.holds(k, p.uid) for k, (p, _) in told.items())

    def _carry_out(
        self,
        pre: Preemption,
        cluster: Cluster,
        why: str = "",
        *,
        reclaimed: bool = False,
        waits_for: Sequence[Pod] = (),
    ) -> str:
        """Hold the room ``pre`` makes for its pod and start evicting its victims; its node.
        ``why``: what the victims are told, when not priority; ``reclaimed``: the room is
        reclaimed (``Room.reclaimed``); ``waits_for``: pods leaving already that the room waits
        for too (those of a room it takes over)."""
        node = cluster.nodes[pre.node].name
        self.s.placed_here.add(pre.pod.key)
        victims = [v.pod for v in pre.victims]
        self.s.cache.nominate(pre.pod, node, pre.placement.gpus, [*victims, *waits_for], reclaimed=reclaimed)
        covered = [v.pod for v in pre.victims if any(b.covers(v.pod) for b in self.s.budgets.values())]
        self.s.evicted_uncounted.update((v.key, v) for v in covered)
        for v in pre.victims:
            self.s.spawn(self._evict(v.pod, pre.pod, node, why), f"preempt:{v.pod.key}")
        return node

    def _log_carried_out(self, pre: Preemption, node: str, batch_id: int, reclaim: bool, **more: str) -> None:
        """The one log line of a preemption (or reclaim) carried out."""
        log.info(
            "reclaim" if reclaim else "preempt",
            batch_id=batch_id,
            pod=pre.pod.key,
            priority=pre.pod.priority,
            node=node,
            victims=[f"{v.pod.key}@{v.pod.priority}" for v in pre.victims],
            violations=pre.violations,
            **more,
            **({"tenant": self.s.tenants.of(pre.pod)} if reclaim else {}),
        )

    def _budgets(self, running: Sequence[Assignment]) -> list[Budget]:
        """The disruption budgets as preemption counts them, beside ``running`` (the pods it may
        evict): less what was evicted here since their status was written, and a budget per
        running gang (``gang_budgets``), whose members it may not evict (their Binding in
        flight, or on a node being re-partitioned) count toward its minimum all the same."""
        for k, v in list(self.s.evicted_uncounted.items()):
            if not self.s.cache.holds(k, v.uid):
                del self.s.evicted_uncounted[k]
        budgets = [  # what was evicted here since their status was written is not in it yet
            replace(b, allowed=b.allowed - sum(1 for v in self.s.evicted_uncounted.values() if b.covers(v)))
            for b in self.s.budgets.values()
        ]
        victims = {a.pod.key for a in running}
        beside = [p for p in self.s.cache.gang_members() if p.key not in victims]
        return budgets + gang_budgets(running, also=beside)  # running gangs keep their minimum

    def _through_rooms(
        self, pods: list[tuple[Pod, _Why]], searched: Collection[str], batch_id: int, reclaim: bool
    ) -> tuple[list[tuple[Pod, _Why]], int]:
        """Of ``pods`` (pods alone a search found nothing for), those that find no room either by
        taking over the room held for another pod, evicting pods beside it on its node where
        that is needed, and how many pods the others evicted.  By priority, the room of a pod of
        lower priority of its tenant (kube-scheduler counts a nominated pod only against pods of
        no higher priority, and clears the nominations a preemption outranks); by ``reclaim``,
        that of a pod of a tenant past its quota, as much of it as that tenant borrowed.  The
        pod waits for the victims of the room and its own; the pod that held the room gives it
        up, is told, and looks again.  Not the rooms of the pods of the search (``searched``)."""
        took: set[str] = set()
        evicted = 0
        order = pods if reclaim else sorted(pods, key=lambda pe: -pe[0].priority)  # as each search takes them
        for p, e in order[:ROOM_SEEKERS]:  # the rest look with the next batch
            live = self.s.is_leader and self.s.queue.current(p.key, p.uid) and not self.s.cache.holds(p.key, p.uid)
            found = self.room_through(p, searched, reclaim) if live and p.preempts and p.gang is None else None
            if found is None:
                continue
            took.add(p.key)
            room, pre, cluster = found
            lower, node = room.pod, room.node
            self.s.cache.unnominate(lower.key)
            why = self._reclaim_note(pre) if reclaim else ""
            self._carry_out(
                pre,
                cluster,
                why,
                reclaimed=reclaim or self._reclaimed(room),
                waits_for=[v.pod for v in room.victims],
            )
            evicted += len(pre.victims)
            self._log_carried_out(pre, node, batch_id, reclaim, room_of=lower.key)
            if reclaim:
                mine, lender = self.s.tenants.of(p), self.s.tenants.of(lower)
                owners = ", ".join(sorted({self.s.tenants.of(v.pod) for v in pre.victims}))
                beside = f", and the GPUs of {len(pre.victims)} pod(s) there from tenant(s) {owners}" if owners else ""
                message = (
                    f"{e.message} Reclaiming the room held on node {node} for pod {lower.key} of tenant {lender}"
                    f"{beside}, past {'their' if owners else 'its'} quota: tenant {mine} is within its own."
                )
                said = (
                    f"The room held for it on node {node} was reclaimed for pod {p.key} of tenant {mine}, within its "
                    f"quota: tenant {lender} is past its own; it looks again."
                )
            else:
                leaving = f", whose {len(room.victims)} preempted pod(s) are leaving" if room.victims else ""
                taking = f"the room held there for pod {lower.key} of lower priority{leaving}."
                doing = (
                    f"Preempting {len(pre.victims)} pod(s) of lower priority on node {node}, and taking"
                    if pre.victims
                    else f"Taking, on node {node},"
                )
                message = f"{e.message} {doing} {taking}"
                said = (
                    f"The room held for it on node {node} was taken by pod {p.key}, of higher priority "
                    f"({p.priority} > {lower.priority}); it looks again."
                )
            if self.s.queue.current(lower.key, lower.uid):
                self._tell_room_lost(lower, said, urgent=True)
            self.s.tell_unschedulable(p, message, e.reason, nominated=node, after=lower.key)
            if not pre.victims and not room.victims:  # its room is ready: bound there with the next batch
                self._wake_one(p.key)
        return [(p, e) for p, e in pods if p.key not in took], evicted

    def room_through(
        self, pod: Pod, searched: Collection[str], reclaim: bool
    ) -> tuple[Room, Preemption, Cluster] | None:
        """``_through_rooms`` for ``pod``: the room it takes over, its preemption there (the least
        harmful of all such rooms'), and the cluster it is placed in; None: no room takes it.
        Not on a node with GPUs busy by utilisation, nor one being re-partitioned."""
        tenants = self.s.tenants
        mine = tenants.of(pod) if tenants.active else None
        busy = self.s.busy_gpus() or {}
        sealed = self.s.mig.sealed()
        rooms = [
            r
            for r in self.s.cache.rooms()
            if r.pod.gang is None and r.pod.key not in searched and not busy.get(r.node) and r.node not in sealed
        ]
        if not rooms:
            return None
        lent: dict[str, int] = {}
        may: Callable[[Room, int], bool] | None = None
        if reclaim:
            assert mine is not None
            usage = self.s.cache.tenant_usage(tenants, [pod.key])
            room_left = self._limit_left(pod)
            if usage.get(mine, 0) + demand_of(pod) > tenants.rule(mine).quota or (
                room_left is not None and demand_of(pod) > room_left
            ):
                return None
            lent = tenants.borrowed(usage)
            rooms = [
                r
                for r in rooms
                if (t := tenants.of(r.pod)) != mine
                and r.pod.priority < tenants.reclaim_below
                and 0 < demand_of(r.pod) <= lent.get(t, 0)
            ]
        else:
            rooms = [r for r in rooms if r.pod.priority < pod.priority and (mine is None or tenants.of(r.pod) == mine)]
            may = self._may_take(pod) if rooms and mine is not None else None
        if not rooms:
            return None
        running = self.s.cache.preemptible()  # as placed in the snapshots below: taken together
        budgets = self._budgets(running)
        if mine is not None and reclaim:  # what it may evict, were every room it may take over taken
            reach = reclaimable(running, tenants, lent, mine)
        else:
            reach = [
                a for a in running if a.pod.priority < pod.priority and (mine is None or tenants.of(a.pod) == mine)
            ]
        keep = self.s.keep_free([pod])
        # One look with all of them free, their victims and every pod it may evict gone (more
        # than any one way leaves), then the rooms whose node passes it one at a time.
        every = self.s.cache.snapshot(free=[r.pod.key for r in rooms] + [pod.key], sealed=sealed, **keep)
        index = every.cluster.index
        near: dict[int, list[Assignment]] = defaultdict(list)
        for a in reach:
            near[a.node].append(a)
        # Only the rooms' nodes are looked at: only their own pods need be gone.
        on_rooms = {i for r in rooms if (i := index.get(r.node)) is not None}
        most = every.state.release([v for r in rooms for v in r.victims])
        most = most.release([a for i in on_rooms for a in near.get(i, ())])
        possible = most.fit_mask(pod.shape) if pod.affinity or pod.spread else most.pod_mask(pod)
        best: tuple[tuple[int, int, int, int, float], Room, Preemption, Cluster] | None = None
        tried = [
            r
            for r in sorted(rooms, key=lambda r: (r.pod.priority, r.pod.key))
            if (i := index.get(r.node)) is not None and possible[i] and every.cluster.could_take(pod, r.node)
        ][:ROOMS_TRIED]
        for room in tried:
            i = index[room.node]
            snap = self.s.cache.snapshot(free=[room.pod.key, pod.key], sealed=sealed, **keep)
            state = snap.state.release(room.victims)
            there = near.get(i, [])
            if reclaim:
                left = dict(lent)
                left[tenants.of(room.pod)] -= demand_of(room.pod)
                pre = reclaim_through_room(pod, state, there, i, tenants, left, budgets)
            else:
                pre = through_room(pod, state, there, i, budgets)
                freed = sum(demand_of(v.pod) for v in pre.victims) if pre is not None else 0
                if pre is not None and may is not None and not may(room, freed):
                    pre = None
            if pre is None or not _on_instances([pre], state):
                continue
            rank = harm(pre)
            if best is None or rank < best[0]:
                best = (rank, room, pre, snap.cluster)
            if not pre.victims:  # no way harms less
                break
        return None if best is None else best[1:]

    def _reclaim_note(self, pre: Preemption) -> str:
        """What the victims of a reclaim are told."""
        mine = self.s.tenants.of(pre.pod)
        owners = sorted({self.s.tenants.of(v.pod) for v in pre.victims})
        quotas = ", ".join(f"{t} (quota {self.s.tenants.rule(t).quota / GPU_MILLI:g})" for t in owners)
        return (
            f"reclaiming GPUs for tenant {mine}, within its quota of {self.s.tenants.rule(mine).quota / GPU_MILLI:g} "
            f"GPUs, from tenants past their own quota: {quotas}"
        )

    async def _evict(self, victim: Pod, by: Pod, node: str, why: str = "") -> None:
        """Delete one victim of ``by``; should that fail, ``by`` waits for it no longer: the room
        held for it is given up, and it looks again when the cluster changes or its wait runs out
        (not at once: a deletion refused, by RBAC or a webhook, is likely to be refused again).
        For a gang member, the room of every member goes (a gang has room whole or not at all),
        and the pods parked outside the gang may take what was held.  Not before the status
        write naming the node where ``by`` preempts is over: the next leader holds the room by it."""
        await self.s.nomination_sent(by.key)
        deleted = await (
            self.s.binder.preempt(victim, by, node, why) if why else self.s.binder.preempt(victim, by, node)
        )
        if deleted:
            return
        if (held := self.s.evicted_uncounted.get(victim.key)) is not None and held.uid == victim.uid:
            del self.s.evicted_uncounted[victim.key]  # it runs on: no budget spent
        said = (
            f"The deletion of pod {victim.key} on node {node}, which it preempted, failed: the room held "
            "for it there is given up; it looks again when the cluster changes."
        )
        # A pod that took the room over preempted no one: it is told what its room waited for.
        waited = (
            f"The deletion of pod {victim.key} on node {node}, that the room held for it there waited for, "
            "failed: the room is given up; it looks again when the cluster changes."
        )
        # Every room that waits for it (its room may have been taken over by a pod of higher
        # priority meanwhile), and a gang's whole: a gang has room whole or not at all.
        waiting = self.s.cache.waiting_on(victim)
        gangs = {g.name for k in waiting if (r := self.s.queue.record(k)) is not None and (g := r.pod.gang) is not None}
        waiting += [k for name in sorted(gangs) for k in self.s.cache.gang_nominations(name) if k not in waiting]
        for key in waiting:
            self.s.cache.unnominate(key)
            record = self.s.queue.record(key)
            if record is not None:  # its nominatedNodeName must not point there
                took = key != by.key and record.pod.gang is None  # (a gang's room is never taken over)
                self._tell_room_lost(record.pod, waited if took else said, wake=False)
        if gangs:  # what the gang held is free for the pods parked outside it
            self.s.queue.move_all(lambda r: r.pod.gang is None or r.pod.gang.name not in gangs)


def _busy_room_ok(
    found: list[Preemption],
    busy: Mapping[str, frozenset[int]],
    holders: Mapping[tuple[str, int], set[str]],
    cluster: Cluster,
) -> list[Preemption]:
    """The preemptions of ``found`` that take room on a busy GPU only where every pod holding it
    is evicted (by the pod, or for a gang by its members together); a gang keeps all its
    members' or none."""
    victims: dict[str, set[str]] = defaultdict(set)  # pod, or gang, -> the keys of its victims
    for pre in found:
        victims[pre.pod.unit].update(v.pod.key for v in pre.victims)
    refused = set()
    for pre in found:
        name = cluster.nodes[pre.placement.node].name
        for g in pre.placement.gpus:
            if g in busy.get(name, ()) and not holders.get((name, g), set()) <= victims[pre.pod.unit]:
                refused.add(pre.pod.unit)
    return [pre for pre in found if pre.pod.unit not in refused]


def _on_instances(found: list[Preemption], state: ClusterState) -> list[Preemption]:
    """``found`` but the MIG pods that would need a GPU re-partitioned: room held for a pod is
    bound as it is once the victims leave, and a node takes a MIG pod only on an instance it
    advertises (a gang's members all go when one does)."""
    free = state.mig_free.copy()
    out: list[Preemption] = []
    dropped: set[str] = set()
    for pre in found:
        for v in pre.victims:
            for held, count in v.pod.mig_slices:  # all it holds: one another scheduler bound may hold several
                if (col := state.cluster.mig_id(held)) >= 0:
                    free[v.node, col] += count
        profile = pre.pod.mig_profile
        if profile:
            col = state.cluster.mig_index[profile]
            if free[pre.node, col] <= 0:
                dropped.add(pre.pod.unit)
                continue
            free[pre.node, col] -= 1
        out.append(pre)
    return [pre for pre in out if pre.pod.unit not in dropped]
