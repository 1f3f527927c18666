"""The daemon re-partitioning nodes into MIG instances, over a recording API: what it binds,
what it asks the MIG manager for, and what it tells the pods, in the cases a live cluster brings
(headroom, gangs, restarts, a lost lead, the feature off, ConfigMap writes that interleave)."""

from __future__ import annotations

import asyncio
import copy
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from structlog.testing import capture_logs

from gpusched.config import parse_config
from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon import mig as mig_module
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder
from gpusched.kube.client import Kube, Response
from gpusched.kube.convert import pod_record
from gpusched.model import Pod
from tests.doubles import IdleClient, RecordingApi
from tests.e2e import kit

A100 = "NVIDIA-A100-SXM4-80GB"
CM = "/api/v1/namespaces/gpu-operator/configmaps/gpusched-mig-parted-config"
ON = {"mig": {"repartition": True, "configDelaySeconds": 0}}
LABEL_STATE = "nvidia.com/mig.config.state"


class MigApi(RecordingApi):
    """Records binds, layouts written and node labels; every write succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.bound_to: dict[str, str] = {}
        self.written: list[str] = []
        self.labelled: list[tuple[str, dict[str, str | None]]] = []
        self.first_written: float | None = None
        """When the layouts were first written, as the ConfigMap says (None: now)."""

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> Any:
        self.bound_to[pod.key] = node
        return await super().bind(pod, node, gpus)

    async def write_mig_config(self, name: str, *_: Any, **__: Any) -> tuple[str, float]:
        self.written.append(name)
        return "", time.time() if self.first_written is None else self.first_written

    async def label_node(self, node: str, labels: dict[str, str | None]) -> str:
        self.labelled.append((node, labels))
        return ""

    async def object_event(self, *_: Any, **__: Any) -> None:
        return None


class EventApi(MigApi):
    """Also records the Events written: (object name, reason, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, str]] = []
        self.node_events: list[tuple[str, str, str, str]] = []
        """(object name, reason, message, type) of the Events written."""

    async def object_event(
        self, involved: dict[str, str], reason: str, message: str, kind: str = "Normal", fenced: bool = False
    ) -> None:
        self.events.append((involved["name"], reason, message))
        self.node_events.append((involved["name"], reason, message, kind))


def scheduler(api: object, cfg: dict[str, Any] | None = None, policy: str = "bestfit") -> Scheduler:
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy=policy), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    s.set_config(parse_config(ON if cfg is None else cfg))
    return s


def add_node(s: Scheduler, name: str, gpus: int, repartition: bool = True, **labels: str) -> None:
    if repartition:
        labels["gpusched.io/mig-repartition"] = "true"
    NodeHandler(s).apply("ADDED", kit.node(name, gpus, A100, **labels))


def pod(name: str, *, gpus: int = 0, mig: str = "", priority: int = 0, gang: str = "") -> dict[str, Any]:
    obj = kit.pod(name, "s", gpus=gpus)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    if mig:
        obj["spec"]["containers"][0]["resources"]["limits"][f"nvidia.com/mig-{mig}"] = "1"
    obj["spec"]["priority"] = priority
    if gang:
        obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = gang
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "2"
    return obj


def unstamped(labels: dict[str, str | None]) -> dict[str, str | None]:
    """``labels`` written on a node, but for when it was labelled back after a layout or a restore
    did not come (``gpusched.io/mig-setting-back-at``, by which every leader seals it: checked to
    be now)."""
    out = dict(labels)
    stamp = out.pop("gpusched.io/mig-setting-back-at", None)
    assert stamp is None or abs(int(stamp) - time.time()) < 60, stamp
    return out


async def batch(s: Scheduler) -> None:
    """One batch, and what it started but the long waits for the MIG manager."""
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    for _ in range(5):
        await asyncio.sleep(0)
    while busy := [t for t in s.pending_tasks() if not t.get_name().startswith("mig:")]:
        await asyncio.wait(busy)


def stop(s: Scheduler) -> None:
    for t in s.pending_tasks():
        t.cancel()


async def test_a_mig_pod_on_gpus_kept_free_waits_for_its_layout_like_any_other() -> None:
    api = MigApi()
    s = scheduler(api, {**ON, "headroom": {"gpus": 1, "priorityAtLeast": 1000}})
    add_node(s, "n0", 1)  # its one GPU is kept free for pods of priority 1000
    s._pending.apply("ADDED", pod("critical", mig="1g.10gb", priority=1000))
    s._pending.apply("ADDED", pod("low"))
    await batch(s)
    assert "default/critical" not in api.bound_to, "bound to a node that advertises no nvidia.com/mig-1g.10gb"
    assert [n for n, _ in api.labelled] == ["n0"]
    assert any("re-partitioned" in m for m in api.failed("default/critical"))
    stop(s)


class ConditionApi(EventApi):
    """Also records the conditions written: (pod key, reason, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.conditions: list[tuple[str, str, str]] = []

    async def unschedulable(self, pod: Pod, message: str, *_: Any, reason: str = "", **__: Any) -> None:
        self.conditions.append((pod.key, reason, message))


async def test_pods_waiting_for_their_layout_are_no_call_for_a_new_node() -> None:
    # The cluster autoscaler adds a node for a pod whose PodScheduled=False reason is
    # Unschedulable: a MIG pod (and a gang member beside it) about to be placed is not one.
    api = ConditionApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    for _ in range(20):
        await asyncio.sleep(0)
    said = [(reason, message) for key, reason, message in api.conditions if key == "default/p"]
    assert said, "told it waits"
    assert said[-1][1].startswith("Waiting for node n to be re-partitioned")
    assert said[-1][0] == "MigRepartition"
    # Read back from the pod, the condition is one of gpusched's verdicts.
    obj = pod("p", mig="1g.10gb")
    obj["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": said[-1][0]}]}
    assert pod_record(obj).unschedulable_reason == "MigRepartition"
    stop(s)


async def test_a_gang_with_a_member_on_a_node_being_repartitioned_is_not_split() -> None:
    for policy in ("bestfit", "fgd", "cpsat"):
        api = MigApi()
        s = scheduler(api, policy=policy)
        add_node(s, "n", 2)
        add_node(s, "m", 1, repartition=False)
        s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
        for i in range(2):
            s._pending.apply("ADDED", pod(f"g{i}", gpus=1, gang="g"))
        await batch(s)
        gang = {k for k in api.bound_to if k.startswith("default/g")}
        assert len(gang) in (0, 2), f"{policy}: gang split, only {gang} bound"
        stop(s)


async def test_with_the_feature_off_the_mig_managers_state_changes_nothing() -> None:
    api = MigApi()
    s = scheduler(api, {})
    add_node(s, "n0", 2, repartition=False, **{"nvidia.com/mig.config.state": "pending"})
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert api.bound_to == {"default/w": "n0"}
    assert not s.mig.sealed()


async def test_with_the_feature_on_a_node_the_mig_manager_works_on_takes_no_pod() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n0", 2, **{"nvidia.com/mig.config.state": "pending"})  # its GPUs are being re-partitioned
    assert "n0" in s.mig.sealed()
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert api.bound_to == {}
    stop(s)


async def test_a_node_another_leader_asked_a_layout_for_is_sealed_until_it_times_out() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 60}})
    asked = {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "success",  # the state of the last layout, not of this one
        "gpusched.io/mig-requested-at": str(int(time.time())),
    }
    add_node(s, "n", 2, **asked)
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert "default/w" not in api.bound_to, "a GPU pod bound to a node the MIG manager is about to re-partition"
    assert "1 node being re-partitioned into MIG instances was not offered" in api.failed("default/w")[-1]
    assert not api.labelled
    # Past the timeout, labelled a minute ago and seen so long by this leader: the node is set
    # back, and no longer offered for re-partitioning.
    add_node(s, "n", 2, **{**asked, "gpusched.io/mig-requested-at": str(int(time.time()) - 61)})
    s.mig.asked_seen["n"] = (s.mig.asked["n"], time.monotonic() - 61)
    assert not s.mig.sealed()
    s.queue.move_all()
    await batch(s)
    assert (
        "n",
        {
            "nvidia.com/mig.config": "all-disabled",
            "gpusched.io/mig-requested-at": None,
            "gpusched.io/mig-repartition": "false",
        },
    ) in [(node, unstamped(labels)) for node, labels in api.labelled]


class LosingApi(MigApi):
    def __init__(self, s: list[Scheduler]) -> None:
        super().__init__()
        self.s = s

    async def write_mig_config(self, name: str, *_: Any, **__: Any) -> tuple[str, float]:
        self.s[0]._leadership(False)
        return "no longer the leader", 0.0


async def test_a_lead_lost_while_asking_is_not_told_to_the_pods() -> None:
    ref: list[Scheduler] = []
    api = LosingApi(ref)
    s = scheduler(api)
    ref.append(s)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0)
    assert not any("no longer the leader" in m for m in api.failed("default/p"))
    assert not s.mig.jobs
    assert s.mig.off_until == 0.0, "re-partitioning is not held off for a lead lost"


class ForbiddenApi(EventApi):
    """The MIG manager's ConfigMap may not be written (RBAC missing)."""

    async def write_mig_config(self, name: str, *_: Any, **__: Any) -> tuple[str, float]:
        self.written.append(name)
        return 'configmaps "gpusched-mig-parted-config" is forbidden', 0.0


async def test_a_layout_that_cannot_be_written_is_told_on_the_node_and_to_the_mig_pods_meanwhile() -> None:
    # No GPU is re-partitioned for mig.timeoutSeconds after: the admin is told why and what to do,
    # and MIG pods that find no room meanwhile are told why no node is re-partitioned for them.
    api = ForbiddenApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0)
    (event,) = [(n, m, kind) for n, reason, m, kind in api.node_events if reason == "MigRepartitionPaused"]
    assert event[0] == "n"
    assert event[2] == "Warning"
    assert 'configmaps "gpusched-mig-parted-config" is forbidden' in event[1]
    assert "ConfigMap gpu-operator/gpusched-mig-parted-config" in event[1]
    s._pending.apply("ADDED", pod("q", mig="1g.10gb"))
    await batch(s)
    told = api.failed("default/q")[-1]
    assert told.startswith("0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb; "), told
    assert "re-partitioning into MIG instances is paused until 20" in told, told
    assert 'a layout could not be written (configmaps "gpusched-mig-parted-config" is forbidden)' in told
    # Once the pause is over, the note is gone.
    s.mig.off_until = 0.0
    assert s.with_notes(pod_record(pod("q", mig="1g.10gb")).pod, "x.", s.cache.snapshot()) == "x."
    stop(s)


class ConfigMapKube:
    """The ConfigMap and node endpoints of an API server, with resourceVersion checks; the first
    read is slow, as under a rate limiter."""

    def __init__(self) -> None:
        self.cm: dict[str, Any] | None = None
        self.rv = 0
        self.gets = 0
        self.labels: dict[str, str] = {}

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        if kw.get("before_send"):
            kw["before_send"]()
        if path == CM and method == "GET":
            self.gets += 1
            if self.gets == 1:
                await asyncio.sleep(0.05)
            if self.cm is None:
                return Response(404, {"message": "not found", "reason": "NotFound"})
            return Response(200, copy.deepcopy(self.cm))
        if method in ("POST", "PUT") and path.startswith(CM.rsplit("/", 1)[0]):
            if (self.cm is None) != (method == "POST") or (
                method == "PUT" and body["metadata"].get("resourceVersion") != self.cm["metadata"]["resourceVersion"]  # type: ignore[index]
            ):
                return Response(409, {"message": "conflict", "reason": "Conflict"})
            self.rv += 1
            self.cm = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
            return Response(200, copy.deepcopy(self.cm))
        if path.startswith("/api/v1/nodes/") and method == "PATCH":
            self.labels[path.rsplit("/", 1)[1]] = body["metadata"]["labels"]["nvidia.com/mig.config"]
            return Response(200, {})
        return Response(201, {})


async def test_layouts_asked_for_in_one_batch_all_stay_in_the_config_map() -> None:
    kube = ConfigMapKube()
    s = scheduler(None, policy="cpsat")
    s.binder = Binder(cast(Kube, kube), "me", leading=lambda: True)
    add_node(s, "a", 1)
    add_node(s, "b", 1)
    s._pending.apply("ADDED", pod("small", mig="1g.10gb"))
    s._pending.apply("ADDED", pod("big", mig="7g.80gb"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    for _ in range(50):
        await asyncio.sleep(0.01)
    assert kube.cm is not None
    configs = yaml.safe_load(kube.cm["data"]["config.yaml"])["mig-configs"]
    assert len(kube.labels) == 2
    for node, config in kube.labels.items():
        assert config in configs, f"node {node} is labelled {config}, which the ConfigMap no longer holds"
    stop(s)


async def test_a_new_layout_is_labelled_only_after_the_config_delay() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0.2}})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert len(api.written) == 1
    assert not api.labelled, "labelled before the MIG manager can read the layout"
    await asyncio.sleep(0.3)
    assert [n for n, _ in api.labelled] == ["n"]
    stop(s)
    # A layout any instance wrote long enough ago is labelled at once.
    api = MigApi()
    api.first_written = time.time() - 1.0
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0.5}})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert [n for n, _ in api.labelled] == ["n"]
    stop(s)


