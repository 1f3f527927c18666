"""Claims of a WaitForFirstConsumer storage class are provisioned for the pod's node: the pod is
placed within the class's topology, the claim annotated with the node, and the pod bound only once
the provisioner's volume is bound to the claim; when the provisioner gives up, the claim goes, or
the wait runs out, the Binding is refused with the reason and the room is freed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gpusched.daemon import Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.daemon.volumes import gangs_sharing_new_claims, on_one_node
from gpusched.kube.binder import BindResult
from gpusched.kube.convert import BIND_COMPLETED, SELECTED_NODE, pod_record
from gpusched.model import Pod
from tests.doubles import RecordingApi, member_pod, one_node_scheduler
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0
ZONE = "topology.kubernetes.io/zone"


class _Provisioned(RecordingApi):
    """Records where each pod is bound, and each claim annotated with a node."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, str] = {}
        self.selected: list[tuple[str, str]] = []
        self.select_error = ""

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.nodes[pod.key] = node
        return await super().bind(pod, node, gpus)

    async def select_node(self, namespace: str, claim: str, node: str) -> str:
        if self.select_error:
            return self.select_error
        self.selected.append((f"{namespace}/{claim}", node))
        return ""


def _class(
    name: str = "fast", provisioner: str = "disk.example.com", zones: tuple[str, ...] = ("b",)
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    if zones:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": ZONE, "values": list(zones)}]}]
    return obj


def _claim(name: str = "data", cls: str = "fast", node: str = "", volume: str = "") -> dict[str, Any]:
    annotations = {SELECTED_NODE: node} if node else {}
    if volume:
        annotations[BIND_COMPLETED] = "yes"
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": cls, "volumeName": volume},
        "status": {"phase": "Bound" if volume else "Pending"},
    }


def _volume(name: str, zone: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}
    return {"metadata": {"name": name}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}}


def _mounting(obj: dict[str, Any], *claims: str) -> dict[str, Any]:
    obj["spec"]["volumes"] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return obj


def _handler(s: Scheduler, name: str) -> Any:
    return next(r.handler for r in s.reflectors if r.name == name)


def _cluster(api: _Provisioned, *classes: dict[str, Any]) -> Scheduler:
    """n0 (no zone, 2 GPUs), a-0 (zone a, 4 GPUs) and b-0 (zone b, 1 GPU), and ``classes``."""
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("a-0", 4, "A100", **{ZONE: "a"}))
    NodeHandler(s).apply("ADDED", kit.node("b-0", 1, "A100", **{ZONE: "b"}))
    _handler(s, "storage-classes").replace(list(classes) or [_class()])
    _handler(s, "volumes").replace([])
    return s


async def _batch(s: Scheduler) -> None:
    """One batch, and its writes, but not the waits for volumes (they last until claims change)."""
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await _writes(s)


async def _writes(s: Scheduler) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    while busy := [t for t in s.pending_tasks() if not t.get_name().startswith("volumes:")]:
        await asyncio.wait(busy)


async def _trainer_placed(api: _Provisioned, claim: dict[str, Any], *classes: dict[str, Any]) -> Scheduler:
    """``_cluster`` with ``claim``, and the first batch over the pod ``trainer`` mounting it."""
    s = _cluster(api, *classes)
    _handler(s, "claims").replace([claim])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), claim["metadata"]["name"]))
    await _batch(s)
    return s


def _metric(s: Scheduler, name: str) -> float:
    """The value of the sample ``name`` (with its labels) on the scheduler's /metrics."""
    for line in s.metrics.render()[0].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name}")


def _waiting(s: Scheduler) -> list[str]:
    return sorted(t.get_name() for t in s.pending_tasks() if t.get_name().startswith("volumes:"))


