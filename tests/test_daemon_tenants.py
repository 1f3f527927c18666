"""Tenants in the daemon: limits hold pods back with an Event, quota goes first in a batch,
reclaim takes borrowed GPUs back (and only those), and preemption stays within a tenant."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from gpusched.config import parse_config
from gpusched.daemon import Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.model import Pod
from tests.doubles import RecordingApi, one_node_scheduler, settle, web_budget
from tests.e2e import kit
from tests.test_daemon_preempt import _Api, _cycle, _leaving, _member, _pod, _two_nodes
from tests.test_daemon_utilisation import EvictingApi, batch, pod


def of(name: str, ns: str, priority: int = 0, **kw: Any) -> dict[str, Any]:
    obj = pod(name, priority, **kw)
    obj["metadata"]["namespace"] = ns
    return obj


def member(name: str, ns: str, priority: int) -> dict[str, Any]:
    """A pending member of gang ``job`` (two members at least)."""
    obj = of(name, ns, priority)
    obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "job"
    obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "2"
    return obj


def tenants(s: Scheduler, **section: Any) -> None:
    s.set_config(parse_config({"tenants": section}))


def gauge(s: Scheduler, prefix: str) -> list[str]:
    return [x for x in s.metrics.render()[0].decode().splitlines() if x.startswith(prefix)]


async def _preempts(s: Scheduler, api: EvictingApi, preemptor: dict[str, Any], victim: dict[str, Any]) -> None:
    """``preemptor`` comes and evicts ``victim`` (bound; the first pod evicted), which is then
    seen leaving: room is held for it on the victim's node while it goes."""
    s._pending.apply("ADDED", preemptor)
    await batch(s)
    meta = victim["metadata"]
    assert api.evicted == [f"{meta['namespace']}/{meta['name']}"]
    meta["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", victim)


async def test_a_tenant_at_its_limit_is_held_back_with_the_reason_and_woken_when_it_frees_gpus() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=5)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    s._bound.apply("ADDED", of("run", "a", node="n0", gpu=0))
    s._pending.apply("ADDED", of("p1", "a"))
    s._pending.apply("ADDED", of("p2", "a"))
    s._pending.apply("ADDED", of("other", "b", gpus=2))
    await batch(s)
    # Each fits the limit beside what a holds; together they pass it: the later one waits for
    # the next batch, which sees what this one bound.
    assert sorted(api.bound) == ["a/p1", "b/other"]
    assert api.failed("a/p2") == []
    await batch(s)
    assert api.failed("a/p2") == ["tenant a is at its GPU limit: it holds 2 of 2 GPUs and this pod asks for 1 more."]
    assert s.queue.counts().unschedulable == 1
    s._bound.apply("DELETED", of("run", "a", node="n0", gpu=0))  # a frees a GPU: p2 is drawn again
    assert s.queue.counts().active == 1
    await batch(s)
    assert api.bound[-1] == "a/p2"


class ConditionApi(RecordingApi):
    """Records the reason of each pod's ``PodScheduled=False`` condition, as written last."""

    def __init__(self) -> None:
        super().__init__()
        self.conditions: dict[str, str] = {}

    async def unschedulable(self, pod: Pod, message: str, *_: Any, reason: str = "Unschedulable", **__: Any) -> None:
        self.conditions[pod.key] = reason


async def test_a_pod_held_back_by_its_tenants_limit_is_no_call_for_a_new_node() -> None:
    """The cluster autoscaler adds a node for a pod whose condition says ``Unschedulable``: a
    pod only its tenant's limit holds back says ``TenantLimit``, one that fits nowhere still
    ``Unschedulable``; the held one still waits for its tenant to free GPUs."""
    api = ConditionApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    s._bound.apply("ADDED", of("run", "a", node="n0", gpu=0))
    s._pending.apply("ADDED", of("next", "a"))
    s._pending.apply("ADDED", of("big", "b", gpus=4))  # no node has 4 GPUs
    await batch(s)
    await settle(s)
    assert api.conditions == {"a/next": "TenantLimit", "b/big": "Unschedulable"}
    for name, ns, gpus in (("next", "a", 1), ("big", "b", 4)):  # as the watch shows them once told
        told = of(name, ns, gpus=gpus)
        reason = api.conditions[f"{ns}/{name}"]
        told["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason}]}
        s._pending.apply("MODIFIED", told)
    s.queue.move_all()  # drawn again, not told yet: they wait all the same
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand ") == ["gpusched_unschedulable_gpu_demand 4.0"]
    s._bound.apply("DELETED", of("run", "a", node="n0", gpu=0))  # a frees its GPU: next is placed
    await batch(s)
    assert "a/next" in api.bound


async def test_a_pod_larger_than_its_tenants_limit_is_told_it_asks_for_more_than_the_limit() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    s._pending.apply("ADDED", of("big", "a", gpus=4))
    await batch(s)
    assert api.bound == []
    assert api.failed("a/big") == [
        "this pod asks for 4 GPUs, more than tenant a's GPU limit of 2: it cannot be placed while that limit stands."
    ]
    assert s.queue.counts().unschedulable == 1  # it waits: a higher limit would let it in
    tenants(s, quotas={"a": {"limitGpus": 4}})
    await batch(s)
    assert api.bound == ["a/big"]


async def test_a_pod_no_node_takes_does_not_use_up_its_tenants_limit() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=4)
    tenants(s, quotas={"a": {"limitGpus": 3}})
    s._bound.apply("ADDED", of("a-low", "a", 0, node="n0", gpu=0))  # a holds 1 of 3
    h100 = of("wants-h100", "a", 10, gpus=2)
    h100["metadata"]["annotations"]["gpusched.io/gpu-models"] = "H100"  # no node takes it
    s._pending.apply("ADDED", h100)
    s._pending.apply("ADDED", of("small", "a", 5))
    await batch(s)
    assert api.bound == ["a/small"]
    assert api.evicted == []
    assert [m for m in api.failed("a/wants-h100") if "limit" in m] == []


