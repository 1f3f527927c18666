"""The books: bound and assumed pods against the inventory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from structlog.testing import capture_logs

from gpusched.model import Cluster, Node, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread
from gpusched.model.node import Taint
from gpusched.state.cache import Cache, keep_free, same_offer
from gpusched.state.records import NodeRecord, PodRecord
from tests.factories import gpu_node, pod


def bound(p: Pod, node: str, gpus: tuple[int, ...] | None = None, *, terminal: bool = False) -> PodRecord:
    return PodRecord(p, uid=p.uid, scheduler="x", node_name=node, gpu_indices=gpus, terminal=terminal)


def cache_with(*nodes: NodeRecord) -> Cache:
    c = Cache()
    c.replace_nodes(nodes)
    return c


def test_pods_of_other_schedulers_take_idle_gpus_and_cpu() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    c.observe_pod(bound(pod("x", cpu=2000, gpus=2), "a"))
    s = c.snapshot().state
    assert s.cpu_used[0] == 2000
    assert list(s.gpu_used[0]) == [1000, 1000, 0, 0]


def test_annotated_indices_are_respected() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    c.observe_pod(bound(pod("x", gpus=1), "a", (3,)))
    assert list(c.snapshot().state.gpu_used[0]) == [0, 0, 0, 1000]


def test_annotated_indices_that_name_a_gpu_twice_are_a_guess_not_a_gpu_counted_twice() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    with capture_logs() as logs:
        c.observe_pod(bound(pod("x", gpus=2), "a", (1, 1)))
        used = list(c.snapshot().state.gpu_used[0])
    # Two GPUs in use (the device plugin gave it two), none of them booked past its capacity.
    assert sorted(used) == [0, 0, 1000, 1000]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []


def test_assume_counts_at_once_forget_undoes_and_is_idempotent() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    p = pod("x", gpus=1, milli=500)
    c.assume(p, "a", (1,))
    assert c.snapshot().state.gpu_used[0, 1] == 500
    c.forget(p.key)
    c.forget(p.key)
    assert c.snapshot().state.gpu_used.sum() == 0
    assert not c.holds(p.key)


def test_confirmed_pod_is_not_forgotten() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    p = pod("x", gpus=1)
    c.assume(p, "a", (0,))
    c.observe_pod(bound(p, "a", (0,)))
    c.forget(p.key)  # a late failure report must not free a bound pod's GPU
    assert c.snapshot().state.gpu_used[0, 0] == 1000


def test_a_pod_bound_on_our_node_with_other_gpus_is_counted_on_those() -> None:
    # An earlier leader bound it first (the Binding answered 409, same node): its annotation,
    # not our choice, says which GPUs it holds.
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    p = pod("x", gpus=2)
    c.assume(p, "a", (0, 1))
    c.observe_pod(bound(p, "a", (2, 3)))
    assert list(c.snapshot().state.gpu_used[0]) == [0, 0, 1000, 1000]
    assert not c.is_assumed(p.key)
    c.forget(p.key)  # a late failure report frees nothing
    assert list(c.snapshot().state.gpu_used[0]) == [0, 0, 1000, 1000]


def test_pod_bound_elsewhere_replaces_the_assumption() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=1)), NodeRecord(gpu_node("b", gpus=1)))
    p = pod("x", gpus=1)
    c.assume(p, "a", (0,))
    c.observe_pod(bound(p, "b"))
    s = c.snapshot()
    assert s.state.gpu_used[s.cluster.index["a"], 0] == 0
    assert s.state.gpu_used[s.cluster.index["b"], 0] == 1000


def test_finished_and_deleted_pods_free_capacity() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=1)))
    p = pod("x", gpus=1)
    c.observe_pod(bound(p, "a"))
    assert c.observe_pod(bound(p, "a", terminal=True)) is True
    assert c.snapshot().state.gpu_used.sum() == 0
    c.observe_pod(bound(pod("y", gpus=1), "a"))
    assert c.delete_pod("default/y") is True
    assert c.snapshot().state.gpu_used.sum() == 0


def test_a_cordoned_node_stays_in_the_cluster_with_its_pods_and_cordoning_changes_its_offer() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)), NodeRecord(replace(gpu_node("b", gpus=2), unschedulable=True)))
    c.observe_pod(bound(pod("x", gpus=1), "b", (1,)))
    s = c.snapshot()
    assert [n.name for n in s.cluster.nodes] == ["a", "b"]
    assert s.cluster.cordoned.tolist() == [False, True]
    assert s.state.gpu_used[1].tolist() == [0, 1000]  # its pod still holds its GPU
    # Uncordoned: the node offers more (pods that do not tolerate the taint fit now).
    assert c.upsert_node(NodeRecord(gpu_node("b", gpus=2))) is True
    after = c.snapshot()
    assert after.cluster.cordoned.tolist() == [False, False]
    assert after.state.gpu_used[1].tolist() == [0, 1000]


def test_node_change_rebuilds_and_keeps_pod_accounting() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    c.observe_pod(bound(pod("x", gpus=1), "a", (1,)))
    before = c.snapshot()
    assert c.upsert_node(NodeRecord(gpu_node("b", gpus=2))) is True
    after = c.snapshot()
    assert after.cluster is not before.cluster
    assert after.state.gpu_used[after.cluster.index["a"], 1] == 1000
    assert c.upsert_node(NodeRecord(gpu_node("b", gpus=2))) is False  # nothing changed


def _full_after_a_guess_was_freed() -> tuple[Cache, Pod, Pod]:
    """Two pods of another scheduler (no GPU indices named) guessed on GPUs 0 and 1 of ``a``; the
    first ends, and ours is bound to GPU 0: the node is full.  The books were built (snapshot)
    before, as the daemon's are."""
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    c.snapshot()
    c.observe_pod(bound(pod("c", gpus=1), "a"))
    theirs = pod("b", gpus=1)
    c.observe_pod(bound(theirs, "a"))
    c.delete_pod("default/c")
    ours = pod("z", gpus=1)
    c.assume(ours, "a", (0,))
    c.observe_pod(bound(ours, "a", (0,)))
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    return c, theirs, ours


