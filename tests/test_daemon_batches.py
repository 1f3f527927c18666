"""Where a batch's pods end up when its solve, its plan or its binds go wrong.

These drive a real ``Scheduler`` (queue, cache, policy) with watch events as the API server
sends them; only the API server's answers (Bindings, Events, conditions) are scripted.  What is
checked is what a user sees: each pod bound once, or told why it waits, and drawn again when it
may fit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.daemon import Scheduler
from gpusched.daemon import scheduler as daemon
from gpusched.daemon.handlers import NodeHandler
from gpusched.model import Pod
from gpusched.state.records import PodRecord
from tests.doubles import RecordingApi, member_pod, one_node_scheduler, settle
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0


def _scheduler(gpus: int) -> tuple[Scheduler, RecordingApi]:
    api = RecordingApi()
    return one_node_scheduler(api, gpus), api


class _HeldSolve:
    """The batch's solve waits in its worker thread until the test has applied what the watches
    deliver meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = asyncio.Event()
        self.go = threading.Event()
        loop = asyncio.get_running_loop()
        real: Callable[..., Any] = daemon._solve

        def solve(*args: Any) -> Any:
            loop.call_soon_threadsafe(self.started.set)
            self.go.wait(DRAWN_WITHIN_S)
            return real(*args)

        monkeypatch.setattr(daemon, "_solve", solve)

    async def during(self, s: Scheduler, batch: list[PodRecord], events: Callable[[], None]) -> None:
        solving = asyncio.ensure_future(s.schedule_batch(batch))
        try:
            await asyncio.wait_for(self.started.wait(), DRAWN_WITHIN_S)
            events()
        finally:
            self.go.set()  # never leave the worker thread waiting
        await solving


async def test_a_pod_left_out_for_a_gang_that_then_broke_is_placed_on_the_gpus_it_left_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan gives both GPUs to a gang, so a lone pod is left out; a member is deleted during
    the solve, so no member is bound.  The GPUs stay idle: the lone pod is bound on one at once,
    not told it does not fit and parked until something else changes in the cluster."""
    s, api = _scheduler(gpus=2)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", member_pod(name, gang="g"))
    s._pending.apply("ADDED", member_pod("solo"))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    held = _HeldSolve(monkeypatch)
    await held.during(s, batch, lambda: s._pending.apply("DELETED", member_pod("m1", gang="g")))
    await settle(s)
    assert api.bound == []
    assert api.reasons("default/solo") == []  # not "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"

    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert sorted(r.key for r in batch) == ["default/m2", "default/solo"]
    await s.schedule_batch(batch)
    await settle(s)
    assert api.bound == ["default/solo"]
    assert api.reasons("default/m2") == ["FailedScheduling"]  # 1 of at least 2 members pending


async def test_a_pod_left_out_for_one_bound_elsewhere_during_the_solve_takes_the_gpu_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan gives n0's only GPU to a, so b is left out; meanwhile a is bound to n1 by another
    instance (an earlier leader's Binding landing late).  n0's GPU is idle: b is bound there."""
    s, api = _scheduler(gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "H100"))
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name, models=("A100",)))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    held = _HeldSolve(monkeypatch)

    def bound_elsewhere() -> None:
        s._bound.apply("ADDED", member_pod("a", models=("A100",), node="n1"))
        s._pending.apply("DELETED", member_pod("a", models=("A100",)))

    await held.during(s, batch, bound_elsewhere)
    await settle(s)
    assert api.bound == []
    assert api.reasons("default/b") == []

    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in batch] == ["default/b"]
    await s.schedule_batch(batch)
    await settle(s)
    assert api.bound == ["default/b"]