async def test_a_pod_in_its_grace_period_counts_against_the_limit() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    run = of("run", "a", node="n0", gpu=0)
    run["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    s._bound.apply("ADDED", run)
    s._pending.apply("ADDED", of("next", "a"))
    await batch(s)
    assert api.bound == []
    assert api.failed("a/next") == ["tenant a is at its GPU limit: it holds 1 of 1 GPUs and this pod asks for 1 more."]


async def test_reclaim_leaves_a_running_gang_whole() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=4)
    tenants(s, quotas={"a": {"quotaGpus": 3}, "b": {"quotaGpus": 1}})
    for i in range(4):  # one job of 4, all needed; a is one GPU past its quota
        member = of(f"w{i}", "a", 0, node="n0", gpu=i)
        member["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "train"
        member["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "4"
        s._bound.apply("ADDED", member)
    s._pending.apply("ADDED", of("b1", "b", 0))
    await batch(s)
    assert api.evicted == []
    assert gauge(s, "gpusched_reclaim_attempts_total") == ["gpusched_reclaim_attempts_total 1.0"]


async def test_a_pod_within_quota_is_solved_with_its_affinity_peer_of_the_same_batch() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    s.settings = dataclasses.replace(s.settings, policy="cpsat")
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    worker = of("worker", "b", 10)  # within b's quota; must run beside the ps, past it
    worker["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "ps"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    ps = of("ps", "b", 0)
    ps["metadata"]["labels"]["app"] = "ps"
    s._pending.apply("ADDED", worker)
    s._pending.apply("ADDED", ps)
    await batch(s)
    assert sorted(api.bound) == ["b/ps", "b/worker"], api.failed("b/worker")


async def test_only_pods_that_may_reclaim_count_as_reclaim_attempts() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    s._bound.apply("ADDED", of("b-low", "b", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", of("b-high", "b", 10))  # past b's quota: preempts within b instead
    await batch(s)
    assert api.evicted == ["b/b-low"]
    assert gauge(s, "gpusched_reclaim_attempts_total") == ["gpusched_reclaim_attempts_total 0.0"]
    assert gauge(s, "gpusched_preemption_attempts_total") == ["gpusched_preemption_attempts_total 1.0"]


async def test_pods_within_their_quota_are_placed_before_a_larger_pod_past_its_own() -> None:
    # 2 idle GPUs; tenant a (no quota) asks for 2, tenant b (quota 1) for 1 twice.  Maximising the
    # GPUs placed alone is a tie (2 either way); the quota decides: b's pod within it goes first.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    s.settings = dataclasses.replace(s.settings, policy="cpsat")  # it would place 'big': more GPUs
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    s._pending.apply("ADDED", of("big", "a", gpus=2))
    s._pending.apply("ADDED", of("b1", "b"))
    await batch(s)
    assert api.bound == ["b/b1"]
    assert api.failed("a/big")


async def test_a_pod_within_its_quota_reclaims_borrowed_gpus_whatever_their_priority() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    s._bound.apply("ADDED", of("a-hi", "a", 500, node="n0", gpu=0))
    s._bound.apply("ADDED", of("a-lo", "a", 100, node="n0", gpu=1))
    s._pending.apply("ADDED", of("b1", "b", 0))
    await batch(s)
    assert api.evicted == ["a/a-lo"]
    assert api.why == [
        "reclaiming GPUs for tenant b, within its quota of 1 GPUs, from tenants past their own quota: a (quota 0)"
    ]
    (message,) = api.failed("b/b1")
    assert "Reclaiming the GPUs of 1 pod(s) on node n0 from tenant(s) a, past their quota" in message
    assert s.cache.nomination("b/b1") is not None
    assert gauge(s, "gpusched_reclaim_victims_total") == ["gpusched_reclaim_victims_total 1.0"]
    held = gauge(s, "gpusched_tenant_gpus{")
    assert 'gpusched_tenant_gpus{tenant="b"} 1.0' in held  # the room held for b1 counts for b
    assert 'gpusched_tenant_gpus{tenant="a"} 1.0' in held  # a-lo, being evicted, no longer does


async def test_reclaim_follows_the_queue_order_between_tenants_not_priority() -> None:
    # One GPU is borrowed (c holds it past its quota of 0).  a holds none of its quota of 1 and b
    # holds 1 of its 2: the queue draws a first, and a reclaims that GPU, though b's pod outranks.
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    tenants(s, quotas={"a": {"quotaGpus": 1}, "b": {"quotaGpus": 2}})
    s._bound.apply("ADDED", of("b-run", "b", 10, node="n1", gpu=0))  # b1 may not preempt it
    s._bound.apply("ADDED", of("c-run", "c", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", of("a1", "a", 0))
    s._pending.apply("ADDED", of("b1", "b", 10))
    drawn = await asyncio.wait_for(s.queue.next_batch(), 10)
    assert [r.key for r in drawn] == ["a/a1", "b/b1"]
    await s.schedule_batch(drawn)
    await settle(s)
    assert api.evicted == ["c/c-run"]
    assert s.cache.nomination("a/a1") == ("n0", (0,), 1)
    assert s.cache.nomination("b/b1") is None


async def test_no_reclaim_past_the_quota_below_the_victims_quota_or_of_protected_priority() -> None:
    cases = [
        ({"b": {"quotaGpus": 1}}, ("b-run", "b", 100), "b has its quota already (and b-run outranks b1)"),
        ({"b": {"quotaGpus": 1}, "a": {"quotaGpus": 2}}, ("a0", "a", 0), "a is within its own quota"),
        ({"b": {"quotaGpus": 1}}, ("a0", "a", 1_000_000), "a's other pod is of the protected priority"),
    ]
    for quotas, (name, ns, prio), why in cases:
        api = EvictingApi()
        s = one_node_scheduler(api, gpus=2)
        tenants(s, quotas=quotas)
        s._bound.apply("ADDED", of("a1", "a", prio if ns == "a" else 0, node="n0", gpu=1))
        s._bound.apply("ADDED", of(name, ns, prio, node="n0", gpu=0))
        s._pending.apply("ADDED", of("b1", "b", 10))
        await batch(s)
        assert api.evicted == [], why
        assert api.failed("b/b1"), why


async def test_preemption_by_priority_stays_within_the_tenant() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, label="team", reclaim=False)
    s._bound.apply("ADDED", of("a-low", "a", 0, node="n0", gpu=0))
    s._bound.apply("ADDED", of("b-low", "b", 0, node="n0", gpu=1))
    s._pending.apply("ADDED", of("b-urgent", "b", 100))
    await batch(s)
    assert api.evicted == ["b/b-low"]
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, label="team")
    s._bound.apply("ADDED", of("a-low", "a", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", of("c-urgent", "c", 100))  # no quota: nothing to reclaim; a is not its tenant
    await batch(s)
    assert api.evicted == []
    assert api.failed("c/c-urgent")


async def test_without_tenant_rules_nothing_changes() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", of("a-low", "a", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", of("c-urgent", "c", 100))
    await batch(s)
    assert api.evicted == ["a/a-low"]
    assert gauge(s, "gpusched_tenant_gpus{") == []


async def test_pods_held_back_by_their_limit_are_no_demand_for_new_nodes() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    s._bound.apply("ADDED", of("run", "a", node="n0", gpu=0))
    s._pending.apply("ADDED", of("over", "a", gpus=2))
    s._pending.apply("ADDED", of("other", "b", gpus=3))
    await batch(s)
    assert api.reasons("a/over") == ["FailedScheduling"]
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == ["gpusched_unschedulable_gpu_demand 3.0"]
    assert gauge(s, "gpusched_pods_unschedulable_total{") == [
        'gpusched_pods_unschedulable_total{reason="TenantLimit"} 1.0',
        'gpusched_pods_unschedulable_total{reason="Insufficient nvidia.com/gpu"} 1.0',
    ]


async def test_room_held_for_a_pod_is_not_counted_twice_against_its_limit() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    s._bound.apply("ADDED", of("low", "a", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", of("urgent", "a", 100))
    await batch(s)
    assert api.evicted == ["a/low"]
    assert s.cache.nomination("a/urgent") is not None
    s.queue.move_all()  # drawn again while its victim is still leaving
    await batch(s)
    first, again = api.failed("a/urgent")
    assert first == (
        "tenant a is at its GPU limit: it holds 1 of 1 GPUs and this pod asks for 1 more. "
        "Preempting 1 pod(s) of lower priority on node n0."
    )
    assert again == (
        "Waiting for 1 preempted pod(s) to leave node n0: tenant a has a GPU limit, "
        "so the pod takes only the room they leave."
    )
    assert s.cache.nomination("a/urgent") is not None


async def test_a_pod_waiting_for_its_victims_takes_no_free_gpu_elsewhere_past_its_limit() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=3)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    low = of("low", "a", 0, node="n0", gpu=1)
    s._bound.apply("ADDED", of("run", "a", 50, node="n0", gpu=0))
    s._bound.apply("ADDED", low)
    s._pending.apply("ADDED", of("urgent", "a", 100))
    await batch(s)  # at its limit: urgent preempts low and waits for its GPU
    assert api.evicted == ["a/low"]
    s._pending.apply("ADDED", of("q", "a", 60))  # (of higher priority than urgent, it would take its room over)
    s.queue.move_all()  # urgent drawn again, beside q, while low is leaving; GPU 2 is free
    await batch(s)
    assert "a/urgent" not in api.bound  # not onto GPU 2: a would hold run, low (leaving), urgent and q
    assert s.cache.nomination("a/urgent") is not None
    s._bound.apply("DELETED", low)
    for _ in range(3):
        if s.queue.counts().active:
            await batch(s)
    assert "a/urgent" in api.bound
    assert s.cache.tenant_usage(s.tenants, terminating=True)["a"] <= 2000


async def test_pods_that_preempt_together_stay_within_their_limit() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=4)
    NodeHandler(s).apply("ADDED", kit.node("n1", 4, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 5}})
    for n in ("n0", "n1"):
        s._bound.apply("ADDED", of(f"a-low-{n}", "a", 0, node=n, gpu=0))
        s._bound.apply("ADDED", of(f"b-{n}", "b", 0, node=n, gpu=1))
    # a holds 2 of 5: each 3-GPU pod fits the limit beside that, not both (each evicts 1, takes 3)
    s._pending.apply("ADDED", of("p1", "a", 100, gpus=3))
    s._pending.apply("ADDED", of("p2", "a", 100, gpus=3))
    await batch(s)
    assert len(api.evicted) == 1, api.evicted
    assert s.cache.tenant_usage(s.tenants, terminating=True)["a"] <= 5000


async def test_the_autoscaling_demand_counts_pods_held_back_by_a_limit_as_a_batch_would() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    s._bound.apply("ADDED", of("run", "a", node="n0", gpu=0))
    for i in range(4):
        s._pending.apply("ADDED", of(f"p{i}", "a"))
    await batch(s)
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == ["gpusched_unschedulable_gpu_demand 1.0"]


async def test_a_pod_at_its_limit_with_nothing_below_it_is_no_preemption_attempt() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    s._bound.apply("ADDED", of("run", "a", 5, node="n0", gpu=0))
    s._pending.apply("ADDED", of("same", "a", 5))
    for _ in range(3):
        await batch(s)
        s.queue.move_all()
    assert gauge(s, "gpusched_preemption_attempts_total") == ["gpusched_preemption_attempts_total 0.0"]


async def test_a_gang_within_its_quota_reclaims_for_all_its_members() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"b": {"quotaGpus": 2}})
    s._bound.apply("ADDED", of("a-hi", "a", 500, node="n0", gpu=0))
    s._bound.apply("ADDED", of("a-lo", "a", 100, node="n0", gpu=1))
    for i in range(2):
        s._pending.apply("ADDED", member(f"m{i}", "b", 0))
    await batch(s)
    assert sorted(api.evicted) == ["a/a-hi", "a/a-lo"], "a borrows both GPUs: both come back, for the whole gang"
    for i in range(2):
        (message,) = api.failed(f"b/m{i}")
        assert "Reclaiming the GPUs of 2 pod(s) on node(s) n0 from tenant(s) a, past their quota" in message
        assert s.cache.nomination(f"b/m{i}") is not None
    assert gauge(s, "gpusched_reclaim_attempts_total") == ["gpusched_reclaim_attempts_total 2.0"]
    assert gauge(s, "gpusched_reclaim_victims_total") == ["gpusched_reclaim_victims_total 2.0"]


async def test_a_gang_past_its_quota_does_not_reclaim_and_may_still_preempt_within_its_tenant() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    s._bound.apply("ADDED", of("a0", "a", 0, node="n0", gpu=0))
    s._bound.apply("ADDED", of("b-low", "b", 0, node="n0", gpu=1))
    for i in range(2):
        s._pending.apply("ADDED", member(f"m{i}", "b", 100))
    await batch(s)
    assert api.evicted == [], "2 GPUs for b, quota 1: no reclaim; b's own pod frees one GPU only"
    (message,) = api.failed("b/m0")
    assert message.startswith("gang b/job: its 2 members do not all fit at once"), message


async def test_reclaim_attempts_count_only_the_pods_that_looked() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=3)
    tenants(s, quotas={"b": {"quotaGpus": 2}})
    for g in range(3):
        s._bound.apply("ADDED", of(f"a{g}", "a", 0, node="n0", gpu=g))  # a borrows all 3
    s._pending.apply("ADDED", of("p", "b", 0))
    for i in range(2):
        s._pending.apply("ADDED", member(f"m{i}", "b", 0))
    await batch(s)
    # p reclaims 1 GPU; the gang (2 more) would take b past its quota of 2: it does not look.
    assert len(api.evicted) == 1, api.evicted
    assert gauge(s, "gpusched_reclaim_attempts_total") == ["gpusched_reclaim_attempts_total 1.0"]


async def test_a_gang_at_its_tenants_limit_preempts_lower_pods_of_its_tenant_taking_only_their_room() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=4)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    s._bound.apply("ADDED", of("a-low0", "a", 0, node="n0", gpu=0))
    s._bound.apply("ADDED", of("a-low1", "a", 0, node="n0", gpu=1))
    for i in range(2):
        s._pending.apply("ADDED", member(f"m{i}", "a", 100))
    await batch(s)
    # Two GPUs are free, but a is at its limit of 2: the gang takes the room of a's two pods.
    assert sorted(api.evicted) == ["a/a-low0", "a/a-low1"]
    for i in range(2):
        (message,) = api.failed(f"a/m{i}")
        assert message.startswith("tenant a is at its GPU limit"), message
        assert "Preempting 2 pod(s) of lower priority on node(s) n0 to make room for the whole gang." in message
    rooms = [s.cache.nomination(f"a/m{i}") for i in range(2)]
    assert sorted(g for room in rooms if room is not None for g in room[1]) == [0, 1], "only its victims' GPUs"


def mig(name: str, ns: str, priority: int, node: str = "") -> dict[str, Any]:
    obj = of(name, ns, priority, gpus=0, node=node)
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"
    return obj


async def test_a_mig_pod_at_its_tenants_limit_preempts_a_lower_one_of_its_tenant_for_its_instance() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=0)
    node = kit.node("m", 0, "NVIDIA-A100-SXM4-80GB")
    for st in ("allocatable", "capacity"):
        node["status"][st]["nvidia.com/mig-1g.10gb"] = "3"
    NodeHandler(s).apply("ADDED", node)
    tenants(s, quotas={"a": {"limitGpus": 0.2}})  # one 1g seventh (0.143 GPU) fits, two do not
    s._bound.apply("ADDED", mig("a-low", "a", 0, node="m"))
    s._bound.apply("ADDED", mig("b-lower", "b", -10, node="m"))
    s._pending.apply("ADDED", mig("urgent", "a", 100))
    await batch(s)
    assert api.evicted == ["a/a-low"], "its own tenant's pod, not b's lower one, nor a free instance"
    assert s.cache.nomination("a/urgent") is not None
    assert not api.bound, "it waits for its victim's instance"


