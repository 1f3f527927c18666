"""Properties of ClusterState under random sequences of pods that fit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.solver.validate import plan_problems

MODELS = ("A100", "T4", "V100")


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    # At least 9 nodes: apply() patches cached free arrays row by row only when it touches
    # under an eighth of the cluster; smaller clusters would always recompute them afresh.
    n = draw(st.integers(9, 20))
    nodes = []
    for i in range(n):
        gpus = draw(st.integers(0, 4))
        nodes.append(
            Node(
                f"n{i}",
                cpu_milli=draw(st.integers(0, 8)) * 1000,
                memory_mib=draw(st.integers(0, 8)) * 1024,
                gpu_count=gpus,
                gpu_model=draw(st.sampled_from(MODELS)) if gpus else "",
            )
        )
    return Cluster(nodes)


@st.composite
def pods(draw: st.DrawFn, i: int) -> Pod:
    kind = draw(st.sampled_from(["cpu", "frac", "whole"]))
    num_gpu, milli = 0, 0
    if kind == "frac":
        num_gpu, milli = 1, draw(st.sampled_from([1, 100, 250, 500, 700, 999]))
    elif kind == "whole":
        num_gpu, milli = draw(st.integers(1, 3)), GPU_MILLI
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    return Pod(
        f"p{i}",
        cpu_milli=draw(st.integers(0, 4)) * 500,
        memory_mib=draw(st.integers(0, 4)) * 512,
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_models=models,
    )


@dataclass
class Usage:
    """A plain-Python mirror of cluster usage, for brute-force checks."""

    cpu: list[int]
    mem: list[int]
    gpu: list[list[int]]


def brute_fits(cluster: Cluster, use: Usage, p: Pod, n: int) -> bool:
    node = cluster.nodes[n]
    if use.cpu[n] + p.cpu_milli > node.cpu_milli or use.mem[n] + p.memory_mib > node.memory_mib:
        return False
    if p.num_gpu == 0:
        return True
    if node.gpu_count == 0 or (p.gpu_models and node.gpu_model not in p.gpu_models):
        return False
    free = [GPU_MILLI - u for u in use.gpu[n][: node.gpu_count]]
    if p.is_fractional:
        return any(f >= p.gpu_milli for f in free)
    return sum(f == GPU_MILLI for f in free) >= p.num_gpu


def choose_gpus(cluster: Cluster, use: Usage, p: Pod, n: int) -> tuple[int, ...]:
    free = [GPU_MILLI - u for u in use.gpu[n][: cluster.nodes[n].gpu_count]]
    if p.num_gpu == 0:
        return ()
    if p.is_fractional:
        return (next(g for g, f in enumerate(free) if f >= p.gpu_milli),)
    return tuple([g for g, f in enumerate(free) if f == GPU_MILLI][: p.num_gpu])


DERIVED = ("cpu_free", "mem_free", "gpu_free", "full_free_gpus", "max_gpu_free")


@settings(max_examples=150, deadline=None)
@given(cluster=clusters(), data=st.data())
def test_fitting_pods_keep_free_non_negative_and_fit_mask_matches_brute_force(
    cluster: Cluster, data: st.DataObject
) -> None:
    n = len(cluster)
    use = Usage([0] * n, [0] * n, [[0] * cluster.max_gpus for _ in range(n)])
    state: ClusterState = cluster.empty_state()
    applied: list[Assignment] = []
    for i in range(data.draw(st.integers(1, 25), label="pods")):
        p = data.draw(pods(i), label=f"pod {i}")
        mask = state.fit_mask(p.shape)
        expected = [brute_fits(cluster, use, p, j) for j in range(n)]
        assert mask.tolist() == expected, p
        fitting = [j for j in range(n) if expected[j]]
        if not fitting:
            continue
        node = data.draw(st.sampled_from(fitting), label=f"node for pod {i}")
        a = Assignment(p, node, choose_gpus(cluster, use, p, node))
        assert plan_problems(Plan((a,), ()), state) == []
        for name in DERIVED:  # computed before apply, so that apply carries them, patched
            getattr(state, name)
        state = state.apply([a])
        applied.append(a)
        use.cpu[node] += p.cpu_milli
        use.mem[node] += p.memory_mib
        for g in a.gpus:
            use.gpu[node][g] += p.gpu_milli
        assert state.cpu_used.tolist() == use.cpu
        assert state.mem_used.tolist() == use.mem
        assert state.gpu_used.tolist() == use.gpu
        caps = [(nd.cpu_milli, nd.memory_mib, nd.gpu_count) for nd in cluster.nodes]
        assert state.cpu_free.tolist() == [c - u for (c, _, _), u in zip(caps, use.cpu, strict=True)]
        assert state.mem_free.tolist() == [m - u for (_, m, _), u in zip(caps, use.mem, strict=True)]
        gpu_free = [
            [GPU_MILLI - u if g < k else 0 for g, u in enumerate(row)]
            for (_, _, k), row in zip(caps, use.gpu, strict=True)
        ]
        assert state.gpu_free.tolist() == gpu_free
        fresh = ClusterState(cluster, state.cpu_used, state.mem_used, state.gpu_used)
        for name in DERIVED:
            assert getattr(state, name).tolist() == getattr(fresh, name).tolist(), name
    empty = state.release(applied)
    assert not np.any(empty.cpu_used)
    assert not np.any(empty.mem_used)
    assert not np.any(empty.gpu_used)


APPS = ("a", "b", "c")


@st.composite
def wishing_pods(draw: st.DrawFn, i: int) -> Pod:
    terms = []
    for _ in range(draw(st.integers(0, 2))):
        app = draw(st.sampled_from(APPS))
        key = draw(st.sampled_from(["zone", "rack"]))  # rack: only some nodes have it
        terms.append((draw(st.integers(1, 100)), PodAffinityTerm((Requirement("app", "In", (app,)),), None, key)))
    apart = [t for t in terms if draw(st.booleans())]
    together = [t for t in terms if t not in apart]
    soft = tuple(t for _, t in apart if draw(st.booleans()))
    label = draw(st.sampled_from(APPS))
    return Pod(
        f"p{i}",
        10,
        10,
        labels=(("app", label),),
        preferred_apart=tuple(apart),
        preferred_together=tuple(together),
        soft_spread=soft,
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_placed_wishes_carried_through_applies_are_what_a_fresh_state_finds(data: st.DataObject) -> None:
    nodes = [
        Node(f"n{i}", 100_000, 100_000, labels={"zone": f"z{i % 2}", **({"rack": "r0"} if i < 2 else {})})
        for i in range(4)
    ]
    cluster = Cluster(nodes)
    probes = [Pod(f"probe-{a}", 10, 10, labels=(("app", a),)) for a in APPS]
    state = cluster.empty_state()
    for step in range(data.draw(st.integers(1, 6))):
        for p in probes:  # fill the caches, so that the next apply carries them
            state.wished(p)
        batch = [data.draw(wishing_pods(10 * step + j)) for j in range(data.draw(st.integers(1, 3)))]
        state = state.apply([Assignment(p, data.draw(st.integers(0, 3))) for p in batch])
        fresh = ClusterState(cluster, state.cpu_used, state.mem_used, state.gpu_used, residents=state.residents)
        for p in probes:
            carried, found = state.wished(p), fresh.wished(p)
            assert (carried is None) == (found is None)
            if carried is not None and found is not None:
                assert carried.tolist() == found.tolist()
            assert set(state.wish_signature(p)) == set(fresh.wish_signature(p))
