"""The queue: batches close on size or time; every pod is somewhere; backoff and parking."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpusched.queue.batcher import QueueCounts, SchedulingQueue
from gpusched.state.records import PodRecord
from tests.factories import pod


def rec(name: str, priority: int = 0) -> PodRecord:
    p = pod(name)
    if priority:
        p = replace(p, priority=priority)
    return PodRecord(p, uid=name, scheduler="gpu-scheduler")


PROMPT = 10.0
"""How long a batch that should close at once (or after a few hundredths of a second) may take:
far below the minute of ``max_wait`` or ``flush_after`` a queue that failed to close it would
wait, far above what a busy machine can hold the event loop up."""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_batch_closes_on_size_at_once() -> None:
    q = SchedulingQueue(max_size=3, max_wait=60)
    for i in range(5):
        q.add(rec(f"p{i}"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert [r.pod.name for r in batch] == ["p0", "p1", "p2"]
    assert q.counts().in_flight == 3
    assert q.counts().active == 2


async def test_batch_closes_on_time() -> None:
    q = SchedulingQueue(max_size=100, max_wait=0.05)
    q.add(rec("a"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert [r.pod.name for r in batch] == ["a"]


async def test_priority_first_then_arrival() -> None:
    q = SchedulingQueue(max_size=3, max_wait=60)
    q.add(rec("low"))
    q.add(rec("high", priority=10))
    q.add(rec("low2"))
    batch = await q.next_batch()
    assert [r.pod.name for r in batch] == ["high", "low", "low2"]


async def test_parked_pods_return_on_cluster_change() -> None:
    q = SchedulingQueue(max_size=1, max_wait=0.01)
    q.add(rec("a"))
    (r,) = await q.next_batch()
    q.park(r.pod.key)
    assert q.counts().unschedulable == 1
    q.move_all()
    (again,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert again.pod.key == r.pod.key


async def test_a_change_that_concerns_some_parked_pods_wakes_only_those() -> None:
    q = SchedulingQueue(max_size=2, max_wait=0.01)
    q.add(replace(rec("with-claim"), claims=("data",)))
    q.add(rec("plain"))
    for r in await q.next_batch():
        q.park(r.pod.key)
    q.move_all(lambda r: "data" in r.claims)
    (woken,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert woken.pod.name == "with-claim"
    assert q.counts().unschedulable == 1


async def test_backoff_grows_and_releases() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=1, max_wait=0.0, initial_backoff=1.0, max_backoff=4.0, clock=clock)
    q.add(rec("a"))
    (r,) = await q.next_batch()
    q.backoff(r.pod.key)
    assert q.counts().backoff == 1
    clock.t = 0.5
    q._release_due(clock.t)
    assert q.counts().backoff == 1
    clock.t = 1.0
    (r,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    q.backoff(r.pod.key)  # second failure: 2 s
    assert q._backoff[r.pod.key] == 3.0
    clock.t = 3.0
    (r,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    q.backoff(r.pod.key)  # third failure: 4 s, the cap
    clock.t = 7.0
    (r,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    q.backoff(r.pod.key)  # fourth failure: 8 s would be past the cap, so 4 s again
    assert q._backoff[r.pod.key] == 11.0
    q._release_due(10.9)
    assert q.counts().backoff == 1
    clock.t = 11.0
    (r,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert r.pod.key == "default/a"


async def test_pod_deleted_in_flight_is_dropped_when_its_batch_resolves() -> None:
    q = SchedulingQueue(max_size=1, max_wait=0.0)
    q.add(rec("a"))
    (r,) = await q.next_batch()
    q.delete(r.pod.key)
    assert r.pod.key in q  # still in flight
    q.park(r.pod.key)
    assert r.pod.key not in q
    assert q.counts().unschedulable == 0


async def test_update_of_in_flight_pod_does_not_duplicate_it() -> None:
    q = SchedulingQueue(max_size=10, max_wait=0.0)
    q.add(rec("a"))
    await q.next_batch()
    q.add(rec("a"))
    assert q.counts().active == 0
    assert q.counts().in_flight == 1
    q.done("default/a")
    assert len(q) == 0


async def test_a_parked_pod_wakes_when_its_request_changes_not_its_status() -> None:
    from dataclasses import replace

    q = SchedulingQueue(max_size=10, max_wait=0.0)
    q.add(rec("a"))
    (r,) = await q.next_batch()
    q.park(r.key)
    # Our own PodScheduled=False write comes back from the watch: same request, new status.
    q.add(replace(r, resource_version="2", unschedulable="0/3 nodes are available: 3 Insufficient cpu."))
    assert q.counts().unschedulable == 1
    assert q.counts().active == 0
    q.add(replace(r, pod=replace(r.pod, cpu_milli=1), resource_version="3"))  # smaller now: try again
    assert q.counts().active == 1
    (again,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert again.pod.cpu_milli == 1


async def test_a_pod_created_again_under_its_name_is_queued_afresh() -> None:
    from dataclasses import replace

    q = SchedulingQueue(max_size=10, max_wait=0.0)
    q.add(rec("a"))
    (old,) = await q.next_batch()
    q.delete(old.key)  # deleted while its batch is solved ...
    new = replace(old, uid="a-2", pod=replace(old.pod, uid="a-2"))
    q.add(new)  # ... and created again
    q.done(old.key)  # the old pod's bind ends (gone): the new pod must not go with it
    assert q.counts().active == 1
    (drawn,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert drawn.uid == "a-2"
    q.park(drawn.key)
    newer = replace(new, uid="a-3", pod=replace(new.pod, uid="a-3"))
    q.add(newer)  # replaced while parked: a new pod, active at once
    assert q.counts().unschedulable == 0
    (drawn,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert drawn.uid == "a-3"
    q.done(drawn.key)
    assert len(q) == 0


async def test_idle_scheduler_closes_a_small_batch_at_once_busy_one_waits() -> None:
    clock = Clock()
    busy = [True]
    q = SchedulingQueue(max_size=64, max_wait=0.5, idle_wait=0.02, busy=lambda: busy[0], clock=clock)
    q.add(rec("a"))
    clock.t = 0.03
    waiting = asyncio.ensure_future(q.next_batch())
    await asyncio.sleep(0)
    assert not waiting.done()  # busy: gather more pods, up to max_wait
    busy[0] = False
    q.nudge()
    batch = await asyncio.wait_for(waiting, PROMPT)
    assert [r.pod.name for r in batch] == ["a"]


def gang_rec(name: str, gang: str) -> PodRecord:
    from dataclasses import replace

    from gpusched.model.pod import Gang

    return PodRecord(replace(pod(name), gang=Gang(gang, 3)), uid=name, scheduler="gpu-scheduler")


async def test_a_batch_draws_every_active_member_of_a_gang() -> None:
    q = SchedulingQueue(max_size=2, max_wait=0.05)
    q.add(gang_rec("g-0", "g"))
    q.add(rec("solo"))
    q.add(gang_rec("g-1", "g"))
    q.add(gang_rec("g-2", "g"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    # solo waited while the gang was short of its three members; the gang comes whole, past max_size
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1", "g-2", "solo"]
    assert q.counts().active == 0


async def test_a_new_member_brings_its_parked_peers_back() -> None:
    q = SchedulingQueue(max_size=10, max_wait=0.01)
    q.add(gang_rec("g-0", "g"))
    q.add(gang_rec("g-1", "g"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    for r in batch:
        q.park(r.key)  # two of three members: the solver left them out
    assert q.counts().unschedulable == 2
    q.add(gang_rec("g-2", "g"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1", "g-2"]
    for r in batch:
        q.done(r.key)
    assert len(q) == 0


async def test_arrivals_are_counted_over_a_sliding_window() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=4, max_wait=60, clock=clock)
    for i in range(3):
        q.add(rec(f"p{i}"))
    q.add(rec("p0"))  # an update, not an arrival
    assert q.arrived_within(1.0) == 3
    clock.t = 0.6
    q.add(rec("p3"))
    assert q.arrived_within(0.1) == 1, "only p3 arrived in the last tenth"
    assert q.arrived_within(1.0) == 4, "asking about a short window forgets nothing"
    clock.t = 1.2
    assert q.arrived_within(1.0) == 1, "the first three are older than a second"


async def test_a_limited_batch_closes_at_its_limit_and_leaves_the_rest_queued() -> None:
    q = SchedulingQueue(max_size=64, max_wait=60, clock=Clock())
    for i in range(30):
        q.add(rec(f"p{i}"))
    batch = await asyncio.wait_for(q.next_batch(limit=20), PROMPT)  # closes at once: 20 wait
    assert [r.pod.name for r in batch] == [f"p{i}" for i in range(20)]
    assert q.counts().active == 10
    for i in range(30, 90):
        q.add(rec(f"p{i}"))
    rest = await asyncio.wait_for(q.next_batch(limit=1000), PROMPT)
    assert len(rest) == 64, "a limit above max_size is max_size"


async def test_a_pod_backed_off_while_the_queue_waits_is_drawn_once_its_backoff_ends() -> None:
    q = SchedulingQueue(max_size=10, max_wait=0, flush_after=600, initial_backoff=0.05)
    q.add(rec("a"))
    (r,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    waiting = asyncio.create_task(q.next_batch())  # the queue is empty: it waits for a pod
    await asyncio.sleep(0.01)
    q.backoff(r.key)  # its bind failed: back after 50 ms, not after the ten-minute flush
    (again,) = await asyncio.wait_for(waiting, PROMPT)
    assert again.key == "default/a"


async def test_an_early_batch_closes_once_that_many_wait_without_the_idle_wait() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=64, max_wait=60, idle_wait=60, clock=clock)
    q.add(rec("a"))
    with pytest.raises(TimeoutError):  # one pod: waits (here for a minute of the fake clock)
        await asyncio.wait_for(q.next_batch(limit=20, early=2), 0.05)
    q.add(rec("b"))
    batch = await asyncio.wait_for(q.next_batch(limit=20, early=2), PROMPT)
    assert [r.pod.name for r in batch] == ["a", "b"]


async def test_an_early_batch_waits_for_a_gang_still_short_of_its_minimum() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=64, max_wait=60, idle_wait=60, clock=clock)
    q.add(gang_rec("g-0", "g"))
    q.add(gang_rec("g-1", "g"))  # two of three: a batch now could only fail the gang
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.next_batch(limit=20, early=2), 0.05)
    clock.t = 2 * q.gang_wait  # no longer held back as they arrived: still short of the third
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.next_batch(limit=20, early=2), 0.05)
    q.add(gang_rec("g-2", "g"))
    batch = await asyncio.wait_for(q.next_batch(limit=20, early=2), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1", "g-2"]


async def test_members_parked_apart_are_drawn_together_again() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, flush_after=60, gang_wait=1.0, clock=clock)
    q.add(gang_rec("g-0", "g"))
    clock.t = 1.0  # no other member came within the gang wait
    (first,) = await asyncio.wait_for(q.next_batch(), PROMPT)  # drawn before its peer arrived
    q.add(gang_rec("g-1", "g"))  # arrives while g-0 is in flight: it waits for the third
    q.park(first.key)
    clock.t = 2.0
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1"], "the parked member comes along"
    counts = q.counts()
    assert (counts.in_flight, counts.unschedulable, counts.active) == (2, 0, 0)


async def test_a_change_while_a_pod_is_in_flight_backs_it_off_instead_of_parking_it() -> None:
    """The batch was solved against the cluster (and the pod) as they were when it was drawn: a
    pod it could not place is parked only if nothing that might let it in came meanwhile."""
    clock = Clock()
    q = SchedulingQueue(max_size=3, max_wait=0, clock=clock)
    for name in ("freed", "updated", "quiet", "other"):
        q.add(rec(name))
    batch = await asyncio.wait_for(q.next_batch(limit=4), PROMPT)
    assert len(batch) == 3
    q.move_all(lambda r: r.pod.name == "freed")  # capacity freed that only "freed" can use
    q.add(replace(rec("updated"), pod=replace(pod("updated"), cpu_milli=1)))  # its request changed
    for name in ("freed", "updated", "quiet"):
        q.park(f"default/{name}")
    assert q.counts() == QueueCounts(active=1, backoff=2, unschedulable=1, in_flight=0)
    clock.t += 1.0  # the first backoff
    assert {r.pod.name for r in await asyncio.wait_for(q.next_batch(limit=3), PROMPT)} == {"freed", "updated", "other"}


async def test_backed_off_and_parked_pods_come_back_each_when_due_and_only_then() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0.0, initial_backoff=1.0, max_backoff=8.0, flush_after=60, clock=clock)
    for name in ("a", "b", "c", "p", "q"):
        q.add(rec(name))
    batch = await q.next_batch()
    assert len(batch) == 5
    q.backoff("default/a")  # due at 1
    q.backoff("default/b")  # due at 1
    q.park("default/p")  # flushed at 60
    clock.t = 30.0
    q.park("default/q")  # flushed at 90
    q.backoff("default/c")  # due at 31
    q._release_due(30.5)
    assert q.counts() == QueueCounts(active=2, backoff=1, unschedulable=2, in_flight=0)
    again = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.key for r in again) == ["default/a", "default/b"]
    clock.t = 30.5
    q.backoff("default/a")  # its second failure: due at 32.5, not at its first entry's time
    q.park("default/b")  # parked again: now the last to be flushed
    q._release_due(31.0)
    assert sorted(q._backoff) == ["default/a"]
    q._release_due(60.0)
    assert sorted(q._parked) == ["default/b", "default/q"]
    q._release_due(90.0)
    assert list(q._parked) == ["default/b"]  # parked at 30.5: due at 90.5
    q._release_due(90.5)
    assert q.counts().unschedulable == 0
    assert q.counts().backoff == 0


async def test_members_of_a_gang_created_one_by_one_are_drawn_once_all_came() -> None:
    # A controller creates a gang's pods a few at a time: each batch closed on one member alone
    # would fail the gang and tell every member so, once per new member.
    clock = Clock()
    q = SchedulingQueue(max_size=2, max_wait=0, gang_wait=1.0, clock=clock)
    for i in range(3):
        q.add(gang_rec(f"g-{i}", "g"))
        clock.t += 0.5  # within the gang wait of the last member
        assert q.counts().active == (3 if i == 2 else 0), i
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1", "g-2"]


async def test_members_of_a_gang_short_for_good_are_drawn_after_the_gang_wait() -> None:
    # Members may run already (one was recreated): the queue cannot tell, so it waits no longer.
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, gang_wait=1.0, clock=clock)
    q.add(gang_rec("g-0", "g"))
    assert q.counts().backoff == 1
    clock.t = 1.0
    (only,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert only.pod.name == "g-0"
    assert q.counts() == QueueCounts(active=0, backoff=0, unschedulable=0, in_flight=1)


async def test_a_verdict_on_a_queued_pod_leaves_it_in_one_place() -> None:
    q = SchedulingQueue(max_size=10, max_wait=0)
    q.add(rec("p"))
    q.backoff("default/p")  # told while waiting, not drawn (a MIG job ending, say)
    q.park("default/p")
    assert q.counts() == QueueCounts(active=0, backoff=0, unschedulable=1, in_flight=0)
    q.move_all()
    (drawn,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert drawn.pod.name == "p"
    assert q.counts() == QueueCounts(active=0, backoff=0, unschedulable=0, in_flight=1)


async def test_a_pod_moved_to_another_tenant_keeps_its_waiting_time() -> None:
    from gpusched.model.tenants import TenantRule, Tenants

    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0.5, clock=clock)
    q.set_tenants(Tenants(label="team", rules={"a": TenantRule(quota=1000), "b": TenantRule(quota=1000)}))
    q.add(replace(rec("p"), pod=replace(pod("p"), labels=(("team", "a"),))))
    clock.t = 0.4
    q.add(replace(rec("p"), pod=replace(pod("p"), labels=(("team", "b"),))))  # relabelled
    clock.t = 0.6  # past max_wait since it came, not since the relabel
    (drawn,) = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert drawn.pod.name == "p"


async def test_a_member_deleted_brings_its_parked_peers_back() -> None:
    # The member that disagreed on the gang's rules is deleted: the rest need not wait for the flush.
    q = SchedulingQueue(max_size=10, max_wait=0.01, flush_after=60.0)
    for i in range(3):
        q.add(gang_rec(f"g-{i}", "g"))
    for r in await asyncio.wait_for(q.next_batch(), PROMPT):
        q.park(r.key)
    assert q.counts().unschedulable == 3
    q.delete("default/g-2")
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1"]


async def test_a_member_bound_leaves_its_parked_peers_parked() -> None:
    # Bound, it takes room: the peers its batch left out fit no better.
    q = SchedulingQueue(max_size=10, max_wait=0.01, flush_after=60.0)
    for i in range(3):
        q.add(gang_rec(f"g-{i}", "g"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    q.park(batch[2].key)
    q.done(batch[0].key)
    q.done(batch[1].key)
    assert q.counts() == QueueCounts(active=0, backoff=0, unschedulable=1, in_flight=0)


async def test_a_member_deleted_while_its_peers_are_in_flight_backs_them_off_rather_than_parks_them() -> None:
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, initial_backoff=1.0, flush_after=60.0, clock=clock)
    for i in range(3):
        q.add(gang_rec(f"g-{i}", "g"))
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    q.delete("default/g-2")
    for r in batch:  # the batch, solved with g-2, left them all out
        q.park(r.key)
    counts = q.counts()
    assert counts.unschedulable == 0  # not left parked until the flush
    assert counts.active + counts.backoff == 2


async def test_a_pod_moved_into_a_gang_short_of_its_minimum_waits_for_the_next_member() -> None:
    # Relabelled into a gang, it is a new member as much as one created in it: the gang waits
    # for the rest rather than be drawn and failed one member at a time.
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, gang_wait=1.0, clock=clock)
    q.add(rec("g-1"))
    q.add(gang_rec("g-0", "g"))  # one of three: it waits for the next
    q.add(gang_rec("g-1", "g"))  # two of three: both wait
    assert q.counts() == QueueCounts(active=0, backoff=2, unschedulable=0, in_flight=0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.next_batch(), 0.05)
    clock.t = 1.0  # no third member within the gang wait: drawn as they are
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-1"]


async def test_a_member_created_again_under_its_name_waits_for_the_next_member_as_a_new_one_does() -> None:
    # A controller recreating a member of a gang still short of its minimum: the new pod is a new
    # member whether the deletion was seen (watch) or not (a relist), and whether or not the old
    # pod was in flight.
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, gang_wait=1.0, clock=clock)
    q.add(gang_rec("g-0", "g"))
    q.add(gang_rec("g-1", "g"))  # two of three
    clock.t = 0.5
    q.add(replace(gang_rec("g-1", "g"), uid="g-1-2"))  # created again; the deletion unseen
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.next_batch(), 0.05)
    clock.t = 1.5  # the gang wait from the new pod's arrival
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.uid for r in batch) == ["g-0", "g-1-2"]
    q.delete("default/g-1")  # deleted while in flight ...
    q.add(replace(gang_rec("g-1", "g"), uid="g-1-3"))  # ... and created again
    for r in batch:
        q.park(r.key)  # the old batch resolves: the new pod is queued afresh
    assert q.counts() == QueueCounts(active=0, backoff=1, unschedulable=1, in_flight=0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.next_batch(), 0.05)
    clock.t = 2.5
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.uid for r in batch) == ["g-0", "g-1-3"]


async def test_a_member_created_again_in_a_relist_brings_its_parked_peers_back() -> None:
    # The relist shows a new pod under the member's name, the deletion unseen: a member arrived.
    q = SchedulingQueue(max_size=10, max_wait=0.01, flush_after=60.0)
    for i in range(3):
        q.add(gang_rec(f"g-{i}", "g"))
    for r in await asyncio.wait_for(q.next_batch(), PROMPT):
        q.park(r.key)
    q.add(replace(gang_rec("g-2", "g"), uid="g-2-2"))
    assert q.counts() == QueueCounts(active=3, backoff=0, unschedulable=0, in_flight=0)
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.uid for r in batch) == ["g-0", "g-1", "g-2-2"]


async def test_a_member_deleted_in_flight_does_not_count_toward_its_gangs_minimum() -> None:
    # Deleted while its batch is solved, the member is gone: a member that arrives then finds
    # its gang short of its minimum, and waits for the next.
    clock = Clock()
    q = SchedulingQueue(max_size=10, max_wait=0, gang_wait=1.0, clock=clock)
    q.add(gang_rec("g-0", "g"))
    q.add(gang_rec("g-1", "g"))
    clock.t = 1.0  # two of three, no third within the gang wait: drawn as they are
    assert len(await asyncio.wait_for(q.next_batch(), PROMPT)) == 2
    q.delete("default/g-1")
    q.add(gang_rec("g-2", "g"))  # two of three pending again, not three
    assert q.counts() == QueueCounts(active=0, backoff=1, unschedulable=0, in_flight=2)
    q.park("default/g-0")
    q.park("default/g-1")  # its batch resolves: dropped
    clock.t = 2.0
    batch = await asyncio.wait_for(q.next_batch(), PROMPT)
    assert sorted(r.pod.name for r in batch) == ["g-0", "g-2"]


@pytest.mark.parametrize("turns", range(6))
async def test_a_wait_cancelled_as_the_queue_is_woken_ends_cancelled(turns: int) -> None:
    """Shutdown cancels the batch loop whenever it comes: a wake-up arriving in the same turns of
    the event loop must not eat the cancellation (the loop would wait on, and the process with it)."""
    q = SchedulingQueue(max_size=100, max_wait=60)
    q.add(rec("a"))
    task = asyncio.create_task(q.next_batch())
    for _ in range(3):
        await asyncio.sleep(0)  # waiting now, for the batch's time to close
    q.nudge()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=PROMPT)
    assert done, "the cancellation was lost: the queue went on waiting"
    assert task.cancelled()
