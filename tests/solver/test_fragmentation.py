"""Fragmentation against typical pods, hand-computed on one- and two-node clusters.

The definition (module docstring of ``gpusched.solver.fragmentation``): against a
typical pod that cannot run on a node, all of the node's idle GPU share is
fragmented; when it can run, only the GPUs whose free share is below its
per-GPU request.  A node's fragmentation is the frequency-weighted sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Pod
from gpusched.solver import fragmentation
from gpusched.solver.baselines import FgdPolicy
from gpusched.solver.fragmentation import (
    FragScorer,
    TypicalPods,
    TypicalShape,
    cluster_frag_ratio,
    node_fragmentation,
    score_cpu,
)
from gpusched.solver.registry import make_policy
from gpusched.solver.solve import CpSatPolicy
from gpusched.solver.typical import TypicalTracker
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod


def busy(cluster: Cluster, gpu: dict[int, list[int]], cpu: dict[int, int] | None = None) -> ClusterState:
    """A state where GPU g of node n has ``gpu[n][g]`` thousandths in use and node n ``cpu[n]`` millicores."""
    old: list[Assignment] = []
    for n, per_gpu in gpu.items():
        for g, milli in enumerate(per_gpu):
            if milli:
                old.append(Assignment(Pod(f"old-{n}-{g}", 0, 0, num_gpu=1, gpu_milli=milli), n, (g,)))
    for n, c in (cpu or {}).items():
        old.append(Assignment(Pod(f"old-cpu-{n}", c, 0), n))
    return cluster.empty_state().apply(old)


def typical(*pods: Pod) -> TypicalPods:
    return TypicalPods.from_pods(pods, coverage=1.0)


def frag(state: ClusterState, typ: TypicalPods, node: int = 0) -> float:
    return float(node_fragmentation(state, typ)[node])


# --- node fragmentation, by hand --------------------------------------------------------------


def test_typical_pod_that_cannot_run_makes_all_idle_gpu_fragmented() -> None:
    cluster = Cluster([gpu_node(gpus=2)])
    state = busy(cluster, {0: [300, 0]})  # free [700, 1000]
    # A 2-GPU pod needs two idle GPUs; only one is idle, so 700 + 1000 are fragmented.
    assert frag(state, typical(pod("t", gpus=2))) == 1700
    # A 1-GPU pod can run on GPU 1; only GPU 0 (700 < 1000) is fragmented.
    assert frag(state, typical(pod("t", gpus=1))) == 700


@pytest.mark.parametrize(
    ("typical_pod", "expected"),
    [
        (pod("t", gpus=1, milli=500), 400 + 100),  # runs on GPU 0 or 1; 400 and 100 are below 500
        (pod("t", gpus=1, milli=200), 100),
        (pod("t", gpus=1, milli=800), 700 + 400 + 100),
        (pod("t", gpus=1), 700 + 400 + 100),  # whole GPU: every partly used GPU counts
        (pod("t", gpus=1, milli=100), 0),  # every GPU fits it
    ],
)
def test_when_typical_pod_runs_only_gpus_below_its_request_count(typical_pod: Pod, expected: int) -> None:
    cluster = Cluster([gpu_node(gpus=4)])
    state = busy(cluster, {0: [0, 300, 600, 900]})  # free [1000, 700, 400, 100]
    assert frag(state, typical(typical_pod)) == expected


def test_cpu_shortage_makes_all_idle_gpu_fragmented() -> None:
    cluster = Cluster([gpu_node(gpus=4, cpu=8000)])
    state = busy(cluster, {0: [0, 300, 600, 900]}, cpu={0: 7500})  # 500m CPU left, 2200 GPU idle
    assert frag(state, typical(pod("t", cpu=1000, gpus=1, milli=500))) == 2200
    assert frag(state, typical(pod("t", cpu=500, gpus=1, milli=500))) == 500  # exactly enough CPU


def test_gpu_model_not_accepted_makes_all_idle_gpu_fragmented() -> None:
    cluster = Cluster([gpu_node(gpus=4, model="A100")])
    state = busy(cluster, {0: [0, 300, 600, 900]})
    assert frag(state, typical(pod("t", gpus=1, milli=500, models=["V100"]))) == 2200
    assert frag(state, typical(pod("t", gpus=1, milli=500, models=["V100", "A100"]))) == 500


def test_cpu_only_typical_pod_counts_all_idle_gpu() -> None:
    cluster = Cluster([gpu_node(gpus=4)])
    state = busy(cluster, {0: [0, 300, 600, 900]})
    assert frag(state, typical(pod("t", cpu=1000))) == 2200


def test_no_idle_gpu_means_no_fragmentation() -> None:
    cluster = Cluster([gpu_node("full", gpus=2), Node("cpu", 8000, 32768)])
    state = busy(cluster, {0: [1000, 1000]})
    for t in (pod("t", cpu=1000), pod("t", gpus=2), pod("t", gpus=1, milli=100)):
        np.testing.assert_array_equal(node_fragmentation(state, typical(t)), [0.0, 0.0])


def test_fragmentation_is_the_frequency_weighted_sum() -> None:
    cluster = Cluster([gpu_node(gpus=4)])
    state = busy(cluster, {0: [0, 300, 600, 900]})
    typ = TypicalPods.from_pods(
        [pod(f"f{i}", gpus=1, milli=500) for i in range(3)] + [pod("c", cpu=1000)], coverage=1.0
    )
    assert sorted(typ.weights) == [0.25, 0.75]
    assert frag(state, typ) == pytest.approx(0.75 * 500 + 0.25 * 2200)


def test_zero_cpu_request_counts_as_100m_in_fragmentation() -> None:
    cluster = Cluster([gpu_node("short", gpus=2), gpu_node("enough", gpus=2)])
    state = busy(cluster, {0: [600, 0], 1: [600, 0]}, cpu={0: 8000 - 99, 1: 8000 - 100})
    typ = typical(pod("t", cpu=0, gpus=1, milli=500))
    assert typ.shapes[0].cpu_milli == 100
    # 99m left: the typical pod "needs" 100m, cannot run, everything idle counts; 100m left: only 400.
    np.testing.assert_array_equal(node_fragmentation(state, typ), [1400.0, 400.0])


def test_zero_cpu_pod_consumes_100m_in_delta_but_still_fits() -> None:
    cluster = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    state = busy(cluster, {0: [600, 0], 1: [600, 0]}, cpu={0: 8000 - 150, 1: 8000 - 50})
    typ = typical(pod("t", cpu=0, gpus=1, milli=500))  # needs 100m as fragmentation sees it
    delta, score, _ = FragScorer(cluster, typ).delta(state, pod("p", cpu=0).shape)
    # Node a: 150m -> 50m "left", the typical pod no longer runs: 400 -> 1400.
    assert delta[0] == 1000
    # Node b has 50m: the 0m pod fits (the fit filter uses the real request), nothing changes.
    assert delta[1] == 0
    assert score[0] == int(100 / (1 + math.exp(1.0)))
    assert score[1] == 50
    assert score_cpu(0) == 100
    assert score_cpu(250) == 250


def test_cluster_frag_ratio() -> None:
    cluster = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=1), Node("c", 4000, 4096)])
    state = busy(cluster, {0: [300, 0], 1: [1000]})
    typ = typical(pod("t", gpus=1))
    assert cluster_frag_ratio(state, typ) == pytest.approx(700 / 1700)
    full = busy(cluster, {0: [1000, 1000], 1: [1000]})
    assert cluster_frag_ratio(full, typ) == 0.0


# --- typical pods ------------------------------------------------------------------------------


def _pods_of(counts: Sequence[tuple[Pod, int]]) -> list[Pod]:
    """``c`` pods shaped like each ``(pod, c)``."""
    return [pod(f"{p.name}-{i}", p.cpu_milli, p.num_gpu, p.gpu_milli) for p, c in counts for i in range(c)]


def test_typical_pods_cut_off_at_95_percent_and_order_by_count() -> None:
    a, b, c, d = (
        pod("a", gpus=1, milli=500),
        pod("b", gpus=1),
        pod("c", cpu=2000),
        pod("d", gpus=2),
    )
    # 50 + 30 + 16 = 96 >= 95 of 100: the 4 pods of shape d are left out.
    pods = _pods_of([(c, 16), (d, 4), (a, 50), (b, 30)])
    assert len(pods) == 100
    typ = TypicalPods.from_pods(pods)
    assert [(s.num_gpu, s.gpu_milli, s.cpu_milli) for s in typ.shapes] == [
        (1, 500, 1000),
        (1, 1000, 1000),
        (0, 0, 2000),
    ]
    assert typ.weights == pytest.approx((50 / 96, 30 / 96, 16 / 96))
    assert sum(typ.weights) == pytest.approx(1.0)
    assert len(TypicalPods.from_pods(pods, coverage=1.0)) == 4


def test_typical_pods_stop_as_soon_as_coverage_is_reached() -> None:
    pods = _pods_of([(pod("a", gpus=1), 95), (pod("b", cpu=3000), 5)])
    typ = TypicalPods.from_pods(pods)
    assert typ.shapes == (TypicalShape(1000, 1000, 1, frozenset()),)
    assert typ.weights == (1.0,)


def test_typical_pods_ties_put_the_larger_shape_first() -> None:
    pods = _pods_of([(pod("small", cpu=1000), 2), (pod("big", cpu=4000), 2), (pod("gpu", cpu=1000, gpus=1), 2)])
    typ = TypicalPods.from_pods(pods, coverage=1.0)
    assert [(s.cpu_milli, s.gpu_milli) for s in typ.shapes] == [(4000, 0), (1000, 1000), (1000, 0)]
    assert typ.weights == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_typical_pods_merge_zero_cpu_with_100m_and_ignore_memory() -> None:
    pods = [
        pod("z", cpu=0, gpus=1, milli=300, mem=1),
        pod("h", cpu=100, gpus=1, milli=300, mem=99999),
        pod("o", cpu=200, gpus=1, milli=300),
    ]
    typ = TypicalPods.from_pods(pods, coverage=1.0)
    assert typ.shapes == (
        TypicalShape(100, 300, 1, frozenset()),
        TypicalShape(200, 300, 1, frozenset()),
    )
    assert typ.weights == pytest.approx((2 / 3, 1 / 3))


def test_typical_pods_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        TypicalPods.from_pods([])


# --- FragScorer ---------------------------------------------------------------------------------


def brute_delta(state: ClusterState, typ: TypicalPods, p: Pod, n: int) -> tuple[float, int]:
    """(fragmentation added, GPU index or -1) of placing ``p`` on node ``n``, from scratch.

    inf where it cannot go.  Needs ``p.cpu_milli > 0`` (the fragmentation CPU then equals the real one).
    """
    assert p.cpu_milli > 0
    cl = state.cluster
    node = cl.nodes[n]
    if state.cpu_free[n] < p.cpu_milli or (p.num_gpu and not p.shape.accepts(node.gpu_model)):
        return math.inf, -1
    before = frag(state, typ, n)
    free = [int(f) for f in state.gpu_free[n, : node.gpu_count]]
    if p.is_fractional:
        best: tuple[int, int, float] | None = None  # (-score, index, delta)
        for g, f in enumerate(free):
            if f >= p.gpu_milli:
                d = frag(state.apply([Assignment(p, n, (g,))]), typ, n) - before
                s = int(100 / (1 + math.exp(d / 1000)))
                if best is None or (-s, g) < best[:2]:
                    best = (-s, g, d)
        return (math.inf, -1) if best is None else (best[2], best[1])
    gpus = tuple(g for g, f in enumerate(free) if f >= GPU_MILLI)[: p.num_gpu]
    if len(gpus) < p.num_gpu:
        return math.inf, -1
    return frag(state.apply([Assignment(p, n, gpus)]), typ, n) - before, -1


SCORER_CLUSTER = Cluster(
    [
        gpu_node("a", gpus=4, cpu=8000),
        gpu_node("b", gpus=2, cpu=4000, model="V100"),
        gpu_node("c", gpus=8, cpu=16000),
        Node("cpu", 8000, 32768),
    ]
)
SCORER_TYPICAL = TypicalPods.from_pods(
    [pod("t1", gpus=1, milli=500)] * 3
    + [pod("t2", cpu=2000, gpus=1)] * 2
    + [pod("t3", gpus=2, models=["A100"])]
    + [pod("t4", cpu=3000)],
    coverage=1.0,
)
SCORER_SHAPES = [
    pod("frac", cpu=500, gpus=1, milli=300),
    pod("frac-v100", cpu=500, gpus=1, milli=700, models=["V100"]),
    pod("one", cpu=1000, gpus=1),
    pod("two", cpu=2000, gpus=2),
    pod("cpu", cpu=1500),
]


@pytest.mark.parametrize("chunk", [fragmentation.CHUNK_ROWS, 2])
def test_delta_matches_recomputation_from_scratch(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows and candidate GPUs are processed CHUNK_ROWS at a time; chunk boundaries must not show.
    monkeypatch.setattr(fragmentation, "CHUNK_ROWS", chunk)
    state = busy(SCORER_CLUSTER, {0: [0, 250, 600, 1000], 1: [500, 0], 2: [0] * 7 + [900]}, cpu={0: 5000})
    _assert_brute_force(FragScorer(SCORER_CLUSTER, SCORER_TYPICAL), state)


def _assert_brute_force(scorer: FragScorer, state: ClusterState) -> None:
    """Every node's delta, score and GPU for every shape are what a brute-force placement gives."""
    for p in SCORER_SHAPES:
        delta, score, gpu = scorer.delta(state, p.shape)
        for n in range(len(state.cluster)):
            want_d, want_g = brute_delta(state, SCORER_TYPICAL, p, n)
            assert delta[n] == pytest.approx(want_d), (p.name, n)
            assert gpu[n] == want_g, (p.name, n)
            assert score[n] == (-1 if math.isinf(want_d) else int(100 / (1 + math.exp(want_d / 1000)))), (p.name, n)