def test_a_guess_keeps_off_a_known_pods_gpu_when_the_books_are_rebuilt() -> None:
    # A node joining (or any node change) rebuilds the books, pod by pod: the guessed pod, counted
    # first, must not take the GPU our pod names, or the next pod is bound to a full node.
    c, theirs, _ = _full_after_a_guess_was_freed()
    c.upsert_node(NodeRecord(gpu_node("cpu", gpus=0)))
    s = c.snapshot()
    assert s.state.gpu_used[s.cluster.index["a"]].tolist() == [1000, 1000]
    assert c.placement(theirs.key) == ("a", (1,))


def test_a_relist_in_name_order_keeps_the_guess_where_it_was() -> None:
    # The API server lists by namespace/name: the guessed b before our z.
    c, theirs, ours = _full_after_a_guess_was_freed()
    c.replace_pods([bound(theirs, "a"), bound(ours, "a", (0,))])
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    assert c.placement(theirs.key) == ("a", (1,))


def test_a_guessed_pod_stays_on_its_gpus_through_a_rebuild() -> None:
    # GPU 0 freed under a pod guessed on GPU 1: the books rebuilt do not move it there (what is
    # measured busy, and preemption, name its GPUs), but a pod of another UID is guessed afresh.
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    c.snapshot()
    theirs = replace(pod("b", gpus=1), uid="b1")
    c.observe_pod(bound(pod("c", gpus=1), "a"))
    c.observe_pod(bound(theirs, "a"))
    c.delete_pod("default/c")
    c.upsert_node(NodeRecord(gpu_node("b", gpus=2)))
    c.snapshot()
    assert c.placement(theirs.key) == ("a", (1,))
    c.replace_pods([bound(theirs, "a")])
    c.snapshot()
    assert c.placement(theirs.key) == ("a", (1,))
    c.replace_pods([bound(replace(theirs, uid="b2"), "a")])
    c.snapshot()
    assert c.placement(theirs.key) == ("a", (0,))


def test_a_pod_that_names_the_gpu_a_guess_holds_moves_the_guess() -> None:
    # kube-scheduler's b names no GPU: guessed on GPU 0.  A pod another instance of gpusched bound
    # (a former leader, another scheduler name) names GPU 0: b is on the other one.
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    c.snapshot()
    c.observe_pod(bound(pod("b", gpus=1), "a"))
    c.observe_pod(bound(pod("x", gpus=1), "a", (0,)))
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    assert c.placement("default/b") == ("a", (1,))
    # Ours, assumed onto the GPU a share was guessed on, moves it too.
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    c.snapshot()
    c.observe_pod(bound(pod("s", gpus=1, milli=500), "a"))
    c.assume(pod("y", gpus=1), "a", (0,))
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 500]


