"""A running scheduler following its ConfigMap: an accepted document acts as a restart with it
would, a rejected one changes nothing but the rejection count.

These drive a real ``Scheduler`` with the ConfigMap's watch events as the API server sends them.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.config import GpuschedConfig, load_config
from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder
from gpusched.kube.client import Kube
from gpusched.kube.configmap import ConfigMapHandler
from gpusched.state.records import PodRecord
from tests.doubles import IdleClient, RecordingApi
from tests.e2e import kit
from tests.factories import pod
from tests.test_daemon_utilisation import pod as kit_pod

NAMESPACE, NAME = "gpusched-system", "gpu-scheduler-config"


class _Events:
    """Records the Events the scheduler writes about objects."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def object_event(self, involved: dict[str, str], reason: str, message: str, kind: str) -> None:
        self.events.append((involved["name"], reason, message))


def _scheduler(config: GpuschedConfig | None = None, follow: bool = True) -> tuple[Scheduler, _Events]:
    settings = DaemonSettings(
        scheduler_name="s",
        leader_elect=False,
        policy="bestfit",
        namespace=NAMESPACE,
        config_map=NAME if follow else None,
        config=config or GpuschedConfig(),
    )
    s = Scheduler(settings, cast(Kube, IdleClient()))
    events = _Events()
    s.binder = cast(Binder, events)
    return s, events


def _configmap(text: str, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": rv, "uid": "cm-uid"},
        "data": {"config.yaml": text},
    }


def _record(name: str) -> PodRecord:
    return PodRecord(pod(name), uid=name, scheduler="s")


def _sample(s: Scheduler, series: str, **labels: str) -> float | None:
    return s.metrics.registry.get_sample_value(series, labels)


def _edit(s: Scheduler, text: str, rv: str) -> None:
    watch = next(r.handler for r in s.reflectors if r.name == "config")
    watch.apply("MODIFIED", _configmap(text, rv))


async def test_a_reloaded_batching_section_acts_as_a_restart_with_it_would() -> None:
    text = "batching:\n  maxSize: 500\n  maxWaitSeconds: 2\n"
    restarted, _ = _scheduler(load_config(text), follow=False)
    s, _ = _scheduler()
    _edit(s, text, "2")
    assert (s.queue.max_size, s.queue.max_wait) == (500, 2.0)
    # As many binds may wait before the next batch is drawn as after a restart with the document.
    assert s.max_binds_in_flight == restarted.max_binds_in_flight == 1000
    assert _sample(s, "gpusched_config_reloads_total", result="ok") == 1


async def test_a_rejected_document_changes_nothing_and_says_which_field() -> None:
    s, events = _scheduler()
    _edit(s, "weights:\n  fragmentation: 77\nbatching:\n  maxSize: 32\n", "2")
    before = (s.config, s.queue.max_size, s.queue.max_wait, s.max_binds_in_flight)
    assert _sample(s, "gpusched_solver_weight", term="fragmentation") == 77

    # A valid weight beside a bad one: none of it is taken.
    _edit(s, "weights:\n  fragmentation: 5\nbatching:\n  maxSize: 0\n", "3")
    for task in s.pending_tasks():  # the Warning Event is written by a task of its own
        await task
    assert (s.config, s.queue.max_size, s.queue.max_wait, s.max_binds_in_flight) == before
    assert _sample(s, "gpusched_solver_weight", term="fragmentation") == 77
    assert _sample(s, "gpusched_config_reloads_total", result="rejected") == 1
    assert _sample(s, "gpusched_config_reloads_total", result="ok") == 1
    [(name, reason, message)] = events.events
    assert (name, reason) == (NAME, "InvalidConfiguration")
    assert "batching.maxSize: " in message