# Every node of SCORER_CLUSTER four times over, some copies busy: many nodes share a state.
MANY = Cluster([replace(n, name=f"{n.name}-{k}") for k in range(4) for n in SCORER_CLUSTER.nodes])


@pytest.mark.parametrize("mix", ["real", "colliding"])
def test_nodes_alike_are_scored_once_and_each_gets_what_it_would_alone(
    mix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes in the same state are scored once for all of them; the answer is each node's own
    (checked by brute force), also when two different states hash alike."""
    monkeypatch.setattr(fragmentation, "DEDUP_ROWS", 1)
    if mix == "colliding":  # every row mixes to 0: all of them hash alike
        monkeypatch.setattr(fragmentation, "_MIX", np.zeros(256, dtype=np.int64))
    state = busy(MANY, {0: [0, 250, 600, 1000], 5: [500, 0], 4: [0, 250, 600, 1000], 6: [0] * 7 + [900]}, {8: 5000})
    _assert_brute_force(FragScorer(MANY, SCORER_TYPICAL), state)


def test_distinct_rows_groups_exactly_the_equal_rows() -> None:
    key = np.array([[1, 2, 3], [4, 5, 6], [1, 2, 3], [0, 0, 0], [4, 5, 6]], dtype=np.int64)
    alike = fragmentation._distinct_rows(key)
    assert alike is not None
    first, inverse = alike
    assert first.size == 3
    np.testing.assert_array_equal(key[first[inverse]], key)
    assert inverse[0] == inverse[2] != inverse[1] == inverse[4] != inverse[3]


def _assert_scorers_agree(cached: FragScorer, state: ClusterState) -> None:
    fresh = FragScorer(state.cluster, cached.typical)
    np.testing.assert_allclose(cached.current(state), fresh.current(state), atol=1e-9)
    for p in SCORER_SHAPES:
        d1, s1, g1 = cached.delta(state, p.shape)
        d2, s2, g2 = fresh.delta(state, p.shape)
        np.testing.assert_allclose(d1, d2, atol=1e-9)
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(g1, g2)
        if p.is_fractional:
            np.testing.assert_allclose(cached.gpu_delta(state, p.shape), fresh.gpu_delta(state, p.shape), atol=1e-9)


def test_delta_cache_equals_fresh_scorer_after_a_sequence_of_placements() -> None:
    state = SCORER_CLUSTER.empty_state()
    scorer = FragScorer(SCORER_CLUSTER, SCORER_TYPICAL)
    steps = [
        Assignment(pod("s1", cpu=500, gpus=1, milli=300), 0, (1,)),
        Assignment(pod("s2", cpu=2000, gpus=2), 2, (0, 1)),
        Assignment(pod("s3", cpu=4000), 0),
        Assignment(pod("s4", cpu=500, gpus=1, milli=700, models=["V100"]), 1, (0,)),
        Assignment(pod("s5", cpu=500, gpus=1, milli=300), 0, (1,)),
        Assignment(pod("s6", cpu=1000), 3),
    ]
    _assert_scorers_agree(scorer, state)
    history = [state]
    for a in steps:
        before = scorer.delta(state, SCORER_SHAPES[0].shape)[0].copy()
        state = state.apply([a])
        history.append(state)
        _assert_scorers_agree(scorer, state)
        after = scorer.delta(state, SCORER_SHAPES[0].shape)[0]
        # Only the node that changed may change.
        other = np.arange(len(SCORER_CLUSTER)) != a.node
        np.testing.assert_array_equal(before[other], after[other])
    # Going back to earlier states (a release, or a replay) must not serve stale entries either.
    for old in reversed(history):
        _assert_scorers_agree(scorer, old)
    _assert_scorers_agree(scorer, state.release([steps[2], steps[4]]))


@st.composite
def placement_sequences(draw: st.DrawFn) -> list[tuple[int, Pod]]:
    seq = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["cpu", "frac", "whole"]))
        cpu = draw(st.integers(1, 6)) * 500
        if kind == "cpu":
            p = pod(f"q{i}", cpu=cpu)
        elif kind == "frac":
            p = pod(f"q{i}", cpu=cpu, gpus=1, milli=draw(st.sampled_from([100, 250, 300, 500, 700, 950])))
        else:
            p = pod(f"q{i}", cpu=cpu, gpus=draw(st.integers(1, 3)))
        seq.append((draw(st.integers(0, len(SCORER_CLUSTER) - 1)), p))
    return seq


@settings(max_examples=60, deadline=None)
@given(placement_sequences())
def test_delta_cache_property(seq: list[tuple[int, Pod]]) -> None:
    state = SCORER_CLUSTER.empty_state()
    scorer = FragScorer(SCORER_CLUSTER, SCORER_TYPICAL)
    for n, p in seq:
        scorer.delta(state, p.shape)
        if not state.fit_mask(p.shape)[n]:
            continue
        if p.is_fractional:
            g = int(np.flatnonzero(state.gpu_free[n] >= p.gpu_milli)[0])
            gpus: tuple[int, ...] = (g,)
        else:
            gpus = tuple(int(g) for g in np.flatnonzero(state.gpu_free[n] >= GPU_MILLI)[: p.num_gpu])
        state = state.apply([Assignment(p, n, gpus)])
        _assert_scorers_agree(scorer, state)


def test_fractional_pod_goes_to_gpu_that_adds_least_fragmentation() -> None:
    cluster = Cluster([gpu_node(gpus=2)])
    state = busy(cluster, {0: [400, 450]})  # free [600, 550]
    typ = typical(pod("t", gpus=1, milli=500))
    p = pod("p", gpus=1, milli=100)
    scorer = FragScorer(cluster, typ)
    delta, score, gpu = scorer.delta(state, p.shape)
    # GPU 0: 600 -> 500 still fits a typical pod (+0); GPU 1 (the tightest): 550 -> 450 strands 450.
    np.testing.assert_allclose(scorer.gpu_delta(state, p.shape)[0], [0.0, 450.0])
    assert gpu[0] == 0
    assert delta[0] == 0
    assert score[0] == 50
    plan = FgdPolicy(cluster, typ).place([p], state)
    assert [(a.node, a.gpus) for a in plan.assignments] == [(0, (0,))]


def test_fractional_pod_ties_go_to_lowest_gpu_index_and_unfit_gpus_are_inf() -> None:
    cluster = Cluster([gpu_node(gpus=4)])
    state = busy(cluster, {0: [0, 600, 600, 800]})  # free [1000, 400, 400, 200]
    typ = typical(pod("t", gpus=1, milli=500))
    p = pod("p", gpus=1, milli=400)
    scorer = FragScorer(cluster, typ)
    per_gpu = scorer.gpu_delta(state, p.shape)[0]
    # Filling GPU 1 or 2 removes 400 of fragmentation; GPU 0 (1000 -> 600) changes nothing;
    # GPU 3 does not fit.
    np.testing.assert_allclose(per_gpu, [0.0, -400.0, -400.0, math.inf])
    _, score, gpu = scorer.delta(state, p.shape)
    assert gpu[0] == 1
    assert score[0] == int(100 / (1 + math.exp(-0.4)))


def test_scorer_marks_nodes_that_cannot_host_as_inf() -> None:
    cluster = Cluster([gpu_node("a100", gpus=2), gpu_node("v100", gpus=2, model="V100"), Node("cpu", 64000, 1)])
    state = busy(cluster, {0: [0, 1000]})
    scorer = FragScorer(cluster, typical(pod("t", gpus=1)))
    d, s, _ = scorer.delta(state, pod("two", gpus=2).shape)
    assert np.isinf(d[[0, 2]]).all()
    assert np.isfinite(d[1])
    assert list(s[[0, 2]]) == [-1, -1]
    d, _, _ = scorer.delta(state, pod("v", gpus=1, milli=500, models=["V100"]).shape)
    assert np.isinf(d[[0, 2]]).all()
    assert np.isfinite(d[1])
    d, _, _ = scorer.delta(state, pod("big", cpu=9000).shape)
    assert np.isinf(d[[0, 1]]).all()
    assert d[2] == 0


# --- a from-scratch reference for the definition, under random states ---------------------------


def reference_frag(cpu_free: int, gpu_free: Sequence[int], model: str, typ: TypicalPods) -> float:
    idle = sum(gpu_free)
    total = 0.0
    for shape, w in zip(typ.shapes, typ.weights, strict=True):
        runs = (
            shape.num_gpu > 0
            and cpu_free >= shape.cpu_milli
            and bool(model)
            and (not shape.gpu_models or model in shape.gpu_models)
            and sum(f >= shape.gpu_milli for f in gpu_free) >= shape.num_gpu
        )
        total += w * (sum(f for f in gpu_free if f < shape.gpu_milli) if runs else idle)
    return total


@st.composite
def states(draw: st.DrawFn) -> ClusterState:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.integers(0, 4))
        nodes.append(
            gpu_node(
                f"n{i}",
                gpus=gpus,
                cpu=draw(st.integers(0, 8)) * 1000,
                model=draw(st.sampled_from(["A100", "T4"])),
            )
        )
    cluster = Cluster(nodes)
    gpu = {
        n: [draw(st.sampled_from([0, 0, 100, 300, 500, 750, 1000])) for _ in range(node.gpu_count)]
        for n, node in enumerate(cluster.nodes)
    }
    cpu = {n: draw(st.integers(0, node.cpu_milli // 250)) * 250 for n, node in enumerate(cluster.nodes)}
    return busy(cluster, gpu, {n: c for n, c in cpu.items() if c})


TYPICAL_CHOICES = [
    pod("a", cpu=0, gpus=1, milli=300),
    pod("b", cpu=2000, gpus=1, milli=600, models=["T4"]),
    pod("c", cpu=1000, gpus=1),
    pod("d", cpu=4000, gpus=2, models=["A100"]),
    pod("e", cpu=500),
]


@settings(max_examples=80, deadline=None)
@given(states(), st.lists(st.sampled_from(TYPICAL_CHOICES), min_size=1, max_size=12))
def test_node_fragmentation_matches_the_definition(state: ClusterState, workload: list[Pod]) -> None:
    typ = TypicalPods.from_pods(workload)
    got = node_fragmentation(state, typ)
    for n, node in enumerate(state.cluster.nodes):
        free = [int(f) for f in state.gpu_free[n, : node.gpu_count]]
        want = reference_frag(int(state.cpu_free[n]), free, node.gpu_model, typ)
        assert got[n] == pytest.approx(want, abs=1e-6)
        assert 0 <= got[n] <= sum(free) + 1e-6


# --- typical pods learnt online ------------------------------------------------------------------


def test_tracker_needs_pods_then_rederives_after_25_percent_growth() -> None:
    cluster = Cluster([gpu_node(gpus=2)])
    tracker = TypicalTracker(cluster)
    with pytest.raises(ValueError, match="observe"):
        _ = tracker.scorer
    tracker.observe([pod(f"w{i}", gpus=1) for i in range(4)])
    first = tracker.scorer
    assert first.typical.shapes == (TypicalShape(1000, 1000, 1, frozenset()),)
    assert tracker.scorer is first  # nothing new seen: caches are kept
    tracker.observe([pod("c", cpu=2000)])  # 5 >= 4 * 1.25
    second = tracker.scorer
    assert second is not first
    assert len(second.typical) == 2
    tracker.observe([pod("c2", cpu=2000)])  # 6 < 5 * 1.25
    assert tracker.scorer is second


def test_tracker_with_fixed_typical_pods_never_changes_them() -> None:
    cluster = Cluster([gpu_node(gpus=2)])
    fixed = typical(pod("t", gpus=2))
    tracker = TypicalTracker(cluster, fixed)
    scorer = tracker.scorer
    tracker.observe([pod(f"c{i}", cpu=500) for i in range(10)])
    assert tracker.scorer is scorer
    assert scorer.typical == fixed


def test_cpsat_learns_typical_pods_unless_it_is_given_them() -> None:
    cluster = Cluster([gpu_node(gpus=2)])
    given = TypicalPods.from_pods([pod("t", gpus=1)], coverage=1.0)
    learning = make_policy("cpsat", cluster, given, 0)
    fixed = make_policy("cpsat", cluster, given, 0, learn_typical=False)
    assert isinstance(learning, CpSatPolicy)
    assert isinstance(fixed, CpSatPolicy)
    state = cluster.empty_state()
    share = pod("s", gpus=1, milli=300)
    for p in (learning, fixed):
        validate_plan(p.place([share], state), state, [share])
    # The learner now scores against the shape it saw; the other still against the one it was given.
    assert [s.gpu_milli for s in learning.tracker.scorer.typical.shapes] == [300]
    assert learning.tracker.scorer.typical != given
    assert fixed.tracker.scorer.typical == given


def test_scores_cached_from_arrays_later_updated_in_place_are_not_served_stale() -> None:
    # The scorer keeps the arrays of the last state it saw; a greedy pass then updates them in
    # place.  A snapshot built afresh with the same usage as the pass's end (the daemon's next
    # batch, with the pod bound where the pass put it) must not look unchanged to the scorer.
    scorer = FragScorer(SCORER_CLUSTER, SCORER_TYPICAL)
    s1 = SCORER_CLUSTER.empty_state().apply([Assignment(pod("a", cpu=1000, gpus=1), 0, (0,))])
    _assert_scorers_agree(scorer, s1)
    s2 = s1.apply([Assignment(pod("b", cpu=2000, gpus=2), 2, (0, 1))], consume=True)
    s3 = s2.apply([Assignment(pod("c", cpu=500, gpus=1, milli=300), 1, (0,))], consume=True)
    snapshot = ClusterState(SCORER_CLUSTER, s3.cpu_used.copy(), s3.mem_used.copy(), s3.gpu_used.copy())
    _assert_scorers_agree(scorer, snapshot)
