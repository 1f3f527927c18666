"""Coscheduling PodGroups on the real API server: with the CRD installed, members wait for the
PodGroup's ``minMember``, and a running job keeps it against preemption, however late its
PodGroup comes; without it, nothing breaks, members are placed one by one, and each is warned.
The CRD is installed for each test that needs it and deleted after it (and its deletion
awaited), so the other tests of the session see an API server that does not serve PodGroups."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit

GROUP_VERSION = "scheduling.x-k8s.io/v1alpha1"
CRD_NAME = "podgroups.scheduling.x-k8s.io"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NOT_SERVED = "the API server does not serve podgroups.scheduling.x-k8s.io/v1alpha1"
SETTLED_S = 30.0
"""How long the daemon has to tell a waiting member, or to bind one: well within reach."""
_INT32 = {"type": "integer", "format": "int32"}
CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "PodGroup", "listKind": "PodGroupList", "plural": "podgroups", "singular": "podgroup"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "minMember": {**_INT32, "minimum": 1},
                                    "scheduleTimeoutSeconds": _INT32,
                                    "minResources": {
                                        "type": "object",
                                        "additionalProperties": {"x-kubernetes-int-or-string": True},
                                    },
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def sched_name() -> str:
    return f"gs-{uuid.uuid4().hex[:8]}"


async def _served(kube: Kube) -> bool:
    r = await kube.request("GET", f"/apis/{GROUP_VERSION}")
    assert r.status in (200, 404), r.body
    return r.status == 200 and any(x.get("name") == "podgroups" for x in r.body.get("resources") or ())


async def _until_served(kube: Kube, served: bool, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while await _served(kube) != served or (not served and (await kube.request("GET", f"{CRDS}/{CRD_NAME}")).ok):
        assert time.monotonic() < deadline, f"PodGroups still {'not ' if served else ''}served after {timeout}s"
        await asyncio.sleep(0.1)


@pytest.fixture
async def podgroup_crd(kube: Kube) -> AsyncIterator[None]:
    """The PodGroup CRD, installed for the test and deleted after it (gone before the next test)."""
    assert not await _served(kube), "the PodGroup CRD is left over from another test"
    r = await kube.request("POST", CRDS, body=CRD)
    assert r.status == 201, r.body
    try:
        await _until_served(kube, True)
        yield
    finally:
        r = await kube.request("DELETE", f"{CRDS}/{CRD_NAME}")
        assert r.ok or r.status == 404, r.body
        await _until_served(kube, False)


def _member(name: str, scheduler: str, group: str = "train") -> dict[str, Any]:
    """A one-GPU member of ``group``, labelled only: no gpusched.io/gang-min-members."""
    p = kit.pod(name, scheduler, gpus=1)
    p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    return p


def _messages(events: dict[str, list[dict[str, Any]]], key: str) -> list[str]:
    return [str(e.get("message")) for e in events.get(key, ())]


async def _bound(kube: Kube, ns: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in await kit.list_all(kube, f"/api/v1/namespaces/{ns}/pods")
        if p["spec"].get("nodeName")
    )


async def _told(kube: Kube, ns: str, key: str, text: str) -> list[str]:
    """The messages of the Events ``key`` ("Reason/pod") once one says ``text``, or as they are
    after ``SETTLED_S``."""
    deadline = time.monotonic() + SETTLED_S
    while True:
        found = _messages(await kit.scheduled_events(kube, ns), key)
        if any(text in m for m in found) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


async def test_members_of_a_podgroup_wait_for_its_min_member_then_are_bound_together(
    control_plane: ControlPlane, kube: Kube, namespace: str, podgroup_crd: None
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("pg-0", 8, "H800")])
    group = {"apiVersion": GROUP_VERSION, "kind": "PodGroup", "metadata": {"name": "train"}}
    group["spec"] = {"minMember": 3, "scheduleTimeoutSeconds": 600}
    await kit.create_all(kube, f"/apis/{GROUP_VERSION}/namespaces/{namespace}/podgroups", [group])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        daemon.wait_log("reading a custom resource", where=lambda x: x.get("watch") == "podgroups")
        daemon.wait_log("caches synced")
        # The members arrive one at a time: each of the first two is seen, told the gang waits
        # for more, and left unbound.
        for i in range(2):
            await kit.create_all(kube, pods, [_member(f"w-{i}", name)])
            waiting = f"gang {namespace}/train: {i + 1} of at least 3 members are pending"
            told = await _told(kube, namespace, f"FailedScheduling/w-{i}", waiting)
            assert any(waiting in m for m in told), told
            assert await _bound(kube, namespace) == []
            await asyncio.sleep(1.0)
            assert await _bound(kube, namespace) == []
        await kit.create_all(kube, pods, [_member("w-2", name)])
        final = [await kit.wait_bound(kube, f"{pods}/w-{i}", timeout=SETTLED_S) for i in range(3)]
        events = await kit.scheduled_events(kube, namespace)
    finally:
        daemon.stop()
    assert all(p["spec"].get("nodeName") == "pg-0" for p in final), [p["spec"].get("nodeName") for p in final]
    assert not [k for k in events if k.startswith("PodGroupMissing/")]
    assert not daemon.events("gang without a minimum")


async def test_without_the_podgroup_crd_members_are_placed_one_by_one_and_each_is_warned(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    assert not await _served(kube)  # the control plane as it comes: no PodGroup CRD
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("pg-1", 8, "H800")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        line = daemon.wait_log("custom resource not read", where=lambda x: x.get("watch") == "podgroups")
        daemon.wait_log("caches synced")  # not waiting for what is not served
        for i in range(2):  # each bound before the next comes: nothing makes it wait for its peers
            await kit.create_all(kube, pods, [_member(f"w-{i}", name)])
            p = await kit.wait_bound(kube, f"{pods}/w-{i}", timeout=SETTLED_S)
            assert p["spec"].get("nodeName") == "pg-1", p.get("status")
        events = await kit.wait_events(kube, namespace, [f"PodGroupMissing/w-{i}" for i in range(2)])
        daemon.wait_log("gang without a minimum", where=lambda x: x.get("pod_group") == f"{namespace}/train")
    finally:
        daemon.stop()
    assert (line["level"], line["why"]) == ("info", NOT_SERVED)
    expected = (
        f"pod group {namespace}/train has no PodGroup object ({NOT_SERVED}) and no gpusched.io/gang-min-members "
        "annotation: members are placed one by one"
    )
    for i in range(2):
        (event,) = events[f"PodGroupMissing/w-{i}"]
        assert (event["type"], event["message"]) == ("Warning", expected)
    # Said once, at info; no failing watch, no error.
    assert len(daemon.events("custom resource not read")) == 1
    noisy = [x for x in daemon.lines if x.get("watch") == "podgroups" and x.get("level") != "info"]
    assert noisy == []
    assert len(daemon.events("gang without a minimum")) == 1  # once per gang


async def _priority_classes(kube: Kube, prefix: str, **values: int) -> list[str]:
    """PriorityClasses ``prefix-NAME`` of the values given, in their order."""
    names = []
    for suffix, value in values.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"{prefix}-{suffix}"},
        }
        r = await kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body={**body, "value": value})
        assert r.status == 201, r.body
        names.append(f"{prefix}-{suffix}")
    return names


def _running(name: str, node: str, cls: str, group: str = "") -> dict[str, Any]:
    """A one-GPU pod of another scheduler bound to ``node``, of PriorityClass ``cls``; with
    ``group``, a member of that pod group (labelled only)."""
    p = kit.pod(name, "default-scheduler", gpus=1, node_name=node)
    p["spec"]["priorityClassName"] = cls
    p["spec"]["terminationGracePeriodSeconds"] = 30  # with no kubelet here, a victim lingers
    if group:
        p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    return p


async def _leaving(kube: Kube, pods: str) -> list[str]:
    """The pods being deleted (preempted: no kubelet here ends them)."""
    return sorted(
        p["metadata"]["name"] for p in await kit.list_all(kube, pods) if p["metadata"].get("deletionTimestamp")
    )


async def test_a_podgroup_created_after_its_members_run_keeps_them_from_preemption(
    control_plane: ControlPlane, kube: Kube, namespace: str, podgroup_crd: None
) -> None:
    """A job of three runs (priority 10) before its PodGroup (minMember 3) is created; another pod
    of priority 20 runs beside it.  A pod of priority 1000 preempts: it evicts the other pod, not
    a member of the job, which would leave it short of its minimum."""
    name = sched_name()
    low, mid, high = await _priority_classes(kube, name, low=10, mid=20, high=1000)
    nodes = [f"pgr-{i}" for i in range(4)]
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(n, 1, "H800") for n in nodes])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    running = [_running(f"w-{i}", nodes[i], low, group="train") for i in range(3)]
    await kit.create_all(kube, pods, [*running, _running("other", nodes[3], mid)])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        daemon.wait_log("caches synced")
        group = {"apiVersion": GROUP_VERSION, "kind": "PodGroup", "metadata": {"name": "train"}}
        group["spec"] = {"minMember": 3}
        await kit.create_all(kube, f"/apis/{GROUP_VERSION}/namespaces/{namespace}/podgroups", [group])
        daemon.wait_log(
            "pod groups changed; members read again", timeout=SETTLED_S, where=lambda x: x.get("bound") == 3
        )
        urgent = kit.pod("urgent", name, gpus=1)
        urgent["spec"]["priorityClassName"] = high
        await kit.create_all(kube, pods, [urgent])
        deadline = time.monotonic() + SETTLED_S
        while not (leaving := await _leaving(kube, pods)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # and no other
        leaving = await _leaving(kube, pods)
        preempted = [x["pod"] for x in daemon.events("preempt")]
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        for cls in (low, mid, high):
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{cls}")
    assert preempted == [f"{namespace}/urgent"]
    assert leaving == ["other"]
