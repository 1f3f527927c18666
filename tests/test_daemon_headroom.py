"""Headroom, the autoscaling signals and the cost report where they meet preemption, gangs,
busy GPUs, MIG slices, taints and pods whose GPUs the books can only guess."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpusched.config import parse_config
from gpusched.daemon import DaemonSettings, Scheduler, preemption
from gpusched.daemon import scheduler as daemon
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder
from gpusched.kube.client import Kube
from gpusched.metrics.cost import Prices, cost_report
from gpusched.metrics.source import UtilisationView
from gpusched.model import Assignment, Cluster, Node, Pod
from tests.doubles import IdleClient, RecordingApi, one_node_scheduler
from tests.e2e import kit
from tests.test_daemon_utilisation import EvictingApi, batch, gauge, kept_for, measured, pod


async def test_a_pod_of_high_priority_is_not_denied_preemption_because_a_low_pod_searched_with_it() -> None:
    # n0: 2 GPUs; 'v' (priority 0) holds GPU 0, GPU 1 is idle and kept (headroom 1 for >= 1000).
    def scheduler(with_low: bool) -> tuple[EvictingApi, Scheduler]:
        api = EvictingApi()
        s = one_node_scheduler(api, gpus=2)
        kept_for(s, 1)
        s._bound.apply("ADDED", pod("v", 0, node="n0", gpu=0))
        s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
        if with_low:
            s._pending.apply("ADDED", pod("mid", 500))
        return api, s

    api, s = scheduler(with_low=False)
    await batch(s)
    assert api.evicted == ["default/v"]
    assert s.cache.nomination("default/critical") is not None  # alone, it preempts 'v' for both GPUs

    api, s = scheduler(with_low=True)
    await batch(s)
    # With a pod of priority 500 in the same batch, the kept GPU is blocked for 'critical' too:
    # 'critical' gets nothing and 'mid' (below the headroom) evicts 'v' instead.
    assert s.cache.nomination("default/critical") is not None, (api.evicted, api.failed("default/critical"))


async def test_low_pods_may_take_idle_gpus_beyond_the_last_headroom_ones() -> None:
    # Docs: "pods below it never take the last `gpus` idle GPUs".  15 idle GPUs, headroom 4:
    # an 8-GPU pod of low priority leaves 7 idle; it should be placed.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)  # n0
    NodeHandler(s).apply("ADDED", kit.node("n1", 8, "A100"))
    kept_for(s, 4)
    s._bound.apply("ADDED", pod("small", 0, node="n0", gpu=3))  # n0: 7 idle, n1: 8 idle
    s._pending.apply("ADDED", pod("big", 0, gpus=8))
    await batch(s)
    assert api.bound == ["default/big"], api.failed("default/big")


async def test_kept_gpus_do_not_flip_between_batches_and_split_both_nodes() -> None:
    # Two idle 8-GPU nodes, headroom 4.  One 1-GPU pod of low priority, then an 8-GPU one:
    # without headroom both fit (the small one packs beside the other on one node).
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    NodeHandler(s).apply("ADDED", kit.node("n1", 8, "A100"))
    kept_for(s, 4)
    s._pending.apply("ADDED", pod("small", 0))
    await batch(s)
    assert api.bound == ["default/small"]
    first = s.cache.placement("default/small")
    s._pending.apply("ADDED", pod("big", 0, gpus=8))
    await batch(s)
    assert api.bound == ["default/small", "default/big"], (first, api.failed("default/big"))


async def test_kept_gauge_does_not_count_busy_gpus_the_batch_cannot_keep() -> None:
    from tests.test_daemon_utilisation import measured

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    kept_for(s, 2)
    measured(s, {"n0": {0: 99.0, 1: 99.0}})  # both idle by the books, both busy (outside use)
    s._pending.apply("ADDED", pod("low", 0))
    await batch(s)
    assert api.failed("default/low")  # no GPU was kept: both were busy
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_kept_free") == 0.0


async def test_idle_node_signal_does_not_offer_the_headroom_to_the_autoscaler() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    NodeHandler(s).apply("ADDED", kit.node("n1", 8, "A100"))
    s.set_config(parse_config({"headroom": {"gpus": 8, "priorityAtLeast": 1000}}))
    s._bound.apply("ADDED", pod("running", 0, node="n0"))
    s.gauges.refresh()
    # n1's 8 GPUs are the headroom: an autoscaler told 'n1 is idle, remove it' removes the headroom.
    assert gauge(s, "gpusched_gpus_kept_free") == 8.0
    assert gauge(s, "gpusched_gpu_nodes_idle") == 0.0


def mig_node(name: str, whole: int) -> dict[str, Any]:
    obj = kit.node(name, whole, "A100")
    for key in ("capacity", "allocatable"):
        obj["status"][key]["nvidia.com/mig-1g.10gb"] = "7"
    return obj


async def test_a_node_whose_mig_slices_are_in_use_is_not_reported_idle() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", mig_node("m", 1))  # one whole GPU, one GPU in MIG mode
    s._bound.apply("ADDED", pod("busy", 0, node="n0"))
    sliced = pod("sliced", 0, gpus=0, node="m")
    sliced["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"
    s._bound.apply("ADDED", sliced)
    assert s.cache.holds("default/sliced", "uid-sliced")
    s.gauges.refresh()
    # 'm' runs a pod on a MIG slice: an autoscaler must not be told it can remove it.
    assert gauge(s, "gpusched_gpu_nodes_idle") == 0.0


def test_the_cost_report_never_holds_more_than_the_cluster_costs() -> None:
    from gpusched.metrics.cost import Prices, cost_report
    from gpusched.model import Assignment, Cluster, Node, Pod

    mig = Node("m", 64000, 65536, gpu_count=0, gpu_model="A100", mig_slices=(("3g.40gb", 2),))
    slices = [Assignment(Pod(f"s{i}", 100, 100, mig_profile="3g.40gb", namespace="infer"), 0, ()) for i in range(2)]
    r = cost_report(Cluster([mig]), slices, Prices({"A100": 3.0}))
    assert r.per_hour_held <= r.per_hour_total, (r.gpus_total, r.per_hour_total, r.gpus_held, r.per_hour_held)


async def test_a_pod_waiting_for_its_victims_is_no_demand_for_new_nodes() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", pod("low", 0, node="n0"))
    s._pending.apply("ADDED", pod("urgent", 100))
    await batch(s)
    assert api.evicted == ["default/low"]
    assert s.cache.nomination("default/urgent") is not None  # room held on n0, its victim leaving
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 0.0


async def test_no_churn_low_pod_evicts_then_is_evicted_by_the_high_pod_it_beat() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    kept_for(s, 1)
    v = pod("v", 0, node="n0", gpu=0)
    s._bound.apply("ADDED", v)
    s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
    s._pending.apply("ADDED", pod("mid", 500))
    await batch(s)
    s._bound.apply("DELETED", v)  # the victim leaves
    s.queue.move_all()
    for _ in range(3):
        if not s.queue.counts().active:
            break
        await batch(s)
    # 'mid' got GPU 0, and then 'critical' evicted it: two evictions where one ('v') would do.
    assert api.evicted == ["default/v"], api.evicted


async def test_the_headroom_is_not_kept_on_a_node_the_pods_it_is_for_cannot_use() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)  # n0: the only node a plain pod may use
    dedicated = kit.node("a-dedicated", 1, "A100")
    dedicated["spec"] = {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("ADDED", dedicated)
    kept_for(s, 1)
    s._pending.apply("ADDED", pod("low", 0))
    await batch(s)
    s._pending.apply("ADDED", pod("critical", 1000))
    await batch(s)
    # The GPU 'kept' was on a node 'critical' may not use; 'low' took the only one it could.
    assert api.bound == ["default/critical"], (api.bound, api.failed("default/critical"))


def test_a_pod_whose_gpu_is_not_known_is_not_reported_idle_by_a_guess() -> None:
    import time

    from gpusched.kube.convert import node_record, pod_record
    from gpusched.metrics.cost import Prices, cost_report
    from gpusched.metrics.source import UtilisationView
    from gpusched.state.cache import Cache

    cache = Cache()
    cache.replace_nodes([node_record(kit.node("n0", 2, "A100"))])
    other = kit.pod("trainer", "default-scheduler", gpus=1, node_name="n0")  # no gpusched.io/gpu-indices
    other["metadata"].update({"namespace": "research", "uid": "u1"})
    cache.replace_pods([pod_record(other)])
    view = UtilisationView(time.monotonic(), {"n0": {0: 0.0, 1: 100.0}})  # one GPU idle, one saturated
    assert cache.guessed_gpus() == {"research/trainer"}
    r = cost_report(cache.snapshot().cluster, cache.placed(), Prices(), view, guessed=cache.guessed_gpus())
    (ns,) = r.namespaces
    # Which of the two GPUs 'trainer' has is not known; the report says it is idle by a guess (GPU 0).
    assert ns.idle_gpus == 0.0, cache.placed()[0].gpus


def test_a_bad_price_list_is_refused_naming_the_key() -> None:
    import pytest

    from gpusched.metrics.cost import parse_prices

    for bad in ({"gpuHour": []}, {"gpuHour": 0}, {"gpuHour": False}):  # taken as "no prices listed"
        with pytest.raises(ValueError, match="gpuHour"):
            parse_prices(bad)


def test_an_infinite_price_is_refused() -> None:
    import math

    import pytest

    from gpusched.metrics.cost import parse_prices

    with pytest.raises(ValueError, match="default"):  # else --json prints "Infinity": not JSON
        parse_prices({"default": math.inf})


async def test_a_member_of_high_priority_kept_out_by_its_gang_is_told_of_the_headroom() -> None:
    from tests.doubles import member_pod

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    kept_for(s, 1)
    hi, lo = member_pod("hi", gang="g"), member_pod("lo", gang="g")
    hi["spec"]["priority"], lo["spec"]["priority"] = 1000, 0
    s._pending.apply("ADDED", hi)
    s._pending.apply("ADDED", lo)
    await batch(s)
    assert api.bound == []
    (low,) = api.failed("default/lo")
    (high,) = api.failed("default/hi")
    assert "headroom" in low
    assert "headroom" in high, high  # 2 idle GPUs, told only "insufficient"


async def test_a_gang_with_a_member_below_the_priority_gets_no_kept_gpu_for_the_members_left_out() -> None:
    """A gang of at least 2: a launcher of priority 0 and three workers of 1,000,000.  The solve
    places its minimum (the launcher and a worker) on the two GPUs not kept; the workers left out
    are of high priority, but their gang is not: the two kept GPUs stay free."""
    from tests.doubles import member_pod

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    kept_for(s, 2)
    launcher = member_pod("launcher", gang="g")
    launcher["spec"]["priority"] = 0
    s._pending.apply("ADDED", launcher)
    for i in range(3):
        worker = member_pod(f"worker{i}", gang="g")
        worker["spec"]["priority"] = 1_000_000
        s._pending.apply("ADDED", worker)
    await batch(s)
    assert "default/launcher" in api.bound
    assert len(api.bound) == 2, api.bound


async def test_the_quick_start_is_not_undone_by_a_full_solve_on_the_kept_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpusched.daemon import scheduler as daemon

    calls: list[bool] = []
    real = daemon._solve

    def spy(policy: Any, pods: Any, state: Any, typical: Any, quick: bool, *rest: Any) -> Any:
        calls.append(quick)
        return real(policy, pods, state, typical, quick, *rest)

    monkeypatch.setattr(daemon, "_solve", spy)
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    kept_for(s, 2)
    s._bound.apply("ADDED", pod("running", 0, gpus=2, node="n0"))
    s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
    s._pending.apply("ADDED", pod("low", 0))
    for i in range(3):  # a burst: more pods wait
        s._pending.apply("ADDED", pod(f"later{i}", 0, gpus=0))
    await s.schedule_batch(await s.queue.next_batch(2, early=2))
    await asyncio.sleep(0)
    assert calls == [True], calls  # quick, and the kept GPUs given to the critical pod in that one solve
    assert "default/critical" in api.bound


def test_pods_over_a_nodes_capacity_are_not_priced_beyond_it() -> None:
    from gpusched.kube.convert import node_record, pod_record
    from gpusched.metrics.cost import Prices, cost_report
    from gpusched.state.cache import Cache

    cache = Cache()
    cache.replace_nodes([node_record(kit.node("n0", 1, "A100"))])  # one GPU left (another failed)
    pods = []
    for i in range(2):  # both were bound while the node had two
        obj = kit.pod(f"p{i}", "default-scheduler", gpus=1, node_name="n0")
        obj["metadata"].update({"namespace": f"ns{i}", "uid": f"u{i}"})
        pods.append(pod_record(obj))
    cache.replace_pods(pods)
    r = cost_report(cache.snapshot().cluster, cache.placed(), Prices())
    assert r.per_hour_held <= r.per_hour_total, (r.gpus_held, r.gpus_total)


async def test_a_pod_refused_as_invalid_is_no_demand_for_new_nodes() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    bad = pod("bad", 0, gpus=2)
    bad["metadata"]["annotations"]["gpusched.io/gpu-milli"] = "half"  # a typo: no node can fix it
    s._pending.apply("ADDED", bad)
    await batch(s)
    assert api.reasons("default/bad") == ["FailedScheduling"]
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 0.0


# The gauges after a batch read the kept GPUs by node name: the node list may have changed since.
@pytest.mark.parametrize("joining", ["z-new", "a-new"])  # after n0 in the books' order, or before it
async def test_a_node_added_during_a_solve_leaves_the_plan_as_good(
    monkeypatch: pytest.MonkeyPatch, joining: str
) -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)  # n0
    kept_for(s, 8)
    s._bound.apply("ADDED", pod("running", 0, node="n0", gpu=0))  # n0: 7 idle
    real = daemon._solve

    def solve_while_a_node_joins(*args: Any) -> Any:
        out = real(*args)
        NodeHandler(s).apply("ADDED", kit.node(joining, 8, "A100"))  # the autoscaler's node shows up
        return out

    monkeypatch.setattr(daemon, "_solve", solve_while_a_node_joins)
    s._pending.apply("ADDED", pod("critical", 1000))  # only pods of high priority: nothing kept in the batch
    await batch(s)  # once an IndexError in the gauges, ending the schedule loop
    assert api.bound == ["default/critical"]  # the plan holds on the nodes as they are now
    assert [m for _, r, m in api.events if r == "Scheduled"] == [
        "Successfully assigned default/critical to n0 (GPUs 1)"
    ]


# Every GPU node tainted nvidia.com/gpu:NoSchedule (GKE's default) -> nothing is ever kept.
def tolerating(obj: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return obj


async def test_headroom_works_on_gpu_nodes_tainted_for_gpu_pods() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("DELETED", kit.node("n0", 1, "A100"))
    n = kit.node("g0", 2, "A100")
    n["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("ADDED", n)
    kept_for(s, 1)
    for i in range(2):
        s._pending.apply("ADDED", tolerating(pod(f"low{i}", 0)))
    await batch(s)
    assert len(api.bound) == 1, api.bound  # one GPU kept for the critical pods (which tolerate it too)


# Stickiness kept a split set: an 8-GPU headroom that can no longer host an 8-GPU pod,
#    while a whole idle node was there to keep.
async def test_kept_gpus_stay_one_block_when_one_is_idle() -> None:
    from tests.test_daemon_utilisation import EvictingApi

    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("DELETED", kit.node("n0", 1, "A100"))
    for name in ("a", "b"):
        NodeHandler(s).apply("ADDED", kit.node(name, 8, "A100"))
    kept_for(s, 8)
    s._pending.apply("ADDED", pod("small", 0))
    await batch(s)  # kept: a0-7; small on b
    other = kit.pod("other", "default-scheduler", gpus=1, node_name="a")
    other["metadata"].update({"namespace": "x", "uid": "u-other", "annotations": {"gpusched.io/gpu-indices": "0"}})
    s._bound.apply("ADDED", other)  # a: 7 idle, b: 7 idle
    NodeHandler(s).apply("ADDED", kit.node("c", 8, "A100"))  # c: 8 idle, the only 8-GPU block
    s._pending.apply("ADDED", pod("big", 0, gpus=8))
    await batch(s)  # kept: a1-7 (sticky) + b1; 'big' takes c
    s._pending.apply("ADDED", pod("critical", 1000, gpus=8))
    await batch(s)
    assert api.evicted == []
    assert "default/critical" in api.bound, (api.bound, api.failed("default/critical"))


# Best fit must see CPU: the headroom lands on a node whose CPU is gone.
async def test_kept_gpus_are_on_a_node_a_gpu_pod_can_still_use() -> None:
    from tests.test_daemon_utilisation import EvictingApi

    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("DELETED", kit.node("n0", 1, "A100"))
    for name in ("a", "b"):
        NodeHandler(s).apply("ADDED", kit.node(name, 8, "A100", cpu="64"))
    kept_for(s, 4)
    hog = kit.pod("hog", "default-scheduler", gpus=4, cpu="63", node_name="a")
    hog["metadata"].update({"namespace": "x", "uid": "u-hog", "annotations": {"gpusched.io/gpu-indices": "0,1,2,3"}})
    s._bound.apply("ADDED", hog)  # a: 4 GPUs idle, 1 CPU left
    s._pending.apply("ADDED", pod("big", 0, gpus=8))
    await batch(s)
    crit = pod("critical", 1000, gpus=4)
    crit["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "8"  # 4 GPUs, 8 CPUs
    s._pending.apply("ADDED", crit)
    await batch(s)
    assert api.evicted == []
    assert "default/critical" in api.bound, (api.bound, api.failed("default/critical"))


# A MIG pod on a node that no longer offers slices (device plugin restarting: allocatable 0)
#    is charged while the node is left out of the totals.
def test_mig_pods_on_a_node_that_lost_its_slices_are_not_charged_beyond_the_total() -> None:
    m = Node("m", 64000, 65536, gpu_count=0, gpu_model="A100")
    placed = [Assignment(Pod("s", 100, 100, mig_profile="1g.10gb", namespace="infer"), 0, ())]
    r = cost_report(Cluster([m]), placed, Prices({"A100": 3.0}))
    assert r.per_hour_held <= r.per_hour_total, (r.per_hour_held, r.per_hour_total)


# An 8-GPU A100 node partitioned 4g.40gb (one slice per GPU) costs 8 GPU-hours, not 4.57.
def test_a_mig_node_costs_all_its_gpus() -> None:
    m = Node(
        "m",
        64000,
        65536,
        gpu_count=0,
        gpu_model="A100",
        mig_slices=(("4g.40gb", 8),),
        labels={"nvidia.com/gpu.count": "8"},
    )
    r = cost_report(Cluster([m]), [], Prices({"A100": 3.0}))
    assert r.per_hour_total == pytest.approx(24.0), (r.gpus_total, r.per_hour_total)


# A guessed pod is "idle when every GPU of its node is", checked by counting, not by index.
def test_a_guessed_pod_is_not_idle_while_one_of_its_nodes_gpus_is_saturated() -> None:
    n = Node("n", 64000, 65536, gpu_count=2, gpu_model="A100")
    p = Pod("trainer", 100, 100, num_gpu=1, gpu_milli=1000, namespace="research")
    view = UtilisationView(time.monotonic(), {"n": {0: 100.0, 1: 0.0, 2: 0.0}})  # GPU 2: failed, out of allocatable
    r = cost_report(Cluster([n]), [Assignment(p, 0, (1,))], Prices(), view, guessed={p.key})
    (ns,) = r.namespaces
    assert ns.idle_gpus == 0.0


def _high_search(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[Scheduler], None]) -> tuple[Any, Scheduler]:
    """Headroom of 1 for priority 1000: 'critical' (2 GPUs) and 'mid' (priority 500) must both
    preempt 'v'; ``meanwhile`` runs during the high group's search, before the low group is told."""
    from tests.test_daemon_utilisation import EvictingApi

    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    kept_for(s, 1)
    s._bound.apply("ADDED", pod("v", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
    s._pending.apply("ADDED", pod("mid", 500))
    real = preemption.plan_preemptions

    def search(*args: Any, **kw: Any) -> Any:
        meanwhile(s)
        return real(*args, **kw)

    monkeypatch.setattr(preemption, "plan_preemptions", search)
    return api, s


# The low group told after the high group's search awaited: no "bound meanwhile" guard.
async def test_a_low_pod_bound_during_the_high_search_is_not_told_it_is_unschedulable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def bound_meanwhile(s: Scheduler) -> None:
        bound = pod("mid", 500, node="n0", gpu=1)  # bound meanwhile (e.g. the previous leader's Binding lands)
        s._bound.apply("ADDED", bound)
        s._pending.apply("MODIFIED", bound)

    api, s = _high_search(monkeypatch, bound_meanwhile)
    await batch(s)
    assert s.cache.holds("default/mid", "uid-mid")
    assert api.failed("default/mid") == [], api.failed("default/mid")


async def test_kept_gpus_do_not_stay_on_a_node_whose_cpu_is_gone() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)  # n0: 2 GPUs, 64 CPUs
    NodeHandler(s).apply("ADDED", kit.node("n1", 3, "A100"))
    kept_for(s, 1)
    s._bound.apply("ADDED", pod("a", 0, node="n0", gpu=0))  # n0: 1 idle, n1: 3 idle
    s._pending.apply("ADDED", pod("first", 0))
    await batch(s)
    assert s._kept_last == (("n0", 1),)
    # Another scheduler's CPU-only pod takes the rest of n0's CPU: n0's idle GPU is no use to anyone.
    hog = kit.pod("hog", "default-scheduler", cpu="63", node_name="n0")
    hog["metadata"].update({"namespace": "other", "uid": "u-hog"})
    s._bound.apply("ADDED", hog)
    assert s.cache.snapshot(keep=1, keep_tolerated=["nvidia.com/gpu"]).kept == ((1, 1),)  # n1, without prefer
    s._pending.apply("ADDED", pod("p", 0))
    s._pending.apply("ADDED", pod("q", 0))
    await batch(s)
    s._pending.apply("ADDED", pod("critical", 1000))
    await batch(s)
    assert api.evicted == []
    assert "default/critical" in api.bound, (s._kept_last, api.bound)


async def test_the_idle_gauge_reads_mig_nodes_by_the_rule_the_busy_one_does() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=1)
    NodeHandler(s).apply("ADDED", mig_node("m", 1))  # one whole GPU (books: 0), one in MIG mode
    s._bound.apply("ADDED", pod("train", 0, node="m", gpu=0))
    # nvidia-smi numbers the MIG GPU 0 and the whole one 1: the pod's GPU is saturated.
    measured(s, {"m": {0: 0.0, 1: 100.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_busy") == 0.0  # MIG node: not read for busy (indices differ)
    assert gauge(s, "gpusched_gpus_allocated_idle") == 0.0  # ... but read for idle


async def test_headroom_models_written_as_the_product_name_keep_the_labelled_gpus_or_are_warned_about() -> None:
    from structlog.testing import capture_logs

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)  # n0: A100
    NodeHandler(s).apply("ADDED", kit.node("h0", 2, "NVIDIA-H100-80GB-HBM3"))
    s.set_config(parse_config({"headroom": {"gpus": 2, "priorityAtLeast": 1000, "models": ["H100-80GB-HBM3"]}}))
    for i in range(4):
        s._pending.apply("ADDED", pod(f"low{i}", 0))
    with capture_logs() as logs:
        await batch(s)
    # The two H100s are kept (the name without NVIDIA- names them); the A100s are taken.
    assert sorted(api.bound) == ["default/low0", "default/low1"], api.bound
    assert {s.cache.placement(k)[0] for k in api.bound} == {"n0"}  # type: ignore[index]
    assert not [e for e in logs if e["event"] == "headroom models match no node"]

    s.set_config(parse_config({"headroom": {"gpus": 2, "priorityAtLeast": 1000, "models": ["H100-SXM5-80GB"]}}))
    with capture_logs() as logs:
        for i in range(4, 6):  # a pod more for each batch
            s._pending.apply("ADDED", pod(f"low{i}", 0))
            await batch(s)
    warned = [e for e in logs if e["event"] == "headroom models match no node"]
    assert len(warned) == 1, warned  # once per setting, with what the nodes are
    assert warned[0]["products"] == ["A100", "NVIDIA-H100-80GB-HBM3"]
    assert "gpu.product" in warned[0]["fix"]


async def test_a_headroom_whose_nodes_all_carry_a_taint_it_does_not_tolerate_is_warned_about_once() -> None:
    from structlog.testing import capture_logs

    api = RecordingApi()
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit"), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    tainted = kit.node("t0", 4, "A100")
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("ADDED", tainted)
    s.set_config(parse_config({"headroom": {"gpus": 1, "priorityAtLeast": 1000}}))
    with capture_logs() as logs:
        for i in range(2):  # a batch each: warned once
            s._pending.apply("ADDED", pod(f"low{i}", 0))
            await batch(s)
    warned = [e for e in logs if e["event"].startswith("headroom keeps no GPU")]
    assert len(warned) == 1, warned
    assert (warned[0]["taints"], warned[0]["tolerated"]) == (["dedicated"], ["nvidia.com/gpu"])
    assert "toleratedTaints" in warned[0]["fix"]
    s.set_config(parse_config({"headroom": {"gpus": 1, "priorityAtLeast": 1000, "toleratedTaints": ["dedicated"]}}))
    with capture_logs() as logs:
        s._pending.apply("ADDED", pod("low2", 0))
        await batch(s)
    assert not [e for e in logs if e["event"].startswith("headroom keeps no GPU")]
    # A taint the node lifecycle puts on for a while (a node joining) is no setting to change.
    joining = kit.node("t0", 4, "A100")
    joining["spec"] = {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("MODIFIED", joining)
    s.set_config(parse_config({"headroom": {"gpus": 1, "priorityAtLeast": 1000, "toleratedTaints": []}}))
    with capture_logs() as logs:
        s._pending.apply("ADDED", pod("low3", 0))
        await batch(s)
    assert not [e for e in logs if e["event"].startswith("headroom keeps no GPU")]


async def test_the_demand_gauge_holds_while_a_change_draws_the_waiting_pods_again() -> None:
    # Any change in the cluster draws every parked pod; they wait all the same until a batch
    # tells them again, and an autoscaler must not see the demand drop to 0 meanwhile.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", pod("running", 0, node="n0"))
    s._pending.apply("ADDED", pod("big", 0, gpus=4))
    await batch(s)
    told = pod("big", 0, gpus=4)  # as the watch shows it once the condition is written
    told["status"] = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}]
    }
    s._pending.apply("MODIFIED", told)
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 4.0
    s.queue.move_all()
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 4.0


