"""API JSON -> records: what a user's Node and Pod manifests turn into."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from gpusched.kube.convert import (
    ConvertError,
    budget_record,
    claim_record,
    csi_node_limits,
    namespace_labels,
    node_record,
    pod_group_record,
    pod_record,
    storage_class_record,
    volume_record,
)
from gpusched.model import Assignment, Cluster, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread, selects
from gpusched.model.node import Taint
from gpusched.model.pod import Toleration
from gpusched.solver.explain import explain
from gpusched.solver.preempt import Budget
from gpusched.state.volumes import ClaimRecord, Claims, VolumeRecord


def node_obj(name: str = "n1", gpus: str | None = "8", labels: dict[str, str] | None = None, **spec: Any) -> Any:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus is not None:
        alloc["nvidia.com/gpu"] = gpus
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "status": {"allocatable": alloc}}


def pod_obj(
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> Any:
    res: dict[str, Any] = {}
    if limits:
        res["limits"] = limits
    if requests:
        res["requests"] = requests
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "resources": res}], **spec},
        "status": {"phase": "Pending"},
    }


def test_node_gpus_model_and_memory_from_resources_and_labels() -> None:
    rec = node_record(node_obj(labels={"nvidia.com/gpu.product": "A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}))
    n = rec.node
    assert (n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_model, n.gpu_memory_mib) == (
        64000,
        512 * 1024,
        8,
        "A100-SXM4-80GB",
        81920,
    )
    assert (rec.node.unschedulable, rec.node.taints) == (False, ())


def test_gpus_count_only_when_the_device_plugin_advertises_them() -> None:
    # GPU feature discovery has labelled the node, but the kubelet admits against allocatable.
    rec = node_record(node_obj(gpus=None, labels={"nvidia.com/gpu.count": "4"}))
    assert rec.node.gpu_count == 0
    assert "label nvidia.com/gpu.count=4 but no allocatable nvidia.com/gpu" in rec.warning
    assert node_record(node_obj(gpus="4")).node.gpu_model == "unknown"


def test_cordoned_nodes_carry_the_unschedulable_taint_and_taints_are_kept_for_the_pods_to_tolerate() -> None:
    cordoned = node_record(node_obj(unschedulable=True)).node
    assert cordoned.unschedulable
    assert cordoned.taints == (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),)
    # The node controller has added the taint already (with its timestamp): not added twice.
    marked = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-12-06T10:00:00Z"}]
    assert node_record(node_obj(unschedulable=True, taints=marked)).node.taints == cordoned.taints
    # Uncordoned before the controller took its taint off: the taint still keeps pods off.
    lag = node_record(node_obj(taints=marked)).node
    assert (lag.unschedulable, lag.taints) == (False, cordoned.taints)
    tainted = node_record(node_obj(taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]))
    assert not tainted.node.unschedulable
    assert tainted.node.taints == (Taint("gpu", "broken", "NoSchedule"),)
    soft = node_record(node_obj(taints=[{"key": "x", "effect": "PreferNoSchedule"}]))
    assert soft.node.taints == ()
    assert soft.node.soft_taints == (Taint("x", "", "PreferNoSchedule"),)  # weighed, not required


def test_when_a_pod_started_is_read_for_preemption_to_spare_the_longest_running() -> None:
    obj = pod_obj(nodeName="n0")
    assert pod_record(obj).pod.started == math.inf  # not started yet: the newest of all
    obj["status"] = {"phase": "Running", "startTime": "2026-12-01T00:00:10Z"}
    assert pod_record(obj).pod.started == 1_796_083_210.0


def test_priority_and_preemption_policy_are_read() -> None:
    default = pod_record(pod_obj()).pod
    assert (default.priority, default.preempts) == (0, True)
    urgent = pod_record(pod_obj(priority=1000, preemptionPolicy="PreemptLowerPriority")).pod
    assert (urgent.priority, urgent.preempts) == (1000, True)
    polite = pod_record(pod_obj(priority=1000, preemptionPolicy="Never")).pod
    assert (polite.priority, polite.preempts) == (1000, False)
    nominated = pod_obj(priority=1000)
    nominated["status"]["nominatedNodeName"] = "n7"
    assert (pod_record(nominated).nominated, pod_record(pod_obj()).nominated) == ("n7", "")


def test_disruption_budgets_are_read_and_an_unreadable_selector_is_refused() -> None:
    obj = {
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1, "disruptedPods": {"web-0": "2026-12-06T12:00:00Z"}},
    }
    key, budget = budget_record(obj)
    assert key == "ns/web"
    assert budget == Budget("ns", (Requirement("app", "In", ("web",)),), 1, frozenset({"web-0"}))
    # No controller has written its status yet: nothing may be disrupted.
    # An empty selector: no pod for preemption (as kube-scheduler), every pod for the Eviction API.
    empty = budget_record({"metadata": {"name": "b"}, "spec": {"selector": {}}})[1]
    assert empty == Budget("default", (), 0, everyone=True)
    assert budget_record({"metadata": {"name": "b"}, "spec": {}})[1] == Budget("default", (), 0)
    bad = {"metadata": {"name": "bad"}, "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}}
    with pytest.raises(ConvertError, match="PodDisruptionBudget default/bad: selector"):
        budget_record(bad)


@pytest.mark.parametrize("allowed", ["1", 1.5, math.inf, math.nan, [1], {"n": 1}, True])
def test_a_disruption_budget_whose_allowed_disruptions_are_no_whole_number_is_refused_naming_the_field(
    allowed: object,
) -> None:
    """Written by the disruption controller; a value of another type (a newer API, another
    controller) is refused with the field named, so the budget handler logs it instead of failing."""
    obj = {"metadata": {"name": "web", "namespace": "ns"}, "spec": {}, "status": {"disruptionsAllowed": allowed}}
    with pytest.raises(ConvertError, match=r"PodDisruptionBudget ns/web: status.disruptionsAllowed must be a whole"):
        budget_record(obj)
    obj["status"]["disruptionsAllowed"] = 2.0
    assert budget_record(obj)[1].allowed == 2


@pytest.mark.parametrize(
    ("spec", "status", "message"),
    [
        ("minAvailable: 1", {}, "spec must be an object"),
        ({}, [{"disruptionsAllowed": 1}], "status must be an object"),
        ({"selector": "app=web"}, {}, "selector must be a label selector"),
        ({"selector": {"matchLabels": ["app", "web"]}}, {}, "selector: matchLabels must map label keys to values"),
        ({}, {"disruptedPods": ["web-0"]}, "status.disruptedPods must be an object"),
    ],
)
def test_a_disruption_budget_field_of_the_wrong_json_type_is_refused_naming_it(
    spec: object, status: object, message: str
) -> None:
    obj = {"metadata": {"name": "web", "namespace": "ns"}, "spec": spec, "status": status}
    with pytest.raises(ConvertError, match=f"^PodDisruptionBudget ns/web: {message}"):
        budget_record(obj)


def test_a_podgroup_whose_spec_is_no_object_is_refused_naming_it() -> None:
    with pytest.raises(ConvertError, match=r"^PodGroup ns/train: spec must be an object, got 4"):
        pod_group_record({"metadata": {"name": "train", "namespace": "ns"}, "spec": 4})


@pytest.mark.parametrize(
    ("read", "obj", "message"),
    [
        (claim_record, {"spec": "data"}, "PersistentVolumeClaim ns/c: spec must be an object"),
        (claim_record, {"status": ["Bound"]}, "PersistentVolumeClaim ns/c: status must be an object"),
        (
            claim_record,
            {"metadata": {"name": "c", "namespace": "ns", "ownerReferences": {"uid": "u", "controller": True}}},
            "PersistentVolumeClaim ns/c: metadata.ownerReferences must be a list of objects",
        ),
        (namespace_labels, {"metadata": {"name": "c", "labels": ["team=a"]}}, "namespace c: metadata.labels must be"),
        (namespace_labels, {"metadata": {"name": "c", "labels": {"team": 5}}}, "namespace c: metadata.labels must map"),
    ],
)
def test_a_claim_or_namespace_field_of_the_wrong_json_type_is_refused_naming_it(
    read: Callable[[Any], object], obj: dict[str, Any], message: str
) -> None:
    """Their handlers leave such an object out of the books with a warning, as a node's does."""
    with pytest.raises(ConvertError, match=f"^{message}"):
        read({"metadata": {"name": "c", "namespace": "ns"}, **obj})


def test_tolerations_are_read() -> None:
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "x", "effect": "PreferNoSchedule"},
    ]
    pod = pod_record(pod_obj(tolerations=tolerations)).pod
    assert pod.tolerations == (
        Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
        Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
        Toleration("x", "Equal", "", "PreferNoSchedule"),  # it steers: the node it names is not avoided
    )


