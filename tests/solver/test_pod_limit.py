"""A node's pod limit (allocatable ``pods``, the kubelet's ``maxPods``): a plan never puts more
pods on a node than it takes, whatever they ask for, or the kubelet refuses them (OutOfpods)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, Plan, SolveStats
from gpusched.solver.explain import TOO_MANY_PODS, explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.factories import gpu_node, pod


def cluster() -> Cluster:
    # Two 8-GPU nodes taking 3 pods each, one of them holding a pod already.
    return Cluster([replace(gpu_node(f"n{i}", gpus=8), max_pods=3) for i in range(2)])


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_each_node_within_its_pod_limit(policy: str) -> None:
    c = cluster()
    state = c.empty_state().apply([Assignment(pod("daemonset", cpu=100), 0)])
    pods = [pod(f"share-{i}", gpus=1, milli=100) for i in range(4)] + [pod(f"cpu-{i}", cpu=100) for i in range(3)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    per_node = [sum(1 for a in plan.assignments if a.node == n) for n in range(2)]
    assert per_node == [2, 3]  # every slot used: 2 left on n0, 3 on n1
    assert plan.stats.status not in ("INVALID_FALLBACK", "INFEASIBLE_FALLBACK")
    left = plan.unplaced[0]
    assert explain(left, state.apply(plan.assignments)).reasons == {TOO_MANY_PODS: 2}


def test_the_validator_rejects_a_plan_over_a_nodes_pod_limit() -> None:
    c = cluster()
    pods = [pod(f"p{i}", cpu=100) for i in range(4)]
    plan = Plan(tuple(Assignment(p, 0) for p in pods), (), SolveStats("test"))
    assert plan_problems(plan, c.empty_state(), pods) == ["n0: too many pods (4 placed, room for 3)"]


def test_nodes_without_a_limit_take_any_number() -> None:
    c = Cluster([gpu_node("n0", gpus=0)])
    pods = [pod(f"p{i}", cpu=1, mem=1) for i in range(200)]
    plan = make_policy("bestfit", c, TypicalPods.from_pods(pods), 0).place(pods, c.empty_state())
    assert len(plan.assignments) == 200