async def test_by_default_a_new_layout_waits_out_the_kubelets_slowest_refresh_of_the_config_map() -> None:
    # The kubelet may project a change into the MIG manager's volume up to 90 s after it (a 60 s
    # sync period and up to half that again), and the change takes a moment to reach it.
    for written_ago, labelled in ((95, False), (125, True)):
        api = MigApi()
        api.first_written = time.time() - written_ago
        s = scheduler(api, {"mig": {"repartition": True}})
        add_node(s, "n", 1)
        s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
        await batch(s)
        await asyncio.sleep(0.05)
        stop(s)
        assert bool(api.labelled) == labelled, f"written {written_ago} s before: {api.labelled}"


async def test_a_later_mig_pod_waits_for_an_instance_to_come_rather_than_split_another_node() -> None:
    for policy in ("bestfit", "cpsat"):
        api = MigApi()
        s = scheduler(api, policy=policy)
        add_node(s, "n", 1)
        add_node(s, "m", 1)
        s._pending.apply("ADDED", pod("first", mig="1g.10gb"))
        await batch(s)
        ((node, job),) = s.mig.jobs.items()
        s._pending.apply("ADDED", pod("second", mig="1g.10gb"))
        await batch(s)
        assert len(s.mig.jobs) == 1, f"{policy}: a second node re-partitioned for one more instance"
        assert sorted(job.pods) == ["default/first", "default/second"]
        assert not api.bound_to
        assert any(f"Waiting for node {node}" in m for m in api.failed("default/second"))
        # Every instance the layout offers promised: the next pod needs a layout of its own.
        for i in range(sum(job.wanted.values()) - 2):
            s._pending.apply("ADDED", pod(f"more{i}", mig="1g.10gb"))
        await batch(s)
        assert len(s.mig.jobs) == 1
        s._pending.apply("ADDED", pod("last", mig="1g.10gb"))
        await batch(s)
        assert len(s.mig.jobs) == 2, f"{policy}: {s.mig.jobs}"
        stop(s)


async def test_after_a_restart_a_mig_pod_waits_for_the_layout_asked_for_rather_than_split_another_node() -> None:
    before = MigApi()
    s = scheduler(before)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    ((_, labelled),) = before.labelled
    asked = {k: str(v) for k, v in labelled.items()}
    stop(s)
    # gpusched restarts while the MIG manager works on node n; node m is idle, p still pending.
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1, **asked, **{LABEL_STATE: "pending"})
    add_node(s, "m", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert not api.labelled, "node m re-partitioned for the pod node n is being re-partitioned for"
    told = api.failed("default/p")[-1]
    assert "no node is given a new MIG layout until node n, asked for one before this instance led" in told
    # The layout comes: the pod takes one of its instances.
    done = mig_node("n", asked["nvidia.com/mig.config"], **{"1g_10gb": 7})
    done["metadata"]["labels"]["gpusched.io/mig-requested-at"] = asked["gpusched.io/mig-requested-at"]
    NodeHandler(s).apply("MODIFIED", done)
    await batch(s)
    stop(s)
    assert api.bound_to == {"default/p": "n"}


async def test_a_layout_asked_for_before_a_restart_that_fails_holds_the_mig_pods_back_no_longer() -> None:
    api = MigApi()
    s = scheduler(api)
    asked = {"nvidia.com/mig.config": "gpusched-0123456789ab", "gpusched.io/mig-requested-at": str(int(time.time()))}
    add_node(s, "n", 1, **asked, **{LABEL_STATE: "pending"})
    add_node(s, "m", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert not api.labelled
    add_node(s, "n", 1, **asked, **{LABEL_STATE: "failed"})
    await batch(s)
    stop(s)
    layouts = [(n, labels["nvidia.com/mig.config"]) for n, labels in api.labelled if "nvidia.com/mig.config" in labels]
    assert layouts[0] == ("n", "all-disabled"), "the failed layout is set back"
    assert [n for n, config in layouts[1:] if str(config).startswith("gpusched-")] == ["m"], "the pod still waits"
    assert any("Waiting for node m" in m for m in api.failed("default/p"))
    # Counted as the failure it was, by the instance that saw it end (the one that asked is gone).
    lines = s.metrics.render()[0].decode().splitlines()
    assert 'gpusched_mig_repartitions_total{result="failed"} 1.0' in lines


def mig_node(name: str, config: str = "gpusched-0123456789ab", **slices: int) -> dict[str, Any]:
    """A node gpusched re-partitioned, as the MIG manager and the device plugin left it."""
    obj = kit.node(name, 0, A100, **{"gpusched.io/mig-repartition": "true", "nvidia.com/mig.config": config})
    obj["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    for profile, count in slices.items():
        obj["status"]["allocatable"][f"nvidia.com/mig-{profile.replace('_', '.')}"] = str(count)
    return obj


async def test_a_repartitioned_node_idle_long_enough_is_set_back_to_whole_gpus() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    NodeHandler(s).apply("ADDED", mig_node("idle", **{"1g_10gb": 7}))
    NodeHandler(s).apply("ADDED", mig_node("used", **{"1g_10gb": 7}))
    NodeHandler(s).apply("ADDED", mig_node("theirs", config="all-1g.10gb", **{"1g_10gb": 7}))
    running = pod("r", mig="1g.10gb")
    running["spec"]["nodeName"] = "used"
    s._bound.apply("ADDED", running)
    assert s.mig.restore_idle(1000.0) == []
    assert s.mig.restore_idle(1059.0) == []
    assert s.mig.restore_idle(1061.0) == ["idle"], "only the node gpusched re-partitioned and nobody uses"
    assert "idle" in s.mig.sealed()
    await asyncio.sleep(0)
    (node, labels) = api.labelled[-1]
    assert (node, labels["nvidia.com/mig.config"]) == ("idle", "all-disabled")
    assert s.mig.restore_idle(2000.0) == [], "asked once"
    # The MIG manager's part: whole GPUs again. The node may be re-partitioned once more.
    whole = kit.node("idle", 8, A100, **{"gpusched.io/mig-repartition": "true"})
    whole["metadata"]["labels"] |= {
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
        "gpusched.io/mig-requested-at": str(labels["gpusched.io/mig-requested-at"]),
    }
    NodeHandler(s).apply("MODIFIED", whole)
    assert "idle" not in s.mig.sealed()
    assert s.cache.nodes["idle"].node.mig_repartition
    stop(s)


async def test_a_cordoned_idle_node_is_not_set_back_round_after_round() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    cordoned = mig_node("drained", **{"1g_10gb": 7})
    cordoned["spec"] = {"unschedulable": True}
    NodeHandler(s).apply("ADDED", cordoned)
    assert s.mig.restore_idle(1000.0) == []
    with capture_logs() as logs:
        assert s.mig.restore_idle(1061.0) == [], "its operator drains it: nothing is asked of the MIG manager"
        await asyncio.sleep(0)
    assert not api.labelled
    assert not [e for e in logs if e["event"] == "mig repartition left to the next leader"]
    stop(s)


async def test_a_node_being_set_back_is_sealed_for_a_new_leader_too() -> None:
    api = MigApi()
    s = scheduler(api)
    obj = mig_node("n", config="all-disabled", **{"1g_10gb": 7})
    obj["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(int(time.time()))
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    NodeHandler(s).apply("ADDED", obj)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert not api.bound_to, "bound to instances the MIG manager is taking away"


def one_gpu_in_mig(name: str, profile: str, count: int, **labels: str) -> dict[str, Any]:
    """A node whose one A100 is in MIG mode and advertises ``count`` instances."""
    obj = kit.node(name, 1, A100, **{"gpusched.io/mig-repartition": "true", **labels})
    for st in ("capacity", "allocatable"):
        obj["status"][st] = {**obj["status"][st], "nvidia.com/gpu": "0", f"nvidia.com/mig-{profile}": str(count)}
    return obj


async def test_a_node_that_succeeded_long_ago_is_not_reset_when_the_mig_manager_restarts() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 60}})
    done = {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "success",
        "gpusched.io/mig-requested-at": str(int(time.time()) - 86_400),  # re-partitioned yesterday
    }
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("n", "1g.10gb", 7, **done))
    assert not s.mig.asked
    # The MIG manager restarts (operator upgrade, reboot) and re-applies the node's layout.
    NodeHandler(s).apply(
        "MODIFIED", one_gpu_in_mig("n", "1g.10gb", 7, **{**done, "nvidia.com/mig.config.state": "pending"})
    )
    s._pending.apply("ADDED", pod("w", mig="1g.10gb"))
    await batch(s)
    set_back = [labels for _, labels in api.labelled if "nvidia.com/mig.config" in labels]
    assert not set_back, f"a node with MIG pods running was set back: {api.labelled}"
    assert api.labelled == [("n", {"gpusched.io/mig-requested-at": None})]  # the request of yesterday, cleared
    stop(s)


class SlowFailingApi(MigApi):
    """The ConfigMap write fails (RBAC, a non-mig-parted document, conflicts) after a while."""

    async def write_mig_config(self, name: str, *_: Any, **__: Any) -> tuple[str, float]:
        self.written.append(name)
        await asyncio.sleep(0.1)
        return 'configmaps "gpusched-mig-parted-config" is forbidden', 0.0


async def test_a_mig_pod_placed_on_a_coming_instance_is_not_bound_when_the_layout_fails_during_the_solve(
    monkeypatch: Any,
) -> None:
    api = SlowFailingApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("first", mig="1g.10gb"))
    await batch(s)
    assert "n" in s.mig.jobs
    orig = asyncio.to_thread

    async def slow_solve(fn: Any, *a: Any, **k: Any) -> Any:
        out = await orig(fn, *a, **k)
        await asyncio.sleep(0.3)  # a solve of 0.3 s: the write fails meanwhile
        return out

    monkeypatch.setattr(asyncio, "to_thread", slow_solve)
    s._pending.apply("ADDED", pod("second", mig="1g.10gb"))
    await batch(s)
    assert "n" not in s.mig.jobs
    assert "default/second" not in api.bound_to, "bound to a node that advertises no nvidia.com/mig-1g.10gb"
    stop(s)


class HookApi(MigApi):
    def __init__(self) -> None:
        super().__init__()
        self.after_event: Any = None

    async def object_event(self, *_: Any, **__: Any) -> None:
        if self.after_event is not None:
            self.after_event()


async def test_a_timeout_does_not_overwrite_a_layout_someone_else_labelled_since() -> None:
    api = HookApi()
    s = scheduler(api)
    add_node(s, "n", 1)

    def expire_soon() -> None:  # the timeout, 0.2 s from now rather than 600 s
        api.after_event = None
        job = s.mig.jobs["n"]
        job.asked -= float(s.config.mig.timeout_seconds) - 0.2

    api.after_event = expire_soon
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    # The cluster admin takes the node over with one of NVIDIA's configurations, and it applies.
    add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending"})
    await asyncio.sleep(0.4)
    await asyncio.sleep(0)
    resets = [labels for node, labels in api.labelled if labels.get("nvidia.com/mig.config") == "all-disabled"]
    assert not resets, "gpusched set back a node whose nvidia.com/mig.config is no longer its own"
    stop(s)


class HookEventApi(EventApi):
    """Records the Events written, and calls ``after_event`` once one is."""

    def __init__(self) -> None:
        super().__init__()
        self.after_event: Any = None

    async def object_event(
        self, involved: dict[str, str], reason: str, message: str, kind: str = "Normal", fenced: bool = False
    ) -> None:
        await super().object_event(involved, reason, message, kind, fenced)
        if self.after_event is not None:
            self.after_event()


