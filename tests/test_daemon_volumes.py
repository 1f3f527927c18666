"""A ReadWriteOncePod claim is one pod's at a time: a pod mounting one that another pod uses
waits, told which pod, and is bound once that pod is gone; of two pods of one batch, the
first in queue order takes it."""

from __future__ import annotations

import asyncio
from typing import Any

from gpusched.daemon import Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import BindResult
from gpusched.kube.convert import BIND_COMPLETED
from gpusched.model import Pod
from gpusched.model.affinity import Requirement
from tests.doubles import RecordingApi, member_pod, one_node_scheduler, settle
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0
RWOP = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod"
)


def _claims(s: Scheduler, **modes: str) -> None:
    """Claims of ``default`` by name, each of the access mode given and bound to a volume of its own."""
    pvcs = [
        {
            "metadata": {"name": name, "namespace": "default", "annotations": {BIND_COMPLETED: "yes"}},
            "spec": {"accessModes": [mode], "volumeName": f"pv-{name}"},
            "status": {"phase": "Bound"},
        }
        for name, mode in modes.items()
    ]
    pvs = [{"metadata": {"name": f"pv-{name}"}, "spec": {"nfs": {}}} for name in modes]
    next(r.handler for r in s.reflectors if r.name == "claims").replace(pvcs)
    next(r.handler for r in s.reflectors if r.name == "volumes").replace(pvs)


def _mounting(obj: dict[str, Any], *claims: str) -> dict[str, Any]:
    obj["spec"]["volumes"] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return obj


def _running(name: str, node: str, *claims: str) -> dict[str, Any]:
    """Another scheduler's pod asking for no GPU, bound to ``node``, mounting ``claims``."""
    obj = kit.pod(name, "default-scheduler", cpu="1", node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    obj["status"] = {"phase": "Running"}
    return _mounting(obj, *claims)


async def _batch(s: Scheduler) -> None:
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)


async def test_a_pod_waits_for_the_pod_using_its_read_write_once_pod_claim_and_is_bound_once_it_is_gone() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("cpu-0", 0, ""))
    _claims(s, solo="ReadWriteOncePod", shared="ReadWriteOnce")
    # The claim's user runs on a node without GPUs: what it frees there no GPU pod could use,
    # but its claim is free when it goes.
    s._bound.apply("ADDED", _running("holder", "cpu-0", "solo", "shared"))
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "shared", "solo"))
    s._pending.apply("ADDED", _mounting(member_pod("reader"), "shared"))
    await _batch(s)
    assert api.bound == ["default/reader"]  # a claim of another access mode is shared
    assert api.failed("default/trainer") == [
        'persistentvolumeclaim "solo" has access mode ReadWriteOncePod and pod default/holder uses it '
        f"({RWOP}); the pod is retried when that pod is gone"
    ]
    assert s.queue.counts().unschedulable == 1
    assert s.waiting(s.queue.parked()) == []  # no new node would let it in
    terminating = _running("holder", "cpu-0", "solo", "shared")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    s._bound.apply("MODIFIED", terminating)
    await _batch(s)
    assert api.bound == ["default/reader"]  # being deleted, it still uses the claim
    assert s.queue.counts().unschedulable == 1
    terminating["status"]["phase"] = "Succeeded"  # its containers ended: it uses the claim no more
    s._bound.apply("MODIFIED", terminating)
    assert s.queue.counts().unschedulable == 0  # woken by its claim's user ending, not the minute's flush
    await _batch(s)
    assert api.bound == ["default/reader", "default/trainer"]


async def test_of_two_pods_of_one_batch_mounting_a_read_write_once_pod_claim_the_first_is_bound() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    _claims(s, solo="ReadWriteOncePod")
    for name in ("first", "second"):
        s._pending.apply("ADDED", _mounting(member_pod(name), "solo"))
    await _batch(s)
    assert api.bound == ["default/first"]
    assert api.failed("default/second") == [
        'persistentvolumeclaim "solo" has access mode ReadWriteOncePod and pod default/first uses it '
        f"({RWOP}); the pod is retried when that pod is gone"
    ]
    # Retried soon (first might not have been bound), it now finds first on the books: parked.
    await _batch(s)
    assert api.bound == ["default/first"]
    assert s.queue.counts().unschedulable == 1
    bound_first = _mounting(member_pod("first", node="n0"), "solo")
    bound_first["status"] = {"phase": "Running"}
    s._bound.apply("ADDED", bound_first)
    s._bound.apply("DELETED", bound_first)
    await _batch(s)
    assert api.bound == ["default/first", "default/second"]