async def test_a_pod_is_placed_in_its_class_topology_and_bound_once_its_volume_is_provisioned_there() -> None:
    api = _Provisioned()
    s = await _trainer_placed(api, _claim())
    claims = _handler(s, "claims")
    # b-0 is the class's only zone: the claim is annotated for it, and the pod waits, room held.
    assert api.selected == [("default/data", "b-0")]
    assert api.bound == []
    assert _waiting(s) == ["volumes:default/trainer"]
    assert s.cache.holds("default/trainer", "uid-trainer")
    assert _metric(s, "gpusched_pods_waiting_for_volumes") == 1.0
    rival = member_pod("rival")
    rival["spec"]["nodeSelector"] = {ZONE: "b"}
    s._pending.apply("ADDED", rival)
    await _batch(s)
    assert api.bound == []  # b-0's only GPU is held for the trainer
    assert api.failed("default/rival") == [
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
    ]
    claims.apply("MODIFIED", _claim(node="b-0"))  # the watch shows the annotation
    await _writes(s)
    assert api.bound == []  # no volume yet
    _handler(s, "volumes").apply("ADDED", _volume("pv-data", "b"))
    claims.apply("MODIFIED", _claim(node="b-0", volume="pv-data"))  # the provisioner's volume, bound
    await _writes(s)
    assert api.nodes == {"default/trainer": "b-0"}
    assert _waiting(s) == []
    assert s.queue.counts().in_flight == 0
    assert _metric(s, "gpusched_pods_waiting_for_volumes") == 0.0
    assert _metric(s, 'gpusched_volume_bindings_total{result="ready"}') == 1.0


async def test_a_claim_annotated_for_a_node_already_holds_its_pod_to_that_node() -> None:
    """A volume being provisioned for a node (a pod placed before a restart, or by another
    scheduler) can be used there only."""
    api = _Provisioned()
    s = await _trainer_placed(api, _claim(node="a-0"), _class(zones=()))
    assert api.selected == []  # annotated already
    assert _waiting(s) == ["volumes:default/trainer"]
    _handler(s, "volumes").apply("ADDED", _volume("pv-data", "a"))
    _handler(s, "claims").apply("MODIFIED", _claim(node="a-0", volume="pv-data"))
    await _writes(s)
    assert api.nodes == {"default/trainer": "a-0"}  # not n0, which best fit would take


async def test_when_the_provisioner_gives_the_node_up_the_binding_is_refused_and_the_pod_placed_again() -> None:
    api = _Provisioned()
    s = await _trainer_placed(api, _claim())
    claims = _handler(s, "claims")
    claims.apply("MODIFIED", _claim(node="b-0"))
    await _writes(s)
    assert _waiting(s) == ["volumes:default/trainer"]
    claims.apply("MODIFIED", _claim())  # the provisioner failed there and took the annotation off
    await _writes(s)
    assert _waiting(s) == []
    assert api.failed("default/trainer") == [
        'Binding rejected: binding volumes: provisioning failed for persistentvolumeclaim "data" on node b-0 '
        "(the provisioner let the node go; the claim's Events say why)"
    ]
    assert not s.cache.holds("default/trainer", "uid-trainer")  # its room is free again
    assert s.queue.counts().backoff == 1  # and it is tried again
    assert api.bound == []


async def test_a_claim_deleted_or_a_pod_deleted_while_waiting_frees_the_room() -> None:
    api = _Provisioned()
    s = _cluster(api, _class(zones=()))
    claims = _handler(s, "claims")
    claims.replace([_claim("one"), _claim("two")])
    s._pending.apply("ADDED", _mounting(member_pod("first"), "one"))
    s._pending.apply("ADDED", _mounting(member_pod("second"), "two"))
    await _batch(s)
    assert _waiting(s) == ["volumes:default/first", "volumes:default/second"]
    claims.apply("DELETED", _claim("one"))
    s._pending.apply("DELETED", _mounting(member_pod("second"), "two"))
    await _writes(s)
    assert _waiting(s) == []
    assert api.failed("default/first") == ['Binding rejected: binding volumes: persistentvolumeclaim "one" was deleted']
    assert not s.cache.holds("default/first")
    assert not s.cache.holds("default/second")
    assert api.bound == []
    assert len(s.queue) == 1  # the first waits to be tried again; the second is gone