async def test_a_layout_that_times_out_beside_a_pod_on_another_whole_gpu_is_set_back() -> None:
    # The MIG manager is not running; a pod of another scheduler starts on the node's other GPU.
    # Left labelled, the layout would be applied whenever the MIG manager comes back, under the
    # pods bound to the node since; setting it back changes no GPU that is whole already.
    api = HookEventApi()
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0, "partitionForQueued": False}})
    add_node(s, "n", 2)

    def expire_soon() -> None:  # the timeout, 0.2 s from now rather than 600 s
        api.after_event = None
        s.mig.jobs["n"].asked -= float(s.config.mig.timeout_seconds) - 0.2

    api.after_event = expire_soon
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    ((_, asked),) = api.labelled
    add_node(s, "n", 2, **{k: str(v) for k, v in asked.items()})  # the watch shows the label
    other = kit.pod("other", "default-scheduler", gpus=1, node_name="n")
    other["metadata"].update({"namespace": "default", "uid": "uid-other"})
    s._bound.apply("ADDED", other)
    await asyncio.sleep(0.4)
    assert "n" not in s.mig.jobs, "timed out"
    back = {"nvidia.com/mig.config": "all-disabled", "gpusched.io/mig-requested-at": None}
    written = [(node, unstamped(labels)) for node, labels in api.labelled]
    assert ("n", {**back, "gpusched.io/mig-repartition": "false"}) in written, api.labelled
    (timeout,) = [(m, kind) for _, reason, m, kind in api.node_events if reason == "MigRepartitionTimeout"]
    assert timeout[1] == "Warning"
    assert "Labelled nvidia.com/mig.config=all-disabled again" in timeout[0]
    # No pod is placed there until the MIG manager has applied that.
    add_node(s, "n", 2, repartition=False, **{"nvidia.com/mig.config": "all-disabled"})
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert "default/w" not in api.bound_to
    stop(s)


class ExistedApi(MigApi):
    """The layout is in the ConfigMap already: written seconds ago by the leader before."""

    async def write_mig_config(self, name: str, *_: Any, **__: Any) -> tuple[str, float]:
        self.written.append(name)
        return "", time.time() - 0.05  # as the ConfigMap's annotation says


async def test_a_layout_the_previous_leader_just_wrote_is_still_waited_for() -> None:
    api = ExistedApi()
    s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0.3}})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0.05)
    assert not api.labelled, "labelled before the MIG manager's copy can hold a layout written by the last leader"
    stop(s)


async def test_a_deleted_pod_keeps_no_instance_promised() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    add_node(s, "m", 1)
    first = pod("first", mig="1g.10gb")
    s._pending.apply("ADDED", first)
    await batch(s)
    ((_, job),) = s.mig.jobs.items()
    s._pending.apply("DELETED", first)
    for i in range(sum(job.wanted.values())):  # as many as the layout holds: the deleted pod's is free
        s._pending.apply("ADDED", pod(f"more{i}", mig="1g.10gb"))
    await batch(s)
    assert len(s.mig.jobs) == 1, "a second node re-partitioned while an instance is kept for a deleted pod"
    stop(s)


async def test_a_pod_left_out_is_not_told_it_fits_on_a_gpu_the_plan_partitioned() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n0", 1)
    s._pending.apply("ADDED", pod("high", mig="7g.80gb", priority=10))
    s._pending.apply("ADDED", pod("low", mig="7g.80gb"))
    await batch(s)
    assert list(s.mig.jobs) == ["n0"]
    told = api.failed("default/low")
    assert not any("could take the pod now" in m for m in told), told
    stop(s)


async def test_a_later_mig_pod_joins_once_the_node_shows_the_label_too() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("first", mig="1g.10gb"))
    await batch(s)
    ((_, job),) = s.mig.jobs.items()
    # The watch delivers the node as labelled (the MIG manager has not begun yet).
    add_node(s, "n", 1, **{"nvidia.com/mig.config": job.config, "gpusched.io/mig-requested-at": str(int(time.time()))})
    s._pending.apply("ADDED", pod("second", mig="1g.10gb"))
    await batch(s)
    assert sorted(job.pods) == ["default/first", "default/second"], api.failed("default/second")
    stop(s)


async def test_a_node_withdrawn_during_the_config_delay_is_not_labelled() -> None:
    wrong = []
    for withdraw in ("node label", "feature off", "GPU taken", "cordoned", "another layout", "manager at work"):
        api = MigApi()
        s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0.2}})
        add_node(s, "n", 1)
        s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
        await batch(s)
        assert api.written
        assert not api.labelled
        if withdraw == "node label":  # the admin takes the node out of re-partitioning
            add_node(s, "n", 1, repartition=False, **{"gpusched.io/mig-repartition": "false"})
        elif withdraw == "feature off":
            s.set_config(parse_config({}))
        elif withdraw == "cordoned":  # drained for maintenance: the MIG manager would act on it all the same
            obj = kit.node("n", 1, A100, **{"gpusched.io/mig-repartition": "true"})
            obj["spec"] = {"unschedulable": True}
            NodeHandler(s).apply("MODIFIED", obj)
        elif withdraw == "another layout":  # the admin asks the MIG manager for another layout
            add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-1g.10gb"})
        elif withdraw == "manager at work":  # re-applying the node's layout (a reboot)
            add_node(s, "n", 1, **{"nvidia.com/mig.config.state": "pending"})
        else:  # another scheduler's pod (or one with spec.nodeName) starts on its GPU
            other = kit.pod("other", "default-scheduler", gpus=1, node_name="n")
            other["metadata"].update({"namespace": "default", "uid": "uid-other"})
            s._bound.apply("ADDED", other)
        await asyncio.sleep(0.3)
        if api.labelled:
            wrong.append(withdraw)
        stop(s)
    assert not wrong, f"labelled for the MIG manager all the same after: {wrong}"


async def test_a_layout_whose_pods_are_all_gone_before_the_label_is_not_asked_for() -> None:
    # Deleted, or bound by someone else, during mig.configDelaySeconds: the MIG manager would
    # drain and re-partition the node for nobody.
    for gone in (("p",), ("p", "q")):
        api = EventApi()
        s = scheduler(api, {"mig": {"repartition": True, "configDelaySeconds": 0.2}})
        add_node(s, "n", 1)
        for name in ("p", "q"):
            s._pending.apply("ADDED", pod(name, mig="1g.10gb"))
        await batch(s)
        ((_, job),) = s.mig.jobs.items()
        assert sorted(job.pods) == ["default/p", "default/q"]
        assert api.written
        assert not api.labelled
        s._pending.apply("DELETED", pod("p", mig="1g.10gb"))
        if "q" in gone:  # bound by hand (spec.nodeName), as the pending watch shows it
            bound = pod("q", mig="1g.10gb")
            bound["spec"]["nodeName"] = "n"
            s._pending.apply("MODIFIED", bound)
        with capture_logs() as logs:
            await asyncio.sleep(0.3)
        asked = [m for _, reason, m in api.events if reason == "MigRepartition"]
        if gone == ("p",):  # q still waits: the node is labelled for it alone
            assert [n for n, _ in api.labelled] == ["n"]
            assert len(asked) == 1
            assert asked[0].endswith("for 1 pod(s)."), asked
        else:
            assert not api.labelled, "node re-partitioned for pods that are gone"
            assert not s.mig.jobs
            assert not asked
            (failed,) = [e for e in logs if e["event"] == "mig repartition failed"]
            assert "none of its pods is pending any more" in failed["why"]
        stop(s)


async def test_a_node_restored_during_a_solve_does_not_swallow_the_mig_pod_placed_there(monkeypatch: Any) -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    NodeHandler(s).apply("ADDED", mig_node("m", **{"1g_10gb": 7}))
    s.mig.restore_idle(0.0)  # idle since t=0
    orig = asyncio.to_thread

    async def solve(fn: Any, *a: Any, **k: Any) -> Any:
        out = await orig(fn, *a, **k)
        s.mig.restore_idle(1000.0)  # the restore loop's tick lands while the batch is solved
        return out

    monkeypatch.setattr(asyncio, "to_thread", solve)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    job = s.mig.jobs.get("m")
    told = api.failed("default/p")
    stop(s)
    # The pod was placed on an instance that exists now; the restore takes it away.
    assert job is None or "default/p" not in job.pods, (job, told)
    assert all(m for m in told), f"told an empty message: {told}"


async def test_a_node_with_gang_members_waiting_beside_a_layout_is_not_restored() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "configDelaySeconds": 0}})
    NodeHandler(s).apply("ADDED", mig_node("m", **{"1g_10gb": 1}))  # one instance left of a layout of ours
    add_node(s, "n", 1)  # whole, may be re-partitioned
    s.mig.restore_idle(0.0)
    for i in range(2):
        s._pending.apply("ADDED", pod(f"g{i}", mig="1g.10gb", gang="g"))
    await batch(s)
    assert "n" in s.mig.jobs, s.mig.jobs
    told = {k: api.failed(k) for k in ("default/g0", "default/g1")}
    restored = s.mig.restore_idle(1000.0)  # the gang's member planned on m waits for n's layout
    stop(s)
    assert restored == [], (restored, told)


async def test_a_node_taken_out_of_repartitioning_is_not_set_back() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    obj = mig_node("m", **{"1g_10gb": 7})
    obj["metadata"]["labels"]["gpusched.io/mig-repartition"] = "false"  # the admin keeps its layout
    NodeHandler(s).apply("ADDED", obj)
    s.mig.restore_idle(0.0)
    restored = s.mig.restore_idle(1000.0)
    stop(s)
    assert restored == [], "set back to whole GPUs, and never given a layout again: its MIG capacity is gone"


async def test_a_whole_gpu_pod_is_not_bound_to_a_node_restored_during_the_solve(monkeypatch: Any) -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    obj = mig_node("m", **{"1g_10gb": 7})  # one GPU in MIG mode, one kept whole
    for st in ("capacity", "allocatable"):
        obj["status"][st]["nvidia.com/gpu"] = "1"
    NodeHandler(s).apply("ADDED", obj)
    s.mig.restore_idle(0.0)
    orig = asyncio.to_thread

    async def solve(fn: Any, *a: Any, **k: Any) -> Any:
        out = await orig(fn, *a, **k)
        s.mig.restore_idle(1000.0)
        return out

    monkeypatch.setattr(asyncio, "to_thread", solve)
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    sealed = "m" in s.mig.jobs
    stop(s)
    assert not (sealed and api.bound_to.get("default/w") == "m"), (
        "bound to a node the MIG manager is told to reconfigure"
    )


async def _restoring(s: Scheduler, api: MigApi) -> Any:
    """Node "m", its seven 1g.10gb instances idle, set back to whole GPUs: the labels written."""
    NodeHandler(s).apply("ADDED", mig_node("m", **{"1g_10gb": 7}))
    s.mig.restore_idle(0.0)
    assert s.mig.restore_idle(1000.0) == ["m"]
    await asyncio.sleep(0)
    return api.labelled[-1][1]


