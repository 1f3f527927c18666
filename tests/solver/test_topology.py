"""MIG slices, GPU islands and gangs: each constraint module end to end and alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.cluster import Repartition
from gpusched.model.pod import Gang
from gpusched.solver.baselines import BestFitPolicy, FgdPolicy
from gpusched.solver.constraints import capacity, demand, gang, island, mig, whole_gpu
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.solver.test_constraints import Solved, cpsat, instance, unplaced, where
from tests.solver.test_properties import hinted_model_solves

A100 = "A100-SXM4-80GB"


def mig_node(
    name: str = "m0", gpus: int = 1, *, repartition: bool = True, slices: Sequence[tuple[str, int]] = ()
) -> Node:
    return Node(
        name, 64000, 262144, gpu_count=gpus, gpu_model=A100, mig_repartition=repartition, mig_slices=tuple(slices)
    )


def mig_pod(name: str, profile: str, cpu: int = 1000) -> Pod:
    return Pod(name, cpu, 1024, mig_profile=profile)


def island_pod(name: str, gpus: int, mode: str = "required", cpu: int = 1000) -> Pod:
    return Pod(name, cpu, 1024, num_gpu=gpus, gpu_milli=1000, island=mode)


def member(name: str, group: Gang, gpus: int = 8, cpu: int = 1000) -> Pod:
    return Pod(name, cpu, 1024, num_gpu=gpus, gpu_milli=1000, gang=group)


def used(state: ClusterState, node: int, gpus: Sequence[int]) -> ClusterState:
    return state.apply([Assignment(Pod(f"old-{node}-{g}", 0, 0, num_gpu=1, gpu_milli=1000), node, (g,)) for g in gpus])


# --- MIG ----------------------------------------------------------------------------------------


def test_fixed_mig_slices_are_packed_up_to_what_the_node_advertises() -> None:
    cluster = Cluster([mig_node("fixed", gpus=0, repartition=False, slices=[("1g.10gb", 7)])])
    pods = [mig_pod(f"p{i}", "1g.10gb") for i in range(8)]
    plan = cpsat(pods, cluster.empty_state())
    assert len(plan.assignments) == 7
    assert all(a.gpus == () for a in plan.assignments)
    assert not plan.partitions, "a node that may not be re-partitioned keeps its layout"


def test_mig_only_nodes_of_another_product_are_not_taken_for_candidates() -> None:
    # Every GPU in MIG mode: no whole GPU, so no GPU model id; the product still decides.
    nodes = [Node(f"a100-{i}", 8000, 32768, 0, "A100-SXM4-80GB", mig_slices=(("1g.10gb", 7),)) for i in range(3)]
    nodes += [Node(f"h100-{i}", 8000, 32768, 0, "H100-80GB", mig_slices=(("1g.10gb", 7),)) for i in range(3)]
    state = Cluster(nodes).empty_state()
    pods = [Pod(f"q{i}", 100, 100, mig_profile="1g.10gb", gpu_models=frozenset({"H100-80GB"})) for i in range(22)]
    plan = cpsat(pods, state)
    assert plan.stats.status == "OPTIMAL"  # the solver's own plan, not a fallback after validation
    assert {nodes[a.node].name for a in plan.assignments} == {"h100-0", "h100-1", "h100-2"}
    assert len(plan.assignments) == 21


def test_the_solver_chooses_a_mig_layout_that_fits_the_whole_batch() -> None:
    cluster = Cluster([mig_node(gpus=1)])
    state = cluster.empty_state()
    pods = [mig_pod("big", "3g.40gb")] + [mig_pod(f"small{i}", "1g.10gb") for i in range(4)]
    plan = cpsat(pods, state)
    assert unplaced(plan) == []
    ((n, g, layout),) = plan.partitions
    assert (n, g) == (0, 0)
    assert layout.counts["3g.40gb"] >= 1
    assert layout.counts["1g.10gb"] >= 4
    greedy = FgdPolicy(cluster, TypicalPods.from_pods(pods)).place(pods, state)
    validate_plan(greedy, state, pods)
    assert len(greedy.assignments) < 5, "the greedy all-<profile> layout cannot hold this batch"


def test_a_gpu_is_never_both_partitioned_and_taken_whole() -> None:
    cluster = Cluster([mig_node(gpus=2)])
    whole = Pod("whole", 1000, 1024, num_gpu=2, gpu_milli=1000)
    plan = cpsat([whole, mig_pod("slice", "1g.10gb")], cluster.empty_state())
    assert len(plan.assignments) == 1
    bad = Plan(
        (Assignment(whole, 0, (0, 1)), Assignment(mig_pod("slice", "1g.10gb"), 0)),
        (),
        partitions=((0, 1, cluster.geometry[0].layouts()[0]),),  # type: ignore[union-attr]
    )
    assert any("partitioned twice or also used" in p for p in plan_problems(bad, cluster.empty_state()))


def test_mig_module_keeps_pods_within_instances_free_or_partitioned() -> None:
    cluster = Cluster([mig_node("fixed", gpus=0, repartition=False, slices=[("1g.10gb", 2)])])
    inst = instance([mig_pod(f"p{i}", "1g.10gb", cpu=1000 + i) for i in range(4)], cluster.empty_state())
    assert Solved(inst, [demand, capacity, mig]).placed_pods() == 2
    assert Solved(inst, [demand, capacity]).placed_pods() == 4, "without the mig module all four land"


@pytest.mark.parametrize(
    ("advertised", "held", "repartition"),
    [
        (1, [False, False], "idle-gpus"),  # an instance went unhealthy under a running pod
        (0, [True], "idle-nodes"),  # the MIG manager re-partitions while a pod still terminates
    ],
)
def test_a_node_short_of_the_instances_its_pods_hold_keeps_its_gpus_for_pods_that_go_there(
    advertised: int, held: list[bool], repartition: Repartition
) -> None:
    # Fewer instances of the profile advertised than pods hold: -1 free.  The MIG pod takes an
    # instance on the other node; nothing binds the short node to partition a GPU, and both its
    # GPUs go to the whole-GPU pod.
    short = mig_node("short", gpus=2, slices=[("1g.10gb", advertised)] if advertised else [])
    spare = mig_node("spare", gpus=0, repartition=False, slices=[("1g.10gb", 2)])
    state = Cluster([short, spare], repartition=repartition).empty_state()
    state = state.apply(
        [Assignment(replace(mig_pod(f"old{i}", "1g.10gb"), terminating=t), 0) for i, t in enumerate(held)]
    )
    assert state.mig_free[0, state.cluster.mig_index["1g.10gb"]] == -1
    pods = [mig_pod("slice", "1g.10gb"), Pod("whole", 1000, 1024, num_gpu=2, gpu_milli=1000)]
    inst = instance(pods, state)
    assert Solved(inst, [demand, capacity, mig, whole_gpu]).placed_pods() == 2
    plan = cpsat(pods, state)
    assert plan.stats.status == "OPTIMAL"  # the solver's own plan, not the warm start kept
    assert where(plan) == {"slice": (1, ()), "whole": (0, (0, 1))}
    assert not plan.partitions


def test_partitioned_instances_are_used_by_later_batches() -> None:
    cluster = Cluster([mig_node(gpus=1)])
    state = cluster.empty_state()
    first = cpsat([mig_pod("a", "1g.10gb")], state)
    state = state.partition(first.partitions).apply(first.assignments)
    assert int(state.full_free_gpus[0]) == 0
    second = cpsat([mig_pod(f"b{i}", "1g.10gb") for i in range(7)], state)
    assert not second.partitions
    assert len(second.assignments) == sum(first.partitions[0][2].counts.values()) - 1


# --- islands ------------------------------------------------------------------------------------


def islands_node(name: str = "i0", layout: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1)) -> Node:
    return Node(name, 64000, 262144, gpu_count=len(layout), gpu_model="L4", gpu_islands=layout)


def test_a_required_island_is_not_assembled_from_two_islands() -> None:
    cluster = Cluster([islands_node()])
    state = used(cluster.empty_state(), 0, [0, 1, 4])  # idle: 2, 3 | 5, 6, 7
    plan = cpsat([island_pod("four", 4)], state, solved=False)
    assert unplaced(plan) == ["four"], "five GPUs are idle, but no island has four"
    plan = cpsat([island_pod("three", 3)], state)
    assert where(plan)["three"] == (0, (5, 6, 7))
    plan = cpsat([island_pod("wish", 4, mode="preferred")], state)
    assert len(where(plan)["wish"][1]) == 4, "a preference may span islands when nothing else fits"


def test_required_island_pods_and_plain_pods_share_a_node_exactly() -> None:
    cluster = Cluster([islands_node(layout=(0, 0, 0, 1, 1, 1))])
    pods = [island_pod("r0", 2), island_pod("r1", 2), Pod("p0", 100, 64, 1, 1000), Pod("p1", 100, 64, 1, 1000)]
    plan = cpsat(pods, cluster.empty_state())
    assert unplaced(plan) == []
    for name in ("r0", "r1"):
        gpus = where(plan)[name][1]
        assert len({cluster.nodes[0].islands[g] for g in gpus}) == 1


def test_a_preferring_pod_gets_one_island_when_one_has_room() -> None:
    cluster = Cluster([islands_node()])
    state = used(cluster.empty_state(), 0, [0, 1])  # idle: 2, 3 | 4..7
    plan = cpsat([island_pod("wish", 4, mode="preferred")], state)
    assert where(plan)["wish"] == (0, (4, 5, 6, 7))


def test_island_module_keeps_required_pods_inside_islands() -> None:
    cluster = Cluster([islands_node(layout=(0, 0, 0, 1, 1, 1))])
    pods = [island_pod("a", 2, cpu=1000), island_pod("b", 2, cpu=1001), island_pod("c", 2, cpu=1002)]
    inst = instance(pods, cluster.empty_state())
    assert Solved(inst, [demand, capacity, whole_gpu, island]).placed_pods() == 2
    assert Solved(inst, [demand, capacity, whole_gpu]).placed_pods() == 3, "without it a pod spans islands"


def test_validator_rejects_a_required_pod_across_islands() -> None:
    cluster = Cluster([islands_node()])
    p = island_pod("r", 2)
    problems = plan_problems(Plan((Assignment(p, 0, (3, 4)),), ()), cluster.empty_state())
    assert any("span islands" in x for x in problems)


# --- gangs --------------------------------------------------------------------------------------


def gpu8(name: str, rack: str = "") -> Node:
    return Node(name, 64000, 262144, gpu_count=8, gpu_model="H100", labels={"rack": rack} if rack else {})


def test_a_gang_that_does_not_fit_is_rejected_whole_and_others_still_land() -> None:
    cluster = Cluster([gpu8("a"), gpu8("b")])
    big = Gang("big", min_members=3)
    pods = [member(f"big-{i}", big, gpus=8) for i in range(3)] + [Pod("solo", 1000, 1024, 4, 1000)]
    plan = cpsat(pods, cluster.empty_state())
    assert sorted(unplaced(plan)) == ["big-0", "big-1", "big-2"]
    assert "solo" in where(plan)


def test_interleaved_gangs_one_lands_whole_the_other_waits_whole() -> None:
    cluster = Cluster([gpu8("a"), gpu8("b"), gpu8("c")])
    g1, g2 = Gang("g1", 2), Gang("g2", 2)
    pods = [member("g1-0", g1), member("g2-0", g2), member("g1-1", g1), member("g2-1", g2)]
    for plan in (
        cpsat(pods, cluster.empty_state()),
        BestFitPolicy().place(pods, cluster.empty_state()),
    ):
        validate_plan(plan, cluster.empty_state(), pods)
        placed = {a.pod.gang.name for a in plan.assignments if a.pod.gang}
        assert len(plan.assignments) == 2
        assert len(placed) == 1


def test_a_gang_short_of_its_minimum_waits() -> None:
    cluster = Cluster([gpu8("a"), gpu8("b")])
    team = Gang("team", min_members=3)
    plan = cpsat([member("t0", team, gpus=1), member("t1", team, gpus=1)], cluster.empty_state(), solved=False)
    assert sorted(unplaced(plan)) == ["t0", "t1"]
    # The model itself keeps it out (no fallback to the warm start's answer): nothing fits it.
    assert plan.stats.status in ("OPTIMAL", "OPTIMAL_PRUNED", "NO_CANDIDATES"), plan.stats


def test_a_gang_requiring_one_rack_lands_in_one_rack_or_not_at_all() -> None:
    cluster = Cluster([gpu8("a", "r1"), gpu8("b", "r1"), gpu8("c", "r2"), gpu8("d", "r2"), gpu8("e", "r3")])
    state = used(cluster.empty_state(), 0, [0])
    three = Gang("three", 3, "rack", "required")
    plan = cpsat([member(f"t{i}", three) for i in range(3)], state, solved=False)
    assert len(unplaced(plan)) == 3, "four idle nodes, but no rack has three"
    assert plan.stats.status in ("OPTIMAL", "OPTIMAL_PRUNED", "NO_CANDIDATES"), (
        plan.stats
    )  # the model's answer, not a fallback
    two = Gang("two", 2, "rack", "required")
    plan = cpsat([member(f"w{i}", two) for i in range(2)], state)
    racks = {cluster.nodes[a.node].labels["rack"] for a in plan.assignments}
    assert len(plan.assignments) == 2
    assert racks == {"r2"}


def test_a_gang_preferring_one_rack_uses_the_fewest_racks() -> None:
    cluster = Cluster([gpu8(f"n{i}", f"r{i // 2}") for i in range(6)])
    state = used(cluster.empty_state(), 0, [0])  # r0 has one idle node, r1 and r2 two each
    wish = Gang("wish", 4, "rack", "preferred")
    plan = cpsat([member(f"w{i}", wish) for i in range(4)], state)
    racks = {cluster.nodes[a.node].labels["rack"] for a in plan.assignments}
    assert len(plan.assignments) == 4
    assert racks == {"r1", "r2"}


def test_a_gang_preferring_one_rack_joins_its_running_members_rack() -> None:
    """One member runs in r0 and r0 has room beside it: the new members go there, though a node
    of r1 is fuller (packing alone would pick it)."""
    cluster = Cluster([gpu8("a", "r0"), gpu8("b", "r0"), gpu8("c", "r1")])
    state = used(used(cluster.empty_state(), 1, range(7)), 2, range(4))
    wish = Gang("train", 1, "rack", "preferred", domain="r0", running=1)
    eight = [Pod("t", 1000, 1024, 8, 1000)]  # typical pods: packing 2-GPU pods onto c looks good
    plan = cpsat([member(f"m{i}", wish, gpus=2) for i in (1, 2)], state, typical=eight)
    assert sorted(node for node, _ in where(plan).values()) == [0, 0]  # a, in r0


def test_gang_module_places_all_or_none() -> None:
    cluster = Cluster([gpu8("a")])
    team = Gang("team", 2)
    inst = instance([member("t0", team, gpus=8, cpu=1000), member("t1", team, gpus=8, cpu=1001)], cluster.empty_state())
    assert Solved(inst, [demand, capacity, whole_gpu, gang]).placed_pods() == 0
    assert Solved(inst, [demand, capacity, whole_gpu]).placed_pods() == 1, "without it half the gang lands"


def test_gang_module_places_at_least_the_minimum_and_the_members_beyond_it_that_fit() -> None:
    team = Gang("team", 2)
    inst = instance([member(f"t{i}", team, gpus=4) for i in range(3)], Cluster([gpu8("a")]).empty_state())
    assert Solved(inst, [demand, capacity, whole_gpu, gang]).placed_pods() == 2
    inst = instance([member(f"t{i}", team, gpus=4) for i in range(3)], Cluster([gpu8("a"), gpu8("b")]).empty_state())
    assert Solved(inst, [demand, capacity, whole_gpu, gang]).placed_pods() == 3
    inst = instance([member(f"t{i}", team, gpus=8) for i in range(3)], Cluster([gpu8("a")]).empty_state())
    assert Solved(inst, [demand, capacity, whole_gpu, gang]).placed_pods() == 0


@pytest.mark.parametrize("name", POLICIES)
def test_a_gang_whose_minimum_fits_is_placed_though_not_every_member_does(name: str) -> None:
    """At least 2 of 3 members of 4 GPUs, one node of 8: two are placed, one waits (as
    Coscheduling's minMember and Volcano's minAvailable start a gang)."""
    cluster = Cluster([gpu8("a")])
    pods = [member(f"t{i}", Gang("team", 2), gpus=4) for i in range(3)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(name, cluster, TypicalPods.from_pods(pods), 0, params).place(pods, cluster.empty_state())
    assert plan_problems(plan, cluster.empty_state(), pods) == []
    assert len(plan.assignments) == 2
    assert "FALLBACK" not in plan.stats.status  # the solver's own plan


@pytest.mark.parametrize("name", POLICIES)
def test_a_gang_with_members_running_places_what_is_left_of_its_minimum(name: str) -> None:
    """At least 3, 2 running: one more is enough, in the rack they run in."""
    cluster = Cluster([gpu8("a", "r1"), gpu8("b", "r2")])
    state = used(cluster.empty_state(), 0, range(4))
    team = Gang("team", 1, "rack", "required", domain="r1", running=2)  # as ``Gang.beside`` leaves it
    pods = [member(f"t{i}", team, gpus=4) for i in range(2)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(name, cluster, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    assert plan_problems(plan, state, pods) == []
    assert [a.node for a in plan.assignments] == [0]  # r1, beside its members


@pytest.mark.parametrize("name", POLICIES)
def test_a_gang_whose_members_disagree_on_its_minimum_is_placed_by_no_policy(name: str) -> None:
    # One member says two are needed, the other one: no plan may bind either (the validator
    # refuses the gang whole), and a pod beside it still lands.
    cluster = Cluster([gpu8("a")])
    pods = [member("m0", Gang("g", 2), gpus=1), member("m1", Gang("g", 1), gpus=1), Pod("solo", 1000, 1024, 1, 1000)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(name, cluster, TypicalPods.from_pods(pods), 0, params).place(pods, cluster.empty_state())
    assert plan_problems(plan, cluster.empty_state(), pods) == []
    assert sorted(unplaced(plan)) == ["m0", "m1"]
    assert "FALLBACK" not in plan.stats.status  # the solver's own plan is valid too


def test_validator_rejects_a_gang_placed_below_its_minimum() -> None:
    cluster = Cluster([gpu8("a")])
    team = Gang("team", 2)
    t0, t1 = member("t0", team), member("t1", team)
    problems = plan_problems(Plan((Assignment(t0, 0, tuple(range(8))),), (t1,)), cluster.empty_state(), [t0, t1])
    assert "gang team: 1 member placed, fewer than its minimum 2" in problems


# --- properties ---------------------------------------------------------------------------------

PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@st.composite
def topology_cases(draw: st.DrawFn) -> tuple[ClusterState, tuple[Pod, ...]]:
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["islands", "rack", "mig", "fixed"]))
        if kind == "islands":
            nodes.append(islands_node(f"n{i}", draw(st.sampled_from([(0, 0, 1, 1), (0, 0, 0, 1, 1, 1), (0, 1)]))))
        elif kind == "rack":
            nodes.append(gpu8(f"n{i}", draw(st.sampled_from(["r1", "r2", ""]))))
        elif kind == "mig":
            nodes.append(mig_node(f"n{i}", gpus=draw(st.integers(1, 3))))
        else:
            nodes.append(mig_node(f"n{i}", gpus=0, repartition=False, slices=[(draw(st.sampled_from(PROFILES)), 3)]))
    state = Cluster(nodes).empty_state()
    for n, node in enumerate(nodes):
        busy = draw(st.lists(st.integers(0, max(node.gpu_count - 1, 0)), max_size=3, unique=True))
        if node.gpu_count:
            state = used(state, n, busy)
    pods: list[Pod] = []
    for i in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["island", "mig", "plain", "gang"]))
        cpu = draw(st.integers(0, 4)) * 500
        if kind == "island":
            pods.append(
                island_pod(f"p{i}", draw(st.integers(2, 4)), draw(st.sampled_from(["required", "preferred"])), cpu)
            )
        elif kind == "mig":
            pods.append(mig_pod(f"p{i}", draw(st.sampled_from(PROFILES)), cpu))
        elif kind == "plain":
            pods.append(Pod(f"p{i}", cpu, 512, num_gpu=draw(st.integers(0, 2)), gpu_milli=1000))
    for k in range(draw(st.integers(0, 2))):
        topo = draw(st.sampled_from(["", "required", "preferred"]))
        size = draw(st.integers(1, 3))
        team = Gang(f"g{k}", draw(st.integers(1, size + 1)), "rack" if topo else "", topo)
        pods.extend(member(f"g{k}-{j}", team, gpus=draw(st.sampled_from([1, 4, 8]))) for j in range(size))
    if not pods:
        pods.append(Pod("solo", 500, 512))
    order = draw(st.permutations(pods))
    return state, tuple(order)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=40, deadline=None)
@given(topology_cases())
def test_no_plan_places_a_gang_below_its_minimum_overcommits_a_slice_or_breaks_a_required_island(
    name: str, case: tuple[ClusterState, tuple[Pod, ...]]
) -> None:
    state, pods = case
    params = SolverParams(limits=Limits(time_limit_s=0.5, workers=1))
    plan = make_policy(name, state.cluster, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)  # gangs at their minimum or none, slices within instances, islands kept
    assert len(plan.assignments) + len(plan.unplaced) == len(pods)
    after = state.partition(plan.partitions).apply(plan.assignments)
    assert (after.mig_free >= 0).all()


@settings(max_examples=40, deadline=None)
@given(topology_cases())
def test_the_greedy_warm_start_is_a_complete_feasible_hint_with_topology(
    case: tuple[ClusterState, tuple[Pod, ...]],
) -> None:
    state, pods = case
    hinted_model_solves(pods, state, TypicalPods.from_pods(pods), 0)


def test_chosen_layouts_render_as_a_mig_manager_document() -> None:
    import yaml

    from gpusched.model import mig_plan

    cluster = Cluster([mig_node("m0", gpus=2)])
    pods = [mig_pod("big", "3g.40gb")] + [mig_pod(f"small{i}", "1g.10gb") for i in range(4)]
    plan = cpsat(pods, cluster.empty_state())
    doc = yaml.safe_load(yaml.safe_dump(mig_plan(cluster, plan.partitions)))
    (entries,) = doc["mig-configs"].values()
    enabled = [e for e in entries if e["mig-enabled"]]
    assert len(enabled) == 1, "one GPU partitioned, the other left whole"
    assert enabled[0]["mig-devices"]["3g.40gb"] >= 1
    assert enabled[0]["mig-devices"]["1g.10gb"] >= 4
    assert [e["devices"] for e in entries if not e["mig-enabled"]] == [[1 - enabled[0]["devices"][0]]]


def test_a_gang_of_two_shapes_gets_room_for_all_members_even_when_the_greedy_misses() -> None:
    nodes = [gpu8(f"r{i}", "a") for i in range(4)] + [gpu8("x0"), gpu8("x1")]
    cluster = Cluster(nodes)
    team = Gang("team", 4, "rack", "required")
    small = [Pod(f"s{i}", 1000, 1024, 4, 1000, priority=10) for i in range(4)]
    members = [member(f"t{i}", team, cpu=1000 + 1000 * (i // 2)) for i in range(4)]
    plan = cpsat(small + members, cluster.empty_state())
    assert unplaced(plan) == [], "the four 4-GPU pods fit on the two unlabelled nodes, the gang in rack a"


def test_validator_checks_the_gpu_model_of_a_mig_pod() -> None:
    cluster = Cluster([mig_node("fixed", gpus=0, repartition=False, slices=[("1g.10gb", 2)])])
    p = Pod("slice", 100, 100, mig_profile="1g.10gb", gpu_models=frozenset({"H100"}))
    problems = plan_problems(Plan((Assignment(p, 0),), ()), cluster.empty_state())
    assert any("is not accepted" in x for x in problems)


def test_members_left_beside_a_gang_placed_in_part_are_placed_one_by_one_in_its_rack() -> None:
    """Two of a gang of at least 2 placed in r2: the third is offered alone, held to r2; a pod of
    another gang, none of whose members is placed, is left as it was."""
    from gpusched.solver.instance import beside_placed

    cluster = Cluster([gpu8("a", "r1"), gpu8("b", "r2")])
    team, other = Gang("team", 2, "rack", "required"), Gang("other", 2)
    pods = [member(f"t{i}", team, gpus=4) for i in range(3)] + [member("o0", other)]
    placed = [Assignment(pods[0], 1, (0, 1, 2, 3)), Assignment(pods[1], 1, (4, 5, 6, 7))]
    left, alone = beside_placed(pods[2:], placed, cluster.empty_state())
    assert left.gang == Gang("team", 1, "rack", "required", domain="r2", running=2)
    assert alone is pods[3]
