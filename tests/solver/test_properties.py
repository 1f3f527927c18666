"""Properties of every policy on random small clusters with random usage and random batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import event, example, given, settings, target
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.affinity import NodeSelector, PodAffinityTerm, Preference, Requirement, Spread
from gpusched.model.node import Taint
from gpusched.model.pod import Gang, Toleration
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.instance import Group, build_instance
from gpusched.solver.model import build_model, hint_from_plan
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.solve import CpSatPolicy, cp_solver
from gpusched.solver.validate import peer_problems, plan_problems, validate_plan

T = TypeVar("T")

MODELS = ("A100", "V100", "T4")
FAST = SolverParams(limits=Limits(time_limit_s=0.5, workers=1))
GREEDY = tuple(p for p in POLICIES if p != "cpsat")
POOLS = ("a", "b")
SELECTORS: tuple[NodeSelector, ...] = ((), (), ((Requirement("pool", "In", ("a",)),),))
A, B = (("app", "a"),), (("app", "b"),)


def _away(app: str, key: str) -> tuple[PodAffinityTerm, ...]:
    return (PodAffinityTerm((Requirement("app", "In", (app,)),), None, key),)


IDENTITIES: tuple[tuple[tuple[tuple[str, str], ...], tuple[PodAffinityTerm, ...]], ...] = (
    ((), ()),
    ((), ()),
    (A, _away("a", "host")),  # replicas, one per node
    (A, _away("a", "zone")),  # replicas, one per zone
    (B, ()),
    ((), _away("b", "zone")),  # keeps b pods out of its zone
)
_A_PODS = (Requirement("app", "In", ("a",)),)
SPREADS: tuple[tuple[Spread, ...], ...] = (
    (),
    (),
    (Spread(1, "zone", _A_PODS, "default"),),
    (Spread(1, "host", _A_PODS, "default", min_domains=2),),
    (Spread(2, "zone", _A_PODS, "default", honor_affinity=False),),
)
"""Hard spread over zones (not every node has one) or nodes, counting the ``app=a`` pods."""
AFFINITIES: tuple[tuple[PodAffinityTerm, ...], ...] = ((), (), (), _away("a", "zone"), _away("b", "host"))
"""Required pod affinity (the same terms, read as "near"): to the ``app=a`` pods' zone, or a ``b`` pod's node."""
"""Anti-affinity by node (every node its own ``host``) or by zone (not every node has one)."""


@dataclass(frozen=True)
class Case:
    state: ClusterState
    pods: tuple[Pod, ...]
    seed: int

    @property
    def typical(self) -> TypicalPods:
        return TypicalPods.from_pods(self.pods)

    def __repr__(self) -> str:
        s = self.state
        free = [[int(f) for f in s.gpu_free[n, : node.gpu_count]] for n, node in enumerate(s.cluster.nodes)]
        nodes = [
            f"{node.name}({node.gpu_model or '-'}: cpu {s.cpu_free[n]}/{node.cpu_milli}, "
            f"mem {s.mem_free[n]}/{node.memory_mib}, gpu free {free[n]})"
            for n, node in enumerate(s.cluster.nodes)
        ]
        pods = [
            f"{p.name}(cpu {p.cpu_milli}, mem {p.memory_mib}, {p.num_gpu}x{p.gpu_milli}"
            f"{', ' + '|'.join(sorted(p.gpu_models)) if p.gpu_models else ''}, prio {p.priority})"
            for p in self.pods
        ]
        return f"Case(seed={self.seed}, nodes=[{', '.join(nodes)}], pods=[{', '.join(pods)}])"


PORTS = [
    frozenset(),
    frozenset(),
    frozenset({"TCP/29500"}),  # on every address: clashes with both below
    frozenset({"TCP/29500@10.0.0.1"}),
    frozenset({"TCP/29500@10.0.0.2"}),
]


def rarely(draw: st.DrawFn, options: Sequence[T], otherwise: T, one_in: int = 5) -> T:
    """One of ``options`` once in ``one_in`` draws, else ``otherwise`` (what shrinking goes to):
    a rule on every pod would leave most pods fitting nowhere, and the policies nothing to place."""
    return draw(st.sampled_from(options)) if draw(st.sampled_from([False] * (one_in - 1) + [True])) else otherwise


@st.composite
def states(draw: st.DrawFn) -> ClusterState:
    """1-6 nodes, loaded below their capacity: most pods drawn fit some node."""
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(1, 8))
        nodes.append(
            Node(
                f"n{i}",
                cpu_milli=draw(st.integers(4, 32)) * 1000,
                memory_mib=draw(st.integers(4, 64)) * 1024,
                gpu_count=gpus,
                gpu_model=draw(st.sampled_from(MODELS)),
                labels={"pool": draw(st.sampled_from(POOLS)), "host": f"n{i}"}
                | ({"zone": z} if (z := draw(st.sampled_from(["z0", "z1", ""]))) else {}),
                storage_mib=draw(st.sampled_from([None, 2048, 8192])),
                unschedulable=rarely(draw, [True], False, one_in=8),  # cordoned: tainted
            )
        )
    cluster = Cluster(nodes)
    old: list[Assignment] = []
    for n, node in enumerate(cluster.nodes):
        for g in range(node.gpu_count):
            use = draw(st.sampled_from([0, 0, 0, 0, 0, GPU_MILLI, 100, 250, 500, 700, 900]))
            if use:
                old.append(Assignment(Pod(f"old-{n}-{g}", 0, 0, num_gpu=1, gpu_milli=use), n, (g,)))
        cpu = draw(st.integers(0, node.cpu_milli // 1000)) * 500  # at most half of it
        mem = draw(st.integers(0, node.memory_mib // 1024)) * 512
        storage = rarely(draw, [1024, 10000], 0)  # 10000 over-fills every node that counts
        ports = rarely(draw, PORTS[2:], frozenset(), one_in=3)
        labels, terms = rarely(draw, IDENTITIES[2:], ((), ()), one_in=2)
        if cpu or mem or storage or ports or labels or terms:
            old.append(
                Assignment(
                    Pod(
                        f"old-{n}", cpu, mem, storage_mib=storage, host_ports=ports, labels=labels, anti_affinity=terms
                    ),
                    n,
                )
            )
    return cluster.empty_state().apply(old)


@st.composite
def pod_shapes(draw: st.DrawFn, models: Sequence[str] = MODELS) -> Pod:
    """A pod of the batch; each rule it may have (GPU models among ``models``, those of the
    nodes, or one no node has; node selector, ports, storage, peers) drawn rarely."""
    kind = draw(st.sampled_from(["cpu", "frac", "frac", "whole", "whole"]))
    num_gpu, milli = 0, 0
    if kind == "frac":
        num_gpu = 1
        milli = draw(st.one_of(st.sampled_from([100, 250, 300, 500, 700]), st.integers(1, GPU_MILLI - 1)))
    elif kind == "whole":
        num_gpu, milli = draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8])), GPU_MILLI
    wanted = sorted({*models, "H100"})
    models_of = frozenset(draw(st.sets(st.sampled_from(wanted), min_size=1, max_size=2))) if num_gpu else frozenset()
    identity = rarely(draw, IDENTITIES[2:], ((), ()), one_in=3)
    return Pod(
        "shape",
        cpu_milli=draw(st.integers(0, 8)) * 500,
        memory_mib=draw(st.integers(0, 8)) * 512,
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_models=rarely(draw, [models_of], frozenset()),
        node_selector=rarely(draw, SELECTORS[2:], ()),
        storage_mib=rarely(draw, [1024, 4096], 0),
        host_ports=rarely(draw, PORTS[1:], frozenset()),
        labels=identity[0],
        anti_affinity=identity[1],
        spread=rarely(draw, SPREADS[2:], ()),
        affinity=rarely(draw, AFFINITIES[3:], (), one_in=10),  # only the peers drawn can meet it
        preferred_apart=draw(st.sampled_from(((), (), ((50, _away("a", "host")[0]),), ((30, _away("a", "zone")[0]),)))),
        preferred_together=draw(st.sampled_from(((), (), ((40, _away("a", "zone")[0]),)))),
        tolerations=draw(st.sampled_from(((), (), (Toleration("node.kubernetes.io/unschedulable", "Exists"),)))),
    )


@st.composite
def batch_pods(draw: st.DrawFn, models: Sequence[str] = MODELS) -> tuple[Pod, ...]:
    """1-8 pods of 1-4 shapes (repeated shapes make groups), with priorities."""
    shapes = draw(st.lists(pod_shapes(models), min_size=1, max_size=4))
    return tuple(
        replace(draw(st.sampled_from(shapes)), name=f"p{i}", priority=draw(st.integers(0, 1)))
        for i in range(draw(st.integers(1, 8)))
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    state = draw(states())
    models = sorted({n.gpu_model for n in state.cluster.nodes if n.gpu_model})
    return Case(state, draw(batch_pods(models)), draw(st.integers(0, 3)))


def run(name: str, case: Case) -> Plan:
    policy = make_policy(name, case.state.cluster, case.typical, case.seed, FAST)
    s = case.state
    before = [a.copy() for a in (s.cpu_used, s.mem_used, s.gpu_used, s.kinds, s.mig, s.cpu_free, s.gpu_free)]
    plan = policy.place(case.pods, s)
    # The caller's state is the caller's: a policy updates in place only states it made itself.
    after = (s.cpu_used, s.mem_used, s.gpu_used, s.kinds, s.mig, s.cpu_free, s.gpu_free)
    for was, now in zip(before, after, strict=True):
        np.testing.assert_array_equal(was, now)
    validate_plan(plan, case.state, case.pods)
    assert len(plan.assignments) + len(plan.unplaced) == len(case.pods)
    return plan


def no_pod_could_go_anywhere(plan: Plan, state: ClusterState) -> None:
    """Each pod a policy leaves out does not fit on the state the plan leaves behind."""
    after = state.apply(plan.assignments)
    for p in plan.unplaced:
        assert not after.pod_mask(p).any(), f"{p.key} fits but was left out"


@pytest.mark.parametrize("name", GREEDY)
@settings(max_examples=100, deadline=None)
@given(cases())
def test_greedy_plans_are_valid_and_leave_out_only_pods_that_do_not_fit(name: str, case: Case) -> None:
    plan = run(name, case)
    no_pod_could_go_anywhere(plan, case.state)
    assert plan.stats.policy == name
    event("placed some" if plan.assignments else "placed none")
    target(float(len(plan.assignments)), label="pods placed")


@settings(max_examples=40, deadline=None)
@given(cases())
def test_cpsat_plan_is_valid_and_solved(case: Case) -> None:
    plan = run("cpsat", case)
    s = plan.stats
    assert s.status.removesuffix("+FILLED") in {
        "OPTIMAL",
        "OPTIMAL_PRUNED",
        "FEASIBLE",
        "NO_CANDIDATES",
        "HINT_KEPT",
    }, s.status
    if s.status == "HINT_KEPT":  # see hinted_model_solves
        assert any(p.spread or p.affinity for p in case.pods)
        return
    assert s.objective <= s.bound + 1e-6
    assert s.gap_pct >= 0
    if s.status == "NO_CANDIDATES":
        assert plan.assignments == ()
        for p in case.pods:
            assert not case.state.pod_mask(p).any()


# One 50-thousandths share competes for CPU with two CPU-only pods: FGD, in arrival order,
# places the share; CP-SAT's default weights value two pods (2 x 100_000) above the share
# (50 x 1000 + 100_000) and place no GPU demand at all.
_SHARE_OR_TWO_CPU_PODS = Case(
    Cluster([Node("a", 2000, 4096, gpu_count=1, gpu_model="A100")]).empty_state(),
    (Pod("share", 2000, 0, num_gpu=1, gpu_milli=50), Pod("cpu-1", 1000, 0), Pod("cpu-2", 1000, 0)),
    0,
)


@example(_SHARE_OR_TWO_CPU_PODS)
@settings(max_examples=40, deadline=None)
@given(cases())
def test_cpsat_never_places_fewer_pods_and_less_gpu_than_its_fgd_warm_start(case: Case) -> None:
    # The objective counts pods and GPU demand (placedPods, placedGpu), so CP-SAT may trade
    # GPU demand for more pods, or pods for more GPU demand, but never lose on both.
    plan = run("cpsat", case)
    fgd = run("fgd", case)
    names = [a.pod.name for a in plan.assignments], [a.pod.name for a in fgd.assignments]
    assert len(plan.assignments) >= len(fgd.assignments) or plan.placed_gpu_milli >= fgd.placed_gpu_milli, (
        f"cpsat placed {names[0]}, fgd placed {names[1]}"
    )


def _follows_a_follower(groups: Sequence[Group], terms: Sequence[PodAffinityTerm]) -> bool:
    """Some group's required pod affinity selects another batch group that has affinity of its own."""
    return any(
        g.shape.affinity
        and any(
            hi != gi and other.shape.affinity and {terms.index(t) for t in g.shape.affinity} & set(other.selected_by)
            for hi, other in enumerate(groups)
        )
        for gi, g in enumerate(groups)
    )


