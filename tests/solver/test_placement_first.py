"""Work-conserving: no term other than placement keeps out a pod that fits, whatever the weights."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ortools.sat.python import cp_model

from gpusched.model import Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.model.node import Taint
from gpusched.model.pod import Toleration
from gpusched.solver import objectives
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.model import build_model, hint_from_plan
from gpusched.solver.objectives.placed import OBJECTIVE_LIMIT, placement_first
from gpusched.solver.params import Limits, SolverParams, Weights
from gpusched.solver.registry import make_policy
from gpusched.solver.solve import cp_solver
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod

A100 = "A100-SXM4-80GB"


def optimum(pods: Sequence[Pod], state: ClusterState, hint: Plan, w: Weights) -> list[str]:
    """Names of the pods the model's proven optimum places, the warm start being ``hint``."""
    inst = build_instance(pods, state, FragScorer(state.cluster, TypicalPods.from_pods(pods)), hint, 24)
    model, v = build_model(inst, w)
    hint_from_plan(inst, model, v)
    solver = cp_solver()
    solver.parameters.num_workers = 1
    assert solver.solve(model) == cp_model.OPTIMAL
    counts = [0] * len(inst.groups)
    for ci, x in v.x.items():
        counts[inst.candidates[ci].group] += int(solver.value(x))
    return sorted(p.name for g, k in zip(inst.groups, counts, strict=True) for p in g.pods[:k])


def test_fragmentation_and_pods_kept_in_place_together_do_not_keep_out_a_cpu_pod() -> None:
    # c may only run on the 16-GPU node, where it takes every core and strands all 16 GPUs (the
    # dearest fragmentation charge there is); g0 and g1 must leave the places the warm start gave them.
    big = replace(gpu_node("a", gpus=16, cpu=8000), labels={"pool": "a"})
    small = replace(gpu_node("b", gpus=2, cpu=8000), labels={"pool": "b"})
    g = [pod(f"g{i}", cpu=4000, gpus=1) for i in range(2)]
    c = replace(pod("c", cpu=8000), node_selector=((Requirement("pool", "In", ("a",)),),))
    hint = Plan((Assignment(g[0], 0, (0,)), Assignment(g[1], 0, (1,))), (c,))
    assert optimum([*g, c], Cluster([big, small]).empty_state(), hint, Weights()) == ["c", "g0", "g1"]


def test_a_mig_partition_and_a_chain_of_moves_do_not_keep_out_a_mig_pod() -> None:
    # The slice needs m's only GPU partitioned; g0 (A100 only) must move to b, g1 from b to the V100.
    m = Node("m", 64000, 262144, gpu_count=1, gpu_model=A100, mig_repartition=True)
    b = Node("b", 64000, 262144, gpu_count=1, gpu_model=A100)
    d = Node("d", 64000, 262144, gpu_count=1, gpu_model="V100")
    g = [pod("g0", gpus=1, models=[A100]), pod("g1", gpus=1)]
    mig = Pod("slice", 1000, 1024, mig_profile="1g.10gb")
    hint = Plan((Assignment(g[0], 0, (0,)), Assignment(g[1], 1, (0,))), (mig,))
    assert optimum([*g, mig], Cluster([m, b, d]).empty_state(), hint, Weights()) == ["g0", "g1", "slice"]


def test_a_pod_worth_nothing_does_not_switch_the_guarantee_off_for_the_others() -> None:
    # placedPods 0: the CPU pod is worth nothing, the GPU pod its GPU alone, half what keeping g1
    # in place is worth; it must still displace g1 to the V100.
    b = Node("b", 64000, 262144, gpu_count=1, gpu_model=A100)
    d = Node("d", 64000, 262144, gpu_count=1, gpu_model="V100")
    g1, new, cpu = pod("g1", gpus=1), pod("new", gpus=1, models=[A100]), pod("cpu")
    hint = Plan((Assignment(g1, 0, (0,)),), (new, cpu))
    w = Weights(placed_pods=0, keep_hint=2 * 10**6)
    assert {"g1", "new"} <= set(optimum([g1, new, cpu], Cluster([b, d]).empty_state(), hint, w))


