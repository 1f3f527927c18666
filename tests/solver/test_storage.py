"""Ephemeral storage: what pods request on a node fits in what it has allocatable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, Plan, SolveStats
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.factories import gpu_node, pod

GIB = 1024


def cluster() -> Cluster:
    # Two nodes with 100 GiB of ephemeral storage each, and one that does not report any.
    nodes = [replace(gpu_node(f"disk-{i}", gpus=4), storage_mib=100 * GIB) for i in range(2)]
    return Cluster([*nodes, gpu_node("unmetered", gpus=0)])


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_storage_requests_within_each_nodes_allocatable(policy: str) -> None:
    c = cluster()
    state = c.empty_state().apply([Assignment(replace(pod("old", cpu=0), storage_mib=50 * GIB), 1)])
    big = [replace(pod(f"big-{i}", gpus=1), storage_mib=60 * GIB) for i in range(3)]
    cpu = replace(pod("cpu-only", cpu=500), storage_mib=500 * GIB)  # fits only where nobody counts
    pods = [*big, cpu]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    where = {a.pod.name: c.nodes[a.node].name for a in plan.assignments}
    # disk-0 takes one 60 GiB pod, disk-1 (50 GiB already requested) none.
    assert sorted(n for p, n in where.items() if p.startswith("big")) == ["disk-0"]
    assert where.get("cpu-only") == "unmetered"
    left = next(p for p in big if p.name not in where)
    message = explain(left, state.apply(plan.assignments)).message
    assert message == "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 Insufficient ephemeral-storage."


def test_the_validator_rejects_storage_over_commitment() -> None:
    c = cluster()
    state = c.empty_state()
    pods = [replace(pod(f"p{i}", gpus=1), storage_mib=60 * GIB) for i in range(2)]
    plan = Plan((Assignment(pods[0], 0, (0,)), Assignment(pods[1], 0, (1,))), (), SolveStats("test"))
    assert any("ephemeral storage over-committed" in x for x in plan_problems(plan, state, pods))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_node_already_over_its_storage_still_takes_pods_that_ask_for_none(policy: str) -> None:
    # Another scheduler (or rounding: allocatable rounds down, requests up) left n0 over its storage.
    c = Cluster([replace(gpu_node("n0", gpus=0), storage_mib=1000)])
    state = c.empty_state().apply([Assignment(replace(pod("old", cpu=0), storage_mib=1500), 0)])
    pods = [pod("no-storage", cpu=500), replace(pod("scratch", cpu=500), storage_mib=10)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    assert [a.pod.name for a in plan.assignments] == ["no-storage"]
    assert plan.stats.status != "INFEASIBLE_FALLBACK"