@pytest.mark.parametrize(
    ("timeout", "select_error", "told"),
    [
        (
            0.05,
            "",
            "claim(s) data not bound to a volume for node b-0 within 0.05 s; is the provisioner running?",
        ),
        (
            600.0,
            'persistentvolumeclaims "data" is forbidden',
            'cannot ask for a volume for claim "data" on node b-0: persistentvolumeclaims "data" is forbidden',
        ),
    ],
    ids=["not-provisioned-in-time", "claim-not-annotated"],
)
async def test_a_volume_not_asked_for_or_not_provisioned_in_time_gives_the_binding_up(
    timeout: float, select_error: str, told: str
) -> None:
    api = _Provisioned()
    api.select_error = select_error
    s = _cluster(api)
    s.volume_binding.timeout = timeout
    _handler(s, "claims").replace([_claim()])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "data"))
    await _batch(s)
    await asyncio.wait_for(asyncio.gather(*s.pending_tasks()), DRAWN_WITHIN_S)
    assert api.failed("default/trainer") == [f"Binding rejected: binding volumes: {told}"]
    assert not s.cache.holds("default/trainer")
    assert s.queue.counts().backoff == 1
    result = "timeout" if timeout < 1 else "failed"
    assert _metric(s, f'gpusched_volume_bindings_total{{result="{result}"}}') == 1.0


async def test_two_pods_of_one_batch_sharing_a_claim_to_be_provisioned_go_to_one_node() -> None:
    api = _Provisioned()
    s = _cluster(api, _class(zones=("a", "b")))  # best fit takes b-0 for one pod, a-0 for two
    _handler(s, "claims").replace([_claim()])
    s._pending.apply("ADDED", _mounting(member_pod("first"), "data"))
    s._pending.apply("ADDED", _mounting(member_pod("second"), "data"))
    await _batch(s)
    assert api.selected == [("default/data", "b-0")]
    assert api.failed("default/second") == [
        'persistentvolumeclaim "data" is to be bound for the node of pod default/first, placed first; '
        "the pod is retried once it is chosen"
    ]
    await _batch(s)  # retried soon: held to the node chosen for the claim, which is full
    assert api.failed("default/second")[-1] == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't find available persistent "
        "volumes to bind."
    )
    assert _waiting(s) == ["volumes:default/first"]


@pytest.mark.parametrize(
    ("cls", "claim", "told"),
    [
        (
            _class(),
            _claim(cls=""),
            'pod has unbound immediate PersistentVolumeClaims ("data"); the pod is retried once the claim is bound',
        ),
        (
            _class() | {"volumeBindingMode": "Immediate"},
            _claim(),
            'pod has unbound immediate PersistentVolumeClaims ("data"); the pod is retried once the claim is bound',
        ),
        (_class(), _claim(cls="slow"), 'storageclass.storage.k8s.io "slow" not found'),
        (
            _class(provisioner="kubernetes.io/no-provisioner"),
            _claim(),
            'persistentvolumeclaim "data" waits for a volume made beforehand (storage class "fast" has no '
            "provisioner), and no available persistent volume matches it (its storage class, size, access modes, "
            "volume mode and selector); the pod is retried when a volume changes",
        ),
        (
            _class() | {"allowedTopologies": [{}]},
            _claim(),
            'storage class "fast" of claim "data": allowedTopologies has no term with an expression, so it '
            "provisions for no node",
        ),
    ],
    ids=["no-class", "immediate", "class-missing", "no-provisioner", "no-topology"],
)
async def test_a_claim_this_scheduler_cannot_have_provisioned_is_told(
    cls: dict[str, Any], claim: dict[str, Any], told: str
) -> None:
    api = _Provisioned()
    s = _cluster(api, cls)
    _handler(s, "claims").replace([claim])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "data"))
    await _batch(s)
    assert api.failed("default/trainer") == [told]
    assert api.selected == []
    assert _waiting(s) == []
    assert s.queue.counts().unschedulable == 1


