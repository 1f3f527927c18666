"""Consolidation in the daemon: which pods are evicted, when a round runs at all, and that a
round never undoes the last one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.config import parse_config
from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder
from gpusched.kube.client import Kube, Response
from gpusched.kube.convert import BIND_COMPLETED, pod_record
from gpusched.model import Pod
from tests.doubles import IdleClient, RecordingApi, one_node_scheduler, settle
from tests.e2e import kit
from tests.test_daemon_utilisation import pod


class EvictionApi(RecordingApi):
    """Records the pods evicted through the Eviction API (each succeeds unless refused)."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.evicted: list[str] = []
        self.refuse = refuse

    async def evict(self, victim: Pod, node: str, why: str) -> bool:
        if self.refuse:
            return False
        self.evicted.append(victim.key)
        await self.event(victim, "Consolidating", f"Evicted from node {node}: {why}")
        return True


class EvictingServer:
    """An API server that accepts every request, recording the pods evicted."""

    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def request(
        self, method: str, path: str, body: Any = None, before_send: Callable[[], None] | None = None, **_: Any
    ) -> Response:
        if before_send is not None:
            before_send()
        if path.endswith("/eviction"):
            self.evicted.append(f"{body['metadata']['namespace']}/{body['metadata']['name']}")
        return Response(201, {})


def batch_pod(name: str, node: str, gpu: int, *, movable: bool = True, owned: bool = True) -> dict[str, Any]:
    obj = pod(name, node=node, gpu=gpu)
    if movable:
        obj["metadata"]["annotations"]["gpusched.io/consolidate"] = "true"
    if owned:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}
        ]
    return obj


def two_nodes(api: object) -> Scheduler:
    s = one_node_scheduler(api, gpus=4)  # n0
    NodeHandler(s).apply("ADDED", kit.node("n1", 4, "A100"))
    s.set_config(parse_config({"consolidation": {"enabled": True}}))
    s._bound.apply("ADDED", batch_pod("a0", "n0", 0))
    s._bound.apply("ADDED", batch_pod("a1", "n0", 1))
    return s


async def round_of(s: Scheduler) -> int:
    n = await s.consolidator.round()
    await settle(s)
    return n


def test_a_pod_may_move_only_when_it_asks_to_and_a_controller_owns_it() -> None:
    assert pod_record(batch_pod("p", "n0", 0)).pod.movable
    assert not pod_record(batch_pod("p", "n0", 0, owned=False)).pod.movable
    assert not pod_record(batch_pod("p", "n0", 0, movable=False)).pod.movable
    # Asked by the autoscalers' annotations not to be disrupted: those win.
    for key, value in (
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
        ("karpenter.sh/do-not-disrupt", "true"),
    ):
        kept = batch_pod("p", "n0", 0)
        kept["metadata"]["annotations"][key] = value
        assert not pod_record(kept).pod.movable, key
        kept["metadata"]["annotations"][key] = "true" if value == "false" else "false"
        assert pod_record(kept).pod.movable, key


async def test_a_pod_that_started_within_the_hold_is_not_moved_whoever_placed_it() -> None:
    # A new leader knows nothing of the last leader's rounds: a replacement it placed would be
    # moved again at once but for its age.
    api = EvictionApi()
    s = _scheduler(api, {"n0": 4, "n1": 4})
    for i in range(2):
        s._bound.apply("ADDED", batch_pod(f"a{i}", "n0", i, movable=False))
    young = batch_pod("b0", "n1", 0)
    young["status"] = {"phase": "Running"}
    young["status"]["startTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    s._bound.apply("ADDED", young)
    assert await round_of(s) == 0
    old = batch_pod("b0", "n1", 0)
    old["status"] = {"phase": "Running"}
    old["status"]["startTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 2 * 3600))
    s._bound.apply("MODIFIED", old)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]


async def test_the_emptiest_node_is_emptied_once_and_not_refilled_from_the_other() -> None:
    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]
    (event,) = [e for e in api.events if e[1] == "Consolidating"]
    assert event[2].startswith("Evicted from node n1: consolidating GPU work: every pod on node n1 fits")
    line = [x for x in s.metrics.render()[0].decode().splitlines() if x.startswith("gpusched_consolidation_")]
    assert "gpusched_consolidation_nodes_total 1.0" in line
    assert "gpusched_consolidation_evictions_total 1.0" in line
    assert await round_of(s) == 0  # b0 is still on the books: its replacement comes first
    s._bound.apply("DELETED", batch_pod("b0", "n1", 0))
    assert await round_of(s) == 0  # n1 is idle now: n0's pods are not moved back onto it
    assert api.evicted == ["default/b0"]


