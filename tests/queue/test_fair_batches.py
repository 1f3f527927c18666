"""With tenants, a batch draws tenant by tenant: below quota first, then the least used for its
weight, counting what the batch drew already; priority only within a tenant."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gpusched.model.pod import Gang
from gpusched.model.tenants import TenantRule, Tenants
from gpusched.queue.batcher import SchedulingQueue
from gpusched.state.records import PodRecord
from tests.factories import pod


def rec(name: str, tenant: str, gpus: int = 1, priority: int = 0, gang: str = "") -> PodRecord:
    p = replace(pod(name, gpus=gpus), namespace=tenant, priority=priority, gang=Gang(gang, 1) if gang else None)
    return PodRecord(p, uid=name, scheduler="gpu-scheduler")


async def drawn(q: SchedulingQueue) -> list[str]:
    return [r.pod.name for r in await asyncio.wait_for(q.next_batch(), 10)]


async def test_a_tenant_with_a_backlog_does_not_hold_back_a_tenant_below_its_quota() -> None:
    q = SchedulingQueue(max_size=4, max_wait=60)
    q.set_tenants(Tenants(rules={"b": TenantRule(quota=2000)}))
    for i in range(10):
        q.add(rec(f"a{i}", "a"))
    for i in range(3):
        q.add(rec(f"b{i}", "b"))
    # One pod per tenant per round; b, below its quota, first in each.
    assert await drawn(q) == ["b0", "a0", "b1", "a1"]


async def test_without_quotas_tenants_share_by_weight_and_usage() -> None:
    q = SchedulingQueue(max_size=6, max_wait=60)
    q.set_tenants(Tenants(rules={"b": TenantRule(weight=2.0)}), usage=lambda: {"a": 1000})
    for i in range(6):
        q.add(rec(f"a{i}", "a"))
        q.add(rec(f"b{i}", "b"))
    # b weighs twice as much: two pods a round to a's one, b first while its share (what it
    # holds for its weight) is the smaller.
    assert await drawn(q) == ["b0", "b1", "a0", "b2", "b3", "a1"]


async def test_priority_orders_pods_within_a_tenant_and_without_tenants_all_pods() -> None:
    q = SchedulingQueue(max_size=3, max_wait=60)
    q.add(rec("a-low", "a"))
    q.add(rec("b-low", "b"))
    q.add(rec("a-high", "a", priority=10))
    q.set_tenants(Tenants(label="team"))  # active: namespaces are tenants
    assert await drawn(q) == ["a-high", "b-low", "a-low"]
    q = SchedulingQueue(max_size=3, max_wait=60)
    q.add(rec("a-low", "a"))
    q.add(rec("b-low", "b"))
    q.add(rec("a-high", "a", priority=10))
    q.set_tenants(Tenants())  # nothing configured: priority, then arrival
    assert await drawn(q) == ["a-high", "a-low", "b-low"]


async def test_a_gang_is_drawn_whole_and_counts_for_its_tenant() -> None:
    q = SchedulingQueue(max_size=4, max_wait=0.01)
    q.set_tenants(Tenants(label="team"))
    for i in range(3):
        q.add(rec(f"g{i}", "a", gang="g"))
    for i in range(3):
        q.add(rec(f"b{i}", "b"))
    assert await drawn(q) == ["g0", "g1", "g2", "b0"]  # the gang exceeds the size: drawn whole
    assert await drawn(q) == ["b1", "b2"]
    assert q.counts().in_flight == 6


async def drawn_and_parked(q: SchedulingQueue) -> list[str]:
    batch = await asyncio.wait_for(q.next_batch(), 10)
    for r in batch:
        q.park(r.key)  # none fits now
    return [r.pod.name for r in batch]


async def test_a_backlog_that_fits_nowhere_does_not_keep_another_tenant_out_of_every_batch() -> None:
    # a is below its quota (or at its limit) with pods that keep failing and are woken by every
    # change in the cluster; b's pod must still be drawn.
    for rules, usage in (
        ({"a": TenantRule(quota=8000)}, {}),
        ({"a": TenantRule(limit=1000)}, {"a": 1000, "b": 10_000}),
    ):
        q = SchedulingQueue(max_size=2, max_wait=60)
        q.set_tenants(Tenants(rules=rules), usage=lambda u=usage: u)  # type: ignore[misc]
        for i in range(6):
            q.add(rec(f"a{i}", "a"))
        q.add(rec("b0", "b"))
        seen = await drawn_and_parked(q)
        q.move_all()
        seen += await drawn_and_parked(q)
        assert "b0" in seen, (rules, seen)


async def test_a_tenant_whose_next_pod_its_limit_holds_back_comes_last_in_a_round() -> None:
    q = SchedulingQueue(max_size=2, max_wait=60)
    q.set_tenants(Tenants(rules={"a": TenantRule(limit=1000)}), usage=lambda: {"a": 1000, "b": 10_000})
    q.add(rec("a0", "a"))
    q.add(rec("b0", "b"))
    assert await drawn(q) == ["b0", "a0"]


async def test_a_gang_as_large_as_a_batch_or_a_heavy_weight_does_not_keep_another_tenant_out() -> None:
    for rules, gang in (({"a": TenantRule(quota=8000)}, "g"), ({"a": TenantRule(weight=4.0)}, "")):
        q = SchedulingQueue(max_size=4, max_wait=60)
        q.set_tenants(Tenants(rules=rules))
        for i in range(4):
            q.add(rec(f"a{i}", "a", gang=gang))
        q.add(rec("b0", "b"))
        seen = await drawn_and_parked(q)
        q.move_all()
        seen += await drawn_and_parked(q)
        assert "b0" in seen, (rules, seen)


def test_a_weight_draws_its_whole_part_per_round() -> None:
    t = Tenants(rules={"x": TenantRule(weight=1.5), "y": TenantRule(weight=2.5), "z": TenantRule(weight=3.5)})
    assert (t.slots("x"), t.slots("y"), t.slots("z"), t.slots("other")) == (1, 2, 3, 1)


async def test_a_pod_whose_tenant_changes_while_it_waits_is_drawn_as_its_new_tenants() -> None:
    q = SchedulingQueue(max_size=4, max_wait=60)
    q.set_tenants(Tenants(rules={"b": TenantRule(quota=2000)}, label="team"))
    for i in range(3):
        q.add(rec(f"a{i}", "a"))
    moved = rec("moved", "ns")
    q.add(replace(moved, pod=replace(moved.pod, labels=(("team", "b"),))))
    q.add(replace(moved, pod=replace(moved.pod, labels=(("team", "a"),))))  # relabelled while it waits
    # Tenant b has nothing waiting now: the pod is drawn as a's, after a's older pods.
    assert await drawn(q) == ["a0", "a1", "a2", "moved"]
