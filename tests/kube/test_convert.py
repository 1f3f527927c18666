"""API JSON -> records: what a user's Node and Pod manifests turn into."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.kube.convert import ConvertError, node_record, pod_record


def node_obj(name: str = "n1", gpus: str | None = "8", labels: dict[str, str] | None = None, **spec: Any) -> Any:
    alloc = {"cpu": "64", "memory": "512Gi"}
    if gpus is not None:
        alloc["nvidia.com/gpu"] = gpus
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "status": {"allocatable": alloc}}


def pod_obj(
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Any:
    res: dict[str, Any] = {}
    if limits:
        res["limits"] = limits
    if requests:
        res["requests"] = requests
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations or {}},
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
    assert rec.excluded == ""


def test_node_gpu_count_falls_back_to_the_gfd_label_and_model_defaults() -> None:
    n = node_record(node_obj(gpus=None, labels={"nvidia.com/gpu.count": "4"})).node
    assert (n.gpu_count, n.gpu_model) == (4, "unknown")


def test_cordoned_and_tainted_nodes_are_excluded_with_a_reason() -> None:
    assert "unschedulable" in node_record(node_obj(unschedulable=True)).excluded
    tainted = node_record(node_obj(taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]))
    assert tainted.excluded == "node(s) had untolerated taint {gpu: broken}"
    soft = node_record(node_obj(taints=[{"key": "x", "effect": "PreferNoSchedule"}]))
    assert soft.excluded == ""


def test_mig_slices_are_read() -> None:
    obj = node_obj()
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    assert node_record(obj).mig == (("nvidia.com/mig-1g.10gb", 7),)


def test_bad_node_quantity_names_the_node_and_field() -> None:
    with pytest.raises(ConvertError, match=r"node n1: allocatable nvidia.com/gpu: must be a whole number"):
        node_record(node_obj(gpus="1.5"))


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
        (pod_obj(nodeSelector={"zone": "a"}), "nodeSelector keys zone are not supported"),
        (pod_obj(limits={"nvidia.com/mig-1g.10gb": "1"}), "MIG slices"),
        (
            pod_obj(
                annotations={"gpusched.io/gpu-models": "A100"},
                nodeSelector={"nvidia.com/gpu.product": "H800"},
            ),
            "excludes every model",
        ),
    ],
)
def test_requests_that_cannot_be_honoured_carry_the_reason(obj: Any, message: str) -> None:
    rec = pod_record(obj)
    assert message in rec.error
    assert rec.key == "ns/p"


def test_unsupported_constraint_keeps_the_real_request_for_accounting() -> None:
    obj = pod_obj(limits={"nvidia.com/gpu": "4", "cpu": "8"}, nodeSelector={"zone": "a"})
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
