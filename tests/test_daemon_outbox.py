"""The outbox of verdicts' writes: one waiting per pod and kind, the latest; bounded in number
and in how many run at once; never sent for a pod bound since the verdict."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from gpusched.daemon.outbox import Outbox
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube, RateLimiter, Response
from tests.doubles import RecordingApi, member_pod, one_node_scheduler, settle


async def _run(box: Outbox, started: int) -> None:
    workers = [asyncio.create_task(box.work()) for _ in range(started)]
    for w in workers:
        w.add_done_callback(box.worker_done)
    await asyncio.gather(*workers)
    await asyncio.sleep(0)  # the done callbacks run


async def test_a_newer_write_for_a_key_replaces_the_waiting_one_in_its_place() -> None:
    sent: list[str] = []

    def write(what: str) -> Any:
        async def go() -> None:
            sent.append(what)

        return go

    box = Outbox(workers=1)
    started = box.put("a", write("a1")) + box.put("b", write("b1")) + box.put("a", write("a2"))
    assert started == 1
    await _run(box, started)
    assert sent == ["a2", "b1"]
    assert len(box) == 0


async def test_beyond_the_limit_the_oldest_waiting_write_is_dropped() -> None:
    sent: list[int] = []

    def write(i: int) -> Any:
        async def go() -> None:
            sent.append(i)

        return go

    box = Outbox(workers=2, limit=3)
    started = sum(box.put(i, write(i)) for i in range(5))
    assert len(box) == 3
    assert box.dropped == 2
    await _run(box, started)
    assert sorted(sent) == [2, 3, 4]


async def test_no_more_than_workers_writes_run_at_once_and_a_failing_one_stops_none() -> None:
    running = peak = 0
    sent: list[int] = []

    def write(i: int) -> Any:
        async def go() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1
            if i == 3:
                raise RuntimeError("a bug in one write")
            sent.append(i)

        return go

    box = Outbox(workers=4)
    started = sum(box.put(i, write(i)) for i in range(40))
    assert started == 4
    await _run(box, started)
    assert peak == 4
    assert sorted(sent) == [i for i in range(40) if i != 3]
    assert box.put(99, write(99)) == 1  # the workers are done: a new write starts one again


async def test_verdicts_told_many_times_wait_as_one_and_none_is_sent_for_a_pod_bound_since() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    s._pending.apply("ADDED", member_pod("late"))
    s._pending.apply("ADDED", member_pod("waiting"))
    late = s.queue.record("default/late")
    waiting = s.queue.record("default/waiting")
    assert late is not None
    assert waiting is not None
    for i in range(1000):
        s.tell_unschedulable(waiting.pod, f"verdict {i}", "Insufficient nvidia.com/gpu")
    s.tell_unschedulable(late.pod, "0/1 nodes are available", "Insufficient nvidia.com/gpu")
    assert len(s.outbox) <= 4  # an Event and a condition per pod, however often told
    s.cache.assume(late.pod, "n0", (0,))  # bound before the verdict's Event went out
    await settle(s)
    assert api.failed("default/waiting") == ["verdict 999"]
    assert api.failed("default/late") == []


async def test_a_verdict_still_waiting_when_its_pod_is_bound_is_never_sent_even_once_the_pod_is_gone() -> None:
    """x is told it does not fit, the verdict waits behind others, x is bound meanwhile and,
    a short Job, finishes and leaves the books before the verdict's turn: it is not sent (a
    FailedScheduling after Scheduled, and PodScheduled=False on a pod that ran)."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=1)
    s._pending.apply("ADDED", member_pod("x"))
    record = s.queue.record("default/x")
    assert record is not None
    s.tell_unschedulable(record.pod, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", "Unschedulable")
    s._bind_outcome(record.pod, "n0", (0,), BindResult.BOUND, "")  # its Binding, answered first
    s.cache.forget("default/x")  # finished and gone from the books before the verdict's turn
    s.queue.delete("default/x")
    await settle(s)
    assert api.failed("default/x") == []


async def test_a_worker_cancelled_before_it_ran_does_not_stall_the_outbox() -> None:
    sent: list[str] = []

    async def go() -> None:
        sent.append("late")

    box = Outbox(workers=1)
    assert box.put("a", go) == 1
    worker = asyncio.create_task(box.work())
    worker.add_done_callback(box.worker_done)
    worker.cancel()  # shut down before its first step
    await asyncio.gather(worker, return_exceptions=True)
    await asyncio.sleep(0)
    assert box.put("b", go) == 1  # a new worker is started for what still waits


async def test_a_write_put_as_the_last_worker_leaves_starts_a_worker_of_its_own() -> None:
    """Between a worker leaving its loop and its task's callbacks, a write may be put: it must
    not wait, unsent, for whatever write comes next (on a quiet cluster: none)."""
    box = Outbox(workers=1)
    sent: list[str] = []

    def write(what: str) -> Any:
        async def go() -> None:
            sent.append(what)

        return go

    assert box.put("a", write("a")) == 1
    task = asyncio.ensure_future(box.work())
    late: list[int] = []
    task.add_done_callback(lambda _: late.append(box.put("b", write("b"))))  # before the scheduler's
    task.add_done_callback(box.worker_done)
    await task
    await asyncio.sleep(0)
    assert late == [1]
    again = asyncio.ensure_future(box.work())
    again.add_done_callback(box.worker_done)
    await again
    await asyncio.sleep(0)
    assert sent == ["a", "b"]
    assert box.put("c", write("c")) == 1  # counted out once each: a worker starts again


class _EventsApi:
    """An API server that accepts every request and records the reasons of the Events posted."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.limiter = RateLimiter(50, 100)

    async def request(
        self, method: str, path: str, body: Any = None, before_send: Callable[[], None] | None = None, **_: Any
    ) -> Response:
        if before_send is not None:
            before_send()
        if path.endswith("/events"):
            self.reasons.append(body["reason"])
        return Response(201, {})


async def test_a_verdict_waiting_when_the_lead_is_lost_is_not_posted_but_a_bind_done_is_still_reported() -> None:
    """After the lead passed, the next leader speaks for the pods: this instance's FailedScheduling
    (or MIG Events) would contradict it.  A Scheduled Event reports a Binding that was made, and
    is sent all the same."""
    api = _EventsApi()
    s = one_node_scheduler(RecordingApi(), gpus=1)
    kube = cast(Kube, api)
    s.binder = Binder(kube, s.identity, events=kube, leading=lambda: s.is_leader)
    s._pending.apply("ADDED", member_pod("waiting"))
    waiting = s.queue.record("default/waiting")
    assert waiting is not None
    s.tell_unschedulable(waiting.pod, "0/1 nodes are available", "Insufficient nvidia.com/gpu")
    s._leadership(False)  # before the outbox sent it
    await settle(s)
    assert api.reasons == []
    await s.binder.object_event({"kind": "Node", "name": "n0"}, "MigRestore", "asked", fenced=True)
    await s.binder.event(waiting.pod, "Scheduled", "Successfully assigned default/waiting to n0")
    assert api.reasons == ["Scheduled"]
