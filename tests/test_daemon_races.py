"""The scheduler's bookkeeping when the cluster changes between a batch's draw and its binds.

These drive a real ``Scheduler`` (queue, cache, solver) with watch events as the API server
sends them; only the Binding's answer is scripted, since the races are in what happens around
it (the API-server tests in tests/e2e cover the Bindings themselves).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon import scheduler as daemon
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube, RateLimiter, Response
from gpusched.model import Pod
from tests.doubles import IdleClient, member_pod, one_node_scheduler, settle
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0
"""How long a batch may take to be drawn: ample for a busy machine, and well short of the minute
after which the queue retries parked pods anyway (a pod never woken would be drawn only then)."""


class _Answers:
    """Bindings answered as scripted (BOUND unless told), recorded; Events and conditions dropped."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[BindResult, str]] = {}
        self.bound: list[str] = []
        self.held: dict[str, asyncio.Event] = {}
        """Bindings that wait for their event before answering."""
        self.deleted: set[str] = set()
        self.read_back: list[str] = []
        self.unanswered = 0
        """Read-backs the API server cannot answer before it does."""
        self.settles: list[tuple[BindResult, str]] = []
        """What the read-backs after a Binding of unknown outcome find, in turn; then nothing."""
        self.sending: set[str] = set()
        """Bindings sent and not answered yet (as ``Binder.sending``)."""

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.bound.append(pod.key)
        self.sending.add(pod.key)
        try:
            if pod.key in self.held:
                await self.held[pod.key].wait()
            return self.results.get(pod.key, (BindResult.BOUND, ""))
        finally:
            self.sending.discard(pod.key)

    async def event(self, *_: Any, **__: Any) -> None:
        pass

    async def exists(self, pod: Pod) -> bool | None:
        self.read_back.append(pod.key)
        if self.unanswered:
            self.unanswered -= 1
            return None
        return pod.key not in self.deleted

    async def settle(self, pod: Pod, node: str, cause: str) -> tuple[BindResult, str]:
        self.read_back.append(pod.key)
        return self.settles.pop(0) if self.settles else (BindResult.UNKNOWN, f"{cause}; and no answer")

    async def unschedulable(self, *_: Any, **__: Any) -> None:
        pass


def _scheduler(gpus: int) -> tuple[Scheduler, _Answers]:
    answers = _Answers()
    return one_node_scheduler(answers, gpus), answers


async def test_a_gang_whose_member_is_deleted_during_the_solve_binds_no_member() -> None:
    s, answers = _scheduler(gpus=2)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", member_pod(name, gang="g"))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    s._pending.apply("DELETED", member_pod("m1", gang="g"))  # after the draw, before the binds
    await s.schedule_batch(batch)
    await settle(s)
    assert answers.bound == []  # m2 alone would run below the gang's minimum of 2
    assert "default/m2" in s.queue
    assert "default/m1" not in s.queue
    assert s.cache.snapshot().state.gpu_used.sum() == 0


async def test_capacity_freed_by_a_bind_that_finds_its_pod_gone_wakes_the_parked() -> None:
    s, answers = _scheduler(gpus=1)
    answers.results["default/a"] = (BindResult.GONE, "pod deleted")
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))  # a placed, b parked
    await settle(s)
    # a's Binding found it deleted: its GPU is free again, and b is drawn at once.
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in batch] == ["default/b"]


@pytest.mark.parametrize("unanswered", [0, 2])
async def test_a_pod_bound_and_deleted_before_a_relist_that_missed_it_frees_its_gpu(
    unanswered: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon, "READ_BACK_RETRY_S", 0.01)
    s, answers = _scheduler(gpus=1)
    answers.unanswered = unanswered  # the API server cannot say at first: asked again
    answers.held["default/a"] = asyncio.Event()
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))  # a placed, b parked
    await asyncio.sleep(0)
    # While a's Binding is in flight it lands, a is deleted, and then a relist (a watch that
    # expired) reads the bound pods: a is in neither the list nor any later watch event.
    s._bound.replace([])
    answers.deleted.add("default/a")
    # The relist woke b, and b is tried at once: a still holds the GPU, so b is parked again.
    again = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in again] == ["default/b"]
    await s.schedule_batch(again)
    assert s.queue.counts().unschedulable == 1
    answers.held["default/a"].set()
    await settle(s)
    assert answers.read_back == ["default/a"] * (1 + unanswered)
    assert s.cache.snapshot().state.gpu_used.sum() == 0  # a is gone: its GPU is free
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)  # b woken by the read-back
    assert [r.key for r in batch] == ["default/b"]
    await s.schedule_batch(batch)
    await settle(s)
    assert answers.bound == ["default/a", "default/b"]


