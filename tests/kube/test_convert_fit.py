"""Pods and nodes as the API server sends them, offered the nodes kube-scheduler would offer them."""

from __future__ import annotations

from typing import Any

from gpusched.kube.convert import node_record, pod_record
from gpusched.model import Assignment, Cluster, Pod
from gpusched.solver.explain import explain
from gpusched.solver.solve import CpSatPolicy


def node_obj(name: str = "n1", cpu: str = "16", memory: str = "64Gi", gpus: str = "8") -> Any:
    alloc = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus, "pods": "110"}
    labels = {"nvidia.com/gpu.product": "A100"}
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {"allocatable": alloc}}


def pod_obj(name: str = "p", containers: list[dict[str, Any]] | None = None, **spec: Any) -> Any:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": containers or [{"name": "c", "resources": {}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def test_pod_level_requests_are_what_the_pod_asks_for() -> None:
    """``spec.resources`` (PodLevelResources, on by default since 1.34): its CPU and memory
    requests stand for the containers', so a pod asking 12 CPUs for its two unrequested
    containers does not go to a node with 8 CPUs free."""
    obj = pod_obj(
        containers=[
            {"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "logs", "resources": {}},
        ],
        resources={"requests": {"cpu": "12", "memory": "48Gi"}, "limits": {"cpu": "12", "memory": "48Gi"}},
    )
    rec = pod_record(obj)
    assert rec.error == ""
    assert (rec.pod.cpu_milli, rec.pod.memory_mib, rec.pod.num_gpu) == (12000, 48 * 1024, 1)

    node = node_record(node_obj(cpu="16")).node
    busy = Pod("other", 8000, 1024, uid="u-other")
    state = Cluster([node]).empty_state().apply([Assignment(busy, 0, ())])
    assert list(state.pod_mask(rec.pod)) == [False]
    assert explain(rec.pod, state).message == "0/1 nodes are available: 1 Insufficient cpu."


def test_pod_level_requests_override_the_containers_per_resource_and_overhead_adds() -> None:
    obj = pod_obj(
        containers=[{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
        initContainers=[{"name": "i", "resources": {"requests": {"memory": "3Gi"}}}],
        resources={"requests": {"cpu": "4"}},  # memory still from the containers: max(1Gi, 3Gi)
        overhead={"cpu": "250m", "memory": "128Mi"},
    )
    pod = pod_record(obj).pod
    assert (pod.cpu_milli, pod.memory_mib) == (4250, 3 * 1024 + 128)


def test_hugepages_at_pod_level_are_refused_as_at_container_level() -> None:
    rec = pod_record(pod_obj(resources={"requests": {"hugepages-2Mi": "1Gi"}, "limits": {"hugepages-2Mi": "1Gi"}}))
    assert "resources hugepages-2Mi are not tracked" in rec.error


def test_a_pod_asking_no_cpu_or_memory_fits_a_node_whose_requests_exceed_its_allocatable() -> None:
    """kube-scheduler checks a resource only when the pod requests some of it: a GPU pod with
    only ``nvidia.com/gpu`` in its limits still goes to a node whose memory was over-committed
    (its allocatable shrank under the pods already running), and a pod asking for memory does not."""
    node = node_record(node_obj(cpu="16", memory="64Gi")).node
    running = Pod("running", 17000, 70 * 1024, uid="u-running")  # bound before the node shrank
    state = Cluster([node]).empty_state().apply([Assignment(running, 0, ())])
    gpu_only = pod_record(pod_obj(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])).pod
    assert (gpu_only.cpu_milli, gpu_only.memory_mib) == (0, 0)
    assert list(state.pod_mask(gpu_only)) == [True]
    assert explain(gpu_only, state).fits == 1
    plan = CpSatPolicy(state.cluster).place([gpu_only], state)
    assert ([a.pod.key for a in plan.assignments], plan.unplaced) == (["ns/p"], ())
    asks_memory = pod_record(
        pod_obj(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "1Gi"}}}])
    ).pod
    assert list(state.pod_mask(asks_memory)) == [False]
    assert explain(asks_memory, state).message == "0/1 nodes are available: 1 Insufficient memory."