async def test_after_a_restore_times_out_the_instances_still_there_are_not_offered_to_pods(
    monkeypatch: Any,
) -> None:
    api = MigApi()
    skip_waits(monkeypatch)
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "timeoutSeconds": 10}})
    asked = await _restoring(s, api)
    asked_before = "gpusched-0123456789ab"
    labelled = mig_node("m", config="all-disabled", **{"1g_10gb": 7})  # as the watch shows it
    labelled["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(asked["gpusched.io/mig-requested-at"])
    NodeHandler(s).apply("MODIFIED", labelled)
    # The MIG manager does not get to it in time (node draining, a slow reboot, the operator
    # being upgraded): the node still advertises its instances, and keeps them.
    await until(lambda: "m" not in s.mig.jobs, "the restore given up")
    (node, back) = api.labelled[-1]
    failed_at = back.pop("gpusched.io/mig-restore-failed-at")  # not set back again for a day, by anyone
    assert failed_at is not None
    assert abs(int(failed_at) - time.time()) < 60
    assert (node, unstamped(back)) == (
        "m",
        {
            "gpusched.io/mig-requested-at": None,
            "gpusched.io/mig-previous": None,
            "nvidia.com/mig.config": asked_before,
        },
    )
    # Sealed until the MIG manager has applied the layout again: it may have set some GPUs back.
    for state, sealed in (("success", True), ("pending", True), ("success", False)):  # the label seen; at work; done
        back = mig_node("m", config=asked_before, **{"1g_10gb": 7})
        back["metadata"]["labels"][LABEL_STATE] = state
        NodeHandler(s).apply("MODIFIED", back)
        assert ("m" in s.mig.sealed()) == sealed, state
    stop(s)


async def test_autoscaling_signals_neither_ask_for_nodes_for_pods_waiting_for_a_layout_nor_offer_its_node() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert "n" in s.mig.jobs
    s.gauges.refresh()
    text = s.metrics.render()[0].decode()
    assert "gpusched_unschedulable_gpu_demand 0.0" in text, "a pod about to be placed is no demand for a new node"
    assert "gpusched_gpu_nodes_idle 0.0" in text, "a node being re-partitioned is not idle, to be removed"
    stop(s)


async def test_the_configuration_of_a_node_that_cannot_be_read_stays_in_the_config_map() -> None:
    kube = ConfigMapKube()
    old = {"version": "v1", "mig-configs": {"gpusched-0123456789ab": [], "gpusched-unused00000": []}}
    meta = {"name": "gpusched-mig-parted-config", "namespace": "gpu-operator", "resourceVersion": "1"}
    kube.cm = {"metadata": meta, "data": {"config.yaml": yaml.safe_dump(old)}}
    s = scheduler(None)
    s.binder = Binder(cast(Kube, kube), "me", leading=lambda: True)
    bad = mig_node("bad", **{"1g_10gb": 7})  # labelled gpusched-0123456789ab
    bad["status"]["allocatable"]["cpu"] = "lots"  # refused by the converter: not in the cache
    NodeHandler(s).apply("ADDED", bad)
    assert "bad" not in s.cache.nodes
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    for _ in range(50):
        await asyncio.sleep(0.01)
    configs = yaml.safe_load(kube.cm["data"]["config.yaml"])["mig-configs"]
    assert "gpusched-0123456789ab" in configs, "the layout a node runs was pruned"
    assert "gpusched-unused00000" not in configs
    assert kube.labels["n"] in configs
    stop(s)


class SkippingClock:
    """The MIG manager's clock for these tests: a wait for it to apply a layout takes no real
    time, the clock jumping on by as long as the wait is."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def time(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        self.offset += max(0.0, seconds)
        await asyncio.sleep(0)


def skip_waits(monkeypatch: Any) -> None:
    """Point ``gpusched.daemon.mig``'s ``time`` and ``asyncio.sleep`` at a ``SkippingClock``."""
    clock = SkippingClock()
    monkeypatch.setattr(mig_module, "time", clock)
    monkeypatch.setattr(
        mig_module, "asyncio", SimpleNamespace(sleep=clock.sleep, Lock=asyncio.Lock, current_task=asyncio.current_task)
    )


async def until(cond: Any, what: str) -> None:
    """Let the loop run until ``cond()``; fail after 10 s."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not seen within 10 s: {what}")


def relabels(api: MigApi, since: int) -> list[dict[str, str | None]]:
    """The labels written on node "m" after the first ``since`` writes, setting it back to a
    layout after a restore failed (the times it failed at and was labelled back dropped)."""
    out = []
    for node, labels in api.labelled[since:]:
        if node == "m" and "gpusched.io/mig-restore-failed-at" in labels:
            out.append({k: v for k, v in unstamped(labels).items() if k != "gpusched.io/mig-restore-failed-at"})
    return out


SET_BACK = {
    "gpusched.io/mig-requested-at": None,
    "gpusched.io/mig-previous": None,
    "nvidia.com/mig.config": "gpusched-0123456789ab",  # the layout it had before the restore
}
"""The labels written on node "m" when a restore of it failed, but for when it failed."""


def restore_failed_warnings(api: EventApi) -> list[str]:
    """The messages of the Warning Events MigRestoreFailed written on node "m"."""
    return [
        m
        for node, reason, m, kind in api.node_events
        if node == "m" and (reason, kind) == ("MigRestoreFailed", "Warning")
    ]


async def test_a_restore_finished_under_another_leader_has_its_request_labels_removed() -> None:
    """The previous leader set node "m" back to whole GPUs and stepped down; the MIG manager
    finished under this one.  The request's labels are removed all the same: left standing, the
    MIG manager applying ``all-disabled`` again days later (a reboot: ``pending``) would read as
    that old request not answered, and be told as a restore that failed."""
    api = EventApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 60}})
    stamp = str(int(time.time()) - 30)
    request = {"gpusched.io/mig-requested-at": stamp, "gpusched.io/mig-previous": "gpusched-0123456789ab"}
    going = mig_node("m", config="all-disabled", **{"1g_10gb": 7})
    going["metadata"]["labels"] |= request
    NodeHandler(s).apply("ADDED", going)  # the instances still being taken away
    done = kit.node("m", 8, A100, **{"gpusched.io/mig-repartition": "true", "nvidia.com/mig.config": "all-disabled"})
    done["metadata"]["labels"] |= {**request, "nvidia.com/mig.config.state": "success"}
    NodeHandler(s).apply("MODIFIED", done)
    await asyncio.sleep(0.05)
    assert ("m", {"gpusched.io/mig-requested-at": None, "gpusched.io/mig-previous": None}) in api.labelled
    # Days later, the labels gone: the MIG manager applies all-disabled again after a reboot.
    for state in ("pending", "success"):
        again = copy.deepcopy(done)
        again["metadata"]["labels"]["nvidia.com/mig.config.state"] = state
        for key in request:
            del again["metadata"]["labels"][key]
        NodeHandler(s).apply("MODIFIED", again)
        s.mig.expire_asks()
    await asyncio.sleep(0.05)
    assert restore_failed_warnings(api) == []
    stop(s)


async def _timed_out_restore(api: MigApi, monkeypatch: Any) -> tuple[Scheduler, int]:
    """Node "m" set back to whole GPUs, which the MIG manager did not do within
    ``timeoutSeconds``; and how many label writes there were before it timed out."""
    skip_waits(monkeypatch)
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "timeoutSeconds": 10}})
    asked = await _restoring(s, api)
    n = len(api.labelled)
    labelled = mig_node("m", config="all-disabled", **{"1g_10gb": 7})  # as the watch shows it
    labelled["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(asked["gpusched.io/mig-requested-at"])
    NodeHandler(s).apply("MODIFIED", labelled)
    await until(lambda: "m" not in s.mig.jobs, "the restore given up")
    return s, n


async def test_restore_timeout_relabel_is_not_undone_by_expire_asks(monkeypatch: Any) -> None:
    """The relabel back to the layout is in flight (its watch event not seen yet) when the next
    batch runs: _expire_asks sees an all-disabled request older than timeoutSeconds and gives
    the node up: all-disabled, opted out, while its instances are handed to pods."""
    api = EventApi()
    s, n = await _timed_out_restore(api, monkeypatch)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    later = [labels for node, labels in api.labelled[n:] if node == "m"]
    stop(s)
    assert relabels(api, n) == [SET_BACK], f"not labelled with its layout again once the restore timed out: {later}"
    assert len(restore_failed_warnings(api)) == 1, api.node_events
    assert "did not apply it within 10.0 s" in restore_failed_warnings(api)[0]
    assert not any(labels.get("gpusched.io/mig-repartition") == "false" for labels in later), later
    assert later[-1].get("nvidia.com/mig.config") == "gpusched-0123456789ab", f"set to all-disabled again: {later}"


async def test_restore_timeout_relabel_failure_leaves_node_all_disabled_with_pods_on_instances(
    monkeypatch: Any,
) -> None:
    api = MigApi()
    orig = api.label_node
    calls = {"n": 0}

    async def label(node: str, labels: dict[str, str | None]) -> str:
        calls["n"] += 1
        if calls["n"] == 2:  # the relabel after the timeout fails (API server blip)
            api.labelled.append((node, labels))
            return "503"
        return await orig(node, labels)

    api.label_node = label  # type: ignore[method-assign]
    s, n = await _timed_out_restore(api, monkeypatch)
    assert relabels(api, n) == [SET_BACK], (
        f"not labelled with its layout again once the restore timed out: {api.labelled}"
    )
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    bound = api.bound_to.get("default/p")
    sealed = "m" in s.mig.sealed()
    stop(s)
    assert bound != "m", f"bound to an instance of a node labelled all-disabled: {api.labelled}"
    assert sealed, "offered while labelled all-disabled, its relabel refused"


async def test_a_restore_that_timed_out_is_not_asked_again_and_again(monkeypatch: Any) -> None:
    api = MigApi()
    s, _ = await _timed_out_restore(api, monkeypatch)
    back = mig_node("m", **{"1g_10gb": 7})  # relabelled with its layout; the MIG manager still away
    NodeHandler(s).apply("MODIFIED", back)
    s.mig.restore_idle(2000.0)
    again = s.mig.restore_idle(2061.0)
    stop(s)
    assert again == [], "set back again every restoreIdleSeconds, sealed for timeoutSeconds each time"


async def test_a_failed_restore_is_relabelled_with_its_layout_before_instances_are_offered() -> None:
    api = EventApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    asked = await _restoring(s, api)
    failed = mig_node("m", config="all-disabled", **{"1g_10gb": 7})  # mig-parted failed; instances left
    failed["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(asked["gpusched.io/mig-requested-at"])
    failed["metadata"]["labels"]["nvidia.com/mig.config.state"] = "failed"
    NodeHandler(s).apply("MODIFIED", failed)
    n = len(api.labelled)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await until(lambda: relabels(api, n), "the node labelled with its layout again")
    bound = api.bound_to.get("default/p")
    stop(s)
    assert not (bound == "m" and not api.labelled[n:]), (
        "bound to an instance of a node still labelled all-disabled after a failed restore"
    )
    assert relabels(api, n) == [SET_BACK], api.labelled[n:]
    (warning,) = restore_failed_warnings(api)
    assert "failed to apply nvidia.com/mig.config=all-disabled" in warning
    assert "Labelled nvidia.com/mig.config=gpusched-0123456789ab again" in warning


async def test_gang_not_split_when_a_restore_seals_a_members_node_during_the_solve(monkeypatch: Any) -> None:
    for policy in ("bestfit", "cpsat"):
        api = MigApi()
        s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}}, policy=policy)
        NodeHandler(s).apply("ADDED", mig_node("m", **{"1g_10gb": 7}))
        add_node(s, "w", 1, repartition=False)
        s.mig.restore_idle(0.0)
        orig = asyncio.to_thread

        async def solve(fn: Any, *a: Any, orig: Any = orig, s: Scheduler = s, **k: Any) -> Any:
            out = await orig(fn, *a, **k)
            s.mig.restore_idle(1000.0)
            return out

        monkeypatch.setattr(asyncio, "to_thread", solve)
        s._pending.apply("ADDED", pod("g0", gpus=1, gang="g"))
        s._pending.apply("ADDED", pod("g1", mig="1g.10gb", gang="g"))
        await batch(s)
        monkeypatch.setattr(asyncio, "to_thread", orig)
        gang = {k: v for k, v in api.bound_to.items() if k.startswith("default/g")}
        sealed = "m" in s.mig.jobs
        stop(s)
        assert len(gang) in (0, 2), f"{policy}: gang split, only {gang} bound (m sealed: {sealed})"


async def test_gang_members_waiting_beside_a_layout_are_no_demand() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1)  # whole, to be re-partitioned for g0
    add_node(s, "w", 1, repartition=False)  # g1 fits here as things are
    s._pending.apply("ADDED", pod("g0", mig="1g.10gb", gang="g"))
    s._pending.apply("ADDED", pod("g1", gpus=1, gang="g"))
    await batch(s)
    assert "n" in s.mig.jobs, s.mig.jobs
    told = api.failed("default/g1")
    s.gauges.refresh()
    text = s.metrics.render()[0].decode()
    stop(s)
    gauges = ("gpusched_unschedulable_gpu_demand", "gpusched_gpu_nodes_idle")
    line = [x for x in text.splitlines() if x.startswith(gauges)]
    assert "gpusched_unschedulable_gpu_demand 0.0" in text, (line, told, api.bound_to)


async def test_gang_members_waiting_beside_a_layout_keep_their_reason_when_drawn_again() -> None:
    # Any change in the cluster draws parked pods again; members waiting for the layout, on its
    # instances or beside them, stay parked and are not told that too few members are pending.
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1)
    add_node(s, "w", 1, repartition=False)
    s._pending.apply("ADDED", pod("g0", mig="1g.10gb", gang="g"))
    s._pending.apply("ADDED", pod("g1", gpus=1, gang="g"))
    await batch(s)
    assert "default/g1" in s.mig.jobs["n"].beside, s.mig.jobs
    told = {k: len(api.failed(k)) for k in ("default/g0", "default/g1")}
    s.queue.move_all()
    await batch(s)
    stop(s)
    assert {k: len(api.failed(k)) for k in told} == told, api.failed("default/g1")
    assert "wait for node n to be re-partitioned" in api.failed("default/g1")[-1]
    assert s.queue.counts().unschedulable == 2
    assert not api.bound_to


async def test_a_pod_that_ran_between_two_looks_restarts_the_idle_clock() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    NodeHandler(s).apply("ADDED", mig_node("m", **{"1g_10gb": 7}))
    assert s.mig.restore_idle(0.0) == []
    brief = pod("brief", mig="1g.10gb")
    brief["spec"]["nodeName"] = "m"
    s._bound.apply("ADDED", brief)  # a short job runs and is gone before the next look
    s._bound.apply("DELETED", brief)
    assert s.mig.restore_idle(61.0) == [], "idle for 60 s counted across a pod that ran"
    assert s.mig.restore_idle(122.0) == ["m"]
    stop(s)


def a_minute_idle(s: Scheduler) -> list[str]:
    """The nodes set back once the idle ones have been idle 61 s (none at the first look)."""
    assert s.mig.restore_idle(1000.0) == []
    return s.mig.restore_idle(1061.0)


OURS = {"nvidia.com/mig.config": "gpusched-0123456789ab", "nvidia.com/mig.config.state": "success"}
SOONER = {"mig": {"repartition": True, "restoreIdleSeconds": 3600, "restoreForWaitingSeconds": 60}}


async def test_an_idle_layout_that_waiting_mig_pods_cannot_use_is_set_back_sooner_for_a_new_one() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    for name in ("a", "b"):  # two idle nodes of ours, each one A100 as seven 1g.10gb instances
        NodeHandler(s).apply("ADDED", one_gpu_in_mig(name, "1g.10gb", 7, **OURS))
    s._pending.apply("ADDED", pod("big", mig="7g.80gb"))
    await batch(s)
    assert not api.bound_to
    assert "default/big" in {r.key for r in s.queue.parked()}
    assert s.mig.restore_idle(1000.0) == []
    assert s.mig.restore_idle(1059.0) == [], "not idle for restoreForWaitingSeconds yet"
    restored = s.mig.restore_idle(1061.0)
    assert restored in (["a"], ["b"]), f"one node serves the one pod: {restored}"
    assert s.mig.restore_idle(1070.0) == [], "a second node set back for a pod one is being set back for"
    await asyncio.sleep(0)
    node, labels = api.labelled[-1]
    assert (node, labels["nvidia.com/mig.config"]) == (restored[0], "all-disabled")
    # The MIG manager's part: the GPU whole again; the pod is drawn again and gets a layout there.
    whole = kit.node(node, 1, A100, **{"gpusched.io/mig-repartition": "true"})
    whole["metadata"]["labels"] |= {
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
        "gpusched.io/mig-requested-at": str(labels["gpusched.io/mig-requested-at"]),
    }
    NodeHandler(s).apply("MODIFIED", whole)
    assert node not in s.mig.jobs
    assert "default/big" not in {r.key for r in s.queue.parked()}
    await batch(s)
    job = s.mig.jobs[node]
    assert job.wanted["7g.80gb"] == 1
    assert "default/big" in job.pods
    stop(s)


async def test_no_node_is_set_back_sooner_for_pods_it_could_not_take_or_that_fit_its_layout() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    s._pending.apply("ADDED", pod("two", gpus=2))  # more GPUs than the node has
    hungry = pod("hungry", gpus=1)
    hungry["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "128"  # more CPU than it has
    s._pending.apply("ADDED", hungry)
    await batch(s)
    assert {"default/two", "default/hungry"} <= {r.key for r in s.queue.parked()}
    assert s.mig.restore_idle(1000.0) == []
    assert s.mig.restore_idle(1100.0) == [], "set back for a pod it could not take whole either"
    s._pending.apply("ADDED", pod("one", gpus=1))  # a whole GPU: the node could take it once whole
    await batch(s)
    assert s.mig.restore_idle(1101.0) == ["a"]
    stop(s)


async def test_an_idle_layout_is_not_set_back_sooner_with_the_rule_off_or_nobody_waiting() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {**SOONER["mig"], "restoreForWaitingSeconds": 0}})
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    s._pending.apply("ADDED", pod("big", mig="7g.80gb"))
    await batch(s)
    assert s.mig.restore_idle(1000.0) == []
    assert s.mig.restore_idle(2000.0) == []
    assert s.mig.restore_idle(4601.0) == ["a"], "restoreIdleSeconds still holds"
    stop(s)
    s = scheduler(MigApi(), SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    assert s.mig.restore_idle(1000.0) == [], "nobody waits"
    assert s.mig.restore_idle(2000.0) == [], "nobody waits"
    stop(s)


async def test_no_node_is_set_back_sooner_for_pods_their_tenants_limit_holds_back() -> None:
    api = MigApi()
    s = scheduler(api, {**SOONER, "tenants": {"label": "team", "quotas": {"a": {"quotaGpus": 0, "limitGpus": 0}}}})
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("n", "1g.10gb", 7, **OURS))
    held = pod("held", gpus=1)
    held["metadata"]["labels"]["team"] = "a"
    s._pending.apply("ADDED", held)
    await batch(s)
    assert "default/held" in {r.key for r in s.queue.parked()}
    assert s.mig.restore_idle(1000.0) == []
    assert s.mig.restore_idle(1100.0) == []
    free = pod("free", gpus=1)
    free["metadata"]["labels"]["team"] = "b"
    s._pending.apply("ADDED", free)
    await batch(s)
    assert s.mig.restore_idle(1101.0) == ["n"]
    stop(s)


async def test_a_node_re_partitioned_for_a_batch_also_gets_layouts_for_the_mig_pods_queued_beyond_it() -> None:
    for on in (True, False):
        api = MigApi()
        s = scheduler(api, {"mig": {"repartition": True, "partitionForQueued": on}, "batching": {"maxSize": 2}})
        add_node(s, "n", 8)
        for i in range(20):  # more than one GPU's seven 1g.10gb instances, in batches of two
            s._pending.apply("ADDED", pod(f"p{i:02d}", mig="1g.10gb"))
        await batch(s)
        ((_, job),) = s.mig.jobs.items()
        gpus = {g for g, _ in job.layouts}
        if on:
            assert job.wanted["1g.10gb"] >= 20, f"{job.layouts}"
            assert len(gpus) == 3, f"{job.layouts}"
            assert len(job.pods) == 2, "the queued pods are not told to wait before a batch places them"
            for _ in range(9):
                await batch(s)
            assert len(s.mig.jobs) == 1, "the later batches join the layout"
            assert len(job.pods) == 20, "the later batches join the layout"
        else:
            assert len(gpus) == 1, f"{job.layouts}"
        stop(s)


async def test_no_gpu_is_partitioned_ahead_for_queued_pods_that_could_not_go_there() -> None:
    api = MigApi()
    s = scheduler(api, {**ON, "batching": {"maxSize": 1}})
    add_node(s, "n", 8)
    s._pending.apply("ADDED", pod("first", mig="1g.10gb"))
    for i in range(10):
        elsewhere = pod(f"elsewhere{i}", mig="1g.10gb")
        elsewhere["spec"]["nodeSelector"] = {"pool": "other"}
        s._pending.apply("ADDED", elsewhere)
    s._pending.apply("ADDED", pod("small", mig="1g.5gb"))  # an A100 40GB profile, not of this GPU
    s._pending.apply("ADDED", pod("whole", gpus=1))
    await batch(s)
    ((_, job),) = s.mig.jobs.items()
    assert len(job.layouts) == 1, f"{job.layouts}"
    stop(s)


class SlowBindApi(MigApi):
    """Bindings are answered only once ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> Any:
        await self.go.wait()
        return await super().bind(pod, node, gpus)


async def test_pods_being_bound_are_no_queued_demand_for_more_layouts() -> None:
    api = SlowBindApi()
    s = scheduler(api, {**ON, "batching": {"maxSize": 7}})
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("m", "1g.10gb", 7))  # seven instances, not ours
    add_node(s, "n", 8)
    for i in range(7):
        s._pending.apply("ADDED", pod(f"a{i}", mig="1g.10gb"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))  # bound to m, slowly
    assert not s.mig.jobs
    s._pending.apply("ADDED", pod("late", mig="1g.10gb"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    ((_, job),) = s.mig.jobs.items()
    assert len(job.layouts) == 1, f"GPUs partitioned for pods being bound elsewhere: {job.layouts}"
    api.go.set()
    stop(s)


async def test_for_queued_does_not_count_pods_of_another_gpu_model() -> None:
    api = MigApi()
    s = scheduler(api, {**ON, "batching": {"maxSize": 1}})
    add_node(s, "n", 8)
    s._pending.apply("ADDED", pod("first", mig="1g.10gb"))
    for i in range(10):  # 1g.10gb is an H100 profile too; these accept only H100s
        h100 = pod(f"h100-{i}", mig="1g.10gb")
        h100["metadata"]["annotations"]["gpusched.io/gpu-models"] = "NVIDIA-H100-80GB-HBM3"
        s._pending.apply("ADDED", h100)
    await batch(s)
    ((_, job),) = s.mig.jobs.items()
    stop(s)
    assert len(job.layouts) == 1, f"A100 GPUs partitioned for H100-only pods: {job.layouts}"


async def test_for_queued_does_not_count_pods_their_tenants_limit_holds_back() -> None:
    api = MigApi()
    cfg = {**ON, "batching": {"maxSize": 10}, "tenants": {"label": "team", "quotas": {"a": {"limitGpus": 0}}}}
    s = scheduler(api, cfg)
    add_node(s, "n", 8)
    for i in range(10):
        held = pod(f"held{i}", mig="1g.10gb")
        held["metadata"]["labels"]["team"] = "a"
        s._pending.apply("ADDED", held)
    await batch(s)
    assert len(s.queue.parked()) == 10
    assert not s.mig.jobs
    free = pod("free", mig="1g.10gb")
    free["metadata"]["labels"]["team"] = "b"
    s._pending.apply("ADDED", free)
    await batch(s)
    ((_, job),) = s.mig.jobs.items()
    stop(s)
    assert len(job.layouts) == 1, f"GPUs partitioned for pods their tenant may not run: {job.layouts}"


def leaving(name: str, node: str) -> dict[str, Any]:
    obj = pod(name, gpus=1)
    obj["spec"]["nodeName"] = node
    obj["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    mark = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    obj["status"] = {"phase": "Running", "conditions": [mark]}
    return obj


async def test_no_node_is_set_back_sooner_for_a_pod_that_holds_room_its_victims_leave() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    add_node(s, "w", 1, repartition=False)
    s._bound.apply("ADDED", leaving("victim", "w"))
    urgent = pod("urgent", gpus=1, priority=50)
    urgent["status"] = {"phase": "Pending", "nominatedNodeName": "w"}
    s._pending.apply("ADDED", urgent)
    await batch(s)
    assert s.cache.nomination("default/urgent") == ("w", (0,), 1)
    assert "default/urgent" in {r.key for r in s.queue.parked()}
    restored = a_minute_idle(s)
    stop(s)
    assert restored == [], "set back for a pod whose room on w is held"


async def test_no_node_is_set_back_sooner_for_gang_members_waiting_beside_a_layout() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    add_node(s, "n", 1)  # whole, re-partitioned for g0
    add_node(s, "w", 1, repartition=False)  # g1 is planned here
    s._pending.apply("ADDED", pod("g0", mig="7g.80gb", gang="g"))
    s._pending.apply("ADDED", pod("g1", gpus=1, gang="g"))
    await batch(s)
    assert "n" in s.mig.jobs, s.mig.jobs
    assert "default/g1" in s.mig.jobs["n"].beside, s.mig.jobs
    restored = a_minute_idle(s)
    stop(s)
    assert restored == [], "set back for a gang member planned on w"


async def test_no_node_is_set_back_sooner_for_a_gang_short_of_members() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    s._pending.apply("ADDED", pod("g0", gpus=1, gang="g"))  # min-members 2, one member so far
    await batch(s)
    assert "default/g0" in {r.key for r in s.queue.parked()}
    restored = a_minute_idle(s)
    stop(s)
    assert restored == [], "set back for a gang that cannot start"


async def test_no_second_node_is_set_back_for_pods_a_restore_the_last_leader_asked_for_serves() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    being_set_back = {
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "pending",
        "gpusched.io/mig-requested-at": str(int(time.time())),
        "gpusched.io/mig-previous": "gpusched-0123456789ab",
    }
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("x", "1g.10gb", 7, **being_set_back))
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("a", "1g.10gb", 7, **OURS))
    assert "x" in s.mig.sealed()
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert "default/w" in {r.key for r in s.queue.parked()}
    restored = a_minute_idle(s)
    stop(s)
    assert restored == [], "a second node set back for the one pod x is being set back for"


async def test_no_second_node_is_set_back_while_the_restored_gpus_are_not_advertised_yet() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    for name in ("x", "y"):
        NodeHandler(s).apply("ADDED", one_gpu_in_mig(name, "1g.10gb", 7, **OURS))
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert s.mig.restore_idle(1000.0) == []
    (node,) = s.mig.restore_idle(1061.0)
    await asyncio.sleep(0)
    _, labels = api.labelled[-1]
    # The MIG manager says success; the device plugin has not registered the whole GPU yet.
    obj = kit.node(node, 1, A100, **{"gpusched.io/mig-repartition": "true"})
    obj["status"]["allocatable"] = {**obj["status"]["allocatable"], "nvidia.com/gpu": "0"}
    obj["metadata"]["labels"] |= {
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
        "gpusched.io/mig-requested-at": str(labels["gpusched.io/mig-requested-at"]),
    }
    NodeHandler(s).apply("MODIFIED", obj)
    await batch(s)  # w is drawn again, and parked again for a moment
    restored = s.mig.restore_idle(1090.0)
    stop(s)
    assert restored == [], f"{restored} set back too for the pod {node} was set back for"


async def test_no_node_is_set_back_sooner_for_a_pod_its_pod_limit_keeps_out() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)
    obj = one_gpu_in_mig("a", "1g.10gb", 7, **OURS)
    for st in ("capacity", "allocatable"):
        obj["status"][st]["pods"] = "1"
    NodeHandler(s).apply("ADDED", obj)
    agent = pod("agent")  # a CPU pod (a node agent) fills a's pod limit
    agent["spec"]["nodeName"] = "a"
    s._bound.apply("ADDED", agent)
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    restored = a_minute_idle(s)
    stop(s)
    assert restored == [], "set back for a pod the node cannot take whole either"