async def test_a_class_topology_no_node_has_leaves_the_pod_unschedulable_with_the_nodes_counted() -> None:
    api = _Provisioned()
    await _trainer_placed(api, _claim(), _class(zones=("c",)))
    assert api.failed("default/trainer") == [
        "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind."
    ]
    assert api.selected == []


class _Controller(_Provisioned):
    """Records each volume a claim is written into too."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed: list[tuple[str, str, str]] = []
        self.claim_error = ""

    async def claim_volume(self, volume: str, version: str, namespace: str, claim: str, uid: str) -> str:
        if self.claim_error:
            return self.claim_error
        self.claimed.append((volume, version, f"{namespace}/{claim}"))
        return ""


def _local(name: str, node: str, size: str = "100Gi", cls: str = "local", **extra: Any) -> dict[str, Any]:
    """A local volume on ``node``, available, as local-static-provisioner makes them."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    spec = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": cls,
        "local": {"path": "/mnt/disks/" + name},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
    } | extra
    return {"metadata": {"name": name, "resourceVersion": "7"}, "spec": spec, "status": {"phase": "Available"}}


def _local_claim(name: str = "scratch", size: str = "50Gi", volume: str = "") -> dict[str, Any]:
    obj = _claim(name, cls="local", volume=volume)
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["spec"]["resources"] = {"requests": {"storage": size}}
    return obj


def _local_class() -> dict[str, Any]:
    return _class("local", provisioner="kubernetes.io/no-provisioner", zones=())


async def test_a_claim_is_bound_to_the_smallest_local_volume_made_beforehand_on_the_node_chosen() -> None:
    api = _Controller()
    s = _cluster(api, _local_class())
    volumes = _handler(s, "volumes")
    # a-0 has a volume too small and one large enough; b-0 none; n0 a larger one.
    volumes.replace([_local("a-small", "a-0", "10Gi"), _local("a-big", "a-0", "200Gi"), _local("n0-big", "n0", "1Ti")])
    _handler(s, "claims").replace([_local_claim()])
    big = _mounting(member_pod("trainer"), "scratch")
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"  # a-0 only has room
    s._pending.apply("ADDED", big)
    await _batch(s)
    assert api.claimed == [("a-big", "7", "default/scratch")]
    assert api.selected == []  # no provisioner to ask
    assert _waiting(s) == ["volumes:default/trainer"]
    # The volume controller completes the binding.
    bound = _local("a-big", "a-0", "200Gi", claimRef={"namespace": "default", "name": "scratch"})
    bound["status"]["phase"] = "Bound"
    volumes.apply("MODIFIED", bound)
    _handler(s, "claims").apply("MODIFIED", _local_claim(volume="a-big"))
    await _writes(s)
    assert api.nodes == {"default/trainer": "a-0"}


async def test_a_pod_whose_claim_no_local_volume_matches_is_told_and_the_nodes_without_one_counted() -> None:
    api = _Controller()
    s = _cluster(api, _local_class())
    _handler(s, "volumes").replace([_local("b-small", "b-0", "10Gi")])
    _handler(s, "claims").replace([_local_claim()])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "scratch"))
    await _batch(s)
    assert api.failed("default/trainer") == [
        'persistentvolumeclaim "scratch" waits for a volume made beforehand (storage class "local" has no '
        "provisioner), and no available persistent volume matches it (its storage class, size, access modes, "
        "volume mode and selector); the pod is retried when a volume changes"
    ]
    _handler(s, "volumes").apply("ADDED", _local("b-big", "b-0", "60Gi"))  # a disk added: retried at once
    await _batch(s)
    assert api.claimed == [("b-big", "7", "default/scratch")]
    # With the only matching volume on b-0, a pod b-0 has no room for is told of the others.
    s2 = _cluster(_Controller(), _local_class())
    _handler(s2, "volumes").replace([_local("b-big", "b-0", "60Gi")])
    _handler(s2, "claims").replace([_local_claim()])
    two = _mounting(member_pod("trainer"), "scratch")
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s2._pending.apply("ADDED", two)
    await _batch(s2)
    assert cast(_Controller, s2.binder).failed("default/trainer") == [
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't find available persistent "
        "volumes to bind."
    ]