def test_mig_slices_are_read() -> None:
    obj = node_obj(gpus="6", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    obj["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "2"
    rec = node_record(obj)
    assert rec.mig == (("nvidia.com/mig-1g.10gb", 7), ("nvidia.com/mig-3g.40gb", 2))
    assert rec.node.mig_slices == (("1g.10gb", 7), ("3g.40gb", 2))
    assert rec.node.gpu_count == 6, "GPUs in MIG mode are not in nvidia.com/gpu"


def test_gpu_islands_from_the_annotation_or_the_product_default() -> None:
    sxm = node_record(node_obj(labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})).node
    assert sxm.islands == (0,) * 8, "an NVSwitch board is one island"
    pcie = node_record(node_obj(gpus="4", labels={"nvidia.com/gpu.product": "NVIDIA-L4"})).node
    assert pcie.islands == (0, 0, 1, 1), "PCIe cards split by CPU socket"
    obj = node_obj(gpus="4")
    obj["metadata"]["annotations"] = {"gpusched.io/gpu-islands": "0,3;1,2"}
    assert node_record(obj).node.islands == (0, 1, 1, 0)
    obj["metadata"]["annotations"] = {"gpusched.io/gpu-islands": "0-2"}
    stale = node_record(obj)  # e.g. written for 3 GPUs, and a fourth came back healthy
    assert stale.node.islands == (0, 0, 1, 1), "the default for four PCIe cards, not a dropped node"
    assert "GPUs [3] are in no island" in stale.warning
    obj["status"]["allocatable"]["nvidia.com/mig-lots"] = "3"
    assert "nvidia.com/mig-lots left out" in node_record(obj).warning


def test_mig_island_and_gang_requests() -> None:
    mig = pod_record(pod_obj(limits={"nvidia.com/mig-3g.40gb": "1", "cpu": "2"})).pod
    assert (mig.mig_profile, mig.num_gpu, mig.gpu_demand_milli) == ("3g.40gb", 0, 428)
    island = pod_record(pod_obj(limits={"nvidia.com/gpu": "4"}, annotations={"gpusched.io/gpu-island": "required"}))
    assert (island.pod.island, island.error) == ("required", "")
    rec = pod_record(
        pod_obj(
            limits={"nvidia.com/gpu": "8"},
            labels={"scheduling.x-k8s.io/pod-group": "train"},
            annotations={"gpusched.io/gang-min-members": "4", "gpusched.io/gang-topology-key": "rack"},
        )
    )
    assert rec.pod.gang is not None
    assert (rec.pod.gang.name, rec.pod.gang.min_members) == ("ns/train", 4)
    assert (rec.pod.gang.topology_key, rec.pod.gang.topology) == ("rack", "required")


def test_a_gang_without_the_annotation_takes_its_minimum_from_its_podgroup_and_the_annotation_wins() -> None:
    group = {"scheduling.x-k8s.io/pod-group": "train"}
    groups = {"ns/train": 3, "ns/other": 5}
    labelled = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, labels=group), pod_groups=groups)
    assert labelled.pod.gang is not None
    assert (labelled.pod.gang.min_members, labelled.pod_group, labelled.error) == (3, "ns/train", "")
    # The annotation wins over the PodGroup; the pod is then not read again when it changes.
    annotated = pod_record(
        pod_obj(limits={"nvidia.com/gpu": "1"}, labels=group, annotations={"gpusched.io/gang-min-members": "2"}),
        pod_groups=groups,
    )
    assert annotated.pod.gang is not None
    assert (annotated.pod.gang.min_members, annotated.pod_group) == (2, "")
    # No PodGroup of that name, or PodGroups not read: 1, and the record says where it would come from.
    for table in ({"ns/other": 5}, None):
        alone = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, labels=group), pod_groups=table)
        assert alone.pod.gang is not None
        assert (alone.pod.gang.min_members, alone.pod_group) == (1, "ns/train")
    # A PodGroup in another namespace is not the pod's.
    elsewhere = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, labels=group), pod_groups={"other/train": 3})
    assert elsewhere.pod.gang is not None
    assert elsewhere.pod.gang.min_members == 1
    # Not a gang member: no PodGroup to follow.
    assert pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}), pod_groups=groups).pod_group == ""
    # A member whose request cannot be honoured keeps its gang's minimum, so its peers wait for it.
    bad = pod_record(pod_obj(limits={"cpu": "lots"}, labels=group), pod_groups=groups)
    assert bad.error
    assert bad.pod.gang is not None
    assert bad.pod.gang.min_members == 3


@pytest.mark.parametrize(
    ("spec", "minimum"),
    [
        ({"minMember": 4, "scheduleTimeoutSeconds": 10}, 4),
        ({}, 1),
        ({"minMember": 0}, 1),
        ({"minMember": 2.0}, 2),
        ({"minMember": 10**400}, 10**400),
    ],
)
def test_a_podgroups_minimum_is_read_from_its_spec(spec: dict[str, Any], minimum: int) -> None:
    obj = {"metadata": {"name": "train", "namespace": "ns"}, "spec": spec}
    assert pod_group_record(obj) == ("ns/train", minimum)


@pytest.mark.parametrize("value", ["3", 2.5, True, math.inf, -math.inf, math.nan])
def test_a_podgroup_whose_minimum_is_no_whole_number_is_refused(value: object) -> None:
    with pytest.raises(ConvertError, match=r"PodGroup ns/train: spec.minMember must be a whole number"):
        pod_group_record({"metadata": {"name": "train", "namespace": "ns"}, "spec": {"minMember": value}})


def test_a_node_advertising_more_gpus_than_a_node_holds_offers_none_naming_it() -> None:
    rec = node_record(node_obj(gpus="9e18"))
    assert rec.node.gpu_count == 0
    assert "node n1: allocatable nvidia.com/gpu 9000000000000000000 is more GPUs" in rec.warning


