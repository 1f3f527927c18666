"""nodeSelector and required node affinity: a pod goes only to the nodes they allow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.model import Assignment, Cluster, Plan, SolveStats
from gpusched.model.affinity import Requirement
from gpusched.solver.explain import explain
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import POLICIES, make_policy
from gpusched.solver.validate import plan_problems, validate_plan
from tests.factories import gpu_node, pod

TRAIN = ((Requirement("pool", "In", ("train",)),),)


def cluster() -> Cluster:
    # Equal nodes but for their pool label: only a selector tells them apart.
    nodes = [replace(gpu_node(f"infer-{i}", gpus=4), labels={"pool": "infer"}) for i in range(3)]
    nodes += [replace(gpu_node(f"train-{i}", gpus=4), labels={"pool": "train"}) for i in range(2)]
    return Cluster(nodes)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_a_pod_only_where_its_volumes_and_its_selector_both_allow(policy: str) -> None:
    c = cluster()
    state = c.empty_state()
    on_train_1 = ((Requirement("metadata.name", "In", ("train-1", "infer-0"), field=True),),)
    # Its volume allows train-1 and infer-0, its selector the train pool: only train-1 is both.
    pinned = [replace(pod(f"pinned-{i}", gpus=2), node_selector=TRAIN, volume_selector=on_train_1) for i in range(3)]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pinned), 0, params).place(pinned, state)
    validate_plan(plan, state, pinned)
    assert sorted(c.nodes[a.node].name for a in plan.assignments) == ["train-1", "train-1"]
    assert len(plan.unplaced) == 1
    after = state.apply(plan.assignments)
    assert explain(plan.unplaced[0], after).message == (
        "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had volume node affinity conflict, "
        "3 node(s) didn't match Pod's node affinity/selector."
    )
    stray = Plan((Assignment(pinned[0], c.index["train-0"], (0, 1)),), (), SolveStats("TEST"))
    assert plan_problems(stray, state, pinned[:1]) == [
        "pod default/pinned-0: a volume it mounts cannot be used on train-0"
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_selected_pods_only_on_nodes_the_selector_allows(policy: str) -> None:
    c = cluster()
    state = c.empty_state()
    selected = [replace(pod(f"train-job-{i}", gpus=2), node_selector=TRAIN) for i in range(4)]
    extra = replace(pod("one-too-many", gpus=2), node_selector=TRAIN)
    anywhere = [pod(f"any-{i}", gpus=1) for i in range(3)]
    pods = [*selected, extra, *anywhere]
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, c, TypicalPods.from_pods(pods), 0, params).place(pods, state)
    validate_plan(plan, state, pods)
    where = {a.pod.name: c.nodes[a.node].name for a in plan.assignments}
    # Four 2-GPU pods fill both train nodes; the fifth has nowhere to go, however idle the rest.
    assert sorted(n for p, n in where.items() if p.startswith("train-job")) == ["train-0"] * 2 + ["train-1"] * 2
    assert "one-too-many" not in where
    assert all(p in where for p in ("any-0", "any-1", "any-2"))
    after = state.apply(plan.assignments)
    assert explain(extra, after).message == (
        "0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 node(s) didn't match Pod's node affinity/selector."
    )


def test_the_validator_rejects_a_pod_on_a_node_its_selector_does_not_allow() -> None:
    c = cluster()
    state = c.empty_state()
    p = replace(pod("p", gpus=1), node_selector=TRAIN)
    plan = Plan((Assignment(p, 0, (0,)),), (), SolveStats("test"))
    assert any("does not allow infer-0" in x for x in plan_problems(plan, state, [p]))


def test_candidate_nodes_of_a_selected_pod_are_all_allowed_even_when_they_look_alike() -> None:
    # The nodes differ only in a label, so without the selector they would be one class and its
    # first nodes (the infer ones) would stand for all of them.
    c = cluster()
    state = c.empty_state()
    pods = [replace(pod("train-job", gpus=2), node_selector=TRAIN), pod("any", gpus=1)]
    inst = build_instance(pods, state, FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    train = next(gi for gi, g in enumerate(inst.groups) if g.shape.node_selector)
    nodes = {c.nodes[x.node].name for x in inst.candidates if x.group == train}
    assert nodes
    assert nodes <= {"train-0", "train-1"}