async def test_two_claims_do_not_take_one_local_volume_and_one_taken_meanwhile_refuses_the_binding() -> None:
    api = _Controller()
    s = _cluster(api, _local_class())
    volumes = _handler(s, "volumes")
    volumes.replace([_local("a-disk", "a-0")])
    _handler(s, "claims").replace([_local_claim("one"), _local_claim("two")])
    s._pending.apply("ADDED", _mounting(member_pod("first"), "one"))
    await _batch(s)
    assert api.claimed == [("a-disk", "7", "default/one")]
    s._pending.apply("ADDED", _mounting(member_pod("second"), "two"))
    await _batch(s)  # the disk is reserved for the first pod's claim
    assert api.failed("default/second")[0].startswith('persistentvolumeclaim "two" waits for a volume made beforehand')
    # Another binder wrote a claim into the volume: the first pod's Binding is given up.
    taken = _local("a-disk", "a-0", claimRef={"namespace": "other", "name": "theirs"})
    volumes.apply("MODIFIED", taken)
    await _writes(s)
    assert api.failed("default/first") == [
        'Binding rejected: binding volumes: persistentvolume "a-disk" was bound to claim other/theirs'
    ]
    assert not s.cache.holds("default/first")
    assert s.claims.reserved == {}


async def test_a_pod_with_two_local_claims_goes_where_there_is_a_disk_for_each_not_to_the_best_fit_with_one() -> None:
    api = _Controller()
    s = _cluster(api, _local_class())
    # b-0, the best fit for one GPU, has one disk that either claim matches; n0 has two.
    _handler(s, "volumes").replace([_local("b-disk", "b-0"), _local("n0-small", "n0", "60Gi"), _local("n0-big", "n0")])
    _handler(s, "claims").replace([_local_claim("logs", "50Gi"), _local_claim("data", "80Gi")])
    s._pending.apply("ADDED", _mounting(member_pod("trainer"), "data", "logs"))
    await _batch(s)
    assert api.failed("default/trainer") == []
    # Each claim its own disk, the smaller claim first (as kube-scheduler hands them out).
    assert api.claimed == [("n0-small", "7", "default/logs"), ("n0-big", "7", "default/data")]
    # The volume controller completes both bindings: the pod is bound there.
    _handler(s, "claims").replace([_local_claim("logs", "50Gi", "n0-small"), _local_claim("data", "80Gi", "n0-big")])
    await _writes(s)
    assert api.nodes == {"default/trainer": "n0"}


async def test_a_gangs_members_sharing_a_claim_to_be_provisioned_are_placed_together_and_bound_once_it_is() -> None:
    api = _Provisioned()
    s = _cluster(api, _class(zones=()))
    _handler(s, "claims").replace([_claim()])
    for name in ("w0", "w1"):
        s._pending.apply("ADDED", _mounting(member_pod(name, gang="job"), "data"))
    await _batch(s)
    assert api.failed("default/w0") == []
    assert api.failed("default/w1") == []  # not held back behind its peer: the gang would never start
    ((claim, node),) = api.selected  # asked for once, for the node of both
    assert claim == "default/data"
    assert _waiting(s) == ["volumes:default/w0", "volumes:default/w1"]
    _handler(s, "claims").apply("MODIFIED", _claim(node=node))
    _handler(s, "volumes").apply("ADDED", {"metadata": {"name": "pv-data"}, "spec": {}})
    _handler(s, "claims").apply("MODIFIED", _claim(node=node, volume="pv-data"))
    await _writes(s)
    assert api.nodes == {"default/w0": node, "default/w1": node}
    assert s.claims.selecting == {}