def test_a_node_advertising_more_mig_slices_than_a_node_holds_leaves_them_out_naming_them() -> None:
    """As for too many GPUs: the node still serves its CPU, memory and its other slices (it was
    ignored whole, with an error that named no resource)."""
    obj = node_obj(gpus="0", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "850812"
    obj["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "2"
    rec = node_record(obj)
    assert (rec.node.cpu_milli, rec.node.mig_slices, rec.mig) == (
        64000,
        (("3g.40gb", 2),),
        (("nvidia.com/mig-3g.40gb", 2),),
    )
    assert (
        "node n1: allocatable nvidia.com/mig-1g.10gb 850812 is more MIG slices than a node holds (448)" in rec.warning
    )


def test_a_bound_pod_with_a_bad_share_is_still_counted_with_the_rest_of_its_request() -> None:
    limits = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}
    obj = pod_obj(limits=limits, annotations={"gpusched.io/gpu-milli": "0"})
    obj["spec"]["nodeName"] = "n1"
    rec = pod_record(obj)
    assert "gpu-milli must be a whole number of thousandths of a GPU, 1..1000" in rec.error
    assert (rec.pod.cpu_milli, rec.pod.memory_mib, rec.pod.num_gpu, rec.pod.gpu_milli) == (4000, 8192, 1, 1000)


def test_the_pod_limit_of_a_node_is_read_and_a_bad_one_left_unchecked_with_a_warning() -> None:
    obj = node_obj()
    obj["status"]["allocatable"]["pods"] = "12"
    assert node_record(obj).node.max_pods == 12
    assert not node_record(obj).warning
    obj["status"]["allocatable"]["pods"] = "lots"
    rec = node_record(obj)
    assert rec.node.max_pods is None
    assert "allocatable pods" in rec.warning


def test_a_node_that_reports_no_allocatable_pods_takes_no_pod() -> None:
    """kube-scheduler reads a missing ``pods`` as none (``Too many pods`` for every pod); the
    kubelet always reports it, so a node without it is not one to place pods on."""
    obj = node_obj("bare", gpus=None)
    del obj["status"]["allocatable"]["pods"]
    rec = node_record(obj)
    assert rec.node.max_pods == 0
    assert "no allocatable pods" in rec.warning
    cluster = Cluster([rec.node, node_record(node_obj("kubelet", gpus=None)).node])
    idle = pod_record(pod_obj()).pod  # asks for nothing at all
    assert cluster.empty_state().pod_mask(idle).tolist() == [False, True]
    assert explain(idle, cluster.empty_state()).reasons == {"Too many pods": 1}


@pytest.mark.parametrize("memory", ["80GB", "1e1000000"])
def test_a_gpu_memory_label_that_is_no_count_keeps_the_node_and_says_so(memory: str) -> None:
    rec = node_record(node_obj(labels={"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": memory}))
    assert (rec.node.gpu_count, rec.node.gpu_memory_mib) == (8, 0)
    assert "label nvidia.com/gpu.memory" in rec.warning
    assert "counted as unknown" in rec.warning


@pytest.mark.parametrize("count", ["\u00b2", "\u0663", "9" * 5000])
def test_a_node_whose_gpu_count_labels_are_no_plain_numbers_is_read_without_them(count: str) -> None:
    """``str.isdigit`` takes a superscript two, which ``int`` refuses: such a label (no API server
    admits it, a watch of another source may bring it) failed the node watch with ValueError."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": count,
        "nvidia.com/gpu.replicas": count,
        "gpusched.io/mig-repartition": "true",
    }
    rec = node_record(node_obj(labels=labels))
    assert (rec.node.gpu_count, rec.node.mig_repartition) == (8, True)
    assert "replicas" not in rec.warning


def test_bad_node_quantity_names_the_node_and_field() -> None:
    with pytest.raises(ConvertError, match=r"node n1: allocatable nvidia.com/gpu: must be a whole number"):
        node_record(node_obj(gpus="1.5"))
    for resource in ("cpu", "memory"):
        obj = node_obj()
        obj["status"]["allocatable"][resource] = "lots"
        with pytest.raises(ConvertError, match=f"^node n1: status.allocatable {resource}: invalid quantity 'lots'"):
            node_record(obj)
    obj["status"] = {"capacity": {"cpu": None}}  # the kubelet reports no allocatable: its capacity is read
    with pytest.raises(ConvertError, match=r"^node n1: status.capacity cpu: quantity must be a number or string"):
        node_record(obj)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("metadata", "labels"), ["nvidia.com/gpu.product"], "metadata.labels must be an object"),
        (("metadata", "labels"), {"nvidia.com/gpu.count": 8}, "metadata.labels must map names to strings"),
        (("metadata", "annotations"), "gpusched.io/gpu-islands", "metadata.annotations must be an object"),
        (("metadata", "annotations"), {"gpusched.io/gpu-islands": ["0-3"]}, "metadata.annotations must map names"),
        (("spec",), 5, "spec must be an object"),
        (("spec", "taints"), {"key": "gpu", "effect": "NoSchedule"}, "spec.taints must be a list of objects"),
        (("spec", "taints"), ["gpu:NoSchedule"], "spec.taints must be a list of objects"),
        (("spec", "unschedulable"), "false", "spec.unschedulable must be true or false"),
        (("status",), "Ready", "status must be an object"),
        (("status", "allocatable"), [["cpu", "64"]], "status.allocatable must be an object"),
    ],
)
def test_a_node_field_of_the_wrong_json_type_is_refused_naming_it(
    path: tuple[str, ...], value: object, field: str
) -> None:
    """The API server checks these types; a watch of another source (a newer API) can still bring
    one, and the node is then ignored with the field named, never a crash of the node watch."""
    obj = node_obj()
    *parents, last = path
    target = obj
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    with pytest.raises(ConvertError, match=f"^node n1: {field}"):
        node_record(obj)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec",), 5, "spec must be an object"),
        (("status",), "Running", "status must be an object"),
        (("metadata", "labels"), ["app=web"], "metadata.labels must be an object"),
        (("metadata", "annotations"), {"gpusched.io/gpu-milli": 500}, "metadata.annotations must map names to strings"),
        (("spec", "priority"), "1000", "spec.priority must be a whole number"),
        (("spec", "priority"), 2**40, "spec.priority must be a whole number"),
        (("spec", "containers"), {"name": "c"}, "spec.containers must be a list of objects"),
        (("spec", "containers"), [{"name": "c", "resources": ["cpu"]}], r"spec.containers\[0\].resources must be"),
        (
            ("spec", "containers", 0, "resources", "limits"),
            [["cpu", "1"]],
            r"spec.containers\[0\].resources.limits must",
        ),
        (("spec", "containers", 0, "ports"), 80, r"spec.containers\[0\].ports must be a list of objects"),
        (("spec", "initContainers"), 1, "spec.initContainers must be a list of objects"),
        (("spec", "tolerations"), {"key": "gpu"}, "spec.tolerations must be a list of objects"),
        (("spec", "volumes"), 3, "spec.volumes must be a list of objects"),
        (("spec", "topologySpreadConstraints"), 1, "spec.topologySpreadConstraints must be a list of objects"),
        (("spec", "nodeSelector"), "nvidia.com/gpu.product=A100", "spec.nodeSelector must be an object"),
        (("spec", "overhead"), ["cpu"], "spec.overhead must be an object"),
        (("spec", "resources"), ["cpu"], "spec.resources must be an object"),
        (("status", "conditions"), 1, "status.conditions must be a list of objects"),
        (("status", "containerStatuses"), {"name": "c"}, "status.containerStatuses must be a list of objects"),
        (
            ("status", "containerStatuses"),
            [{"name": "c", "resources": {"requests": ["cpu"]}}],
            r"the status of spec.containers\[0\]: resources.requests must be an object",
        ),
    ],
)
def test_a_pod_field_of_the_wrong_json_type_is_the_pods_error_naming_it(
    path: tuple[str | int, ...], value: object, message: str
) -> None:
    """The API server checks these types; a watch of another source (a newer API) can still bring
    one.  The pod is read all the same, with what is wrong as its error (told on it as any other),
    never a crash of the pod watches."""
    obj = pod_obj(limits={"cpu": "2"})
    *parents, last = path
    target = obj
    for key in parents:
        target = target[key]
    target[last] = value
    rec = pod_record(obj)
    assert re.match(f"pod ns/p: {message}", rec.error), rec.error


def test_a_bound_pod_whose_status_cannot_be_read_is_still_counted_with_its_request() -> None:
    obj = pod_obj(limits={"cpu": "2", "nvidia.com/gpu": "1"}, nodeName="n1")
    obj["status"]["conditions"] = {"type": "Ready"}
    rec = pod_record(obj)
    assert rec.error == "pod ns/p: status.conditions must be a list of objects, got {'type': 'Ready'}"
    assert (rec.bound, rec.pod.cpu_milli, rec.pod.num_gpu) == (True, 2000, 1)


def test_whole_gpu_pod_from_limits_and_requests_default_to_limits() -> None:
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "2", "cpu": "4", "memory": "8Gi"}))
    p = rec.pod
    assert (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib) == (2, 1000, 4000, 8192)
    assert (rec.error, rec.scheduler, rec.uid, rec.bound) == ("", "gpu-scheduler", "u1", False)


def test_fractional_share_by_annotation_and_models_by_annotation_and_selector() -> None:
    rec = pod_record(
        pod_obj(
            requests={"cpu": "500m"},
            annotations={"gpusched.io/gpu-milli": "250", "gpusched.io/gpu-models": "A100, H800"},
            nodeSelector={"nvidia.com/gpu.product": "H800"},
        )
    )
    assert (rec.pod.num_gpu, rec.pod.gpu_milli, rec.pod.gpu_models) == (1, 250, frozenset({"H800"}))
    assert rec.error == ""
    # The annotation written without the maker's prefix, the selector as the label reads.
    rec = pod_record(
        pod_obj(
            annotations={"gpusched.io/gpu-models": "A100-SXM4-80GB"},
            nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            limits={"nvidia.com/gpu": "1"},
        )
    )
    assert (rec.pod.gpu_models, rec.error) == (frozenset({"NVIDIA-A100-SXM4-80GB"}), "")


@pytest.mark.parametrize("text", [",", ", ,", " ,\t, "])
def test_a_gpu_models_annotation_naming_no_model_is_refused_not_read_as_any_model(text: str) -> None:
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, annotations={"gpusched.io/gpu-models": text}))
    assert "annotation gpusched.io/gpu-models" in rec.error
    assert "names no GPU model" in rec.error


@pytest.mark.parametrize("value", ["true", "True", "TRUE", " true "])
def test_the_consolidate_annotation_is_read_as_kubernetes_booleans_are_written(value: str) -> None:
    obj = pod_obj(requests={"cpu": "1"}, annotations={"gpusched.io/consolidate": value})
    obj["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}]
    assert pod_record(obj).pod.movable


def test_fractional_share_by_extended_resource() -> None:
    rec = pod_record(pod_obj(limits={"gpusched.io/gpu-milli": "500"}))
    assert (rec.pod.num_gpu, rec.pod.gpu_milli) == (1, 500)


def test_init_containers_and_overhead_count() -> None:
    obj = pod_obj(requests={"cpu": "1"})
    obj["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]
    obj["spec"]["overhead"] = {"cpu": "250m"}
    assert pod_record(obj).pod.cpu_milli == 3250


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            pod_obj(limits={"nvidia.com/gpu": "1"}, annotations={"gpusched.io/gpu-milli": "500"}),
            "not both",
        ),
        (pod_obj(annotations={"gpusched.io/gpu-milli": "1500"}), "must be 1..1000"),
        (pod_obj(requests={"cpu": "lots"}), "invalid quantity"),
        (
            pod_obj(
                affinity={
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}
                }
            ),
            "matches no node",
        ),
        (
            pod_obj(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gen", "operator": "Near"}]}]
                        }
                    }
                }
            ),
            "operator 'Near' is not one of",
        ),
        (pod_obj(limits={"nvidia.com/mig-1g.10gb": "2"}), "one MIG slice"),
        (pod_obj(limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}), "one MIG slice"),
        (pod_obj(limits={"nvidia.com/mig-lots": "1"}), "nvidia.com/mig-lots"),
        (pod_obj(annotations={"gpusched.io/gpu-island": "maybe"}), "required or preferred"),
        (
            pod_obj(
                annotations={"gpusched.io/gang-min-members": "many"},
                labels={"scheduling.x-k8s.io/pod-group": "g"},
            ),
            "gang-min-members must be a whole number",
        ),
        (
            pod_obj(
                annotations={"gpusched.io/gang-min-members": "0"},
                labels={"scheduling.x-k8s.io/pod-group": "g"},
            ),
            "min_members must be at least 1",
        ),
        (
            pod_obj(
                annotations={"gpusched.io/gpu-models": "A100"},
                nodeSelector={"nvidia.com/gpu.product": "H800"},
            ),
            "excludes every model",
        ),
        (pod_obj(annotations={"gpusched.io/gpu-milli": "1e1000000"}), "got '1e1000000'"),
        (pod_obj(annotations={"gpusched.io/gpu-milli": "0"}), "a GPU, 1..1000 (\"500\" is half a GPU), got '0'"),
        # Written as a quantity or a fraction: the message says what to write instead.
        (pod_obj(annotations={"gpusched.io/gpu-milli": "500m"}), "a whole number of thousandths of a GPU"),
        (pod_obj(annotations={"gpusched.io/gpu-milli": "0.5"}), "a whole number of thousandths of a GPU"),
        (
            pod_obj(annotations={"gpusched.io/gang-min-members": "3"}),
            "annotation gpusched.io/gang-min-members needs the label scheduling.x-k8s.io/pod-group",
        ),
    ],
)
def test_requests_that_cannot_be_honoured_carry_the_reason(obj: Any, message: str) -> None:
    rec = pod_record(obj)
    assert message in rec.error
    assert rec.key == "ns/p"


def test_unsupported_constraint_keeps_the_real_request_for_accounting() -> None:
    obj = pod_obj(limits={"nvidia.com/gpu": "4", "cpu": "8"}, topologySpreadConstraints=[{"maxSkew": 1}])
    obj["spec"]["nodeName"] = "n1"
    rec = pod_record(obj)
    assert rec.error
    assert rec.bound
    assert (rec.pod.num_gpu, rec.pod.cpu_milli) == (4, 8000)


def test_bound_pod_gpu_indices_and_terminal_phase() -> None:
    obj = pod_obj(limits={"nvidia.com/gpu": "2"}, annotations={"gpusched.io/gpu-indices": "3,5"})
    obj["spec"]["nodeName"] = "n1"
    obj["status"]["phase"] = "Succeeded"
    rec = pod_record(obj)
    assert (rec.node_name, rec.gpu_indices, rec.terminal) == ("n1", (3, 5), True)


@pytest.mark.parametrize("text", ["1_000", "\u0663", "3.0", "0x10"])
def test_a_gang_minimum_or_gpu_indices_not_written_in_plain_digits_are_refused_not_misread(text: str) -> None:
    """int() reads "1_000" as 1000 and other scripts' digits as numbers: a typo is refused instead."""
    group = {"scheduling.x-k8s.io/pod-group": "g"}
    rec = pod_record(pod_obj(labels=group, annotations={"gpusched.io/gang-min-members": text}))
    assert rec.error == f"pod ns/p: annotation gpusched.io/gang-min-members must be a whole number, got {text!r}"
    assert pod_record(pod_obj(annotations={"gpusched.io/gpu-indices": f"0,{text}"})).gpu_indices is None
    spaced = pod_record(pod_obj(labels=group, annotations={"gpusched.io/gang-min-members": " 3 "}))
    assert spaced.pod.gang is not None
    assert spaced.pod.gang.min_members == 3
    assert pod_record(pod_obj(annotations={"gpusched.io/gpu-indices": "0, 2"})).gpu_indices == (0, 2)
    # A PodGroup's minimum is its own number, however large, not read back from text.
    huge = pod_record(pod_obj(labels=group), pod_groups={"ns/g": 10**30})
    assert (huge.error, huge.pod.gang.min_members if huge.pod.gang else None) == ("", 10**30)


@pytest.mark.parametrize(
    ("annotations", "limits", "message"),
    [
        ({"gpusched.io/gang-min-members": "many"}, {}, "gang-min-members must be a whole number"),
        ({"gpusched.io/gang-min-members": "0"}, {}, "min_members must be at least 1"),
        ({"gpusched.io/gang-topology": "sideways"}, {}, "topology must be 'required' or 'preferred'"),
        ({"gpusched.io/gang-min-members": "2"}, {"example.com/fpga": "1"}, "are not tracked by this scheduler"),
        ({"gpusched.io/gang-min-members": "2"}, {"cpu": "lots"}, "resources cpu: invalid quantity"),
    ],
    ids=["min-not-a-number", "min-zero", "bad-topology", "unsupported-resource", "unreadable-quantity"],
)
def test_a_member_whose_request_cannot_be_honoured_stays_in_its_gang(
    annotations: dict[str, str], limits: dict[str, str], message: str
) -> None:
    """Its peers wait for it, and are told what is wrong with it rather than that a member is missing."""
    rec = pod_record(pod_obj(limits=limits, annotations=annotations, labels={"scheduling.x-k8s.io/pod-group": "g"}))
    assert message in rec.error
    assert rec.pod.gang is not None
    assert rec.pod.gang.name == "ns/g"


def test_a_request_this_scheduler_refuses_still_counts_what_it_holds() -> None:
    obj = pod_obj(
        limits={"nvidia.com/mig-1g.10gb": "2", "cpu": "4", "memory": "16Gi"},
        annotations={"gpusched.io/gpu-island": "Required", "gpusched.io/gang-min-members": "x"},
        labels={"scheduling.x-k8s.io/pod-group": "g"},
        nodeName="n1",
    )
    rec = pod_record(obj)
    assert rec.bound
    assert "one MIG slice" in rec.error
    assert (rec.pod.cpu_milli, rec.pod.memory_mib, rec.pod.mig_slices) == (4000, 16384, (("1g.10gb", 2),))
    gpus = pod_record(pod_obj(limits={"nvidia.com/gpu": "2", "cpu": "1"}, annotations={"gpusched.io/gpu-island": "x"}))
    assert "required or preferred" in gpus.error
    assert (gpus.pod.num_gpu, gpus.pod.cpu_milli) == (2, 1000)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}, "0/3 nodes"),
        ({"type": "PodScheduled", "status": "False", "reason": "TenantLimit", "message": "tenant a"}, "tenant a"),
        ({"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": "x"}, None),
        ({"type": "PodScheduled", "status": "True"}, None),
        ({"type": "Ready", "status": "False", "reason": "Unschedulable", "message": "x"}, None),
    ],
)
def test_the_unschedulable_condition_a_pod_already_has(condition: dict[str, str], expected: str | None) -> None:
    obj = pod_obj(limits={"nvidia.com/gpu": "1"})
    obj["status"]["conditions"] = [condition]
    assert pod_record(obj).unschedulable == expected
    assert pod_record(pod_obj()).unschedulable is None