def apart_from(obj: dict[str, Any], app: str) -> dict[str, Any]:
    """``obj`` with a required pod anti-affinity to the pods labelled ``app``, per node."""
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}
    obj["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return obj


def on_port(obj: dict[str, Any], port: int) -> dict[str, Any]:
    """``obj`` binding host port ``port``."""
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return obj


async def test_no_node_is_set_back_sooner_for_a_pod_what_runs_there_keeps_out() -> None:
    # Set back for it, the pod would not land there after all; the next MIG job re-partitions
    # the node again, and so on, round after round.
    wrong = []
    for conflict in ("its anti-affinity", "theirs", "a host port"):
        api = MigApi()
        s = scheduler(api, SOONER)
        NodeHandler(s).apply("ADDED", one_gpu_in_mig("n", "1g.10gb", 7, **OURS))
        db = pod("db")  # a CPU pod on n, of another scheduler
        db["spec"].update(nodeName="n", schedulerName="default-scheduler")
        db["metadata"]["labels"] = {"app": "db"}
        w = pod("w", gpus=1)
        w["metadata"]["labels"] = {"app": "w"}
        if conflict == "its anti-affinity":
            apart_from(w, "db")
        elif conflict == "theirs":
            apart_from(db, "w")
        else:
            on_port(db, 8080)
            on_port(w, 8080)
        s._bound.apply("ADDED", db)
        s._pending.apply("ADDED", w)
        await batch(s)
        if a_minute_idle(s):
            wrong.append(conflict)
        stop(s)
    assert not wrong, f"set back for a pod the node would not take whole either: {wrong}"
    # Nothing there that keeps it out: set back.
    api = MigApi()
    s = scheduler(api, SOONER)
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("n", "1g.10gb", 7, **OURS))
    db = on_port(pod("db"), 8080)
    db["spec"].update(nodeName="n", schedulerName="default-scheduler")
    db["metadata"]["labels"] = {"app": "db"}
    s._bound.apply("ADDED", db)
    s._pending.apply("ADDED", on_port(apart_from(pod("w", gpus=1), "cache"), 8081))
    await batch(s)
    assert a_minute_idle(s) == ["n"]
    stop(s)