def test_extreme_weights_keep_the_objective_exact_and_the_batch_placed() -> None:
    # A pod worth 1 next to 8-GPU pods worth 8e9, and a keep-hint of 1e7 per pod: the factor that
    # would lift the least pod above the stakes would overflow; it stops at the limit instead.
    nodes = [gpu_node(f"n{i}", gpus=8, cpu=64000) for i in range(40)]
    pods = [pod(f"big{i}", gpus=8) for i in range(30)] + [pod(f"cpu{i}") for i in range(60)]
    w = Weights(placed_gpu=10**6, placed_pods=1, keep_hint=10**7)
    c = Cluster(nodes)
    inst = build_instance(pods, c.empty_state(), FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    raised = placement_first(inst, w, sum(o.stake(inst, w) for o in objectives.ALL))
    total = sum((w.placed_gpu * g.shape.gpu_demand_milli + w.placed_pods) * len(g.pods) for g in inst.groups)
    assert raised.placement_factor > 1
    assert raised.placement_factor * total <= OBJECTIVE_LIMIT
    params = SolverParams(weights=w, limits=Limits(time_limit_s=2.0, workers=1))
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, c.empty_state())
    validate_plan(plan, c.empty_state(), pods)
    assert plan.stats.status in ("OPTIMAL", "OPTIMAL_PRUNED", "FEASIBLE"), plan.stats.status
    assert not plan.unplaced


def _wary(name: str, app: str) -> Pod:
    term = PodAffinityTerm((Requirement("app", "In", ("llm",)),), frozenset({"default"}), "kubernetes.io/hostname")
    return replace(pod(name, gpus=1), labels=(("app", app),), preferred_apart=((100, term),))


def test_replicas_of_one_shape_pay_for_pairs_only_among_the_pods_their_wish_selects() -> None:
    # Same shape, same wish; only the two labelled llm select each other (and web's wish selects
    # them too).  Listed first, the pod labelled web must not decide for the group whether pairs
    # count: with three hosts, no two of them need share one.
    hosts = [replace(gpu_node(f"h{i}", gpus=8), labels={"kubernetes.io/hostname": f"h{i}"}) for i in range(3)]
    state = Cluster(hosts).empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])  # packing favours h0
    batch = [_wary("web", "web"), _wary("llm0", "llm"), _wary("llm1", "llm")]
    w = Weights(keep_hint=0)
    inst = build_instance(
        batch, state, FragScorer(state.cluster, TypicalPods.from_pods(batch)), Plan((), tuple(batch)), 24
    )
    assert len(inst.groups) == 2
    model, v = build_model(inst, w)
    solver = cp_solver()
    solver.parameters.num_workers = 1
    assert solver.solve(model) == cp_model.OPTIMAL
    hosts_used = [
        inst.candidates[ci].node
        for gi in range(len(inst.groups))
        for ci in v.by_group[gi]
        for _ in range(int(solver.value(v.x[ci])))
    ]
    assert sorted(hosts_used) == [0, 1, 2], "no two of the three may share a host"


def test_a_wish_whose_best_node_scores_above_zero_everywhere_still_does_not_keep_out_pods() -> None:
    # g prefers the spot pool and minds the autoscaler's taint; every node it may use earns it
    # points (A 250, B 150, C 100), so its wishes swing 250 points, not max - min = 150.  Six
    # tolerant pods fill all three nodes; g fits only by keeping two of them out.
    soft = Taint("DeletionCandidateOfClusterAutoscaler", "1", "PreferNoSchedule")
    nodes = [
        Node("A", 2000, 8192, labels={"pool": "spot"}),
        Node("B", 2000, 8192),
        Node("C", 2000, 8192, labels={"pool": "spot"}, soft_taints=(soft,)),
    ]
    g = replace(pod("g", cpu=2000), preferred_nodes=((100, (Requirement("pool", "In", ("spot",)),)),))
    tolerant = (Toleration("DeletionCandidateOfClusterAutoscaler", "Exists"),)
    others = [replace(pod(f"h{i}", cpu=1000), tolerations=tolerant) for i in range(6)]
    batch = [g, *others]
    w = Weights(preferred_affinity=10_000)
    assert len(optimum(batch, Cluster(nodes).empty_state(), Plan((), tuple(batch)), w)) == 6