def test_sidecars_run_beside_the_app_and_the_later_init_containers() -> None:
    obj = pod_obj(requests={"cpu": "2", "memory": "4Gi"})
    obj["spec"]["initContainers"] = [
        {"name": "mesh", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "migrate", "resources": {"requests": {"cpu": "4", "memory": "512Mi"}}},
    ]
    p = pod_record(obj).pod
    # app 2 + sidecar 1 = 3 CPU, but the init step needs 4 + the sidecar 1 = 5; memory 4Gi + 1Gi.
    assert (p.cpu_milli, p.memory_mib) == (5000, 5120)


def test_required_pod_affinity_terms_are_read_and_a_malformed_one_refused() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity={"podAffinity": {_REQUIRED: [term]}}))
    assert rec.error == ""
    assert rec.pod.affinity == (PodAffinityTerm((Requirement("app", "In", ("cache",)),), frozenset({"ns"}), "zone"),)
    bad = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity={"podAffinity": {_REQUIRED: [{}]}}))
    assert "required podAffinity: a term needs a topologyKey" in bad.error
    assert bad.pod.num_gpu == 1  # still counted with its request, were it bound by someone else


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_resources_nodes_are_not_checked_for_are_refused() -> None:
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1", "rdma/ib": "1", "hugepages-2Mi": "1Gi"}))
    assert "resources hugepages-2Mi, rdma/ib are not tracked" in rec.error
    fine = pod_record(
        pod_obj(limits={"nvidia.com/gpu": "1", "ephemeral-storage": "10Gi", "nvidia.com/mig-1g.10gb": "0"})
    )
    assert fine.error == ""


def test_gated_pods_are_marked() -> None:
    assert pod_record(pod_obj(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])).gated
    assert not pod_record(pod_obj()).gated


def test_claims_of_a_pod_name_its_claim_volumes_and_ephemeral_volume_claims() -> None:
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "cfg", "configMap": {"name": "x"}},
        {"name": "again", "persistentVolumeClaim": {"claimName": "dataset"}},
    ]
    rec = pod_record(pod_obj(volumes=volumes))
    assert rec.claims == ("dataset", "p-scratch")
    assert rec.ephemeral_claims == ("p-scratch",)
    assert pod_record(pod_obj(volumes=volumes[1::-1])).claims == ("p-scratch", "dataset")  # the volumes' order
    assert pod_record(pod_obj()).claims == ()
    # The pod on the books carries them too: a ReadWriteOncePod claim is one pod's at a time.
    assert rec.pod.claims == ("dataset", "p-scratch")
    for refused in (
        pod_record(pod_obj(volumes=volumes, resourceClaims=[{"name": "gpu"}])),
        pod_record(pod_obj(limits={"cpu": "lots"}, volumes=volumes)),
    ):
        assert refused.error
        assert refused.pod.claims == ("dataset", "p-scratch")  # bound by another scheduler, it holds them


