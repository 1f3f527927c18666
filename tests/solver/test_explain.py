"""Explanations count every node under its first failing filter (every resource it lacks when
that is the resource filter), as kube-scheduler does."""

from __future__ import annotations

from dataclasses import replace

from gpusched.model import Assignment, Cluster
from gpusched.model.node import Taint
from gpusched.model.pod import Gang, Toleration
from gpusched.solver.explain import explain, explain_gang, together
from tests.factories import gpu_node, pod


def test_message_counts_reasons_like_kube_scheduler() -> None:
    nodes = [gpu_node(f"a{i}", gpus=2, model="A100") for i in range(8)] + [
        gpu_node(f"h{i}", gpus=8, model="H800") for i in range(4)
    ]
    cluster = Cluster(nodes)
    state = cluster.empty_state()
    e = explain(pod("big", gpus=4, models=["A100"]), state)
    assert e.fits == 0
    assert e.message == "0/12 nodes are available: 4 GPU model not accepted, 8 Insufficient nvidia.com/gpu."
    assert e.reason == "Insufficient nvidia.com/gpu"


def test_cpu_memory_share_and_cordoned_nodes() -> None:
    cordoned = replace(gpu_node("d", gpus=1, cpu=1000), unschedulable=True, taints=(Taint("gpu", "bad"),))
    cluster = Cluster([gpu_node("a", gpus=1, cpu=1000), gpu_node("b", gpus=1), gpu_node("c", gpus=0), cordoned])
    state = cluster.empty_state().apply([Assignment(pod("x", gpus=1, milli=800), 1, (0,))])
    e = explain(pod("p", cpu=2000, gpus=1, milli=500), state)
    assert dict(e.reasons) == {
        "Insufficient cpu": 1,
        "insufficient GPU share": 1,
        "Insufficient nvidia.com/gpu": 1,
        "node(s) were unschedulable": 1,
    }
    assert e.total == 4
    assert sum(e.reasons.values()) == 4
    # Tolerating the cordon, the pod meets the cordoned node's other taint, then nothing else
    # (kube-scheduler stops at a node's first failing filter).
    tolerant = replace(pod("p", gpus=1), tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists"),))
    e = explain(tolerant, cluster.empty_state())
    assert (e.fits, dict(e.reasons)) == (
        2,
        {"node(s) had untolerated taint {gpu: bad}": 1, "Insufficient nvidia.com/gpu": 1},
    )
    e = explain(replace(tolerant, tolerations=(Toleration(operator="Exists"),)), cluster.empty_state())
    assert (e.fits, dict(e.reasons)) == (3, {"Insufficient nvidia.com/gpu": 1})


def test_a_pod_that_fits_is_reported_as_deferred() -> None:
    cluster = Cluster([gpu_node("a", gpus=2)])
    e = explain(pod("p", gpus=1), cluster.empty_state())
    assert e.fits == 1
    assert e.message.startswith("1/1 nodes could take the pod now")


def test_a_gang_that_does_not_fit_whole_says_how_many_nodes_could_take_one_member() -> None:
    state = Cluster([gpu_node("a", gpus=1)]).empty_state()
    member = replace(pod("m1", gpus=1), gang=Gang("ns/g", min_members=2))
    assert explain_gang(member, 2, state) == (
        "gang ns/g: its 2 members do not all fit at once; 1/1 nodes could take this member alone."
    )
    assert explain_gang(member, 1, state).startswith("gang ns/g: 1 of at least 2 members are pending;")


def test_a_gang_with_more_members_than_its_minimum_is_told_its_minimum_does_not_fit() -> None:
    state = Cluster([gpu_node("a", gpus=1)]).empty_state()
    member = replace(pod("m1", gpus=1), gang=Gang("ns/g", min_members=2))
    assert explain_gang(member, 3, state) == (
        "gang ns/g: no 2 of its 3 members fit at once; 1/1 nodes could take this member alone."
    )


def test_a_gang_short_of_its_minimum_is_told_how_many_must_be_placed_together() -> None:
    state = Cluster([gpu_node("a", gpus=1)]).empty_state()
    member = replace(pod("m1", gpus=1), gang=Gang("ns/g", min_members=3))
    assert explain_gang(member, 2, state) == (
        "gang ns/g: 2 of at least 3 members are pending; no member is placed until at least 3 of them can be, together."
    )
    assert together(Gang("ns/g", min_members=3), 3) == "no member is placed until all of them can be, together."
    assert together(Gang("ns/g", min_members=3), 5).startswith("no member is placed until at least 3 of them")
    running = Gang("ns/g", min_members=2, running=2)
    assert together(running, 6) == (
        "no member is placed until at least 2 more of them can be, together, beside the 2 running."
    )


def test_the_members_left_beside_a_running_gang_that_meets_its_minimum_are_told_so_in_good_grammar() -> None:
    """A gang of at least 2 with 2 running: each pending member is placed on its own."""
    state = Cluster([gpu_node("a", gpus=1)]).empty_state()
    left = replace(pod("m3", gpus=2), gang=Gang("ns/g", min_members=2).beside(2))
    assert explain_gang(left, 1, state).startswith("gang ns/g: its pending member (beside 2 running) does not fit;")
    assert explain_gang(left, 2, state).startswith("gang ns/g: none of its 2 pending members (beside 2 running) fits;")


def test_a_gang_with_members_running_is_told_its_minimum_as_written() -> None:
    """A gang of at least 4 with one member running and two pending is short by one: said in the
    numbers its owner wrote, not in the three the batch has left to place."""
    state = Cluster([gpu_node("a", gpus=1)]).empty_state()
    left = replace(pod("m2", gpus=1), gang=Gang("ns/g", min_members=3, running=1))
    assert explain_gang(left, 2, state).startswith(
        "gang ns/g: 2 pending and 1 running of at least 4 members; no member is placed"
    )
    assert explain_gang(left, 3, state).startswith(
        "gang ns/g: its 3 pending members (beside 1 running) do not all fit at once;"
    )