@pytest.mark.parametrize("with_valid_pod", [False, True])
async def test_every_batch_writes_its_one_log_line_even_when_no_pod_is_left_to_solve(with_valid_pod: bool) -> None:
    s, api = _scheduler(gpus=1)
    bad = member_pod("bad")
    bad["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "two"  # not a number
    s._pending.apply("ADDED", bad)
    if with_valid_pod:
        s._pending.apply("ADDED", member_pod("good"))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    with capture_logs() as logs:
        await s.schedule_batch(batch)
        await settle(s)
    (line,) = [e for e in logs if e["event"] == "batch"]
    placed = 1 if with_valid_pod else 0
    assert (line["pods"], line["placed"], line["unplaced"], line["invalid"]) == (1 + placed, placed, 0, 1)
    assert api.reasons("default/bad") == ["FailedScheduling"]


async def test_a_gang_the_solve_left_out_while_it_fits_is_tried_again_soon_not_parked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A solve cut short (its time limit) may leave a gang out that fits.  Like a single pod that
    # fits, its members are told so and backed off, not parked until the cluster changes.
    real: Callable[..., Any] = daemon._place
    calls = 0

    def short(policy: Any, pods: list[Any], state: Any, quick: bool, deadline: float | None = None) -> Any:
        nonlocal calls
        calls += 1
        plan = real(policy, pods, state, quick, deadline)
        if calls > 1:
            return plan
        out = tuple(a.pod for a in plan.assignments if a.pod.gang is not None)
        return dataclasses.replace(
            plan, assignments=tuple(a for a in plan.assignments if a.pod.gang is None), unplaced=plan.unplaced + out
        )

    monkeypatch.setattr(daemon, "_place", short)
    s, api = _scheduler(gpus=2)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", member_pod(name, gang="g"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    told = api.failed("default/m1")
    assert told, api.events
    assert "fit together now" in told[-1]
    assert s.queue.counts().backoff == 2, s.queue.counts()
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert sorted(api.bound) == ["default/m1", "default/m2"]


async def test_a_batch_that_raises_backs_its_pods_off_and_scheduling_goes_on() -> None:
    # A defect outside the solve (which has its own guard) must neither stop the scheduling
    # loop nor lose the batch's pods.
    s, api = _scheduler(gpus=2)
    real = s._bind_nominated
    calls = 0

    def broken(todo: list[PodRecord]) -> list[PodRecord]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a defect")
        return real(todo)

    s._bind_nominated = broken  # type: ignore[method-assign]
    for r in s.reflectors:
        r.synced.set()
    s._leadership(True)
    s._pending.apply("ADDED", member_pod("p"))
    loop = asyncio.create_task(s.schedule_forever())
    try:
        with capture_logs() as logs:
            deadline = asyncio.get_running_loop().time() + DRAWN_WITHIN_S
            while not api.bound and asyncio.get_running_loop().time() < deadline and not loop.done():
                await asyncio.sleep(0.05)
        assert api.bound == ["default/p"], (loop, [e["event"] for e in logs])
        assert calls == 2
        assert [e["size"] for e in logs if e["event"] == "batch failed"] == [1]
        assert "gpusched_batches_failed_total 1.0" in s.metrics.render()[0].decode()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await settle(s)


@pytest.mark.parametrize("policy", ["cpsat", "bestfit", "fgd"])
async def test_a_pod_of_higher_priority_in_the_batch_is_placed_before_a_lower_one_that_places_more(
    policy: str,
) -> None:
    # One GPU: the low pod asks for all of it, the high one for half.  Placing the low one would
    # place more GPU demand, and the high one would then preempt it at once.
    from gpusched.daemon import DaemonSettings
    from gpusched.kube.binder import Binder
    from gpusched.kube.client import Kube
    from tests.doubles import IdleClient
    from tests.test_daemon_utilisation import pod

    api = RecordingApi()
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy=policy), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    NodeHandler(s).apply("ADDED", kit.node("n0", 1, "A100"))
    s._pending.apply("ADDED", pod("low", 0, gpus=1))
    s._pending.apply("ADDED", pod("high", 1000, milli=500))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert len(batch) == 2
    await s.schedule_batch(batch)
    await settle(s)
    assert api.bound == ["default/high"]


def test_a_batch_is_placed_by_priority_quota_first_and_a_gang_at_its_lowest_members() -> None:
    from gpusched.model.pod import Gang
    from tests.factories import pod

    def p(name: str, prio: int, gang: str = "") -> Pod:
        return dataclasses.replace(pod(name), priority=prio, gang=Gang(gang, 2) if gang else None)

    pods = [p("a", 0), p("b", 5), p("g1", 6, "g"), p("g2", 9, "g"), p("q", 1), p("c", 7), p("d", 3), p("e", 2)]
    passes = daemon._passes(pods, first={"default/q"})
    # Quota first; then 7, 6 (the gang, both members, at its lower one's), and the rest in one pass.
    assert [[x.name for x in part] for part in passes] == [["q"], ["c"], ["g1", "g2"], ["a", "b", "d", "e"]]