async def test_a_bind_that_lands_while_the_scheduler_drains_still_has_its_event_written() -> None:
    s, answers = _scheduler(gpus=1)
    written: list[str] = []

    async def event(pod: Pod, reason: str, *_: Any, **__: Any) -> None:
        await asyncio.sleep(0.05)  # a request to the API server
        written.append(f"{reason}/{pod.key}")

    answers.event = event  # type: ignore[method-assign]
    answers.held["default/a"] = asyncio.Event()
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await asyncio.sleep(0)  # a's Binding is in flight when SIGTERM comes
    asyncio.get_running_loop().call_later(0.1, answers.held["default/a"].set)
    await s.drain(timeout=DRAWN_WITHIN_S)
    assert written == ["Scheduled/default/a"]


async def test_a_binding_the_api_server_refuses_is_told_on_the_pod_and_retried() -> None:
    """A webhook or a missing permission refuses the Binding: the pod says why (as kube-scheduler's
    "Binding rejected"), and is tried again after its backoff."""
    s, answers = _scheduler(gpus=1)
    events: list[tuple[str, str, str]] = []

    async def event(pod: Pod, reason: str, message: str, kind: str = "Normal", fenced: bool = False) -> None:
        events.append((reason, kind, message))

    answers.event = event  # type: ignore[method-assign]
    answers.results["default/a"] = (BindResult.FAILED, "403 Forbidden: admission webhook denied the request")
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert events == [
        ("FailedScheduling", "Warning", "Binding rejected: 403 Forbidden: admission webhook denied the request")
    ]
    assert s.queue.counts().backoff == 1  # tried again, not forgotten
    del answers.results["default/a"]  # the webhook lets it through now
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a", "default/a"]
    assert events[-1][0] == "Scheduled"


LOST = (BindResult.UNKNOWN, "connection lost; and reading the pod failed: connection lost")


@pytest.fixture
def unknown(monkeypatch: pytest.MonkeyPatch) -> tuple[Scheduler, _Answers]:
    """One GPU; a's Binding will end with its outcome unknown; read-backs 10 ms apart."""
    monkeypatch.setattr(daemon, "READ_BACK_RETRY_S", 0.01)
    s, answers = _scheduler(gpus=1)
    answers.results["default/a"] = LOST
    return s, answers


async def _unknown_bind_of_a_then_b_waits(s: Scheduler, answers: _Answers) -> None:
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))  # a placed, b parked


async def test_a_binding_of_unknown_outcome_keeps_its_gpu_until_the_pod_is_read_back_bound(
    unknown: tuple[Scheduler, _Answers],
) -> None:
    s, answers = unknown
    await _unknown_bind_of_a_then_b_waits(s, answers)
    await asyncio.sleep(0.05)  # read back a few times, no answer
    s.queue.move_all()  # something wakes b while a's outcome is unknown
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    answers.settles = [(BindResult.BOUND, "")]  # then the API server answers
    await asyncio.wait_for(settle(s), DRAWN_WITHIN_S)
    assert len(answers.read_back) >= 2
    assert answers.bound == ["default/a"]  # b was not given the GPU a may have held
    assert s.cache.placement("default/a") == ("n0", (0,))
    assert not s.cache.is_assumed("default/a")
    assert "default/a" not in s.queue
    assert s.queue.counts().unschedulable == 1  # b waits for a change in the cluster


async def test_a_binding_of_unknown_outcome_read_back_unbound_frees_the_gpu_and_retries_the_pod(
    unknown: tuple[Scheduler, _Answers],
) -> None:
    s, answers = unknown
    answers.settles = [(BindResult.FAILED, "connection lost")]
    await _unknown_bind_of_a_then_b_waits(s, answers)
    await asyncio.wait_for(settle(s), DRAWN_WITHIN_S)
    assert s.cache.snapshot().state.gpu_used.sum() == 0
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in batch] == ["default/b"]  # woken at once; a waits out its backoff
    assert "default/a" in s.queue


