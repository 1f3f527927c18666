"""Greedy baselines on tiny hand-made clusters: each picks the node its rule says."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.policy import Policy
from gpusched.solver.registry import make_policy
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod

GREEDY = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")


def policy(name: str, cluster: Cluster, typical: Sequence[Pod] = (), seed: int = 0) -> Policy:
    typ = TypicalPods.from_pods(typical or [pod("t", gpus=1)], coverage=1.0)
    return make_policy(name, cluster, typ, seed)


def place(name: str, pods: Sequence[Pod], state: ClusterState, typical: Sequence[Pod] = (), seed: int = 0) -> Plan:
    plan = policy(name, state.cluster, typical or pods, seed).place(pods, state)
    validate_plan(plan, state, pods)
    assert plan.stats.policy == name
    return plan


def where(plan: Plan) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {a.pod.name: (a.node, a.gpus) for a in plan.assignments}


# --- each policy's rule -----------------------------------------------------------------------


def test_bestfit_picks_the_fullest_node() -> None:
    cluster = Cluster([gpu_node("a"), gpu_node("b"), gpu_node("c")])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=1), 1, (0,))])
    assert where(place("bestfit", [pod("p", gpus=1)], state)) == {"p": (1, (1,))}
    # A CPU-only pod goes where the least CPU is left after it.
    state = cluster.empty_state().apply([Assignment(pod("old", cpu=5000), 2)])
    assert where(place("bestfit", [pod("p", cpu=2000)], state)) == {"p": (2, ())}


def test_dotprod_picks_the_node_with_the_smallest_dot_product() -> None:
    cluster = Cluster([gpu_node("a", gpus=8, cpu=32000), gpu_node("b", gpus=8, cpu=32000)])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=4), 1, (0, 1, 2, 3))])
    # Node b has half the free GPU of node a: the smaller dot product with a 4-GPU request.
    assert where(place("dotprod", [pod("p", gpus=4)], state)) == {"p": (1, (4, 5, 6, 7))}


def test_gpuclustering_keeps_pod_kinds_together() -> None:
    cluster = Cluster([gpu_node("two", gpus=4), gpu_node("frac", gpus=4), gpu_node("empty", gpus=4)])
    state = cluster.empty_state().apply(
        [Assignment(pod("old2", gpus=2), 0, (0, 1)), Assignment(pod("oldf", gpus=1, milli=500), 1, (0,))]
    )
    assert where(place("gpuclustering", [pod("p", gpus=2)], state))["p"][0] == 0
    assert where(place("gpuclustering", [pod("p", gpus=1, milli=300)], state))["p"][0] == 1
    # A 1-GPU pod has no node of its own kind: an empty node beats mixing kinds.
    assert where(place("gpuclustering", [pod("p", gpus=1)], state))["p"][0] == 2


def test_gpupacking_puts_a_share_on_a_partly_used_gpu() -> None:
    cluster = Cluster([gpu_node("idle"), gpu_node("used")])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=1, milli=400), 1, (1,))])
    assert where(place("gpupacking", [pod("p", gpus=1, milli=300)], state)) == {"p": (1, (1,))}
    # A share that does not fit the used GPU still prefers the used node's idle GPU to an idle node.
    assert where(place("gpupacking", [pod("p", gpus=1, milli=700)], state)) == {"p": (1, (0,))}
    assert where(place("gpupacking", [pod("p", gpus=1)], state)) == {"p": (1, (0,))}


@pytest.mark.parametrize("fuller", [0, 1])
def test_gpupacking_prefers_the_fuller_gpu(fuller: int) -> None:
    cluster = Cluster([gpu_node("a"), gpu_node("b")])
    state = cluster.empty_state().apply(
        [
            Assignment(pod("o1", gpus=1, milli=200), 1 - fuller, (0,)),
            Assignment(pod("o2", gpus=1, milli=600), fuller, (0,)),
        ]
    )
    for seed in range(8):  # whatever order the seed breaks ties in
        plan = place("gpupacking", [pod("p", gpus=1, milli=300)], state, seed=seed)
        assert where(plan) == {"p": (fuller, (0,))}, seed


def test_gpupacking_prefers_a_partly_used_gpu_to_an_idle_gpu_of_a_partly_used_node() -> None:
    cluster = Cluster([gpu_node("whole-used"), gpu_node("share-used")])
    state = cluster.empty_state().apply(
        [Assignment(pod("o1", gpus=1), 0, (0,)), Assignment(pod("o2", gpus=1, milli=400), 1, (0,))]
    )
    assert where(place("gpupacking", [pod("p", gpus=1, milli=300)], state)) == {"p": (1, (0,))}


@pytest.mark.parametrize("name", ["bestfit", "dotprod", "gpuclustering", "gpupacking"])
def test_a_share_goes_to_the_tightest_gpu_that_fits(name: str) -> None:
    cluster = Cluster([gpu_node("a", gpus=4)])
    state = cluster.empty_state().apply(
        [Assignment(pod("o1", gpus=1, milli=700), 0, (1,)), Assignment(pod("o2", gpus=1, milli=500), 0, (2,))]
    )  # free [1000, 300, 500, 1000]
    assert where(place(name, [pod("p", gpus=1, milli=250)], state)) == {"p": (0, (1,))}
    assert where(place(name, [pod("p", gpus=1, milli=400)], state)) == {"p": (0, (2,))}
    assert where(place(name, [pod("p", gpus=1, milli=600)], state)) == {"p": (0, (0,))}


def test_fgd_avoids_stranding_a_gpu() -> None:
    cluster = Cluster([gpu_node("two", gpus=2), gpu_node("three", gpus=3)])
    state = cluster.empty_state()
    typical = [pod("t", gpus=2)]  # the workload is 2-GPU pods
    p = pod("p", gpus=1)
    # On "two" the pod would strand one GPU that no 2-GPU pod can use; on "three" it leaves two.
    assert where(place("fgd", [p], state, typical))["p"][0] == 1
    # Best fit, which only looks at what is left, takes the fuller node and strands the GPU.
    assert where(place("bestfit", [p], state, typical))["p"][0] == 0


def test_fgd_keeps_cpu_for_gpu_work() -> None:
    cluster = Cluster([gpu_node("gpu", gpus=1, cpu=4000), Node("cpu", 4000, 32768)])
    typical = [pod("t", cpu=2000, gpus=1)]
    # A CPU-only pod on the GPU node would leave it too little CPU for the typical GPU pod.
    assert where(place("fgd", [pod("p", cpu=3000)], cluster.empty_state(), typical))["p"][0] == 1


def test_fgd_fills_the_gpu_a_share_completes() -> None:
    cluster = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=1, milli=500), 1, (1,))])
    plan = place("fgd", [pod("p", gpus=1, milli=500)], state, [pod("t", gpus=1)])
    assert where(plan) == {"p": (1, (1,))}


def test_random_only_uses_feasible_nodes_and_spreads() -> None:
    cluster = Cluster([gpu_node("a"), gpu_node("v", model="V100"), gpu_node("b"), Node("cpu", 64000, 65536)])
    p = pod("p", gpus=1, milli=300, models=["A100"])
    chosen = {where(place("random", [p], cluster.empty_state(), seed=s))["p"] for s in range(20)}
    assert {n for n, _ in chosen} == {0, 2}
    assert {g for _, g in chosen} == {(0,), (1,)}  # the GPU is drawn too


# --- every greedy policy ------------------------------------------------------------------------


@pytest.mark.parametrize("name", GREEDY)
def test_unplaceable_pods_land_in_unplaced(name: str) -> None:
    cluster = Cluster([gpu_node("a", gpus=3, cpu=8000, mem=8192), gpu_node("b", gpus=2)])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=1, milli=100), 1, (0,))])
    batch = [
        pod("four", gpus=4),  # no node has 4 GPUs
        pod("h100", gpus=1, milli=200, models=["H100"]),  # no such model
        pod("cpu", cpu=9000),  # no node has the CPU
        pod("mem", cpu=1000, mem=40000),  # nor the memory
        pod("ok", gpus=2),
        pod("two-more", gpus=2),  # b has only one idle GPU left
        pod("share", gpus=1, milli=900),
    ]
    plan = place(name, batch, state)
    unplaced = [p.name for p in plan.unplaced]
    assert {"four", "h100", "cpu", "mem", "two-more"} <= set(unplaced)
    assert {"ok", "share"} <= set(where(plan))
    assert where(plan)["ok"][0] == 0  # the only node with two idle GPUs
    assert len(plan.assignments) + len(plan.unplaced) == len(batch)
    assert unplaced == [p.name for p in batch if p.name in set(unplaced)]  # input order kept


@pytest.mark.parametrize("name", GREEDY)
def test_whole_gpu_pods_get_distinct_idle_gpus(name: str) -> None:
    cluster = Cluster([gpu_node("big", gpus=8, cpu=64000)])
    state = cluster.empty_state().apply(
        [Assignment(pod("old", gpus=1, milli=100), 0, (0,)), Assignment(pod("old2", gpus=1), 0, (5,))]
    )
    batch = [pod("a", gpus=2), pod("b", gpus=1), pod("c", gpus=2), pod("d", gpus=1), pod("e", gpus=1)]
    plan = place(name, batch, state)
    got = where(plan)
    assert set(got) == {"a", "b", "c", "d"}  # 6 idle GPUs: a, b, c and d take them all
    assert [p.name for p in plan.unplaced] == ["e"]
    taken = [g for _, gpus in got.values() for g in gpus]
    assert sorted(taken) == [1, 2, 3, 4, 6, 7]  # neither the shared GPU 0 nor the taken GPU 5
    assert [len(got[k][1]) for k in "abcd"] == [2, 1, 2, 1]


@pytest.mark.parametrize("name", GREEDY)
def test_shares_never_over_commit_a_gpu(name: str) -> None:
    cluster = Cluster([gpu_node("a", gpus=2)])
    state = cluster.empty_state().apply([Assignment(pod("old", gpus=1, milli=300), 0, (0,))])
    batch = [pod(f"s{i}", cpu=100, gpus=1, milli=400) for i in range(5)]
    plan = place(name, batch, state)
    assert len(plan.assignments) == 3  # 700 free holds one 400 share, 1000 free holds two
    after = state.apply(plan.assignments)
    assert int(after.gpu_used.max()) <= GPU_MILLI


@pytest.mark.parametrize("name", GREEDY)
def test_tie_break_is_deterministic_per_seed(name: str) -> None:
    cluster = Cluster([gpu_node(f"n{i}", gpus=4) for i in range(6)])
    batch = [pod("w", gpus=2), pod("f", gpus=1, milli=300), pod("c", cpu=500)]

    def run(seed: int) -> dict[str, tuple[int, tuple[int, ...]]]:
        return where(place(name, batch, cluster.empty_state(), seed=seed))

    assert run(7) == run(7)
    first_nodes = {run(s)["w"][0] for s in range(12)}
    assert len(first_nodes) > 1, "identical nodes: the choice among them must depend on the seed"


@pytest.mark.parametrize("name", GREEDY)
def test_one_policy_instance_is_reusable_across_batches(name: str) -> None:
    cluster = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    pol = policy(name, cluster, [pod("t", gpus=1)])
    state = cluster.empty_state()
    placed = 0
    for i in range(3):
        batch = [pod(f"b{i}-{j}", gpus=1) for j in range(2)]
        plan = pol.place(batch, state)
        validate_plan(plan, state, batch)
        placed += len(plan.assignments)
        state = state.apply(plan.assignments)
    assert placed == 4
    assert int(state.full_free_gpus.sum()) == 0


def test_make_policy_rejects_unknown_names_and_ignores_case() -> None:
    cluster = Cluster([gpu_node("a")])
    assert policy(" BestFit ", cluster).name == "bestfit"
    with pytest.raises(ValueError, match="unknown policy"):
        policy("firstfit", cluster)