async def test_no_round_while_pods_wait_room_is_held_or_it_is_off() -> None:
    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    s._pending.apply("ADDED", pod("new"))
    assert await round_of(s) == 0  # a pod waits for a batch
    s._pending.apply("DELETED", pod("new"))
    s.set_config(parse_config({}))
    assert await round_of(s) == 0  # off by default
    assert api.evicted == []


async def test_a_node_with_a_pod_that_may_not_move_is_left_alone() -> None:
    for odd in (batch_pod("x", "n1", 1, movable=False), batch_pod("x", "n1", 1, owned=False)):
        api = EvictionApi()
        s = two_nodes(api)
        s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
        s._bound.apply("ADDED", odd)
        await round_of(s)
        assert "default/b0" not in api.evicted


def _on_local_disk_of_n1(s: Scheduler, claim: dict[str, Any]) -> None:
    """A local volume pv-n1 on n1, and ``claim`` bound to it, as the watches show them."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}
    pv = {"metadata": {"name": "pv-n1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}}
    next(r.handler for r in s.reflectors if r.name == "volumes").replace([pv])
    next(r.handler for r in s.reflectors if r.name == "claims").replace([claim])


async def test_a_pod_on_a_local_volume_is_not_moved_for_its_replacement_could_only_come_back() -> None:
    api = EvictionApi()
    s = two_nodes(api)
    claim = {
        "metadata": {"name": "scratch", "namespace": "default", "annotations": {BIND_COMPLETED: "yes"}},
        "spec": {"volumeName": "pv-n1"},
    }
    _on_local_disk_of_n1(s, claim)
    on_disk = batch_pod("b0", "n1", 0)
    on_disk["spec"]["volumes"] = [{"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch"}}]
    s._bound.apply("ADDED", on_disk)
    await round_of(s)
    assert "default/b0" not in api.evicted  # n1, the emptiest, is not emptied: n0's pods may go there instead


async def test_a_pod_whose_local_volume_is_its_own_ephemeral_one_is_moved_all_the_same() -> None:
    """A generic ephemeral volume's claim is made anew for the replacement, wherever it goes."""
    api = EvictionApi()
    s = two_nodes(api)
    claim = {
        "metadata": {
            "name": "b0-scratch",
            "namespace": "default",
            "annotations": {BIND_COMPLETED: "yes"},
            "ownerReferences": [{"kind": "Pod", "name": "b0", "uid": "uid-b0", "controller": True}],
        },
        "spec": {"volumeName": "pv-n1"},
    }
    _on_local_disk_of_n1(s, claim)
    scratch = batch_pod("b0", "n1", 0)
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    scratch["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}]
    s._bound.apply("ADDED", scratch)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]


async def test_a_node_whose_evictions_were_all_refused_is_left_alone_and_the_next_round_goes_on() -> None:
    api = EvictionApi(refuse=True)
    s = two_nodes(api)  # n0: a0, a1 on GPUs 0-1
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    assert await round_of(s) == 1
    api.refuse = False  # the budget that refused b0 allows it now, say
    assert await round_of(s) == 1  # not waiting for a pod that was never evicted ...
    assert api.evicted == ["default/a0", "default/a1"]  # ... nor asking for b0 again: n0 goes to n1


def other(
    name: str, node: str, gpu: int = 0, *, kind: str = "Job", scheduler: str = "default-scheduler"
) -> dict[str, Any]:
    obj = batch_pod(name, node, gpu)
    obj["spec"]["schedulerName"] = scheduler
    obj["metadata"]["ownerReferences"][0]["kind"] = kind
    return obj


async def test_a_daemonset_pod_stays_and_its_node_is_emptied_all_the_same() -> None:
    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    plugin = other("device-plugin", "n1", kind="DaemonSet")
    del plugin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    s._bound.apply("ADDED", plugin)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]


async def test_a_pod_another_scheduler_places_or_with_soft_preferences_is_never_moved() -> None:
    preferring = batch_pod("b0", "n1", 0)
    preferring["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                }
            ]
        }
    }
    for odd in (other("b0", "n1"), preferring):
        api = EvictionApi()
        s = two_nodes(api)
        s._bound.apply("ADDED", odd)
        await round_of(s)
        assert "default/b0" not in api.evicted