async def test_a_pod_deleted_while_waiting_for_its_volume_frees_its_room_at_once() -> None:
    api = _Provisioned()
    s = await _trainer_placed(api, _claim())
    assert _waiting(s) == ["volumes:default/trainer"]
    s._pending.apply("DELETED", _mounting(member_pod("trainer"), "data"))
    await _writes(s)
    for _ in range(5):
        await asyncio.sleep(0)
    assert _waiting(s) == []  # no claim or volume changed: the pod's going woke the wait
    assert not s.cache.holds("default/trainer")
    assert s.claims.selecting == {}


async def test_a_claim_held_for_one_node_refuses_a_pod_placed_on_another_before_anything_is_written() -> None:
    """The batch placed the pod on claims as they were; at binding they are read again."""
    api = _Provisioned()
    s = await _trainer_placed(api, _claim(), _class(zones=()))
    (held,) = {n for _, n in api.selected}
    other = next(n for n in ("n0", "a-0", "b-0") if n != held)
    s._pending.apply("ADDED", _mounting(member_pod("late"), "data"))
    record = s.queue.record("default/late")
    assert record is not None
    assert s.volume_binding.hold(record.pod, other) == (
        (),
        f'binding volumes: claim "data" is being bound for node {held}, not {other}',
    )
    assert s.volume_binding.hold(record.pod, held) == (("data",), "")


async def test_a_gang_two_members_of_which_share_a_new_claim_goes_whole_to_one_node() -> None:
    """Its launcher mounts nothing: the gang is still placed on one node, never started on two
    with the members that follow the claim left behind."""
    api = _Provisioned()
    s = _cluster(api, _class(zones=()))
    _handler(s, "claims").replace([_claim()])
    s._pending.apply("ADDED", member_pod("launcher", gang="job"))
    for name in ("w0", "w1"):
        s._pending.apply("ADDED", _mounting(member_pod(name, gang="job"), "data"))
    await _batch(s)
    assert [e for e in api.events if e[1] == "FailedScheduling"] == []
    assert api.bound == ["default/launcher"]
    assert api.nodes == {"default/launcher": "a-0"}  # the only node with three GPUs
    assert api.selected == [("default/data", "a-0")]
    _handler(s, "claims").apply("MODIFIED", _claim(node="a-0"))
    _handler(s, "volumes").apply("ADDED", _volume("pv-data", "a"))
    _handler(s, "claims").apply("MODIFIED", _claim(node="a-0", volume="pv-data"))
    await _writes(s)
    assert api.nodes == {"default/launcher": "a-0", "default/w0": "a-0", "default/w1": "a-0"}


def test_gangs_sharing_a_new_claim_are_found_and_held_to_one_node() -> None:
    s = _cluster(_Provisioned(), _class(zones=()))
    _handler(s, "claims").replace([_claim(), _claim("own"), _claim("chosen", node="n0")])
    gang = pod_record(member_pod("w", gang="job")).pod
    lone = pod_record(member_pod("x")).pod
    assert gangs_sharing_new_claims([(gang, ("data",)), (gang, ("data", "own"))], s.claims) == {"default/job"}
    assert gangs_sharing_new_claims([(gang, ("own",)), (gang, ("chosen",)), (gang, ("chosen",))], s.claims) == set()
    assert gangs_sharing_new_claims([(lone, ("data",)), (gang, ("data",))], s.claims) == set()
    pinned = on_one_node(gang, {"default/job"})
    assert pinned.gang is not None
    assert (pinned.gang.topology_key, pinned.gang.topology) == ("kubernetes.io/hostname", "required")
    assert on_one_node(lone, {"default/job"}) is lone


