"""The queue and cluster gauges a running scheduler exports follow the cluster between batches.

These drive a real ``Scheduler`` (queue, cache, policy) with watch events as the API server sends
them; only the Binding's answer is scripted.  What is checked is what a scrape of ``/metrics``
reads: a dashboard shows the queue empty once its pods are bound, the cluster's GPUs before the
first pod arrives, and the allocation fall when pods finish.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube
from gpusched.kube.watch import Handler
from gpusched.metrics import SchedulerMetrics
from gpusched.model import Pod
from tests.doubles import IdleClient

SCHEDULER = "s"


class _Binder:
    """Every Binding succeeds; Events and conditions are dropped."""

    def __init__(self) -> None:
        self.bound: list[str] = []

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.bound.append(pod.key)
        return BindResult.BOUND, ""

    async def event(self, *_: Any, **__: Any) -> None:
        pass

    async def unschedulable(self, *_: Any, **__: Any) -> None:
        pass

    async def exists(self, pod: Pod) -> bool | None:
        return True


def _node(name: str, gpus: int) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "256Gi", "pods": "250", "nvidia.com/gpu": str(gpus)}
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.count": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": res, "allocatable": res},
    }


def _pod(name: str, node: str = "") -> dict[str, Any]:
    limits = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}],
    }
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {}, "annotations": {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def _watch(s: Scheduler, name: str) -> Handler:
    """The handler the watch ``name`` feeds its events to."""
    return next(r.handler for r in s.reflectors if r.name == name)


def _scheduler(*nodes: tuple[str, int]) -> Scheduler:
    s = Scheduler(
        DaemonSettings(scheduler_name=SCHEDULER, leader_elect=False, policy="bestfit"), cast(Kube, IdleClient())
    )
    s.binder = cast(Binder, _Binder())
    for name, gpus in nodes:
        _watch(s, "nodes").apply("ADDED", _node(name, gpus))
    return s


def _scrape(metrics: SchedulerMetrics) -> dict[str, float]:
    """What a scrape of ``/metrics`` reads: series -> value."""
    body, _ = metrics.render()
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


async def _settle(s: Scheduler) -> None:
    await asyncio.sleep(0)
    while s.pending_tasks():
        await asyncio.wait(s.pending_tasks())


def test_the_cluster_gauges_are_read_before_any_pod_arrives() -> None:
    s = _scheduler(("n0", 8), ("n1", 4))
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == 12
    assert m["gpusched_gpu_allocation_ratio"] == 0
    assert m["gpusched_gpu_nodes_active"] == 0


def test_a_single_strategy_mig_node_counts_as_its_gpus_not_as_its_instances() -> None:
    """GPU feature discovery labels the instances as the node's GPUs and the device plugin
    advertises its seven 1g.5gb instances as nvidia.com/gpu: one A100, not seven."""
    s = _scheduler(("n0", 8))
    mig = _node("m", 7)
    mig["metadata"]["labels"].update(
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig.strategy": "single"}
    )
    _watch(s, "nodes").apply("ADDED", mig)
    _watch(s, "bound-pods").apply("ADDED", _pod("x", node="m"))  # holds one instance: a seventh of it
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == pytest.approx(9)
    assert m["gpusched_gpu_allocation_ratio"] == pytest.approx(1 / 7 / 9)


async def test_pending_pods_count_what_waits_and_fall_to_zero_once_bound() -> None:
    s = _scheduler(("n0", 2))
    for name in ("a", "b", "c"):
        _watch(s, "pending-pods").apply("ADDED", _pod(name))
    m = _scrape(s.metrics)
    assert m['gpusched_pending_pods{queue="active"}'] == 3  # waiting for their batch

    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 5))  # a, b placed; c parked
    await _settle(s)
    m = _scrape(s.metrics)
    assert m['gpusched_pending_pods{queue="active"}'] == 0  # a and b are bound: nothing waits
    assert m['gpusched_pending_pods{queue="unschedulable"}'] == 1
    assert m["gpusched_pods_scheduled_total"] == 2
    assert m["gpusched_gpu_allocation_ratio"] == 1
    assert m["gpusched_gpu_nodes_active"] == 1

    _watch(s, "pending-pods").apply("DELETED", _pod("c"))
    assert _scrape(s.metrics)['gpusched_pending_pods{queue="unschedulable"}'] == 0


async def test_allocation_falls_when_bound_pods_finish_without_another_batch() -> None:
    s = _scheduler(("n0", 2), ("n1", 2))
    bound = _watch(s, "bound-pods")
    for name, node in (("x", "n0"), ("y", "n0"), ("z", "n1")):
        bound.apply("ADDED", _pod(name, node))
    m = _scrape(s.metrics)
    assert m["gpusched_gpu_allocation_ratio"] == 0.75
    assert m["gpusched_gpu_nodes_active"] == 2

    for name, node in (("y", "n0"), ("z", "n1")):
        bound.apply("DELETED", _pod(name, node))
    m = _scrape(s.metrics)
    assert m["gpusched_gpu_allocation_ratio"] == 0.25
    assert m["gpusched_gpu_nodes_active"] == 1


async def test_a_cordoned_node_is_no_capacity_though_a_tolerating_pod_may_go_there() -> None:
    s = _scheduler(("n0", 2))
    cordoned = _node("n1", 4)
    cordoned["spec"] = {"unschedulable": True}
    _watch(s, "nodes").apply("ADDED", cordoned)
    _watch(s, "bound-pods").apply("ADDED", _pod("draining", "n1"))
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == 2
    assert m["gpusched_gpu_allocation_ratio"] == 0
    assert m["gpusched_gpu_nodes_active"] == 0
    tolerant = _pod("tolerant")
    tolerant["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    tolerant["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    _watch(s, "pending-pods").apply("ADDED", tolerant)
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 5))
    await _settle(s)
    assert cast(_Binder, s.binder).bound == ["default/tolerant"]  # only n1 has three GPUs free
    assert _scrape(s.metrics)["gpusched_gpus"] == 2
    uncordoned = _node("n1", 4)
    _watch(s, "nodes").apply("MODIFIED", uncordoned)
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == 6
    assert m["gpusched_gpu_nodes_active"] == 1


def _mig_node(name: str, whole: int, in_mig: int, slices: dict[str, int]) -> dict[str, Any]:
    """``whole`` GPUs advertised as such and ``in_mig`` more in MIG mode, cut into ``slices``."""
    obj = _node(name, whole)
    obj["metadata"]["labels"]["nvidia.com/gpu.count"] = str(whole + in_mig)
    for key in ("capacity", "allocatable"):
        obj["status"][key].update({f"nvidia.com/mig-{p}": str(n) for p, n in slices.items()})
    return obj


def _sliced_pod(name: str, node: str, profile: str) -> dict[str, Any]:
    obj = _pod(name, node)
    obj["spec"]["containers"][0]["resources"]["limits"] = {
        "cpu": "1",
        "memory": "1Gi",
        f"nvidia.com/mig-{profile}": "1",
    }
    return obj


def test_gpus_in_mig_mode_are_gpus_and_their_slices_held_are_allocated() -> None:
    s = _scheduler()
    _watch(s, "nodes").apply("ADDED", _mig_node("m", 0, 1, {"3g.40gb": 2}))  # one GPU, all in MIG mode
    m = _scrape(s.metrics)
    assert (m["gpusched_gpus"], m["gpusched_gpu_allocation_ratio"]) == (1, 0)
    for k in range(2):
        _watch(s, "bound-pods").apply("ADDED", _sliced_pod(f"s{k}", "m", "3g.40gb"))
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == 1
    assert m["gpusched_gpu_allocation_ratio"] == pytest.approx(6 / 7)  # two of its seven compute slices
    assert m["gpusched_gpu_nodes_active"] == 1

    # Beside whole GPUs: each counts as one GPU, each slice as its part of one.
    _watch(s, "nodes").apply("ADDED", _mig_node("w", 2, 1, {"1g.10gb": 7}))
    _watch(s, "bound-pods").apply("ADDED", _pod("whole", "w"))
    _watch(s, "bound-pods").apply("ADDED", _sliced_pod("small", "w", "1g.10gb"))
    m = _scrape(s.metrics)
    assert m["gpusched_gpus"] == 4
    assert m["gpusched_gpu_allocation_ratio"] == pytest.approx((6 / 7 + 1 + 1 / 7) / 4)


def test_a_failing_refresh_does_not_fail_the_scrape() -> None:
    metrics = SchedulerMetrics()
    metrics.scheduled(2)

    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("books unavailable")

    def queue_depths() -> None:
        ran.append("queue_depths")
        metrics.set_pending(3, 0, 0)

    metrics.on_scrape(broken)
    metrics.on_scrape(queue_depths)  # registered after the failing one: still refreshed
    m = _scrape(metrics)
    assert m["gpusched_pods_scheduled_total"] == 2
    assert ran == ["broken", "queue_depths"]
    assert m['gpusched_pending_pods{queue="active"}'] == 3