def test_claim_and_volume_records_say_what_placement_needs() -> None:
    pvc = {
        "metadata": {"name": "dataset", "namespace": "ns", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"volumeName": "pv-1"},
        "status": {"phase": "Bound"},
    }
    assert claim_record(pvc) == ClaimRecord("ns", "dataset", volume="pv-1", bound=True)
    pvc["metadata"]["ownerReferences"] = [
        {"kind": "Deployment", "uid": "other"},
        {"kind": "Pod", "uid": "pod-uid", "controller": True},
    ]
    assert claim_record(pvc).owner == "pod-uid"
    pending = {"metadata": {"name": "d", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert claim_record(pending) == ClaimRecord("ns", "d", deleting=True)
    assert volume_record({"metadata": {"name": "pv-3"}, "spec": {"nfs": {}}}) == VolumeRecord("pv-3")


def test_a_claim_names_its_class_and_the_node_chosen_as_kube_scheduler_reads_them() -> None:
    pvc: dict[str, Any] = {
        "metadata": {"name": "d", "namespace": "ns", "annotations": {"volume.kubernetes.io/selected-node": "n1"}},
        "spec": {"storageClassName": "fast"},
    }
    assert claim_record(pvc) == ClaimRecord("ns", "d", storage_class="fast", selected_node="n1")
    pvc["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"] = "old"  # the annotation wins
    assert claim_record(pvc).storage_class == "old"
    pvc["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"] = 7
    with pytest.raises(ConvertError, match=r"annotation volume\.beta\.kubernetes\.io/storage-class must be a string"):
        claim_record(pvc)


def test_a_claim_and_a_volume_say_what_matching_one_to_the_other_needs() -> None:
    pvc = {
        "metadata": {"name": "d", "namespace": "ns", "uid": "u1"},
        "spec": {
            "storageClassName": "local",
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "resources": {"requests": {"storage": "1.5Gi"}},
            "selector": {"matchLabels": {"tier": "fast"}},
        },
    }
    rec = claim_record(pvc)
    assert (rec.uid, rec.request, rec.modes, rec.block) == ("u1", 3 << 29, frozenset({"ReadWriteOnce"}), True)
    assert rec.selector == (Requirement("tier", "In", ("fast",)),)
    pvc["spec"]["resources"]["requests"]["storage"] = "lots"
    with pytest.raises(ConvertError, match=r"spec\.resources\.requests\.storage: invalid quantity"):
        claim_record(pvc)
    pv = {
        "metadata": {"name": "pv-1", "resourceVersion": "9", "labels": {"tier": "fast"}},
        "spec": {
            "storageClassName": "local",
            "capacity": {"storage": "100Gi"},
            "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "ns", "name": "d", "uid": "u1"},
        },
        "status": {"phase": "Available"},
    }
    v = volume_record(pv)
    assert (v.storage_class, v.capacity, v.claim, v.claim_uid, v.available, v.version) == (
        "local",
        100 << 30,
        "ns/d",
        "u1",
        True,
        "9",
    )
    assert v.labels == (("tier", "fast"),)
    pv["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not volume_record(pv).available


def test_a_csi_node_says_how_many_volumes_each_driver_may_attach() -> None:
    obj = {
        "metadata": {"name": "n1"},
        "spec": {
            "drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}},
                {"name": "efs.csi.aws.com", "nodeID": "i-1"},  # no limit
            ]
        },
    }
    assert csi_node_limits(obj) == ("n1", {"ebs.csi.aws.com": 25})
    # An in-tree volume counts against the CSI driver it is migrated to.
    ebs = volume_record({"metadata": {"name": "pv"}, "spec": {"awsElasticBlockStore": {"volumeID": "vol-9"}}})
    assert (ebs.driver, ebs.handle) == ("ebs.csi.aws.com", "vol-9")
    obj["spec"]["drivers"][0]["allocatable"]["count"] = "lots"
    with pytest.raises(ConvertError, match=r"CSINode n1: spec\.drivers\.allocatable\.count must be a whole number"):
        csi_node_limits(obj)


def test_a_storage_class_says_whether_and_where_it_provisions_for_the_pods_node() -> None:
    zone = "topology.kubernetes.io/zone"
    wffc = {
        "metadata": {"name": "fast"},
        "provisioner": "ebs.csi.aws.com",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [
            {"matchLabelExpressions": [{"key": zone, "values": ["a", "b"]}, {"key": "rack", "values": ["r1"]}]},
            {"matchLabelExpressions": [{"key": zone, "values": ["c"]}]},
        ],
    }
    rec = storage_class_record(wffc)
    assert rec.provisions
    assert rec.topology == (
        (Requirement(zone, "In", ("a", "b")), Requirement("rack", "In", ("r1",))),
        (Requirement(zone, "In", ("c",)),),
    )
    assert not storage_class_record({"metadata": {"name": "x"}, "provisioner": "p"}).provisions  # Immediate
    local = wffc | {"provisioner": "kubernetes.io/no-provisioner"}
    assert not storage_class_record(local).provisions
    assert storage_class_record(wffc | {"allowedTopologies": [{"matchLabelExpressions": [{"key": zone}]}]}).error == (
        f"allowedTopologies: requirement on '{zone}': In needs at least one value"
    )


def test_a_claim_is_bound_once_the_volume_controller_has_completed_the_binding() -> None:
    """As kube-scheduler's volume binding reads a claim: bound once it names its volume and
    carries the bind-completed annotation the volume controller writes with it, before it
    writes the phase; a claim whose phase says Bound without them is one the controller has
    still to bind, and a lost claim's volume is gone."""

    def pvc(name: str, phase: str = "", completed: bool = True) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": "ns"}
        if completed:
            meta["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
        return {"metadata": meta, "spec": {"volumeName": "pv-1"}, "status": {"phase": phase} if phase else {}}

    claims = Claims()
    claims.replace_claims(
        [
            claim_record(o)
            for o in (
                pvc("bound", "Bound"),
                pvc("phase-not-written"),
                pvc("not-completed", "Bound", completed=False),
                pvc("lost", "Lost"),
            )
        ]
    )
    claims.replace_volumes([volume_record({"metadata": {"name": "pv-1"}, "spec": {"nfs": {}}})])
    assert claims.problem("ns/p", "uid-p", ("bound",)) == ""
    assert claims.problem("ns/p", "uid-p", ("phase-not-written",)) == ""
    assert claims.problem("ns/p", "uid-p", ("not-completed",)) == (
        'persistentvolumeclaim "not-completed" is being bound to persistentvolume "pv-1"; the pod is retried once '
        "the binding completes"
    )
    assert claims.problem("ns/p", "uid-p", ("lost",)) == (
        'persistentvolumeclaim "lost" bound to non-existent persistentvolume "pv-1"'
    )


def test_a_volumes_node_affinity_is_read_as_a_pods_required_node_affinity_is() -> None:
    def pv(*terms: Any) -> dict[str, Any]:
        return {"metadata": {"name": "pv"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": list(terms)}}}}

    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    assert volume_record(pv({"matchExpressions": [zone]}, {"matchExpressions": [host]})).affinity == (
        (Requirement("topology.kubernetes.io/zone", "In", ("a", "b")),),
        (Requirement("kubernetes.io/hostname", "In", ("n1",)),),
    )
    # A term kube-scheduler cannot compare (a Gt that is no number) matches no node; the others stand.
    gt = {"key": "rack", "operator": "Gt", "values": ["x"]}
    assert volume_record(pv({"matchExpressions": [gt]}, {"matchExpressions": [host]})).affinity == (
        (Requirement("kubernetes.io/hostname", "In", ("n1",)),),
    )
    # Nothing a node could match, or not an object: no node is chosen for it, and the reason says why.
    empty = volume_record(pv({}))
    assert empty.affinity == ()
    assert "matches no node" in empty.error
    assert empty.error.startswith("spec.nodeAffinity.required: ")
    bad = volume_record({"metadata": {"name": "pv"}, "spec": {"nodeAffinity": "zone-a"}})
    assert bad.error.startswith("spec.nodeAffinity must be an object")  # named once, not under .required
    no_spec = volume_record({"metadata": {"name": "pv"}, "spec": ["zone-a"]})
    assert no_spec.error.startswith("spec must be an object")
    wrong_op = volume_record(pv({"matchExpressions": [{"key": "k", "operator": "Near", "values": ["v"]}]}))
    assert "Near" in wrong_op.error


def test_a_volumes_zone_and_region_labels_keep_it_to_their_nodes_as_kube_schedulers_volume_zone_does() -> None:
    ga_zone, ga_region = "topology.kubernetes.io/zone", "topology.kubernetes.io/region"
    beta_zone = "failure-domain.beta.kubernetes.io/zone"

    def takes(pv_labels: dict[str, str], node_labels: dict[str, str], **spec: Any) -> bool:
        pv = volume_record({"metadata": {"name": "pv", "labels": pv_labels}, "spec": spec})
        assert not pv.error, pv.error
        return selects(pv.affinity, node_record(node_obj(labels=node_labels)).node)

    assert takes({ga_zone: "a"}, {ga_zone: "a"})
    assert not takes({ga_zone: "a"}, {ga_zone: "b"})
    assert not takes({ga_zone: "a"}, {ga_region: "eu"})  # a node with a region but no zone
    assert takes({ga_zone: "a"}, {"rack": "r1"})  # no zone or region label at all: any volume
    assert takes({ga_zone: "a__b"}, {ga_zone: "b"})  # "__" parts the zones of a regional disk
    assert takes({ga_zone: "a", ga_region: "eu"}, {ga_zone: "a", ga_region: "eu"})
    assert not takes({ga_zone: "a", ga_region: "eu"}, {ga_zone: "a", ga_region: "us"})
    # A beta label is matched against the node's beta label, or its GA one when it has none.
    assert takes({beta_zone: "a"}, {ga_zone: "a"})
    assert not takes({beta_zone: "a"}, {beta_zone: "b", ga_zone: "a"})
    assert takes({beta_zone: "a"}, {beta_zone: "a", ga_zone: "b"})
    assert takes({ga_zone: "a__"}, {ga_zone: "b"})  # an empty zone: the label is left out
    assert takes({"tier": "fast"}, {ga_zone: "b"})
    # With node affinity, both hold.
    in_a = {
        "required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    }
    assert takes({ga_zone: "a"}, {ga_zone: "a", "rack": "r1"}, nodeAffinity=in_a)
    assert not takes({ga_zone: "a"}, {ga_zone: "b", "rack": "r1"}, nodeAffinity=in_a)
    assert not takes({ga_zone: "a"}, {ga_zone: "a", "rack": "r2"}, nodeAffinity=in_a)


def test_a_claim_with_access_mode_read_write_once_pod_is_one_pods_at_a_time() -> None:
    def pvc(*modes: str) -> dict[str, Any]:
        return {"metadata": {"name": "d", "namespace": "ns"}, "spec": {"accessModes": list(modes)}}

    assert claim_record(pvc("ReadWriteOncePod")).one_pod
    assert claim_record(pvc("ReadWriteOnce", "ReadWriteOncePod")).one_pod
    assert not claim_record(pvc("ReadWriteOnce")).one_pod
    assert not claim_record(pvc("ReadOnlyMany", "ReadWriteMany")).one_pod
    assert not claim_record(pvc()).one_pod
    assert not claim_record({"metadata": {"name": "d"}, "spec": {"accessModes": "ReadWriteOncePod"}}).one_pod


def test_a_gt_or_lt_value_with_leading_zeros_is_read_as_kube_scheduler_reads_it() -> None:
    """Go's strconv.ParseInt takes any number of leading zeros; Python's int() raises ValueError
    beyond 4300 digits, which refused such a pod in Python's own words, and would have raised out
    of placement for a toleration.  The API server admits 63 characters; a watch of another source
    (or a newer API) is held to no such limit."""
    five = "0" * 5000 + "5"
    term = {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": [five]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    rec = pod_record(pod_obj(affinity={"nodeAffinity": required}))
    assert rec.error == ""
    ((gt,),) = rec.pod.node_selector
    assert [gt.holds(v) for v in ("6", "5", "0" * 5000 + "6", "9" * 5000)] == [True, False, True, False]
    lt = Toleration("rank", "Lt", five, "NoSchedule")
    assert [lt.tolerates(Taint("rank", v, "NoSchedule")) for v in ("4", "0" * 5000 + "4", "6")] == [True, True, False]


def test_node_selector_and_required_node_affinity_become_one_selector() -> None:
    term_a = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train", "batch"]}]}
    term_b = {
        "matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad-node"]}],
    }
    obj = pod_obj(
        limits={"nvidia.com/gpu": "1"},
        nodeSelector={"kubernetes.io/os": "linux", "nvidia.com/gpu.product": "H800"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term_a, {}, term_b]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": term_a}],
            }
        },
    )
    rec = pod_record(obj)
    assert rec.error == ""
    assert rec.pod.gpu_models == frozenset({"H800"})  # the GPU product label is the model constraint too
    common = (Requirement("kubernetes.io/os", "In", ("linux",)), Requirement("nvidia.com/gpu.product", "In", ("H800",)))
    assert rec.pod.node_selector == (
        (*common, Requirement("pool", "In", ("train", "batch"))),
        (*common, Requirement("gen", "Gt", ("3",)), Requirement("metadata.name", "NotIn", ("bad-node",), field=True)),
    )
    assert pod_record(pod_obj(nodeSelector={"zone": "a"})).pod.node_selector == ((Requirement("zone", "In", ("a",)),),)
    assert pod_record(pod_obj()).pod.node_selector == ()


@pytest.mark.parametrize("value", ["x1", "99999999999999999999", "1.5"])
def test_a_node_term_comparing_with_no_integer_matches_no_node_and_the_others_still_do(value: str) -> None:
    """The API server admits ``Gt``/``Lt`` with any one value; kube-scheduler cannot parse one that
    is not a 64-bit integer, so that term matches no node, and a node another term matches takes
    the pod (it is not refused as a whole)."""
    odd = {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": [value]}]}
    zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    rec = pod_record(pod_obj(affinity=_node_term_list(odd, zone_a)))
    assert rec.error == ""
    cluster = Cluster(
        [node_record(node_obj(f"n-{z}", labels={"zone": z, "rank": "7"}, gpus=None)).node for z in ("a", "b")]
    )
    assert cluster.selector_mask(rec.pod.node_selector).tolist() == [True, False]
    alone = pod_record(pod_obj(affinity=_node_term_list(odd)))
    assert "matches no node" in alone.error
    assert "not an integer" in alone.error


def _node_term_list(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_ephemeral_storage_of_pods_and_nodes_in_mib() -> None:
    obj = pod_obj(requests={"ephemeral-storage": "10Gi"})
    obj["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"ephemeral-storage": "20Gi"}}}]
    rec = pod_record(obj)
    assert rec.error == ""
    assert rec.pod.storage_mib == 20 * 1024  # the larger of the init container and the app containers
    node = node_obj()
    node["status"]["allocatable"]["ephemeral-storage"] = "100Gi"
    assert node_record(node).node.storage_mib == 100 * 1024
    assert node_record(node_obj()).node.storage_mib == 0  # not reported: none, as kube-scheduler reads it
    node["status"]["allocatable"]["ephemeral-storage"] = "lots"
    rec = node_record(node)  # the node still counts, with no storage, and the log says why
    assert rec.node.storage_mib == 0
    assert "allocatable ephemeral-storage counted as 0, as if not reported" in rec.warning


def test_a_gpu_product_selector_selects_nodes_for_any_pod_and_is_the_model_constraint_of_a_gpu_pod() -> None:
    product = {"nvidia.com/gpu.product": "A100"}
    selected = ((Requirement("nvidia.com/gpu.product", "In", ("A100",)),),)
    cpu_pod = pod_record(pod_obj(requests={"cpu": "1"}, nodeSelector=product)).pod
    assert cpu_pod.node_selector == selected
    gpu_pod = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, nodeSelector=product)).pod
    assert (gpu_pod.node_selector, gpu_pod.gpu_models) == (selected, frozenset({"A100"}))


def test_spread_counts_only_the_nodes_a_gpu_product_selector_picks() -> None:
    """As kube-scheduler's nodeAffinityPolicy Honor: with minDomains 2 and only one zone of
    H100 nodes, the global minimum is 0, so a fourth replica in that zone breaks maxSkew 1."""
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "minDomains": 2,
            "labelSelector": {"matchLabels": {"app": "x"}},
        }
    ]

    def replica(name: str) -> Pod:
        obj = pod_obj(
            limits={"nvidia.com/gpu": "1"},
            labels={"app": "x"},
            nodeSelector={"nvidia.com/gpu.product": "H100"},
            topologySpreadConstraints=spread,
        )
        obj["metadata"]["name"] = name
        return pod_record(obj).pod

    nodes = [
        node_record(node_obj(f"n-{m}", labels={"nvidia.com/gpu.product": m, "zone": z})).node
        for m, z in (("A100", "za"), ("H100", "zb"))
    ]
    state = Cluster(nodes).empty_state()
    running = [Assignment(replica(f"a{i}"), 0, (i,)) for i in range(3)]  # an older version, on A100s
    running += [Assignment(replica(f"h{i}"), 1, (i,)) for i in range(3)]
    state = state.apply(running)
    assert list(state.pod_mask(replica("new"))) == [False, False]


def test_a_spread_constraint_with_an_empty_selector_counts_no_pod_and_asks_only_for_the_key() -> None:
    """kube-scheduler counts no pod for ``labelSelector: {}`` (unlike a pod affinity term's, which
    picks every pod): three pods of the namespace in zone a do not keep a fourth out of it, and
    a ScheduleAnyway one weighs nothing; a node without the key still takes no such pod."""
    hard = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
    soft = {**hard, "whenUnsatisfiable": "ScheduleAnyway"}

    def replica(name: str, constraint: dict[str, Any]) -> Pod:
        obj = pod_obj(requests={"cpu": "1"}, labels={"app": "x"}, topologySpreadConstraints=[constraint])
        obj["metadata"]["name"] = name
        return pod_record(obj).pod

    nodes = [node_record(node_obj(f"n-{z}", gpus=None, labels={"zone": z})).node for z in ("a", "b")]
    nodes.append(node_record(node_obj("n-nozone", gpus=None)).node)
    state = Cluster(nodes).empty_state().apply(Assignment(replica(f"r{i}", hard), 0, ()) for i in range(3))
    assert list(state.pod_mask(replica("new", hard))) == [True, True, False]
    assert replica("new", soft).preferred_apart == ()


def test_host_ports_of_containers_and_sidecars() -> None:
    obj = pod_obj()
    obj["spec"]["containers"][0]["ports"] = [
        {"containerPort": 29500, "hostPort": 29500},
        {"containerPort": 8080},  # no host port
        {"containerPort": 53, "hostPort": 5353, "protocol": "UDP"},
        {"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.1"},  # one address
        {"containerPort": 81, "hostPort": 81, "hostIP": "0.0.0.0"},  # every address, as when empty
    ]
    obj["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "ports": [{"containerPort": 9400, "hostPort": 9400}]},
        {"name": "setup", "ports": [{"containerPort": 1, "hostPort": 1}]},  # gone before the pod runs
    ]
    assert pod_record(obj).pod.host_ports == frozenset(
        {"TCP/29500", "UDP/5353", "TCP/80@10.0.0.1", "TCP/81", "TCP/9400"}
    )


def test_required_pod_anti_affinity_terms_and_labels_are_read() -> None:
    terms = [
        {  # the replicas of one inference server, one per node
            "labelSelector": {
                "matchLabels": {"app": "llm"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}],
            },
            "topologyKey": "kubernetes.io/hostname",
            "matchLabelKeys": ["pod-template-hash", "absent"],
        },
        {"labelSelector": {}, "namespaces": ["a", "b"], "topologyKey": "zone"},
        {"labelSelector": {"matchLabels": {"x": "y"}}, "namespaceSelector": {}, "topologyKey": "rack"},
        {"topologyKey": "zone"},  # no labelSelector: selects no pod, so it is dropped
    ]
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
    labels = {"app": "llm", "pod-template-hash": "abc"}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, labels=labels, affinity=affinity))
    assert rec.error == ""
    assert rec.pod.labels == (("app", "llm"), ("pod-template-hash", "abc"))
    assert rec.pod.anti_affinity == (
        PodAffinityTerm(
            (
                Requirement("app", "In", ("llm",)),
                Requirement("tier", "Exists"),
                Requirement("pod-template-hash", "In", ("abc",)),
            ),
            frozenset({"ns"}),
            "kubernetes.io/hostname",
        ),
        PodAffinityTerm((), frozenset({"a", "b"}), "zone"),
        PodAffinityTerm((Requirement("x", "In", ("y",)),), None, "rack"),
    )


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ({"labelSelector": {}}, "needs a topologyKey"),
        ({"labelSelector": {}, "topologyKey": "zone", "namespaceSelector": {"matchLabels": {"t": "x"}}}, "namespaces"),
        (
            {
                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
                "topologyKey": "z",
            },
            "operator 'Gt'",
        ),
        ({"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}, "topologyKey": "z"}, "at least one"),
    ],
)
def test_pod_anti_affinity_that_cannot_be_honoured_is_refused_with_the_reason(term: Any, message: str) -> None:
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity))
    assert "required podAntiAffinity" in rec.error
    assert message in rec.error
    assert rec.pod.num_gpu == 1
    # Were it bound by another scheduler, what can be read of its terms still keeps others away.
    kept = {"namespaces": (PodAffinityTerm((), None, "zone"),)}.get(message, ())
    assert rec.pod.anti_affinity == kept


