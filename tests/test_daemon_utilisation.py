"""Busy GPUs and GPUs kept free, as a real ``Scheduler`` meets them batch by batch.

The utilisation view is set by hand here (tests/e2e/test_utilisation.py reads it from a real
Prometheus); the API server's answers are scripted (tests/doubles.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from gpusched.config import parse_config
from gpusched.daemon import Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.metrics.source import UtilisationSource, UtilisationView
from gpusched.solver.fragmentation import TypicalPods, cluster_frag_ratio
from tests.doubles import RecordingApi, one_node_scheduler, settle
from tests.e2e import kit


class EvictingApi(RecordingApi):
    """Records the pods the scheduler evicts too."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[str] = []
        self.why: list[str] = []
        """What each victim was told, when not priority (a reclaim)."""

    async def preempt(self, victim: Any, by: Any, node: str, why: str = "") -> bool:
        self.evicted.append(victim.key)
        if why:
            self.why.append(why)
        return True


def pod(name: str, priority: int = 0, *, gpus: int = 1, milli: int = 0, node: str = "", gpu: int = 0) -> dict[str, Any]:
    obj = kit.pod(name, "s", gpus=0 if milli else gpus, milli=milli, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    if node:
        obj["metadata"]["annotations"]["gpusched.io/gpu-indices"] = ",".join(str(gpu + k) for k in range(gpus))
    obj["spec"]["priority"] = priority
    return obj


def measured(s: Scheduler, percent: dict[str, dict[int, float]]) -> None:
    if s.utilisation is None:
        s.utilisation = UtilisationSource("http://prometheus.invalid:9090")
    s.utilisation.view = UtilisationView(time.monotonic(), percent)


async def batch(s: Scheduler) -> None:
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)


# -- busy GPUs and preemption ---------------------------------------------------------------


async def test_a_busy_gpu_held_only_by_pods_of_lower_priority_is_taken_by_evicting_them() -> None:
    for busy in (False, True):
        api = EvictingApi()
        s = one_node_scheduler(api, gpus=1)
        if busy:
            measured(s, {"n0": {0: 95.0}})  # the share below keeps it busy
        s._bound.apply("ADDED", pod("low", 0, milli=500, node="n0"))
        s._pending.apply("ADDED", pod("urgent", 100))
        await batch(s)
        assert api.evicted == ["default/low"], (busy, api.failed("default/urgent"))


async def test_no_pod_is_evicted_for_room_on_a_gpu_that_others_keep_busy() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    measured(s, {"n0": {0: 99.0}})
    s._bound.apply("ADDED", pod("w", 1000, milli=300, node="n0"))  # stays: higher priority
    s._bound.apply("ADDED", pod("v", 0, milli=500, node="n0"))
    s._pending.apply("ADDED", pod("p", 100, milli=500))
    await batch(s)
    assert api.evicted == []
    assert api.failed("default/p") == ["0/1 nodes are available: 1 insufficient GPU share."]


async def test_a_busy_gpu_no_pod_holds_is_not_taken_by_preemption_either() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    honoured(s)  # the device plugin gives each pod the GPUs the books name
    measured(s, {"n0": {1: 97.0}})  # something outside the cluster's pods
    s._bound.apply("ADDED", pod("low", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", pod("urgent", 100, gpus=2))
    await batch(s)
    assert api.evicted == []
    assert api.bound == []


# -- who is told what, and woken when ----------------------------------------------------------


async def test_the_busy_note_counts_only_gpus_the_pod_could_have_used() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)  # n0: one A100, busy
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "H100"))
    measured(s, {"n0": {0: 99.0}})
    s._bound.apply("ADDED", pod("other", 0, node="n1"))
    h100 = pod("h100-only")
    h100["metadata"]["annotations"]["gpusched.io/gpu-models"] = "H100"
    s._pending.apply("ADDED", h100)
    s._pending.apply("ADDED", pod("any"))
    await batch(s)
    (message,) = api.failed("default/h100-only")
    assert "busy" not in message, message
    (message,) = api.failed("default/any")
    assert message.endswith("; 1 GPU with room for it was not offered: busy, at 90 % utilisation or more (DCGM)."), (
        message
    )