def test_two_pods_that_name_one_gpu_fill_two_and_are_told() -> None:
    # Two instances of gpusched (a leader change, two scheduler names) named GPU 0 for a pod each:
    # the kubelet gave them a GPU each, so the next pod must not count on the second.
    c = cache_with(NodeRecord(gpu_node("a", gpus=3)))
    c.observe_pod(bound(pod("x", gpus=1), "a", (0,)))
    with capture_logs() as logs:
        c.observe_pod(bound(pod("y", gpus=1), "a", (0,)))
        snap = c.snapshot()
        c.snapshot()  # told once, not at every snapshot
    assert snap.state.gpu_used[0].tolist() == [1000, 1000, 0]
    assert [e["gpus"] for e in logs if e["log_level"] == "warning"] == [["a/0: default/x, default/y"]]
    c.delete_pod("default/y")
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 0, 0]
    # Room held for a preemptor over its victim's GPU is no excess: it is the victim's to leave.
    victim = replace(pod("v", gpus=1), uid="v")
    c.observe_pod(bound(victim, "a", (1,)))
    c.nominate(replace(pod("urgent", gpus=1), uid="u", priority=10), "a", (1,), [victim])
    with capture_logs() as logs:
        snap = c.snapshot()
    assert snap.state.gpu_used[0].tolist() == [1000, 1000, 0]
    assert not [e for e in logs if e["log_level"] == "warning"]


def test_a_prefer_no_schedule_taint_is_seen_but_wakes_no_pod() -> None:
    # The cluster autoscaler adds and removes its PreferNoSchedule taint as nodes fall idle:
    # later solves must weigh it, but it makes no parked pod fit (no retry of them all).
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    before = c.snapshot()
    soft = replace(
        gpu_node("a", gpus=2), soft_taints=(Taint("DeletionCandidateOfClusterAutoscaler", "1", "PreferNoSchedule"),)
    )
    assert c.upsert_node(NodeRecord(soft)) is False
    after = c.snapshot()
    assert after.cluster is not before.cluster
    assert after.cluster.nodes[0].soft_taints == soft.soft_taints
    assert same_offer(before.cluster.nodes[0], after.cluster.nodes[0])
    assert not same_offer(gpu_node("a", gpus=2), gpu_node("a", gpus=4))


def test_snapshot_is_frozen_against_later_events() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    snap = c.snapshot()
    c.observe_pod(bound(pod("x", gpus=2), "a"))
    assert snap.state.gpu_used.sum() == 0
    assert c.generation > snap.generation


def test_relist_keeps_assumed_pods_and_drops_vanished_bound_ones() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    c.observe_pod(bound(pod("gone", gpus=1), "a"))
    c.assume(pod("inflight", gpus=1), "a", (2,))
    c.replace_pods([bound(pod("still", gpus=1), "a", (0,))])
    assert not c.holds("default/gone")
    assert c.holds("default/inflight")
    assert c.holds("default/still")
    assert c.snapshot().state.gpu_used[0].sum() == 2000


def test_a_bind_that_lands_after_a_relist_missed_its_pod_asks_for_a_read_back() -> None:
    # The pod may have been bound and deleted before the list: no watch event will free it.
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    missed, listed, watched = (replace(pod(n, gpus=1), uid=f"uid-{n}") for n in ("missed", "listed", "watched"))
    for i, p in enumerate((missed, listed, watched)):
        c.assume(p, "a", (i,))
    c.replace_pods([bound(listed, "a", (1,))])
    c.observe_pod(bound(watched, "a", (2,)))  # seen after the list: its deletion will be seen too
    assert [c.confirm(p.key) for p in (missed, listed, watched)] == [True, False, False]
    assert not c.confirm(missed.key)  # asked once
    assert c.read_back(missed.key, missed.uid, exists=False)
    assert list(c.snapshot().state.gpu_used[0]) == [0, 1000, 1000, 0]


