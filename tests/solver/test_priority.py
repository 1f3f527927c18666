"""Priority within one solve: a pod of lower priority never takes the room a pod of higher
priority in the same batch needs, even where it would place more GPU demand."""

from __future__ import annotations

from dataclasses import replace

from gpusched.model import Cluster, Node, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.model.pod import Gang
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.objectives import priority
from gpusched.solver.objectives.placed import OBJECTIVE_LIMIT
from gpusched.solver.params import Limits, SolverParams, Weights
from gpusched.solver.solve import CpSatPolicy
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod

PARAMS = SolverParams(limits=Limits(time_limit_s=5.0, workers=1))


def placed(pods: list[Pod], cluster: Cluster) -> tuple[list[str], str]:
    state = cluster.empty_state()
    plan = CpSatPolicy(cluster, PARAMS, TypicalPods.from_pods(pods)).place(pods, state)
    validate_plan(plan, state, pods)
    return sorted(a.pod.name for a in plan.assignments), plan.stats.status


def test_a_pod_of_higher_priority_keeps_its_room_against_more_gpu_demand() -> None:
    high = replace(pod("high", gpus=1), priority=10)
    low = replace(pod("low", gpus=2), priority=1)
    names, status = placed([low, high], Cluster([gpu_node(gpus=2)]))
    assert names == ["high"]
    assert status == "OPTIMAL"  # the model's own answer, not the warm start kept


def test_higher_levels_first_whatever_the_counts_below() -> None:
    """One pod of priority 5 outweighs three of priority 1 that would place three times the GPUs."""
    top = replace(pod("top", gpus=4), priority=5)
    rest = [replace(pod(f"r{i}", gpus=2), priority=1) for i in range(3)]
    mid = replace(pod("mid", gpus=2), priority=3)
    names, _ = placed([*rest, mid, top], Cluster([gpu_node(gpus=6)]))
    assert names == ["mid", "top"]


def test_a_follower_of_a_lower_pod_keeps_its_priority() -> None:
    """``high`` must run beside ``x`` (lower priority): the daemon solves the levels together,
    and ``low``, which would place more GPU demand, still does not take ``high``'s GPU."""
    cluster = Cluster([Node("n0", 64000, 256000, gpu_count=2, gpu_model="A100", labels={"zone": "z0"})])
    near_x = (PodAffinityTerm((Requirement("app", "In", ("x",)),), None, "zone"),)
    x = Pod("x", 100, 10, labels=(("app", "x"),), uid="ux", priority=0)
    high = Pod("high", 1000, 100, num_gpu=1, gpu_milli=1000, priority=10, affinity=near_x, uid="uh")
    low = Pod("low", 1000, 100, num_gpu=2, gpu_milli=1000, priority=0, uid="ul")
    names, status = placed([high, x, low], cluster)
    assert names == ["high", "x"]
    assert status == "OPTIMAL"


def test_a_gang_counts_at_its_lowest_members_priority() -> None:
    gang = Gang("g", min_members=2)
    both_high = [replace(pod(f"g{i}", gpus=1), priority=10, gang=gang, uid=f"g{i}") for i in range(2)]
    single = replace(pod("single", gpus=2), priority=5, uid="single")
    cluster = Cluster([gpu_node(gpus=2)])
    assert placed([single, *both_high], cluster)[0] == ["g0", "g1"]
    one_low = [both_high[0], replace(both_high[1], priority=0)]
    assert placed([*one_low, single], cluster)[0] == ["single"]


def test_levels_too_many_to_weigh_exactly_leave_the_objective_bounded() -> None:
    """Sixty levels of 8-GPU pods: the exact bonuses would pass the objective's limit; none are
    given, and the plan is still a valid one."""
    pods = [replace(pod(f"p{i}", gpus=8), priority=i, uid=f"p{i}") for i in range(60)]
    cluster = Cluster([gpu_node(f"n{i}", gpus=8) for i in range(4)])
    state = cluster.empty_state()
    inst = build_instance(pods, state, FragScorer(cluster, TypicalPods.from_pods(pods)), _empty(pods), 24)
    assert priority.bonuses(inst, Weights(), 0) == [0] * len(inst.groups)
    names, _ = placed(pods, cluster)
    assert len(names) == 4


def test_bonuses_are_lexicographic_and_only_when_work_conserving() -> None:
    pods = [replace(pod("a", gpus=1), priority=1), replace(pod("b", gpus=1), priority=1)]
    pods.append(replace(pod("c", gpus=1), priority=2))
    cluster = Cluster([gpu_node(gpus=2)])
    state = cluster.empty_state()
    inst = build_instance(pods, state, FragScorer(cluster, TypicalPods.from_pods(pods)), _empty(pods), 24)
    w = Weights()
    bonus = priority.bonuses(inst, w, 7)
    by_priority = {g.priority: b for g, b in zip(inst.groups, bonus, strict=True)}
    low_worth = 2 * (w.placed_gpu * 1000 + w.placed_pods)
    assert by_priority == {1: 0, 2: 7 + low_worth + 1}
    assert 3 * by_priority[2] < OBJECTIVE_LIMIT
    assert priority.bonuses(inst, replace(w, work_conserving=False), 7) == [0, 0]


def _empty(pods: list[Pod]) -> Plan:
    return Plan((), tuple(pods))


def test_the_models_plan_stands_when_it_places_as_many_high_pods_and_more_below() -> None:
    """Three GPUs; A (2 GPUs), B and C (1 each) at priority 10, ``low`` (1) at 0.  Two high pods
    either way; B, C and ``low`` place three pods of the batch's GPUs where A and B place two:
    the model's plan, not the warm start's, though it places less GPU demand at priority 10."""
    top = [replace(pod("A", gpus=2), priority=10), replace(pod("B", gpus=1), priority=10)]
    top.append(replace(pod("C", gpus=1), priority=10))
    low = replace(pod("low", gpus=1), priority=0)
    names, status = placed([*top, low], Cluster([gpu_node(gpus=3)]))
    assert names == ["B", "C", "low"]
    assert status == "OPTIMAL"
