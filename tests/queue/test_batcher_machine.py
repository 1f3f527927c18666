"""The queue driven by random sequences of the calls the daemon makes, checked after each step
against a model of what it was told: every pending pod is in exactly one place, none is drawn
twice at once nor after it left, gangs are drawn whole, and every waiting pod is drawn at last.

Time is the queue's clock, moved by a rule: batches close, back-offs end, gangs stop waiting
for members and parked pods are flushed as the clock says, never on the wall clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpusched.model.pod import Gang
from gpusched.model.tenants import TenantRule, Tenants
from gpusched.queue.batcher import QueueCounts, SchedulingQueue
from gpusched.state.records import PodRecord
from tests.factories import pod

NAMESPACES = ("a", "b")
KEYS = tuple(f"{ns}/p{i}" for ns in NAMESPACES for i in range(4))
MAX_WAIT = 0.5
FLUSH_AFTER = 30.0
MAX_BACKOFF = 4.0
GANG_WAIT = 1.0
LONG = FLUSH_AFTER + 1.0
"""Past every wait of the queue: the batch's, a back-off's, a gang's and the flush."""

TENANTS: tuple[Tenants | None, ...] = (
    None,
    Tenants(),  # nothing configured: priority alone
    Tenants(label="team"),  # the label's value, else the namespace
    Tenants(rules={"a": TenantRule(quota=2000)}),
    Tenants(rules={"b": TenantRule(weight=2.5, limit=1000)}),
)
USAGE: tuple[Mapping[str, int], ...] = ({}, {"a": 1000}, {"b": 3000, "x": 1000})


@dataclass(frozen=True)
class Shape:
    """What a pod asks for, as the watch reports it; an update changes some of it."""

    gang_min: int  # 0: no gang; else a member of its namespace's gang ``g`` with this minimum
    priority: int
    gpus: int
    team: str  # the ``team`` label ("" for none)
    cpu: int
    error: str  # what the scheduler cannot honour in it ("" for nothing)


shapes = st.builds(
    Shape,
    gang_min=st.sampled_from((0, 0, 1, 2, 3)),
    priority=st.sampled_from((0, 0, 10)),
    gpus=st.sampled_from((0, 1)),
    team=st.sampled_from(("", "x", "y")),
    cpu=st.sampled_from((1000, 2000)),
    error=st.sampled_from(("", "", "", "an annotation it cannot read")),
)


def record(key: str, uid: str, shape: Shape, version: int) -> PodRecord:
    namespace, name = key.split("/")
    p = replace(
        pod(name, cpu=shape.cpu, gpus=shape.gpus),
        namespace=namespace,
        uid=uid,
        priority=shape.priority,
        gang=Gang(f"{namespace}/g", shape.gang_min) if shape.gang_min else None,
        labels=(("team", shape.team),) if shape.team else (),
    )
    return PodRecord(p, uid=uid, scheduler="gpu-scheduler", resource_version=str(version), error=shape.error)