def test_a_relist_taken_before_a_binding_landed_keeps_the_bound_pod_until_it_is_read_back() -> None:
    # The list's version predates the Binding: the pod is bound, holds GPU 0, and the watch
    # that follows the list will show it.  Dropping it would give GPU 0 to another pod.
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    landed, seen = (replace(pod(n, gpus=1), uid=f"uid-{n}") for n in ("landed", "seen"))
    c.assume(landed, "a", (0,))
    c.assume(seen, "a", (1,))
    assert not c.confirm(landed.key)
    assert not c.confirm(seen.key)
    c.observe_pod(bound(seen, "a", (1,)))  # on the watch since: a list without it means it is gone
    assert c.replace_pods([]) == [landed.key]
    assert c.holds(landed.key, landed.uid)
    assert not c.holds(seen.key)
    assert list(c.snapshot().state.gpu_used[0]) == [1000, 0]
    assert not c.read_back(landed.key, landed.uid, exists=True)
    c.observe_pod(bound(landed, "a", (0,)))  # the watch shows it: the next relist without it drops it
    assert c.replace_pods([]) == []
    assert not c.holds(landed.key)


def test_a_pod_bound_and_deleted_before_a_relist_is_freed_by_the_read_back() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=1)))
    gone = replace(pod("gone", gpus=1), uid="uid-gone")
    c.assume(gone, "a", (0,))
    c.confirm(gone.key)
    assert c.replace_pods([]) == [gone.key]
    assert c.read_back(gone.key, gone.uid, exists=False)
    assert list(c.snapshot().state.gpu_used[0]) == [0]


def test_a_pod_a_relist_shows_under_the_name_of_one_gone_since_is_counted_once_the_read_back_says_so() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    ours, theirs = (replace(pod("web-0", gpus=1), uid=u) for u in ("uid-ours", "uid-theirs"))
    c.assume(ours, "a", (0,))
    c.replace_pods([bound(theirs, "a", (1,))])  # ours was bound and deleted, theirs bound since
    assert c.confirm(ours.key)
    assert c.read_back(ours.key, ours.uid, exists=False)
    assert c.holds(theirs.key, theirs.uid)
    assert list(c.snapshot().state.gpu_used[0]) == [0, 1000]


def test_a_pod_the_read_back_finds_keeps_its_place_and_the_relisted_one_is_dropped() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    ours, theirs = (replace(pod("web-0", gpus=1), uid=u) for u in ("uid-ours", "uid-theirs"))
    c.assume(ours, "a", (0,))
    c.replace_pods([bound(theirs, "a", (1,))])
    assert c.confirm(ours.key)
    assert not c.read_back(ours.key, ours.uid, exists=True)
    assert c.holds(ours.key, ours.uid)
    assert not c.forget(ours.key)  # nothing set aside is brought back
    assert list(c.snapshot().state.gpu_used[0]) == [1000, 0]


def test_assuming_a_stale_pod_of_a_bound_name_keeps_the_bound_one_until_the_bind_fails() -> None:
    # The pending watch lags: web-0 (old UID) is drawn while the bound watch already shows the
    # web-0 created since and bound elsewhere.  The Binding fails on the UID; the bound one stays.
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    stale, current = (replace(pod("web-0", gpus=1), uid=u) for u in ("uid-stale", "uid-current"))
    c.observe_pod(bound(current, "a", (1,)))
    assert not c.holds(stale.key, stale.uid)
    c.assume(stale, "a", (0,))
    assert c.forget(stale.key)
    assert c.holds(current.key, current.uid)
    assert list(c.snapshot().state.gpu_used[0]) == [0, 1000]


def test_every_pod_on_a_node_with_a_pod_limit_takes_one_of_its_slots() -> None:
    c = cache_with(NodeRecord(replace(gpu_node("a", gpus=2), max_pods=3)), NodeRecord(gpu_node("b", gpus=2)))
    c.observe_pod(bound(pod("other-scheduler", cpu=100), "a"))
    c.assume(pod("ours", gpus=1), "a", (0,))
    c.observe_pod(bound(pod("elsewhere", cpu=100), "b"))
    state = c.snapshot().state
    assert list(state.pods_free[:1]) == [1]
    c.delete_pod("default/other-scheduler")
    assert list(c.snapshot().state.pods_free[:1]) == [2]


def test_mig_slices_held_by_bound_and_assumed_pods_are_counted() -> None:
    from gpusched.model import Node

    node = Node("m", 64000, 65536, gpu_count=0, gpu_model="A100-SXM4-80GB", mig_slices=(("1g.10gb", 3),))
    c = cache_with(NodeRecord(node))
    c.observe_pod(bound(Pod("x", 100, 100, mig_profile="1g.10gb"), "m"))
    c.assume(Pod("y", 100, 100, mig_profile="1g.10gb"), "m", ())
    state = c.snapshot().state
    assert int(state.mig_free[0, state.cluster.mig_id("1g.10gb")]) == 1
    c.forget("default/y")
    c.delete_pod("default/x")
    state = c.snapshot().state
    assert int(state.mig_free[0, state.cluster.mig_id("1g.10gb")]) == 3


