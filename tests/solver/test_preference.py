"""Preferred node affinity: weighed, never required."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ortools.sat.python import cp_model

from gpusched.model import Assignment, Cluster, Plan
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.solver.constraints import capacity, demand, whole_gpu
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.objectives import packing, placed, preference
from gpusched.solver.params import Limits, SolverParams, Weights
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import validate_plan
from gpusched.solver.vars import Vars
from tests.factories import gpu_node, pod

SPOT = ((70, (Requirement("pool", "In", ("spot",)),)), (30, (Requirement("zone", "In", ("a",)),)))


def cluster() -> Cluster:
    labels = [{"pool": "reserved", "zone": "a"}, {"pool": "spot", "zone": "b"}, {"pool": "spot", "zone": "a"}]
    return Cluster([replace(gpu_node(f"n{i}", gpus=4), labels=lab) for i, lab in enumerate(labels)])


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_uses_the_preferred_nodes_first_and_others_when_they_are_full(policy: str) -> None:
    c = cluster()
    pods = [replace(pod(f"p{i}", gpus=2), preferred_nodes=SPOT) for i in range(4)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, c.empty_state())
    validate_plan(plan, c.empty_state(), pods)
    where = sorted(c.nodes[a.node].name for a in plan.assignments)
    # n2 (spot, zone a: 100) fills first, then n1 (spot: 70); n0 (zone a: 30) stays empty.
    assert where == ["n1", "n1", "n2", "n2"]
    more = [replace(pod(f"q{i}", gpus=2), preferred_nodes=SPOT) for i in range(6)]
    plan = make_policy(policy, c, TypicalPods.from_pods(more), 0, params).place(more, c.empty_state())
    assert len(plan.assignments) == 6  # a preference never leaves a pod out


def _chosen(w: Weights) -> list[str]:
    c = cluster()
    state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])  # n0 half full
    pods = [replace(pod("p", gpus=1), preferred_nodes=SPOT)]
    inst = build_instance(pods, state, FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    model = cp_model.CpModel()
    v = Vars.create(inst, model)
    for m in (demand, capacity, whole_gpu):
        m.build(inst, model, v)
    model.maximize(
        placed.build(inst, model, v, w) + packing.build(inst, model, v, w) + preference.build(inst, model, v, w)
    )
    solver = cp_model.CpSolver()
    assert solver.solve(model) == cp_model.OPTIMAL
    return [c.nodes[inst.candidates[ci].node].name for ci in v.x if solver.value(v.x[ci])]


def test_preference_objective_outweighs_packing_toward_the_fuller_node() -> None:
    w = Weights(fragmentation=0, active_nodes=0, packing=1, keep_hint=0)
    assert _chosen(w) == ["n2"]
    assert _chosen(replace(w, preferred_affinity=0)) == ["n0"], "without the term packing picks the fuller node"


def _apart(weight: int = 100, key: str = "kubernetes.io/hostname") -> tuple[tuple[int, PodAffinityTerm], ...]:
    return ((weight, PodAffinityTerm((Requirement("app", "In", ("llm",)),), frozenset({"default"}), key)),)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_spreads_replicas_that_prefer_to_be_apart_and_still_places_them_all(policy: str) -> None:
    hosts = [replace(gpu_node(f"h{i}", gpus=8), labels={"kubernetes.io/hostname": f"h{i}"}) for i in range(3)]
    c = Cluster(hosts)
    replicas = [replace(pod(f"r{i}", gpus=1), labels=(("app", "llm"),), preferred_apart=_apart()) for i in range(3)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(replicas), 0, params).place(replicas, c.empty_state())
    validate_plan(plan, c.empty_state(), replicas)
    assert len({a.node for a in plan.assignments}) == 3  # packing alone would put all three on one node
    four = [*replicas, replace(replicas[0], name="r3")]
    plan = make_policy(policy, c, TypicalPods.from_pods(four), 0, params).place(four, c.empty_state())
    assert len(plan.assignments) == 4  # a wish, not a rule


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_keeps_off_a_node_where_a_pod_it_prefers_to_avoid_runs(policy: str) -> None:
    hosts = [replace(gpu_node(f"h{i}", gpus=8), labels={"kubernetes.io/hostname": f"h{i}"}) for i in range(2)]
    c = Cluster(hosts)
    state = c.empty_state().apply([Assignment(replace(pod("old", gpus=4), labels=(("app", "llm"),)), 0, (0, 1, 2, 3))])
    new = replace(pod("new", gpus=1), preferred_apart=_apart(50))
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods([new]), 0, params).place([new], state)
    assert [c.nodes[a.node].name for a in plan.assignments] == ["h1"]  # packing alone picks h0


def test_the_objective_charges_replicas_sharing_a_domain_against_packing() -> None:
    hosts = [replace(gpu_node(f"h{i}", gpus=8), labels={"kubernetes.io/hostname": f"h{i}"}) for i in range(3)]
    c = Cluster(hosts)
    state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])  # h0 is the fullest
    replicas = [replace(pod(f"r{i}", gpus=1), labels=(("app", "llm"),), preferred_apart=_apart()) for i in range(3)]
    inst = build_instance(
        replicas, state, FragScorer(c, TypicalPods.from_pods(replicas)), Plan((), tuple(replicas)), 24
    )

    def nodes_used(w: Weights) -> int:
        model = cp_model.CpModel()
        v = Vars.create(inst, model)
        for m in (demand, capacity, whole_gpu):
            m.build(inst, model, v)
        model.maximize(sum(m.build(inst, model, v, w) for m in (placed, packing, preference)))
        solver = cp_model.CpSolver()
        assert solver.solve(model) == cp_model.OPTIMAL
        return len({inst.candidates[ci].node for ci in v.x if solver.value(v.x[ci])})

    w = Weights(fragmentation=0, active_nodes=0, packing=1, keep_hint=0)
    assert nodes_used(w) == 3
    assert nodes_used(replace(w, preferred_affinity=0)) == 1, "without the term packing stacks them on h0"
