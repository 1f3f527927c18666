"""`gpusched run` with a claim of a WaitForFirstConsumer storage class, on the real API server with
the RBAC of manifests/: the claim is annotated with the node chosen within the class's topology,
and the pod is bound there once the volume is; when the provisioner gives the node up, the pod's
Binding is refused with the reason and it is placed again.  No provisioner or volume controller
runs here: the test does their part, as they would."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpusched.kube.client import MERGE_PATCH, Kube
from gpusched.kube.convert import BIND_COMPLETED, SELECTED_NODE
from tests.controlplane import ControlPlane
from tests.e2e import kit

ZONE = "topology.kubernetes.io/zone"


async def _until(kube: Kube, path: str, ok: Callable[[dict[str, Any]], Any], timeout: float = 60.0) -> dict[str, Any]:
    """The object at ``path`` once ``ok(obj)`` holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = await kube.request("GET", path)
        assert r.ok, r.body
        if ok(r.body):
            return dict(r.body)
        assert time.monotonic() < deadline, f"{path} never got there: {r.body}"
        await asyncio.sleep(0.1)


def _selected(claim: dict[str, Any]) -> str:
    return str((claim["metadata"].get("annotations") or {}).get(SELECTED_NODE) or "")


async def _setup(kube: Kube, namespace: str, tag: str) -> tuple[str, str]:
    """Nodes ``{tag}-a`` (zone a) and ``{tag}-b`` (zone b, fewer GPUs: best fit's first
    choice were it allowed), a class provisioning in zone a only, and its claim ``data``; the
    pods' and claim's paths."""
    zone_a, zone_b = f"{tag}-za", f"{tag}-zb"
    nodes = [kit.node(f"{tag}-a", 8, "A100", **{ZONE: zone_a}), kit.node(f"{tag}-b", 1, "A100", **{ZONE: zone_b})]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    cls = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": tag},
        "provisioner": "disk.example.com",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE, "values": [zone_a]}]}],
    }
    await kit.create_all(kube, "/apis/storage.k8s.io/v1/storageclasses", [cls])
    claims = await _data_claim(kube, namespace, tag, "1Gi")
    return f"/api/v1/namespaces/{namespace}/pods", f"{claims}/data"


async def _data_claim(kube: Kube, namespace: str, cls: str, size: str) -> str:
    """The claim ``data`` of class ``cls`` asking for ``size``; the path of the namespace's claims."""
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
            "storageClassName": cls,
        },
    }
    await kit.create_all(kube, claims, [claim])
    return claims


def _trainer(scheduler: str) -> dict[str, Any]:
    obj = kit.pod("trainer", scheduler, gpus=1)
    obj["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    return obj


async def _provision(kube: Kube, namespace: str, claim_path: str, volume: str, node_zone: str, tag: str) -> None:
    """What the provisioner and the volume controller do: a volume for the zone, bound to the claim."""
    in_zone = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [node_zone]}]}
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": tag,
            "csi": {"driver": "disk.example.com", "volumeHandle": volume},
            "claimRef": {"namespace": namespace, "name": "data"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [in_zone]}},
        },
    }
    await kit.create_all(kube, "/api/v1/persistentvolumes", [pv])
    body = {"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": volume}}
    r = await kube.request("PATCH", claim_path, body=body, content_type=MERGE_PATCH)
    assert r.ok, r.body
    status = {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}}
    r = await kube.request("PATCH", f"{claim_path}/status", body=status, content_type=MERGE_PATCH)
    assert r.ok, r.body