def test_a_pod_with_resource_claims_is_refused_and_still_counted_when_bound() -> None:
    """Devices of ``spec.resourceClaims`` are allocated by the scheduler that places the pod; one
    that does not allocate them would bind a pod the kubelet never starts."""
    claims = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    containers = [{"name": "c", "resources": {"requests": {"cpu": "2"}, "claims": [{"name": "gpu"}]}}]
    rec = pod_record(pod_obj(containers=containers, resourceClaims=claims))
    assert "resourceClaims gpu ask for devices by dynamic resource allocation" in rec.error
    assert "schedule this pod with another scheduler" in rec.error
    bound = pod_record(pod_obj(containers=containers, resourceClaims=claims, nodeName="n1"))
    assert bound.bound
    assert bound.pod.cpu_milli == 2000
    assert pod_record(pod_obj()).error == ""


def _resized(spec_cpu: str, running_cpu: str, infeasible: bool) -> Any:
    """A pod bound to ``n1`` whose container's CPU request was changed in place from
    ``running_cpu`` (what the kubelet reports it runs with) to ``spec_cpu``."""
    obj = pod_obj(
        "resized",
        containers=[{"name": "c", "resources": {"requests": {"cpu": spec_cpu, "memory": "4Gi"}}}],
        nodeName="n1",
    )
    running = {"requests": {"cpu": running_cpu, "memory": "4Gi"}}
    obj["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "c", "resources": running, "allocatedResources": {"cpu": running_cpu, "memory": "4Gi"}}
        ],
        "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}] if infeasible else [],
    }
    return obj


def test_a_pod_resized_in_place_holds_what_it_runs_with_while_the_resize_is_infeasible() -> None:
    """A running pod asked to grow past its node (resize ``Infeasible``) keeps running with its
    old request, and the node's other CPUs stay free for new pods."""
    held = pod_record(_resized("24", "4", infeasible=True)).pod
    assert held.cpu_milli == 4000
    state = Cluster([node_record(node_obj(cpu="16")).node]).empty_state().apply([Assignment(held, 0, ())])
    new = pod_record(pod_obj("new", containers=[{"name": "c", "resources": {"requests": {"cpu": "8"}}}])).pod
    assert list(state.pod_mask(new)) == [True]