async def test_the_next_round_waits_until_the_evicted_pods_replacements_run() -> None:
    api = EvictionApi()
    s = one_node_scheduler(api, gpus=4)
    NodeHandler(s).apply("ADDED", kit.node("n1", 4, "A100"))
    NodeHandler(s).apply("ADDED", kit.node("n2", 4, "A100"))
    s.set_config(parse_config({"consolidation": {"enabled": True}}))
    for i in range(3):
        s._bound.apply("ADDED", batch_pod(f"a{i}", "n0", i, movable=False))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    s._bound.apply("ADDED", batch_pod("c0", "n2", 0))
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]  # into n0's last GPU
    s._bound.apply("DELETED", batch_pod("b0", "n1", 0))  # gone; its Job has not made the new pod yet
    assert await round_of(s) == 0  # c0 may not take the GPU b0's replacement needs
    s._bound.apply("ADDED", batch_pod("b0-new", "n0", 3))
    assert await round_of(s) == 0  # c0 fits nowhere in use now: nothing to do, rightly


async def test_counters_say_what_was_evicted_not_what_was_planned() -> None:
    api = EvictionApi(refuse=True)
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    await round_of(s)
    lines = [x for x in s.metrics.render()[0].decode().splitlines() if x.startswith("gpusched_consolidation_")]
    assert "gpusched_consolidation_evictions_total 0.0" in lines
    assert "gpusched_consolidation_nodes_total 0.0" in lines
    assert "gpusched_consolidation_evictions_refused_total 1.0" in lines  # seen without reading the logs


