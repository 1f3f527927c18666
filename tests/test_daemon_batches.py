"""Where a batch's pods end up when its solve, its plan or its binds go wrong.

These drive a real ``Scheduler`` (queue, cache, policy) with watch events as the API server
sends them; only the API server's answers (Bindings, Events, conditions) are scripted.  What is
checked is what a user sees: each pod bound once, or told why it waits, and drawn again when it
may fit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpusched import daemon
from gpusched.daemon import DaemonSettings, Scheduler, _NodeHandler
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube, RateLimiter
from gpusched.model import Pod
from gpusched.state.records import PodRecord
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0


class _Client:
    """What the scheduler reads of its client before any request: the rate limiter."""

    def __init__(self) -> None:
        self.limiter = RateLimiter(50, 100)

    def sibling(self) -> _Client:
        return self


class _ApiServer:
    """Every Binding succeeds; Bindings and Events recorded, conditions dropped."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        """(pod key, reason, message) of every Event written."""

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.bound.append(pod.key)
        return BindResult.BOUND, ""

    async def event(self, pod: Pod, reason: str, message: str, kind: str = "Normal") -> None:
        self.events.append((pod.key, reason, message))

    async def unschedulable(self, *_: Any, **__: Any) -> None:
        pass

    async def exists(self, pod: Pod) -> bool | None:
        return True

    def told(self, key: str) -> list[str]:
        return [reason for k, reason, _ in self.events if k == key]


def _scheduler(gpus: int) -> tuple[Scheduler, _ApiServer]:
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit"), cast(Kube, _Client()))
    api = _ApiServer()
    s.binder = cast(Binder, api)
    _NodeHandler(s).apply("ADDED", kit.node("n0", gpus, "A100"))
    return s, api


def _pod(name: str, gang: str = "", models: tuple[str, ...] = (), node: str = "") -> dict[str, Any]:
    obj = kit.pod(name, "s", gpus=1, models=models, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    if gang:
        obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = gang
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "2"
    return obj


async def _settle(s: Scheduler) -> None:
    await asyncio.sleep(0)
    while s.pending_tasks():
        await asyncio.wait(s.pending_tasks())


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
        s._pending.apply("ADDED", _pod(name, gang="g"))
    s._pending.apply("ADDED", _pod("solo"))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    held = _HeldSolve(monkeypatch)
    await held.during(s, batch, lambda: s._pending.apply("DELETED", _pod("m1", gang="g")))
    await _settle(s)
    assert api.bound == []
    assert api.told("default/solo") == []  # not "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"

    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert sorted(r.key for r in batch) == ["default/m2", "default/solo"]
    await s.schedule_batch(batch)
    await _settle(s)
    assert api.bound == ["default/solo"]
    assert api.told("default/m2") == ["FailedScheduling"]  # 1 of at least 2 members pending


async def test_a_pod_left_out_for_one_bound_elsewhere_during_the_solve_takes_the_gpu_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan gives n0's only GPU to a, so b is left out; meanwhile a is bound to n1 by another
    instance (an earlier leader's Binding landing late).  n0's GPU is idle: b is bound there."""
    s, api = _scheduler(gpus=1)
    _NodeHandler(s).apply("ADDED", kit.node("n1", 1, "H100"))
    for name in ("a", "b"):
        s._pending.apply("ADDED", _pod(name, models=("A100",)))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    held = _HeldSolve(monkeypatch)

    def bound_elsewhere() -> None:
        s._bound.apply("ADDED", _pod("a", models=("A100",), node="n1"))
        s._pending.apply("DELETED", _pod("a", models=("A100",)))

    await held.during(s, batch, bound_elsewhere)
    await _settle(s)
    assert api.bound == []
    assert api.told("default/b") == []

    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert [r.key for r in batch] == ["default/b"]
    await s.schedule_batch(batch)
    await _settle(s)
    assert api.bound == ["default/b"]
