"""Required pod affinity: a pod goes only where a pod each of its terms selects runs."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
from ortools.sat.python import cp_model

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.model.pod import Gang
from gpusched.solver.constraints import affinity, capacity, demand, whole_gpu
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.registry import POLICIES
from gpusched.solver.solve import cp_solver
from gpusched.solver.validate import peer_order, plan_problems
from gpusched.solver.vars import Vars
from tests.factories import gpu_node, place_checked, pod
from tests.solver.test_constraints import Solved


def near(app: str, key: str = "zone") -> tuple[PodAffinityTerm, ...]:
    return (PodAffinityTerm((Requirement("app", "In", (app,)),), frozenset({"default"}), key),)


def zones(extra: int = 0) -> Cluster:
    nodes = [replace(gpu_node(f"{z}{i}", gpus=8), labels={"zone": z}) for z in ("a", "b", "c") for i in range(2)]
    return Cluster(nodes + [gpu_node(f"unzoned{i}", gpus=8) for i in range(extra)])


def solve(policy: str, c: Cluster, pods: list[Pod], state: ClusterState | None = None) -> Plan:
    return place_checked(policy, c, pods, state)


def zone_of(c: Cluster, plan: Plan) -> Counter[str]:
    return Counter(c.nodes[a.node].labels.get("zone", "-") for a in plan.assignments)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_puts_pods_in_the_zone_of_the_pod_they_follow(policy: str) -> None:
    c = zones(extra=1)
    cache = replace(pod("cache", gpus=1), labels=(("app", "cache"),))
    state = c.empty_state().apply([Assignment(cache, 3, (0,))])  # b1
    web = [replace(pod(f"web-{i}", gpus=2), affinity=near("cache")) for i in range(4)]
    plan = solve(policy, c, web, state)
    assert zone_of(c, plan) == {"b": 4}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_the_first_of_a_series_together(policy: str) -> None:
    c = zones(extra=1)
    series = [replace(pod(f"s-{i}", gpus=4), labels=(("app", "s"),), affinity=near("s")) for i in range(4)]
    plan = solve(policy, c, series)
    placed = zone_of(c, plan)
    assert len(placed) == 1  # none of them runs yet: the first goes anywhere, the rest join it
    assert "-" not in placed
    assert sum(placed.values()) == 4


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_leaves_out_a_pod_whose_match_runs_nowhere_and_says_why(policy: str) -> None:
    c = zones(extra=1)
    lonely = replace(pod("lonely", gpus=1), affinity=near("cache"))
    plan = solve(policy, c, [lonely, pod("other", gpus=1)])
    assert [p.name for p in plan.unplaced] == ["lonely"]
    assert explain(lonely, c.empty_state().apply(plan.assignments)).message == (
        "0/7 nodes are available: 7 node(s) didn't match pod affinity rules."
    )


def test_the_validator_checks_the_plan_order_and_peer_order_finds_one() -> None:
    c = zones()
    cache = replace(pod("cache", gpus=1), labels=(("app", "cache"),))
    web = replace(pod("web", gpus=1), affinity=near("cache"))
    wrong = (Assignment(web, 0, (0,)), Assignment(cache, 1, (0,)))  # web first: nothing to follow yet
    assert any(
        "web: required pod affinity forbids a0" in x
        for x in plan_problems(Plan(wrong, (), SolveStats("t")), c.empty_state())
    )
    right, stuck = peer_order(wrong, c.empty_state())
    assert stuck == []
    assert [a.pod.name for a in right] == ["cache", "web"]
    assert plan_problems(Plan(tuple(right), (), SolveStats("t")), c.empty_state()) == []


def test_affinity_module_puts_the_first_of_a_series_in_one_domain() -> None:
    c = Cluster([replace(gpu_node(f"n{z}", gpus=1), labels={"zone": z}) for z in ("a", "b")])
    series = [replace(pod(f"s-{i}", gpus=1), labels=(("app", "s"),), affinity=near("s")) for i in range(2)]
    inst = build_instance(
        series, c.empty_state(), FragScorer(c, TypicalPods.from_pods(series)), Plan((), tuple(series)), 24
    )
    assert Solved(inst, [demand, capacity, whole_gpu, affinity]).placed_pods() == 1  # one GPU per zone
    assert Solved(inst, [demand, capacity, whole_gpu]).placed_pods() == 2, "without the module each zone takes one"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_pod_whose_leader_cannot_be_placed_still_goes_first_of_its_series(policy: str) -> None:
    # p0 would follow p1 (both app=s), but p1 fits nowhere: p0, selecting itself with no app=s
    # pod anywhere, is the first of its series and goes alone rather than wait for ever.
    c = Cluster([replace(gpu_node("n0", gpus=2), labels={"zone": "a"})])
    p0 = replace(pod("p0", gpus=1), labels=(("app", "s"),), affinity=near("s"))
    p1 = replace(pod("p1", gpus=4), labels=(("app", "s"),))
    plan = solve(policy, c, [p0, p1, pod("other", gpus=1)])
    assert sorted(a.pod.name for a in plan.assignments) == ["other", "p0"]


def _term(key: str, value: str) -> PodAffinityTerm:
    return PodAffinityTerm((Requirement(key, "In", (value,)),), frozenset({"default"}), "zone")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_pod_follows_only_pods_that_all_its_terms_select(policy: str) -> None:
    # db runs in zone a and cache in zone b, but no pod is both: kube-scheduler refuses every node.
    c = zones()
    state = c.empty_state().apply(
        [
            Assignment(replace(pod("db", gpus=1), labels=(("app", "db"),)), 0, (0,)),
            Assignment(replace(pod("cache", gpus=1), labels=(("tier", "cache"),)), 2, (0,)),
        ]
    )
    both = replace(pod("both", gpus=1), affinity=(_term("app", "db"), _term("tier", "cache")))
    plan = solve(policy, c, [both], state)
    assert plan.assignments == ()
    # A pod that both terms select starts a series of its own: any zone will do.
    series = replace(both, name="series", labels=(("app", "db"), ("tier", "cache")))
    mask = state.pod_mask(series)
    assert mask.all()


@pytest.mark.parametrize("policy", POLICIES)
def test_unrelated_series_each_take_a_zone_of_their_own(policy: str) -> None:
    c = Cluster([replace(gpu_node(f"{z}0", gpus=4), labels={"zone": z}) for z in ("a", "b")])
    s = [replace(pod(f"s{i}", gpus=2), labels=(("app", "s"),), affinity=near("s")) for i in range(2)]
    t = [replace(pod(f"t{i}", gpus=2), labels=(("app", "t"),), affinity=near("t")) for i in range(2)]
    plan = solve(policy, c, s + t)
    where = {a.pod.name: c.nodes[a.node].labels["zone"] for a in plan.assignments}
    assert len(where) == 4
    assert where["s0"] == where["s1"] != where["t0"] == where["t1"]


def test_a_worker_may_start_its_series_before_its_launcher_goes_elsewhere() -> None:
    # kube-scheduler lets F go first (no job=x pod anywhere, it selects itself), then L anywhere.
    c = Cluster([replace(gpu_node(f"{z}0", gpus=1), labels={"zone": z}) for z in ("a", "b")])
    worker = replace(pod("F", gpus=1), labels=(("job", "x"),), affinity=(_term("job", "x"),))
    launcher = replace(pod("L", gpus=1), labels=(("job", "x"),))
    plan = solve("cpsat", c, [worker, launcher])
    assert len(plan.assignments) == 2


def test_a_series_is_not_stranded_in_a_small_domain_by_candidate_pruning() -> None:
    # 40 nodes of their own small zones with one idle GPU each rank first for packing; the one
    # zone with room for the whole series lies past the candidates a pod keeps (24 by default).
    small = [replace(gpu_node(f"s{i:02d}", gpus=2), labels={"zone": f"small-{i}"}) for i in range(40)]
    big = [replace(gpu_node(f"b{i}", gpus=8), labels={"zone": "big"}) for i in range(3)]
    c = Cluster(small + big)
    busy = pod("busy", gpus=1)
    state = c.empty_state().apply([Assignment(replace(busy, name=f"busy-{i}"), i, (0,)) for i in range(40)])
    series = [replace(pod(f"t-{i}", gpus=1), labels=(("app", "train"),), affinity=near("train")) for i in range(10)]
    plan = solve("cpsat", c, series, state)
    assert zone_of(c, plan) == {"big": 10}, plan.stats


# A series whose terms use two keys: a and b (both app=a) follow app=a pods, a by zone, b by rack,
# and none runs yet.  Each node has room for one of them.  kube-scheduler lets the first of them go
# anywhere; the other must then find it in its own domain: a on n1 then b on n3 (rack r1), or b on
# n2 then a on n3 (zone z0), and so on.  a and b on n1 and n2 is no plan: neither finds the other.
TWO_KEYS = {"n1": ("z1", "r1"), "n2": ("z0", "r2"), "n3": ("z0", "r1")}


def two_keys(order: str) -> tuple[Cluster, list[Pod]]:
    nodes = [
        replace(gpu_node(n, gpus=0, cpu=1000), labels={"zone": TWO_KEYS[n][0], "rack": TWO_KEYS[n][1]})
        for n in order.split()
    ]
    g = Gang("g")
    a, b = (
        replace(pod(name, cpu=1000), labels=(("app", "a"),), gang=g, affinity=near("a", key))
        for name, key in (("a", "zone"), ("b", "rack"))
    )
    return Cluster(nodes), [a, b]


@pytest.mark.parametrize("order", ["n1 n2 n3", "n3 n2 n1"])
def test_a_series_over_two_keys_is_placed_whole_in_an_order_that_binds(order: str) -> None:
    c, pods = two_keys(order)
    plan = solve("cpsat", c, pods)  # its own plan, checked valid in the order given
    assert sorted(a.pod.name for a in plan.assignments) == ["a", "b"], plan.stats
    assert plan_problems(plan, c.empty_state(), pods) == []


def test_affinity_module_starts_a_series_over_two_keys_on_one_node() -> None:
    # The module allows exactly the placements of both that kube-scheduler binds in some order.
    c, pods = two_keys("n3 n2 n1")
    inst = build_instance(pods, c.empty_state(), FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    model = cp_model.CpModel()
    v = Vars.create(inst, model)
    for m in (demand, capacity, affinity):
        m.build(inst, model, v)
    model.add(sum(v.x.values()) == 2)
    placements: list[tuple[Assignment, ...]] = []

    class Each(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            placements.append(
                tuple(
                    Assignment(inst.groups[cand.group].pods[0], cand.node)
                    for ci, cand in enumerate(inst.candidates)
                    if self.value(v.x[ci])
                )
            )

    solver = cp_solver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    assert solver.solve(model, Each()) == cp_model.OPTIMAL
    where = {tuple(sorted((a.pod.name, c.nodes[a.node].name) for a in p)) for p in placements}
    assert where == {
        (("a", "n1"), ("b", "n3")),
        (("a", "n2"), ("b", "n3")),
        (("a", "n3"), ("b", "n1")),
        (("a", "n3"), ("b", "n2")),
    }
    for p in placements:
        assert peer_order(p, c.empty_state())[1] == []


def test_peer_order_binds_first_the_pod_that_starts_a_series() -> None:
    # a on n3 (z0, r1) and b on n2 (z0, r2): a bound first leaves b no pod in rack r2 to follow;
    # b first goes anywhere, and a then finds it in zone z0.
    c, (a, b) = two_keys("n1 n2 n3")
    given = (Assignment(a, 2), Assignment(b, 1))
    assert plan_problems(Plan(given, (), SolveStats("t")), c.empty_state()) == [
        "pod default/b: required pod affinity forbids n2"
    ]
    ordered, stuck = peer_order(given, c.empty_state())
    assert stuck == []
    assert [x.pod.name for x in ordered] == ["b", "a"]
    assert plan_problems(Plan(tuple(ordered), (), SolveStats("t")), c.empty_state()) == []


def test_peer_order_past_its_deadline_keeps_the_first_order_it_finds() -> None:
    # As above, b must go first, which only the search for a series start finds; a deadline
    # already past leaves b for the next batch instead of searching on.
    c, (a, b) = two_keys("n1 n2 n3")
    given = (Assignment(a, 2), Assignment(b, 1))
    ordered, stuck = peer_order(given, c.empty_state(), deadline=time.perf_counter() - 1.0)
    assert ([x.pod.name for x in ordered], [x.pod.name for x in stuck]) == (["a"], ["b"])
    assert peer_order(given, c.empty_state(), deadline=time.perf_counter() + 60.0)[1] == []


def test_peer_order_looks_for_a_series_start_only_when_a_pod_with_affinity_is_stuck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranking the pods that may start a series costs time on every solve with such pods: none
    is needed when the plain order binds them all."""
    from gpusched.solver import validate

    def no(*_: object) -> Iterator[list[Assignment]]:
        raise AssertionError("series starts ranked though nothing was stuck")

    c, (a, b) = two_keys("n1 n2 n3")
    monkeypatch.setattr(validate, "_series_orders", no)
    ordered, stuck = peer_order((Assignment(b, 1), Assignment(a, 2)), c.empty_state())
    assert stuck == []
    assert [x.pod.name for x in ordered] == ["b", "a"]
