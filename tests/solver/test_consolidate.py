"""Consolidation: which nodes are emptied, and where their pods would go."""

from __future__ import annotations

from dataclasses import replace

from gpusched.model import Assignment, Cluster, ClusterState, Node, Plan
from gpusched.model.affinity import Requirement
from gpusched.model.node import Taint
from gpusched.model.pod import Gang
from gpusched.solver.consolidate import plan_consolidation
from gpusched.solver.preempt import Budget
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod


def on(name: str, node: int, gpus: tuple[int, ...], movable: bool = True, **kw: object) -> Assignment:
    return Assignment(replace(pod(name, gpus=len(gpus)), movable=movable, **kw), node, gpus)  # type: ignore[arg-type]


def setup(placed: list[Assignment], nodes: int = 3, gpus: int = 4) -> tuple[Cluster, ClusterState]:
    c = Cluster([gpu_node(f"n{i}", gpus=gpus) for i in range(nodes)])
    return c, c.empty_state().apply(placed)


def check(state: ClusterState, placed: list[Assignment], moves: list) -> None:  # type: ignore[type-arg]
    """The moved pods fit where the plan says, with every move's pods gone from their node."""
    gone = [a for m in moves for a in m.pods]
    after = state.release(gone)
    targets = [t for m in moves for t in m.targets]
    validate_plan(Plan(tuple(targets), ()), after, [t.pod for t in targets])
    emptied = {m.node for m in moves}
    assert not {t.node for t in targets} & emptied
    assert all(a.node not in emptied for a in placed if a not in gone)


def test_the_emptiest_node_whose_pods_fit_elsewhere_is_emptied() -> None:
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,))]  # n2 idle
    _, state = setup(placed)
    (move,) = plan_consolidation(state, placed)
    assert move.node == 1
    assert [t.pod.name for t in move.targets] == ["b0"]
    assert move.targets[0].node == 0  # a node in use; never the idle n2
    check(state, placed, [move])


def test_nothing_moves_onto_idle_nodes_or_when_it_does_not_all_fit() -> None:
    placed = [on(f"a{i}", 0, (i,)) for i in range(4)] + [on("b0", 1, (0,)), on("b1", 1, (1,))]
    _, state = setup(placed)
    assert plan_consolidation(state, placed) == []  # n1's two pods find room only on idle n2


def test_a_node_with_any_pod_that_may_not_move_stays() -> None:
    for odd in (
        on("x", 1, (1,), movable=False),
        on("x", 1, (1,), gang=Gang("g", 1)),
        on("x", 1, (1,), terminating=True),
    ):
        placed = [on("a0", 0, (0,)), on("b0", 1, (0,)), odd]
        _, state = setup(placed)
        moves = plan_consolidation(state, placed)
        assert 1 not in [m.node for m in moves], odd.pod  # (n0 may move onto n1, unless x is leaving)


def test_a_node_where_a_pod_is_leaving_takes_no_moved_pod() -> None:
    placed = [on("a0", 0, (0,)), on("gone", 0, (1,), movable=False, terminating=True), on("b0", 1, (0,))]
    _, state = setup(placed, nodes=2)
    assert plan_consolidation(state, placed) == []  # n0 would take b0, but something there is on its way out


def test_disruption_budgets_are_never_broken() -> None:
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,), labels=(("app", "web"),))]
    _, state = setup(placed)
    budget = Budget("default", (Requirement("app", "In", ("web",)),), 0)
    assert [m.node for m in plan_consolidation(state, placed, budgets=[budget])] == [0]  # n1 is the emptier
    assert [m.node for m in plan_consolidation(state, placed, budgets=[replace(budget, allowed=1)])] == [1]


def test_several_nodes_empty_in_one_plan_but_never_onto_each_other() -> None:
    placed = [on(f"a{i}", 0, (i,)) for i in range(2)] + [on("b0", 1, (0,)), on("c0", 2, (0,))]
    _, state = setup(placed)
    moves = plan_consolidation(state, placed, max_nodes=5)
    assert sorted(m.node for m in moves) == [1, 2]  # both onto n0, which stays
    check(state, placed, moves)
    assert [m.node for m in plan_consolidation(state, placed, max_nodes=1)] == [1]


def test_a_pod_that_runs_on_every_node_stays_and_does_not_keep_its_node_from_emptying() -> None:
    plugin = Assignment(replace(pod("device-plugin", cpu=100), daemon=True), 1, ())
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,)), plugin]
    _, state = setup(placed)
    (move,) = plan_consolidation(state, placed)
    assert move.node == 1
    assert [a.pod.name for a in move.pods] == ["b0"]  # the plugin stays


def test_a_node_that_is_not_ready_is_never_emptied_nor_a_target() -> None:
    c = Cluster(
        [
            gpu_node("n0", gpus=4),
            replace(gpu_node("n1", gpus=4), taints=(Taint("node.kubernetes.io/unreachable", "", "NoExecute"),)),
        ]
    )
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,))]
    state = c.empty_state().apply(placed)
    assert plan_consolidation(state, placed) == []