def test_a_pod_refused_for_its_request_still_shows_its_labels_and_terms_to_others() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    both = pod_obj(limits={"nvidia.com/gpu": "1"}, annotations={"gpusched.io/gpu-milli": "500"}, labels={"app": "db"})
    both["spec"]["affinity"] = affinity
    rec = pod_record(both)
    assert rec.error
    assert rec.pod.labels == (("app", "db"),)
    assert rec.pod.anti_affinity == (
        PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"ns"}), "kubernetes.io/hostname"),
    )


def test_match_label_keys_the_api_server_merged_already_are_not_added_again() -> None:
    term = {
        "labelSelector": {"matchLabels": {"app": "llm", "pod-template-hash": "old"}},
        "matchLabelKeys": ["pod-template-hash"],
        "topologyKey": "zone",
    }
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    rec = pod_record(pod_obj(labels={"app": "llm", "pod-template-hash": "new"}, affinity=affinity))
    assert rec.pod.anti_affinity[0].selector == (
        Requirement("app", "In", ("llm",)),
        Requirement("pod-template-hash", "In", ("old",)),
    )


def test_hard_topology_spread_constraints_are_read_and_soft_ones_weighed_as_wishes_to_be_apart() -> None:
    constraints = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "llm"}},
            "matchLabelKeys": ["pod-template-hash"],
            "minDomains": 3,
            "nodeTaintsPolicy": "Honor",
        },
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "nodeAffinityPolicy": "Ignore"},
        {"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "ScheduleAnyway"},  # counts no pod
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "llm"}},
        },
    ]
    labels = {"app": "llm", "pod-template-hash": "abc"}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, labels=labels, topologySpreadConstraints=constraints))
    assert rec.error == ""
    llm = (Requirement("app", "In", ("llm",)), Requirement("pod-template-hash", "In", ("abc",)))
    assert rec.pod.spread == (
        Spread(1, "zone", llm, "ns", 3, honor_affinity=True, honor_taints=True),
        Spread(2, "kubernetes.io/hostname", None, "ns", 1, honor_affinity=False, honor_taints=False),
    )
    assert rec.pod.preferred_apart == (
        (100, PodAffinityTerm((Requirement("app", "In", ("llm",)),), frozenset({"ns"}), "zone")),
    )
    # They weigh this pod's own placement only, not the pods placed after it (as kube-scheduler).
    assert rec.pod.soft_spread == (rec.pod.preferred_apart[0][1],)
    assert rec.pod.held_wishes == ()
    odd = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, topologySpreadConstraints=[odd]))
    assert "whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, got 'Sometimes'" in rec.error


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"maxSkew": 0, "topologyKey": "zone"}, "maxSkew must be at least 1"),
        ({"maxSkew": 1}, "needs a topologyKey"),
        (
            {"maxSkew": 1, "topologyKey": "zone", "nodeTaintsPolicy": "Maybe"},
            "nodeTaintsPolicy must be Honor or Ignore",
        ),
        ({"maxSkew": "1", "topologyKey": "zone"}, "must be integers"),
    ],
)
def test_a_malformed_spread_constraint_is_refused_with_the_reason(constraint: Any, message: str) -> None:
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, topologySpreadConstraints=[constraint]))
    assert "topologySpreadConstraints" in rec.error
    assert message in rec.error
    assert rec.pod.spread == ()