def hinted_model_solves(pods: tuple[Pod, ...], state: ClusterState, typical: TypicalPods, seed: int) -> float | None:
    """Objective of the CP-SAT policy's own warm start (FGD) as a complete hint with every
    variable fixed to it (None when nothing fits); fails when the hint leaves a variable out or
    violates the model.  The very warm start ``run("cpsat", ...)`` starts from: the model
    rewards keeping it (``keepHint``), so another would be scored by another objective."""
    policy = make_policy("cpsat", state.cluster, typical, seed, FAST)
    assert isinstance(policy, CpSatPolicy)
    hint = policy._greedy(pods, state)
    inst = build_instance(pods, state, policy.greedy.scorer, hint, FAST.limits.candidates_per_pod)
    if not inst.candidates:
        return None
    model, v = build_model(inst, FAST.weights)
    hint_from_plan(inst, model, v)
    if _follows_a_follower(inst.groups, inst.terms):
        # A group whose required affinity only a group with affinity of its own can meet has no
        # candidate there (``instance.followed``): the warm start, placing pod after pod, puts
        # it beside that group; the model leaves it for the next batch, and the solver keeps the
        # warm start when that places more (HINT_KEPT).  The test above checks it never places less.
        return None
    assert len(model.proto.solution_hint.vars) == len(model.proto.variables)
    solver = cp_solver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    code = solver.solve(model)
    if code != cp_model.OPTIMAL and any(p.spread for p in pods):
        # The model reads spread constraints over the batch's end state, which can refuse a warm
        # start that kept every skew pod by pod; the solver then keeps the warm start (HINT_KEPT),
        # and the test above checks that it never places less.
        return None
    assert code == cp_model.OPTIMAL, "the hint violates the model"
    return float(solver.objective_value)