async def test_for_queued_leaves_the_gpus_kept_free_to_pods_of_high_priority() -> None:
    api = MigApi()
    cfg = {**ON, "batching": {"maxSize": 2}, "headroom": {"gpus": 2, "priorityAtLeast": 1000}}
    s = scheduler(api, cfg)
    add_node(s, "n", 3)
    s._pending.apply("ADDED", pod("critical", mig="7g.80gb", priority=1000))
    s._pending.apply("ADDED", pod("low", mig="7g.80gb"))  # below the headroom: two GPUs are kept
    for i in range(5):
        s._pending.apply("ADDED", pod(f"q{i}", mig="7g.80gb"))  # queued, below the headroom too
    await batch(s)
    job = s.mig.jobs["n"]
    kept = {g for name, g in s._kept_last if name == "n"}
    stop(s)
    assert len(kept) == 2
    assert list(job.pods) == ["default/critical"]
    on_kept = kept & {g for g, _ in job.layouts}
    assert len(on_kept) <= 1, f"kept GPUs {sorted(on_kept)} partitioned, one for critical, the rest for low pods"


async def test_no_more_nodes_are_set_back_sooner_than_a_tenants_limit_lets_its_pods_use() -> None:
    api = MigApi()
    s = scheduler(api, {**SOONER, "tenants": {"label": "team", "quotas": {"a": {"limitGpus": 1}}}})
    for name in ("x", "y"):
        NodeHandler(s).apply("ADDED", one_gpu_in_mig(name, "1g.10gb", 7, **OURS))
    for i in range(2):  # each within the limit alone; together past it
        w = pod(f"w{i}", gpus=1)
        w["metadata"]["labels"]["team"] = "a"
        s._pending.apply("ADDED", w)
    await batch(s)
    assert {"default/w0", "default/w1"} <= {r.key for r in s.queue.parked()}
    restored = a_minute_idle(s)
    stop(s)
    assert len(restored) == 1, f"{restored} set back; tenant a may run one more GPU pod"


async def test_no_node_is_set_back_sooner_for_a_pod_a_node_set_back_for_idling_long_takes() -> None:
    api = MigApi()
    s = scheduler(api, SOONER)  # restoreIdleSeconds 3600, restoreForWaitingSeconds 60
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("x", "1g.10gb", 7, **OURS))
    assert s.mig.restore_idle(0.0) == []
    NodeHandler(s).apply("ADDED", one_gpu_in_mig("y", "1g.10gb", 7, **OURS))
    assert s.mig.restore_idle(3550.0) == []
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert s.mig.restore_idle(3601.0) == ["x"]  # idle an hour: set back, whole GPU for w
    restored = s.mig.restore_idle(3611.0)
    stop(s)
    assert restored == [], "y set back too for the one pod x's whole GPU takes"


async def test_a_node_pods_run_on_is_not_set_back_when_its_instances_vanish_for_a_moment() -> None:
    # Its layout came under another leader, which left the request label.  This leader removes
    # it; and should the removal have failed, a device plugin restart (no instance advertised
    # for a moment) must not read as a request never answered: the node is not set back.
    api = EventApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 60}})

    def seen(**slices: int) -> dict[str, Any]:
        obj = mig_node("m", **slices)
        obj["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(int(time.time()) - 7200)
        return obj

    NodeHandler(s).apply("ADDED", seen(**{"1g_10gb": 7}))
    running = pod("r", mig="1g.10gb")
    running["spec"]["nodeName"] = "m"
    s._bound.apply("ADDED", running)
    await asyncio.sleep(0)
    assert ("m", {"gpusched.io/mig-requested-at": None}) in api.labelled
    for _ in range(2):  # the label still there, no instance advertised
        NodeHandler(s).apply("MODIFIED", seen())
        s.mig.expire_asks()
        await asyncio.sleep(0)
    assert not [labels for _, labels in api.labelled if "nvidia.com/mig.config" in labels], api.labelled
    # Its instances are offered to no pod meanwhile, and the admin is told why, once.
    assert "m" in s.mig.sealed()
    (told,) = [(m, kind) for node, reason, m, kind in api.node_events if reason == "MigRepartitionTimeout"]
    assert told[1] == "Warning"
    assert "Pods run on its MIG instances (default/r)" in told[0], told
    s.mig.hidden["m"] -= 4 * 60 + 1  # four times timeoutSeconds on: offered again, forgotten
    s.mig.expire_asks()
    assert "m" not in s.mig.sealed()
    assert "m" not in s.mig.hidden  # a later timeout there is sealed and told anew
    NodeHandler(s).apply("MODIFIED", seen(**{"1g_10gb": 7}))  # the device plugin is back
    assert "m" not in s.mig.sealed()
    stop(s)


async def test_a_node_deleted_while_the_node_watch_was_down_is_forgotten_at_the_relist() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True}})
    waiting = mig_node("gone")  # labelled for a layout of ours, no instance yet
    waiting["metadata"]["labels"]["gpusched.io/mig-requested-at"] = str(int(time.time()))
    del waiting["metadata"]["labels"]["nvidia.com/mig.config.state"]
    NodeHandler(s).apply("ADDED", waiting)
    assert "gone" in s.mig.asked
    NodeHandler(s).replace([kit.node("other", 8, A100)])
    assert "gone" not in s.mig.asked
    s.mig.expire_asks()
    await asyncio.sleep(0)
    stop(s)
    assert not api.labelled  # no write to a node that is not there


@pytest.mark.parametrize(("failed_ago_s", "set_back"), [(3600, False), (90_000, True)])
async def test_a_node_whose_restore_failed_is_not_set_back_again_for_a_day_by_any_leader(
    failed_ago_s: int, set_back: bool
) -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})  # a new leader
    node = mig_node("m", **{"1g_10gb": 7})
    node["metadata"]["labels"]["gpusched.io/mig-restore-failed-at"] = str(int(time.time()) - failed_ago_s)
    NodeHandler(s).apply("ADDED", node)
    s.mig.restore_idle(0.0)
    assert s.mig.restore_idle(1000.0) == (["m"] if set_back else [])
    stop(s)


async def test_a_layout_an_admin_takes_back_to_the_old_configuration_ends_the_wait_at_once() -> None:
    api = MigApi()
    s = scheduler(api)
    add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-disabled"})  # as the GPU operator labels it
    s._pending.apply("ADDED", pod("w", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0.05)  # the label is written (configDelaySeconds 0)
    job = s.mig.jobs["n"]
    assert job.labelled
    add_node(s, "n", 1, **{"nvidia.com/mig.config": job.config, "nvidia.com/mig.config.state": "pending"})
    assert "n" in s.mig.jobs  # ours, on its way
    assert job.before == "all-disabled"
    add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-disabled"})  # the admin's word
    for _ in range(5):  # the pod's Event goes out
        await asyncio.sleep(0)
    stop(s)
    assert "n" not in s.mig.jobs
    assert "relabelled" in api.failed("default/w")[-1]


async def test_no_pod_is_preempted_on_a_node_being_repartitioned() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 600}})
    asked = {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "pending",
        "gpusched.io/mig-requested-at": str(int(time.time())),
    }
    add_node(s, "n", 1, **asked)  # sealed: its GPUs are the MIG manager's until it is done
    low = pod("low", gpus=1)
    low["spec"]["nodeName"] = "n"
    s._bound.apply("ADDED", low)
    s._pending.apply("ADDED", pod("urgent", gpus=1, priority=100))
    await batch(s)
    stop(s)
    assert s.cache.nomination("default/urgent") is None  # no victim evicted for room it could not have
    assert api.failed("default/urgent")


def failed_restore(name: str, requested: str, **labels: str) -> dict[str, Any]:
    """A node labelled back to whole GPUs by gpusched that the MIG manager failed on: its
    instances still advertised."""
    obj = mig_node(name, config="all-disabled", **{"1g_10gb": 7})
    obj["metadata"]["labels"] |= {
        "gpusched.io/mig-requested-at": requested,
        "gpusched.io/mig-previous": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "failed",
        **labels,
    }
    return obj


async def test_a_restore_the_last_leader_saw_fail_is_labelled_with_its_layout_by_the_next() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "timeoutSeconds": 10}})
    NodeHandler(s).apply("ADDED", failed_restore("m", str(int(time.time()) - 5)))  # a new leader's first look
    await asyncio.sleep(0)
    back = [labels for node, labels in api.labelled if node == "m"]
    assert back, "not relabelled with the layout it had"
    assert back[0]["nvidia.com/mig.config"] == "gpusched-0123456789ab"
    assert back[0]["gpusched.io/mig-requested-at"] is None
    NodeHandler(s).apply("MODIFIED", mig_node("m", **{"1g_10gb": 7}))  # the watch shows the relabel
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    stop(s)
    assert api.bound_to.get("default/p") == "m", "its instances sealed for good"


