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
    # b is below its quota for its first two GPUs; then a (using nothing) and b alternate.
    assert await drawn(q) == ["b0", "b1", "a0", "a1"]


async def test_without_quotas_tenants_share_by_weight_and_usage() -> None:
    q = SchedulingQueue(max_size=6, max_wait=60)
    q.set_tenants(Tenants(rules={"b": TenantRule(weight=2.0)}), usage=lambda: {"a": 1000})
    for i in range(6):
        q.add(rec(f"a{i}", "a"))
        q.add(rec(f"b{i}", "b"))
    # a holds 1 GPU already and b weighs twice as much: b draws two before a's share is reached;
    # then each draws in turn as its share falls behind (on a tie, arrival order).
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