@pytest.mark.parametrize("meanwhile", ["a pod comes", "consolidation is turned off"])
async def test_no_pod_is_evicted_when_things_change_during_the_plan(monkeypatch: Any, meanwhile: str) -> None:
    from gpusched.daemon import consolidation as daemon

    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    real = daemon.plan_consolidation

    def planned(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        assert out, "the round would empty a node"
        if meanwhile == "a pod comes":
            s._pending.apply("ADDED", pod("new", gpus=2))
        else:  # an operator stops it in a hurry: the round being planned stops too
            s.set_config(parse_config({}))
        return out

    monkeypatch.setattr(daemon, "plan_consolidation", planned)
    assert await round_of(s) == 0
    assert api.evicted == []


async def test_a_shorter_interval_counts_at_once_not_after_the_long_one() -> None:
    s = two_nodes(RecordingApi())
    s.set_config(parse_config({"consolidation": {"enabled": True, "intervalSeconds": 86400}}))
    rounds: list[float] = []

    async def counted() -> int:
        rounds.append(time.monotonic())
        return 0

    s.consolidator.round = counted  # type: ignore[method-assign]
    for r in s.reflectors:
        r.synced.set()
    task = asyncio.create_task(s.consolidator.forever())
    try:
        await asyncio.sleep(0.2)
        assert rounds == []
        s.set_config(parse_config({"consolidation": {"enabled": True, "intervalSeconds": 1}}))
        await asyncio.sleep(1.5)  # the last round (the start) was over a second ago: one now
        assert len(rounds) == 1, rounds
    finally:
        task.cancel()


async def test_no_round_before_every_watch_has_listed_nor_while_one_fails() -> None:
    s = two_nodes(RecordingApi())
    s.set_config(parse_config({"consolidation": {"enabled": True, "intervalSeconds": 1}}))
    rounds: list[float] = []

    async def counted() -> int:
        rounds.append(time.monotonic())
        return 0

    s.consolidator.round = counted  # type: ignore[method-assign]
    budgets = next(r for r in s.reflectors if r.name == "disruption-budgets")
    for r in s.reflectors:
        if r is not budgets:
            r.synced.set()
    task = asyncio.create_task(s.consolidator.forever())
    try:
        await asyncio.sleep(1.3)
        assert rounds == [], "the budgets are not listed yet: a plan could break one"
        budgets.synced.set()
        await asyncio.sleep(1.3)
        assert len(rounds) == 1
        budgets.failing_since = time.monotonic() - 3600  # its watch has failed for an hour
        with capture_logs() as logs:
            await asyncio.sleep(1.2)
        assert len(rounds) == 1
        assert [e["watch"] for e in logs if e["event"] == "consolidation round skipped: a watch is failing"] == [
            "disruption-budgets"
        ]
    finally:
        task.cancel()


async def test_a_plan_the_cluster_outran_is_not_carried_out(monkeypatch: Any) -> None:
    # While the round plans (in a worker thread), a batch binds a pod to the room b0 was to
    # take on n0: the move no longer holds and nobody is evicted for it.
    from gpusched.daemon import consolidation as daemon

    api = EvictionApi()
    s = two_nodes(api)  # n0: a0, a1 on GPUs 0-1
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    real = daemon.plan_consolidation

    def planned_while_a_batch_binds(*args: Any, **kwargs: Any) -> Any:
        moves = real(*args, **kwargs)
        for i, name in ((2, "c2"), (3, "c3")):  # n0's two free GPUs, taken meanwhile
            s._bound.apply("ADDED", batch_pod(name, "n0", i, movable=False))
        return moves

    monkeypatch.setattr(daemon, "plan_consolidation", planned_while_a_batch_binds)
    assert await round_of(s) == 0
    assert api.evicted == []


async def test_a_node_left_half_emptied_is_not_chosen_again_at_once() -> None:
    class HalfApi(EvictionApi):
        async def evict(self, victim: Pod, node: str, why: str) -> bool:
            if victim.name == "b1":  # a budget the plan could not see refuses it, say
                return False
            return await super().evict(victim, node, why)

    api = HalfApi()
    s = two_nodes(api)  # n0: a0, a1 on GPUs 0-1
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    b1 = batch_pod("b1", "n1", 0)  # no GPU: n1 holds less GPU work than n0, and is emptied first
    del b1["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    s._bound.apply("ADDED", b1)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]
    s._bound.apply("DELETED", batch_pod("b0", "n1", 0))
    s._bound.apply("ADDED", batch_pod("b0-again", "n1", 0))  # its Job's new pod lands back on n1
    s.consolidator._awaiting.clear()
    await round_of(s)  # n0 may go to n1 now; n1 is not emptied again, round after round
    assert "default/b0-again" not in api.evicted, api.evicted


async def test_a_moved_pods_replacement_is_not_held_to_its_tenants_limit_by_the_pod_it_replaces() -> None:
    # Tenant 'default' may hold 3 GPUs and holds 3.  Consolidation evicts b0 (n1); while b0
    # terminates, its Job's new pod must take its place, not preempt a0 of the same tenant.
    from tests.test_daemon_utilisation import EvictingApi, batch

    class Both(EvictingApi):
        async def evict(self, victim: Pod, node: str, why: str) -> bool:
            self.evicted.append(victim.key)
            return True

    api = Both()
    s = two_nodes(api)  # n0: a0, a1
    s.set_config(parse_config({"consolidation": {"enabled": True}, "tenants": {"default": {"limitGpus": 3}}}))
    b0 = batch_pod("b0", "n1", 0)
    s._bound.apply("ADDED", b0)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]
    b0["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"  # terminating, its GPU still held
    s._bound.apply("MODIFIED", b0)
    s._pending.apply("ADDED", pod("b0-next", 10))
    await batch(s)
    assert api.bound == ["default/b0-next"], api.failed("default/b0-next")
    assert api.evicted == ["default/b0"]  # a0 and a1 are left alone


def _scheduler(api: EvictionApi, nodes: dict[str, int], policy: str = "cpsat") -> Scheduler:
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy=policy), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    for name, gpus in nodes.items():
        NodeHandler(s).apply("ADDED", kit.node(name, gpus, "A100"))
    s.set_config(parse_config({"consolidation": {"enabled": True}}))
    return s


async def _replace_evicted(s: Scheduler, api: EvictionApi, done: int, made: int) -> int:
    """Each pod evicted since ``done`` leaves and its Job makes a new one (``r<n>``), which the
    batches place and the watch then sees bound; how many new pods in all."""
    for key in api.evicted[done:]:
        node, gpus = s.cache.placement(key) or ("", (0,))
        s._bound.apply("DELETED", batch_pod(key.split("/")[1], node, gpus[0]))
        made += 1
        s._pending.apply("ADDED", batch_pod(f"r{made}", "", 0))
    while s.queue.counts().active:
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
        await settle(s)
        for i in range(1, made + 1):
            if (where := s.cache.placement(f"default/r{i}")) is not None:
                s._bound.apply("MODIFIED", batch_pod(f"r{i}", where[0], where[1][0]))
    return made


async def test_a_node_whose_moved_pods_came_back_to_it_is_not_emptied_again_round_after_round() -> None:
    # FGD places b0's replacement back on n1, the node the round emptied, not in the room the
    # plan found on n0: evicting it again each round would kill the same batch job each interval.
    api = EvictionApi()
    s = _scheduler(api, {"n0": 4, "n1": 4, "n2": 4}, "fgd")
    s._bound.apply("ADDED", batch_pod("a0", "n0", 0))
    s._bound.apply("ADDED", batch_pod("a1", "n0", 1))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    emptied: list[str] = []
    made = 0
    for _ in range(5):
        before = len(api.evicted)
        await round_of(s)
        for key in api.evicted[before:]:
            node, _gpus = s.cache.placement(key) or ("", ())
            if node not in emptied[-1:]:
                emptied.append(node)
        made = await _replace_evicted(s, api, before, made)
    assert emptied[0] == "n1"
    assert "default/r1" not in api.evicted, api.evicted
    assert s.cache.placement("default/r1") == ("n1", (0,))  # where the policy put it back
    assert len(emptied) == len(set(emptied)), emptied  # no node emptied twice


async def test_a_daemonset_pod_marked_movable_stays_and_does_not_keep_its_node_in_use() -> None:
    # A namespace-wide policy marked every pod movable, the node agent too.
    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    agent = batch_pod("agent", "n1", 0)
    agent["metadata"]["ownerReferences"][0]["kind"] = "DaemonSet"
    del agent["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    agent["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
            }
        }
    }
    s._bound.apply("ADDED", agent)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]  # n1 emptied of GPU work; the agent was never a pod to move