async def test_a_limited_tenants_pod_whose_held_room_stopped_fitting_is_placed_elsewhere_once_its_victim_left() -> None:
    # Tenant a (limit 2 GPUs) preempts 'low' on n0; n0 is then tainted (a drain) as 'low' leaves,
    # and n1 frees up.  The room on n0 can no longer take 'urgent': it must not wait there forever.
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 2}})
    low = of("low", "a", 0, node="n0", gpu=0)
    other = of("b1", "b", 50, node="n1", gpu=0)
    s._bound.apply("ADDED", low)
    s._bound.apply("ADDED", other)
    s._pending.apply("ADDED", of("urgent", "a", 100))
    await batch(s)
    assert api.evicted == ["a/low"]
    n0 = kit.node("n0", 1, "A100")
    n0["spec"] = {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("MODIFIED", n0)
    s._bound.apply("DELETED", low)
    s._bound.apply("DELETED", other)
    await batch(s)
    assert api.bound == ["a/urgent"], api.failed("a/urgent")
    assert s.cache.placement("a/urgent") == ("n1", (0,))
    assert s.cache.nomination("a/urgent") is None


async def test_a_limited_tenants_gang_with_a_recreated_member_is_placed_once_its_victims_left() -> None:
    # A gang of 2 preempts one pod for each member; its controller recreates m1 (new UID, no
    # room) while the victims leave.  Once they are gone the gang is placed whole, and no
    # member is told that fewer members than it has are pending.
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 4}})
    victims = [of("low0", "a", 0, node="n0", gpu=0), of("low1", "a", 0, node="n1", gpu=0)]
    for v in victims:
        s._bound.apply("ADDED", v)
    for m in ("m1", "m2"):
        s._pending.apply("ADDED", member(m, "a", 50))
    await batch(s)
    assert sorted(api.evicted) == ["a/low0", "a/low1"]
    s._pending.apply("DELETED", member("m1", "a", 50))
    again = member("m1", "a", 50)
    again["metadata"]["uid"] = "m1-second"
    s._pending.apply("ADDED", again)
    for v in victims:
        s._bound.apply("DELETED", v)
    await batch(s)
    assert sorted(api.bound) == ["a/m1", "a/m2"], (api.failed("a/m1"), api.failed("a/m2"))
    assert s.cache.tenant_usage(s.tenants) == {"a": 2000}