async def test_a_binding_of_unknown_outcome_is_settled_by_the_watch_when_reads_keep_failing(
    unknown: tuple[Scheduler, _Answers],
) -> None:
    s, answers = unknown
    await _unknown_bind_of_a_then_b_waits(s, answers)
    await asyncio.sleep(0.05)  # a few read-backs, none answered
    assert s.cache.is_assumed("default/a")
    bound = member_pod("a", node="n0")
    s._bound.apply("MODIFIED", bound)
    s._pending.apply("MODIFIED", bound)
    await asyncio.wait_for(settle(s), DRAWN_WITHIN_S)
    assert answers.bound == ["default/a"]
    assert s.cache.placement("default/a") == ("n0", (0,))
    assert "default/a" not in s.queue
    assert s.queue.counts().unschedulable == 1


async def test_a_read_back_that_raises_is_tried_again_rather_than_leaving_the_pod_in_flight(
    unknown: tuple[Scheduler, _Answers],
) -> None:
    s, answers = unknown
    calls = 0
    real = answers.settle

    async def flaky(pod: Pod, node: str, cause: str) -> tuple[BindResult, str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("token refresh failed")
        return await real(pod, node, cause)

    answers.settle = flaky  # type: ignore[method-assign]
    answers.settles = [(BindResult.FAILED, "not bound")]
    await _unknown_bind_of_a_then_b_waits(s, answers)
    await asyncio.wait_for(settle(s), DRAWN_WITHIN_S)
    assert calls == 2
    assert s.queue.counts().in_flight == 0
    assert s.cache.snapshot().state.gpu_used.sum() == 0  # read back unbound: freed


@pytest.mark.parametrize(("where", "gone"), [("elsewhere", False), ("", True), ("n0", False)])
async def test_a_binding_of_unknown_outcome_settled_by_the_watch_elsewhere_or_gone_frees_nothing_twice(
    where: str, gone: bool, unknown: tuple[Scheduler, _Answers]
) -> None:
    """Only a pod the watch shows on the node it was bound to is told it was scheduled."""
    s, answers = unknown
    events: list[str] = []

    async def event(pod: Pod, reason: str, message: str, kind: str = "Normal", fenced: bool = False) -> None:
        events.append(f"{reason}: {message}")

    answers.event = event  # type: ignore[method-assign]
    await _unknown_bind_of_a_then_b_waits(s, answers)
    NodeHandler(s).apply("ADDED", kit.node("elsewhere", 1, "A100"))
    await asyncio.sleep(0.05)
    bound = member_pod("a", node=where or "n0")  # bound by us (gone: then deleted) or by another instance
    s._bound.apply("MODIFIED", bound)
    s._pending.apply("MODIFIED", bound)
    if gone:
        s._bound.apply("DELETED", bound)
    await asyncio.wait_for(settle(s), DRAWN_WITHIN_S)
    assert "default/a" not in s.queue
    assert s.queue.counts().in_flight == 0
    if gone:
        assert s.cache.placement("default/a") is None
        assert s.cache.snapshot().state.gpu_used.sum() == 0
    else:
        assert s.cache.placement("default/a")[0] == where  # type: ignore[index]
        assert s.cache.snapshot().state.gpu_used.sum() == 1000  # counted once, where it runs
    assert answers.bound == ["default/a"]
    scheduled = [e for e in events if e.startswith("Scheduled")]
    assert scheduled == (["Scheduled: Successfully assigned default/a to n0 (GPUs 0)"] if where == "n0" else [])


async def test_shutdown_does_not_wait_for_a_binding_of_unknown_outcome_to_be_read_back(
    unknown: tuple[Scheduler, _Answers],
) -> None:
    """The next leader reads the pod afresh; the drain waits for binds and Events only."""
    s, answers = unknown
    await _unknown_bind_of_a_then_b_waits(s, answers)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await s.drain(5.0)
    assert loop.time() - start < 2.0
    assert [t.get_name() for t in s.pending_tasks()] == ["resolve:default/a"]
    for t in s.pending_tasks():
        t.cancel()


@pytest.mark.parametrize("deleted", [False, True])
async def test_a_pod_bound_while_a_relist_was_taken_keeps_its_gpu_until_read_back(deleted: bool) -> None:
    s, answers = _scheduler(gpus=1)
    answers.held["default/a"] = asyncio.Event()
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))  # a placed, b waits
    # The bound-pods watch expired and a list is sent; a's Binding lands (201) before its answer.
    answers.held["default/a"].set()
    await settle(s)
    if deleted:  # a was bound and deleted before the list: nothing on the watch will say so
        answers.deleted.add("default/a")
    s._bound.replace([])  # the list, taken before the Binding (or after the deletion)
    await settle(s)
    assert answers.read_back == ["default/a"]
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))  # the relist woke b
    await settle(s)
    # Bound, a holds the node's one GPU: b is not bound to it.  Gone, b takes it.
    assert answers.bound == (["default/a", "default/b"] if deleted else ["default/a"])