async def test_a_waiting_a30_slice_is_as_much_gpu_demand_as_its_tenant_counts_it() -> None:
    """An A30 has 4 compute slices, not 7: its 2g.12gb instance is half a GPU, to the autoscaling
    gauge as to the tenant gauge and the cost report."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)  # whole A100s: no node offers the slice
    s.set_config(parse_config({"tenants": {"label": "team"}}))
    obj = pod("slice", 0, gpus=0)
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-2g.12gb"] = "1"
    s._pending.apply("ADDED", obj)
    await batch(s)
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 0.5
    bound = pod("theirs", 0, gpus=0, node="n0")  # the same slice, bound by another scheduler
    bound["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-2g.12gb"] = "1"
    s._bound.apply("ADDED", bound)
    s.gauges.refresh()
    text = s.metrics.render()[0].decode()
    assert 'gpusched_tenant_gpus{tenant="default"} 0.5' in text, text


async def test_a_gang_short_of_its_minimum_is_no_demand_for_new_nodes() -> None:
    from tests.doubles import member_pod

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    lone = member_pod("m0", gang="g")  # one of at least 2: no room would place it alone
    s._pending.apply("ADDED", lone)
    await batch(s)
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 0.0
    s._pending.apply("ADDED", member_pod("m1", gang="g"))
    s._pending.apply("ADDED", member_pod("m2", gang="g"))
    await batch(s)  # three members, one GPU: they wait for a node with room for all
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 3.0


async def test_a_pod_waiting_for_its_volume_is_no_demand_for_new_nodes() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", pod("busy", 0, node="n0", gpu=0))  # no room either: a new node would seem to help
    waits = pod("waits", 0, gpus=1)
    waits["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}]
    s._pending.apply("ADDED", waits)
    s._pending.apply("ADDED", pod("fits-nowhere", 0, gpus=1))
    await batch(s)
    assert api.reasons("default/waits") == ["FailedScheduling"], "told why it waits"
    s.gauges.refresh()
    # Only the pod without a claim asks for a GPU: a new node would not start the other before
    # its claim is bound to a volume.
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 1.0


async def test_a_low_pod_created_again_during_the_high_search_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def created_again(s: Scheduler) -> None:
        s._pending.apply("DELETED", pod("mid", 500))  # a StatefulSet's pod, deleted and created again
        again = pod("mid", 500)
        again["metadata"]["uid"] = "uid-mid-2"
        s._pending.apply("ADDED", again)

    real = preemption.plan_preemptions
    _, s = _high_search(monkeypatch, created_again)
    await batch(s)
    assert s.queue.counts().in_flight == 0, "the old pod's draw was never settled"
    monkeypatch.setattr(preemption, "plan_preemptions", real)
    drawn = await asyncio.wait_for(s.queue.next_batch(), 10)
    assert [(r.key, r.uid) for r in drawn] == [("default/mid", "uid-mid-2")]


async def test_a_pod_of_high_priority_reclaims_with_the_headroom_beside_a_low_pod_of_its_batch() -> None:
    """GPU 0 is kept free for pods of priority 1000; b borrows GPU 1. crit (a, within its quota)
    fits once b0 is reclaimed, with the kept GPU; m (d, within its quota) is below the
    headroom's priority. Searched together, the kept GPU was out of crit's reach: m reclaimed
    b0 and crit waited on."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    s.set_config(
        parse_config(
            {
                "headroom": {"gpus": 1, "priorityAtLeast": 1000},
                "tenants": {"quotas": {"a": {"quotaGpus": 2}, "d": {"quotaGpus": 1}}},
            }
        )
    )
    b0 = pod("b0", 0, node="n0", gpu=1)
    b0["metadata"]["namespace"] = "b"
    s._bound.apply("ADDED", b0)
    crit, m = pod("crit", 1000, gpus=2), pod("m", 0)
    crit["metadata"]["namespace"], m["metadata"]["namespace"] = "a", "d"
    s._pending.apply("ADDED", crit)
    s._pending.apply("ADDED", m)
    await batch(s)
    assert api.evicted == ["b/b0"]
    assert s.cache.nomination("a/crit") == ("n0", (0, 1), 1)
    assert s.cache.nomination("d/m") is None
    assert api.failed("a/crit")[-1].endswith(
        "Reclaiming the GPUs of 1 pod(s) on node n0 from tenant(s) b, past their quota: tenant a is within its own."
    )
    assert api.failed("d/m") == [
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu; "
        "1 idle GPU is kept free for pods of priority 1000 or more (headroom)."
    ]


