"""The scheduling queue: every pending pod is in exactly one place.

::

    add ──▶ active ──next_batch──▶ in flight ──bound────────▶ (gone)
              ▲                        │ ──unschedulable──▶ parked ──cluster changed──▶ active
              │                        │ ──bind failed────▶ backoff ──timer──────────▶ active
              └────────────────────────┴────────────────────────────────────────────────┘

A batch closes when ``max_size`` pods are active or the oldest active pod has
waited ``max_wait`` seconds; while the scheduler is not busy (``busy`` says
so: the daemon counts it busy while binds wait on its client) it closes after
only ``idle_wait``, so a lone pod is not held back, while under load pods
gather into full batches.  Higher priority pops first, then arrival order.  With tenants
configured (``set_tenants``), a batch draws in rounds, one pod (or gang) per tenant per
round (more for a tenant of weight 2 or more), the tenants in ``Tenants.order_key`` order
counting what each holds and what the batch drew for it already; within a tenant, priority
and then arrival order.
A pod updated while in flight keeps its place; deleted, it is dropped when its
batch resolves; deleted and created again under the same name (a new UID), the
new pod is queued afresh when the old one's batch resolves, whatever became of
the old one.  A parked pod returns to active when its request changes, not when
only its status does (as when its own PodScheduled condition is written).
Parked pods also return to active every ``flush_after`` seconds in case a
change went unseen.  A pod its batch could not place goes to backoff instead of
parked when a change that might let it in (``move_all``, or its own request)
came while it was in flight: its batch saw the cluster before that change.
Nothing is forgotten: ``counts`` adds up to every pending pod the watch has
reported and not deleted.

Members of a gang travel together: a batch that draws one draws every member
of its gang that is not in flight, parked and backed-off ones too (it may then
exceed ``max_size``), and a member that arrives or leaves (deleted, or moved to
another gang) wakes its parked or backed-off peers, so the solver always sees a
gang whole, as it is now.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpusched.model.tenants import Tenants, demand_of
from gpusched.state.records import PodRecord

__all__ = ["QueueCounts", "SchedulingQueue"]


@dataclass(frozen=True)
class QueueCounts:
    """Pods per place."""

    active: int
    backoff: int
    unschedulable: int
    in_flight: int


class SchedulingQueue:
    """Active, backoff and unschedulable pods, and the batches drawn from them."""

    def __init__(
        self,
        max_size: int = 64,
        max_wait: float = 0.5,
        *,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        flush_after: float = 60.0,
        idle_wait: float = 0.02,
        gang_wait: float = 1.0,
        busy: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_size = max_size
        self.max_wait = max_wait
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.flush_after = flush_after
        self.idle_wait = idle_wait
        self.gang_wait = gang_wait
        """How long the members of a gang short of its minimum wait for the next member, from the
        last one's arrival, before they are drawn as they are (members may run already)."""
        self.busy = busy
        self._clock = clock
        self._records: dict[str, PodRecord] = {}
        self._active: dict[str, tuple[int, float]] = {}  # key -> (seq, enqueued at)
        self._heaps: dict[str, list[tuple[int, int, str]]] = {}
        """Per tenant ("" for all, without tenants): (-priority, seq, key); stale entries skipped."""
        self._tenants: Tenants | None = None
        self._usage: Callable[[], Mapping[str, int]] = dict
        self._counted: Callable[[str], bool] = _never
        """Whether a pending pod (its key) holds room that ``_usage`` counts already."""
        self._passed_over: set[str] = set()
        """Tenants that had pods waiting when the last batch was drawn and drew none: first in
        the next batch's first round."""
        self._backoff: dict[str, float] = {}  # key -> ready at
        self._backoff_due: list[tuple[float, str]] = []  # heap of (ready at, key); stale entries skipped
        self._parked: dict[str, float] = {}  # key -> parked at
        self._in_flight: dict[str, str] = {}  # key -> UID of the pod that was drawn
        self._deleted_in_flight: set[str] = set()
        self._moved_in_flight: set[str] = set()  # woken while drawn: not parked on a stale view
        self._changed_in_flight: set[str] = set()  # its pod changed while drawn: not bound as it was
        self._attempts: dict[str, int] = {}
        self._gangs: dict[str, set[str]] = {}  # gang name -> keys of its pending members
        self._arrivals: collections.deque[float] = collections.deque()  # when new pods came, oldest first
        self._seq = itertools.count()
        self._wake = asyncio.Event()

    # -- what the watch reports ----------------------------------------------------------
    def add(self, record: PodRecord) -> None:
        """A pending pod, new or updated."""
        key = record.key
        old = self._records.get(key)
        replaced = old is not None and old.uid != record.uid  # deleted and created again: a new pod
        if replaced:
            self._deleted_in_flight.discard(key)  # the deletion was the old pod's, not this one's
        self._records[key] = record
        gang = record.pod.gang.name if record.pod.gang is not None else ""
        if old is not None and old.pod.gang is not None and old.pod.gang.name != gang:
            self._leave_gang(key, old.pod.gang.name)
        short = False  # a new member of a gang still short of its minimum: it waits for the next
        if gang and (replaced or key not in self._gangs.setdefault(gang, set())):  # a new pod is a new member
            self._gangs.setdefault(gang, set()).add(key)
            short = record.pod.gang is not None and self._members(gang) < record.pod.gang.min_members
            for peer in self._gangs[gang] - {key}:  # a new member: retry the gang together
                if short and peer not in self._in_flight:  # ... once the rest came, or none for a while
                    self._forget(peer, attempts=False)
                    self._hold(peer)
                elif self._parked.pop(peer, None) is not None or self._backoff.pop(peer, None) is not None:
                    self._activate(peer)
        if old is None or (replaced and key not in self._in_flight):  # (in flight: settled later)
            self._forget(key)
            self._arrivals.append(self._clock())
            if len(self._arrivals) > 4 * self.max_size:
                self._arrivals.popleft()
            self._enqueue(key)
        elif short and key not in self._in_flight:  # moved into a gang still short: it waits with its peers
            self._forget(key, attempts=False)
            self._hold(key)
        elif (old.pod, old.error) != (record.pod, record.error):  # may fit now
            tenants = self._tenants
            if key in self._active and tenants is not None and tenants.of(old.pod) != tenants.of(record.pod):
                # queued again as its new tenant's (the old heap's entry goes stale), waiting since it came
                self._activate(key, since=self._active[key][1])
            elif key in self._parked:
                del self._parked[key]
                self._activate(key)
            elif key in self._in_flight:
                self._moved_in_flight.add(key)
            if key in self._in_flight and old.pod != record.pod:
                self._changed_in_flight.add(key)

    def delete(self, key: str) -> None:
        """The pod is gone, or no longer pending."""
        if key not in self._records:
            return
        if key in self._in_flight:
            self._deleted_in_flight.add(key)
            return
        self._remove(key)

    def move_all(self, only: Callable[[PodRecord], bool] | None = None) -> None:
        """The cluster changed: parked pods (those ``only`` picks, if given) may fit now.  Those
        in flight it picks are backed off rather than parked should their batch fail them: it
        was solved against the cluster before the change."""
        for key in list(self._parked):
            if only is None or only(self._records[key]):
                del self._parked[key]
                self._activate(key)
        for key in self._in_flight:
            if key in self._records and (only is None or only(self._records[key])):
                self._moved_in_flight.add(key)

    # -- what the scheduler reports ------------------------------------------------------
    def done(self, key: str) -> None:
        """The pod was bound (or needs nothing more): it leaves the queue."""
        if self._settle(key):
            self._remove(key, wake=False)  # a member bound takes room: no peer it left out fits now

    def park(self, key: str) -> None:
        """The pod fits nowhere now; it waits for a change in the cluster (or, if one came while
        it was in flight, backs off: the change may have let it in)."""
        moved = key in self._moved_in_flight
        if moved:
            self.backoff(key)
        elif self._settle(key):
            self._parked.pop(key, None)  # parked again: at the end, so that the order stays that of time
            self._parked[key] = self._clock()

    def backoff(self, key: str) -> None:
        """Binding failed or was refused for a passing reason; retry after a growing delay."""
        if self._settle(key):
            n = self._attempts.get(key, 0) + 1
            self._attempts[key] = n
            delay = min(self.initial_backoff * 2 ** (n - 1), self.max_backoff)
            self._backoff[key] = ready = self._clock() + delay
            heapq.heappush(self._backoff_due, (ready, key))
            self._wake.set()

    def in_flight(self, key: str) -> bool:
        """Whether ``key`` is drawn and not yet bound, parked or backed off."""
        return key in self._in_flight

    def back_off_drawn(self, keys: Iterable[str]) -> None:
        """Of ``keys`` (a batch whose handling failed), each still drawn backs off: none is lost,
        and a pod that sets off the failure is not drawn again in a tight loop."""
        for key in keys:
            if key in self._in_flight:
                self.backoff(key)

    def requeue(self, key: str) -> None:
        """Return an in-flight pod to active at once (the batch was not acted on)."""
        if self._settle(key):
            self._activate(key)

    def nudge(self) -> None:
        """Something ``busy`` depends on changed: re-check whether the batch can close."""
        self._wake.set()

    def arrived_within(self, seconds: float) -> int:
        """New pods that arrived in the last ``seconds`` (counted up to ``4 x max_size``; arrivals
        more than a second old are forgotten)."""
        now = self._clock()
        while self._arrivals and self._arrivals[0] < now - max(seconds, 1.0):
            self._arrivals.popleft()
        since = now - seconds
        return sum(1 for _ in itertools.takewhile(lambda t: t >= since, reversed(self._arrivals)))

    def current(self, key: str, uid: str) -> bool:
        """Whether the pod ``key`` with ``uid`` is still pending here: not deleted, nor replaced
        by a new pod of the name, since it was drawn."""
        record = self._records.get(key)
        return record is not None and record.uid == uid and key not in self._deleted_in_flight

    def changed(self, key: str) -> bool:
        """Whether the pod ``key``, in flight, changed since it was drawn (what it asks for, or
        where it may go: an annotation, a label): its batch placed it as it was."""
        return key in self._changed_in_flight

    def record(self, key: str) -> PodRecord | None:
        """The latest record of a queued or in-flight pod."""
        return self._records.get(key)

    def counts(self) -> QueueCounts:
        """How many pods are where."""
        return QueueCounts(len(self._active), len(self._backoff), len(self._parked), len(self._in_flight))

    def gang_pending(self, gang: str) -> int:
        """Pending members of ``gang`` the queue holds, wherever they are."""
        return len(self._gangs.get(gang, ()))

    def gang_live(self, gang: str) -> int:
        """Pending members of ``gang`` not deleted (those deleted while in flight are held only
        until their batch resolves)."""
        return self._members(gang)

    def parked(self) -> list[PodRecord]:
        """The pods waiting as unschedulable (until something changes, or the flush)."""
        return [r for k in self._parked if (r := self._records.get(k)) is not None]

    def pending_keys(self) -> list[str]:
        """Every pending pod the queue holds, wherever it is."""
        return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    # -- batches -------------------------------------------------------------------------
    async def next_batch(self, limit: int | None = None, early: int | None = None) -> list[PodRecord]:
        """Wait for the next batch (at most ``limit``, by default ``max_size``, pods; it closes as
        soon as that many wait, or ``early`` many while no gang waits for more of its members)
        and mark its pods in flight.  ``max_size`` and ``max_wait`` are read afresh each time the
        queue is woken (``nudge``): a new configuration applies to the batch being gathered."""
        while True:
            size = self.max_size if limit is None else max(1, min(limit, self.max_size))
            enough = size if early is None else max(1, min(early, size))
            now = self._clock()
            self._release_due(now)
            wait: float | None = None
            if self._active:
                oldest = next(iter(self._active.values()))[1]  # insertion order is activation order
                due = oldest + self.max_wait
                if self.busy is not None and not self.busy():
                    due = min(due, oldest + self.idle_wait)
                waiting = len(self._active)
                if waiting >= size or now >= due or (waiting >= enough and not self._gang_short()):
                    return self._pop(size)
                wait = due - now
            first = self._first_backoff()
            if first is not None:
                until = first - now
                wait = until if wait is None else min(wait, until)
            if self._parked:
                until = next(iter(self._parked.values())) + self.flush_after - now  # parked in time order
                wait = until if wait is None else min(wait, until)
            self._wake.clear()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns when the wake-up and a
            # cancellation (the shutdown's) come in the same turn, and the cancellation is lost.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if wait is None else max(wait, 0.0)):
                    await self._wake.wait()

    def _gang_short(self) -> bool:
        """A waiting pod's gang has fewer members pending than its minimum: more are on their way
        (or running), and a batch closed early would only fail it."""
        for key in self._active:
            gang = self._records[key].pod.gang
            if gang is not None and self._members(gang.name) < gang.min_members:
                return True
        return False

    def set_tenants(
        self,
        tenants: Tenants | None,
        usage: Callable[[], Mapping[str, int]] = dict,
        counted: Callable[[str], bool] | None = None,
    ) -> None:
        """Draw batches fairly between ``tenants`` (None or inactive: by priority alone);
        ``usage`` says what each tenant holds now, read once per batch, and ``counted`` which
        pending pods it counts already (room is held for them): drawing one of those takes its
        tenant no further."""
        self._tenants = tenants if tenants is not None and tenants.active else None
        self._usage = usage
        self._counted = counted or _never
        self._heaps = {}
        for key in sorted(self._active, key=lambda k: self._active[k][0]):
            self._push(key, self._active[key][0])

    def _tenant(self, key: str) -> str:
        return self._tenants.of(self._records[key].pod) if self._tenants is not None else ""

    def _head(self, tenant: str) -> tuple[int, int, str] | None:
        """The first live entry of ``tenant``'s heap (stale ones dropped); None: it is empty."""
        heap = self._heaps[tenant]
        while heap:
            entry = heap[0]
            live = self._active.get(entry[2])
            if live is not None and live[0] == entry[1]:
                return entry
            heapq.heappop(heap)
        del self._heaps[tenant]
        return None

    def _pop(self, limit: int) -> list[PodRecord]:
        """Up to ``limit`` pods (a gang whole, past the limit if need be).  Without tenants, in
        heap order.  With tenants, in rounds: each round, every tenant with pods waiting draws
        ``Tenants.slots`` of them (no more than the batch's size over the tenants waiting),
        tenants in ``Tenants.order_key`` order as the round starts, but for the first round
        those the last batch passed over first: so no tenant's backlog (pods that fit nowhere,
        or wait for its limit, or a gang as large as a batch) keeps another tenant's pods out of
        batch after batch."""
        batch: list[PodRecord] = []
        tenants = self._tenants
        used = dict(self._usage()) if tenants is not None else {}

        def adds(key: str) -> int:
            """What drawing ``key`` adds to its tenant's usage: its room, if any, is in it already."""
            return 0 if self._counted(key) else demand_of(self._records[key].pod)

        def rank(tenant: str, head: tuple[int, int, str]) -> tuple[tuple[int, float], tuple[int, int, str]]:
            if tenants is None:
                return (0, 0.0), head
            return tenants.order_key(tenant, used.get(tenant, 0), adds(head[2])), head

        waiting: set[str] = set()
        first_round = True
        while len(batch) < limit:
            heads = {t: h for t in list(self._heaps) if (h := self._head(t)) is not None}
            if not heads:
                break
            waiting.update(heads)
            passed_over = self._passed_over if first_round else set()
            first_round = False
            share = max(1, limit // len(heads))
            for tenant in sorted(heads, key=lambda t: (t not in passed_over, rank(t, heads[t]))):
                for _ in range(min(tenants.slots(tenant), share) if tenants is not None else 1):
                    head = self._head(tenant) if tenant in self._heaps else None
                    if head is None or len(batch) >= limit:
                        break
                    heapq.heappop(self._heaps[tenant])
                    drawn = len(batch)
                    self._draw(head[2], batch)
                    if tenants is not None:
                        for r in batch[drawn:]:
                            t = tenants.of(r.pod)
                            used[t] = used.get(t, 0) + adds(r.key)
        if tenants is not None:
            self._passed_over = waiting - {tenants.of(r.pod) for r in batch}
        return batch

    def _draw(self, key: str, batch: list[PodRecord]) -> None:
        """Take ``key`` into ``batch``, and every member of its gang with it."""
        self._take(key, batch)
        gang = self._records[key].pod.gang
        if gang is not None:
            for peer in sorted(self._gangs.get(gang.name, ())):
                # Parked and backed-off peers come too: a gang retried a member at a time
                # would never have its minimum in one batch.
                if self._parked.pop(peer, None) is not None or self._backoff.pop(peer, None) is not None:
                    self._active[peer] = (next(self._seq), self._clock())
                if peer in self._active:
                    self._take(peer, batch)

    def _take(self, key: str, batch: list[PodRecord]) -> None:
        del self._active[key]
        record = self._records[key]
        self._in_flight[key] = record.uid
        batch.append(record)

    def _leave_gang(self, key: str, gang: str, wake: bool = True) -> None:
        """``key`` is no longer a member of ``gang``.  With ``wake`` (it was deleted or moved to
        another gang, not bound), its parked and backed-off peers are drawn again, as for a new
        member, and those in flight back off rather than park: the one that left may have been
        what held them back, as a member that disagreed on the gang's rules."""
        members = self._gangs.get(gang)
        if members is not None:
            members.discard(key)
            if not members:
                del self._gangs[gang]
            for peer in members if wake else ():
                if peer in self._in_flight:  # its batch saw the gang with ``key``: backed off, not parked
                    self._moved_in_flight.add(peer)
                elif self._parked.pop(peer, None) is not None or self._backoff.pop(peer, None) is not None:
                    self._activate(peer)

    def _first_backoff(self) -> float | None:
        """When the first backed-off pod is due (None: none backs off)."""
        due = self._backoff_due
        while due and self._backoff.get(due[0][1]) != due[0][0]:  # drawn, deleted or backed off anew
            heapq.heappop(due)
        return due[0][0] if due else None

    def _release_due(self, now: float) -> None:
        """Activate the backed-off pods now due and the parked ones due for the flush: only
        those are looked at (a wake with ten thousand waiting costs what is due)."""
        while (first := self._first_backoff()) is not None and first <= now:
            _, key = heapq.heappop(self._backoff_due)
            del self._backoff[key]
            self._activate(key)
        flushed = []
        for key, since in self._parked.items():  # parked in time order
            if since + self.flush_after > now:
                break
            flushed.append(key)
        for key in flushed:
            del self._parked[key]
            self._activate(key)

    def _activate(self, key: str, since: float | None = None) -> None:
        seq = next(self._seq)
        self._active[key] = (seq, self._clock() if since is None else since)  # an active one keeps its place
        self._push(key, seq)
        self._wake.set()

    def _members(self, gang: str) -> int:
        """Members of ``gang`` still pending: not those deleted while in flight, which the queue
        holds only until their batch resolves."""
        members = self._gangs.get(gang, set())
        return len(members) - len(members & self._deleted_in_flight)  # (iterates over the smaller set)

    def _enqueue(self, key: str) -> None:
        """Queue a new pod: active, or held for the next member if its gang is short of its minimum."""
        gang = self._records[key].pod.gang
        if gang is not None and self._members(gang.name) < gang.min_members:
            self._hold(key)
        else:
            self._activate(key)

    def _hold(self, key: str) -> None:
        """Wait ``gang_wait`` for the next member of the pod's gang (as a back-off, not counted as
        an attempt)."""
        ready = self._clock() + self.gang_wait
        self._backoff[key] = ready
        heapq.heappush(self._backoff_due, (ready, key))
        self._wake.set()

    def _push(self, key: str, seq: int) -> None:
        tenant = self._tenant(key)
        heap = self._heaps.setdefault(tenant, [])
        heapq.heappush(heap, (-self._records[key].pod.priority, seq, key))
        if len(heap) > 4 * len(self._active) + 1024:  # drop stale entries
            heap[:] = [e for e in heap if self._active.get(e[2], (-1, 0.0))[0] == e[1]]
            heapq.heapify(heap)

    def _settle(self, key: str) -> bool:
        """End the in-flight state; True when the outcome applies to the pod now queued.

        False when the pod was deleted meanwhile (it is dropped) or replaced by a new pod of
        the same name (that one is queued afresh).
        """
        uid = self._in_flight.pop(key, None)
        if uid is None:  # told while queued (not drawn): it leaves where it waits for the verdict's place
            self._forget(key, attempts=False)
        self._moved_in_flight.discard(key)
        self._changed_in_flight.discard(key)
        if key in self._deleted_in_flight:
            self._deleted_in_flight.discard(key)
            self._remove(key)
            return False
        record = self._records.get(key)
        if record is None:
            return False
        if uid is not None and record.uid != uid:
            self._forget(key)
            self._enqueue(key)
            return False
        return True

    def _remove(self, key: str, wake: bool = True) -> None:
        record = self._records.get(key)
        if record is not None and record.pod.gang is not None:
            self._leave_gang(key, record.pod.gang.name, wake)
        self._records.pop(key, None)
        self._forget(key)

    def _forget(self, key: str, attempts: bool = True) -> None:
        """Drop where the pod waits and (``attempts``) its retry count (not its record)."""
        self._active.pop(key, None)
        self._backoff.pop(key, None)
        self._parked.pop(key, None)
        if attempts:
            self._attempts.pop(key, None)


def _never(_: str) -> bool:
    return False
