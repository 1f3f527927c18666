"""The CP-SAT batch model: each constraint and objective module on tiny states.

Constraint modules are checked twice: end to end through ``CpSatPolicy.place``
(what a user sees), and alone on a model with only the ``placed`` objective,
next to the same model without the module, so that each check is shown to
depend on the module it is about.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from types import ModuleType

import pytest
from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread
from gpusched.model.node import Taint
from gpusched.model.pod import Gang
from gpusched.solver.baselines import FgdPolicy
from gpusched.solver.baselines.fgd import WarmStart
from gpusched.solver.constraints import anti_affinity, capacity, demand, ports, share, spread, whole_gpu
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import Instance, build_instance
from gpusched.solver.objectives import placed
from gpusched.solver.params import Limits, SolverParams, Weights
from gpusched.solver.solve import CpSatPolicy, cp_solver
from gpusched.solver.validate import validate_plan
from gpusched.solver.vars import Vars
from tests.factories import gpu_node, pod

DEFAULT = Weights()
ONLY_PLACED = Weights(fragmentation=0, active_nodes=0, packing=0, keep_hint=0)
SOLVED = {"OPTIMAL", "OPTIMAL_PRUNED", "FEASIBLE"}


def old(state: ClusterState, node: int, gpus: Sequence[int] = (), milli: int = GPU_MILLI, cpu: int = 0) -> ClusterState:
    """``state`` with a pre-existing pod on ``node`` (``milli`` per GPU listed)."""
    p = Pod(f"old-{node}-{len(gpus)}-{milli}-{cpu}", cpu, 0, num_gpu=len(gpus), gpu_milli=milli if gpus else 0)
    return state.apply([Assignment(p, node, tuple(gpus))])


def check_stats(plan: Plan) -> None:
    s = plan.stats
    assert s.policy == "cpsat"
    assert s.status.removesuffix("+FILLED") in SOLVED, s.status  # filled: leftovers placed after the model
    assert s.objective <= s.bound + 1e-6
    assert s.gap_pct >= 0


def cpsat(
    pods: Sequence[Pod],
    state: ClusterState,
    weights: Weights = DEFAULT,
    typical: Sequence[Pod] = (),
    *,
    solved: bool = True,
) -> Plan:
    # A zero gap limit: these tests check the model's optimum, not where the search may stop.
    params = SolverParams(weights=weights, limits=Limits(time_limit_s=2.0, workers=1, relative_gap=0.0))
    typ = TypicalPods.from_pods(typical, coverage=1.0) if typical else None
    plan = CpSatPolicy(state.cluster, params, typ).place(pods, state)
    validate_plan(plan, state, pods)
    if solved:
        check_stats(plan)
    return plan


def where(plan: Plan) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {a.pod.name: (a.node, a.gpus) for a in plan.assignments}


def unplaced(plan: Plan) -> list[str]:
    return [p.name for p in plan.unplaced]


# --- constraint modules alone -------------------------------------------------------------------


class Solved:
    """A model of ``inst`` with only some constraint modules, maximising the ``placed`` term."""

    def __init__(self, inst: Instance, modules: Sequence[ModuleType]) -> None:
        self.inst = inst
        model = cp_model.CpModel()
        self.v = Vars.create(inst, model)
        for m in modules:
            m.build(inst, model, self.v)
        model.maximize(placed.build(inst, model, self.v, ONLY_PLACED))
        self.solver = cp_solver()
        self.solver.parameters.num_workers = 1
        self.solver.parameters.max_time_in_seconds = 5.0
        assert self.solver.solve(model) == cp_model.OPTIMAL

    def x(self, ci: int) -> int:
        return int(self.solver.value(self.v.x[ci]))

    def placed_pods(self) -> int:
        return sum(self.x(ci) for ci in self.v.x)

    def on_node(self, attr: str) -> Counter[int]:
        """Per node, the sum of ``attr`` of the shapes placed there (``attr`` of PodShape)."""
        out: Counter[int] = Counter()
        for ci, c in enumerate(self.inst.candidates):
            out[c.node] += getattr(self.inst.groups[c.group].shape, attr) * self.x(ci)
        return out

    def share_load(self) -> Counter[tuple[int, int]]:
        """Per (node, GPU), the share placed there by fractional candidates."""
        out: Counter[tuple[int, int]] = Counter()
        for (ci, g), var in self.v.y.items():
            c = self.inst.candidates[ci]
            out[c.node, g] += self.inst.groups[c.group].shape.gpu_milli * int(self.solver.value(var))
        return out


def instance(pods: Sequence[Pod], state: ClusterState) -> Instance:
    scorer = FragScorer(state.cluster, TypicalPods.from_pods(pods))
    return build_instance(pods, state, scorer, Plan((), tuple(pods)), candidates_per_pod=24)


def test_demand_module_places_each_pod_at_most_once() -> None:
    cluster = Cluster([Node("a", 5000, 8192), Node("b", 5000, 8192)])
    inst = instance([pod(f"p{i}", cpu=1000) for i in range(3)], cluster.empty_state())
    assert Solved(inst, [demand]).placed_pods() == 3
    assert Solved(inst, []).placed_pods() == 6, "without the demand module each node takes all 3"


@pytest.mark.parametrize("resource", ["cpu", "memory"])
def test_capacity_module_keeps_the_sum_of_requests_within_what_is_free(resource: str) -> None:
    cluster = Cluster([Node("a", 3000, 3000)])
    if resource == "cpu":
        pods = [pod("p", cpu=2000, mem=1), pod("q", cpu=2000, mem=2)]
    else:
        pods = [pod("p", cpu=1, mem=2000), pod("q", cpu=2, mem=2000)]
    inst = instance(pods, cluster.empty_state())
    s = Solved(inst, [demand, capacity])
    assert s.placed_pods() == 1
    assert s.on_node("cpu_milli")[0] <= 3000
    assert s.on_node("memory_mib")[0] <= 3000
    assert Solved(inst, [demand]).placed_pods() == 2, "without the capacity module both fit"


def test_capacity_module_counts_ephemeral_storage() -> None:
    cluster = Cluster([replace(Node("a", 8000, 8000), storage_mib=3000)])
    pods = [replace(pod("p", cpu=1), storage_mib=2000), replace(pod("q", cpu=2), storage_mib=2000)]
    inst = instance(pods, cluster.empty_state())
    assert Solved(inst, [demand, capacity]).placed_pods() == 1
    assert Solved(inst, [demand]).placed_pods() == 2, "without the capacity module both fit"


def test_ports_module_keeps_pods_of_different_shapes_off_one_host_port() -> None:
    cluster = Cluster([Node("a", 8000, 8000)])
    port = frozenset({"TCP/29500"})
    pods = [replace(pod("p", cpu=1), host_ports=port), replace(pod("q", cpu=2), host_ports=port)]
    inst = instance(pods, cluster.empty_state())
    assert Solved(inst, [demand, ports]).placed_pods() == 1
    assert Solved(inst, [demand]).placed_pods() == 2, "without the ports module both bind the port"


def test_ports_module_lets_bindings_on_two_addresses_share_a_node_but_not_one_on_every_address() -> None:
    cluster = Cluster([Node("a", 8000, 8000)])
    on = {ip: replace(pod(f"on-{ip}", cpu=1), host_ports=frozenset({f"TCP/80@10.0.0.{ip}"})) for ip in (1, 2)}
    inst = instance(list(on.values()), cluster.empty_state())
    assert Solved(inst, [demand, ports]).placed_pods() == 2
    everywhere = replace(pod("on-all", cpu=3), host_ports=frozenset({"TCP/80"}))
    inst = instance([*on.values(), everywhere], cluster.empty_state())
    s = Solved(inst, [demand, ports])
    assert s.placed_pods() == 2, "the two address bindings, not the one on every address"
    assert Solved(inst, [demand]).placed_pods() == 3, "without the ports module all three bind port 80"


def _away_from(app: str, key: str) -> tuple[PodAffinityTerm, ...]:
    return (PodAffinityTerm((Requirement("app", "In", (app,)),), None, key),)


def test_anti_affinity_module_keeps_one_replica_per_domain() -> None:
    zones = [replace(Node(f"n{i}", 8000, 8000), labels={"zone": f"z{i // 2}"}) for i in range(4)]
    cluster = Cluster([*zones, Node("no-zone", 200, 8000)])  # no zone label: no domain, room for two
    replicas = [
        replace(pod(f"r{i}", cpu=100), labels=(("app", "r"),), anti_affinity=_away_from("r", "zone")) for i in range(6)
    ]
    inst = instance(replicas, cluster.empty_state())
    s = Solved(inst, [demand, capacity, anti_affinity])
    per_zone = Counter(
        cluster.nodes[c.node].labels.get("zone") for ci, c in enumerate(inst.candidates) for _ in range(s.x(ci))
    )
    assert per_zone == {"z0": 1, "z1": 1, None: 2}
    assert Solved(inst, [demand, capacity]).placed_pods() == 6, "without the module the zones take them all"


def test_anti_affinity_module_keeps_two_groups_off_one_domain() -> None:
    web = replace(pod("web", cpu=100), anti_affinity=_away_from("db", "kubernetes.io/hostname"))
    db = replace(pod("db", cpu=200), labels=(("app", "db"),))
    cluster = Cluster([replace(Node("a", 8000, 8000), labels={"kubernetes.io/hostname": "a"})])
    inst = instance([web, db], cluster.empty_state())
    assert Solved(inst, [demand, anti_affinity]).placed_pods() == 1
    assert Solved(inst, [demand]).placed_pods() == 2, "without the module they share the node"


def test_spread_module_keeps_each_domain_within_max_skew_of_the_emptiest() -> None:
    big = replace(Node("a", 8000, 8000), labels={"zone": "a"})
    small = replace(Node("b", 100, 8000), labels={"zone": "b"})  # room for one pod
    constraint = Spread(1, "zone", (Requirement("app", "In", ("r",)),), "default")
    replicas = [replace(pod(f"r{i}", cpu=100), labels=(("app", "r"),), spread=(constraint,)) for i in range(4)]
    inst = instance(replicas, Cluster([big, small]).empty_state())
    s = Solved(inst, [demand, capacity, spread])
    assert s.on_node("cpu_milli") == {0: 200, 1: 100}  # a may hold one more than b, and b holds one
    assert Solved(inst, [demand, capacity]).placed_pods() == 4, "without the module zone a takes them all"


def test_whole_gpu_module_takes_no_more_gpus_than_are_idle() -> None:
    cluster = Cluster([gpu_node("a", gpus=4)])
    state = old(cluster.empty_state(), 0, [3], milli=100)  # 3 idle GPUs
    inst = instance([pod("two", gpus=2), pod("one-a", gpus=1), pod("one-b", gpus=1)], state)
    s = Solved(inst, [demand, capacity, whole_gpu])
    assert s.on_node("num_gpu")[0] == 3
    assert Solved(inst, [demand, capacity]).on_node("num_gpu")[0] == 4, "without it 4 GPUs are taken"


def test_whole_gpu_and_share_modules_never_share_a_gpu_taken_whole() -> None:
    cluster = Cluster([gpu_node("a", gpus=2)])
    pods = [pod("w1", gpus=1), pod("w2", gpus=1), pod("f", gpus=1, milli=500)]
    inst = instance(pods, cluster.empty_state())
    s = Solved(inst, [demand, capacity, whole_gpu, share])
    whole = {g for (n, g), var in s.v.whole.items() if s.solver.boolean_value(var)}
    load = s.share_load()
    assert all(load[0, g] == 0 for g in whole)
    assert len(whole) + len({g for (_, g), m in load.items() if m}) <= 2
    assert s.on_node("gpu_demand_milli")[0] == 2000  # both whole pods (worth more than the share)
    loose = Solved(inst, [demand, capacity, share])
    assert loose.placed_pods() == 3, "without whole_gpu a GPU is both shared and taken whole"


def test_share_module_keeps_shares_within_each_gpus_free_capacity() -> None:
    cluster = Cluster([gpu_node("a", gpus=2)])
    state = old(cluster.empty_state(), 0, [1], milli=1000)  # one GPU left
    inst = instance([pod("p", gpus=1, milli=600), pod("q", gpus=1, milli=500)], state)
    s = Solved(inst, [demand, capacity, whole_gpu, share])
    assert s.placed_pods() == 1
    assert max(s.share_load().values()) <= 1000
    assert Solved(inst, [demand, capacity, whole_gpu]).placed_pods() == 2, "without share both go"


# --- constraints end to end ---------------------------------------------------------------------


def test_two_pods_whose_cpu_exceeds_the_free_cpu_are_not_both_placed() -> None:
    cluster = Cluster([gpu_node("a", gpus=2, cpu=4000)])
    state = old(cluster.empty_state(), 0, cpu=1000)  # 3000m free
    plan = cpsat([pod("p", cpu=2000, gpus=1, milli=300), pod("q", cpu=2000)], state)
    assert len(plan.assignments) == 1
    assert len(plan.unplaced) == 1
    # Feasible: both fit within 3000m.
    plan = cpsat([pod("p", cpu=1500, gpus=1, milli=300), pod("q", cpu=1500)], state)
    assert unplaced(plan) == []


def test_pods_that_cannot_share_a_node_spread_over_nodes() -> None:
    cluster = Cluster([Node("a", 3000, 4096), Node("b", 2000, 4096)])
    plan = cpsat([pod("p", cpu=2000), pod("q", cpu=2000)], cluster.empty_state())
    assert sorted(n for n, _ in where(plan).values()) == [0, 1]


def test_memory_is_never_over_committed() -> None:
    cluster = Cluster([Node("a", 8000, 4096)])
    plan = cpsat([pod(f"p{i}", cpu=100, mem=1500) for i in range(3)], cluster.empty_state())
    assert len(plan.assignments) == 2


def test_a_gpus_shares_never_exceed_1000() -> None:
    cluster = Cluster([gpu_node("a", gpus=1)])
    state = old(cluster.empty_state(), 0, [0], milli=200)  # 800 free
    plan = cpsat([pod(f"s{i}", cpu=100, gpus=1, milli=300) for i in range(4)], state)
    assert len(plan.assignments) == 2
    assert int(state.apply(plan.assignments).gpu_used.max()) <= GPU_MILLI
    plan = cpsat([pod(f"s{i}", cpu=100, gpus=1, milli=250) for i in range(3)], state)
    assert unplaced(plan) == []
    assert int(state.apply(plan.assignments).gpu_used[0, 0]) == 950


def test_a_gpu_is_never_both_shared_and_taken_whole() -> None:
    for gpus, placed_all in ((2, False), (3, True)):
        cluster = Cluster([gpu_node("a", gpus=gpus)])
        batch = [pod("f", gpus=1, milli=500), pod("w1", gpus=1), pod("w2", gpus=1)]
        plan = cpsat(batch, cluster.empty_state())
        assert (unplaced(plan) == []) == placed_all
        whole = {g for a in plan.assignments if not a.pod.is_fractional for g in a.gpus}
        shared = {g for a in plan.assignments if a.pod.is_fractional for g in a.gpus}
        assert not whole & shared
        assert len(whole) == 2  # the whole pods are worth more than the share


def test_a_pod_with_4_gpus_never_lands_on_a_node_with_3_idle() -> None:
    cluster = Cluster([gpu_node("three", gpus=4), gpu_node("four", gpus=4)])
    state = old(cluster.empty_state(), 0, [2], milli=10)
    plan = cpsat([pod("big", gpus=4)], state)
    assert where(plan) == {"big": (1, (0, 1, 2, 3))}
    only_three = Cluster([gpu_node("three", gpus=4)])
    plan = cpsat([pod("big", gpus=4)], old(only_three.empty_state(), 0, [2], milli=10), solved=False)
    assert unplaced(plan) == ["big"]


def test_a_pod_whose_accepted_model_is_absent_stays_unplaced() -> None:
    cluster = Cluster([gpu_node("a", model="A100"), gpu_node("v", model="V100")])
    batch = [pod("h", gpus=1, milli=200, models=["H100"]), pod("v", gpus=1, models=["V100"]), pod("c")]
    plan = cpsat(batch, cluster.empty_state())
    assert unplaced(plan) == ["h"]
    assert where(plan)["v"][0] == 1
    alone = cpsat(batch[:1], cluster.empty_state(), solved=False)
    assert unplaced(alone) == ["h"]
    assert alone.stats.status == "NO_CANDIDATES"


def test_an_accepted_model_is_matched_without_the_makers_prefix_or_case_but_not_a_mig_mode_gpu() -> None:
    # GPU feature discovery writes NVIDIA-A100-SXM4-80GB; people write A100-SXM4-80GB.  A node in
    # single-strategy MIG mode offers 1g.10gb instances as nvidia.com/gpu: not the GPU asked for.
    cluster = Cluster(
        [
            gpu_node("mig", model="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
            gpu_node("a100", gpus=1, model="NVIDIA-A100-SXM4-80GB"),
            gpu_node("t4", model="Tesla-T4"),
        ]
    )
    batch = [pod("short", gpus=1, models=["A100-SXM4-80GB"]), pod("lower", gpus=1, milli=300, models=["t4"])]
    plan = cpsat(batch, cluster.empty_state())
    assert unplaced(plan) == []
    assert (where(plan)["short"][0], where(plan)["lower"][0]) == (1, 2)
    assert validate_plan(plan, cluster.empty_state(), batch) is None
    full = [pod(f"x{i}", gpus=1, models=["NVIDIA-A100-SXM4-80GB"]) for i in range(2)]  # one A100 GPU each
    assert len(unplaced(cpsat(full, cluster.empty_state()))) == 1  # never the MIG-mode node


def test_each_pod_appears_once() -> None:
    cluster = Cluster([gpu_node("a", gpus=2, cpu=6000), gpu_node("b", gpus=2, cpu=6000)])
    batch = [pod(f"f{i}", gpus=1, milli=300) for i in range(8)] + [pod(f"c{i}") for i in range(5)]
    plan = cpsat(batch, cluster.empty_state())
    keys = [a.pod.key for a in plan.assignments] + [p.key for p in plan.unplaced]
    assert sorted(keys) == sorted(p.key for p in batch)
    # CPU allows 6 pods of 1000m per node; every share fits (3 per GPU), so a CPU-only pod waits.
    assert Counter(a.node for a in plan.assignments) == {0: 6, 1: 6}
    assert len(plan.unplaced) == 1
    assert plan.unplaced[0].num_gpu == 0


def test_higher_priority_pods_of_a_shape_are_placed_first() -> None:
    cluster = Cluster([gpu_node("a", gpus=1)])
    batch = [Pod(f"p{prio}", 1000, 1024, num_gpu=1, gpu_milli=400, priority=prio) for prio in (0, 5, 1, 3)]
    plan = cpsat(batch, cluster.empty_state())
    assert sorted(a.pod.name for a in plan.assignments) == ["p3", "p5"]


# --- objective modules --------------------------------------------------------------------------


def test_placed_prefers_the_larger_gpu_demand_when_not_everything_fits() -> None:
    cluster = Cluster([gpu_node("a", gpus=1)])
    batch = [pod("share", gpus=1, milli=600), pod("whole", gpus=1)]
    greedy = FgdPolicy(cluster, TypicalPods.from_pods(batch)).place(batch, cluster.empty_state())
    assert [a.pod.name for a in greedy.assignments] == ["share"]  # first come, first served
    plan = cpsat(batch, cluster.empty_state(), ONLY_PLACED)
    assert unplaced(plan) == ["share"]
    w = ONLY_PLACED
    assert plan.stats.objective == pytest.approx(w.placed_gpu * 1000 + w.placed_pods)


def test_placed_counts_pods_too() -> None:
    cluster = Cluster([Node("a", 4000, 8192)])
    batch = [pod("big", cpu=4000), pod("s1", cpu=2000), pod("s2", cpu=2000)]
    plan = cpsat(batch, cluster.empty_state())
    assert unplaced(plan) == ["big"]
    plan = cpsat(batch, cluster.empty_state(), ONLY_PLACED)
    assert plan.stats.objective == pytest.approx(2 * ONLY_PLACED.placed_pods)
    assert plan.stats.objective == pytest.approx(plan.stats.bound)


def _partly_used_and_idle() -> ClusterState:
    """Node 0 has GPU 0 half used; node 1 is idle; both have 4 GPUs."""
    cluster = Cluster([gpu_node("used", gpus=4), gpu_node("idle", gpus=4)])
    return old(cluster.empty_state(), 0, [0], milli=500)


def test_fragmentation_fills_a_partly_used_gpu_before_an_idle_one() -> None:
    state = _partly_used_and_idle()
    batch = [pod("f", gpus=1, milli=500)]
    typical = [pod("t", gpus=1)]  # whole-GPU work: the half GPU is fragmented until filled
    # Packing turned around (prefer emptier nodes) would send the share to the idle node ...
    emptier = Weights(fragmentation=0, active_nodes=0, packing=-1, keep_hint=0)
    assert where(cpsat(batch, state, emptier, typical))["f"][0] == 1
    # ... but the fragmentation term makes filling the half GPU worth more.
    frag = Weights(fragmentation=10, active_nodes=0, packing=-1, keep_hint=0)
    assert where(cpsat(batch, state, frag, typical)) == {"f": (0, (0,))}
    # The default weights agree: the FGD warm start fills the half GPU too, and is kept.
    assert where(cpsat(batch, state, DEFAULT, typical)) == {"f": (0, (0,))}


def test_active_nodes_does_not_wake_an_idle_node_when_the_batch_fits_on_an_active_one() -> None:
    state = _partly_used_and_idle()
    batch = [pod("w1", gpus=1), pod("w2", gpus=1), pod("f", gpus=1, milli=300)]
    emptier = Weights(fragmentation=0, active_nodes=0, packing=-1, keep_hint=0)
    assert {n for n, _ in where(cpsat(batch, state, emptier)).values()} == {1}
    awake = Weights(fragmentation=0, active_nodes=1_000_000, packing=-1, keep_hint=0)
    plan = cpsat(batch, state, awake)
    assert {n for n, _ in where(plan).values()} == {0}
    assert unplaced(plan) == []


def test_default_limits_keep_an_idle_node_asleep_when_the_batch_fits_on_an_active_one() -> None:
    # Default weights and limits.  Keeping the pods on the active node is worth active_nodes = 1000
    # more than the idle one, which is below 0.1% of this batch's objective (2.6 million): any
    # relative gap limit of that size would let the search stop at a warm start that woke the node.
    state = _partly_used_and_idle()
    batch = [pod("w1", gpus=1), pod("w2", gpus=1), pod("f", gpus=1, milli=300)]
    # keep_hint=0: with the default keep_hint the solver keeps the warm start's choice on purpose.
    params = SolverParams(weights=Weights(keep_hint=0), limits=Limits(workers=1), seed=0)
    plan = CpSatPolicy(state.cluster, params).place(batch, state)
    validate_plan(plan, state, batch)
    check_stats(plan)
    assert unplaced(plan) == []
    assert {n for n, _ in where(plan).values()} == {0}, (where(plan), plan.stats)
    # The quick answer is the warm start itself, without a CP-SAT solve: FGD scores both nodes
    # alike for these pods, and the warm start breaks the tie toward the node in use.
    quick = CpSatPolicy(state.cluster, params).place_quick(batch, state)
    validate_plan(quick, state, batch)
    assert (quick.stats.status, quick.stats.variables) == ("QUICK", 0)
    assert unplaced(quick) == []
    assert where(quick)["w1"][0] == where(quick)["w2"][0] == 0
    # So the default keep_hint keeps them there too.
    kept = CpSatPolicy(state.cluster, SolverParams(limits=Limits(workers=1), seed=0)).place(batch, state)
    assert {n for n, _ in where(kept).values()} == {0}, (where(kept), kept.stats)


def test_quick_placement_solves_in_full_when_the_warm_start_leaves_a_pod_out() -> None:
    state = _partly_used_and_idle()
    batch = [pod("w1", gpus=1), pod("too-big", gpus=16)]
    plan = CpSatPolicy(state.cluster, SolverParams(limits=Limits(workers=1))).place_quick(batch, state)
    validate_plan(plan, state, batch)
    check_stats(plan)
    assert unplaced(plan) == ["too-big"]


def test_active_nodes_wakes_a_node_when_the_work_does_not_fit_otherwise() -> None:
    state = _partly_used_and_idle()
    batch = [pod("w", gpus=4)]
    plan = cpsat(batch, state, Weights(active_nodes=1_000_000, keep_hint=0))
    assert where(plan) == {"w": (1, (0, 1, 2, 3))}


def test_packing_prefers_the_fuller_node() -> None:
    cluster = Cluster([Node("empty", 8000, 8192), Node("half", 8000, 8192)])
    state = old(cluster.empty_state(), 1, cpu=4000)
    batch = [pod("c", cpu=1000)]
    assert where(cpsat(batch, state, Weights(fragmentation=0, active_nodes=0, packing=1, keep_hint=0)))["c"][0] == 1
    assert where(cpsat(batch, state, Weights(fragmentation=0, active_nodes=0, packing=-1, keep_hint=0)))["c"][0] == 0


@pytest.mark.parametrize("gpus", [8, 16])
def test_default_weights_place_a_pod_that_fits_even_where_it_fragments_every_idle_gpu(gpus: int) -> None:
    # The CPU-only pod takes the node's last CPU, so the typical GPU pod can no longer run there and
    # all idle GPU becomes fragmented: fragmentation x 1000 x gpus = 10_000 per GPU against
    # placed_pods = 100_000.  From 10 GPUs a node up, leaving the pod pending scores higher.
    cluster = Cluster([gpu_node("big", gpus=gpus, cpu=1000)])
    plan = cpsat([pod("c", cpu=1000)], cluster.empty_state(), DEFAULT, [pod("t", cpu=1000, gpus=1)])
    assert unplaced(plan) == []


def test_default_weights_place_a_pod_even_if_it_fragments() -> None:
    cluster = Cluster([gpu_node("a", gpus=2)])
    typical = [pod("t", gpus=2)]
    plan = cpsat([pod("one", gpus=1)], cluster.empty_state(), DEFAULT, typical)
    assert unplaced(plan) == []


def test_warm_start_term_keeps_the_greedy_placement_unless_moving_places_more() -> None:
    # Against 3-GPU typical pods the warm start puts both whole-GPU pods on the idle node (on the
    # active one they would leave too few idle GPUs for one); without keep_hint the active_nodes
    # term moves them to the active node, with a large keep_hint they stay.
    state = _partly_used_and_idle()
    batch = [pod("w1", gpus=1), pod("w2", gpus=1)]
    typical = [pod("t", gpus=3)]
    free = where(cpsat(batch, state, Weights(keep_hint=0, active_nodes=100_000), typical))
    kept = where(cpsat(batch, state, Weights(keep_hint=1_000_000, active_nodes=100_000), typical))
    hint = WarmStart(state.cluster, TypicalPods.from_pods(typical, coverage=1.0)).place(batch, state)
    assert {a.node for a in hint.assignments} == {1}
    assert {n for n, _ in free.values()} == {0}
    assert {n for n, _ in kept.values()} == {1}
    # ... but a pod the warm start could not place is worth moving for.
    full = Cluster([gpu_node("a", gpus=1), gpu_node("b", gpus=1)])
    busy = old(full.empty_state(), 0, [0], milli=600)
    shares = [pod("s1", gpus=1, milli=300), pod("s2", gpus=1, milli=700)]
    plan = cpsat(shares, busy, Weights(keep_hint=50_000))
    assert unplaced(plan) == []


def test_work_conserving_cap_places_a_pod_that_fits_even_when_it_wakes_a_node() -> None:
    # Every placement of the small share fragments all of an idle 8-GPU node against 8-GPU typical
    # pods and wakes that node; with the cap the pod is still placed, without it it waits.
    cluster = Cluster([gpu_node("big", gpus=8, cpu=64000, mem=262144)])
    batch = [pod("s", gpus=1, milli=100)]
    typical = [pod("t", gpus=8)]
    heavy = {"fragmentation": 1000, "keep_hint": 0, "active_nodes": 1000}
    capped = cpsat(batch, cluster.empty_state(), Weights(**heavy), typical)
    assert unplaced(capped) == []
    waits = cpsat(batch, cluster.empty_state(), Weights(**heavy, work_conserving=False), typical)
    assert unplaced(waits) == ["s"]


def test_a_solve_stopped_at_the_relative_gap_is_reported_feasible_not_optimal() -> None:
    # CP-SAT says OPTIMAL once the gap limit is reached; the batch log should not claim a proof.
    cl = Cluster([gpu_node(f"n{i}", gpus=8) for i in range(20)])
    pods = [pod(f"f{i}", gpus=1, milli=100 + (i * 37) % 800) for i in range(60)]
    pods += [pod(f"w{i}", gpus=1 + i % 4) for i in range(30)]
    for gap in (0.0, 0.5):
        stats = (
            CpSatPolicy(cl, SolverParams(limits=Limits(time_limit_s=5, workers=1, relative_gap=gap)))
            .place(pods, cl.empty_state())
            .stats
        )
        if stats.status in ("OPTIMAL", "OPTIMAL_PRUNED"):
            assert stats.objective == stats.bound, gap
        else:
            assert stats.status == "FEASIBLE", stats
            assert stats.gap_pct > 0, stats


def test_pods_the_model_was_offered_only_nodes_others_took_are_placed_where_room_is_left() -> None:
    # 30 big nodes, each with other CPU in use (30 classes), rank first for the small pods;
    # the 30 8-GPU pods need every one of them.  The small pods fit the 5 low-memory nodes, which
    # their pruned candidates do not hold.
    big = [gpu_node(f"a{i:02d}", gpus=8, cpu=64000, mem=262144) for i in range(30)]
    low = [gpu_node(f"b{i}", gpus=8, cpu=64000, mem=16384) for i in range(5)]
    cluster = Cluster(big + low)
    state = cluster.empty_state().apply(
        [Assignment(replace(pod(f"cpu-{i}"), cpu_milli=100 * (i + 1)), i, ()) for i in range(30)]
    )
    small = [replace(pod(f"small-{i}", gpus=1), memory_mib=1024) for i in range(2)]
    large = [replace(pod(f"big-{i}", gpus=8), memory_mib=102400) for i in range(30)]
    plan = cpsat(small + large, state)
    assert unplaced(plan) == []
    assert validate_plan(plan, state, small + large) is None


def _pool(k: int, spare: Sequence[Node] = ()) -> ClusterState:
    """``k`` "pool=x" nodes, each with room for one 1000m pod and one idle GPU, and different free
    CPU (a class each), then ``spare``."""
    nodes = [Node(f"pool{i}", 4000 + i, 8192, gpu_count=2, gpu_model="A100", labels={"pool": "x"}) for i in range(k)]
    busy = [Assignment(Pod(f"cpu{i}", 3000, 0), i) for i in range(k)]
    busy += [Assignment(Pod(f"gpu{i}", 0, 0, num_gpu=1, gpu_milli=GPU_MILLI), i, (0,)) for i in range(k)]
    return Cluster([*nodes, *spare]).empty_state().apply(busy)


POOL_X = ((Requirement("pool", "In", ("x",)),),)


def test_a_pod_whose_best_ranked_nodes_the_batch_needs_is_offered_the_emptiest_one() -> None:
    # The GPU pod fits every pool node and the empty "spare"; its 24 best-ranked classes
    # (candidatesPerPod) are pool nodes, which the 25 pool pods need, one each.  Only "spare"
    # places the whole batch.
    k = 25
    state = _pool(k, [Node("spare", 64000, 65536, gpu_count=8, gpu_model="A100")])
    pods = [Pod("a", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI)]
    pods += [Pod(f"b{i}", 1000, 1024, node_selector=POOL_X) for i in range(k)]
    plan = cpsat(pods, state)
    assert unplaced(plan) == []
    assert where(plan)["a"][0] == k


def test_the_emptiest_node_costs_the_model_one_class_at_most() -> None:
    k = 40
    state = _pool(k, [Node("spare", 64000, 65536, gpu_count=8, gpu_model="A100")])
    pods = [Pod("a", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI)]
    scorer = FragScorer(state.cluster, TypicalPods.from_pods(pods))
    offered = [c.node for c in build_instance(pods, state, scorer, Plan((), tuple(pods)), 24).candidates]
    assert k in offered
    assert len(offered) == 25


def test_a_solve_offered_only_part_of_the_nodes_claims_no_proven_optimum() -> None:
    # 30 classes a pod fits: with 24 candidates per pod the model's optimum is the best over
    # those (and the emptiest), not a proof for the cluster; offered them all, it is one.
    state = _pool(30)
    pods = [Pod("a", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI)]
    for candidates, status in ((24, "OPTIMAL_PRUNED"), (100, "OPTIMAL")):
        params = SolverParams(limits=Limits(time_limit_s=2.0, workers=1, candidates_per_pod=candidates))
        plan = CpSatPolicy(state.cluster, params).place(pods, state)
        assert (unplaced(plan), plan.stats.status) == ([], status)


LEAVING = (Taint("DeletionCandidateOfClusterAutoscaler", "1", "PreferNoSchedule"),)


def test_a_waiting_gang_does_not_keep_pods_the_model_left_out_from_being_filled() -> None:
    # 25 "pool" nodes with one idle GPU and room for one 1000m pod each (25 classes), then two
    # nodes the autoscaler means to remove.  The 25 pool pods need every pool node; "big" needs
    # "spare"; "a" ranks the pool nodes first and is offered no room the model leaves it, so it
    # is filled onto "spare2".  The gang of at least 2: "w2" fits nowhere yet, "w0" and "w1" do,
    # and are its minimum: they are placed, "w2" waits, and "a" still lands.
    k = 25
    spare = Node("spare", 64000, 65536, gpu_count=8, gpu_model="A100", soft_taints=LEAVING)
    state = _pool(k, [spare, Node("spare2", 2000, 8192, gpu_count=1, gpu_model="A100", soft_taints=LEAVING)])
    pods = [Pod("a", 1000, 1024)]
    pods += [Pod(f"b{i}", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI, node_selector=POOL_X) for i in range(k)]
    pods += [Pod("big", 63500, 1024, num_gpu=8, gpu_milli=GPU_MILLI)]
    train = Gang("train", min_members=2)
    pods += [Pod("w0", 500, 512, gang=train), Pod("w1", 500, 512, gang=train)]
    pods += [Pod("w2", 500, 512, num_gpu=16, gpu_milli=GPU_MILLI, gang=train)]
    plan = cpsat(pods, state)
    assert sorted(unplaced(plan)) == ["w2"]
    assert where(plan)["a"][0] == k + 1  # spare2
    assert plan.stats.status.endswith("+FILLED")  # placed after the model, in what its plan left