def test_every_slice_a_pod_of_another_scheduler_holds_is_counted() -> None:
    """Slices of two profiles beside a GPU: each one is taken while it runs, and freed when it goes."""
    from gpusched.model import Node

    slices = (("1g.10gb", 3), ("2g.20gb", 1))
    node = Node("m", 64000, 65536, gpu_count=1, gpu_model="A100-SXM4-80GB", mig_slices=slices)
    c = cache_with(NodeRecord(node))
    theirs = Pod("x", 100, 100, num_gpu=1, gpu_milli=1000, mig_held=(("1g.10gb", 2), ("2g.20gb", 1)))
    c.observe_pod(bound(theirs, "m"))
    state = c.snapshot().state
    assert [int(state.mig_free[0, state.cluster.mig_id(p)]) for p in ("1g.10gb", "2g.20gb")] == [1, 0]
    assert int(state.gpu_used[0, 0]) == 1000
    c.delete_pod("default/x")
    state = c.snapshot().state
    assert [int(state.mig_free[0, state.cluster.mig_id(p)]) for p in ("1g.10gb", "2g.20gb")] == [3, 1]


def test_a_pod_of_the_same_name_but_another_uid_is_not_the_one_held() -> None:
    from dataclasses import replace

    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    old = replace(pod("x", gpus=1), uid="u1")
    c.observe_pod(bound(old, "a"))
    assert c.holds(old.key, "u1")
    assert not c.holds(old.key, "u2")  # created again: the new pod still needs placing
    assert not c.delete_pod(old.key, "u2")  # a late deletion of another incarnation frees nothing
    assert c.snapshot().state.gpu_used[0].sum() == 1000
    assert c.delete_pod(old.key, "u1")
    assert c.snapshot().state.gpu_used[0].sum() == 0


def test_a_relabelled_node_rebuilds_the_view_the_solver_reads() -> None:
    from dataclasses import replace

    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    before = c.snapshot().cluster
    node = c.nodes["a"].node
    assert c.upsert_node(NodeRecord(replace(node, labels={**node.labels, "rack": "r1"})))
    assert c.snapshot().cluster.nodes[0].labels.get("rack") == "r1"
    assert c.snapshot().cluster is not before


def test_a_resized_pod_is_counted_with_its_new_request() -> None:
    from dataclasses import replace

    c = cache_with(NodeRecord(gpu_node("a", gpus=2, cpu=8000)))
    p = replace(pod("x", cpu=1000, gpus=1), uid="u1")
    c.assume(p, "a", (1,))
    assert not c.observe_pod(bound(p, "a", (1,)))  # the watch confirms the bind
    assert c.snapshot().state.cpu_used[0] == 1000
    grown = replace(p, cpu_milli=3000)
    c.observe_pod(bound(grown, "a", (1,)))  # resized in place: 1 -> 3 CPUs
    s = c.snapshot().state
    assert s.cpu_used[0] == 3000
    assert list(s.gpu_used[0]) == [0, 1000]  # still on the GPU it holds


def test_pods_on_a_cordoned_node_still_keep_replicas_out_of_their_zone() -> None:
    zone = {"zone": "z0"}
    away = (PodAffinityTerm((Requirement("app", "In", ("llm",)),), None, "zone"),)
    c = cache_with(
        NodeRecord(replace(gpu_node("a"), labels=zone, unschedulable=True)),
        NodeRecord(replace(gpu_node("b"), labels=zone)),
        NodeRecord(replace(gpu_node("c"), labels={"zone": "z1"})),
    )
    running = replace(pod("r0", gpus=1), uid="u0", labels=(("app", "llm"),), anti_affinity=away)
    c.observe_pod(bound(running, "a"))
    state = c.snapshot().state
    new = replace(pod("r1", gpus=1), uid="u1", labels=(("app", "llm"),), anti_affinity=away)
    mask = state.anti_mask(new)
    assert mask is not None
    assert mask.tolist() == [False, False, True]  # b shares the cordoned node's zone
    spread = Spread(1, "zone", (Requirement("app", "In", ("llm",)),), "default")
    assert state.spread_view(replace(new, spread=(spread,)), spread).counts.tolist() == [1, 0]
    c.delete_pod(running.key)
    assert c.snapshot().state.anti_mask(new) is None


