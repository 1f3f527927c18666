"""Cluster inventory and usage: which nodes a pod fits on, and immutable updates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpusched.model import Assignment, Cluster, ClusterState, Node, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.model.cluster import BoolArray


def make_cluster() -> Cluster:
    return Cluster(
        [
            Node("a100-0", 16000, 65536, gpu_count=2, gpu_model="A100"),
            Node("v100-0", 8000, 32768, gpu_count=4, gpu_model="V100"),
            Node("cpu-0", 32000, 131072),
            Node("t4-0", 2000, 4096, gpu_count=1, gpu_model="T4"),
        ]
    )


def nodes_of(cluster: Cluster, mask: BoolArray) -> list[str]:
    return [cluster.nodes[i].name for i in np.flatnonzero(mask)]


def pod(name: str, *, cpu: int = 1000, mem: int = 1024, gpus: int = 0, milli: int = 0, models: str = "") -> Pod:
    return Pod(name, cpu, mem, gpus, milli, frozenset(m for m in models.split("|") if m))


class TestCluster:
    def test_inventory(self) -> None:
        c = make_cluster()
        assert len(c) == 4
        assert c.models == ("A100", "T4", "V100")
        assert c.total_gpus == 7
        assert c.max_gpus == 4
        assert c.index["cpu-0"] == 2
        assert c.gpu_cap.tolist()[0] == [1000, 1000, 0, 0]
        assert c.model_id.tolist()[2] == -1

    def test_duplicate_node_names_are_rejected(self) -> None:
        with pytest.raises(ValueError, match="duplicate node names: n1"):
            Cluster([Node("n1", 1, 1), Node("n2", 1, 1), Node("n1", 2, 2)])

    def test_cpu_only_cluster(self) -> None:
        c = Cluster([Node("c", 1000, 1000)])
        assert c.total_gpus == 0
        assert c.models == ()
        assert nodes_of(c, c.empty_state().fit_mask(pod("g", gpus=1, milli=100).shape)) == []

    def test_model_mask(self) -> None:
        c = make_cluster()
        assert nodes_of(c, c.model_mask(frozenset())) == ["a100-0", "v100-0", "t4-0"]
        assert nodes_of(c, c.model_mask(frozenset({"T4", "V100"}))) == ["v100-0", "t4-0"]
        assert nodes_of(c, c.model_mask(frozenset({"H100"}))) == []


class TestFitMask:
    def test_cpu_only_pod_fits_any_node_with_cpu_and_memory(self) -> None:
        c = make_cluster()
        s = c.empty_state()
        assert nodes_of(c, s.fit_mask(pod("p", cpu=2000, mem=4096).shape)) == [
            "a100-0",
            "v100-0",
            "cpu-0",
            "t4-0",
        ]
        assert nodes_of(c, s.fit_mask(pod("p", cpu=9000).shape)) == ["a100-0", "cpu-0"]
        assert nodes_of(c, s.fit_mask(pod("p", mem=40000).shape)) == ["a100-0", "cpu-0"]
        assert nodes_of(c, s.fit_mask(pod("p", cpu=40000).shape)) == []

    def test_cpu_only_pod_ignores_a_model_list(self) -> None:
        c = make_cluster()
        shape = pod("p", models="A100").shape  # no GPU requested: models do not matter
        assert "cpu-0" in nodes_of(c, c.empty_state().fit_mask(shape))

    def test_gpu_pod_never_fits_a_cpu_only_node(self) -> None:
        c = make_cluster()
        assert "cpu-0" not in nodes_of(c, c.empty_state().fit_mask(pod("g", gpus=1, milli=100).shape))

    def test_fractional_pod_needs_the_share_on_one_gpu(self) -> None:
        c = make_cluster()
        # 600 + 600 on the two A100s: 800 free in total on the node, but at most 400 on one GPU.
        s = c.empty_state().apply(
            [
                Assignment(pod("x", gpus=1, milli=600), 0, (0,)),
                Assignment(pod("y", gpus=1, milli=600), 0, (1,)),
            ]
        )
        assert "a100-0" in nodes_of(c, s.fit_mask(pod("f", gpus=1, milli=400).shape))
        assert "a100-0" not in nodes_of(c, s.fit_mask(pod("f", gpus=1, milli=500).shape))

    def test_fractional_pod_fits_a_partly_used_gpu(self) -> None:
        c = make_cluster()
        s = c.empty_state().apply([Assignment(pod("x", gpus=1, milli=300), 3, (0,))])
        assert nodes_of(c, s.fit_mask(pod("f", gpus=1, milli=700, models="T4").shape)) == ["t4-0"]
        assert nodes_of(c, s.fit_mask(pod("f", gpus=1, milli=701, models="T4").shape)) == []

    def test_whole_gpu_pod_needs_idle_gpus(self) -> None:
        c = make_cluster()
        s = c.empty_state().apply([Assignment(pod("x", gpus=1, milli=1), 0, (1,))])
        # a100-0 has one idle GPU and one with 999 free: a whole GPU fits, two do not.
        assert "a100-0" in nodes_of(c, s.fit_mask(pod("w", gpus=1, milli=1000).shape))
        assert nodes_of(c, s.fit_mask(pod("w", gpus=2, milli=1000).shape)) == ["v100-0"]
        assert nodes_of(c, s.fit_mask(pod("w", gpus=4, milli=1000).shape)) == ["v100-0"]
        assert nodes_of(c, s.fit_mask(pod("w", gpus=5, milli=1000).shape)) == []

    def test_gpu_pod_also_needs_cpu_and_memory(self) -> None:
        c = make_cluster()
        s = c.empty_state()
        assert nodes_of(c, s.fit_mask(pod("g", cpu=3000, gpus=1, milli=100, models="T4").shape)) == []
        assert nodes_of(c, s.fit_mask(pod("g", mem=5000, gpus=1, milli=1000, models="T4").shape)) == []

    def test_model_constraint(self) -> None:
        c = make_cluster()
        s = c.empty_state()
        assert nodes_of(c, s.fit_mask(pod("g", gpus=1, milli=500, models="V100").shape)) == ["v100-0"]
        assert nodes_of(c, s.fit_mask(pod("g", gpus=1, milli=1000, models="A100|T4").shape)) == [
            "a100-0",
            "t4-0",
        ]
        assert nodes_of(c, s.fit_mask(pod("g", gpus=1, milli=1000, models="H100").shape)) == []
        assert nodes_of(c, s.fit_mask(pod("g", gpus=2, milli=1000, models="T4").shape)) == []


class TestApplyRelease:
    def test_apply_adds_usage(self) -> None:
        c = make_cluster()
        s = c.empty_state().apply(
            [
                Assignment(pod("w", cpu=4000, mem=8192, gpus=2, milli=1000), 1, (0, 2)),
                Assignment(pod("f", cpu=500, mem=512, gpus=1, milli=250), 1, (1,)),
                Assignment(pod("c", cpu=1500, mem=100), 2),
            ]
        )
        assert s.cpu_used.tolist() == [0, 4500, 1500, 0]
        assert s.mem_used.tolist() == [0, 8704, 100, 0]
        assert s.gpu_used[1].tolist() == [1000, 250, 1000, 0]
        assert s.cpu_free.tolist() == [16000, 3500, 30500, 2000]
        assert s.gpu_free[1].tolist() == [0, 750, 0, 1000]
        assert s.full_free_gpus.tolist() == [2, 1, 0, 1]
        assert s.max_gpu_free.tolist() == [1000, 1000, 0, 1000]
        assert s.gpu_allocated_milli == 2250

    def test_apply_then_release_round_trip(self) -> None:
        c = make_cluster()
        a = [
            Assignment(pod("w", gpus=2, milli=1000), 0, (0, 1)),
            Assignment(pod("f", gpus=1, milli=300), 3, (0,)),
            Assignment(pod("c", cpu=7000), 2),
        ]
        s0 = c.empty_state()
        s1 = s0.apply(a)
        s2 = s1.release(a[:1])
        assert s2.full_free_gpus[0] == 2
        assert s2.gpu_allocated_milli == 300
        s3 = s2.release(a[1:])
        for used in ("cpu_used", "mem_used", "gpu_used"):
            assert not getattr(s3, used).any()
        assert s3.cluster is c

    def test_apply_leaves_the_original_state_unchanged(self) -> None:
        c = make_cluster()
        s0 = c.empty_state()
        free_before = s0.cpu_free.copy()
        s1 = s0.apply([Assignment(pod("c", cpu=1000), 0)])
        assert s0.cpu_used.tolist() == [0, 0, 0, 0]
        assert s0.cpu_free.tolist() == free_before.tolist()
        assert s1.cpu_free[0] == 15000
        assert s1 is not s0

    def test_apply_of_nothing_is_an_equal_state(self) -> None:
        s = make_cluster().empty_state().apply([Assignment(pod("c", cpu=10), 1)])
        t = s.apply([])
        assert t.cpu_used.tolist() == s.cpu_used.tolist()


class TestImmutability:
    def test_state_arrays_are_read_only(self) -> None:
        s = make_cluster().empty_state().apply([Assignment(pod("c", cpu=10), 1)])
        for a in (s.cpu_used, s.mem_used, s.gpu_used, s.cpu_free, s.mem_free, s.gpu_free, s.full_free_gpus):
            with pytest.raises(ValueError, match="read-only"):
                a[0] = 1

    def test_cluster_arrays_are_read_only(self) -> None:
        c = make_cluster()
        for a in (c.cpu_cap, c.mem_cap, c.gpu_cap, c.gpu_count, c.model_id, c.model_mask(frozenset())):
            with pytest.raises(ValueError, match="read-only"):
                a[0] = 0

    def test_state_fields_cannot_be_reassigned(self) -> None:
        s = make_cluster().empty_state()
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.cpu_used = np.zeros(4, dtype=np.int64)  # type: ignore[misc]

    def test_states_share_the_cluster(self) -> None:
        c = make_cluster()
        s = c.empty_state()
        assert isinstance(s, ClusterState)
        assert s.apply([Assignment(pod("c"), 0)]).cluster is c


def test_derived_arrays_of_an_applied_state_match_a_fresh_computation() -> None:
    # apply() patches the free-capacity arrays of the parent on the touched rows only;
    # a state built from scratch with the same usage must agree everywhere.
    nodes = [Node(f"n{i}", 16000, 65536, gpu_count=4, gpu_model="A100") for i in range(20)]
    cluster = Cluster(nodes)
    state = cluster.empty_state()
    for k in range(12):
        _ = (state.cpu_free, state.mem_free, state.gpu_free, state.full_free_gpus, state.max_gpu_free)
        pod = Pod(f"p{k}", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=300 + 50 * k % 700)
        state = state.apply([Assignment(pod, k % 5, ((k // 5) % 4,))])
    for g in range(4):  # every GPU of n7 shared: its largest free share drops below a whole GPU
        _ = (state.cpu_free, state.mem_free, state.gpu_free, state.full_free_gpus, state.max_gpu_free)
        state = state.apply([Assignment(Pod(f"q{g}", 1000, 1024, num_gpu=1, gpu_milli=300), 7, (g,))])
    assert state.max_gpu_free[7] == 700
    assert state.full_free_gpus[7] == 0
    fresh = ClusterState(cluster, state.cpu_used.copy(), state.mem_used.copy(), state.gpu_used.copy())
    for name in ("cpu_free", "mem_free", "gpu_free", "full_free_gpus", "max_gpu_free"):
        assert (getattr(state, name) == getattr(fresh, name)).all(), name


def test_changed_since_names_exactly_the_nodes_touched_since_a_stamp() -> None:
    cluster = Cluster([Node(f"n{i}", 8000, 8192, gpu_count=2, gpu_model="T4") for i in range(6)])
    base = cluster.empty_state()
    stamp = base.stamp
    s1 = base.apply([Assignment(Pod("a", 100, 10), 1)])
    s2 = s1.apply([Assignment(Pod("b", 100, 10), 4), Assignment(Pod("c", 100, 10), 3)])
    changed = s2.changed_since(stamp)
    assert changed is not None
    assert sorted(changed.tolist()) == [1, 3, 4]  # both steps: n1 only in the first
    since_s1 = s2.changed_since(s1.stamp)
    assert since_s1 is not None
    assert sorted(since_s1.tolist()) == [3, 4]
    sibling = base.apply([Assignment(Pod("d", 100, 10), 2)])  # a second branch from base
    sibling = sibling.apply([Assignment(Pod("e", 100, 10), 5)])  # as far along its own log as s1 and further
    assert sibling.changed_since(s1.stamp) is None  # not derived from s1: callers must diff arrays


def test_pods_a_term_selects_are_counted_per_domain_and_the_counts_follow_apply_and_release() -> None:
    c = Cluster([dataclasses.replace(Node(f"n{i}", 8000, 8192), labels={"zone": "ab"[i % 2]}) for i in range(4)])
    term = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), "zone")
    web = dataclasses.replace(pod("w"), labels=(("app", "web"),))
    other = dataclasses.replace(pod("o"), labels=(("app", "db"),))
    first = [Assignment(dataclasses.replace(web, name="w0"), 0), Assignment(other, 1)]
    state = c.empty_state().apply(first)
    assert state.selected_counts(term).tolist() == [1, 0]  # zone a: w0; zone b: only a pod it does not select
    more = [Assignment(dataclasses.replace(web, name="w1"), 2), Assignment(dataclasses.replace(web, name="w2"), 3)]
    grown = state.apply(more)  # carried over from the cached counts
    assert grown.selected_counts(term).tolist() == [2, 1]
    assert c.empty_state().apply(first + more).selected_counts(term).tolist() == [2, 1]  # found afresh
    assert grown.release(more[:1]).selected_counts(term).tolist() == [1, 1]
    asker = dataclasses.replace(pod("x"), preferred_apart=((10, term),))
    penalty = grown.apart_penalty(asker)
    assert penalty is not None
    assert penalty.tolist() == [20, 10, 20, 10]  # the weight once per pod selected


def test_placed_pods_wishes_are_carried_over_as_a_fresh_state_would_find_them() -> None:
    nodes = [Node(f"n{i}", 8000, 8192, labels={"zone": f"z{i % 2}"}) for i in range(4)]
    cluster = Cluster(nodes)
    near = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), "zone")
    away = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), "zone")
    web = Pod("web", 100, 10, labels=(("app", "web"),))
    state = cluster.empty_state().apply([Assignment(Pod("a", 100, 10, preferred_together=((40, near),)), 0)])
    assert list(state.wished(web)) == [-40, 0, -40, 0]  # zone z0: nodes 0 and 2
    later = state.apply([Assignment(Pod("b", 100, 10, preferred_apart=((70, away),)), 1)])
    fresh = ClusterState(cluster, later.cpu_used, later.mem_used, later.gpu_used, residents=later.residents)
    assert list(later.wished(web)) == list(fresh.wished(web)) == [-40, 70, -40, 70]
    quiet = later.apply([Assignment(Pod("c", 100, 10, labels=(("app", "db"),)), 2)])
    assert list(quiet.wished(web)) == [-40, 70, -40, 70]
    assert quiet.wished(Pod("db", 100, 10, labels=(("app", "db"),))) is None  # no term selects it


def test_a_placed_pod_with_a_new_wish_reaches_pods_no_earlier_wish_selected() -> None:
    nodes = [Node(f"n{i}", 8000, 8192, labels={"zone": f"z{i % 2}"}) for i in range(4)]
    cluster = Cluster(nodes)
    web_term = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), "zone")
    db_term = PodAffinityTerm((Requirement("app", "In", ("db",)),), frozenset({"default"}), "zone")
    db = Pod("db", 100, 10, labels=(("app", "db"),))
    state = cluster.empty_state().apply([Assignment(Pod("a", 100, 10, preferred_apart=((30, web_term),)), 0)])
    assert state.wished(db) is None
    assert state.wish_signature(db) == ()
    later = state.apply([Assignment(Pod("b", 100, 10, preferred_apart=((50, db_term),)), 1)])
    assert later.wish_signature(db) == (db_term,)
    assert list(later.wished(db)) == [0, 50, 0, 50]
    web = Pod("web", 100, 10, labels=(("app", "web"),))
    assert list(later.wished(web)) == [30, 0, 30, 0]


def test_a_placed_pods_soft_spread_does_not_weigh_the_pods_after_it() -> None:
    nodes = [Node(f"n{i}", 8000, 8192, labels={"zone": f"z{i % 2}"}) for i in range(4)]
    cluster = Cluster(nodes)
    term = PodAffinityTerm((Requirement("app", "In", ("web",)),), frozenset({"default"}), "zone")
    spreading = Pod("a", 100, 10, labels=(("app", "web"),), preferred_apart=((100, term),), soft_spread=(term,))
    web = Pod("web", 100, 10, labels=(("app", "web"),))
    state = cluster.empty_state()
    assert state.wish_terms == {}  # computed before the apply: carried through it
    assert state.apply([Assignment(spreading, 0)]).wished(web) is None
    fresh = ClusterState(cluster, state.cpu_used, state.mem_used, state.gpu_used, residents={0: (spreading,)})
    assert fresh.wished(web) is None
    wishing = dataclasses.replace(spreading, soft_spread=())  # the same term as preferred anti-affinity
    assert list(state.apply([Assignment(wishing, 0)]).wished(web)) == [100, 0, 100, 0]


def test_a_node_over_committed_before_a_placement_still_takes_pods_asking_no_cpu_or_memory() -> None:
    """Free CPU and memory never go below 0, whether a state is built afresh or derived by
    placing pods (the derived one patches only the rows a placement touched): a node whose
    running pods ask more than its allocatable still takes GPU-only pods, one after another."""
    cluster = Cluster([Node(f"n{i}", 16000, 65536, gpu_count=2, gpu_model="A100") for i in range(10)])
    running = Pod("running", 17000, 70 * 1024, uid="u-running")
    s0 = cluster.empty_state().apply([Assignment(running, 0, ())])
    gpu_only = [Pod(f"g{i}", 0, 0, num_gpu=1, gpu_milli=1000, uid=f"u-g{i}") for i in range(2)]
    assert s0.pod_mask(gpu_only[0])[0]  # computes free CPU and memory, which placing then patches
    s1 = s0.apply([Assignment(gpu_only[0], 0, (0,))])
    assert s1.pod_mask(gpu_only[1])[0]
    assert not s1.pod_mask(Pod("cpu", 1, 0, uid="u-cpu"))[0]  # asking for any CPU: refused there


class TestConsume:
    """``apply(consume=True)``: the arrays a state made for itself are updated in place and handed on."""

    def test_a_consumed_state_hands_its_arrays_on_and_is_spent(self) -> None:
        # Twenty nodes: derived arrays are patched on the rows touched (not recomputed) past eight.
        c = Cluster([Node(f"n{i}", 16000, 65536, gpu_count=4, gpu_model="A100") for i in range(20)])
        s1 = c.empty_state().apply([Assignment(pod("a", cpu=1000, gpus=1, milli=300), 0, (0,))])
        _ = (s1.cpu_free, s1.gpu_free, s1.full_free_gpus)
        arrays = (s1.cpu_used, s1.gpu_used, s1.cpu_free, s1.gpu_free, s1.full_free_gpus)
        s2 = s1.apply([Assignment(pod("b", cpu=2000, gpus=2, milli=1000), 1, (0, 1))], consume=True)
        now = (s2.cpu_used, s2.gpu_used, s2.cpu_free, s2.gpu_free, s2.full_free_gpus)
        for a, b in zip(arrays, now, strict=True):
            assert b is a  # no copy
        assert s2.cpu_used.tolist()[:3] == [1000, 2000, 0]
        assert s2.gpu_used[1].tolist() == [1000, 1000, 0, 0]
        assert s2.full_free_gpus.tolist()[:3] == [3, 2, 4]
        with pytest.raises(ValueError, match="read-only"):
            s2.cpu_used[0] = 0  # read-only again
        assert s1.cpu_used is None
        assert s1.cluster is None
        with pytest.raises((TypeError, AttributeError)):
            _ = s1.cpu_free
        fresh = ClusterState(c, s2.cpu_used.copy(), s2.mem_used.copy(), s2.gpu_used.copy())
        for name in ("cpu_free", "mem_free", "gpu_free", "full_free_gpus", "max_gpu_free"):
            assert (getattr(s2, name) == getattr(fresh, name)).all(), name

    def test_a_state_not_made_by_apply_is_copied_and_stays_readable(self) -> None:
        s0 = make_cluster().empty_state()
        s1 = s0.apply([Assignment(pod("a", cpu=1000), 0)], consume=True)
        assert s0.cpu_used.tolist() == [0, 0, 0, 0]
        assert s1.cpu_used is not s0.cpu_used
        assert s1.cpu_used.tolist() == [1000, 0, 0, 0]

    def test_arrays_shared_with_the_parent_are_copied_not_updated(self) -> None:
        # s1 made cpu, memory and GPU arrays for itself but shares s0's storage array: consuming
        # s1 must leave s0's storage as it was.
        c = Cluster([Node(f"n{i}", 8000, 8192, storage_mib=10000) for i in range(3)])
        s0 = c.empty_state().apply([Assignment(Pod("disk", 100, 10, storage_mib=500), 0)])
        s1 = s0.apply([Assignment(Pod("plain", 100, 10), 1)])
        assert s1.storage_used is s0.storage_used
        s2 = s1.apply([Assignment(Pod("disk2", 100, 10, storage_mib=700), 2)], consume=True)
        assert s0.storage_used is not None
        assert s0.storage_used.tolist() == [500, 0, 0]
        assert s0.cpu_used.tolist() == [100, 0, 0]
        assert s2.storage_used is not None
        assert s2.storage_used.tolist() == [500, 0, 700]
        assert s2.cpu_used.tolist() == [100, 100, 100]

    def test_in_place_only_along_the_change_log(self) -> None:
        # A state that is not the newest of its log cannot extend it; without a log to say which
        # rows changed, a cache that kept its arrays could not tell: it is copied instead.
        s0 = make_cluster().empty_state()
        s1 = s0.apply([Assignment(pod("a", cpu=10), 0)])
        s2 = s1.apply([Assignment(pod("b", cpu=10), 1)])
        s3 = s1.apply([Assignment(pod("c", cpu=10), 2)], consume=True)  # s1 is no longer the newest
        assert s3.cpu_used is not s1.cpu_used
        assert s1.cpu_used.tolist() == [10, 0, 0, 0]
        assert s2.cpu_used.tolist() == [10, 10, 0, 0]
        assert s3.cpu_used.tolist() == [10, 0, 10, 0]
        assert s2.changed_since(s1.stamp) is not None
        s4 = s2.apply([Assignment(pod("d", cpu=10), 3)], consume=True)  # s2 is: in place
        changed = s4.changed_since(s1.stamp)
        assert changed is not None
        assert changed.tolist() == [1, 3]
        assert ClusterState.changed_after(s1.stamp).tolist() == [1, 3]