@pytest.mark.parametrize("policy", ["bestfit", "cpsat"])
async def test_pods_are_sent_to_a_node_no_round_empties_rather_than_to_one_the_next_round_would(policy: str) -> None:
    # n0 keeps a pod that may not move: 7 GPUs free there for good.  n2 (3 movable pods) has
    # the best fit for b, but the round after would empty n2 and move b's new pod again.
    api = EvictionApi()
    s = _scheduler(api, {"n0": 8, "n1": 8, "n2": 8}, policy)
    s._bound.apply("ADDED", batch_pod("pinned", "n0", 0, movable=False))
    s._bound.apply("ADDED", batch_pod("b", "n1", 0))
    for i in range(3):
        s._bound.apply("ADDED", batch_pod(f"t{i}", "n2", i))
    assert await round_of(s) == 1
    made = await _replace_evicted(s, api, 0, 0)
    await round_of(s)
    await _replace_evicted(s, api, 1, made)
    assert "default/r1" not in api.evicted, api.evicted  # b's job is not killed twice


@pytest.mark.parametrize("policy", ["fgd", "random", "cpsat"])
async def test_a_replacement_placed_on_another_idle_node_is_not_moved_again(policy: str) -> None:
    # The plan sends b0 to n0's free GPUs; FGD (or chance) puts its new pod on an idle node,
    # which is then the emptiest in use.  The new pod stays put: one move per pod, no churn.
    api = EvictionApi()
    s = _scheduler(api, {"n0": 4, "n1": 4, "m0": 4, "m1": 4, "m2": 4, "m3": 4}, policy)
    s._bound.apply("ADDED", batch_pod("a0", "n0", 0))
    s._bound.apply("ADDED", batch_pod("a1", "n0", 1))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    made = 0
    for _ in range(6):
        done = len(api.evicted)
        await round_of(s)
        made = await _replace_evicted(s, api, done, made)
    assert not [k for k in api.evicted if k.startswith("default/r")], api.evicted
    assert len(api.evicted) == len(set(api.evicted)) <= 3, api.evicted


async def test_no_round_while_a_pod_of_the_tenant_waits_at_its_limit() -> None:
    # A pod evicted counts toward its tenant's limit no more; a pod of the tenant parked at the
    # limit would take its place, and the evicted pod's replacement would wait for good.
    api = EvictionApi()
    s = two_nodes(api)  # n0: a0, a1
    s.set_config(parse_config({"consolidation": {"enabled": True}, "tenants": {"default": {"limitGpus": 3}}}))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    s._pending.apply("ADDED", pod("waiter"))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    assert s.queue.counts().unschedulable == 1  # held at the limit
    assert await round_of(s) == 0
    assert api.evicted == []
    s._pending.apply("DELETED", pod("waiter"))  # nobody waits at the limit any more
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]