@settings(max_examples=40, deadline=None)
@given(cases())
def test_fgd_warm_start_is_a_complete_feasible_solution_and_cpsat_never_scores_below_it(case: Case) -> None:
    hinted = hinted_model_solves(case.pods, case.state, case.typical, case.seed)
    if hinted is None:
        return
    plan = run("cpsat", case)
    assert plan.stats.objective >= hinted - 1e-6


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_the_validators_peer_rules_agree_with_the_masks_the_policies_prune_by(case: Case, data: st.DataObject) -> None:
    """``validate.peer_problems`` reads pod affinity, anti-affinity and spread from the rules
    themselves; the policies prune with ``ClusterState``'s masks.  Over random plans (valid or
    not) the two must agree pod by pod, so that neither a mask bug passes unseen nor a valid
    plan is refused."""
    n = len(case.state.cluster)
    nodes = data.draw(st.lists(st.integers(0, n - 1), min_size=len(case.pods), max_size=len(case.pods)))
    plan = [Assignment(p, node) for p, node in zip(case.pods, nodes, strict=True)]
    state, by_masks = case.state, []
    for a in plan:
        fine = state.peer_mask(a.pod)
        if fine is not None and not fine[a.node]:
            by_masks.append(a.pod.key)
        state = state.apply((a,))
    by_rules = [p.split(":")[0].removeprefix("pod ") for p in peer_problems(plan, case.state)]
    assert sorted(set(by_rules)) == sorted(by_masks)


