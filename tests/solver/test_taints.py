"""Taints and tolerations: a pod goes only where it tolerates every NoSchedule/NoExecute taint."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, Plan, SolveStats
from gpusched.model.node import Taint
from gpusched.model.pod import Toleration
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.factories import gpu_node, pod

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
GPU_TOLERATION = Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "present", ""), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "absent", ""), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Exists", "", "NoExecute"), GPU_TAINT, False),
        (Toleration("", "Exists", "", ""), GPU_TAINT, True),  # tolerates everything
        (Toleration("other", "Exists", "", ""), GPU_TAINT, False),
    ],
)
def test_toleration_matching(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert toleration.tolerates(taint) is expected


SLA = Taint("sla", "800", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        (Toleration("sla", "Gt", "750", "NoSchedule"), True),  # the taint's 800 is greater
        (Toleration("sla", "Gt", "800", "NoSchedule"), False),
        (Toleration("sla", "Lt", "900", "NoSchedule"), True),  # the taint's 800 is less
        (Toleration("sla", "Lt", "800", "NoSchedule"), False),
        (Toleration("sla", "Gt", "+750", ""), True),
        (Toleration("sla", "Lt", "9223372036854775808", ""), False),  # past int64: no number
        (Toleration("sla", "Gt", "7.5e2", ""), False),
        (Toleration("sla", "Gt", " 750", ""), False),
        (Toleration("other", "Gt", "750", ""), False),
        (Toleration("sla", "Bogus", "800", ""), False),  # an unknown operator tolerates nothing
        (Toleration("sla", "equal", "800", ""), False),
    ],
)
def test_comparison_and_unknown_operators(toleration: Toleration, expected: bool) -> None:
    assert toleration.tolerates(SLA) is expected
    assert toleration.tolerates(Taint("sla", "high", "NoSchedule")) is False  # not a number: no comparison


def cluster() -> Cluster:
    # The only GPU node is tainted, as GPU node pools often are; the other node has no GPUs.
    return Cluster([replace(gpu_node("gpu", gpus=4), taints=(GPU_TAINT,)), gpu_node("cpu", gpus=0)])


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_untolerating_pods_off_tainted_nodes(policy: str) -> None:
    c = cluster()
    state = c.empty_state()
    ok = replace(pod("tolerates", gpus=1), tolerations=(GPU_TOLERATION,))
    blocked = pod("does-not", gpus=1)
    cpu = pod("cpu-only", cpu=500)
    pods = [ok, blocked, cpu]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    where = {a.pod.name: c.nodes[a.node].name for a in plan.assignments}
    assert where.get("tolerates") == "gpu"
    assert "does-not" not in where
    assert where.get("cpu-only") == "cpu"
    assert "untolerated taint {nvidia.com/gpu: present}" in explain(blocked, state).message


def test_the_validator_rejects_a_pod_on_a_node_it_does_not_tolerate() -> None:
    c = cluster()
    state = c.empty_state()
    p = pod("p", gpus=1)
    plan = Plan((Assignment(p, 0, (0,)),), (), SolveStats("test"))
    assert any("does not tolerate the taints of gpu" in x for x in plan_problems(plan, state, [p]))


SCALE_DOWN = Taint("DeletionCandidateOfClusterAutoscaler", "1733390000", "PreferNoSchedule")


def soft_cluster() -> Cluster:
    # "leaving" is the fuller node, which packing would pick, but the autoscaler means to remove it.
    return Cluster([replace(gpu_node("leaving", gpus=4), soft_taints=(SCALE_DOWN,)), gpu_node("staying", gpus=4)])


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_steers_pods_off_prefer_no_schedule_nodes_while_another_fits(policy: str) -> None:
    c = soft_cluster()
    state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])
    # The half pod would fill the GPU half used on "leaving" (on an idle GPU it strands half a
    # GPU that whole-GPU pods cannot use).
    batch = [pod("half", gpus=1, milli=500), pod("whole", gpus=1)]
    shared = state.apply([Assignment(pod("old-half", gpus=1, milli=500), 0, (2,))])
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(batch), 0, params).place(batch, shared)
    validate_plan(plan, shared, batch)
    assert [c.nodes[a.node].name for a in plan.assignments] == ["staying"] * 2
    pods = [pod(f"p{i}", gpus=1) for i in range(2)]
    more = pods + [pod(f"q{i}", gpus=1) for i in range(4)]  # six GPUs asked, four free off the tainted node
    plan = make_policy(policy, c, TypicalPods.from_pods(more), 0, params).place(more, state)
    validate_plan(plan, state, more)
    assert sorted(c.nodes[a.node].name for a in plan.assignments) == ["leaving"] * 2 + ["staying"] * 4


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_a_pod_that_tolerates_the_soft_taint_goes_where_it_would_without_it(policy: str) -> None:
    tolerant = replace(pod("t", gpus=1), tolerations=(Toleration("DeletionCandidateOfClusterAutoscaler", "Exists"),))
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    chosen = []
    for c in (soft_cluster(), Cluster([replace(n, soft_taints=()) for n in soft_cluster().nodes])):
        state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])
        plan = make_policy(policy, c, TypicalPods.from_pods([tolerant]), 0, params).place([tolerant], state)
        validate_plan(plan, state, [tolerant])
        chosen.append([(a.node, a.gpus) for a in plan.assignments])
    assert chosen[0] == chosen[1]