async def test_a_limit_set_while_a_batch_is_solved_counts_what_the_tenant_already_holds(monkeypatch: Any) -> None:
    from tests.test_daemon_batches import _HeldSolve

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=6)
    for i in range(2):
        s._bound.apply("ADDED", of(f"running{i}", "a", node="n0", gpu=i))
    for i in range(4):
        s._pending.apply("ADDED", of(f"new{i}", "a"))
    held = _HeldSolve(monkeypatch)
    batch_ = await s.queue.next_batch()
    await held.during(s, batch_, lambda: tenants(s, quotas={"a": {"limitGpus": 3}}))
    await settle(s)
    assert len(api.bound) == 1, api.bound  # 2 held + 1: the limit, not 2 + 3
    assert s.cache.tenant_usage(s.tenants) == {"a": 3000}


async def test_a_disruption_budget_a_reclaim_spent_is_spent_for_the_preemption_of_the_same_batch() -> None:
    # One batch, two passes: b1 (within b's quota) reclaims a web pod a borrowed; a-urgent then
    # preempts in its own tenant.  The budget allows one web pod to go: the second pass must
    # take the pod it does not cover, although a web pod is of lower priority.
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    for n in ("n1", "n2"):
        NodeHandler(s).apply("ADDED", kit.node(n, 1, "A100"))
    tenants(s, quotas={"b": {"quotaGpus": 1}}, reclaimBelowPriority=50)
    for name, node, prio in (("web-0", "n0", 0), ("other", "n1", 60), ("web-1", "n2", 0)):
        obj = of(name, "a", prio, node=node)
        if name.startswith("web"):
            obj["metadata"]["labels"]["app"] = "web"
        s._bound.apply("ADDED", obj)
    web_budget(s, "a")
    s._pending.apply("ADDED", of("b1", "b", 0))
    s._pending.apply("ADDED", of("a-urgent", "a", 100))
    await batch(s)
    assert len(api.why) == 1, api.why  # one reclaim
    assert sorted(v.removesuffix("-0").removesuffix("-1") for v in api.evicted) == ["a/other", "a/web"], api.evicted