async def test_a_failed_restore_whose_relabel_failed_is_relabelled_at_the_next_look() -> None:
    api = MigApi()
    orig = api.label_node
    answers = ["503 the server is currently unable to handle the request"]

    async def label(node: str, labels: dict[str, str | None]) -> str:
        if "nvidia.com/mig.config" in labels and answers:
            api.labelled.append((node, labels))
            return answers.pop()
        return await orig(node, labels)

    api.label_node = label  # type: ignore[method-assign]
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "timeoutSeconds": 10}})
    NodeHandler(s).apply("ADDED", failed_restore("m", str(int(time.time()) - 5)))
    await asyncio.sleep(0)
    assert len(api.labelled) == 1
    assert "m" in s.mig.sealed()
    s.mig.expire_asks()  # the next batch, or the next look for idle nodes; no update of the node
    await asyncio.sleep(0)
    stop(s)
    assert len(api.labelled) == 2, "not tried again"
    assert api.labelled[-1][1]["nvidia.com/mig.config"] == "gpusched-0123456789ab"
    NodeHandler(s).apply("MODIFIED", mig_node("m", **{"1g_10gb": 7}))  # the MIG manager applied it
    assert "m" not in s.mig.sealed()


async def test_a_layout_is_not_given_up_while_the_mig_manager_reboots_the_node_for_it() -> None:
    api = HookApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 10, "configDelaySeconds": 0}})
    add_node(s, "n", 1)

    def expire_soon() -> None:  # the timeout, 0.2 s from now rather than 10 s
        api.after_event = None
        s.mig.jobs["n"].asked -= 9.8

    api.after_event = expire_soon
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    (_, asked) = api.labelled[-1]
    rebooting = kit.node("n", 0, A100, **{"gpusched.io/mig-repartition": "true"})  # the device plugin is down
    rebooting["metadata"]["labels"] |= {
        "nvidia.com/mig.config": str(asked["nvidia.com/mig.config"]),
        "gpusched.io/mig-requested-at": str(asked["gpusched.io/mig-requested-at"]),
        "nvidia.com/mig.config.state": "rebooting",
    }
    NodeHandler(s).apply("MODIFIED", rebooting)
    await asyncio.sleep(0.4)
    stop(s)
    assert [labels for _, labels in api.labelled[1:]] == [], "set back while the MIG manager was at work"
    assert "n" in s.mig.jobs, "the pods waiting for it were told it failed"


async def test_another_leaders_layout_is_waited_for_while_the_mig_manager_works_at_most_four_timeouts() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 10}})

    def asked(ago: int, state: str) -> None:
        labels = {
            "nvidia.com/mig.config": "gpusched-0123456789ab",
            "nvidia.com/mig.config.state": state,
            "gpusched.io/mig-requested-at": str(int(time.time()) - ago),
        }
        add_node(s, "n", 0, **labels)

    asked(15, "rebooting")
    s.mig.expire_asks()
    assert "n" in s.mig.sealed()
    assert not api.labelled
    asked(15, "success")  # back from the reboot; the device plugin not registered yet
    s.mig.expire_asks()
    assert "n" in s.mig.sealed(), "the timeout runs again from when the reboot ended"
    assert not api.labelled
    asked(41, "rebooting")
    s.mig.expire_asks()
    await asyncio.sleep(0)
    stop(s)
    assert [labels.get("nvidia.com/mig.config") for _, labels in api.labelled] == ["all-disabled"]


async def test_a_new_leader_gives_a_layout_the_mig_manager_just_applied_a_timeout_of_its_own() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 600}})
    # Labelled 700 s ago by the last leader; the MIG manager rebooted the node for most of that and
    # has just reported success; the device plugin has not registered the instances yet.
    asked = {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        LABEL_STATE: "success",
        "gpusched.io/mig-requested-at": str(int(time.time()) - 700),
    }
    add_node(s, "n", 0, **asked)
    s.mig.expire_asks()
    await asyncio.sleep(0)
    assert not api.labelled, "set back to all-disabled and taken out moments after its layout was applied"
    assert "n" in s.mig.sealed()
    # A timeout after this leader first saw it, the instances still not there: set back.
    s.mig.asked_seen["n"] = (s.mig.asked["n"], time.monotonic() - 600)
    s.mig.expire_asks()
    await asyncio.sleep(0)
    assert [labels.get("nvidia.com/mig.config") for _, labels in api.labelled] == ["all-disabled"]
    stop(s)
    # Four timeouts after the label, a leader that has just started gives it up at once.
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 600}})
    add_node(s, "n", 0, **{**asked, "gpusched.io/mig-requested-at": str(int(time.time()) - 2401)})
    assert "n" not in s.mig.sealed()
    s.mig.expire_asks()
    await asyncio.sleep(0)
    stop(s)
    assert [labels.get("nvidia.com/mig.config") for _, labels in api.labelled] == ["all-disabled"]


async def test_a_layout_the_mig_manager_failed_on_is_labelled_back_before_its_gpus_are_offered_whole() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 10, "configDelaySeconds": 0}})
    add_node(s, "n", 2, **{"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"})
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0.05)
    (_, asked) = api.labelled[-1]
    config = str(asked["nvidia.com/mig.config"])
    # mig-parted failed (a GPU reset refused); the device plugin is back with both GPUs whole.
    failed = {"nvidia.com/mig.config": config, "nvidia.com/mig.config.state": "failed"}
    add_node(s, "n", 2, **failed, **{"gpusched.io/mig-requested-at": str(asked["gpusched.io/mig-requested-at"])})
    await asyncio.sleep(0)
    assert [(node, unstamped(labels)) for node, labels in api.labelled[1:]] == [
        (
            "n",
            {
                "nvidia.com/mig.config": "all-disabled",
                "gpusched.io/mig-requested-at": None,
                "gpusched.io/mig-repartition": "false",
            },
        )
    ], "the MIG manager applies the failed layout again whenever its pod restarts"
    s._pending.apply("ADDED", pod("w", gpus=2))
    await batch(s)
    assert "default/w" not in api.bound_to, "bound before the MIG manager has set the GPUs back"
    for state in ("failed", "pending", "success"):  # the watch shows the label; the MIG manager applies it
        add_node(s, "n", 2, repartition=False, **{"nvidia.com/mig.config": "all-disabled", LABEL_STATE: state})
        assert ("n" in s.mig.sealed()) == (state != "success"), state
    await batch(s)
    stop(s)
    assert api.bound_to.get("default/w") == "n"


async def test_a_node_being_set_back_after_a_failed_layout_stays_sealed_for_the_next_leader() -> None:
    # The leader that labelled it back goes away before the MIG manager acts on the label: the
    # next one (or the same daemon restarted) binds no pod to GPUs the MIG manager may reset.
    cfg = {"mig": {"repartition": True, "timeoutSeconds": 10, "configDelaySeconds": 0}}
    api = MigApi()
    s = scheduler(api, cfg)
    add_node(s, "n", 2, **{"nvidia.com/mig.config": "all-disabled", LABEL_STATE: "success"})
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0.05)
    (_, asked) = api.labelled[-1]
    failed = {"nvidia.com/mig.config": str(asked["nvidia.com/mig.config"]), LABEL_STATE: "failed"}
    add_node(s, "n", 2, **failed, **{"gpusched.io/mig-requested-at": str(asked["gpusched.io/mig-requested-at"])})
    await asyncio.sleep(0)
    (_, back) = api.labelled[-1]
    assert back["nvidia.com/mig.config"] == "all-disabled"
    stop(s)
    left = {k: str(v) for k, v in back.items() if v is not None}  # the node as it left it
    api = MigApi()
    s = scheduler(api, cfg)
    add_node(s, "n", 2, repartition=False, **left, **{LABEL_STATE: "failed"})
    s.mig.lead()
    s._pending.apply("ADDED", pod("w", gpus=2))
    await batch(s)
    assert "default/w" not in api.bound_to, "bound to GPUs the MIG manager is about to reset"
    assert "1 node being re-partitioned into MIG instances was not offered" in api.failed("default/w")[-1]
    # The MIG manager applies the label: the node is offered again, and the mark is removed.
    for _ in range(2):  # (the second time, the mark's removal not seen yet)
        add_node(s, "n", 2, repartition=False, **left, **{LABEL_STATE: "success"})
        assert "n" not in s.mig.sealed()
    await batch(s)
    stop(s)
    assert api.bound_to.get("default/w") == "n"
    assert ("n", {"gpusched.io/mig-setting-back-at": None}) in api.labelled


async def test_a_restore_is_not_over_when_the_device_plugin_restarts_before_the_mig_manager_acts() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60}})
    asked = await _restoring(s, api)

    def seen(state: str, slices: int) -> dict[str, Any]:
        obj = mig_node("m", config="all-disabled", **{"1g_10gb": slices})
        obj["metadata"]["labels"] |= {
            "gpusched.io/mig-requested-at": str(asked["gpusched.io/mig-requested-at"]),
            "gpusched.io/mig-previous": "gpusched-0123456789ab",
            "nvidia.com/mig.config.state": state,  # "success": still the state of the layout
        }
        return obj

    NodeHandler(s).apply("MODIFIED", seen("success", 0))  # the device plugin restarts: nothing advertised
    await asyncio.sleep(0)
    assert api.labelled[1:] == [], "the request dropped, for every leader, before the MIG manager acted"
    NodeHandler(s).apply("MODIFIED", seen("success", 7))
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert "default/p" not in api.bound_to, "bound to an instance the MIG manager is about to destroy"
    NodeHandler(s).apply("MODIFIED", seen("pending", 7))
    NodeHandler(s).apply("MODIFIED", seen("success", 0))  # done: the whole GPUs to follow
    await asyncio.sleep(0)
    stop(s)
    assert "m" not in s.mig.jobs


async def test_no_request_or_previous_layout_is_left_on_a_node_once_its_layout_or_restore_is_over() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "configDelaySeconds": 0}})
    # Whole GPUs again after a restore: the layout they replace is no longer anyone's to go back to.
    asked = await _restoring(s, api)
    whole = kit.node("m", 8, A100, **{"gpusched.io/mig-repartition": "true", "nvidia.com/mig.config": "all-disabled"})
    whole["metadata"]["labels"] |= {
        "nvidia.com/mig.config.state": "success",
        "gpusched.io/mig-requested-at": str(asked["gpusched.io/mig-requested-at"]),
        "gpusched.io/mig-previous": "gpusched-0123456789ab",
    }
    NodeHandler(s).apply("MODIFIED", whole)
    await asyncio.sleep(0)
    assert api.labelled[-1] == ("m", {"gpusched.io/mig-requested-at": None, "gpusched.io/mig-previous": None})
    # A layout an admin relabels the node from: the request is over for every leader.
    add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-disabled"})
    s._pending.apply("ADDED", pod("w", mig="1g.10gb"))
    await batch(s)
    await asyncio.sleep(0.05)
    config = s.mig.jobs["n"].config
    add_node(s, "n", 1, **{"nvidia.com/mig.config": config, "nvidia.com/mig.config.state": "pending"})
    add_node(s, "n", 1, **{"nvidia.com/mig.config": "all-1g.10gb"})
    await asyncio.sleep(0)
    stop(s)
    assert api.labelled[-1] == ("n", {"gpusched.io/mig-requested-at": None})


async def test_a_node_a_dead_mig_manager_left_pending_is_offered_again_after_four_timeouts_with_one_warning() -> None:
    api = EventApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 10}})
    add_node(s, "n", 1, **{LABEL_STATE: "pending"})
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert "default/w" not in api.bound_to
    s.mig.busy_since["n"] -= 41  # four timeouts on, the MIG manager gone, its label left behind
    add_node(s, "n", 1, **{LABEL_STATE: "pending"})  # the node's next update: still pending
    s.queue.move_all()
    await batch(s)
    s.mig.expire_asks()  # the next look
    add_node(s, "n", 1, **{LABEL_STATE: "rebooting"})
    s.mig.expire_asks()
    await asyncio.sleep(0)
    stop(s)
    assert api.bound_to.get("default/w") == "n", "sealed for good by a state label nobody will change"
    stuck = [(node, message) for node, reason, message in api.events if reason == "MigManagerStuck"]
    assert len(stuck) == 1, api.events
    assert stuck[0][0] == "n"
    assert "nvidia.com/mig.config.state=pending" in stuck[0][1]


async def test_a_layout_that_failed_while_this_instance_followed_is_set_back_once_it_leads() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "timeoutSeconds": 10}})
    s._leadership(False)  # another replica leads
    failed = {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        LABEL_STATE: "failed",
        "gpusched.io/mig-requested-at": str(int(time.time()) - 5),
    }
    add_node(s, "n", 2, **failed)  # the MIG manager failed while the other replica led; it then died
    assert not api.labelled, "a follower labels nothing"
    s._leadership(True)  # no update of the node since
    await asyncio.sleep(0)
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    stop(s)
    assert "default/w" not in api.bound_to, "bound to GPUs the MIG manager applies the failed layout to again"
    assert [labels.get("nvidia.com/mig.config") for _, labels in api.labelled] == ["all-disabled"]


