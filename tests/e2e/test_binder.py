"""The binder against the real API server: who may bind, and whose Events are whose."""

from __future__ import annotations

import uuid

from kubernetes_asyncio.client import ApiClient
from structlog.testing import capture_logs

from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube
from gpusched.model import Pod
from tests.controlplane import ControlPlane
from tests.e2e import kit


def _pod(obj: dict[str, object], namespace: str) -> Pod:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return Pod(str(meta["name"]), 0, 0, namespace=namespace, uid=str(meta["uid"]))


async def _create(kube: Kube, namespace: str, name: str) -> Pod:
    r = await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=kit.pod(name, "gpu-scheduler"))
    assert r.status == 201, r.body
    return _pod(r.body, namespace)


async def _delete(kube: Kube, namespace: str, name: str) -> None:
    gone = await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", query={"gracePeriodSeconds": 0})
    assert gone.ok, gone.body


async def test_an_instance_that_stopped_leading_sends_no_binding(control_plane: ControlPlane, namespace: str) -> None:
    kube = await kit.admin(control_plane)
    name = f"bind-{uuid.uuid4().hex[:6]}"
    try:
        await kit.create_all(kube, "/api/v1/nodes", [kit.node(name, 1, "H800")])
        path = f"/api/v1/namespaces/{namespace}/pods"
        r = await kube.request("POST", path, body=kit.pod("p", "gpu-scheduler", gpus=1))
        assert r.status == 201, r.body
        leading = True
        binder = Binder(kube, "test", leading=lambda: leading)
        leading = False  # stepped down between the solve and the bind
        result, why = await binder.bind(_pod(r.body, namespace), name, (0,))
        assert (result, why) == (BindResult.FAILED, "no longer the leader")
        assert not (await kube.get(f"{path}/p"))["spec"].get("nodeName")
        leading = True
        assert (await binder.bind(_pod(r.body, namespace), name, (0,)))[0] is BindResult.BOUND
        assert (await kube.get(f"{path}/p"))["spec"]["nodeName"] == name
    finally:
        await kube.request("DELETE", f"/api/v1/nodes/{name}")
        await kube.close()