@pytest.mark.parametrize("cut_off", [False, True])
async def test_at_shutdown_the_lease_is_released_only_when_no_binding_was_cut_off(cut_off: bool) -> None:
    # A Binding cut off may still land: a successor that took the Lease at once could give its
    # room to another pod.  Then the Lease runs out instead.
    answers = _Answers()
    s = Scheduler(DaemonSettings(scheduler_name="s", policy="bestfit"), cast(Kube, IdleClient()))
    s.binder = cast(Binder, answers)
    NodeHandler(s).apply("ADDED", kit.node("n0", 1, "A100"))
    assert s.elector is not None
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    s.elector.release = release  # type: ignore[method-assign]
    s.elector.holds = lambda: True  # type: ignore[method-assign]
    s._leadership(True)
    if cut_off:
        answers.held["default/a"] = asyncio.Event()  # the API server does not answer in time
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await s.drain(0.3)
    cut = s.unfinished_binds()
    for t in s.pending_tasks():
        t.cancel()
    await s.give_up_lead(cut)
    assert (cut, released) == ((1, []) if cut_off else (0, [True]))


async def test_a_gpu_taken_by_another_scheduler_during_the_solve_is_not_bound_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan was made against the books at the draw; a pod kube-scheduler bound to the same GPU
    while the solver ran makes it wrong: nothing is bound, and the pod waits for room, not lost."""
    s, answers = _scheduler(gpus=1)
    loop = asyncio.get_running_loop()
    solve = daemon._solve

    def solve_while_another_binds(*args: Any, **kwargs: Any) -> Any:
        plan = solve(*args, **kwargs)
        # Handed to the loop before the plan is: the watch shows it before the plan comes back.
        loop.call_soon_threadsafe(s._bound.apply, "ADDED", member_pod("other", node="n0"))
        return plan

    monkeypatch.setattr(daemon, "_solve", solve_while_another_binds)
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == []
    assert "default/a" in s.queue
    assert s.cache.snapshot().state.gpu_used.sum() == 1000  # "other" only
    monkeypatch.setattr(daemon, "_solve", solve)
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == []
    assert s.queue.counts().unschedulable == 1  # told, and parked until the cluster changes


async def test_a_node_joining_leaves_a_node_full_of_guessed_and_known_pods_full() -> None:
    """kube-scheduler's pods name no GPUs: the books guess them.  A node joining rebuilds the books;
    a guess must not land on the GPU our pod names, or the next pod is bound to a full node."""
    s, answers = _scheduler(gpus=2)
    s.cache.snapshot()
    s._bound.apply("ADDED", member_pod("c", node="n0"))  # guessed on GPU 0
    s._bound.apply("ADDED", member_pod("b", node="n0"))  # guessed on GPU 1
    s._bound.apply("DELETED", member_pod("c", node="n0"))
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a"]
    held = s.cache.placement("default/a")
    assert held == ("n0", (0,))
    ours = member_pod("a", node="n0")
    ours["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0"
    s._pending.apply("DELETED", member_pod("a"))
    s._bound.apply("ADDED", ours)
    NodeHandler(s).apply("ADDED", kit.node("cpu-0", 0, ""))
    s._pending.apply("ADDED", member_pod("d"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a"]
    assert s.queue.counts().unschedulable == 1


def _during_the_solve(monkeypatch: pytest.MonkeyPatch, s: Scheduler, kind: str, node: dict[str, Any]) -> None:
    """The watch shows ``node`` (``kind``) while the next solve runs."""
    loop = asyncio.get_running_loop()
    solve = daemon._solve

    def solve_while_the_node_changes(*args: Any, **kwargs: Any) -> Any:
        plan = solve(*args, **kwargs)
        loop.call_soon_threadsafe(NodeHandler(s).apply, kind, node)
        monkeypatch.setattr(daemon, "_solve", solve)
        return plan

    monkeypatch.setattr(daemon, "_solve", solve_while_the_node_changes)


def _selecting(name: str, label: str) -> dict[str, Any]:
    obj = member_pod(name)
    obj["spec"]["nodeSelector"] = {label: "true"}
    return obj


async def test_a_plan_is_rechecked_node_by_node_name_against_the_nodes_as_they_are_after_the_solve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A label changed on another node, or one no pod reads, leaves the plan good: it is bound.
    The label the pod selects gone from its node, or its node deleted: nothing is bound, and the
    pod is drawn again."""
    s, answers = _scheduler(gpus=2)
    labelled = kit.node("n0", 2, "A100")
    labelled["metadata"]["labels"]["pool"] = "true"
    NodeHandler(s).apply("MODIFIED", labelled)
    other = kit.node("a-other", 1, "A100")  # before n0 in the books' order
    NodeHandler(s).apply("ADDED", other)
    relabelled = kit.node("a-other", 1, "A100")
    relabelled["metadata"]["labels"]["rack"] = "r7"
    _during_the_solve(monkeypatch, s, "MODIFIED", relabelled)
    s._pending.apply("ADDED", _selecting("a", "pool"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a"]

    _during_the_solve(monkeypatch, s, "MODIFIED", kit.node("n0", 2, "A100"))  # "pool" removed
    s._pending.apply("ADDED", _selecting("b", "pool"))
    problems = await _requeued(s, answers, "default/b")
    assert "selector" in " ".join(problems), problems

    NodeHandler(s).apply("MODIFIED", labelled)
    _during_the_solve(monkeypatch, s, "DELETED", labelled)
    assert await _requeued(s, answers, "default/b") == ["node n0 is gone"]


async def _requeued(s: Scheduler, answers: _Answers, key: str) -> list[str]:
    """Draw and solve a batch whose plan the recheck refuses: nothing more bound, ``key`` drawn
    again; the problems the warning names."""
    bound = list(answers.bound)
    with capture_logs() as logs:
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == bound
    assert key in s.queue
    (warned,) = [e for e in logs if e["event"] == "plan no longer fits after the solve; batch requeued"]
    problems: list[str] = warned["problems"]
    return problems


async def test_a_plan_that_fails_the_independent_check_binds_nothing_and_the_batch_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A policy's plan is checked before any Binding: one that over-commits a GPU is refused and
    its pods are backed off, never bound and never dropped."""
    from dataclasses import replace

    s, answers = _scheduler(gpus=1)
    solve = daemon._solve

    def over_committing(*args: Any, **kwargs: Any) -> Any:
        plan, after, frag = solve(*args, **kwargs)
        (one,) = plan.assignments
        b = next(p for p in plan.unplaced)
        return replace(plan, assignments=(one, replace(one, pod=b)), unplaced=()), after, frag

    monkeypatch.setattr(daemon, "_solve", over_committing)
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    with capture_logs() as logs:
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
        await settle(s)
    assert answers.bound == []
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["plan rejected; batch requeued"]
    assert s.queue.counts().backoff == 2
    assert s.cache.snapshot().state.gpu_used.sum() == 0


def _gang_of_two_on_two_gpus() -> tuple[Scheduler, _Answers]:
    """m1 and m2 (a gang of 2) placed on n0's two GPUs; m1 bound, m2's Binding refused by a
    webhook; meanwhile x (no gang) came and was parked: no room."""
    s, answers = _scheduler(gpus=2)
    answers.results["default/m2"] = (BindResult.FAILED, 'admission webhook "quota.example" denied the request')
    answers.held["default/m2"] = asyncio.Event()
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", member_pod(name, gang="g"))
    return s, answers


async def _refused_after_x_parked(s: Scheduler, answers: _Answers) -> None:
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await asyncio.sleep(0)
    s._pending.apply("DELETED", member_pod("m1", gang="g"))
    s._bound.apply("ADDED", member_pod("m1", gang="g", node="n0"))  # m1's Binding landed
    s._pending.apply("ADDED", member_pod("x"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    assert s.queue.counts().unschedulable == 1
    answers.held["default/m2"].set()
    await settle(s)


async def test_a_member_whose_binding_is_refused_after_its_peer_was_bound_keeps_its_room() -> None:
    """Bindings are one pod at a time: a refused member is retried into the room it was placed
    in, before any other pod may take it, so that its gang is not left running short."""
    s, answers = _gang_of_two_on_two_gpus()
    s.queue.initial_backoff = 0.01
    await _refused_after_x_parked(s, answers)
    assert s.cache.nomination("default/m2") == ("n0", (1,), 0)
    del answers.results["default/m2"]  # the webhook lets it through now
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in batch] == ["default/m2"]
    await s.schedule_batch(batch)
    await settle(s)
    assert answers.bound == ["default/m1", "default/m2", "default/m2"]
    assert "default/x" in s.queue  # still waiting: there was no room for it


async def test_a_member_refused_again_and_again_gives_its_room_up() -> None:
    """A webhook that refuses the member for good must not keep the GPU idle for ever."""
    s, answers = _gang_of_two_on_two_gpus()
    s.queue.initial_backoff = 0.01
    await _refused_after_x_parked(s, answers)
    for _ in range(daemon.GANG_ROOM_TRIES + 1):
        if "default/x" in answers.bound:
            break
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
        await settle(s)
    assert answers.bound.count("default/m2") == daemon.GANG_ROOM_TRIES
    assert answers.bound[-1] == "default/x"
    assert s.cache.nomination("default/m2") is None


async def test_a_member_deleted_while_its_refused_binding_was_in_flight_keeps_no_room() -> None:
    s, answers = _gang_of_two_on_two_gpus()
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await asyncio.sleep(0)
    s._pending.apply("DELETED", member_pod("m1", gang="g"))
    s._bound.apply("ADDED", member_pod("m1", gang="g", node="n0"))
    s._pending.apply("DELETED", member_pod("m2", gang="g"))  # the job deleted meanwhile
    answers.held["default/m2"].set()
    await settle(s)
    assert "default/m2" not in s.queue
    assert s.cache.nomination("default/m2") is None


async def test_feature_discovery_stamping_a_node_each_minute_is_no_change_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU feature discovery rewrites nvidia.com/gfd.timestamp on every node each minute: that
    neither voids the batch being solved nor wakes the pods parked as unschedulable."""
    s, answers = _scheduler(gpus=1)

    def stamped(at: str) -> dict[str, Any]:
        node = kit.node("n0", 1, "A100")
        node["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = at
        return node

    NodeHandler(s).apply("MODIFIED", stamped("1765100000"))
    _during_the_solve(monkeypatch, s, "MODIFIED", stamped("1765100060"))
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a"]
    s._pending.apply("ADDED", member_pod("b"))  # no room: parked
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert s.queue.counts().unschedulable == 1
    NodeHandler(s).apply("MODIFIED", stamped("1765100120"))
    assert s.queue.counts().unschedulable == 1  # not woken for nothing


async def test_a_binding_withdrawn_because_its_node_went_away_places_the_pod_again_at_once() -> None:
    s, answers = _scheduler(gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    answers.results["default/a"] = (BindResult.WITHDRAWN, "node n0 is gone")
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert s.queue.counts().active == 1  # not backed off: no fault of the pod's
    assert s.cache.snapshot().state.gpu_used.sum() == 0  # what it was to take is not held
    answers.results.clear()
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == ["default/a", "default/a"]


class _Throttled:
    """A client whose rate limiter lets no request go until ``go`` is set; a request sent is
    never answered (an API server that holds it)."""

    def __init__(self) -> None:
        self.limiter = RateLimiter(50, 100)
        self.go = asyncio.Event()

    async def request(self, *_: Any, before_send: Callable[[], None] | None = None, **__: Any) -> Response:
        await self.go.wait()
        if before_send is not None:
            before_send()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("sent", [False, True])
async def test_at_shutdown_a_binding_still_waiting_for_a_token_keeps_no_lease(sent: bool) -> None:
    """A Binding never sent cannot land: a rollout during a burst, with binds waiting for the
    client's rate, releases the Lease so that the other replica takes over at once, rather
    than after the Lease ran out.  One sent and unanswered keeps it."""
    api = _Throttled()
    if sent:
        api.go.set()
    s = Scheduler(DaemonSettings(scheduler_name="s", policy="bestfit"), cast(Kube, IdleClient()))
    kube = cast(Kube, api)
    s.binder = Binder(kube, s.identity, events=kube, leading=lambda: s.is_leader, lead_left=lambda: 5.0)
    NodeHandler(s).apply("ADDED", kit.node("n0", 1, "A100"))
    assert s.elector is not None
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    s.elector.release = release  # type: ignore[method-assign]
    s.elector.holds = lambda: True  # type: ignore[method-assign]
    s._leadership(True)
    s._pending.apply("ADDED", member_pod("a"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await s.drain(0.3)
    cut = s.unfinished_binds()
    for t in s.pending_tasks():
        t.cancel()
    await asyncio.gather(*s.pending_tasks(), return_exceptions=True)
    await s.give_up_lead(cut)
    assert (cut, released) == ((1, []) if sent else (0, [True]))


async def test_binds_dropped_when_the_lead_is_lost_count_as_a_lost_lead_not_as_failures() -> None:
    """A bind still waiting when the lead passes is dropped for the next leader to place: an alert
    on failed Bindings must not fire at every hand-over."""
    s, answers = _scheduler(gpus=2)
    for name in ("a", "b"):
        s._pending.apply("ADDED", member_pod(name))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    s._leadership(False)  # before the binds got their slots
    await settle(s)
    assert answers.bound == []
    scraped = s.metrics.render()[0].decode()
    assert 'gpusched_bind_errors_total{reason="failed"} 0.0' in scraped
    assert 'gpusched_bind_errors_total{reason="lead_lost"} 2.0' in scraped


def _sharing(name: str, milli: int, node: str = "", gang: str = "") -> dict[str, Any]:
    """A pod asking for ``milli`` thousandths of one GPU (``gpusched.io/gpu-milli``)."""
    obj = member_pod(name, gang=gang, node=node) if gang else kit.pod(name, "s", milli=milli, node_name=node)
    obj["metadata"].setdefault("namespace", "default")
    obj["metadata"].setdefault("uid", f"uid-{name}")
    if gang:
        obj["spec"]["containers"][0]["resources"]["limits"].pop("nvidia.com/gpu", None)
        obj["metadata"]["annotations"]["gpusched.io/gpu-milli"] = str(milli)
    return obj


@pytest.mark.parametrize("gang", ["", "g"])
async def test_a_pod_whose_request_changes_during_the_solve_is_placed_again_as_it_is_now(
    monkeypatch: pytest.MonkeyPatch, gang: str
) -> None:
    """Pod a asks for 300 thousandths of the GPU, 700 of which c holds; its annotation is raised
    to 1000 while the batch is solved.  Bound as solved, the GPU would be booked 1700/1000: it is
    placed again as it is now (and, past the GPU, not bound); a gang with it, likewise whole."""
    s, answers = _scheduler(gpus=1)
    s._bound.apply("ADDED", _sharing("c", 700, node="n0"))
    loop = asyncio.get_running_loop()
    solve = daemon._solve

    def solve_then_change(*args: Any, **kwargs: Any) -> Any:
        plan = solve(*args, **kwargs)
        loop.call_soon_threadsafe(s._pending.apply, "MODIFIED", _sharing("a", 1000, gang=gang))
        return plan

    monkeypatch.setattr(daemon, "_solve", solve_then_change)
    s._pending.apply("ADDED", _sharing("a", 300, gang=gang))
    if gang:
        s._pending.apply("ADDED", _sharing("b", 100, gang=gang))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == []
    monkeypatch.undo()
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert answers.bound == []  # 1000 thousandths do not fit beside c's 700
    record = s.queue.record("default/a")
    assert record is not None
    assert record.pod.gpu_milli == 1000