async def test_when_asking_for_a_shared_claim_fails_every_pod_holding_it_is_refused_at_once() -> None:
    api = _Provisioned()
    api.select_error = 'persistentvolumeclaims "data" is forbidden'
    s = _cluster(api, _class(zones=()))
    _handler(s, "claims").replace([_claim()])
    for name in ("w0", "w1"):
        s._pending.apply("ADDED", _mounting(member_pod(name, gang="job"), "data"))
    await _batch(s)
    await asyncio.wait_for(asyncio.gather(*s.pending_tasks()), DRAWN_WITHIN_S)  # not the 600 s wait
    told = (
        'Binding rejected: binding volumes: cannot ask for a volume for claim "data" on node n0: '
        'persistentvolumeclaims "data" is forbidden'
    )  # (both on n0: two GPUs, best fit)
    assert api.failed("default/w0") == [told]
    assert api.failed("default/w1") == [told]


def _csi_volume(name: str, handle: str = "", driver: str = "ebs.csi.aws.com") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"csi": {"driver": driver, "volumeHandle": handle or name}}}


def _csi_nodes(s: Scheduler, **limits: int) -> None:
    """Each named node's CSINode, its EBS driver allowed ``limits[node]`` volumes."""
    objs = [
        {"metadata": {"name": n}, "spec": {"drivers": [{"name": "ebs.csi.aws.com", "allocatable": {"count": c}}]}}
        for n, c in limits.items()
    ]
    _handler(s, "csi-nodes").replace(objs)


async def test_a_node_at_its_csi_attach_limit_takes_no_pod_with_another_volume_of_that_driver() -> None:
    api = _Provisioned()
    s = _cluster(api, _class(zones=()))
    _handler(s, "volumes").replace([_csi_volume("pv-a"), _csi_volume("pv-b"), _csi_volume("pv-shared", "shared")])
    _handler(s, "claims").replace(
        [_claim("a", volume="pv-a"), _claim("b", volume="pv-b"), _claim("shared", volume="pv-shared")]
    )
    _csi_nodes(s, n0=2, **{"a-0": 0, "b-0": 0})
    running = _mounting(member_pod("running", node="n0"), "a", "shared")
    running["status"] = {"phase": "Running"}
    s._bound.apply("ADDED", running)
    s._pending.apply("ADDED", _mounting(member_pod("another"), "b"))
    await _batch(s)
    assert api.failed("default/another") == ["0/3 nodes are available: 3 node(s) exceed max volume count."]
    s._pending.apply("ADDED", _mounting(member_pod("same"), "shared"))  # attached there already
    await _batch(s)
    assert api.nodes == {"default/same": "n0"}
    _csi_nodes(s, n0=3, **{"a-0": 1, "b-0": 0})  # a limit grown: the pod waiting is retried at once
    await _batch(s)
    assert api.nodes == {"default/same": "n0", "default/another": "a-0"}  # (n0's GPUs are all taken now)


async def test_two_pods_of_one_batch_do_not_pass_a_nodes_attach_limit_together() -> None:
    api = _Provisioned()
    s = one_node_scheduler(api, gpus=4)
    _handler(s, "volumes").replace([_csi_volume("pv-a"), _csi_volume("pv-b")])
    _handler(s, "claims").replace([_claim("a", volume="pv-a"), _claim("b", volume="pv-b")])
    _csi_nodes(s, n0=1)
    s._pending.apply("ADDED", _mounting(member_pod("first"), "a"))
    s._pending.apply("ADDED", _mounting(member_pod("second"), "b"))
    await _batch(s)
    await asyncio.wait_for(asyncio.gather(*s.pending_tasks()), DRAWN_WITHIN_S)
    assert list(api.nodes) == ["default/first"]
    assert api.failed("default/second") == []  # not told: placed again at once, the slot counted
    await _batch(s)
    assert api.failed("default/second") == ["0/1 nodes are available: 1 node(s) exceed max volume count."]