@settings(max_examples=200, deadline=None)
@given(cases())
def test_explain_counts_as_fitting_exactly_the_nodes_the_policies_may_use(case: Case) -> None:
    # A pod told "0/N nodes are available" must have no node to go to, and one told that
    # k nodes fit must have k, cordoned nodes and their taints included.
    for p in case.pods:
        e = explain(p, case.state)
        assert e.total == len(case.state.cluster)
        assert e.fits == int(case.state.pod_mask(p).sum()), e.message


# --- crowded clusters: gangs, MIG, islands, pod limits, soft taints, pruning --------------------

A100 = "A100-SXM4-80GB"
LEAVING = (Taint("DeletionCandidateOfClusterAutoscaler", "1", "PreferNoSchedule"),)
RACK_R1: Preference = ((60, (Requirement("rack", "In", ("r1",)),)),)
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")
SPARE = Node("spare", 256_000, 1 << 20, gpu_count=8, gpu_model=A100)
"""Room for a whole batch of the plain pods below: empty, so it ranks last for packing."""


@dataclass(frozen=True)
class Crowded:
    state: ClusterState
    pods: tuple[Pod, ...]
    candidates: int

    def __repr__(self) -> str:
        s = self.state
        nodes = [
            f"{node.name}(cpu {s.cpu_free[n]}, mem {s.mem_free[n]}, gpu free {s.gpu_free[n, : node.gpu_count].tolist()}"
            f"{', mig' if node.mig_repartition else ''}{', islands' if node.gpu_islands else ''}"
            f"{', max ' + str(node.max_pods) if node.max_pods else ''}{', leaving' if node.soft_taints else ''})"
            for n, node in enumerate(s.cluster.nodes)
        ]
        pods = [
            f"{p.name}(cpu {p.cpu_milli}, mem {p.memory_mib}, {p.num_gpu}x{p.gpu_milli}"
            f"{' ' + p.mig_profile if p.mig_profile else ''}{' island ' + p.island if p.island else ''}"
            f"{f' gang {p.gang}' if p.gang else ''})"
            for p in self.pods
        ]
        return f"Crowded(candidates={self.candidates}, nodes=[{', '.join(nodes)}], pods=[{', '.join(pods)}])"

    @property
    def spare_holds_the_batch(self) -> bool:
        """The spare alone has room for every pod of the batch that takes whole GPUs or shares
        (each share counted as a GPU), CPU and memory: nothing competes for what plain pods need."""
        spare = self.state.cluster.nodes[-1]
        gpus = sum(p.num_gpu for p in self.pods if not p.mig_profile)
        cpu = sum(p.cpu_milli for p in self.pods)
        mem = sum(p.memory_mib for p in self.pods)
        return spare.name == "spare" and gpus <= spare.gpu_count and cpu <= spare.cpu_milli and mem <= spare.memory_mib


