"""The FailedScheduling message reads as kube-scheduler's: each node is counted under the first
filter it fails, in kube-scheduler's filter order (taints, node affinity, host ports, resources,
topology spread, pod affinity), under every resource it lacks when that filter is the resource
one (the pod count, cpu, memory, ephemeral storage, GPUs), with its wording, and the
"count reason" parts sorted as strings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpusched.model import Assignment, Cluster, Node
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread
from gpusched.model.node import Taint
from gpusched.solver.explain import explain
from tests.factories import gpu_node, pod

NCCL = frozenset({"TCP/29500"})
POOL = ((Requirement("pool", "In", ("gpu",)),),)
LLM = (("app", "llm"),)


def node(name: str, zone: str, pool: str = "gpu", gpus: int = 8, model: str = "A100", **kw: Any) -> Node:
    return replace(gpu_node(name, gpus=gpus, model=model), labels={"zone": zone, "pool": pool}, **kw)


def test_each_node_counts_under_the_first_filter_kube_scheduler_checks() -> None:
    nodes = [
        # Every node but the last fails two or more filters; the first one checked counts, with
        # every resource it lacks when that is the resource filter.
        node("tainted", "a", pool="other", gpus=0, taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),)),
        node("other-pool", "a", pool="other"),  # + spread, pod affinity
        node("h100", "a", model="H100"),  # + spread, pod affinity
        node("port", "a", max_pods=1),  # + pod count, cpu, spread, pod affinity
        node("full", "a", max_pods=1),  # pod count and cpu, + spread, pod affinity
        node("busy", "a"),  # cpu and GPUs, + spread, pod affinity
        node("skew", "a"),  # spread + pod affinity
        node("b", "b"),  # GPUs only
    ]
    c = Cluster(nodes)
    at = c.index
    running = [
        Assignment(replace(pod("old", cpu=7000), host_ports=NCCL), at["port"]),
        Assignment(pod("daemon", cpu=7000), at["full"]),
        *(
            Assignment(
                replace(pod(f"llm-{i}", cpu=3000, gpus=4), labels=LLM), at["busy"], tuple(range(4 * i, 4 * i + 4))
            )
            for i in range(2)
        ),
        Assignment(replace(pod("db", gpus=8), labels=(("app", "db"),)), at["b"], tuple(range(8))),
    ]
    state = c.empty_state().apply(running)
    train = replace(
        pod("train", cpu=4000, gpus=2, models=["A100"]),
        labels=LLM,
        host_ports=NCCL,
        node_selector=POOL,
        spread=(Spread(1, "zone", (Requirement("app", "In", ("llm",)),), "default"),),
        affinity=(PodAffinityTerm((Requirement("app", "In", ("db",)),), frozenset({"default"}), "zone"),),
    )
    e = explain(train, state)
    assert dict(e.reasons) == {
        "node(s) had untolerated taint {nvidia.com/gpu: present}": 1,
        "node(s) didn't match Pod's node affinity/selector": 1,
        "GPU model not accepted": 1,
        "node(s) didn't have free ports for the requested pod ports": 1,
        "Too many pods": 1,
        "Insufficient cpu": 2,
        "Insufficient nvidia.com/gpu": 2,
        "node(s) didn't match pod topology spread constraints": 1,
    }
    assert e.message == (
        "0/8 nodes are available: 1 GPU model not accepted, 1 Too many pods, "
        "1 node(s) didn't have free ports for the requested pod ports, "
        "1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) didn't match pod topology spread constraints, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
        "2 Insufficient cpu, 2 Insufficient nvidia.com/gpu."
    )


def test_parts_are_sorted_as_strings_like_kube_scheduler_sorts_them() -> None:
    nodes = [gpu_node(f"small-{i}", gpus=2, cpu=1000) for i in range(10)]
    nodes += [gpu_node(f"h100-{i}", gpus=2, model="H100") for i in range(2)]
    nodes += [gpu_node(f"tiny-{i}", gpus=2, mem=512) for i in range(3)]
    e = explain(pod("p", cpu=2000, gpus=1, models=["A100"]), Cluster(nodes).empty_state())
    # Neither by count (10, 3, 2) nor the other way round: "10" < "2" < "3" as strings.
    assert (
        e.message == "0/15 nodes are available: 10 Insufficient cpu, 2 GPU model not accepted, 3 Insufficient memory."
    )
    assert e.reason == "Insufficient cpu"


def test_gpu_reasons_come_after_cpu_and_memory_and_name_the_resource() -> None:
    c = Cluster([gpu_node("cpu-only", gpus=0), gpu_node("small", gpus=1, mem=512)])
    assert dict(explain(pod("share", gpus=1, milli=500), c.empty_state()).reasons) == {
        "Insufficient nvidia.com/gpu": 1,
        "Insufficient memory": 1,
    }
    mig = replace(pod("slice"), mig_profile="1g.10gb")
    assert explain(mig, c.empty_state()).message == (
        "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient nvidia.com/mig-1g.10gb."
    )


def test_a_node_short_of_several_resources_counts_under_each_but_once_among_the_gpu_checks() -> None:
    c = Cluster([gpu_node("cpu-only", gpus=0, cpu=1000, mem=512), gpu_node("busy", gpus=8, cpu=1000)])
    state = c.empty_state().apply([Assignment(pod("old", gpus=6), 1, tuple(range(6)))])
    e = explain(replace(pod("p", cpu=2000, gpus=4), island="required"), state)
    assert dict(e.reasons) == {
        "Insufficient cpu": 2,
        "Insufficient memory": 1,
        "Insufficient nvidia.com/gpu": 2,  # cpu-only: no GPUs at all, not also no island
    }
    assert e.message == (
        "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu."
    )