async def test_a_pod_created_again_under_its_name_gets_its_own_events(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A StatefulSet's web-0 deleted and created again within the repeat window: the new pod's
    Scheduled Event is written, on the new pod (``kubectl describe`` selects Events by UID)."""
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/pods"
    binder = Binder(kube, "test")
    uids = []
    try:
        for _ in range(2):
            r = await kube.request("POST", path, body=kit.pod("web-0", "gpu-scheduler"))
            assert r.status == 201, r.body
            uids.append(r.body["metadata"]["uid"])
            await binder.event(_pod(r.body, namespace), "Scheduled", "Successfully assigned to node-a")
            gone = await kube.request("DELETE", f"{path}/web-0", query={"gracePeriodSeconds": 0})
            assert gone.ok, gone.body
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
        seen = sorted(e["involvedObject"]["uid"] for e in events if e["reason"] == "Scheduled")
        assert seen == sorted(uids)
    finally:
        await kube.close()


async def test_a_repeated_event_is_counted_in_the_one_written_as_kubectl_describe_shows_it(
    control_plane: ControlPlane, scheduler_api: ApiClient, namespace: str
) -> None:
    """A pod told the same verdict again and again has one FailedScheduling Event whose count
    grows (``x3 over 2m``), not one Event per telling; a new verdict is an Event of its own; a
    counted Event gone (they live an hour) is written again with its count.  As the scheduler's
    ServiceAccount, with the RBAC of manifests/."""
    kube = await kit.admin(control_plane)
    binder = Binder(Kube(scheduler_api), "test", event_repeat_s=0)
    events = f"/api/v1/namespaces/{namespace}/events"

    async def told() -> list[tuple[str, int]]:
        items = (await kube.get(events))["items"]
        return sorted((e["message"], e["count"]) for e in items if e["involvedObject"]["uid"] == pod.uid)

    try:
        pod = await _create(kube, namespace, "waiting")
        full = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        for _ in range(3):
            await binder.event(pod, "FailedScheduling", full, "Warning")
        assert await told() == [(full, 3)]
        (only,) = (await kube.get(events))["items"]
        assert only["lastTimestamp"] >= only["firstTimestamp"]
        tainted = "0/3 nodes are available: 3 node(s) had untolerated taint {gpu: busy}."
        await binder.event(pod, "FailedScheduling", tainted, "Warning")
        await binder.event(pod, "FailedScheduling", tainted, "Warning")
        assert await told() == [(full, 3), (tainted, 2)]
        gone = [e["metadata"]["name"] for e in (await kube.get(events))["items"] if e["message"] == tainted]
        r = await kube.request("DELETE", f"{events}/{gone[0]}")
        assert r.ok, r.body
        await binder.event(pod, "FailedScheduling", tainted, "Warning")
        assert await told() == [(full, 3), (tainted, 3)]
    finally:
        await kube.close()


async def test_the_unschedulable_condition_is_written_only_on_the_pod_it_was_meant_for(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A verdict on web-0 that lands after web-0 was deleted and created again must not mark the
    new pod Unschedulable: it has not been tried yet."""
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/pods"
    binder = Binder(kube, "test")
    try:
        old = await _create(kube, namespace, "web-0")
        await binder.unschedulable(old, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        conditions = (await kube.get(f"{path}/web-0"))["status"]["conditions"]
        assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
            ("PodScheduled", "False", "Unschedulable")
        ]
        await _delete(kube, namespace, "web-0")
        await _create(kube, namespace, "web-0")
        with capture_logs() as logs:
            await binder.unschedulable(old, "0/3 nodes are available: 3 Insufficient cpu.")
        assert [e["event"] for e in logs] == ["condition not written: pod replaced"]
        fresh = await kube.get(f"{path}/web-0")
        assert fresh["metadata"]["uid"] != old.uid
        assert not (fresh.get("status") or {}).get("conditions")
    finally:
        await kube.close()


async def test_nominated_node_name_is_set_with_a_preemption_and_cleared_when_it_is_given_up(
    control_plane: ControlPlane, namespace: str
) -> None:
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/pods/urgent"
    binder = Binder(kube, "test")
    try:
        urgent = await _create(kube, namespace, "urgent")
        await binder.unschedulable(
            urgent, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. Preempting.", None, "n0"
        )
        assert (await kube.get(path))["status"].get("nominatedNodeName") == "n0"
        await binder.unschedulable(urgent, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", "x")
        status = (await kube.get(path))["status"]
        assert "nominatedNodeName" not in status
        assert status["conditions"][0]["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    finally:
        await kube.close()


async def test_a_pod_held_by_its_tenants_limit_reads_back_as_such_and_not_as_unschedulable(
    control_plane: ControlPlane, namespace: str
) -> None:
    """What the cluster autoscaler reads: the reason changes from Unschedulable to TenantLimit
    (and the watch reads it back as the pod's verdict) though the message stays."""
    from gpusched.kube.convert import pod_record

    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/pods/p"
    binder = Binder(kube, "test")
    said = "tenant a is at its GPU limit: it holds 1 of 1 GPUs and this pod asks for 1 more."
    try:
        p = await _create(kube, namespace, "p")
        await binder.unschedulable(p, said)
        await binder.unschedulable(p, said, said, reason="TenantLimit", current_reason="Unschedulable")
        obj = await kube.get(path)
        assert [(c["type"], c["status"], c["reason"]) for c in obj["status"]["conditions"]] == [
            ("PodScheduled", "False", "TenantLimit")
        ]
        rec = pod_record(obj)
        assert (rec.unschedulable, rec.unschedulable_reason) == (said, "TenantLimit")
    finally:
        await kube.close()


async def test_a_pod_is_read_back_by_its_uid(control_plane: ControlPlane, namespace: str) -> None:
    """After a relist missed a bound pod, only the API server can say whether that pod is still
    there: a later pod of its name is not it."""
    kube = await kit.admin(control_plane)
    binder = Binder(kube, "test")
    try:
        old = await _create(kube, namespace, "job-0")
        assert await binder.exists(old) is True
        await _delete(kube, namespace, "job-0")
        assert await binder.exists(old) is False
        new = await _create(kube, namespace, "job-0")
        assert await binder.exists(old) is False
        assert await binder.exists(new) is True
    finally:
        await kube.close()


async def test_preemption_and_eviction_spare_a_pod_created_again_under_the_victims_name(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A victim chosen in one batch may be deleted and created again (a StatefulSet's web-0)
    before the deletion is sent: the new pod is not the victim. Neither its condition, nor its
    life, nor its Events are touched, and the old victim counts as gone (its room is free)."""
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/pods/web-0"
    binder = Binder(kube, "test")
    by = Pod("urgent", 0, 0, namespace=namespace, uid="uid-urgent")
    try:
        old = await _create(kube, namespace, "web-0")
        await _delete(kube, namespace, "web-0")
        new = await _create(kube, namespace, "web-0")
        assert await binder.preempt(old, by, "n0") is True
        assert await binder.evict(old, "n0", "emptying the node") is True
        fresh = await kube.get(path)
        assert fresh["metadata"]["uid"] == new.uid
        assert not (fresh.get("status") or {}).get("conditions")
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
        assert not [e for e in events if e["reason"] in ("Preempted", "Consolidating")]
        # The pod itself is preempted: marked, deleted, told.
        assert await binder.preempt(new, by, "n0") is True
        assert (await kube.request("GET", path)).status == 404
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
        told = [(e["involvedObject"]["uid"], e["message"]) for e in events if e["reason"] == "Preempted"]
        assert told == [(new.uid, f"Preempted by pod {by.key} on node n0")]
    finally:
        await kube.close()
