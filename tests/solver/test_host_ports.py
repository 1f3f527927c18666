"""Host ports: no two pods on a node bind the same host port."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, Plan, SolveStats
from gpusched.model.ports import host_port, ports_clash
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.factories import gpu_node, pod

NCCL = frozenset({"TCP/29500"})


def cluster() -> Cluster:
    return Cluster([gpu_node(f"n{i}", gpus=8, cpu=64000, mem=512 * 1024) for i in range(3)])


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_pods_binding_one_host_port_on_different_nodes(policy: str) -> None:
    c = cluster()
    # n2 already runs a pod bound to the port (another scheduler's, say).
    state = c.empty_state().apply([Assignment(replace(pod("old", cpu=0), host_ports=NCCL), 2)])
    workers = [replace(pod(f"worker-{i}", gpus=2), host_ports=NCCL) for i in range(3)]
    other_port = replace(pod("metrics", gpus=1), host_ports=frozenset({"TCP/9400"}))
    pods = [*workers, other_port]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    where = {a.pod.name: c.nodes[a.node].name for a in plan.assignments}
    # Plenty of GPUs everywhere, but only n0 and n1 have the port free: two workers, one each.
    assert sorted(n for p, n in where.items() if p.startswith("worker")) == ["n0", "n1"]
    assert "metrics" in where
    left = next(p for p in workers if p.name not in where)
    assert explain(left, state.apply(plan.assignments)).message == (
        "0/3 nodes are available: 3 node(s) didn't have free ports for the requested pod ports."
    )


def test_the_validator_rejects_a_host_port_bound_twice_on_a_node() -> None:
    c = cluster()
    state = c.empty_state()
    pods = [replace(pod(f"p{i}", gpus=1), host_ports=NCCL) for i in range(2)]
    plan = Plan((Assignment(pods[0], 0, (0,)), Assignment(pods[1], 0, (1,))), (), SolveStats("test"))
    assert any("host port TCP/29500 bound twice" in x for x in plan_problems(plan, state, pods))
    taken = state.apply([Assignment(replace(pod("old", cpu=0), host_ports=NCCL), 0)])
    single = Plan((Assignment(pods[0], 0, (0,)),), (pods[1],), SolveStats("test"))
    assert any("bound twice" in x for x in plan_problems(single, taken, pods))


def test_releasing_a_pod_frees_its_host_ports() -> None:
    c = cluster()
    held = Assignment(replace(pod("old", cpu=0), host_ports=NCCL), 0)
    state = c.empty_state().apply([held])
    assert not state.ports_free(NCCL)[0]
    assert state.release([held]).ports_free(NCCL).all()


@pytest.mark.parametrize(
    ("held", "asked", "clash"),
    [
        ("TCP/80", "TCP/80", True),
        ("TCP/80", "TCP/80@10.0.0.1", True),  # every address includes this one
        ("TCP/80@10.0.0.1", "TCP/80", True),
        ("TCP/80@10.0.0.1", "TCP/80@10.0.0.1", True),
        ("TCP/80@10.0.0.1", "TCP/80@10.0.0.2", False),
        ("TCP/80", "UDP/80", False),
        ("TCP/80", "TCP/81", False),
    ],
)
def test_host_port_bindings_clash_as_kube_scheduler_reads_them(held: str, asked: str, clash: bool) -> None:
    assert ports_clash({held}, {asked}) is clash
    assert ports_clash({asked}, {held}) is clash  # either order
    assert host_port("TCP", 80, "0.0.0.0") == host_port("TCP", 80) == "TCP/80"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_lets_bindings_on_different_addresses_share_a_node(policy: str) -> None:
    """Two pods binding port 80 on different addresses of one node do not clash; one binding it
    on every address clashes with both.  One node, room for all three by resources."""
    c = Cluster([gpu_node("n0", gpus=8, cpu=64000, mem=512 * 1024)])
    state = c.empty_state()
    on_a = replace(pod("on-a", gpus=1), host_ports=frozenset({host_port("TCP", 80, "10.0.0.1")}))
    on_b = replace(pod("on-b", gpus=1), host_ports=frozenset({host_port("TCP", 80, "10.0.0.2")}))
    on_all = replace(pod("on-all", gpus=1), host_ports=frozenset({host_port("TCP", 80)}))
    pods = [on_a, on_b, on_all]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    assert sorted(a.pod.name for a in plan.assignments) == ["on-a", "on-b"]
    assert explain(on_all, state.apply(plan.assignments)).message == (
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    )
    alone = state.apply([Assignment(on_all, 0, (0,))])
    assert not alone.ports_free(on_a.host_ports)[0]


def test_the_validator_rejects_an_address_binding_beside_one_on_every_address() -> None:
    c = cluster()
    on_all = replace(pod("on-all", gpus=1), host_ports=frozenset({"TCP/80"}))
    on_a = replace(pod("on-a", gpus=1), host_ports=frozenset({"TCP/80@10.0.0.1"}))
    on_b = replace(pod("on-b", gpus=1), host_ports=frozenset({"TCP/80@10.0.0.2"}))
    clashing = Plan((Assignment(on_all, 0, (0,)), Assignment(on_a, 0, (1,))), (), SolveStats("test"))
    assert any(
        "host port TCP/80, TCP/80@10.0.0.1 bound twice" in x
        for x in plan_problems(clashing, c.empty_state(), [on_all, on_a])
    )
    apart = Plan((Assignment(on_a, 0, (0,)), Assignment(on_b, 0, (1,))), (), SolveStats("test"))
    assert plan_problems(apart, c.empty_state(), [on_a, on_b]) == []