async def test_room_reclaimed_for_one_tenant_is_not_taken_over_by_another_of_higher_priority() -> None:
    """Priority does not decide between tenants: b reclaimed its quota from a, and a pod of a of
    higher priority does not take b's room (b would only reclaim it again)."""
    from tests.test_daemon_utilisation import EvictingApi, batch

    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"b": {"quotaGpus": 1}})
    s._bound.apply("ADDED", of("a-lo", "a", 0, node="n0", gpu=0))  # a borrows (quota 0)
    s._pending.apply("ADDED", of("b1", "b", 0))
    await batch(s)
    assert api.evicted == ["a/a-lo"]
    held = s.cache.nomination("b/b1")
    assert held is not None
    s._pending.apply("ADDED", of("a-hi", "a", 1000))
    await batch(s)
    assert s.cache.nomination("b/b1") == held
    assert s.cache.nomination("a/a-hi") is None


async def test_a_pod_takes_over_no_room_that_would_take_its_tenant_past_its_limit() -> None:
    """low (1 GPU) preempted v (2 GPUs); while v leaves, p1 is placed on a new node, and p2, of
    higher priority than low and twice its size, would fit in low's room: taking it would take
    a to 4 GPUs of its 3."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("n1", 2, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 3}})
    v = of("v", "a", 0, node="n0", gpu=0, gpus=2)
    s._bound.apply("ADDED", v)
    s._bound.apply("ADDED", of("bb", "b", 20, node="n1", gpu=0, gpus=2))
    await _preempts(s, api, of("low", "a", 10), v)
    NodeHandler(s).apply("ADDED", kit.node("n2", 2, "A100"))
    s._pending.apply("ADDED", of("p1", "a", 100, gpus=2))
    s._pending.apply("ADDED", of("p2", "a", 50, gpus=2))
    await batch(s)
    assert api.bound == ["a/p1"]
    assert s.cache.nomination("a/p2") is None
    assert s.cache.nomination("a/low") == ("n0", (0,), 1)
    assert api.evicted == ["a/v"]
    assert s.cache.tenant_usage(s.tenants, terminating=True)["a"] <= 3000


async def test_room_reclaimed_within_quota_is_not_taken_over_past_it() -> None:
    """l, within a's quota of 1 GPU, reclaimed the 2 GPUs of b1 from b, which borrowed them.
    p, of a and of higher priority, would fit in l's room: taken over, a would hold 2 GPUs
    reclaimed for its quota of 1, and b would have lost one to a's borrowing."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    tenants(s, quotas={"a": {"quotaGpus": 1}, "b": {"quotaGpus": 1}})
    b1 = of("b1", "b", 0, node="n0", gpu=0, gpus=2)
    s._bound.apply("ADDED", b1)
    s._bound.apply("ADDED", of("b2", "b", 5, node="n1", gpu=0))
    s._pending.apply("ADDED", of("l", "a", 0))
    await batch(s)
    assert api.evicted == ["b/b1"]
    held = s.cache.nomination("a/l")
    assert held is not None
    assert held[0] == "n0"
    b1["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", b1)
    s._pending.apply("ADDED", of("p", "a", 100, gpus=2))
    await batch(s)
    assert s.cache.nomination("a/p") is None
    assert s.cache.nomination("a/l") == held
    assert api.failed("a/p") == ["0/2 nodes are available: 2 Insufficient nvidia.com/gpu."]
    assert s.cache.tenant_usage(s.tenants)["a"] == 1000