async def test_a_pod_is_bound_once_its_claim_is_provisioned_for_the_node_chosen_in_the_class_topology(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    tag = f"vb-{uuid.uuid4().hex[:6]}"
    name = f"gs-{tag}"
    pods, claim_path = await _setup(kube, namespace, tag)
    volume = f"{tag}-pv"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods, [_trainer(name)])
        claim = await _until(kube, claim_path, _selected)
        assert _selected(claim) == f"{tag}-a"  # the only node in the class's zone
        waiting = daemon.wait_log("waiting for volumes")
        assert (waiting["pod"], waiting["node"], waiting["claims"]) == (f"{namespace}/trainer", f"{tag}-a", ["data"])
        await asyncio.sleep(1.0)
        pod = (await kube.request("GET", f"{pods}/trainer")).body
        assert not pod["spec"].get("nodeName"), "bound before its volume was"
        await _provision(kube, namespace, claim_path, volume, f"{tag}-za", tag)
        pod = await _until(kube, f"{pods}/trainer", lambda o: o["spec"].get("nodeName"))
        assert pod["spec"]["nodeName"] == f"{tag}-a"
        (bind,) = daemon.wait_count("bind", 1)
        assert (bind["pod"], bind["result"]) == (f"{namespace}/trainer", "bound")
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await kube.request("DELETE", f"/api/v1/persistentvolumes/{volume}")
        await kube.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{tag}")


async def test_when_the_provisioner_gives_the_node_up_the_pod_is_told_and_placed_again(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    tag = f"vb-{uuid.uuid4().hex[:6]}"
    name = f"gs-{tag}"
    pods, claim_path = await _setup(kube, namespace, tag)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods, [_trainer(name)])
        await _until(kube, claim_path, _selected)
        daemon.wait_log("waiting for volumes")
        # The provisioner failed there and asks for another node, as external-provisioner does.
        body = {"metadata": {"annotations": {SELECTED_NODE: None}}}
        r = await kube.request("PATCH", claim_path, body=body, content_type=MERGE_PATCH)
        assert r.ok, r.body
        refused = daemon.wait_log("bind", where=lambda x: x["pod"] == f"{namespace}/trainer")
        assert refused["result"] == "failed"
        assert refused["why"].startswith('binding volumes: provisioning failed for persistentvolumeclaim "data"')

        def told(events: list[dict[str, Any]]) -> bool:
            return any(e["reason"] == "FailedScheduling" and "binding volumes" in e["message"] for e in events)

        deadline = time.monotonic() + 30
        while not told(events := await kit.list_all(kube, f"/api/v1/namespaces/{namespace}/events")):
            assert time.monotonic() < deadline, events
            await asyncio.sleep(0.2)
        # Tried again after its back-off: the claim is annotated anew, for the same zone.
        claim = await _until(kube, claim_path, _selected)
        assert _selected(claim) == f"{tag}-a"
        pod = (await kube.request("GET", f"{pods}/trainer")).body
        assert not pod["spec"].get("nodeName")
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await kube.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{tag}")


def _local_volume(name: str, node: str, size: str, cls: str) -> dict[str, Any]:
    on_node = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "local": {"path": f"/mnt/disks/{name}"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [on_node]}},
        },
    }


async def test_a_claim_is_bound_to_a_local_volume_made_beforehand_on_the_node_chosen(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    tag = f"lv-{uuid.uuid4().hex[:6]}"
    name = f"gs-{tag}"
    small, large = f"{tag}-a-small", f"{tag}-a-large"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"{tag}-a", 8, "A100"), kit.node(f"{tag}-b", 1, "A100")])
    cls = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": tag},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    await kit.create_all(kube, "/apis/storage.k8s.io/v1/storageclasses", [cls])
    volumes = [_local_volume(small, f"{tag}-a", "10Gi", tag), _local_volume(large, f"{tag}-a", "200Gi", tag)]
    await kit.create_all(kube, "/api/v1/persistentvolumes", volumes)
    for v in volumes:  # as the volume controller marks a new volume
        path = f"/api/v1/persistentvolumes/{v['metadata']['name']}/status"
        r = await kube.request("PATCH", path, body={"status": {"phase": "Available"}}, content_type=MERGE_PATCH)
        assert r.ok, r.body
    claims = await _data_claim(kube, namespace, tag, "50Gi")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods, [_trainer(name)])  # b-0 (best fit) has no volume
        pv = await _until(kube, f"/api/v1/persistentvolumes/{large}", lambda o: o["spec"].get("claimRef"))
        ref = pv["spec"]["claimRef"]
        assert (ref["namespace"], ref["name"]) == (namespace, "data")
        small_pv = (await kube.request("GET", f"/api/v1/persistentvolumes/{small}")).body
        assert not small_pv["spec"].get("claimRef")  # too small for the claim
        await asyncio.sleep(1.0)
        pod = (await kube.request("GET", f"{pods}/trainer")).body
        assert not pod["spec"].get("nodeName"), "bound before its claim was"
        # The volume controller completes the binding.
        body = {"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": large}}
        r = await kube.request("PATCH", f"{claims}/data", body=body, content_type=MERGE_PATCH)
        assert r.ok, r.body
        pod = await _until(kube, f"{pods}/trainer", lambda o: o["spec"].get("nodeName"))
        assert pod["spec"]["nodeName"] == f"{tag}-a"
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        for v in volumes:
            await kube.request("DELETE", f"/api/v1/persistentvolumes/{v['metadata']['name']}")
        await kube.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{tag}")