async def test_pods_deleted_during_their_solve_are_told_nothing() -> None:
    s, api = _scheduler(gpus=1)
    from tests.test_daemon_utilisation import pod

    for i in range(5):
        s._pending.apply("ADDED", pod(f"p{i}", gpus=2))  # fits nowhere
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    for i in range(5):  # the job is cleaned up while its batch is solved
        s._pending.apply("DELETED", pod(f"p{i}", gpus=2))
    await s.schedule_batch(batch)
    await settle(s)
    assert api.events == []  # no Event for pods that are gone
    assert s.placed_here == set()
    assert len(s.queue) == 0


def test_a_batch_placed_in_passes_shares_one_time_limit() -> None:
    # Three priority levels: three passes, which together may take the time limit, not each.
    import time

    from gpusched.solver.baselines import BestFitPolicy
    from gpusched.solver.fragmentation import TypicalPods
    from tests.factories import gpu_node
    from tests.factories import pod as fpod

    class Timed(BestFitPolicy):
        time_limit_s = 2.0

        def __init__(self) -> None:
            super().__init__()
            self.deadlines: list[float] = []

        def place_until(self, pods: Any, state: Any, deadline: float, quick: bool) -> Any:
            self.deadlines.append(deadline)
            return self.place(pods, state)

    from gpusched.model import Cluster

    cluster = Cluster([gpu_node("n0", gpus=8)])
    policy = Timed()
    pods = [dataclasses.replace(fpod(f"p{i}", gpus=1), priority=i % 3) for i in range(6)]
    start = time.perf_counter()
    plan, _, _ = daemon._solve(policy, pods, cluster.empty_state(), TypicalPods((), ()), quick=False)
    assert len(plan.assignments) == 6
    assert len(policy.deadlines) == 3
    assert policy.deadlines == sorted(policy.deadlines)
    assert policy.deadlines[-1] <= start + 2.0 + 0.5  # the last pass ends with the batch's limit
    assert policy.deadlines[0] - start <= 2.0 / 3 + 0.5  # the first its share: 2 of 6 pods


@pytest.mark.parametrize("others", [1, 9])  # handled alone, or halved until it is
async def test_a_pod_that_sets_off_a_defect_is_handled_alone_and_its_batchmates_are_told(
    monkeypatch: pytest.MonkeyPatch, others: int
) -> None:
    """Drawn together again and again, every batch would raise: the pods of a batch that raised
    are handled one at a time the next time, so the others get their verdict (here: no node has
    their GPU model) and the culprit is told of an internal error, with a backoff of its own."""
    real = daemon.explain

    def explain(p: Pod, state: Any) -> Any:
        if p.name == "bad":
            raise ValueError("a defect")
        return real(p, state)

    monkeypatch.setattr(daemon, "explain", explain)
    s, api = _scheduler(gpus=1)
    s.queue.initial_backoff = s.queue.max_backoff = 0.05
    s._leadership(True)
    names = ["bad", *(f"other{i}" for i in range(others))]
    for name in names:
        s._pending.apply("ADDED", member_pod(name, models=("H100",)))
    for _ in range(8):
        await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
        await settle(s)
        if all(api.failed(f"default/{name}") for name in names):
            break
    for name in names[1:]:
        assert api.failed(f"default/{name}")[-1].endswith("GPU model not accepted."), name
    assert api.failed("default/bad")[-1] == (
        "internal error while placing it (ValueError('a defect')); tried again after a backoff"
    )
    assert "default/bad" in s.queue


@pytest.mark.parametrize("policy", ["cpsat", "bestfit"])
async def test_a_recreated_member_of_a_gang_that_requires_one_rack_joins_its_peers_rack(policy: str) -> None:
    # Two members (2 GPUs each) run on a, rack r0; the third was deleted and comes again.  b, in
    # rack r1, fits it exactly (the best fit), but the gang is held to r0, where its peers run.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=0)
    s.settings = dataclasses.replace(s.settings, policy=policy)
    NodeHandler(s).apply("ADDED", kit.node("a", 8, "A100", rack="r0"))
    NodeHandler(s).apply("ADDED", kit.node("b", 2, "A100", rack="r1"))

    def member(name: str, node: str = "") -> dict[str, Any]:
        obj = member_pod(name, gang="train", node=node)
        obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
        obj["metadata"]["annotations"].update(
            {"gpusched.io/gang-min-members": "3", "gpusched.io/gang-topology-key": "rack"}
        )
        if node:
            obj["status"] = {"phase": "Running"}
        return obj

    s._bound.apply("ADDED", member("m0", "a"))
    s._bound.apply("ADDED", member("m1", "a"))
    s._pending.apply("ADDED", member("m2"))
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    assert api.bound == ["default/m2"]
    where = s.cache.placement("default/m2")
    assert where is not None
    assert where[0] == "a"