def _one_leaving(leaving: dict[str, Any]) -> tuple[EvictionApi, Scheduler]:
    """n0 runs pods that may not move (two GPUs free), n1 ``leaving`` (being deleted), and n2 a
    movable pod c0 that fits on n0."""
    api = EvictionApi()
    s = _scheduler(api, {"n0": 4, "n1": 4, "n2": 4})
    s._bound.apply("ADDED", batch_pod("a0", "n0", 0, movable=False))
    s._bound.apply("ADDED", batch_pod("a1", "n0", 1, movable=False))
    leaving["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    s._bound.apply("ADDED", leaving)
    s._bound.apply("ADDED", batch_pod("c0", "n2", 0))
    return api, s


async def test_a_new_leader_waits_for_the_pods_the_last_leader_evicted() -> None:
    # The last leader evicted b0 (2 GPUs) from n1 for n0's two free GPUs; its Job has not made
    # the new pod yet.  This instance has just taken the lead and has no record of that round.
    b0 = batch_pod("b0", "n1", 0)
    b0["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    b0["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0,1"
    api, s = _one_leaving(b0)
    assert await round_of(s) == 0
    assert api.evicted == []  # c0 would take the room b0's new pod is to have
    s._bound.apply("DELETED", b0)
    assert await round_of(s) == 1
    assert api.evicted == ["default/c0"]


async def test_a_leader_of_long_standing_is_not_held_back_by_pods_that_leave() -> None:
    # Pods of controllers come and go all day; only a new leader waits for them (the rounds of
    # this one are its own record).
    api, s = _one_leaving(batch_pod("done", "n1", 0, movable=False))  # a rollout's old pod, say
    assert await round_of(s) == 0  # newly leading: it may be a pod the last leader evicted
    s.consolidator._led_at -= 601
    assert await round_of(s) == 1
    assert api.evicted == ["default/c0"]


async def test_a_node_whose_evictions_met_the_end_of_the_lead_is_not_left_out_as_refused() -> None:
    """Nothing refused those evictions: the node is not taken for one that will not empty (left
    out of rounds for an hour, with a warning), and is emptied when this instance leads again."""
    server = EvictingServer()
    leading = False  # the lead ends as the round's evictions are to go out
    kube = cast(Kube, server)
    s = two_nodes(RecordingApi())  # n0: a0, a1 on GPUs 0-1
    s.binder = Binder(kube, "me", events=kube, leading=lambda: leading)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    with capture_logs() as logs:
        assert await round_of(s) == 1  # n1's b0 was to go
    assert server.evicted == []
    assert not [e for e in logs if e["event"] == "consolidation left a node in use"]
    leading = True
    assert await round_of(s) == 1
    assert server.evicted == ["default/b0"]  # n1 again, the emptiest


@pytest.mark.parametrize(
    ("policy", "sizes", "used"),
    [(p, {"n0": 4, "n1": 4}, 2) for p in ("cpsat", "fgd", "bestfit")]
    + [("cpsat", {"n0": 8, "n1": 8, "n2": 8}, used) for used in (2, 4, 6)],
)
async def test_a_replacement_made_while_the_evicted_pod_terminates_goes_where_the_plan_found_room(
    policy: str, sizes: dict[str, int], used: int
) -> None:
    # As a kubelet does, the evicted pod terminates for its grace period while its Job makes
    # the replacement at once: the node being emptied still looks in use to the batches.
    api = EvictionApi()
    s = _scheduler(api, sizes, policy)
    for i in range(used):
        s._bound.apply("ADDED", batch_pod(f"a{i}", "n0", i, movable=False))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]
    leaving = batch_pod("b0", "n1", 0)
    leaving["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    s._bound.apply("MODIFIED", leaving)
    s._pending.apply("ADDED", batch_pod("r1", "", 0))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    where = s.cache.placement("default/r1")
    assert where is not None
    assert where[0] == "n0", "not back on the node it was moved off"
    s._bound.apply("MODIFIED", batch_pod("r1", where[0], where[1][0]))
    s._bound.apply("DELETED", leaving)
    assert s.sealed() == set()  # gone: n1 takes pods again
    with capture_logs() as logs:
        await round_of(s)
    assert not [e for e in logs if e["event"] == "consolidation emptied a node that was filled again"]


async def test_a_node_emptied_and_then_taken_by_other_work_is_no_failure_to_warn_of() -> None:
    api = EvictionApi()
    s = _scheduler(api, {"n0": 4, "n1": 4})
    for i in range(2):
        s._bound.apply("ADDED", batch_pod(f"a{i}", "n0", i, movable=False))
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    assert await round_of(s) == 1
    s._bound.apply("DELETED", batch_pod("b0", "n1", 0))
    s._bound.apply("ADDED", batch_pod("r0", "n0", 2))  # b0's replacement, where the plan found room
    big = batch_pod("whole-node", "n1", 0, movable=False)  # what the node was emptied for, say
    big["metadata"]["ownerReferences"][0]["uid"] = "another-job"
    s._bound.apply("ADDED", big)
    with capture_logs() as logs:
        await round_of(s)
    assert [e for e in logs if e["event"] == "consolidation emptied a node that was filled again"] == []


@pytest.mark.parametrize(
    "change",
    [
        "karpenter.sh/do-not-disrupt=true",
        "cluster-autoscaler.kubernetes.io/safe-to-evict=false",
        "gpusched.io/consolidate=false",
        "orphaned",
    ],
)
async def test_a_running_pod_that_opts_out_or_loses_its_controller_is_not_moved(change: str) -> None:
    """b0, alone on n1, asked to be moved when it started; then it opts out (an annotation added
    to the running pod), or its Job is deleted with --cascade=orphan: nothing would recreate it.
    The next round leaves it where it is."""
    api = EvictionApi()
    s = two_nodes(api)
    s._bound.apply("ADDED", batch_pod("b0", "n1", 0))
    now = batch_pod("b0", "n1", 0, owned=change != "orphaned")
    if change != "orphaned":
        key, value = change.split("=")
        now["metadata"]["annotations"][key] = value
    s._bound.apply("MODIFIED", now)
    await round_of(s)
    assert "default/b0" not in api.evicted  # (a0 and a1 may come to it instead)


class _Preempting(EvictionApi):
    """Also deletes preemption's victims (recorded with the evictions)."""

    async def preempt(self, victim: Pod, by: Pod, node: str, why: str = "") -> bool:
        self.evicted.append(victim.key)
        return True


async def test_a_pod_that_fits_on_a_node_being_emptied_waits_for_it_rather_than_preempt() -> None:
    """A round evicts b0 off n1 (its replacement's room is on n0); while b0 terminates, n1 is
    sealed.  A pod of high priority asking for 3 GPUs fits on n1 once b0 is gone: it waits for
    that, rather than evict a1, running on n0, and take the replacement's room."""
    api = _Preempting()
    s = two_nodes(api)
    b0 = batch_pod("b0", "n1", 0)
    s._bound.apply("ADDED", b0)
    assert await round_of(s) == 1
    assert api.evicted == ["default/b0"]
    b0["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    s._bound.apply("MODIFIED", b0)
    assert s.sealed() == {"n1"}
    urgent = pod("urgent", 100, gpus=3)
    s._pending.apply("ADDED", urgent)
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
    await settle(s)
    assert api.evicted == ["default/b0"], "running work evicted for room about to be free"
    assert "node n1 is being emptied by consolidation" in api.failed("default/urgent")[-1]
    s._bound.apply("DELETED", b0)  # gone: n1 is open
    for _ in range(3):
        if "default/urgent" in api.bound:
            break
        await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), 10))
        await settle(s)
    where = s.cache.placement("default/urgent")
    assert where is not None
    assert where[0] == "n1"
    assert api.evicted == ["default/b0"]


async def test_a_node_being_emptied_is_open_again_once_the_wait_is_over_even_with_consolidation_off() -> None:
    """b0 is stuck terminating (a finalizer) and the operator turns consolidation off: n1 is not
    sealed for ever; past the round's wait it takes work again."""
    api = EvictionApi()
    s = two_nodes(api)
    b0 = batch_pod("b0", "n1", 0)
    s._bound.apply("ADDED", b0)
    assert await round_of(s) == 1
    b0["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    s._bound.apply("MODIFIED", b0)
    assert s.sealed() == {"n1"}
    s.set_config(parse_config({}))
    s.consolidator._round_deadline = time.monotonic() - 1  # the wait is over
    await round_of(s)
    assert s.sealed() == set()