async def test_a_pod_at_its_tenants_limit_takes_over_the_room_of_a_lower_pod_of_its_tenant() -> None:
    """mid, at a's limit of 1 GPU, preempted low; while low leaves, high (at the limit too)
    comes. Nothing of a runs below it, but mid's room is there to take over: high takes it,
    evicting no one more, rather than wait for mid to be bound and then evict it."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"a": {"limitGpus": 1}})
    low = of("low", "a", 0, node="n0", gpu=0)
    s._bound.apply("ADDED", low)
    await _preempts(s, api, of("mid", "a", 10), low)
    s._pending.apply("ADDED", of("high", "a", 100))
    await batch(s)
    assert s.cache.nomination("a/high") == ("n0", (0,), 1)
    assert s.cache.nomination("a/mid") is None
    assert api.failed("a/high")[-1] == (
        "tenant a is at its GPU limit: it holds 1 of 1 GPUs and this pod asks for 1 more. "
        "Taking the room held on node n0 for pod a/mid of lower priority, whose 1 preempted pod(s) are leaving."
    )
    assert "taken by pod a/high, of higher priority (100 > 10)" in api.failed("a/mid")[-1]
    s._bound.apply("DELETED", low)
    for _ in range(3):
        if s.queue.counts().active:
            await batch(s)
    assert api.bound == ["a/high"]
    assert api.evicted == ["a/low"]
    assert api.failed("a/mid")[-1] == "tenant a is at its GPU limit: it holds 1 of 1 GPUs and this pod asks for 1 more."


async def test_a_pod_at_its_tenants_limit_takes_over_no_room_smaller_than_itself() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"a": {"limitGpus": 2}})
    low = of("low", "a", 0, node="n0", gpu=0)
    s._bound.apply("ADDED", low)
    s._bound.apply("ADDED", of("other", "a", 200, node="n0", gpu=1))
    await _preempts(s, api, of("mid", "a", 10), low)
    s._pending.apply("ADDED", of("high", "a", 100, gpus=2))  # 2 GPUs for mid's 1: a would hold 4 of 2
    await batch(s)
    assert s.cache.nomination("a/high") is None
    assert s.cache.nomination("a/mid") == ("n0", (0,), 1)
    assert api.failed("a/high")[-1] == (
        "tenant a is at its GPU limit: it holds 2 of 2 GPUs and this pod asks for 2 more."
    )


async def test_a_pod_whose_room_is_ready_is_drawn_as_within_its_tenants_limit() -> None:
    """mid, at a's limit of 1 GPU, preempted low, which is gone: the room held for it counts in
    what a holds, and drawing mid takes a no further. Counted twice, a was ranked past its limit
    and mid drawn after b's pod, which fits nowhere."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 2, "A100"))
    s.set_config(parse_config({"batching": {"maxSize": 1}, "tenants": {"quotas": {"a": {"limitGpus": 1}}}}))
    low = of("low", "a", 0, node="n0", gpu=0)
    s._bound.apply("ADDED", low)
    s._bound.apply("ADDED", of("bb", "b", 0, node="n1", gpu=0, gpus=2))
    s._pending.apply("ADDED", of("mid", "a", 10))
    await batch(s)
    assert api.evicted == ["a/low"]
    s._pending.apply("ADDED", of("bp", "b", 0))
    s._bound.apply("DELETED", low)  # mid's room is ready; both are drawn again
    await batch(s)
    assert api.bound == ["a/mid"]