def _explain(control_plane: ControlPlane, pod: str) -> str:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "gpusched", "explain", pod),
            *("--kubeconfig", str(control_plane.scheduler_kubeconfig)),
        ],
        capture_output=True,
        text=True,
        cwd=kit.repo_file(),
        timeout=60,
        check=False,
    )
    return out.stdout + out.stderr


async def test_explain_holds_a_pod_and_its_gang_to_where_their_claims_can_be_had(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    tag = f"ex-{uuid.uuid4().hex[:6]}"
    pods, _ = await _setup(kube, namespace, tag)
    try:
        await kit.create_all(kube, pods, [_trainer("gpu-scheduler")])
        said = await asyncio.to_thread(_explain, control_plane, f"{namespace}/trainer")
        assert f"1/2 nodes can take it now: {tag}-a" in said, said  # the class provisions in zone a only
        body = {"metadata": {"annotations": {SELECTED_NODE: f"{tag}-a"}}}
        claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"
        r = await kube.request("PATCH", claim_path, body=body, content_type=MERGE_PATCH)
        assert r.ok, r.body
        said = await asyncio.to_thread(_explain, control_plane, f"{namespace}/trainer")
        assert f'claim "data" is being provisioned for node {tag}-a: the pod goes' in said, said
        members = [_trainer("gpu-scheduler"), _trainer("gpu-scheduler")]
        for p, name, claim in zip(members, ("w0", "w1"), ("data", "missing"), strict=True):
            p["metadata"]["name"] = name
            p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "job"}
            p["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "2"
            p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = claim
        await kit.create_all(kube, pods, members)
        said = await asyncio.to_thread(_explain, control_plane, f"{namespace}/w0")
        assert f'member {namespace}/w1 cannot be bound: persistentvolumeclaim "missing" not found' in said, said
    finally:
        await kube.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{tag}")


async def test_a_node_at_its_csi_attach_limit_is_passed_over(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    tag = f"cs-{uuid.uuid4().hex[:6]}"
    name = f"gs-{tag}"
    roomy, small = f"{tag}-roomy", f"{tag}-small"  # best fit would take the small one
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(roomy, 8, "A100"), kit.node(small, 1, "A100")])
    limits = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": small},
        "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 1}}]},
    }
    await kit.create_all(kube, "/apis/storage.k8s.io/v1/csinodes", [limits])
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    volumes = []
    for disk in ("old", "new"):
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{tag}-{disk}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": f"vol-{tag}-{disk}"},
                "claimRef": {"namespace": namespace, "name": disk},
            },
        }
        volumes.append(pv)
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": disk, "annotations": {BIND_COMPLETED: "yes"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": f"{tag}-{disk}",
                "storageClassName": "",
            },
        }
        await kit.create_all(kube, "/api/v1/persistentvolumes", [pv])
        await kit.create_all(kube, claims, [claim])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    running = kit.pod("running", "other-scheduler", cpu="1", node_name=small)
    running["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "old"}}]
    await kit.create_all(kube, pods, [running])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        trainer = _trainer(name)
        trainer["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "new"
        await kit.create_all(kube, pods, [trainer])
        pod = await _until(kube, f"{pods}/trainer", lambda o: o["spec"].get("nodeName"))
        assert pod["spec"]["nodeName"] == roomy  # the small node attaches one EBS volume, and has it
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        for pv in volumes:
            await kube.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        await kube.request("DELETE", f"/apis/storage.k8s.io/v1/csinodes/{small}")
