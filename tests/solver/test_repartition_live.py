"""Re-partitioning on a live cluster (``Cluster(repartition="idle-nodes")``): a node is given MIG
layouts only while none of its GPUs is in use, since which physical GPU a running pod holds is
not known there; every policy and the validator keep to it."""

from __future__ import annotations

import pytest

from gpusched.model import Assignment, Cluster, Node, Plan, Pod
from gpusched.model.cluster import live_mig_configs
from gpusched.solver.baselines import BestFitPolicy, FgdPolicy
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.validate import plan_problems, validate_plan
from tests.solver.test_constraints import cpsat
from tests.solver.test_topology import A100, mig_pod, used


def _nodes() -> list[Node]:
    return [Node(name, 64000, 262144, gpu_count=2, gpu_model=A100, mig_repartition=True) for name in ("busy", "idle")]


def test_only_a_node_with_every_gpu_idle_may_be_partitioned() -> None:
    live = Cluster(_nodes(), repartition="idle-nodes")
    state = used(live.empty_state(), 0, [0])
    assert state.full_free_gpus.tolist() == [1, 2]
    assert state.partitionable_gpus.tolist() == [0, 2]
    sim = Cluster(_nodes())  # the simulator's rule: any idle GPU
    assert used(sim.empty_state(), 0, [0]).partitionable_gpus.tolist() == [1, 2]
    off = Cluster(_nodes(), repartition="off")
    assert off.geometry == (None, None)
    assert off.empty_state().partitionable_gpus.tolist() == [0, 0]
    with pytest.raises(ValueError, match="idle-gpus, idle-nodes or off"):
        Cluster(_nodes(), repartition="some")  # type: ignore[arg-type]


def test_a_node_advertising_instances_is_not_partitioned_again_live() -> None:
    node = Node("m", 64000, 262144, gpu_count=1, gpu_model=A100, mig_repartition=True, mig_slices=(("1g.10gb", 7),))
    assert Cluster([node], repartition="idle-nodes").empty_state().partitionable_gpus.tolist() == [0]
    assert Cluster([node]).empty_state().partitionable_gpus.tolist() == [1]


def test_a_plan_may_partition_several_gpus_of_one_idle_node() -> None:
    live = Cluster(_nodes()[:1], repartition="idle-nodes")
    state = live.empty_state()
    part = live.geometry[0].layouts()[0]  # type: ignore[union-attr]
    once = state.partition([(0, 0, part)])
    assert once.partitionable_gpus.tolist() == [1], "its own partitions do not make the node busy"


@pytest.mark.parametrize("policy", ["cpsat", "fgd", "bestfit"])
def test_mig_pods_go_to_the_idle_node_and_never_partition_the_busy_one(policy: str) -> None:
    live = Cluster(_nodes(), repartition="idle-nodes")
    state = used(live.empty_state(), 0, [0])
    pods = [mig_pod(f"s{i}", "1g.10gb") for i in range(3)]
    if policy == "cpsat":
        plan = cpsat(pods, state)
    else:
        greedy = FgdPolicy(live, TypicalPods.from_pods(pods)) if policy == "fgd" else BestFitPolicy()
        plan = greedy.place(pods, state)
    validate_plan(plan, state, pods)
    assert len(plan.assignments) == 3
    assert {a.node for a in plan.assignments} == {1}
    assert {n for n, _, _ in plan.partitions} == {1}


def test_the_validator_refuses_a_partition_of_a_node_in_use() -> None:
    live = Cluster(_nodes(), repartition="idle-nodes")
    state = used(live.empty_state(), 0, [0])
    layout = live.geometry[0].layouts()[0]  # type: ignore[union-attr]
    bad = Plan((Assignment(mig_pod("s", next(iter(layout.counts))), 0),), (), partitions=((0, 1, layout),))
    assert any("while other GPUs of the node are in use" in p for p in plan_problems(bad, state))


def test_a_mig_pod_that_fits_nowhere_else_is_left_out_rather_than_partition_a_busy_node() -> None:
    live = Cluster(_nodes()[:1], repartition="idle-nodes")
    state = used(live.empty_state(), 0, [0])
    plan = cpsat([mig_pod("s", "1g.10gb"), Pod("w", 1000, 1024, num_gpu=1, gpu_milli=1000)], state)
    assert [a.pod.name for a in plan.assignments] == ["w"]
    assert not plan.partitions


def test_live_configs_are_named_by_their_content() -> None:
    live = Cluster([*_nodes(), Node("other", 64000, 262144, gpu_count=2, gpu_model=A100, mig_repartition=True)])
    layout = max(live.geometry[0].layouts(), key=lambda lay: lay.counts.get("1g.10gb", 0))  # type: ignore[union-attr]
    configs = live_mig_configs(live, [(0, 0, layout), (2, 0, layout), (1, 1, layout)])
    assert set(configs) == {"busy", "idle", "other"}
    assert configs["busy"] == configs["other"], "one layout, one configuration"
    name, entries = configs["idle"]
    assert name.startswith("gpusched-")
    assert name != configs["busy"][0]
    assert {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}} in entries
    assert {"devices": [0], "mig-enabled": False} in entries
    assert live_mig_configs(live, []) == {}
