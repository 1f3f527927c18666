"""Required pod anti-affinity: pods a term selects never share a topology domain with its pod."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.registry import POLICIES
from gpusched.solver.validate import plan_problems
from tests.factories import gpu_node, place_checked, pod

HOST = "kubernetes.io/hostname"


def term(app: str, key: str = HOST, namespaces: frozenset[str] | None = frozenset({"default"})) -> PodAffinityTerm:
    return PodAffinityTerm((Requirement("app", "In", (app,)),), namespaces, key)


def replica(name: str, app: str = "llm", key: str = HOST, gpus: int = 1) -> Pod:
    """A replica that keeps away from its own kind, as a Deployment's pods do."""
    return replace(pod(name, gpus=gpus), labels=(("app", app),), anti_affinity=(term(app, key),))


def zoned(count: int, per_zone: int = 2, gpus: int = 8) -> Cluster:
    nodes = [
        replace(gpu_node(f"n{i}", gpus=gpus), labels={HOST: f"n{i}", "zone": f"z{i // per_zone}"}) for i in range(count)
    ]
    return Cluster(nodes)


def solve(policy: str, c: Cluster, pods: list[Pod], state: ClusterState | None = None) -> Plan:
    return place_checked(policy, c, pods, state)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_puts_replicas_on_distinct_nodes_and_leaves_the_extra_one_out(policy: str) -> None:
    c = zoned(3)  # three 8-GPU nodes: room for all four 1-GPU replicas, on three nodes
    pods = [replica(f"llm-{i}") for i in range(4)] + [pod(f"other-{i}", gpus=1) for i in range(3)]
    plan = solve(policy, c, pods)
    nodes = [a.node for a in plan.assignments if a.pod.name.startswith("llm")]
    assert len(nodes) == 3
    assert len(set(nodes)) == 3
    assert sum(a.pod.name.startswith("other") for a in plan.assignments) == 3  # unlabelled pods go anywhere
    left = next(p for p in plan.unplaced if p.name.startswith("llm"))
    assert explain(left, c.empty_state().apply(plan.assignments)).message == (
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_zone_replicas_in_distinct_zones(policy: str) -> None:
    c = zoned(6, per_zone=2)  # three zones of two nodes
    pods = [replica(f"z-{i}", key="zone") for i in range(4)]
    plan = solve(policy, c, pods)
    zones = [c.nodes[a.node].labels["zone"] for a in plan.assignments]
    assert sorted(zones) == ["z0", "z1", "z2"]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_honours_the_terms_of_pods_already_running(policy: str) -> None:
    c = zoned(2)
    # A running pod that keeps web pods off its node; a web pod's own labels are all it has.
    guard = replace(pod("guard", gpus=1), anti_affinity=(term("web"),))
    state = c.empty_state().apply([Assignment(guard, 0, (0,))])
    web = replace(pod("web", gpus=1), labels=(("app", "web"),))
    plan = solve(policy, c, [web], state)
    assert [c.nodes[a.node].name for a in plan.assignments] == ["n1"]
    blocked = state.apply([Assignment(replace(pod("x", gpus=8)), 1, tuple(range(8)))])
    assert explain(web, blocked).message == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't satisfy existing pods "
        "anti-affinity rules."
    )


def test_a_term_counts_only_the_namespaces_it_names_and_nodes_with_its_label() -> None:
    nodes = [replace(gpu_node("a"), labels={"zone": "z0"}), replace(gpu_node("b"), labels={"zone": "z0"})]
    nodes.append(gpu_node("unlabelled"))
    c = Cluster(nodes)
    other_ns = replace(pod("elsewhere", gpus=1), labels=(("app", "llm"),), namespace="team-b")
    state = c.empty_state().apply([Assignment(other_ns, 0, (0,))])
    mine = replica("mine", key="zone")
    assert state.anti_mask(mine) is None  # team-b's pod is not in the term's namespace
    every_ns = replace(mine, anti_affinity=(term("llm", "zone", None),))
    mask = state.anti_mask(every_ns)
    assert mask is not None
    assert mask.tolist() == [False, False, True]


def test_release_forgets_a_pod_for_anti_affinity() -> None:
    c = zoned(1)
    a = Assignment(replica("one"), 0, (0,))
    state = c.empty_state().apply([a])
    mask = state.anti_mask(replica("two"))
    assert mask is not None
    assert not mask[0]
    assert state.release([a]).anti_mask(replica("two")) is None


def test_the_validator_rejects_replicas_on_one_node_or_next_to_a_running_one() -> None:
    c = zoned(2)
    one, two = replica("one"), replica("two")
    both = Plan((Assignment(one, 0, (0,)), Assignment(two, 0, (1,))), (), SolveStats("test"))
    assert any("pod default/two: required pod anti-affinity" in x for x in plan_problems(both, c.empty_state()))
    running = c.empty_state().apply([Assignment(one, 1, (0,))])
    beside = Plan((Assignment(two, 1, (1,)),), (), SolveStats("test"))
    assert any("forbids n1" in x for x in plan_problems(beside, running))
    apart = Plan((Assignment(two, 0, (0,)),), (), SolveStats("test"))
    assert plan_problems(apart, running) == []


def test_pods_a_term_selects_are_a_group_of_their_own() -> None:
    c = zoned(2)
    state = c.empty_state().apply([Assignment(replace(pod("guard", gpus=1), anti_affinity=(term("web"),)), 0, (0,))])
    web = replace(pod("web", gpus=1), labels=(("app", "web"),))
    plain = pod("plain", gpus=1)  # the same shape, but no term selects it
    inst = build_instance([web, plain], state, FragScorer(c, TypicalPods.from_pods([web])), Plan((), (web, plain)), 24)
    assert len(inst.groups) == 2
    web_group = next(gi for gi, g in enumerate(inst.groups) if g.pods[0].name == "web")
    assert {c.nodes[x.node].name for x in inst.candidates if x.group == web_group} == {"n1"}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_two_kinds_apart_when_one_excludes_the_other(policy: str) -> None:
    c = zoned(2)
    webs = [replace(pod(f"web-{i}", gpus=1), anti_affinity=(term("db"),)) for i in range(2)]
    db = replace(pod("db", gpus=2), labels=(("app", "db"),))
    plan = solve(policy, c, [*webs, db])
    where = {a.pod.name: a.node for a in plan.assignments}
    assert len(where) == 3  # packing alone would put all three on one node
    assert where["web-0"] == where["web-1"] != where["db"]


def test_a_selector_without_requirements_keeps_away_pods_without_labels_too() -> None:
    c = zoned(2)
    bare = replace(pod("bare", gpus=1), uid="u-bare")  # a pod of the API with no labels
    state = c.empty_state().apply([Assignment(bare, 0, (0,))])
    alone = replace(pod("alone", gpus=1), anti_affinity=(PodAffinityTerm((), None, HOST),))
    mask = state.anti_mask(alone)
    assert mask is not None
    assert mask.tolist() == [False, True]
