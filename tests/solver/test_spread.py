"""Topology spread with whenUnsatisfiable: DoNotSchedule: no domain gets more than maxSkew counted
pods beyond the emptiest one the pod could go to."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.affinity import Requirement, Spread
from gpusched.model.pod import Toleration
from gpusched.solver import validate
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import peer_order, plan_problems, validate_plan
from tests.factories import gpu_node, place_checked, pod

LLM = (Requirement("app", "In", ("llm",)),)


def spread(skew: int = 1, key: str = "zone", **kw: object) -> Spread:
    return Spread(skew, key, LLM, "default", **kw)  # type: ignore[arg-type]


def replica(name: str, constraint: Spread | None = None, gpus: int = 1) -> Pod:
    c = constraint or spread()
    return replace(pod(name, gpus=gpus), labels=(("app", "llm"),), spread=(c,))


def zones(per_zone: int = 2, names: tuple[str, ...] = ("a", "b", "c"), extra: int = 0) -> Cluster:
    nodes = [
        replace(gpu_node(f"{z}{i}", gpus=8), labels={"zone": z, "pool": "gpu" if z != "c" else "other"})
        for z in names
        for i in range(per_zone)
    ]
    nodes += [gpu_node(f"unzoned{i}", gpus=8) for i in range(extra)]
    return Cluster(nodes)


def solve(policy: str, c: Cluster, pods: list[Pod], state: ClusterState | None = None) -> Plan:
    return place_checked(policy, c, pods, state, hint_kept=True)


def per_zone(c: Cluster, plan: Plan) -> Counter[str]:
    return Counter(c.nodes[a.node].labels.get("zone", "-") for a in plan.assignments)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_spreads_replicas_evenly_over_zones(policy: str) -> None:
    c = zones()
    plan = solve(policy, c, [replica(f"r{i}") for i in range(6)])
    assert per_zone(c, plan) == {"a": 2, "b": 2, "c": 2}  # packing alone would fill one zone's nodes


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_counts_the_pods_already_running(policy: str) -> None:
    c = zones()
    running = [Assignment(replace(pod(f"old{i}", gpus=1), labels=(("app", "llm"),)), 0, (i,)) for i in range(2)]
    state = c.empty_state().apply(running)  # zone a holds two already
    plan = solve(policy, c, [replica(f"r{i}") for i in range(5)], state)
    totals = per_zone(c, plan) + Counter({"a": 2})
    assert totals.total() == 7  # all five placed, zone a had two
    assert max(totals.values()) - min(totals.values()) == 1
    assert totals["a"] <= 3


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_leaves_out_what_would_break_the_skew_and_says_why(policy: str) -> None:
    c = zones(names=("a", "b"), extra=1)
    pods = [replica(f"r{i}", spread(min_domains=3)) for i in range(4)]  # 2 zones < 3: the emptiest counts 0
    plan = solve(policy, c, pods)
    assert per_zone(c, plan) == {"a": 1, "b": 1}  # never on the node without a zone
    left = plan.unplaced[0]
    assert explain(left, c.empty_state().apply(plan.assignments)).message == (
        "0/5 nodes are available: 1 node(s) didn't match pod topology spread constraints (missing required label), "
        "4 node(s) didn't match pod topology spread constraints."
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_only_zones_the_pod_could_go_to_count_unless_its_policy_says_ignore(policy: str) -> None:
    c = zones()  # zone c is pool "other", where the pods may not go
    gpu_pool = ((Requirement("pool", "In", ("gpu",)),),)
    honour = [replace(replica(f"h{i}"), node_selector=gpu_pool) for i in range(4)]
    assert per_zone(c, solve(policy, c, honour)) == {"a": 2, "b": 2}
    ignore = spread(honor_affinity=False)
    ignoring = [replace(replica(f"i{i}", ignore), node_selector=gpu_pool) for i in range(4)]
    assert per_zone(c, solve(policy, c, ignoring)) == {"a": 1, "b": 1}  # empty zone c holds the rest back


def test_pods_the_constraint_counts_weigh_even_without_a_constraint_of_their_own() -> None:
    c = zones(names=("a", "b"))
    plain = replace(pod("plain", gpus=1), labels=(("app", "llm"),))
    plan = solve("cpsat", c, [plain, replica("r0"), replica("r1")])
    assert per_zone(c, plan) in ({"a": 2, "b": 1}, {"a": 1, "b": 2})
    # Bound in the plan's order, each spread pod passes kube-scheduler's check.
    assert plan_problems(plan, c.empty_state()) == []


def test_the_validator_rejects_a_skewed_plan_and_peer_order_fixes_a_good_one() -> None:
    c = zones(names=("a", "b"), per_zone=1)
    state = c.empty_state()
    r = [replica(f"r{i}") for i in range(3)]
    skewed = Plan((Assignment(r[0], 0, (0,)), Assignment(r[1], 0, (1,))), (), SolveStats("test"))
    assert any("r1: its topology spread constraints do not allow a0" in x for x in plan_problems(skewed, state))
    # Ends even (a: 2, b: 1) but in this order the second pod to a0 goes while b0 is still empty.
    fine = [Assignment(r[0], 0, (0,)), Assignment(r[1], 0, (1,)), Assignment(r[2], 1, (0,))]
    assert plan_problems(Plan(tuple(fine), (), SolveStats("test")), state)
    ordered, stuck = peer_order(fine, state)
    assert stuck == []
    assert plan_problems(Plan(tuple(ordered), (), SolveStats("test")), state) == []


def test_peer_order_leaves_the_state_it_is_given_as_it_was() -> None:
    # A state made by apply owns its arrays and is the newest of its log: the one kind a pass
    # may update in place.  peer_order works on its own copies of it.
    c = zones(names=("a", "b"), per_zone=1)
    state = c.empty_state().apply([Assignment(pod("old", cpu=500), 1)])
    before = (state.cpu_used.copy(), state.gpu_used.copy())
    r = [replica(f"r{i}") for i in range(3)]
    ordered, stuck = peer_order(
        [Assignment(r[0], 0, (0,)), Assignment(r[1], 0, (1,)), Assignment(r[2], 1, (0,))], state
    )
    assert stuck == []
    assert [a.pod.name for a in ordered] == ["r0", "r2", "r1"]
    np.testing.assert_array_equal(state.cpu_used, before[0])
    np.testing.assert_array_equal(state.gpu_used, before[1])


def test_a_plan_listed_zone_by_zone_is_ordered_with_one_check_per_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    # 60 replicas, 20 per zone, each alone on its node, listed zone by zone: bound in that order
    # the second pod of zone a would already break the skew.  Each pod is checked once, not once
    # for every pod placed before it (what kept a 500-pod batch past its time limit).
    c = zones(per_zone=20)
    plan = [Assignment(replica(f"r{n}"), n, (0,)) for n in range(60)]
    checks = 0
    real = validate._Peers.affinity_ok  # the first of the checks of a pod on its node

    def counted(self: validate._Peers, p: Pod, node: int) -> bool:
        nonlocal checks
        checks += 1
        return real(self, p, node)

    monkeypatch.setattr(validate._Peers, "affinity_ok", counted)
    ordered, stuck = peer_order(plan, c.empty_state())
    assert stuck == []
    assert checks == len(plan)
    assert plan_problems(Plan(tuple(ordered), (), SolveStats("test")), c.empty_state()) == []


def test_the_batch_deadline_reaches_the_ordering_of_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ordering a plan with spread constraints may look for other orders (series starts); the
    # batch's time limit, or an earlier deadline it is given, bounds that search too.
    from gpusched.solver import solve as solve_module

    told: list[float | None] = []

    def recorded(
        assignments: list[Assignment], state: ClusterState, deadline: float | None = None
    ) -> tuple[list[Assignment], list[Assignment]]:
        told.append(deadline)
        return peer_order(assignments, state, deadline)

    monkeypatch.setattr(solve_module, "peer_order", recorded)
    c = zones()
    pods = [replica(f"r{i}") for i in range(6)]
    policy = solve_module.CpSatPolicy(c, SolverParams(limits=Limits(time_limit_s=30.0, workers=1)))
    before = time.perf_counter()
    policy.place(pods, c.empty_state())
    after = time.perf_counter()
    soon = time.perf_counter() + 20.0
    policy.place(pods, c.empty_state(), deadline=soon)
    assert len(told) == 2
    assert told[0] is not None
    assert before + 30.0 <= told[0] <= after + 30.0  # the limit counts from the call
    assert told[1] == soon


def test_only_pods_on_nodes_that_count_for_the_pod_are_counted() -> None:
    # Zone a's CPU node runs three llm pods, but the pod may only go to GPU-pool nodes
    # (nodeAffinityPolicy Honor): zone a counts 0 and zone b 2, so only a-gpu is allowed.
    c = Cluster(
        [
            replace(gpu_node("a-gpu"), labels={"zone": "a", "pool": "gpu"}),
            replace(gpu_node("a-cpu", gpus=0), labels={"zone": "a", "pool": "cpu"}),
            replace(gpu_node("b-gpu"), labels={"zone": "b", "pool": "gpu"}),
        ]
    )
    llm = replace(pod("x"), labels=(("app", "llm"),))
    state = c.empty_state().apply(
        [Assignment(replace(llm, name=f"cpu{i}"), 1) for i in range(3)]
        + [Assignment(replace(llm, name=f"gpu{i}"), 2) for i in range(2)]
    )
    new = replace(replica("new"), node_selector=((Requirement("pool", "In", ("gpu",)),),))
    assert [c.nodes[n].name for n in range(3) if state.pod_mask(new)[n]] == ["a-gpu"]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cordoned_nodes_zone_counts_unless_taints_are_honoured_and_terminating_pods_do_not(policy: str) -> None:
    c = zones(names=("a", "b"), per_zone=1)
    llm = replace(pod("x"), labels=(("app", "llm"),))
    state = c.empty_state().apply([Assignment(replace(llm, name="x"), 0), Assignment(replace(llm, name="y"), 1)])
    mask = state.spread_mask(replica("new"))
    assert mask is not None
    assert mask.tolist() == [True, True]
    # Zone c has only a cordoned node, with no llm pod: as for kube-scheduler (nodeTaintsPolicy
    # Ignore, the default) the emptiest domain now counts 0, so a and b are full, and the pod
    # cannot go to c either: it does not tolerate the cordon.
    cordoned = Cluster([*c.nodes, replace(gpu_node("c0", gpus=8), labels={"zone": "c"}, unschedulable=True)])
    both = cordoned.empty_state().apply([Assignment(replace(llm, name="x"), 0), Assignment(replace(llm, name="y"), 1)])
    mask = both.spread_mask(replica("new"))
    assert mask is not None
    assert mask.tolist() == [False, False, True]
    assert not place_checked(policy, cordoned, [replica("new")], both, hint_kept=True).assignments
    assert explain(replica("new"), both).reasons == {
        "node(s) didn't match pod topology spread constraints": 2,
        "node(s) were unschedulable": 1,
    }
    # Honouring taints leaves the cordoned node's zone out; so does tolerating the cordon, which
    # lets the pod go to c0 as well.
    honour = replica("new", spread(honor_taints=True))
    assert {a.node for a in place_checked(policy, cordoned, [honour], both, hint_kept=True).assignments} <= {0, 1}
    assert len(place_checked(policy, cordoned, [honour], both, hint_kept=True).assignments) == 1
    tolerant = replace(replica("new"), tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists"),))
    plan = place_checked(policy, cordoned, [tolerant], both, hint_kept=True)
    assert [a.node for a in plan.assignments] == [2]
    leaving = c.empty_state().apply(
        [Assignment(replace(llm, name="x"), 0), Assignment(replace(llm, name="y", terminating=True), 1)]
    )
    mask = leaving.spread_mask(replica("new"))
    assert mask is not None
    assert mask.tolist() == [False, True]  # b's only pod is being deleted: b counts 0


def test_cpsat_keeps_the_warm_start_where_the_end_state_reading_refuses_it() -> None:
    # p keeps its spread when bound before u (1 - 0 <= 1); the batch's end state has zone a two
    # ahead of the GPU-less zone b, which the model refuses.  CP-SAT must not place less.
    c = Cluster(
        [replace(gpu_node("a1", gpus=2), labels={"zone": "a"}), replace(gpu_node("b1", gpus=0), labels={"zone": "b"})]
    )
    counted = replace(pod("u", gpus=1), labels=(("app", "llm"),))
    pods = [replica("p"), counted, pod("big", gpus=8)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, c.empty_state())
    validate_plan(plan, c.empty_state(), pods)
    assert plan.stats.status == "HINT_KEPT"
    assert [a.pod.name for a in plan.assignments] == ["p", "u"]


def test_cpsat_with_two_constraints_per_pod_binds_what_it_can_order_and_defers_the_rest() -> None:
    # Four nodes, each its own (zone, rack) pair, and four replicas spread over both keys: the
    # model's end state may admit no bind order; the plan keeps the pods that have one.
    c = Cluster([replace(gpu_node(z + r, gpus=1), labels={"zone": z, "rack": r}) for z, r in ("ay", "by", "cx", "cz")])
    rack = Spread(1, "rack", LLM, "default")
    pods = [replace(replica(f"r{i}"), spread=(spread(), rack)) for i in range(4)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plans = {
        name: make_policy(name, c, TypicalPods.from_pods(pods), 0, params).place(pods, c.empty_state())
        for name in ("fgd", "cpsat")
    }
    validate_plan(plans["cpsat"], c.empty_state(), pods)
    assert "FALLBACK" not in plans["cpsat"].stats.status
    assert len(plans["cpsat"].assignments) >= len(plans["fgd"].assignments)


def test_pods_deferred_for_want_of_a_bind_order_leave_no_partition_behind() -> None:
    # MIG replicas spread over zones and nodes: the model's end state may admit no bind order, and
    # the pods without one wait for the next batch.  The GPUs the model partitioned for them stay
    # as they are: re-partitioning one drains its node (the MIG manager) for no pod.
    at = {"n0": ("z0", 2), "n1": ("z1", 1), "n2": ("z0", 2), "n3": ("z0", 1)}
    c = Cluster(
        [
            replace(
                gpu_node(n, gpus=gpus), gpu_model="A100-SXM4-40GB", mig_repartition=True, labels={"zone": z, "host": n}
            )
            for n, (z, gpus) in at.items()
        ]
    )
    a = (Requirement("app", "In", ("a",)),)
    both = (Spread(1, "zone", a, "default"), Spread(1, "host", a, "default"))
    profiles = ("3g.20gb", "3g.20gb", "2g.10gb", "3g.20gb", "3g.20gb")
    pods = [
        Pod(f"p{i}", 100, 10, mig_profile=p, labels=(("app", "a"),), uid=f"p{i}", spread=both)
        for i, p in enumerate(profiles)
    ]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, c.empty_state())
    validate_plan(plan, c.empty_state(), pods)
    assert "FALLBACK" not in plan.stats.status
    placed = {c.nodes[x.node].name for x in plan.assignments}
    assert {c.nodes[n].name for n, _, _ in plan.partitions} <= placed