async def test_a_reload_that_lands_while_the_first_policy_is_built_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first policy is built in a worker thread at start; a ConfigMap change delivered
    meanwhile must reach the solver, not be overwritten by the build that read the old weights."""
    from gpusched.daemon import scheduler as daemon

    s, _ = _scheduler()
    built_with: list[float] = []
    real_make_policy = daemon.make_policy

    def make_policy(name: str, cluster: Any, typical: Any, seed: int, params: Any) -> Any:
        built_with.append(params.weights.fragmentation)
        if len(built_with) == 1:  # the watch delivers the edit while this build runs
            _edit(s, "weights:\n  fragmentation: 77\n", "2")
        return real_make_policy(name, cluster, typical, seed, params)

    monkeypatch.setattr(daemon, "make_policy", make_policy)
    cluster = s.cache.snapshot().cluster
    await asyncio.to_thread(s._policy_for, cluster)  # as at start
    s._policy_for(cluster)  # the first batch
    assert built_with[-1] == 77


async def test_a_batch_being_gathered_closes_by_the_reloaded_size_and_wait() -> None:
    """A batch waits up to ``maxWaitSeconds`` for ``maxSize`` pods while binds keep the client
    busy; lowering either in the ConfigMap closes the batch being gathered by the new values."""
    s, _ = _scheduler(load_config("batching:\n  maxSize: 64\n  maxWaitSeconds: 60\n"))
    s.queue.busy = lambda: True  # binds in flight: no early close for a lone pod
    for name in ("a", "b", "c"):
        s.queue.add(_record(name))
    gathering = asyncio.ensure_future(s.queue.next_batch())
    await asyncio.sleep(0.05)
    assert not gathering.done()  # 3 of 64, a minute to go
    _edit(s, "batching:\n  maxSize: 2\n  maxWaitSeconds: 60\n", "2")
    batch = await asyncio.wait_for(gathering, 10)
    assert len(batch) == 2

    gathering = asyncio.ensure_future(s.queue.next_batch())
    await asyncio.sleep(0.05)
    assert not gathering.done()  # 1 of 2, a minute to go
    _edit(s, "batching:\n  maxSize: 2\n  maxWaitSeconds: 0.01\n", "3")
    batch = await asyncio.wait_for(gathering, 10)
    assert [r.key for r in batch] == ["default/c"]


class _Api(RecordingApi):
    async def object_event(self, involved: dict[str, str], reason: str, message: str, kind: str) -> None:
        self.events.append((involved["name"], reason, message))


async def test_a_configmap_never_valid_since_the_start_places_no_pod_on_the_defaults_and_says_why() -> None:
    # A restart (or a new replica) reads a document someone broke meanwhile: running on the
    # built-in defaults would drop tenants' limits, headroom, MIG and consolidation unasked.
    api = _Api()
    s, _ = _scheduler()
    s.binder = cast(Binder, api)
    NodeHandler(s).apply("ADDED", kit.node("n0", 1, "A100"))
    watch = next(r for r in s.reflectors if r.name == "config")
    cast(ConfigMapHandler, watch.handler).replace([])
    for r in s.reflectors:
        r.synced.set()
    s._pending.apply("ADDED", kit_pod("p"))
    task = asyncio.create_task(s.schedule_forever())
    try:
        ok, why = s.ready()
        assert not ok
        assert why.startswith(f"no valid configuration from ConfigMap {NAMESPACE}/{NAME} yet (the ConfigMap was")
        _edit(s, "weights:\n  fragmentation: -5\n", "2")
        await asyncio.sleep(0.5)
        assert api.bound == []
        ok, why = s.ready()
        assert "weights.fragmentation" in why
        assert why.endswith("fix it, and pods are placed once a valid document is in it")
        ((_, reason, message),) = [e for e in api.events if e[0] == NAME]
        assert reason == "InvalidConfiguration"
        assert message.endswith("no pod is placed until a valid one is in it")
        _edit(s, "weights:\n  fragmentation: 5\n", "3")
        for _ in range(200):
            if api.bound:
                break
            await asyncio.sleep(0.05)
        assert api.bound == ["default/p"]
        assert s.ready() == (True, "")
        # From now on a bad document keeps the last good one: placing goes on.
        _edit(s, "weights:\n  fragmentation: -5\n", "4")
        assert s.ready() == (True, "")
        await asyncio.sleep(0.1)
        assert [e for e in api.events if e[0] == NAME][-1][2].endswith("the last good configuration stays")
    finally:
        task.cancel()


def _electing() -> tuple[Scheduler, list[bool]]:
    settings = DaemonSettings(scheduler_name="s", leader_elect=True, namespace=NAMESPACE, config_map=NAME)
    s = Scheduler(settings, cast(Kube, IdleClient()))
    tried: list[bool] = []

    async def run() -> None:
        tried.append(True)

    assert s.elector is not None
    s.elector.run = run  # type: ignore[method-assign]
    for r in s.reflectors:  # the watches have listed: only the ConfigMap's document is in question
        r.synced.set()
    return s, tried


async def test_a_replica_whose_configmap_was_never_valid_does_not_try_for_the_lead() -> None:
    s, tried = _electing()
    task = asyncio.create_task(s.lead())
    await asyncio.sleep(0.2)
    assert tried == []  # the leader running on the last good document keeps the lead
    _edit(s, "{}\n", "2")
    await asyncio.wait_for(task, 5)
    assert tried == [True]


def _config_watch(s: Scheduler) -> ConfigMapHandler:
    return cast(ConfigMapHandler, next(r.handler for r in s.reflectors if r.name == "config"))


async def test_a_start_whose_configmap_list_is_on_its_way_logs_no_error() -> None:
    s, tried = _electing()
    with capture_logs() as logs:
        task = asyncio.create_task(s.lead())
        await asyncio.sleep(0.05)  # the first list of the ConfigMap comes back a moment later
        _config_watch(s).replace([_configmap("{}\n", "2")])
        await asyncio.wait_for(task, 5)
    assert tried == [True]
    assert [e for e in logs if e["log_level"] == "error"] == []


@pytest.mark.parametrize("listed", [True, False])
async def test_a_replica_not_trying_for_the_lead_says_why(monkeypatch: pytest.MonkeyPatch, listed: bool) -> None:
    from gpusched.daemon import scheduler as daemon

    monkeypatch.setattr(daemon, "CONFIG_READ_WAIT_S", 0.1)
    s, tried = _electing()
    if listed:
        _config_watch(s).replace([])  # no such ConfigMap
    with capture_logs() as logs:
        task = asyncio.create_task(s.lead())
        await asyncio.sleep(0.3)
    task.cancel()
    assert tried == []
    (error,) = [e for e in logs if e["event"] == "not trying for the lead"]
    if listed:
        assert "the ConfigMap was not found" in error["why"]
    else:  # never read (no permission, no API server): "not found" would be a guess
        assert "could not be read yet" in error["why"]
        assert "not found" not in error["why"]


def test_a_document_whose_applying_raised_is_applied_when_the_relist_offers_it_again() -> None:
    """A handler that raises makes the watch relist, which brings the same resourceVersion: it
    must not be skipped as seen, nor counted as applied the first time."""
    applied: list[GpuschedConfig] = []
    fail = True

    def on_config(cfg: GpuschedConfig) -> None:
        nonlocal fail
        if fail:
            fail = False
            raise RuntimeError("a defect")
        applied.append(cfg)

    handler = ConfigMapHandler(NAMESPACE, NAME, on_config)
    cm = _configmap("solver:\n  workers: 3\n", "7")
    with pytest.raises(RuntimeError):
        handler.apply("ADDED", cm)
    assert not handler.accepted
    handler.replace([cm])
    assert [c.solver.workers for c in applied] == [3]
    assert handler.accepted


async def test_a_replica_does_not_try_for_the_lead_before_every_watch_has_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that cannot list what placement reads (its role lacks CSINodes after an
    upgrade, say) would hold the Lease placing nothing while a healthy one stood by: it waits,
    says which watch and why, and tries once the watch has listed."""
    from gpusched.daemon import scheduler as daemon

    monkeypatch.setattr(daemon, "CONFIG_READ_WAIT_S", 0.1)
    s, tried = _electing()
    _config_watch(s).replace([_configmap("{}\n", "2")])
    stuck = next(r for r in s.reflectors if r.name == "csi-nodes")
    stuck.synced.clear()
    stuck.failing_since, stuck.last_error = 1.0, "403 Forbidden: csinodes is forbidden"
    with capture_logs() as logs:
        task = asyncio.create_task(s.lead())
        await asyncio.sleep(0.3)
        assert tried == []
        (error,) = [e for e in logs if e["event"] == "not trying for the lead"]
        assert error["why"] == "waiting for the first list of csi-nodes (403 Forbidden: csinodes is forbidden)"
        assert s.ready() == (False, error["why"])
        stuck.synced.set()
        await asyncio.wait_for(task, 5)
    assert tried == [True]


async def test_no_weights_are_exported_as_in_force_before_the_configmaps_document() -> None:
    """While a replica waits for its ConfigMap nothing is in force (no batch, not ready): the
    built-in defaults are not exported as the weights; the document's are, once accepted."""
    s, _ = _scheduler()
    assert _sample(s, "gpusched_solver_weight", term="placedGpu") is None
    _edit(s, "weights:\n  placedGpu: 2000\n", "2")
    assert _sample(s, "gpusched_solver_weight", term="placedGpu") == 2000
    follows_a_file, _ = _scheduler(follow=False)
    assert _sample(follows_a_file, "gpusched_solver_weight", term="placedGpu") == 1000