@st.composite
def crowded(draw: st.DrawFn) -> Crowded:
    """3-12 nodes of every kind (GPU nodes in racks with random use, pod limits and soft taints,
    MIG nodes that may be re-partitioned, nodes of two GPU islands, CPU nodes), then maybe the
    spare; a batch of plain pods, shares, MIG slices, island pods and gangs (some whose members
    disagree on the minimum); a candidatesPerPod of 1-3 (or 24), below the node classes, so
    that pruning leaves classes out."""
    nodes: list[Node] = []
    for i in range(draw(st.integers(3, 12))):
        kind = draw(st.sampled_from(["gpu", "gpu", "mig", "islands", "cpu"]))
        cpu, mem = draw(st.integers(2, 32)) * 1000, draw(st.integers(2, 64)) * 1024
        extra = {
            "labels": {"rack": draw(st.sampled_from(["r0", "r1", ""]))},
            "max_pods": draw(st.sampled_from([None, None, 1, 2, 3])),
            "soft_taints": draw(st.sampled_from([(), (), LEAVING])),
        }
        if kind == "gpu":
            nodes.append(Node(f"n{i}", cpu, mem, gpu_count=draw(st.integers(1, 8)), gpu_model=A100, **extra))
        elif kind == "mig":
            nodes.append(
                Node(f"n{i}", cpu, mem, gpu_count=draw(st.integers(1, 2)), gpu_model=A100, mig_repartition=True)
            )
        elif kind == "islands":
            nodes.append(Node(f"n{i}", cpu, mem, gpu_count=4, gpu_model=A100, gpu_islands=(0, 0, 1, 1), **extra))
        else:
            nodes.append(Node(f"n{i}", cpu, mem, **extra))
    if draw(st.sampled_from([True, True, True, False])):
        nodes.append(replace(SPARE, soft_taints=draw(st.sampled_from([(), LEAVING]))))
    cluster = Cluster(nodes)
    old: list[Assignment] = []
    for n, node in enumerate(nodes[: len(nodes) - (nodes[-1].name == "spare")]):
        for g in range(node.gpu_count if not node.mig_repartition else 0):
            use = draw(st.sampled_from([0, 0, GPU_MILLI, 250, 500]))
            if use:
                old.append(Assignment(Pod(f"old-{n}-{g}", 0, 0, num_gpu=1, gpu_milli=use), n, (g,)))
        if cpu := draw(st.integers(0, node.cpu_milli // 1000)) * 1000:
            old.append(Assignment(Pod(f"old-{n}", cpu, 0), n))
    state = cluster.empty_state().apply(old)
    pods: list[Pod] = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["cpu", "whole", "share", "mig", "island"]))
        cpu, mem = draw(st.integers(0, 4)) * 500, draw(st.integers(0, 4)) * 512
        wish = {
            "preferred_nodes": draw(st.sampled_from([(), RACK_R1])),
            "tolerations": draw(st.sampled_from([(), (Toleration("DeletionCandidateOfClusterAutoscaler", "Exists"),)])),
        }
        if kind == "cpu":
            pods.append(Pod(f"p{i}", cpu, mem, **wish))
        elif kind == "whole":
            pods.append(Pod(f"p{i}", cpu, mem, num_gpu=draw(st.sampled_from([1, 1, 2])), gpu_milli=GPU_MILLI, **wish))
        elif kind == "share":
            pods.append(Pod(f"p{i}", cpu, mem, num_gpu=1, gpu_milli=draw(st.sampled_from([250, 500, 700])), **wish))
        elif kind == "mig":
            pods.append(Pod(f"p{i}", cpu, mem, mig_profile=draw(st.sampled_from(PROFILES))))
        else:
            mode = draw(st.sampled_from(["required", "preferred"]))
            pods.append(Pod(f"p{i}", cpu, mem, num_gpu=2, gpu_milli=GPU_MILLI, island=mode, **wish))
    for k in range(draw(st.integers(0, 2))):
        size = draw(st.integers(1, 3))
        topology = draw(st.sampled_from(["", "required", "preferred"]))
        team = Gang(f"g{k}", draw(st.integers(1, size)), "rack" if topology else "", topology)
        gpus = [draw(st.sampled_from([0, 0, 1, 2])) for _ in range(size)]
        members = [
            Pod(f"g{k}-{j}", 500, 512, num_gpu=g, gpu_milli=GPU_MILLI if g else 0, gang=team)
            for j, g in enumerate(gpus)
        ]
        if size > 1 and draw(st.booleans()):  # a member from another template: the gang is refused whole
            members[-1] = replace(members[-1], gang=replace(team, min_members=team.min_members % size + 1))
        pods.extend(members)
    return Crowded(state, tuple(draw(st.permutations(pods))), draw(st.sampled_from([1, 2, 3, 24])))


@pytest.mark.parametrize("name", ["cpsat", "fgd"])
@settings(max_examples=60, deadline=None)
@given(crowded())
def test_plans_on_crowded_clusters_are_valid_and_leave_out_no_plain_pod_the_spare_holds(
    name: str, case: Crowded
) -> None:
    params = SolverParams(limits=Limits(time_limit_s=0.5, workers=1, candidates_per_pod=case.candidates))
    plan = make_policy(name, case.state.cluster, TypicalPods.from_pods(case.pods), 0, params).place(
        case.pods, case.state
    )
    assert plan_problems(plan, case.state, case.pods) == [], plan.stats.status
    after = case.state.partition(plan.partitions).apply(plan.assignments)
    fit = [p.name for p in plan.unplaced if p.gang is None and after.pod_mask(p).any()]
    assert fit == [], f"{plan.stats.status}: left out, though they fit where the plan leaves room"
    if case.spare_holds_the_batch:
        # Whatever the rest of the batch asks, the spare has room for it: a pod without a gang or
        # a MIG slice that waits is one the scheduler could have bound.
        left = [p.name for p in plan.unplaced if p.gang is None and not p.mig_profile]
        assert left == [], plan.stats.status