def test_a_running_pod_read_again_with_other_preferred_terms_is_counted_with_them() -> None:
    # Its namespaceSelector picks another namespace since a label changed: later pods must see
    # the term as it reads now, not as it read when the pod was first seen.
    c = cache_with(NodeRecord(replace(gpu_node("a", gpus=2), labels={"zone": "z"})))
    before = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset(), "zone")
    after = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"team-x"}), "zone")
    db = replace(pod("db", gpus=1), uid="u1", labels=(("app", "db"),), preferred_apart=((50, before),))
    c.observe_pod(bound(db, "a"))
    assert c.observe_pod(bound(replace(db, preferred_apart=((50, after),)), "a"))
    assert list(c.snapshot().state.wish_terms) == [after]


def test_the_last_events_of_a_replaced_pod_do_not_undo_the_assumption_of_its_successor() -> None:
    """web-0 (u1) is deleted and created again (u2); u2 is assumed on a while u1's last events
    (terminating, then deleted) are still on the bound-pods watch.  u2's GPU stays counted, so
    it is not given out again; once u2's bind succeeds, u1 is forgotten."""
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    old, new = replace(pod("web-0", gpus=1), uid="u1"), replace(pod("web-0", gpus=1), uid="u2")
    c.assume(new, "a", (0,))
    leaving = replace(bound(old, "a", (1,)), deleting=True)
    assert not c.observe_pod(leaving)
    assert not c.delete_pod(old.key, "u1")
    assert c.holds(new.key, "u2")
    assert c.snapshot().state.gpu_used[0].sum() == 1000
    c.confirm(new.key)
    assert c.holds(new.key, "u2")
    assert c.snapshot().state.gpu_used[0].sum() == 1000


def test_a_pod_seen_under_the_name_of_one_being_bound_counts_once_that_bind_fails() -> None:
    """While u1's bind is in flight, u2 of the same name turns up bound by someone else (u1 was
    deleted meanwhile); when u1's bind comes back gone, u2 is what the node holds."""
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)), NodeRecord(gpu_node("b", gpus=2)))
    ours, theirs = replace(pod("job", gpus=1), uid="u1"), replace(pod("job", gpus=2), uid="u2")
    c.assume(ours, "a", (0,))
    c.observe_pod(bound(theirs, "b", (0, 1)))
    assert c.forget(ours.key)  # capacity changed hands: the caller wakes parked pods
    s = c.snapshot()
    assert s.state.gpu_used[s.cluster.index["a"]].sum() == 0
    assert s.state.gpu_used[s.cluster.index["b"]].sum() == 2000
    assert c.holds(theirs.key, "u2")
    assert not c.forget(ours.key)


def test_room_held_for_a_preemptor_is_taken_from_others_and_left_free_for_it() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)), NodeRecord(gpu_node("b", gpus=1)))
    victim = replace(pod("victim", gpus=1), uid="v", priority=0)
    c.observe_pod(bound(victim, "a", (0,)))
    c.observe_pod(bound(replace(pod("other", gpus=1), uid="o", priority=0), "a", (1,)))
    c.observe_pod(bound(replace(pod("leaving", gpus=1), uid="l", terminating=True), "b", (0,)))
    # Preemptible: confirmed, not being deleted, placed in the snapshot's cluster.
    assert sorted((a.pod.name, a.node, a.gpus) for a in c.preemptible()) == [("other", 0, (1,)), ("victim", 0, (0,))]
    urgent = replace(pod("urgent", gpus=1), uid="u", priority=10)
    c.nominate(urgent, "a", (0,), [victim])
    assert c.nomination(urgent.key) == ("a", (0,), 1)
    # Preempted already: no other pod may pick it, even before the watch shows it leaving.
    assert [a.pod.name for a in c.preemptible()] == ["other"]
    assert c.lowest_priority() == 0
    # While the victim terminates, GPU 0 is counted twice; others see it taken, and so does the
    # preemptor: its room is free for it, but the victim is still there.
    c.observe_pod(bound(replace(victim, terminating=True), "a", (0,)))
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    assert c.snapshot(free=[urgent.key]).state.gpu_used[0].tolist() == [1000, 1000]
    c.delete_pod(victim.key, "v")
    assert c.nomination(urgent.key) == ("a", (0,), 0)
    # A pod created again under its name is another pod, not the victim still leaving.
    c.observe_pod(bound(replace(victim, uid="v2"), "b", (0,)))
    assert c.nomination(urgent.key) == ("a", (0,), 0)
    c.delete_pod(victim.key, "v2")
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]  # held for urgent
    assert c.snapshot(free=[urgent.key]).state.gpu_used[0].tolist() == [0, 1000]
    # A node change rebuilds the books: the room is still held.
    assert c.upsert_node(NodeRecord(gpu_node("c", gpus=1)))
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    # Bound by someone else on its node: the watch's pod replaces the held room, counted once.
    c.observe_pod(bound(urgent, "a", (0,)))
    assert c.nomination(urgent.key) is None
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    c.delete_pod(urgent.key, "u")
    c.nominate(urgent, "a", (0,), [victim])
    # Bound: the assumption replaces the held room, counted once.
    c.assume(urgent, "a", (0,))
    assert c.nomination(urgent.key) is None
    assert c.snapshot(free=[urgent.key]).state.gpu_used[0].tolist() == [1000, 1000]
    c.forget(urgent.key)
    assert c.snapshot().state.gpu_used[0].tolist() == [0, 1000]