def test_a_pod_being_deleted_is_marked_terminating() -> None:
    obj = pod_obj(limits={"nvidia.com/gpu": "1"})
    obj["metadata"]["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    assert pod_record(obj).pod.terminating
    assert not pod_record(pod_obj()).pod.terminating


def test_preferred_node_affinity_is_read_and_a_bad_weight_refused() -> None:
    preferred = [
        {"weight": 80, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spot"]}]}},
        {"weight": 5, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}},
        {"weight": 9, "preference": {}},  # no requirement: every node meets it, so it is left out
    ]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity))
    assert rec.error == ""
    assert rec.pod.preferred_nodes == (
        (80, (Requirement("pool", "In", ("spot",)),)),
        (5, (Requirement("metadata.name", "In", ("n1",), True),)),
    )
    bad = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}
    assert "weight must be 1..100, got 0" in pod_record(pod_obj(affinity=bad)).error


def test_a_pod_affinity_term_without_a_label_selector_can_never_be_met_and_is_refused() -> None:
    affinity = {"podAffinity": {_REQUIRED: [{"topologyKey": "zone"}]}}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity))
    assert "required podAffinity: a term without a labelSelector selects no pod" in rec.error
    anti = {"podAntiAffinity": {_REQUIRED: [{"topologyKey": "zone"}]}}
    assert pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=anti)).error == ""  # keeps nothing away


def test_preferred_pod_anti_affinity_is_read_with_its_weights() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": "kubernetes.io/hostname"}
    anti = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 40, "podAffinityTerm": term}]
        }
    }
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=anti))
    assert rec.error == ""
    assert rec.pod.preferred_apart == (
        (40, PodAffinityTerm((Requirement("app", "In", ("llm",)),), frozenset({"ns"}), "kubernetes.io/hostname")),
    )
    bad = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "podAffinityTerm": term}]
        }
    }
    assert "preferred podAntiAffinity: weight must be 1..100, got 101" in pod_record(pod_obj(affinity=bad)).error


def test_preferred_pod_affinity_is_read_with_its_weights() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
    wish = {
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 70, "podAffinityTerm": term}]}
    }
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=wish))
    assert rec.error == ""
    assert rec.pod.preferred_together == (
        (70, PodAffinityTerm((Requirement("app", "In", ("cache",)),), frozenset({"ns"}), "zone")),
    )
    assert rec.pod.preferred_apart == ()
    bad = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": term}]}}
    assert "preferred podAffinity: weight must be 1..100, got 0" in pod_record(pod_obj(affinity=bad)).error


def test_a_namespace_selector_picks_the_namespaces_whose_labels_it_matches() -> None:
    namespaces = {"a": {"team": "x"}, "b": {"team": "y"}, "c": {}}
    by_label = {"labelSelector": {}, "topologyKey": "zone", "namespaces": ["c"]}
    terms = [
        {**by_label, "namespaceSelector": {"matchLabels": {"team": "x"}}},  # a, and c as listed
        {
            **by_label,
            "namespaces": [],
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        },
        {**by_label, "namespaces": [], "namespaceSelector": {"matchLabels": {"team": "z"}}},  # none: selects no pod
    ]
    preferred = [{"weight": 10, "podAffinityTerm": {**by_label, "namespaceSelector": {"matchLabels": {"team": "y"}}}}]
    affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": terms,
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        }
    }
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity), namespaces)
    assert rec.error == ""
    assert rec.namespace_selected
    assert [t.namespaces for t in rec.pod.anti_affinity] == [
        frozenset({"a", "c"}),
        frozenset({"a", "b"}),
        frozenset(),
    ]
    assert [t.namespaces for _, t in rec.pod.preferred_apart] == [frozenset({"b", "c"})]
    assert not rec.pod.anti_affinity[2].selects("c", {})
    # Read again once a namespace labelled team=z exists: the third term picks it.
    later = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity), {**namespaces, "d": {"team": "z"}})
    assert later.pod.anti_affinity[2].namespaces == frozenset({"d"})


def test_only_terms_that_pick_namespaces_by_label_make_a_pod_depend_on_them() -> None:
    every = {"labelSelector": {}, "topologyKey": "zone", "namespaceSelector": {}}  # {}: every namespace
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [every]}}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity), {})
    assert rec.error == ""
    assert not rec.namespace_selected
    assert rec.pod.anti_affinity[0].namespaces is None


def test_a_malformed_namespace_selector_is_refused_even_with_no_namespace_to_match() -> None:
    term = {
        "labelSelector": {},
        "topologyKey": "zone",
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Gt", "values": ["1"]}]},
    }
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity), {})
    assert "operator 'Gt'" in rec.error


