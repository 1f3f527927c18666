"""Preferred node affinity: weighed, never required."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ortools.sat.python import cp_model

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.solver.constraints import capacity, demand, whole_gpu
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.objectives import packing, placed, preference
from gpusched.solver.params import Limits, SolverParams, Weights
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.solve import cp_solver
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
    solver = cp_solver()
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
        solver = cp_solver()
        assert solver.solve(model) == cp_model.OPTIMAL
        return len({inst.candidates[ci].node for ci in v.x if solver.value(v.x[ci])})

    w = Weights(fragmentation=0, active_nodes=0, packing=1, keep_hint=0)
    assert nodes_used(w) == 3
    assert nodes_used(replace(w, preferred_affinity=0)) == 1, "without the term packing stacks them on h0"


@pytest.mark.parametrize("per_point", [100, 1000, 10**6])
def test_no_preference_keeps_out_a_pod_that_fits_whatever_its_weight(per_point: int) -> None:
    # a and b would rather run on the spot node; c may only run there.  Both fit elsewhere, c
    # does not: the plan must move a and b, not leave c out (the greedy warm start, taking the
    # pods in order, does leave c out).
    c = cluster()
    only_spot_b = ((Requirement("pool", "In", ("spot",)), Requirement("zone", "In", ("b",))),)
    wishes = [replace(pod(n, cpu=4000), preferred_nodes=((100, (Requirement("zone", "In", ("b",)),)),)) for n in "ab"]
    must = replace(pod("c", cpu=8000), node_selector=only_spot_b)
    params = SolverParams(weights=Weights(preferred_affinity=per_point), limits=Limits(time_limit_s=1.0, workers=1))
    batch = [*wishes, must]
    greedy = make_policy("fgd", c, TypicalPods.from_pods(batch), 0, params).place(batch, c.empty_state())
    assert [p.name for p in greedy.unplaced] == ["c"]
    plan = make_policy("cpsat", c, TypicalPods.from_pods(batch), 0, params).place(batch, c.empty_state())
    validate_plan(plan, c.empty_state(), batch)
    assert not plan.unplaced, plan.stats
    assert {c.nodes[a.node].name for a in plan.assignments if a.pod.name != "c"} != {"n1"}


ZONE = "topology.kubernetes.io/zone"


def _zones(per_zone: int = 2) -> Cluster:
    return Cluster(
        [
            replace(gpu_node(f"{z}{i}", gpus=8), labels={ZONE: z, "kubernetes.io/hostname": f"{z}{i}"})
            for z in "abc"
            for i in range(per_zone)
        ]
    )


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_replicas_beyond_the_domains_spread_evenly_counting_every_pod_already_there(policy: str) -> None:
    c = _zones()
    replica = replace(pod("r", gpus=1), labels=(("app", "llm"),), preferred_apart=_apart(100, ZONE))
    six = [replace(replica, name=f"r{i}") for i in range(6)]
    plan = make_policy(policy, c, TypicalPods.from_pods(six), 0, SolverParams()).place(six, c.empty_state())
    validate_plan(plan, c.empty_state(), six)
    per_zone = sorted(sum(c.nodes[a.node].labels[ZONE] == z for a in plan.assignments) for z in "abc")
    assert per_zone == [2, 2, 2]  # 4/1/1 breaks as many wishes once each, but more pairs
    # Two replicas already run in zone a and one in b: three more go c, c, b (or b, c, c).
    old = [Assignment(replace(replica, name=f"old{i}"), n, (0,)) for i, n in enumerate((0, 1, 2))]
    state = c.empty_state().apply(old)
    three = six[:3]
    plan = make_policy(policy, c, TypicalPods.from_pods(three), 0, SolverParams()).place(three, state)
    validate_plan(plan, state, three)
    added = sorted(c.nodes[a.node].labels[ZONE] for a in plan.assignments)
    assert added == ["b", "c", "c"]


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_replicas_stay_out_of_a_zone_crowded_with_pods_they_avoid_as_they_avoid_each_other(policy: str) -> None:
    # Ten replicas already run in zone a.  Each pod there counts as much as a new replica does:
    # six more go 3/3 to b and c (nine pairs), not 2/2/2 (three pairs, but twenty against zone a).
    c = _zones()
    replica = replace(pod("r", gpus=1), labels=(("app", "llm"),), preferred_apart=_apart(100, ZONE))
    old = [Assignment(replace(replica, name=f"old{i}"), i % 2, (i // 2,)) for i in range(10)]
    state = c.empty_state().apply(old)
    six = [replace(replica, name=f"r{i}") for i in range(6)]
    params = SolverParams(weights=Weights(keep_hint=0), limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(six), 0, params).place(six, state)
    validate_plan(plan, state, six)
    assert plan.stats.status != "HINT_KEPT"
    per_zone = {z: sum(c.nodes[a.node].labels[ZONE] == z for a in plan.assignments) for z in "abc"}
    assert per_zone == {"a": 0, "b": 3, "c": 3}


@pytest.mark.parametrize(("on", "kept", "left"), [(True, "n2", "n0"), (False, "n0", "n2")])
def test_preferences_off_do_not_pick_the_candidates_either(on: bool, kept: str, left: str) -> None:
    c = cluster()
    state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])  # n0 half full: packing's pick
    p = replace(pod("p", gpus=1), preferred_nodes=SPOT)  # n2 is the one it prefers
    scorer = FragScorer(c, TypicalPods.from_pods([p]))
    inst = build_instance([p], state, scorer, Plan((), (p,)), 1, preferences=on)
    offered = [c.nodes[cand.node].name for cand in inst.candidates]  # one, and an empty node (the escape)
    assert kept in offered
    assert left not in offered


def test_preferences_off_are_off_in_the_warm_start_too() -> None:
    c = cluster()
    state = c.empty_state().apply([Assignment(pod("old", gpus=2), 0, (0, 1))])  # n0 half full
    p = replace(pod("p", gpus=1), preferred_nodes=SPOT)
    off = SolverParams(weights=Weights(preferred_affinity=0), limits=Limits(time_limit_s=1.0, workers=1))

    def node(q: Pod) -> int:
        plan = make_policy("cpsat", c, TypicalPods.from_pods([q]), 0, off).place([q], state)
        return plan.assignments[0].node

    wishless = node(replace(p, preferred_nodes=()))
    assert wishless != 2, "the test needs a cluster where the wish changes the answer"
    assert node(p) == wishless  # the warm start did not follow the wish either


def test_a_zone_wish_keeps_the_best_candidates_of_each_zone_not_every_node() -> None:
    nodes = [
        replace(gpu_node(f"n{i}", gpus=8), labels={ZONE: "abc"[i % 3], "kubernetes.io/hostname": f"n{i}"})
        for i in range(600)
    ]
    c = Cluster(nodes)
    # 300 distinct fills, so few nodes are interchangeable.
    fill = [Assignment(pod(f"f{i}", cpu=10 * (i % 300), mem=1), i, ()) for i in range(600)]
    state = c.empty_state().apply(fill)
    wish = _apart(100, ZONE)
    replicas = [replace(pod(f"r{i}", gpus=1), labels=(("app", "llm"),), preferred_apart=wish) for i in range(5)]
    scorer = FragScorer(c, TypicalPods.from_pods(replicas))
    inst = build_instance(replicas, state, scorer, Plan((), tuple(replicas)), 24)
    per_zone: dict[str, int] = {}
    for cand in inst.candidates:
        z = c.nodes[cand.node].labels[ZONE]
        per_zone[z] = per_zone.get(z, 0) + 1
    assert sorted(per_zone) == ["a", "b", "c"]
    assert max(per_zone.values()) <= 24 + 1  # and the node with the most room


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_joins_the_zone_of_the_pods_it_prefers_to_be_near_while_there_is_room(policy: str) -> None:
    c = _zones(per_zone=1)
    cache = replace(pod("cache", gpus=1), labels=(("app", "cache"),))
    state = c.empty_state().apply([Assignment(cache, 1, (0,)), Assignment(pod("other", gpus=4), 0, (0, 1, 2, 3))])
    near = ((100, PodAffinityTerm((Requirement("app", "In", ("cache",)),), frozenset({"default"}), ZONE)),)
    pods = [replace(pod(f"w{i}", gpus=2), preferred_together=near) for i in range(5)]
    three = pods[:3]
    plan = make_policy(policy, c, TypicalPods.from_pods(three), 0, SolverParams()).place(three, state)
    validate_plan(plan, state, three)
    # Zone b (the cache's) has room for all three; packing alone would fill the busier zone a first.
    assert [c.nodes[a.node].labels[ZONE] for a in plan.assignments] == ["b", "b", "b"]
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, SolverParams()).place(pods, state)
    assert len(plan.assignments) == 5  # a wish, not a rule


def _db_on_h0() -> tuple[Cluster, ClusterState]:
    """Two hosts; on h0 a database that prefers batch pods on other hosts."""
    hosts = [replace(gpu_node(f"h{i}", gpus=8), labels={"kubernetes.io/hostname": f"h{i}"}) for i in range(2)]
    c = Cluster(hosts)
    batch_term = PodAffinityTerm(
        (Requirement("app", "In", ("batch",)),), frozenset({"default"}), "kubernetes.io/hostname"
    )
    db = replace(pod("db", gpus=4), labels=(("app", "db"),), preferred_apart=((100, batch_term),))
    return c, c.empty_state().apply([Assignment(db, 0, (0, 1, 2, 3))])


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_keeps_a_pod_off_the_node_of_a_placed_pod_whose_wish_selects_it(policy: str) -> None:
    # The database on h0 prefers batch pods elsewhere; the batch pod itself has no terms.  As
    # kube-scheduler does, its placement weighs the database's wish: h1, though h0 is fuller.
    c, state = _db_on_h0()
    job = replace(pod("job", gpus=1), labels=(("app", "batch"),))
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods([job]), 0, params).place([job], state)
    validate_plan(plan, state, [job])
    assert [c.nodes[a.node].name for a in plan.assignments] == ["h1"]


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_brings_a_pod_to_the_zone_of_a_placed_pod_that_wants_it_near(policy: str) -> None:
    c = _zones()
    web = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), ZONE)
    cache = replace(pod("cache"), labels=(("app", "cache"),), preferred_together=((100, web),))
    # Zone c holds the cache (CPU only); a0 is the fullest node, which packing alone would pick.
    state = c.empty_state().apply([Assignment(cache, 4), Assignment(pod("old", gpus=4), 0, (0, 1, 2, 3))])
    front = [replace(pod(f"web{i}", gpus=1), labels=(("app", "web"),)) for i in range(2)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(front), 0, params).place(front, state)
    validate_plan(plan, state, front)
    assert {c.nodes[a.node].labels[ZONE] for a in plan.assignments} == {"c"}


def test_pods_of_one_shape_that_placed_wishes_tell_apart_are_not_grouped_together() -> None:
    c, state = _db_on_h0()
    pods = [
        replace(pod("job", gpus=1), labels=(("app", "batch"),)),
        replace(pod("svc", gpus=1), labels=(("app", "svc"),)),
    ]
    inst = build_instance(pods, state, FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    assert sorted(g.pods[0].name for g in inst.groups) == ["job", "svc"]
    assert preference.wishes(inst, next(gi for gi, g in enumerate(inst.groups) if g.pods[0].name == "job"))
    assert not preference.wishes(inst, next(gi for gi, g in enumerate(inst.groups) if g.pods[0].name == "svc"))


def test_pods_that_no_placed_wish_tells_apart_stay_one_group_whatever_their_labels() -> None:
    # StatefulSet replicas differ in their pod-name label, which the database's term does not
    # look at: they are interchangeable, one group, as without the database.
    c, state = _db_on_h0()
    pods = [
        replace(pod(f"job{i}", gpus=1), labels=(("app", "batch"), ("statefulset.kubernetes.io/pod-name", f"job{i}")))
        for i in range(3)
    ]
    inst = build_instance(pods, state, FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    assert [len(g.pods) for g in inst.groups] == [3]
    assert preference.wishes(inst, 0)


def _web_and_cache(kind: str, keep_hint: int = 0) -> tuple[Cluster, ClusterState, list[Pod], SolverParams]:
    """Zones a, b, c; a0 the fullest node.  Two cache pods and two web pods in one batch, the web
    pods preferring (``kind``: apart or together) the cache pods' zone, the cache pods preferring zone c."""
    c = _zones()
    state = c.empty_state().apply([Assignment(pod("old", gpus=4), 0, (0, 1, 2, 3))])
    term = PodAffinityTerm((Requirement("app", "In", ("cache",)),), frozenset({"default"}), ZONE)
    caches = [
        replace(
            pod(f"cache{i}", gpus=1),
            labels=(("app", "cache"), ("statefulset.kubernetes.io/pod-name", f"cache{i}")),
            preferred_nodes=((100, (Requirement(ZONE, "In", ("c",)),)),) if kind == "together" else (),
        )
        for i in range(2)
    ]
    wish = {"preferred_apart": ((100, term),)} if kind == "apart" else {"preferred_together": ((100, term),)}
    webs = [replace(pod(f"web{i}", gpus=1), labels=(("app", "web"),), **wish) for i in range(2)]
    params = SolverParams(weights=Weights(keep_hint=keep_hint), limits=Limits(time_limit_s=1.0, workers=1))
    return c, state, webs + caches, params