def test_held_room_is_given_up_on_request_and_all_at_once_on_step_down() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    for i in range(2):
        c.nominate(replace(pod(f"u{i}", gpus=1), uid=f"u{i}"), "a", (i,), ())
    assert c.snapshot().state.gpu_used[0].tolist() == [1000, 1000]
    assert c.unnominate("default/u0") is True
    assert c.unnominate("default/u0") is False
    assert c.snapshot().state.gpu_used[0].tolist() == [0, 1000]
    c.clear_nominations()
    assert c.snapshot().state.gpu_used[0].tolist() == [0, 0]
    assert c.nomination("default/u1") is None


def test_room_held_for_pods_waiting_for_a_mig_layout_counts_all_but_their_instances_once() -> None:
    mig = Node("m", 8000, 65536, gpu_count=1, gpu_model="A100-SXM4-80GB", mig_slices=(("1g.10gb", 7),))
    c = cache_with(NodeRecord(mig), NodeRecord(gpu_node("w", gpus=1)))
    first = replace(pod("first", cpu=6000), uid="f", mig_profile="1g.10gb", host_ports=frozenset({"TCP/8080"}))
    member = replace(pod("member", cpu=2000, gpus=1), uid="g", labels=(("app", "g"),))
    assert c.hold_for_layouts({first.key: (first, "m"), member.key: (member, "w")})
    assert not c.hold_for_layouts({first.key: (first, "m"), member.key: (member, "w")})  # as held already

    def held() -> tuple[list[int], list[int], int, list[int], object, object]:
        st = c.snapshot().state
        assert st.mig_used is not None
        return (
            st.cpu_used.tolist(),
            st.mem_used.tolist(),
            int(st.mig_used.sum()),
            st.gpu_used.sum(axis=1).tolist(),
            dict(st.ports_used),
            {i: [p.name for p in ps] for i, ps in st.residents.items()},
        )

    # Their CPU, memory, host ports and place for (anti-)affinity; no GPU, no instance (the
    # layout's instances are promised to them apart).
    want = ([6000, 2000], [1024, 1024], 0, [0, 0], {0: frozenset({"TCP/8080"})}, {0: ["first"], 1: ["member"]})
    assert held() == want
    assert c.upsert_node(NodeRecord(gpu_node("x", gpus=1)))  # the books rebuilt: still held
    assert held()[:2] == ([6000, 2000, 0], [1024, 1024, 0])
    # Bound: the pod on the books holds its own room, counted once; not held for again.
    c.observe_pod(bound(first, "m"))
    assert not c.hold_for_layouts({first.key: (first, "m"), member.key: (member, "w")})
    assert held()[0] == [6000, 2000, 0]
    assert held()[2] == 1
    c.assume(member, "w", (0,))
    assert held()[0] == [6000, 2000, 0]
    assert held()[3] == [0, 1000, 0]
    c.forget(member.key)
    c.delete_pod(first.key, "f")
    # The wait is over (the layout came, failed or timed out): nothing held any more.
    assert c.hold_for_layouts({member.key: (member, "w")})
    assert c.hold_for_layouts({})
    assert held() == ([0, 0, 0], [0, 0, 0], 0, [0, 0, 0], {}, {})