async def test_a_critical_pod_needing_the_kept_gpus_and_one_more_gets_it_before_a_low_pod_of_its_batch() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)  # two idle GPUs, one kept for priority 1000
    kept_for(s, 1)
    s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
    s._pending.apply("ADDED", pod("low", 0, gpus=1))
    await batch(s)
    # It starts at once, as it would with no headroom: the low pod waits, nobody is evicted.
    assert api.bound == ["default/critical"]
    assert api.evicted == []
    assert api.failed("default/low")


async def test_a_pod_the_solve_deferred_though_it_fits_is_no_demand_for_new_nodes() -> None:
    """A pod the solve kept back for a later batch (its time ran out) fits as things are: its
    PodScheduled=False condition must not read as a call for more nodes."""
    from gpusched.solver.explain import DEFERRED

    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    obj = pod("later", 0, gpus=1)
    s._pending.apply("ADDED", obj)
    record = s.queue.record("default/later")
    assert record is not None
    s.tell_unschedulable(record.pod, "deferred to the next batch", DEFERRED)
    obj["status"] = {  # the watch shows the condition written
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "deferred"}]
    }
    s._pending.apply("MODIFIED", obj)
    s.gauges.refresh()
    assert gauge(s, "gpusched_unschedulable_gpu_demand") == 0.0