def test_a_pod_being_resized_in_place_holds_the_larger_of_its_old_and_new_requests() -> None:
    assert pod_record(_resized("2", "8", infeasible=False)).pod.cpu_milli == 8000  # shrinking, not yet done
    assert pod_record(_resized("8", "2", infeasible=False)).pod.cpu_milli == 8000  # growing, deferred
    sidecar = _resized("2", "8", infeasible=False)
    sidecar["spec"]["initContainers"] = [
        {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        {"name": "setup", "resources": {"requests": {"cpu": "1"}}},  # done: its status is no resize
    ]
    sidecar["status"]["initContainerStatuses"] = [
        {"name": "s", "resources": {"requests": {"cpu": "3"}}},
        {"name": "setup", "resources": {"requests": {"cpu": "10"}}},
    ]
    assert pod_record(sidecar).pod.cpu_milli == 8000 + 3000


def test_a_resize_the_kubelet_allocated_but_has_not_applied_holds_what_it_allocated() -> None:
    obj = _resized("24", "4", infeasible=True)  # 24 is infeasible; 6, asked before, was allocated
    obj["status"]["containerStatuses"][0]["allocatedResources"] = {"cpu": "6", "memory": "4Gi"}
    assert pod_record(obj).pod.cpu_milli == 6000


def _mig_node(slices: dict[str, str]) -> Any:
    alloc = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "0", "pods": "110"}
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    return {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": alloc | slices}}


def _theirs(limits: dict[str, str]) -> Any:
    obj = pod_obj("theirs", containers=[{"name": "c", "resources": {"limits": limits}}], nodeName="n1")
    obj["spec"]["schedulerName"] = "default-scheduler"
    return obj


def _mine(profile: str) -> Pod:
    rec = pod_record(pod_obj("mine", containers=[{"name": "c", "resources": {"limits": {profile: "1"}}}]))
    assert rec.error == ""
    return rec.pod


def test_a_pod_another_scheduler_bound_holds_every_slice_it_asks_for() -> None:
    """Two 1g.10gb slices held by another scheduler's pod leave none of the node's two: a pod of
    this scheduler bound there would be refused by the kubelet (OutOfnvidia.com/mig-1g.10gb)."""
    node = node_record(_mig_node({"nvidia.com/mig-1g.10gb": "2"})).node
    theirs = pod_record(_theirs({"nvidia.com/mig-1g.10gb": "2"}))
    assert theirs.bound
    state = Cluster([node]).empty_state().apply([Assignment(theirs.pod, 0, ())])
    mine = _mine("nvidia.com/mig-1g.10gb")
    assert list(state.pod_mask(mine)) == [False]
    assert explain(mine, state).fits == 0
    assert list(state.release([Assignment(theirs.pod, 0, ())]).pod_mask(mine)) == [True]  # gone, both free


def test_a_pod_holding_a_gpu_and_a_slice_holds_the_slice_too() -> None:
    node_obj_ = _mig_node({"nvidia.com/mig-1g.10gb": "1"})
    node_obj_["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    node = node_record(node_obj_).node
    theirs = pod_record(_theirs({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}))
    state = Cluster([node]).empty_state().apply([Assignment(theirs.pod, 0, (0,))])
    assert list(state.pod_mask(_mine("nvidia.com/mig-1g.10gb"))) == [False]
    assert list(state.pod_mask(_mine("nvidia.com/gpu"))) == [False]


def test_a_pod_holding_slices_of_two_profiles_holds_both() -> None:
    node = node_record(_mig_node({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"})).node
    theirs = pod_record(_theirs({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}))
    state = Cluster([node]).empty_state().apply([Assignment(theirs.pod, 0, ())])
    assert list(state.pod_mask(_mine("nvidia.com/mig-1g.10gb"))) == [False]
    assert list(state.pod_mask(_mine("nvidia.com/mig-2g.20gb"))) == [False]


def test_a_node_that_reports_no_ephemeral_storage_takes_no_pod_asking_for_some() -> None:
    """kube-scheduler reads a missing allocatable ``ephemeral-storage`` as none (a kubelet with
    local storage capacity isolation off reports none): a pod asking for some does not fit, and is
    told so as kube-scheduler tells it; a pod asking for none is unaffected."""
    node = node_record(node_obj()).node  # cpu, memory, GPUs and pods, no ephemeral-storage
    state = Cluster([node]).empty_state()
    scratch = pod_record(pod_obj(containers=[{"name": "c", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}]))
    assert list(state.pod_mask(scratch.pod)) == [False]
    assert explain(scratch.pod, state).message == "0/1 nodes are available: 1 Insufficient ephemeral-storage."
    plain = pod_record(pod_obj(containers=[{"name": "c", "resources": {"requests": {"cpu": "1"}}}])).pod
    assert list(state.pod_mask(plain)) == [True]


def test_memory_adds_up_in_bytes_and_rounds_once() -> None:
    """Three containers of 100M ask for 300,000,000 bytes (286.1 MiB), not three times 95.4
    rounded up: a node with 287 MiB left takes the pod, as the kubelet would."""
    containers = [{"name": f"c{i}", "resources": {"requests": {"memory": "100M"}}} for i in range(3)]
    pod = pod_record(pod_obj(containers=containers, overhead={"memory": "1M"})).pod
    assert pod.memory_mib == 288  # 301,000,000 bytes = 287.06 MiB
    pod = pod_record(pod_obj(containers=containers)).pod
    assert pod.memory_mib == 287
    node = node_record(node_obj(memory="287Mi")).node
    assert list(Cluster([node]).empty_state().pod_mask(pod)) == [True]


def test_memory_summed_past_the_largest_quantity_is_refused_by_name() -> None:
    big = {"memory": str(2**62)}
    containers = [{"name": f"c{i}", "resources": {"requests": big}} for i in range(2)]
    rec = pod_record(pod_obj(containers=containers))
    assert "resources memory" in rec.error
    assert "too large" in rec.error