def test_batch_pods_that_one_anothers_terms_weigh_are_grouped_by_them() -> None:
    # A proxy pod has the cache pods' shape, but no web pod's term selects it: a group of its own.
    c, state, pods, _ = _web_and_cache("apart")
    pods.append(replace(pod("proxy", gpus=1), labels=(("app", "proxy"),)))
    inst = build_instance(pods, state, FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    groups = sorted(sorted(p.name for p in g.pods) for g in inst.groups)
    assert groups == [["cache0", "cache1"], ["proxy"], ["web0", "web1"]]


def test_cpsat_keeps_batch_pods_out_of_the_zone_of_batch_pods_they_prefer_to_avoid() -> None:
    # Packing alone puts all four on a0; the web pods' wish is weighed jointly, not left to the
    # warm start (keepHint 0: the solver decides).
    c, state, pods, params = _web_and_cache("apart")
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    assert plan.stats.status != "HINT_KEPT"
    zones = {a.pod.name: c.nodes[a.node].labels[ZONE] for a in plan.assignments}
    assert len(zones) == 4
    assert {zones["web0"], zones["web1"]}.isdisjoint({zones["cache0"], zones["cache1"]})


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_every_policy_keeps_batch_pods_apart_as_they_come(policy: str) -> None:
    c, state, pods, params = _web_and_cache("apart", keep_hint=1)
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    zones = {a.pod.name: c.nodes[a.node].labels[ZONE] for a in plan.assignments}
    assert {zones["web0"], zones["web1"]}.isdisjoint({zones["cache0"], zones["cache1"]})


def test_cpsat_brings_batch_pods_to_the_zone_of_batch_pods_they_prefer_to_be_near() -> None:
    # The cache pods prefer zone c; the web pods follow them there rather than pack onto a0.
    c, state, pods, params = _web_and_cache("together")
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    zones = {a.pod.name: c.nodes[a.node].labels[ZONE] for a in plan.assignments}
    assert zones == dict.fromkeys(("web0", "web1", "cache0", "cache1"), "c")


@pytest.mark.parametrize("keep_hint", [0, Weights().keep_hint])
def test_cpsat_keeps_replicas_that_prefer_one_anothers_zone_together(keep_hint: int) -> None:
    # Four replicas prefer the zone of other pods of their app, and nothing runs yet: kube-scheduler,
    # placing them one by one, puts them all in the first one's zone (the warm start does too).
    # The solver, deciding alone (keepHint 0), keeps them together as well.
    c = Cluster([replace(gpu_node(f"n{i}", gpus=1, cpu=4000), labels={ZONE: "ab"[i % 2]}) for i in range(8)])
    near = ((100, PodAffinityTerm((Requirement("app", "In", ("a",)),), None, ZONE)),)
    replicas = [replace(pod(f"r{i}", gpus=1), labels=(("app", "a"),), preferred_together=near) for i in range(4)]
    params = SolverParams(weights=Weights(keep_hint=keep_hint), limits=Limits(time_limit_s=2.0, workers=1))
    plan = make_policy("cpsat", c, TypicalPods.from_pods(replicas), 0, params).place(replicas, c.empty_state())
    validate_plan(plan, c.empty_state(), replicas)
    assert plan.stats.status == "OPTIMAL"
    assert [c.nodes[a.node].labels[ZONE] for a in plan.assignments] in (["a"] * 4, ["b"] * 4)


@pytest.mark.parametrize("per_point", [100, 10**6])
def test_replicas_drawn_together_never_keep_out_a_pod_that_fits(per_point: int) -> None:
    # The two replicas prefer zone a and each other's zone: together there, they would take the
    # GPUs the third pod may only use there.  However much the wishes weigh, all three are placed.
    c = Cluster([replace(gpu_node(n, gpus=g), labels={ZONE: z}) for n, g, z in (("a0", 2, "a"), ("b0", 1, "b"))])
    near = ((100, PodAffinityTerm((Requirement("app", "In", ("r",)),), None, ZONE)),)
    in_a = ((100, (Requirement(ZONE, "In", ("a",)),)),)
    replicas = [
        replace(pod(f"r{i}", gpus=1), labels=(("app", "r"),), preferred_together=near, preferred_nodes=in_a)
        for i in range(2)
    ]
    only_a = replace(pod("w", gpus=1), node_selector=((Requirement(ZONE, "In", ("a",)),),))
    batch = [*replicas, only_a]
    weights = Weights(keep_hint=0, preferred_affinity=per_point)
    params = SolverParams(weights=weights, limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy("cpsat", c, TypicalPods.from_pods(batch), 0, params).place(batch, c.empty_state())
    validate_plan(plan, c.empty_state(), batch)
    assert not plan.unplaced, plan.stats


def test_a_pair_of_groups_is_scored_in_all_its_shared_domains_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    # Room for one domain only: scoring zone a alone would pull the cache pods out of zone c.
    monkeypatch.setattr(preference, "CROSS_DOMAINS", 1)
    c, state, pods, params = _web_and_cache("together")
    plan = make_policy("cpsat", c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    zones = {a.pod.name: c.nodes[a.node].labels[ZONE] for a in plan.assignments}
    assert zones["cache0"] == zones["cache1"] == "c"