def test_busy_gpus_count_as_full_in_the_snapshot_only() -> None:
    from gpusched.model import Node

    mig = Node("m", 64000, 65536, gpu_count=1, gpu_model="A100-SXM4-80GB", mig_slices=(("1g.10gb", 7),))
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)), NodeRecord(gpu_node("b", gpus=1)), NodeRecord(mig))
    c.observe_pod(bound(pod("x", gpus=1, milli=400), "a", (0,)))
    c.observe_pod(bound(pod("y", gpus=1), "a", (1,)))
    snap = c.snapshot(busy={"a": {0, 1, 2, 9}, "gone": {0}, "m": {0}})
    assert list(snap.state.gpu_used[0]) == [1000, 1000, 1000, 0]
    # Of the GPUs named: 0 had a share left, 2 was idle; 1 was full, 9 is not there, nor is node "gone";
    # a node with MIG slices is left as it is.
    assert snap.busy == 2
    assert int(snap.state.gpu_used[2, 0]) == 0
    assert list(c.snapshot().state.gpu_used[0]) == [400, 1000, 0, 0]  # the books are untouched


def test_room_held_for_a_preemptor_whose_victims_left_is_never_busy() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=2)))
    victim = pod("low", gpus=1)
    c.observe_pod(bound(victim, "a", (0,)))
    c.nominate(pod("high", gpus=1), "a", (0,), [victim])
    c.delete_pod(victim.key)
    snap = c.snapshot(free=["default/high"], busy={"a": {0, 1}})
    assert list(snap.state.gpu_used[0]) == [0, 1000]  # GPU 0 is the room; 1 is busy
    assert snap.busy == 1


def test_room_adopted_for_a_pod_that_requires_one_island_is_held_within_one() -> None:
    """A new leader holds room from nominatedNodeName on the GPUs the preempted pods free: for a
    pod whose GPUs must share an island, on an island they free enough of."""
    node = replace(gpu_node("a", gpus=4), gpu_islands=(0, 0, 1, 1))
    c = cache_with(NodeRecord(node))
    for i, g in enumerate((1, 2, 3)):
        leaving = replace(pod(f"v{i}", gpus=1), uid=f"v{i}", terminating=True, preempted=True)
        c.observe_pod(bound(leaving, "a", (g,)))
    urgent = replace(pod("urgent", gpus=2), uid="u", priority=100, island="required")
    assert c.adopt_nomination(urgent, "a")
    assert c.nomination(urgent.key) == ("a", (2, 3), 3)


def test_the_claims_of_pods_on_the_books_name_the_pod_that_mounts_them() -> None:
    c = cache_with(NodeRecord(gpu_node("a", gpus=4)))
    db = replace(pod("db"), uid="u-db", claims=("data", "logs"))
    c.observe_pod(bound(db, "a"))
    c.assume(replace(pod("train", gpus=1), uid="u-t", claims=("ckpt",)), "a", (0,))
    assert dict(c.claim_users()) == {
        "default/data": ("default/db", "u-db"),
        "default/logs": ("default/db", "u-db"),
        "default/ckpt": ("default/train", "u-t"),
    }
    c.forget("default/train")  # its Binding failed: it mounts nothing
    assert "default/ckpt" not in c.claim_users()
    c.observe_pod(bound(db, "a", terminal=True))  # finished: it holds nothing
    assert dict(c.claim_users()) == {}
    c.replace_pods([bound(db, "a")])
    assert set(c.claim_users()) == {"default/data", "default/logs"}
    c.delete_pod("default/db", "u-db")
    assert dict(c.claim_users()) == {}


def test_the_headroom_keeps_whole_gpus_never_mig_instances_nor_time_slices() -> None:
    """Eight GPUs kept must be eight physical GPUs a critical pod can have whole: not fifty-six
    instances of a single-strategy MIG node (each a seventh), nor slices of a time-sliced node."""
    whole = Node("whole", 64_000, 512_000, gpu_count=8, gpu_model="NVIDIA-A100-SXM4-80GB")
    single = Node("single", 64_000, 512_000, gpu_count=56, gpu_model="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")
    sliced = Node(
        "sliced",
        64_000,
        512_000,
        gpu_count=32,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        labels={"nvidia.com/gpu.replicas": "4"},
    )
    cluster = Cluster([single, sliced, whole])
    used = np.zeros_like(cluster.gpu_cap)
    kept = keep_free(cluster, used, 8, frozenset({"A100-SXM4-80GB"}))
    assert {cluster.nodes[i].name for i, _ in kept} == {"whole"}
    assert len(kept) == 8
    used[2, :2] = 1000  # two of the whole GPUs taken: six is all the headroom can keep
    assert len(keep_free(cluster, used, 8)) == 6
