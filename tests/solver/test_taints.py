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