async def test_parked_pods_are_woken_only_when_a_gpu_they_were_denied_cools_down() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    honoured(s)  # the device plugin gives each pod the GPUs the books name
    s._bound.apply("ADDED", pod("train", 0, node="n0", gpu=0))
    s._pending.apply("ADDED", pod("waiting", 0, gpus=2))
    measured(s, {"n0": {0: 95.0, 1: 95.0}, "elsewhere": {0: 95.0}})
    await batch(s)
    assert s.queue.counts().unschedulable == 1
    blocking = s.cache.blocking(s.busy_gpus() or {})
    assert blocking == {("n0", 1)}  # GPU 0 is full by the books; "elsewhere" is no node here
    measured(s, {"n0": {0: 10.0, 1: 95.0}, "elsewhere": {0: 10.0}})
    blocking = s.utilisation_changed(blocking)
    assert s.queue.counts().unschedulable == 1  # what cooled was denied to nobody
    measured(s, {"n0": {0: 10.0, 1: 10.0}})
    s.utilisation_changed(blocking)
    assert s.queue.counts().unschedulable == 0


async def test_the_fragmentation_gauge_after_a_batch_counts_busy_gpus_as_the_books_do() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    measured(s, {"n0": {0: 99.0, 1: 99.0}})
    s._bound.apply("ADDED", pod("r0", milli=700, node="n0", gpu=0))
    s._bound.apply("ADDED", pod("r1", milli=700, node="n0", gpu=1))
    for i in range(6):
        s._pending.apply("ADDED", pod(f"small{i}", milli=300))
    await batch(s)
    state = s.cache.snapshot().state
    books = cluster_frag_ratio(state, TypicalPods.from_counts(s._shapes), ~state.cluster.cordoned)
    line = next(
        x for x in s.metrics.render()[0].decode().splitlines() if x.startswith("gpusched_gpu_fragmentation_ratio")
    )
    assert float(line.split()[-1]) == books


# -- headroom --------------------------------------------------------------------------------


def kept_for(s: Scheduler, gpus: int, priority: int = 1000) -> None:
    s.set_config(parse_config({"headroom": {"gpus": gpus, "priorityAtLeast": priority}}))


async def test_pods_below_the_headroom_priority_leave_the_kept_gpus_idle_and_are_told() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    kept_for(s, 2)
    for i in range(3):
        s._pending.apply("ADDED", pod(f"batch{i}", 0))
    await batch(s)
    assert len(api.bound) == 2
    (left,) = {f"default/batch{i}" for i in range(3)} - set(api.bound)
    (message,) = api.failed(left)
    assert message.endswith("; 2 idle GPUs are kept free for pods of priority 1000 or more (headroom)."), message
    line = next(x for x in s.metrics.render()[0].decode().splitlines() if x.startswith("gpusched_gpus_kept_free"))
    assert line == "gpusched_gpus_kept_free 2.0"


async def test_a_pod_of_high_priority_takes_the_kept_gpus_in_the_same_batch() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    kept_for(s, 2)
    s._bound.apply("ADDED", pod("running", 0, gpus=2, node="n0"))  # GPUs 0 and 1: two idle, both kept
    s._pending.apply("ADDED", pod("critical", 1000, gpus=2))
    s._pending.apply("ADDED", pod("low", 0))
    await batch(s)
    assert api.bound == ["default/critical"]
    # Nothing is kept any more (the critical pod took it): the low pod is told only that it does not fit.
    assert api.failed("default/low") == ["0/1 nodes are available: 1 Insufficient nvidia.com/gpu."]
    line = next(x for x in s.metrics.render()[0].decode().splitlines() if x.startswith("gpusched_gpus_kept_free"))
    assert line == "gpusched_gpus_kept_free 0.0"


async def test_a_pod_below_the_headroom_priority_does_not_preempt_its_way_onto_kept_gpus() -> None:
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    kept_for(s, 2)
    s._pending.apply("ADDED", pod("mid", 500))
    await batch(s)
    assert api.bound == []
    assert api.evicted == []
    s.set_config(parse_config({}))  # no headroom: woken at once, and placed
    assert s.queue.counts().unschedulable == 0
    await batch(s)
    assert api.bound == ["default/mid"]


async def test_the_idle_gauge_does_not_trust_the_books_guess_of_a_pods_gpu() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    other = kit.pod("trainer", "default-scheduler", gpus=1, node_name="n0")  # no gpusched.io/gpu-indices
    other["metadata"].update({"namespace": "research", "uid": "u1"})
    s._bound.apply("ADDED", other)
    measured(s, {"n0": {0: 0.0, 1: 100.0}})  # the books guess GPU 0; it may well be on GPU 1, saturated
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_allocated_idle") == 0.0
    measured(s, {"n0": {0: 0.0, 1: 1.0}})  # both idle: whichever it has is idle
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_allocated_idle") == 1.0