async def test_room_held_for_a_tenant_past_its_quota_is_reclaimed_by_one_within_its_own() -> None:
    """bhigh preempted blow, both of b, which borrows every GPU it holds. While blow leaves, a1
    comes, within a's quota: it reclaims bhigh's room, evicting no one more. Held for bhigh,
    that room was out of reach of the reclaim: a1 waited, and once bhigh was bound reclaimed it."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    tenants(s, quotas={"a": {"quotaGpus": 1}})
    blow = of("blow", "b", 0, node="n0", gpu=0)
    s._bound.apply("ADDED", blow)
    await _preempts(s, api, of("bhigh", "b", 100), blow)
    s._pending.apply("ADDED", of("a1", "a", 0))
    await batch(s)
    assert api.evicted == ["b/blow"]
    assert s.cache.nomination("a/a1") == ("n0", (0,), 1)
    assert s.cache.nomination("b/bhigh") is None
    assert api.failed("a/a1")[-1] == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. Reclaiming the room held on node n0 for pod "
        "b/bhigh of tenant b, past its quota: tenant a is within its own."
    )
    assert api.failed("b/bhigh")[-1] == (
        "The room held for it on node n0 was reclaimed for pod a/a1 of tenant a, within its quota: "
        "tenant b is past its own; it looks again."
    )
    s._bound.apply("DELETED", blow)
    for _ in range(3):
        if s.queue.counts().active:
            await batch(s)
    assert api.bound == ["a/a1"]
    assert api.evicted == ["b/blow"]


async def test_a_pod_at_its_limit_takes_over_no_room_that_the_pods_admitted_beside_it_fill() -> None:
    """Limit 4; the tenant holds 2 (r running, L's room while v leaves). A (2 GPUs) is admitted
    and B (3 GPUs) is held back: B taking over L's room would add 2 more, past the limit once A
    is bound too."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=4)
    NodeHandler(s).apply("ADDED", kit.node("n1", 3, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 4}})
    v = of("v", "a", 0, node="n0", gpu=0)
    x = of("x", "c", 100, node="n0", gpu=1, gpus=3)
    y = of("y", "c", 100, node="n1", gpu=1, gpus=2)
    for o in (v, x, y, of("r", "a", 100, node="n1", gpu=0)):
        s._bound.apply("ADDED", o)
    await _preempts(s, api, of("L", "a", 10), v)
    s._bound.apply("DELETED", x)
    s._bound.apply("DELETED", y)
    s._pending.apply("ADDED", of("B", "a", 50, gpus=3))
    s._pending.apply("ADDED", of("A", "a", 5, gpus=2))
    for _ in range(2):
        if s.queue.counts().active:
            await batch(s)
    assert s.cache.tenant_usage(s.tenants, terminating=True)["a"] <= 4000
    assert s.cache.nomination("a/B") is None


