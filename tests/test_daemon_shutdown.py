"""Shutdown: what the daemon stops first, and what its drain waits for."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon import run as daemon_run
from gpusched.kube.watch import Reflector
from tests.doubles import IdleClient
from tests.test_daemon_mig import MigApi, add_node, batch, pod, scheduler, stop


async def test_the_drain_does_not_wait_for_a_mig_layout_waiting_for_the_mig_manager() -> None:
    """A layout asked for waits for the MIG manager for minutes: a shutdown meanwhile must not
    take the whole drain (and so the grace period) waiting for it; the next leader finds it."""
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0, "timeoutSeconds": 600}})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert [n for n, _ in api.labelled] == ["n"]  # asked for; the MIG manager is yet to answer
    assert any(t.get_name() == "mig:n" for t in s.pending_tasks())
    began = time.monotonic()
    await s.drain(timeout=5.0)
    assert time.monotonic() - began < 1.0
    stop(s)


async def test_a_layout_waiting_for_the_kubelets_copy_is_not_waited_for_either() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 120}})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert api.written
    assert not api.labelled  # labelled once the kubelet has copied it
    began = time.monotonic()
    await s.drain(timeout=5.0)
    assert time.monotonic() - began < 1.0
    stop(s)


class _Kube(IdleClient):
    async def warm(self, connections: int) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_at_shutdown_the_loops_that_evict_or_relabel_stop_before_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During the drain (up to 10 s) nothing new may start: no batch, and no consolidation
    eviction, MIG restore or connection warming either."""

    async def connect(*_: Any) -> _Kube:
        return _Kube()

    async def watch(self: Reflector) -> None:
        if self.name == "nodes":
            await asyncio.sleep(0.05)  # a watch that ends stops the daemon
            return
        await asyncio.Event().wait()

    running_at_drain: list[str] = []

    async def drain(self: Scheduler, timeout: float) -> None:
        running_at_drain.extend(t.get_name() for t in asyncio.all_tasks() if not t.done())

    monkeypatch.setattr(daemon_run, "connect", connect)
    monkeypatch.setattr(Reflector, "run", watch)
    monkeypatch.setattr(Scheduler, "drain", drain)
    settings = DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit", metrics_port=0)
    assert await daemon_run.run_daemon(settings) == 1
    assert running_at_drain  # the drain was reached
    assert {"schedule", "consolidate", "mig-restore", "keep-warm"}.isdisjoint(running_at_drain)


async def test_the_drain_does_not_wait_for_a_backlog_of_verdicts() -> None:
    """Three thousand pods that do not fit fill the outbox with their FailedScheduling verdicts,
    which the Events client sends at its rate: a shutdown must not hold the lead (and the
    hand-over) for them; the next leader tells them again."""
    from tests.doubles import RecordingApi, member_pod, one_node_scheduler

    class SlowApi(RecordingApi):
        async def event(self, *_: Any, **__: Any) -> None:
            await asyncio.sleep(60)

    s = one_node_scheduler(SlowApi(), gpus=1)
    for i in range(50):
        s._pending.apply("ADDED", member_pod(f"p{i}"))
        record = s.queue.record(f"default/p{i}")
        assert record is not None
        s.tell_unschedulable(record.pod, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", "Unschedulable")
    await asyncio.sleep(0)
    assert any(t.get_name() == "outbox" for t in s.pending_tasks())
    began = time.monotonic()
    await s.drain(timeout=5.0)
    assert time.monotonic() - began < 1.0
    for t in s.pending_tasks():
        t.cancel()