async def test_a_node_time_sliced_past_64_gpus_still_takes_pods_that_ask_for_no_gpu() -> None:
    # 8 GPUs time-sliced 10 ways advertise 80 nvidia.com/gpu, more than a node holds: the node's
    # GPUs are not offered, but its CPU and memory are, and it still counts among the nodes.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=8)
    with capture_logs() as logs:
        NodeHandler(s).apply("ADDED", kit.node("ts", 80, "NVIDIA-A100-SXM4-80GB", **{"nvidia.com/gpu.replicas": "10"}))
    assert any("more GPUs than a node holds" in str(e.get("warning")) for e in logs), logs
    cpu = kit.pod("cpu", "s")
    cpu["metadata"].update({"namespace": "default", "uid": "uid-cpu"})
    cpu["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "ts"}
    gpu = kit.pod("gpu", "s", gpus=1)
    gpu["metadata"].update({"namespace": "default", "uid": "uid-gpu"})
    gpu["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "ts"}
    s._pending.apply("ADDED", cpu)
    s._pending.apply("ADDED", gpu)
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    assert api.bound == ["default/cpu"]
    assert s.cache.placement("default/cpu") is not None
    told = api.failed("default/gpu")
    assert told, api.events
    assert told[0].startswith("0/2 nodes are available"), told


def test_a_replica_that_lost_the_lead_does_not_keep_exporting_its_last_solve() -> None:
    """Dashboards read the leader's gauges, and a scrape may well still reach the old leader:
    the solve gap and fragmentation its last batch measured are no longer the cluster's."""
    s = one_node_scheduler(RecordingApi(), gpus=1)
    s._leadership(True)
    s.metrics.observe_batch(3, 0.2, 0.25)
    s.metrics.set_cluster(1, 0.0, 0.4, 0)
    s._leadership(False)
    text = s.metrics.render()[0].decode().splitlines()
    assert "gpusched_is_leader 0.0" in text
    assert "gpusched_solve_gap_ratio NaN" in text
    assert "gpusched_gpu_fragmentation_ratio NaN" in text


def _gang_scheduler(policy: str, gpus: int) -> tuple[Scheduler, RecordingApi]:
    from gpusched.daemon import DaemonSettings
    from gpusched.kube.binder import Binder
    from gpusched.kube.client import Kube
    from tests.doubles import IdleClient

    api = RecordingApi()
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy=policy), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    NodeHandler(s).apply("ADDED", kit.node("n0", gpus, "A100"))
    return s, api


@pytest.mark.parametrize("policy", ["bestfit", "cpsat"])
async def test_a_gang_whose_minimum_fits_runs_and_its_last_member_follows_when_room_comes(policy: str) -> None:
    """At least 2 of 3 members, room for 2: two are bound (as Coscheduling's minMember starts a
    gang), the third is told it waits for room beside them, and is bound on its own once a node
    with room comes."""
    s, api = _gang_scheduler(policy, gpus=2)
    for name in ("m1", "m2", "m3"):
        s._pending.apply("ADDED", member_pod(name, gang="g"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert len(api.bound) == 2, api.events
    [left] = {"default/m1", "default/m2", "default/m3"} - set(api.bound)
    [told] = api.failed(left)
    assert told.startswith(
        "gang default/g: 2 of its members placed, at least its minimum; this member is placed beside them once "
        "it fits: 0/1 nodes are available"
    ), told
    for key in api.bound:  # the watch shows them bound
        name = key.removeprefix("default/")
        s._pending.apply("DELETED", member_pod(name, gang="g"))
        s._bound.apply("ADDED", member_pod(name, gang="g", node="n0"))
    if s.queue.counts().active:  # woken by its peers' binds: weighed beside them, it still fits nowhere
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
        await settle(s)
        assert api.failed(left)[-1].startswith("gang default/g: its pending member (beside 2 running) does not fit;")
    assert s.queue.counts().unschedulable == 1
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    drawn = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in drawn] == [left]
    await s.schedule_batch(drawn)
    await settle(s)
    assert api.bound[-1] == left