async def test_a_room_taken_over_counts_toward_the_limit_for_the_pods_of_its_batch() -> None:
    """Limit 4: a runs A (1 GPU) and room is held for L (2 GPUs) while its victim leaves: 3.
    H (2 GPUs, above L) is held back by the limit and takes L's room over; Q1 and Q2 (1 GPU
    each) came in the same batch.  H's room is a's all the same: one of them more, not both."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=3)
    NodeHandler(s).apply("ADDED", kit.node("n1", 2, "A100"))
    tenants(s, quotas={"a": {"limitGpus": 4}})
    v = of("v", "a", 0, node="n0", gpu=1, gpus=2)
    w = of("w", "c", 100, node="n1", gpu=0, gpus=2)  # n1 is full until L has preempted
    for o in (of("A", "a", 100, node="n0", gpu=0), v, w):
        s._bound.apply("ADDED", o)
    await _preempts(s, api, of("L", "a", 10, gpus=2), v)
    s._bound.apply("DELETED", w)
    for o in (of("H", "a", 100, gpus=2), of("Q1", "a", 5), of("Q2", "a", 5)):
        s._pending.apply("ADDED", o)
    await batch(s)
    assert s.cache.nomination("a/H") == ("n0", (1, 2), 1)
    assert len([k for k in api.bound if k in ("a/Q1", "a/Q2")]) == 1
    assert s.cache.tenant_usage(s.tenants, terminating=True)["a"] <= 4000


def _unreachable(name: str) -> dict[str, Any]:
    node = kit.node(name, 1, "A100")
    node["spec"] = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}
    return node


async def test_a_limited_tenants_preemptor_whose_victim_is_stuck_on_an_unreachable_node_preempts_elsewhere() -> None:
    # Its victim's node becomes unreachable: the victim may never leave, and the node takes
    # nothing new anyway.  The room there is given up and the pod preempts elsewhere.
    api = _Api()
    s = _two_nodes(api, (0, 1))
    s.set_config(parse_config({"tenants": {"quotas": {"default": {"limitGpus": 2}}}}))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == [("default/low-0", "default/urgent", "n0")]
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))
    NodeHandler(s).apply("MODIFIED", _unreachable("n0"))
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted[-1] == ("default/low-1", "default/urgent", "n1")
    assert s.cache.nomination("default/urgent") == ("n1", (0,), 1)


async def test_a_limited_tenants_gang_whose_victim_is_stuck_on_an_unreachable_node_gives_its_room_up() -> None:
    api = _Api()
    s = _two_nodes(api)
    s.set_config(parse_config({"tenants": {"quotas": {"default": {"limitGpus": 4}}}}))
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert sorted(v for v, _, _ in api.evicted) == ["default/low-0", "default/low-1"]
    for i in (0, 1):
        s._bound.apply("MODIFIED", _leaving(f"low-{i}", 0, f"n{i}"))
    NodeHandler(s).apply("MODIFIED", _unreachable("n0"))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert s.cache.nomination("default/m1") is None
    assert s.cache.nomination("default/m2") is None
    assert api.nominated == {"default/m1": None, "default/m2": None}


def min_member(name: str, ns: str, minimum: int, **kw: Any) -> dict[str, Any]:
    """A pending one-GPU member of gang ``job`` of at least ``minimum`` members."""
    obj = of(name, ns, **kw)
    obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "job"
    obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = str(minimum)
    return obj


async def test_a_gang_whose_minimum_fits_its_tenants_limit_starts_and_its_extras_stay_within_it() -> None:
    """A gang of 4 one-GPU members, minimum 2, tenant limit 3: it starts with its minimum and
    one member beyond it; the last waits at the limit (not that the gang passes the limit)."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    tenants(s, quotas={"a": {"limitGpus": 3}})
    for i in range(4):
        s._pending.apply("ADDED", min_member(f"m{i}", "a", 2))
    await batch(s)
    await settle(s)
    assert len(api.bound) == 3
    [left] = {f"a/m{i}" for i in range(4)} - set(api.bound)
    await batch(s)
    await settle(s)
    assert len(api.bound) == 3  # the limit is never passed
    assert api.failed(left) == [
        "tenant a is at its GPU limit: it holds 3 of 3 GPUs and this gang's pending member asks for 1 more."
    ]
    assert s.tenant_usage() == {"a": 3000}


async def test_a_gang_whose_minimum_fits_its_quota_is_placed_in_the_quota_first_pass() -> None:
    """2 idle GPUs; tenant a (no quota) asks for 2 at a higher priority, tenant b (quota 2) runs
    a gang of 3 one-GPU members, minimum 2: its minimum is within b's quota, and goes first (as
    between tenants quota decides, not priority)."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    tenants(s, quotas={"b": {"quotaGpus": 2}})
    s._pending.apply("ADDED", of("big", "a", 100, gpus=2))
    for i in range(3):
        s._pending.apply("ADDED", min_member(f"m{i}", "b", 2))
    await batch(s)
    await settle(s)
    assert sorted(api.bound) == ["b/m0", "b/m1"]
    assert api.failed("a/big")


async def test_a_gang_beyond_its_quota_but_whose_minimum_is_within_places_its_extras_beside_it() -> None:
    """4 idle GPUs; b (quota 2) runs a gang of 3, minimum 2, and a (no quota) a one-GPU pod: the
    minimum goes first, and the extra, over quota, is placed beside it in the later pass."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    tenants(s, quotas={"b": {"quotaGpus": 2}})
    s._pending.apply("ADDED", of("small", "a"))
    for i in range(3):
        s._pending.apply("ADDED", min_member(f"m{i}", "b", 2))
    await batch(s)
    await settle(s)
    assert sorted(api.bound) == ["a/small", "b/m0", "b/m1", "b/m2"]


async def test_a_gang_whose_minimum_fits_its_quota_reclaims_for_its_minimum_only() -> None:
    """a borrows all 3 GPUs (quota 0); b (quota 2) runs a gang of 3, minimum 2: b reclaims 2
    GPUs for the minimum, not the third: that would take b past its quota."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=3)
    tenants(s, quotas={"b": {"quotaGpus": 2}})
    for g in range(3):
        s._bound.apply("ADDED", of(f"a{g}", "a", 100 * g, node="n0", gpu=g))
    for i in range(3):
        s._pending.apply("ADDED", min_member(f"m{i}", "b", 2))
    await batch(s)
    assert sorted(api.evicted) == ["a/a0", "a/a1"], "the two of lowest priority, for the minimum"
    held = [f"b/m{i}" for i in range(3) if s.cache.nomination(f"b/m{i}") is not None]
    assert len(held) == 2
    for key in held:
        (message,) = api.failed(key)
        assert "Reclaiming the GPUs of 2 pod(s) on node(s) n0 from tenant(s) a, past their quota" in message
        assert "2 of its 3 pending members, at least its minimum" in message
    [extra] = {f"b/m{i}" for i in range(3)} - set(held)
    (message,) = api.failed(extra)
    assert message.endswith("This member is placed beside them once it fits."), message