def gang_of(r: PodRecord) -> str:
    return r.pod.gang.name if r.pod.gang is not None else ""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.busy = False
        self.queue = SchedulingQueue(
            max_size=3,
            max_wait=MAX_WAIT,
            initial_backoff=1.0,
            max_backoff=MAX_BACKOFF,
            flush_after=FLUSH_AFTER,
            gang_wait=GANG_WAIT,
            busy=lambda: self.busy,
            clock=self.clock,
        )
        # The model: what the watch and the scheduler told the queue.
        self.held: dict[str, PodRecord] = {}
        """Key -> the latest record of each pod the queue must hold: pending (added, neither
        deleted nor done), or drawn and deleted since (dropped once its batch tells its fate)."""
        self.deleted: set[str] = set()
        """Keys drawn and deleted since (not created again)."""
        self.in_flight: dict[str, str] = {}
        """Key -> UID of the pod drawn, not yet bound, parked, backed off or requeued."""
        self.handling: list[str] = []
        """The keys of the last batch drawn: the one the scheduler is handling."""
        self.gone: dict[str, PodRecord] = {}
        """Key -> the record of a pod bound (``done``) and not pending since."""
        self.version = 0
        self.uids = 0
        self.tenants: Tenants | None = None
        self.moved: set[str] = set()
        """Keys in flight since a change that may let them in: their batch saw the cluster, or
        them, as they were before it."""
        self.last_change: dict[str, tuple[str, float]] = {}
        """Gang -> the last change of its members, and when: "arrived" (a new member), "left"
        (deleted, or moved to another gang), "told" (a verdict on one) or "woken" (a change in
        the cluster for one parked)."""

    def teardown(self) -> None:
        self.loop.close()

    # -- helpers ---------------------------------------------------------------------------
    def queued(self) -> list[str]:
        """Pending pods not in flight: active, parked or backed off."""
        return sorted(k for k in self.held if k not in self.in_flight)

    def members(self, gang: str) -> set[str]:
        """The pending members of ``gang`` the queue knows, drawn ones included (not those drawn
        and deleted since)."""
        return {k for k, r in self.held.items() if gang_of(r) == gang and k not in self.deleted}

    def give(self, r: PodRecord) -> None:
        """The watch reports ``r`` pending."""
        key = r.key
        old = self.held.get(key)
        if key in self.deleted and old is not None and old.uid != r.uid:
            self.deleted.discard(key)  # created again under its name
        gang, was = gang_of(r), (gang_of(old) if old is not None else "")
        if was and was != gang:
            self.last_change[was] = ("left", self.clock.t)
        if gang and (was != gang or old is None or old.uid != r.uid):  # a new member: joined, or a new pod
            self.last_change[gang] = ("arrived", self.clock.t)
        if key in self.in_flight and old is not None and (old.pod, old.error) != (r.pod, r.error):
            self.moved.add(key)  # it may fit now: its batch saw it as it was
        self.held[key] = r
        self.gone.pop(key, None)
        self.queue.add(r)
        if was and was != gang:
            self.check_woken(was, "left it")
        if gang and (was != gang or old is None or old.uid != r.uid):
            self.check_woken(gang, f"{key} joined it")

    def check_woken(self, gang: str, why: str) -> None:
        """A member arrived or left: the gang is retried as it is now, none of its members left
        parked until the flush."""
        parked = sorted(k for k in self.queue._parked if gang_of(self.held[k]) == gang)
        assert not parked, f"gang {gang}: {parked} still parked after {why}"

    def told(self, key: str) -> None:
        """A verdict on ``key``: the scheduler's word on where it waits now, not the gang wait's."""
        gang = gang_of(self.held[key])
        if gang:
            self.last_change[gang] = ("told", self.clock.t)

    def settle(self, key: str, verdict: str) -> None:
        """The model's side of a verdict on the drawn ``key``."""
        self.told(key)
        self.moved.discard(key)
        uid = self.in_flight.pop(key)
        if key in self.deleted:  # gone meanwhile: dropped (its peers woken, once told)
            self.deleted.discard(key)
            del self.held[key]
        elif verdict == "done" and self.held[key].uid == uid:  # bound (not a namesake created since)
            self.gone[key] = self.held.pop(key)

    async def _try_draw(self, limit: int | None, early: int | None) -> list[PodRecord] | None:
        """The batch ``next_batch`` returns now, or None: it would wait (for the clock)."""
        task = asyncio.ensure_future(self.queue.next_batch(limit, early))
        await asyncio.sleep(0)  # up to the batch, or to its first wait
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    def draw(self, limit: int | None = None, early: int | None = None) -> list[PodRecord] | None:
        before = dict(self.in_flight)
        batch = self.loop.run_until_complete(self._try_draw(limit, early))
        if batch is None:
            return None
        keys = [r.key for r in batch]
        assert batch, "a batch closed empty"
        assert len(set(keys)) == len(keys), f"a pod twice in one batch: {keys}"
        for r in batch:
            assert r.key not in before, f"{r.key} drawn while in flight in an earlier batch"
            assert r.key in self.held, f"{r.key} drawn after it was bound or deleted"
            assert r.key not in self.deleted, f"{r.key} drawn after it was deleted"
            assert r == self.held[r.key], f"{r.key} drawn as {r}, not as last reported: {self.held[r.key]}"
        size = self.queue.max_size if limit is None else max(1, min(limit, self.queue.max_size))
        last = gang_of(batch[-1])
        last_unit = sum(1 for r in batch if last and gang_of(r) == last) or 1
        assert len(batch) - last_unit < size, f"batch of {keys} past its size {size} by more than a gang"
        for gang in {gang_of(r) for r in batch} - {""}:
            left_out = {k for k in self.members(gang) if k not in before} - set(keys)
            assert not left_out, f"gang {gang} drawn without its members {sorted(left_out)}: {keys}"
            # A gang short of its minimum waits for its next member, the gang wait from the last
            # one's arrival; not when a member left, was told a verdict or woken by the cluster
            # since: then the gang is drawn as it is now (those that wait for the next member come
            # along, as every member does).  Members that disagree on the minimum are told so at
            # once: the queue need not hold them.
            pending = self.members(gang)
            minimum = {g.min_members for k in pending if (g := self.held[k].pod.gang) is not None}
            short = len(minimum) == 1 and len(pending) < min(minimum)
            change, at = self.last_change[gang]
            assert not short or change != "arrived" or self.clock.t >= at + GANG_WAIT, (
                f"gang {gang} drawn short of its minimum ({len(pending)} pending) {self.clock.t - at:.2f} s after "
                f"its last member arrived, within the gang wait: {keys}"
            )
        # Higher priority first, within each tenant: no pod left waiting in active outranks the
        # pod that started a unit (a pod, or a gang) of the batch.
        tenants = self.tenants if self.tenants is not None and self.tenants.active else None
        floor: dict[str, int] = {}
        for i, r in enumerate(batch):
            if i == 0 or not gang_of(r) or gang_of(r) != gang_of(batch[i - 1]):
                tenant = tenants.of(r.pod) if tenants is not None else ""
                floor[tenant] = min(floor.get(tenant, r.pod.priority), r.pod.priority)
        for key in self.queue._active:
            r = self.held[key]
            tenant = tenants.of(r.pod) if tenants is not None else ""
            assert r.pod.priority <= floor.get(tenant, r.pod.priority), f"{key} outranks the batch {keys}"
        for r in batch:
            self.in_flight[r.key] = r.uid
        self.handling = keys
        return batch

    # -- the watch -------------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), shape=shapes)
    def add(self, key: str, shape: Shape) -> None:
        """A pod created, or an update of a pending one (its request, its gang, its tenant, or
        only its status)."""
        self.version += 1
        old = self.held.get(key)
        if old is None or key in self.deleted:
            # A pod deleted is never reported pending again under its UID: a new pod of its name.
            self.uids += 1
            uid = f"{key}#{self.uids}"
        else:
            uid = old.uid
            shape = replace(shape, priority=old.pod.priority)  # fixed when the pod is created
        self.give(record(key, uid, shape, self.version))

    @precondition(lambda self: any(k not in self.deleted for k in self.held))
    @rule(data=st.data())
    def recreate(self, data: st.DataObject) -> None:
        """A pending pod deleted and created again under its name, the deletion unseen (a relist)."""
        key = data.draw(st.sampled_from(sorted(k for k in self.held if k not in self.deleted)))
        self.version += 1
        self.uids += 1
        self.give(replace(self.held[key], uid=f"{key}#{self.uids}", resource_version=str(self.version)))

    @precondition(lambda self: bool(self.gone))
    @rule(data=st.data())
    def stale_update(self, data: st.DataObject) -> None:
        """A pod bound reported pending once more: an event from before its Binding, which the
        watch delivers after the Binding's answer came."""
        key = data.draw(st.sampled_from(sorted(self.gone)))
        self.give(self.gone[key])

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        """Deleted, or no longer pending (bound, by this scheduler or as the watch saw it)."""
        old = self.held.get(key)
        if old is not None and key not in self.deleted:
            if old.pod.gang is not None:
                self.last_change[old.pod.gang.name] = ("left", self.clock.t)
            if key in self.in_flight:
                self.deleted.add(key)
            else:
                del self.held[key]
        self.gone.pop(key, None)
        self.queue.delete(key)
        if old is not None and old.pod.gang is not None and key not in self.in_flight:
            self.check_woken(old.pod.gang.name, f"{key} was deleted")

    # -- the cluster -----------------------------------------------------------------------
    @rule(namespace=st.sampled_from((None, *NAMESPACES)))
    def move_all(self, namespace: str | None) -> None:
        """The cluster changed: all parked pods may fit, or those of one namespace."""

        def picks(r: PodRecord) -> bool:
            return namespace is None or r.pod.namespace == namespace

        for r in self.queue.parked():
            if picks(r) and gang_of(r):
                self.last_change[gang_of(r)] = ("woken", self.clock.t)
        self.moved |= {k for k in self.in_flight if k in self.held and picks(self.held[k])}
        self.queue.move_all(None if namespace is None else picks)
        stuck = [r.key for r in self.queue.parked() if picks(r)]
        assert not stuck, f"parked still after move_all: {stuck}"

    @rule(seconds=st.sampled_from((0.01, 0.25, MAX_WAIT, GANG_WAIT, 2.5, LONG)))
    def tick(self, seconds: float) -> None:
        self.clock.t += seconds

    @rule(busy=st.booleans())
    def binds(self, busy: bool) -> None:
        """Binds in flight keep the client busy, or the last one ended."""
        self.busy = busy
        self.queue.nudge()

    @rule(
        tenants=st.sampled_from(TENANTS),
        usage=st.sampled_from(USAGE),
        max_size=st.sampled_from((1, 2, 3, 4)),
    )
    def reconfigure(self, tenants: Tenants | None, usage: Mapping[str, int], max_size: int) -> None:
        """A new configuration: tenants' rules and the batch's size."""
        held: Callable[[], Mapping[str, int]] = lambda: usage  # noqa: E731
        self.queue.set_tenants(tenants, held)
        self.tenants = tenants
        self.queue.max_size = max_size
        self.queue.nudge()

    # -- the scheduler ---------------------------------------------------------------------
    @rule(
        size=st.sampled_from(((None, None), (2, 2), (5, 2), (1, None))),
        waits=st.sampled_from((0.0, 0.02, MAX_WAIT, GANG_WAIT)),
    )
    def next_batch(self, size: tuple[int | None, int | None], waits: float) -> None:
        """The scheduler asks for a batch (a quick one while its client idles), drawn if one
        closes now, or else after it ``waits`` (if one closes by then, without more news)."""
        if self.draw(*size) is None and waits:
            self.clock.t += waits
            self.draw(*size)

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), verdict=st.sampled_from(("done", "park", "backoff", "requeue")))
    def tell(self, data: st.DataObject, verdict: str) -> None:
        """A drawn pod's fate: bound, fits nowhere, bind failed, or its batch not acted on.  Also
        for a pod deleted or created again since it was drawn (the scheduler parks or requeues
        it, and the queue settles it).  Pods of any batch still in flight, in any order: binds
        end as they end."""
        key = data.draw(st.sampled_from(sorted(self.in_flight)))
        stale = key in self.moved and key not in self.deleted and self.held[key].uid == self.in_flight[key]
        gone = key in self.deleted and gang_of(self.held[key])
        self.settle(key, verdict)
        getattr(self.queue, verdict)(key)
        if gone:
            self.check_woken(gone, f"{key}, deleted while in flight, was told")
        assert not (stale and key in self.queue._parked), f"{key} parked on a view older than a change that concerns it"

    @precondition(lambda self: bool(self.queued()))
    @rule(data=st.data(), verdict=st.sampled_from(("park", "backoff")))
    def tell_queued(self, data: st.DataObject, verdict: str) -> None:
        """A verdict on a pod not drawn: a MIG re-partition that failed tells the pods that
        waited for it (parked, or woken since) that they do not fit.  Only ``park`` and
        ``backoff`` (``tell_unschedulable``): the scheduler binds (``done``) and ``requeue``s
        only pods it drew."""
        key = data.draw(st.sampled_from(self.queued()))
        self.told(key)
        getattr(self.queue, verdict)(key)

    @precondition(lambda self: any(k in self.in_flight for k in self.handling))
    @rule(data=st.data())
    def batch_failed(self, data: st.DataObject) -> None:
        """Handling the last batch raised: those of its pods still drawn back off (those whose
        bind started are left out).  Only the last batch, and once: the scheduler handles one
        batch at a time and draws the next after it, so a key of an earlier batch may be in
        flight again in a later one, which no failure of the earlier one concerns."""
        keys = data.draw(st.lists(st.sampled_from(self.handling), unique=True, min_size=1))
        for key in keys:
            if key in self.in_flight:
                self.settle(key, "backoff")
        self.queue.back_off_drawn(keys)
        self.handling = []

    @precondition(lambda self: bool(self.queued()))
    @rule()
    def drain(self) -> None:
        """No more news: as time passes, every pod waiting is drawn, the parked ones too."""
        waiting = set(self.queued())
        drawn: set[str] = set()
        for _ in range(len(waiting) + 2):
            self.clock.t += LONG
            batch = self.draw()
            drawn |= {r.key for r in batch or ()}
            if not self.queued():
                break
        assert waiting <= drawn, f"never drawn: {sorted(waiting - drawn)}"

    # -- what holds after every step -------------------------------------------------------
    @invariant()
    def every_pod_in_one_place(self) -> None:
        q = self.queue
        places = {
            "active": set(q._active),
            "parked": set(q._parked),
            "backoff": set(q._backoff),
            "in flight": set(q._in_flight),
        }
        for key in self.held:
            where = [name for name, keys in places.items() if key in keys]
            assert len(where) == 1, f"{key} is in {where or 'no place'}"
        extra = set().union(*places.values()) - set(self.held)
        assert not extra, f"the queue holds pods deleted or bound: {sorted(extra)}"
        assert places["in flight"] == set(self.in_flight)
        assert q._in_flight == self.in_flight, "in flight as another pod than was drawn"
        assert sorted(q.pending_keys()) == sorted(self.held)
        for key, r in self.held.items():
            assert q.record(key) == r, f"{key}: the queue holds {q.record(key)}, not {r}"
            assert q.current(key, r.uid) == (key not in self.deleted)

    @invariant()
    def counts_agree(self) -> None:
        q = self.queue
        counts = q.counts()
        assert counts.in_flight == len(self.in_flight)
        assert counts.active + counts.backoff + counts.unschedulable + counts.in_flight == len(self.held) == len(q)
        assert counts == QueueCounts(len(q._active), len(q._backoff), len(q._parked), len(q._in_flight))
        gangs = {gang_of(r) for r in self.held.values()} - {""}
        for gang in gangs:
            assert q.gang_pending(gang) == len({k for k, r in self.held.items() if gang_of(r) == gang}), gang


QueueMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, derandomize=True, database=None
)
TestQueueMachine = QueueMachine.TestCase