def test_an_idle_node_is_no_target_even_when_a_batch_would_count_its_gpu_taken() -> None:
    placed = [on(f"full{i}", 0, (i,), movable=False) for i in range(4)] + [on("b0", 1, (0,))]
    _, state = setup(placed)
    blocked = state.with_gpus_at([(2, 0)], 1000)  # n2 idle, its GPU 0 kept free or measured busy
    assert plan_consolidation(blocked, placed) == []


def test_a_pod_is_not_moved_to_a_node_its_replacement_would_be_steered_from() -> None:
    spot = replace(gpu_node("n0", gpus=4), taints=(Taint("spot", "true", "PreferNoSchedule"),))
    c = Cluster([spot, gpu_node("n1", gpus=4)])
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,))]
    state = c.empty_state().apply(placed)
    (move,) = plan_consolidation(state, placed)
    assert move.node == 0  # the spot node's pods move off it; b0 is never moved onto it


def test_an_empty_budget_selector_protects_every_pod_of_its_namespace_from_eviction() -> None:
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("b0", 1, (0,))]
    _, state = setup(placed)
    assert plan_consolidation(state, placed, budgets=[Budget("default", (), 0, everyone=True)]) == []
    assert plan_consolidation(state, placed, budgets=[Budget("default", (), 0)]) != []  # as preemption reads it


def test_mig_pods_move_to_free_instances_of_their_profile_and_never_partition_a_gpu() -> None:
    a100 = "A100-SXM4-80GB"
    nodes = [Node(f"m{i}", 64000, 262144, gpu_count=0, gpu_model=a100, mig_slices=(("1g.10gb", 7),)) for i in range(3)]
    nodes.append(Node("whole", 64000, 262144, gpu_count=1, gpu_model=a100, mig_repartition=True))
    cluster = Cluster(nodes, repartition="idle-nodes")

    def mig(name: str, node: int) -> Assignment:
        return Assignment(replace(pod(name), mig_profile="1g.10gb", movable=True), node, ())

    placed = [mig(f"a{i}", 0) for i in range(4)] + [mig("b0", 1), mig("b1", 1), mig("c0", 2)]
    placed += [on("w", 3, (0,))]  # the whole-GPU node is in use: a target, but has no instance
    state = cluster.empty_state().apply(placed)
    moves = plan_consolidation(state, placed, max_nodes=3)
    emptied = {cluster.nodes[m.node].name for m in moves}
    assert len(emptied) == 2, "seven instances' worth of pods on three nodes: two are emptied"
    assert emptied < {"m0", "m1", "m2"}
    kept = ({"m0", "m1", "m2"} - emptied).pop()
    assert {cluster.nodes[t.node].name for m in moves for t in m.targets} == {kept}, "never the whole-GPU node"
    check(state, placed, moves)
    assert all(t.gpus == () for m in moves for t in m.targets)


def test_a_pod_two_budgets_select_is_not_moved_as_the_eviction_api_would_refuse_it() -> None:
    web = (("app", "web"), ("tier", "gpu"))
    placed = [on("a0", 0, (0,)), on("a1", 0, (1,)), on("a2", 0, (2,)), on("b0", 1, (0,), labels=web), on("b1", 1, (1,))]
    _, state = setup(placed, nodes=2, gpus=6)
    app = Budget("default", (Requirement("app", "In", ("web",)),), 1)
    tier = Budget("default", (Requirement("tier", "In", ("gpu",)),), 1)
    assert [m.node for m in plan_consolidation(state, placed, budgets=[app])] == [1]  # the emptier
    # Each budget allows b0 to go, but the Eviction API refuses a pod of two budgets outright:
    # n1 is left alone (b1 would be evicted for nothing), and n0 moves onto it instead.
    (move,) = plan_consolidation(state, placed, budgets=[app, tier])
    assert move.node == 0
    assert sorted(a.pod.name for a in move.pods) == ["a0", "a1", "a2"]


def test_a_pod_that_prefers_one_island_moves_only_to_a_node_where_it_gets_one() -> None:
    # Two 4-GPU nodes of two NVLink islands each.  n0 keeps a pod on GPU 0 and one on GPU 2:
    # two GPUs free there, one per island.  n1 runs a 2-GPU job within one island.
    nodes = [Node(f"n{i}", 64000, 262144, gpu_count=4, gpu_model="A100", gpu_islands=(0, 0, 1, 1)) for i in range(3)]
    stays = [Assignment(replace(pod(f"a{g}", gpus=1), movable=False), 0, (g,)) for g in (0, 2)]
    job = Assignment(replace(pod("j", gpus=2), movable=True, island="preferred"), 1, (0, 1))
    state = Cluster(nodes[:2]).empty_state().apply([*stays, job])
    assert plan_consolidation(state, [*stays, job]) == []  # its replacement would go back for an island
    # With n0's GPUs 2 and 3 free (one island), it moves there, onto that island.
    stays[1] = Assignment(stays[1].pod, 0, (1,))
    state = Cluster(nodes[:2]).empty_state().apply([*stays, job])
    moves = plan_consolidation(state, [*stays, job])
    assert [(m.node, [(t.node, t.gpus) for t in m.targets]) for m in moves] == [(1, [(0, (2, 3))])]