async def test_with_no_answer_young_enough_to_use_the_utilisation_gauges_say_nothing() -> None:
    """Not 0: that would read as "nothing busy, nothing idle", measured."""
    s = one_node_scheduler(RecordingApi(), gpus=2)
    honoured(s)  # the device plugin gives each pod the GPUs the books name
    s._bound.apply("ADDED", pod("train", node="n0"))
    s.utilisation = UtilisationSource("http://prometheus.invalid:9090")
    s.gauges.refresh()  # before the first answer
    assert math.isnan(gauge(s, "gpusched_gpus_busy"))
    assert math.isnan(gauge(s, "gpusched_gpus_allocated_idle"))
    measured(s, {"n0": {0: 0.0, 1: 99.0}})
    s.gauges.refresh()
    assert (gauge(s, "gpusched_gpus_busy"), gauge(s, "gpusched_gpus_allocated_idle")) == (1.0, 1.0)
    too_old = s.config.utilisation.max_age_seconds + 60
    s.utilisation.view = UtilisationView(time.monotonic() - too_old, {"n0": {0: 0.0, 1: 99.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_utilisation_age_seconds") >= too_old
    assert math.isnan(gauge(s, "gpusched_gpus_busy"))
    assert math.isnan(gauge(s, "gpusched_gpus_allocated_idle"))


def time_sliced(s: Scheduler) -> None:
    """Node ``n0`` of ``s`` becomes two A100s the device plugin time-slices four ways: it
    advertises 8 ``nvidia.com/gpu`` (the books' GPUs 0-7), and DCGM reports GPUs 0 and 1."""
    obj = kit.node("n0", 8, "A100", **{"nvidia.com/gpu.replicas": "4"})
    obj["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    NodeHandler(s).apply("MODIFIED", obj)


async def test_on_a_time_sliced_node_a_gpu_is_busy_or_idle_in_all_its_slices() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=8)
    time_sliced(s)
    for k in (4, 5, 6, 7):
        s._bound.apply("ADDED", pod(f"w{k}", node="n0", gpu=k))
    measured(s, {"n0": {0: 0.0, 1: 0.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_allocated_idle") == 4.0  # every slice held is on an idle GPU
    assert gauge(s, "gpusched_gpus_busy") == 0.0
    measured(s, {"n0": {0: 100.0, 1: 100.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_busy") == 4.0  # the four slices with room: on a saturated GPU
    assert gauge(s, "gpusched_gpus_allocated_idle") == 0.0
    # One busy, one idle: which slice runs on which GPU is the device plugin's choice, so a
    # slice is neither known busy nor known idle.
    measured(s, {"n0": {0: 100.0, 1: 0.0}})
    s.gauges.refresh()
    assert (gauge(s, "gpusched_gpus_busy"), gauge(s, "gpusched_gpus_allocated_idle")) == (0.0, 0.0)


async def test_no_pod_goes_to_a_slice_of_a_busy_time_sliced_gpu_and_is_woken_when_it_cools() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    time_sliced(s)
    for k in (4, 5, 6, 7):
        s._bound.apply("ADDED", pod(f"w{k}", node="n0", gpu=k))
    measured(s, {"n0": {0: 100.0, 1: 100.0}})
    s._pending.apply("ADDED", pod("p"))
    await batch(s)
    assert api.bound == []
    (message,) = api.failed("default/p")
    assert message.endswith("; 4 GPUs with room for it were not offered: busy, at 90 % utilisation or more (DCGM)."), (
        message
    )
    blocking = s.utilisation_changed(s.cache.blocking(s.busy_gpus() or {}))
    assert s.queue.counts().unschedulable == 1  # still busy: not drawn again
    measured(s, {"n0": {0: 100.0, 1: 10.0}})
    s.utilisation_changed(blocking)
    assert s.queue.counts().unschedulable == 0
    await batch(s)
    assert api.bound == ["default/p"]


def gauge(s: Scheduler, name: str) -> float:
    line = next(x for x in s.metrics.render()[0].decode().splitlines() if x.startswith(name + " "))
    return float(line.split()[-1])


async def test_a_pod_whose_best_preemption_is_on_a_busy_gpu_takes_the_next_best_elsewhere() -> None:
    # n0: its GPU busy (DCGM) and held by 'v' (priority 1) and 's' (priority 100), half each;
    # n1: its GPU held whole by 'w' (priority 2).  Evicting v (the lowest) would make room on
    # n0, but s keeps that GPU busy: that answer is refused, and w is evicted on n1 instead.
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    measured(s, {"n0": {0: 95.0}})
    s._bound.apply("ADDED", pod("v", 1, milli=500, node="n0", gpu=0))
    s._bound.apply("ADDED", pod("s", 100, milli=500, node="n0", gpu=0))
    s._bound.apply("ADDED", pod("w", 2, node="n1", gpu=0))
    s._pending.apply("ADDED", pod("q", 50, milli=500))
    await batch(s)
    assert api.evicted == ["default/w"], (api.evicted, api.failed("default/q"))
    assert s.cache.nomination("default/q") == ("n1", (0,), 1)


def test_a_configuration_that_makes_answers_too_short_lived_for_the_poll_is_warned_about() -> None:
    from structlog.testing import capture_logs

    s = one_node_scheduler(RecordingApi(), gpus=1)
    s.utilisation = UtilisationSource("http://prometheus.invalid:9090", poll_s=15)
    with capture_logs() as logs:
        s.set_config(parse_config({"utilisation": {"maxAgeSeconds": 60}}))
        assert logs == []
        s.set_config(parse_config({"utilisation": {"maxAgeSeconds": 10}}))  # the ConfigMap, reloaded
    (line,) = logs
    assert line["log_level"] == "warning"
    assert line["fix"] == "a --utilisation-poll below utilisation.maxAgeSeconds"
    assert (line["poll_s"], line["max_age_s"]) == (15, 10)


async def test_room_on_a_node_with_busy_gpus_is_not_taken_over() -> None:
    """Who keeps a GPU busy is not known to leave: a pod of higher priority does not take over room
    held on such a node (it may preempt as usual)."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=2)
    measured(s, {"n0": {1: 99.0}})  # GPU 1 kept busy by "other"
    s._bound.apply("ADDED", pod("low", 0, node="n0", gpu=0))
    s._bound.apply("ADDED", pod("other", 5000, milli=500, node="n0", gpu=1))
    s._pending.apply("ADDED", pod("mid", 50))
    await batch(s)
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)
    s._pending.apply("ADDED", pod("critical", 1000, milli=500))
    await batch(s)
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)
    room = s.cache.nomination("default/critical")
    assert room is None or 1 not in room[1]


def test_names_in_the_answer_that_are_no_node_are_warned_about_once_until_they_change() -> None:
    """A dcgm-exporter without NODE_NAME labels its GPUs with its pod's name: those GPUs go
    unmeasured while the others' are read, which only a warning tells."""
    from structlog.testing import capture_logs

    s = one_node_scheduler(EvictingApi(), gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    warned = []
    told: tuple[frozenset[str], bool] = (frozenset(), False)
    for answer in (
        {"n0": {0: 5.0}, "n1": {0: 5.0}},  # every name a node: nothing to say
        {"n0": {0: 5.0}, "dcgm-exporter-x1": {0: 5.0}},
        {"n0": {0: 6.0}, "dcgm-exporter-x1": {0: 6.0}},  # the same stranger: said once
        {"n0": {0: 6.0}, "dcgm-exporter-x2": {0: 6.0}},  # a new one
        {"dcgm-exporter-x2": {0: 6.0}},  # no node at all: the label names something else
    ):
        measured(s, answer)
        with capture_logs() as logs:
            told = s.gauges.check_node_names(told)
        warned.append([(e["event"], e.get("answered")) for e in logs if e["log_level"] == "warning"])
    some = "names in the utilisation answer are no node of the cluster; their GPUs count as neither busy nor idle"
    assert warned[:4] == [[], [(some, ["dcgm-exporter-x1"])], [], [(some, ["dcgm-exporter-x2"])]]
    (last,) = warned[4]
    assert last[0].startswith("no node of the utilisation answer is a node of the cluster")
    # A node scaled down stays in the answer until its series age out: no exporter is at fault.
    measured(s, {"n0": {0: 6.0}, "n1": {0: 6.0}})
    told = s.gauges.check_node_names(told)
    NodeHandler(s).apply("DELETED", kit.node("n1", 1, "A100"))
    with capture_logs() as logs:
        told = s.gauges.check_node_names(told)
    assert [e for e in logs if e["log_level"] == "warning"] == []


def honoured(s: Scheduler) -> None:
    s.set_config(parse_config({"utilisation": {"gpuIndicesHonoured": True}}))


# -- NVIDIA's device plugin: it chooses the GPUs, the books' indices are a guess ---------------


async def test_a_busy_gpu_the_books_show_free_is_first_taken_for_a_pod_booked_on_an_idle_one() -> None:
    for who in ("other", "ours"):
        api = RecordingApi()
        s = one_node_scheduler(api, gpus=2)
        if who == "other":  # another scheduler's pod: the books guess GPU 0
            running = kit.pod("trainer", "default-scheduler", gpus=1, node_name="n0")
            running["metadata"].update({"namespace": "research", "uid": "u1"})
        else:  # ours, booked on GPU 0, given GPU 1 by the device plugin
            running = pod("a", node="n0", gpu=0)
        s._bound.apply("ADDED", running)
        measured(s, {"n0": {0: 0.0, 1: 100.0}})
        s.gauges.refresh()
        # GPU 1 is the running pod's: GPU 0 is free, and nothing is held idle.
        assert (gauge(s, "gpusched_gpus_busy"), gauge(s, "gpusched_gpus_allocated_idle")) == (0.0, 0.0), who
        s._pending.apply("ADDED", pod("p"))
        await batch(s)
        assert api.bound == ["default/p"], (who, api.failed("default/p"))


async def test_busy_gpus_beyond_what_the_pods_account_for_still_keep_pods_out() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=4)
    s._bound.apply("ADDED", pod("a", node="n0", gpu=0))
    measured(s, {"n0": {0: 0.0, 1: 99.0, 2: 99.0, 3: 0.0}})  # two busy, one pod: one is something else's
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_busy") == 1.0
    s._pending.apply("ADDED", pod("two", gpus=2))
    s._pending.apply("ADDED", pod("three", gpus=3))
    await batch(s)
    assert api.bound == ["default/two"]
    (message,) = api.failed("default/three")
    assert message.endswith("; 1 GPU with room for it was not offered: busy, at 90 % utilisation or more (DCGM)."), (
        message
    )


async def test_gpus_held_idle_are_counted_per_node_when_the_device_plugin_chose_them() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=4)
    for g in range(3):
        s._bound.apply("ADDED", pod(f"w{g}", node="n0", gpu=g))
    measured(s, {"n0": {0: 0.0, 1: 0.0, 2: 0.0, 3: 99.0}})  # one of the three works (on GPU 3)
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_allocated_idle") == 2.0


async def test_a_single_strategy_mig_node_numbers_no_instance_by_its_physical_gpus() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=14)
    node = kit.node("n0", 14, "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", **{"nvidia.com/mig.strategy": "single"})
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    NodeHandler(s).apply("MODIFIED", node)
    measured(s, {"n0": {0: 0.0, 1: 99.0}})  # DCGM's physical GPUs 0 and 1, not instances 0 and 1
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_busy") == 0.0
    s._pending.apply("ADDED", pod("p", gpus=14))
    await batch(s)
    assert api.bound == ["default/p"], api.failed("default/p")
    s._bound.apply("ADDED", pod("p", node="n0", gpu=0))
    measured(s, {"n0": {0: 0.0, 1: 0.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_allocated_idle") == 0.0  # instance 0 is no physical GPU 0


async def test_an_answer_that_names_no_node_measures_nothing_rather_than_zero() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    s._bound.apply("ADDED", pod("train", node="n0"))
    measured(s, {"nvidia-dcgm-exporter-abcde": {0: 0.0, 1: 99.0}})  # the exporter's pod name, no node's
    s.gauges.refresh()
    assert math.isnan(gauge(s, "gpusched_gpus_busy"))
    assert math.isnan(gauge(s, "gpusched_gpus_allocated_idle"))


async def test_an_answer_that_names_no_node_finds_no_node_idle() -> None:
    """With a wrong node label, a node whose GPUs work at 99 % outside the books is not offered
    to an autoscaler as idle: that answer measured none of the cluster's nodes."""
    s = one_node_scheduler(RecordingApi(), gpus=2)
    measured(s, {"nvidia-dcgm-exporter-abcde": {0: 99.0, 1: 99.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpu_nodes_idle") == 0.0
    measured(s, {"n0": {0: 0.0, 1: 0.0}})  # the label fixed: n0 measured, and idle
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpu_nodes_idle") == 1.0


async def test_a_node_whose_gpus_dcgm_finds_busy_is_no_idle_node_to_remove() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpu_nodes_idle") == 1.0
    measured(s, {"n0": {0: 99.0, 1: 99.0}})  # nothing on the books, yet something works there
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpu_nodes_idle") == 0.0


@pytest.mark.parametrize("case", ["busy GPUs not avoided", "time-sliced", "answer too old"])
async def test_a_node_dcgm_finds_busy_is_no_idle_node_whatever_batches_do_with_busy_gpus(case: str) -> None:
    """Batches may place on busy GPUs (``avoidBusyGpus: false``) and a time-sliced node's busy
    GPU maps to no slice: the node still runs work outside the books, and an autoscaler must not
    remove it.  Without a recent answer, no node is said to be idle at all."""
    s = one_node_scheduler(RecordingApi(), gpus=2)
    if case == "busy GPUs not avoided":
        s.set_config(parse_config({"utilisation": {"avoidBusyGpus": False}}))
    elif case == "time-sliced":
        NodeHandler(s).apply("MODIFIED", kit.node("n0", 8, "A100", **{"nvidia.com/gpu.replicas": "4"}))
    measured(s, {"n0": {0: 95.0}})
    if case == "answer too old":
        assert s.utilisation is not None
        assert s.utilisation.view is not None
        s.utilisation.view = UtilisationView(time.monotonic() - 3600, {"n0": {0: 0.0, 1: 0.0}})
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpu_nodes_idle") == 0.0


async def test_gpu_nodes_the_answer_says_nothing_of_are_warned_about_once() -> None:
    from structlog.testing import capture_logs

    s = one_node_scheduler(RecordingApi(), gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("tainted-pool-0", 8, "H100"))  # dcgm-exporter does not run there
    measured(s, {"n0": {0: 10.0, 1: 10.0}})
    with capture_logs() as logs:
        told = s.gauges.check_node_names((frozenset(), False))
        s.gauges.check_node_names(told)  # the next poll: the same nodes, not told again
    warned = [e for e in logs if e["event"].startswith("GPU nodes are not in the utilisation answer")]
    assert [(e["nodes"], e["first"]) for e in warned] == [(1, ["tainted-pool-0"])]


async def test_a_pod_whose_room_is_on_a_gpu_others_keep_busy_is_parked_not_retried_for_ever() -> None:
    """p's only room is the share of v (of lower priority) on a GPU that w, staying, keeps busy:
    no eviction makes room there.  p is told and parked until the cluster changes, not drawn
    again and again (which would also keep consolidation from ever finding the cluster quiet)."""
    api = EvictingApi()
    s = one_node_scheduler(api, gpus=1)
    measured(s, {"n0": {0: 99.0}})
    s._bound.apply("ADDED", pod("w", 1000, milli=300, node="n0"))
    s._bound.apply("ADDED", pod("v", 0, milli=500, node="n0"))
    s._pending.apply("ADDED", pod("p", 100, milli=500))
    await batch(s)
    assert api.evicted == []
    assert s.queue.counts().unschedulable == 1
    assert [r.key for r in s.unschedulable_records()] == ["default/p"]


async def test_a_replica_that_loses_the_lead_during_a_batch_exports_no_fragmentation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lead passes to another replica while the batch recomputes fragmentation (busy GPUs
    make it do so in a worker thread): the gauge is NaN, as on any replica that does not lead,
    not this batch's number until this replica leads again."""
    from gpusched.daemon import scheduler as daemon

    s = one_node_scheduler(RecordingApi(), gpus=2)
    s.set_config(parse_config({"batching": {"quickStart": False}}))
    measured(s, {"n0": {0: 0.0, 1: 99.0}})
    loop = asyncio.get_running_loop()
    real, calls = daemon.cluster_frag_ratio, []

    def frag(*args: Any, **kwargs: Any) -> float:
        calls.append(1)
        if len(calls) == 2:  # the recomputation after the solve: the Lease passes now
            loop.call_soon_threadsafe(s._leadership, False)
            time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon, "cluster_frag_ratio", frag)
    s._pending.apply("ADDED", pod("p"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    assert len(calls) >= 2
    assert gauge(s, "gpusched_is_leader") == 0.0
    assert math.isnan(gauge(s, "gpusched_gpu_fragmentation_ratio"))
    assert math.isnan(gauge(s, "gpusched_solve_gap_ratio"))