def _anti(selector_field: str, selector: Any) -> dict[str, Any]:
    term: dict[str, Any] = {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "zone"}
    term[selector_field] = selector
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _node_term(term: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


@pytest.mark.parametrize(
    ("affinity", "message"),
    [
        (_anti("labelSelector", {"matchExpressions": ["app"]}), "must be an object with key, operator and values"),
        (_anti("labelSelector", {"matchLabels": ["app"]}), "matchLabels must map label keys to values"),
        (
            _anti("labelSelector", {"matchExpressions": [{"key": "app", "operator": "In", "values": "a"}]}),
            "values of 'app' must be a list",
        ),
        (_anti("namespaceSelector", {"matchExpressions": ["team"]}), "must be an object with key, operator"),
        (_anti("namespaceSelector", {"matchLabels": "team=a"}), "matchLabels must map label keys to values"),
        (_node_term({"matchExpressions": ["zone"]}), "must be an object with key, operator and values"),
        (_node_term({"matchFields": [{"key": "metadata.name", "operator": "In", "values": 3}]}), "must be a list"),
        (_anti("labelSelector", {"matchExpressions": 5}), "matchExpressions must be a list, got 5"),
        (_anti("namespaceSelector", {"matchExpressions": {"key": "team"}}), "matchExpressions must be a list"),
        (_anti("namespaces", 3), "namespaces must be a list, got 3"),
        (_anti("matchLabelKeys", [["app"]]), "matchLabelKeys must be a list of strings"),
        ({"podAntiAffinity": [{}]}, "podAntiAffinity must be an object"),
        ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 3}}, "the terms must be a list"),
        (
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": [{}]}]}},
            "preference must be an object",
        ),
        ("anti", "affinity must be an object"),
    ],
)
def test_a_selector_of_the_wrong_shape_is_refused_with_the_reason(affinity: Any, message: str) -> None:
    """Every place a selector is read (pod terms, their namespaces, node terms) refuses a
    requirement that is not an object, or values that are not a list, with the cause; the pod is
    kept as unschedulable, never dropped by an exception."""
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=affinity), {"ns": {"team": "a"}})
    assert message in rec.error
    assert rec.key == "ns/p"


def test_a_namespace_selector_that_is_refused_is_not_tracked_for_namespace_changes() -> None:
    """A selector with an operator only node selectors have leaves the pod refused whatever the
    namespaces' labels, so a namespace change has nothing to re-read for it (and must not try)."""
    odd = {"matchExpressions": [{"key": "team", "operator": "Gt", "values": ["1"]}]}
    rec = pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=_anti("namespaceSelector", odd)), {})
    assert "operator 'Gt'" in rec.error
    assert rec.namespace_selectors == ()
    good = _anti("namespaceSelector", {"matchLabels": {"team": "a"}})
    assert pod_record(pod_obj(limits={"nvidia.com/gpu": "1"}, affinity=good), {}).namespace_selectors == (
        (Requirement("team", "In", ("a",)),),
    )


def test_a_node_reporting_only_capacity_is_read_from_it() -> None:
    obj = node_obj()
    obj["status"] = {"capacity": obj["status"].pop("allocatable")}  # an old or minimal kubelet
    n = node_record(obj).node
    assert (n.cpu_milli, n.memory_mib, n.gpu_count) == (64000, 512 * 1024, 8)


def test_a_node_may_hold_up_to_the_most_gpus_a_node_holds() -> None:
    assert node_record(node_obj(gpus="64")).node.gpu_count == 64
    over = node_record(node_obj(gpus="65"))  # kept for its CPU and memory, its GPUs not offered
    assert (over.node.gpu_count, over.node.cpu_milli) == (0, 64000)
    assert "65 is more GPUs than a node holds (64)" in over.warning
    assert "its GPUs are not offered, pods that ask for no GPU still are" in over.warning


def test_mig_profiles_with_no_slices_left_are_not_offered() -> None:
    obj = node_obj(gpus="0")
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "0"  # reconfigured away
    obj["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "2"
    rec = node_record(obj)
    assert rec.mig == (("nvidia.com/mig-3g.40gb", 2),)
    assert rec.node.mig_slices == (("3g.40gb", 2),)
    assert rec.node.gpu_model == "unknown"  # MIG slices without a product label: still a GPU node


def test_init_containers_count_at_their_largest_not_their_last() -> None:
    obj = pod_obj(
        requests={"cpu": "1", "memory": "1Gi"},
        initContainers=[
            {"name": "big", "resources": {"requests": {"cpu": "6", "memory": "8Gi"}}},
            {"name": "small", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}},
        ],
    )
    pod = pod_record(obj).pod
    assert (pod.cpu_milli, pod.memory_mib) == (6000, 8 * 1024)


def test_pod_level_requests_stand_only_for_cpu_and_memory() -> None:
    obj = pod_obj(requests={"cpu": "1", "ephemeral-storage": "1Gi"})
    obj["spec"]["resources"] = {"requests": {"cpu": "4", "ephemeral-storage": "10Gi"}}  # not pod-level
    pod = pod_record(obj).pod
    assert (pod.cpu_milli, pod.storage_mib) == (4000, 1024)


def test_creation_time_is_read_as_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    obj = pod_obj()
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert pod_record(obj).created == 1767225600.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_pod_identity_fields_and_their_defaults() -> None:
    obj = pod_obj(priority=1000)
    obj["metadata"]["resourceVersion"] = "4711"
    rec = pod_record(obj)
    assert (rec.pod.priority, rec.resource_version, rec.scheduler) == (1000, "4711", "gpu-scheduler")
    bare = pod_obj()
    del bare["metadata"]["namespace"], bare["spec"]["schedulerName"]
    rec = pod_record(bare)
    assert (rec.pod.namespace, rec.pod.priority, rec.scheduler) == ("default", 0, "default-scheduler")


def test_a_container_port_without_a_host_port_binds_none() -> None:
    ports = [{"containerPort": 8080, "hostPort": 0}, {"containerPort": 9090}]
    obj = pod_obj(containers=[{"name": "c", "resources": {}, "ports": ports}])
    assert pod_record(obj).pod.host_ports == frozenset()


def test_an_unreadable_pod_that_is_being_deleted_is_still_known_as_terminating() -> None:
    obj = pod_obj(limits={"cpu": "lots"})
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    rec = pod_record(obj)
    assert rec.error
    assert rec.pod.terminating
    assert rec.deleting


def test_a_bound_pods_resource_we_do_not_place_by_never_zeroes_its_gpus_in_the_books() -> None:
    # kubernetes.io/batch-cpu may be fractional; were the whole request dropped for it, another
    # scheduler's pod would hold no GPU in the books and its 8 GPUs would look free.
    obj = {
        "metadata": {"name": "theirs", "namespace": "default", "uid": "u"},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeName": "n1",
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", "kubernetes.io/batch-cpu": "1.5"},
                        "limits": {"nvidia.com/gpu": "8"},
                    },
                }
            ],
        },
    }
    rec = pod_record(obj)
    assert (rec.pod.cpu_milli, rec.pod.memory_mib, rec.pod.num_gpu) == (8000, 65536, 8)


def test_a_null_quantity_is_an_error_naming_the_field_not_a_crash() -> None:
    obj = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"schedulerName": "s", "containers": [{"name": "c", "resources": {"requests": {"cpu": None}}}]},
    }
    rec = pod_record(obj)
    assert "cpu" in rec.error


def test_a_toleration_with_a_null_effect_tolerates_every_effect() -> None:
    obj = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {
            "schedulerName": "s",
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": None}],
            "containers": [{"name": "c"}],
        },
    }
    (t,) = pod_record(obj).pod.tolerations
    assert (t.key, t.operator, t.effect) == ("gpu", "Exists", "")


def test_a_toleration_with_an_unknown_operator_is_refused_by_name() -> None:
    rec = pod_record(pod_obj(tolerations=[{"key": "sla", "operator": "Bogus", "value": "1", "effect": "NoSchedule"}]))
    assert rec.error == (
        "pod ns/p: tolerations: operator 'Bogus' (key 'sla') is not one of Equal, Exists, Lt, Gt, "
        "so it tolerates no taint; fix or remove the toleration"
    )
    for operator in ("Equal", "Exists", "Gt", "Lt", None):
        ok = pod_record(pod_obj(tolerations=[{"key": "sla", "operator": operator, "value": "1"}]))
        assert ok.error == ""


def test_a_time_sliced_node_is_warned_about_and_too_many_slices_name_the_cause() -> None:
    def node(gpus: int, replicas: int) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "ts",
                "labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": str(replicas)},
            },
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
        }

    rec = node_record(node(32, 4))
    assert rec.node.gpu_count == 32
    assert "nvidia.com/gpu.replicas=4" in rec.warning
    over = node_record(node(80, 10))
    assert over.node.gpu_count == 0
    assert "nvidia.com/gpu.replicas=10: the device plugin time-slices" in over.warning
    assert over.warning.count("replicas=10") == 1  # one warning, not the 64-or-fewer one as well


def test_a_mig_slice_with_a_share_annotation_is_refused_as_such_and_the_slice_counted() -> None:
    obj = {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "u",
            "annotations": {"gpusched.io/gpu-milli": "250"},
        },
        "spec": {
            "schedulerName": "s",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
        },
    }
    rec = pod_record(obj)
    assert rec.pod.mig_profile == "1g.10gb"
    assert (rec.pod.num_gpu, rec.pod.gpu_milli) == (0, 0)
    assert "a MIG slice (nvidia.com/mig-1g.10gb) and a share of a GPU" in rec.error