async def test_a_pod_refused_for_a_batch_peer_that_is_not_bound_after_all_is_bound_soon() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    _claims(s, solo="ReadWriteOncePod")
    too_big = _mounting(member_pod("too-big"), "solo")
    too_big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
    s._pending.apply("ADDED", too_big)
    s._pending.apply("ADDED", _mounting(member_pod("fits"), "solo"))
    await _batch(s)
    assert api.bound == []
    assert "pod default/too-big uses it" in api.failed("default/fits")[0]
    await _batch(s)  # drawn again without waiting for a change in the cluster
    assert api.bound == ["default/fits"]


class _Placing(RecordingApi):
    """Records where each pod is bound too."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, str] = {}

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.nodes[pod.key] = node
        return await super().bind(pod, node, gpus)


async def test_a_pod_mounting_a_zonal_volume_is_bound_in_its_zone_and_told_of_the_others_when_it_is_full() -> None:
    api = _Placing()
    s = one_node_scheduler(api, gpus=2)  # n0: no zone
    for name, zone in (("a-0", "a"), ("b-0", "b")):
        NodeHandler(s).apply("ADDED", kit.node(name, 2, "A100", **{"topology.kubernetes.io/zone": zone}))
    in_b = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}
    claim = {
        "metadata": {"name": "disk", "namespace": "default", "annotations": {BIND_COMPLETED: "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-disk"},
        "status": {"phase": "Bound"},
    }
    pv = {"metadata": {"name": "pv-disk"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [in_b]}}}}
    next(r.handler for r in s.reflectors if r.name == "claims").replace([claim])
    next(r.handler for r in s.reflectors if r.name == "volumes").replace([pv])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "disk"))
    await _batch(s)
    assert api.nodes == {"default/trainer": "b-0"}
    big = _mounting(member_pod("big"), "disk")
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", big)
    await _batch(s)
    assert "default/big" not in api.nodes  # b-0 has one GPU left; n0 and a-0 have two, out of its zone
    assert api.failed("default/big") == [
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had volume node affinity conflict."
    ]
    # A new node in zone b would let it in: it counts as waiting for room, held to that zone.
    assert [(p.key, p.volume_selector) for p in s.waiting(s.queue.parked())] == [("default/big", (_zone_b(),))]


def _zone_b() -> tuple[Requirement, ...]:
    return (Requirement("topology.kubernetes.io/zone", "In", ("b",)),)


async def test_a_pod_mounting_a_volume_labelled_with_a_zone_is_kept_to_its_zone() -> None:
    """A volume without node affinity but with zone labels (a zonal disk provisioned before
    topology-aware provisioning) can be attached only in its zones: kube-scheduler's VolumeZone
    lets its pods onto nodes of those zones, or with no zone or region label at all."""
    api = _Placing()
    s = one_node_scheduler(api, gpus=2)  # n0: no zone or region label
    NodeHandler(s).apply("ADDED", kit.node("a-0", 4, "A100", **{"topology.kubernetes.io/zone": "a"}))
    NodeHandler(s).apply("ADDED", kit.node("b-0", 1, "A100", **{"topology.kubernetes.io/zone": "b"}))
    claim = {
        "metadata": {"name": "disk", "namespace": "default", "annotations": {BIND_COMPLETED: "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-disk"},
        "status": {"phase": "Bound"},
    }
    pv = {"metadata": {"name": "pv-disk", "labels": {"topology.kubernetes.io/zone": "b"}}, "spec": {"csi": {}}}
    next(r.handler for r in s.reflectors if r.name == "claims").replace([claim])
    next(r.handler for r in s.reflectors if r.name == "volumes").replace([pv])
    big = _mounting(member_pod("big"), "disk")
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
    s._pending.apply("ADDED", big)
    await _batch(s)
    assert api.nodes == {}  # only a-0 has four GPUs, and the disk cannot be attached in zone a
    assert api.failed("default/big") == [
        "0/3 nodes are available: 1 node(s) had volume node affinity conflict, 2 Insufficient nvidia.com/gpu."
    ]
    s._pending.apply("ADDED", _mounting(member_pod("small"), "disk"))
    await _batch(s)
    assert api.nodes["default/small"] in ("n0", "b-0")