async def test_a_restore_that_partly_happened_is_sealed_until_its_layout_is_applied_again() -> None:
    api = MigApi()
    s = scheduler(api, {"mig": {"repartition": True, "restoreIdleSeconds": 60, "timeoutSeconds": 10}})
    NodeHandler(s).apply("ADDED", failed_restore("m", str(int(time.time()) - 5)))
    await asyncio.sleep(0)
    assert api.labelled[-1][1]["nvidia.com/mig.config"] == "gpusched-0123456789ab"

    def seen(state: str, slices: int, gpus: int) -> dict[str, Any]:
        obj = mig_node("m", **{"1g_10gb": slices})
        obj["metadata"]["labels"][LABEL_STATE] = state
        for st in ("capacity", "allocatable"):
            obj["status"][st]["nvidia.com/gpu"] = str(gpus)
        return obj

    # The relabel seen, the restore's "failed" still the state: one GPU had been set back whole.
    NodeHandler(s).apply("MODIFIED", seen("failed", 3, 1))
    s._pending.apply("ADDED", pod("w", gpus=1))
    await batch(s)
    assert "default/w" not in api.bound_to, "bound to a GPU the MIG manager is about to re-partition"
    NodeHandler(s).apply("MODIFIED", seen("pending", 3, 1))
    assert "m" in s.mig.sealed()
    NodeHandler(s).apply("MODIFIED", seen("success", 7, 0))  # its layout back
    stop(s)
    assert "m" not in s.mig.sealed()


class EvictingMigApi(MigApi):
    """Records the pods evicted too: (victim, preemptor, node)."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[tuple[str, str, str]] = []

    async def preempt(self, victim: Pod, by: Pod, node: str, why: str = "") -> bool:
        self.evicted.append((victim.key, by.key, node))
        return True

    async def unschedulable(self, *_: Any, **__: Any) -> None:
        pass


async def test_a_mig_pod_takes_over_no_room_without_an_instance_of_its_profile() -> None:
    # mid preempted low for n0's one whole GPU.  high, a MIG pod of higher priority, would fit
    # there only once the GPU is re-partitioned, which room held for a pod is not: it is bound
    # as it is.  So mid keeps its room, and high waits.
    api = EvictingMigApi()
    s = scheduler(api)
    add_node(s, "n0", 1)
    low = kit.pod("low", "s", gpus=1, node_name="n0")
    low["metadata"].update({"namespace": "default", "uid": "uid-low", "labels": {}})
    low["spec"]["priority"] = 0
    s._bound.apply("ADDED", low)
    s._pending.apply("ADDED", pod("mid", gpus=1, priority=50))
    await batch(s)
    assert api.evicted == [("default/low", "default/mid", "n0")]
    low["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", low)
    s._pending.apply("ADDED", pod("high", mig="1g.10gb", priority=100))
    await batch(s)
    assert s.cache.nomination("default/high") is None
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)
    s._bound.apply("DELETED", low)
    await batch(s)
    assert api.bound_to == {"default/mid": "n0"}
    assert api.evicted == [("default/low", "default/mid", "n0")]
    stop(s)


async def test_no_gpu_is_kept_for_critical_pods_on_a_node_being_repartitioned() -> None:
    from tests.test_daemon_utilisation import gauge

    api = MigApi()
    s = scheduler(api, {**ON, "headroom": {"gpus": 1, "priorityAtLeast": 1000}})
    add_node(s, "n0", 2, **{"nvidia.com/mig.config.state": "pending"})  # the MIG manager at work
    assert "n0" in s.mig.sealed()
    s.gauges.refresh()
    assert gauge(s, "gpusched_gpus_kept_free") == 0.0  # none that anyone could use
    s._pending.apply("ADDED", pod("critical", gpus=1, priority=1000))
    s._pending.apply("ADDED", pod("low", gpus=1))
    await batch(s)
    assert api.bound_to == {}, "not through the headroom either"
    stop(s)


async def test_mig_pods_waiting_look_again_as_soon_as_repartitioning_is_turned_on() -> None:
    """A MIG pod no node offers its instance to is parked; the researcher's ConfigMap turns
    re-partitioning on: the pod is drawn again at once, not at the next flush a minute later."""
    api = MigApi()
    s = scheduler(api, {})
    add_node(s, "n", 1)
    s._pending.apply("ADDED", pod("p", mig="1g.10gb"))
    await batch(s)
    assert s.queue.counts().unschedulable == 1
    s.set_config(parse_config({"mig": {"repartition": True, "configDelaySeconds": 0}}))
    await batch(s)  # drawn within the test's wait, not after the minute's flush
    assert [n for n, _ in api.labelled] == ["n"]
    stop(s)


def with_cpu(obj: dict[str, Any], cpu: str) -> dict[str, Any]:
    """``obj`` asking for ``cpu`` CPUs."""
    obj["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu
    return obj


def cpu_node(name: str, cpu: str, **labels: str) -> dict[str, Any]:
    """A node with one whole A100 that may be re-partitioned, and ``cpu`` CPUs."""
    return kit.node(name, 1, A100, cpu=cpu, **{"gpusched.io/mig-repartition": "true", **labels})


def laid_out(name: str, cpu: str, asked: dict[str, str | None]) -> dict[str, Any]:
    """``cpu_node`` once the MIG manager applied the layout labelled ``asked``: 7 x 1g.10gb."""
    obj = cpu_node(name, cpu, **{k: str(v) for k, v in asked.items()}, **{LABEL_STATE: "success"})
    for st in ("capacity", "allocatable"):
        obj["status"][st] = {**obj["status"][st], "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}
    return obj


async def test_a_mig_pod_joins_a_layout_only_if_it_fits_beside_the_pods_waiting_for_it() -> None:
    # 6 + 6 CPUs on an 8-CPU node: promised both, the node takes one once its layout comes, and
    # the other waited a whole re-partition for nothing before a second node is re-partitioned.
    api = MigApi()
    s = scheduler(api)
    NodeHandler(s).apply("ADDED", cpu_node("n", "8"))
    s._pending.apply("ADDED", with_cpu(pod("first", mig="1g.10gb"), "6"))
    await batch(s)
    job = s.mig.jobs["n"]
    ((_, asked),) = api.labelled
    NodeHandler(s).apply("MODIFIED", cpu_node("n", "8", **{k: str(v) for k, v in asked.items()}))
    s._pending.apply("ADDED", with_cpu(pod("second", mig="1g.10gb"), "6"))
    await batch(s)
    assert sorted(job.pods) == ["default/first"], "promised an instance on a node without the CPUs for it"
    assert not any("Waiting for node n" in m for m in api.failed("default/second")), api.failed("default/second")
    # Another node comes, and n's layout: first lands on n, second waits for the new node's.
    NodeHandler(s).apply("ADDED", cpu_node("m", "8"))
    await batch(s)
    assert list(s.mig.jobs) == ["n", "m"], s.mig.jobs
    assert sorted(s.mig.jobs["m"].pods) == ["default/second"]
    NodeHandler(s).apply("MODIFIED", laid_out("n", "8", asked))
    await batch(s)
    stop(s)
    assert api.bound_to == {"default/first": "n"}
    assert "Waiting for node m" in api.failed("default/second")[-1]


async def test_no_cpu_pod_takes_the_room_a_mig_pod_waits_for_on_a_node_being_repartitioned() -> None:
    # A node being re-partitioned is closed to GPU pods only: a CPU pod bound there meanwhile
    # left the MIG pod "Insufficient cpu" once its layout came, and the node idle with 7 instances.
    api = MigApi()
    s = scheduler(api)
    NodeHandler(s).apply("ADDED", cpu_node("n", "8"))
    s._pending.apply("ADDED", with_cpu(pod("first", mig="1g.10gb"), "6"))
    await batch(s)
    ((_, asked),) = api.labelled
    NodeHandler(s).apply("MODIFIED", cpu_node("n", "8", **{k: str(v) for k, v in asked.items()}))
    s._pending.apply("ADDED", with_cpu(pod("cpu"), "4"))
    await batch(s)
    assert "default/cpu" not in api.bound_to, "bound to the CPUs the MIG pod waits to take there"
    NodeHandler(s).apply("MODIFIED", laid_out("n", "8", asked))
    await batch(s)
    stop(s)
    assert api.bound_to == {"default/first": "n"}, api.failed("default/first")[-1:]


async def test_no_pod_takes_the_host_port_of_a_mig_pod_waiting_for_its_layout_nor_breaks_its_anti_affinity() -> None:
    wrong = []
    for conflict in ("a host port", "its anti-affinity", "theirs", "none"):
        api = MigApi()
        s = scheduler(api)
        add_node(s, "n", 1)
        first = pod("first", mig="1g.10gb")
        first["metadata"]["labels"] = {"app": "first"}
        other = pod("other")  # a CPU pod: a node being re-partitioned takes it
        other["metadata"]["labels"] = {"app": "other"}
        if conflict == "a host port":
            on_port(first, 8080)
            on_port(other, 8080)
        elif conflict == "its anti-affinity":
            apart_from(first, "other")
        elif conflict == "theirs":
            apart_from(other, "first")
        s._pending.apply("ADDED", first)
        await batch(s)
        assert list(s.mig.jobs) == ["n"]
        s._pending.apply("ADDED", other)
        await batch(s)
        if (api.bound_to.get("default/other") == "n") != (conflict == "none"):
            wrong.append(conflict)
        stop(s)
    assert not wrong, f"placed as if the MIG pod waiting for the node were not there: {wrong}"


async def test_gang_members_waiting_beside_a_layout_hold_their_room_on_the_node_planned_for_them() -> None:
    api = MigApi()
    s = scheduler(api)
    NodeHandler(s).apply("ADDED", cpu_node("n", "2"))  # re-partitioned for g0
    NodeHandler(s).apply("ADDED", kit.node("w", 0, A100, cpu="8"))  # g1's CPUs
    s._pending.apply("ADDED", pod("g0", mig="1g.10gb", gang="g"))
    s._pending.apply("ADDED", with_cpu(pod("g1", gang="g"), "6"))
    await batch(s)
    assert s.mig.jobs["n"].beside["default/g1"][1] == "w", s.mig.jobs
    s._pending.apply("ADDED", with_cpu(pod("cpu"), "4"))
    await batch(s)
    stop(s)
    assert "default/cpu" not in api.bound_to, "bound to the CPUs a gang member waits to take there"


async def _cpu_pod_after_the_wait(end: str) -> list[str]:
    """A MIG pod waits for node n's layout, with 6 of its 8 CPUs; a 4-CPU pod finds no room there.
    Then the wait ends (``end``): what the CPU pod was told last, unless it is bound to n."""
    api = HookEventApi()
    s = scheduler(api)

    def expire_soon() -> None:  # the timeout, 1 s from now rather than 600 s
        api.after_event = None
        s.mig.jobs["n"].asked -= float(s.config.mig.timeout_seconds) - 1.0

    if end == "timeout":
        api.after_event = expire_soon
    NodeHandler(s).apply("ADDED", cpu_node("n", "8"))
    first = with_cpu(pod("first", mig="1g.10gb"), "6")
    s._pending.apply("ADDED", first)
    await batch(s)
    ((_, asked),) = api.labelled
    labels = {k: str(v) for k, v in asked.items()}
    NodeHandler(s).apply("MODIFIED", cpu_node("n", "8", **labels))
    s._pending.apply("ADDED", with_cpu(pod("cpu"), "4"))
    await batch(s)
    assert "default/cpu" not in api.bound_to, end
    if end == "failed":
        NodeHandler(s).apply("MODIFIED", cpu_node("n", "8", **labels, **{LABEL_STATE: "failed"}))
    elif end == "timeout":
        await until(lambda: "n" not in s.mig.jobs, "the layout timed out")
    else:
        s._pending.apply("DELETED", first)
    await batch(s)
    stop(s)
    return [] if api.bound_to.get("default/cpu") == "n" else api.failed("default/cpu")[-1:]


async def test_the_room_a_mig_pod_waits_with_is_free_once_its_layout_fails_or_times_out_or_it_is_gone() -> None:
    # (A CPU pod: a node being set back after its layout failed or timed out takes it.)
    wrong = {end: told for end in ("failed", "timeout", "deleted") if (told := await _cpu_pod_after_the_wait(end))}
    assert not wrong, f"the room stayed held after the wait was over: {wrong}"
