"""GPU fragmentation as the FGD paper defines it, vectorised over nodes.

A *typical pod* set is the most common pod shapes of a workload, each with its
frequency ``p_t``.  Against one typical pod ``t`` a node's idle GPU share is
fragmented in full when ``t`` cannot run there (too little CPU, GPU model not
accepted, not enough GPU, or ``t`` asks for no GPU at all); when ``t`` can run,
only the GPUs whose free share is below ``t``'s per-GPU request count.  A
node's fragmentation is the frequency-weighted sum; it is 0 on a node with no
idle GPU.  All amounts are thousandths of a GPU.

Scores follow the reference simulator's conventions: a CPU request of 0
counts as 100 millicores in scores and in fragmentation (but not in the fit
filter), and memory plays no part in fragmentation.

``FragScorer`` keeps per-shape results between calls and recomputes only the
nodes whose usage changed since, which is what makes replaying thousands of
arrivals cheap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpusched.model import GPU_MILLI, Cluster, ClusterState, Pod, PodShape
from gpusched.model.cluster import BoolArray, IntArray
from gpusched.model.pod import model_key

__all__ = [
    "FloatArray",
    "FragScorer",
    "TypicalPods",
    "cluster_frag_ratio",
    "frag_of_rows",
    "node_fragmentation",
    "score_cpu",
    "typical_from",
]

FloatArray = npt.NDArray[np.float64]

ZERO_CPU_AS = 100
"""Millicores a zero CPU request counts as in scores and fragmentation."""


def score_cpu(cpu_milli: int) -> int:
    """The CPU request as scores see it (0 counts as 100m)."""
    return cpu_milli if cpu_milli > 0 else ZERO_CPU_AS


@dataclass(frozen=True, slots=True)
class TypicalShape:
    """A pod shape as fragmentation sees it (no memory)."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_models: frozenset[str]
    island: bool = False
    """A multi-GPU pod that needs its GPUs within one island: idle GPUs count for it per island."""

    @classmethod
    def of(cls, pod: Pod) -> TypicalShape:
        """The shape of ``pod`` (CPU bucketed the way FGD scores it)."""
        island = pod.island == "required" and pod.num_gpu > 1
        return cls(score_cpu(pod.cpu_milli), pod.gpu_milli, pod.num_gpu, pod.gpu_models, island)


@dataclass(frozen=True)
class TypicalPods:
    """The most common pod shapes, covering ``coverage`` of the pods, with frequencies."""

    shapes: tuple[TypicalShape, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_pods(cls, pods: Iterable[Pod], coverage: float = 0.95) -> TypicalPods:
        """Shapes by descending count until their cumulative count reaches ``coverage``."""
        counts = Counter(TypicalShape.of(p) for p in pods)
        return cls.from_counts(counts, coverage)

    @classmethod
    def from_counts(cls, counts: Mapping[TypicalShape, int], coverage: float = 0.95) -> TypicalPods:
        """Typical pods from shape counts (see ``from_pods``)."""
        if not counts:
            raise ValueError("cannot derive typical pods from an empty workload")
        total = sum(counts.values())

        def order(item: tuple[TypicalShape, int]) -> tuple[int, int, int, int, tuple[str, ...]]:
            s, c = item
            # Descending count; equal counts put the larger shape first.
            return (-c, -s.cpu_milli, -s.gpu_milli, -s.num_gpu, tuple(sorted(s.gpu_models, reverse=True)))

        ranked = sorted(counts.items(), key=order)
        expected = coverage * total
        kept: list[tuple[TypicalShape, int]] = []
        cum = 0
        for shape, c in ranked:
            if cum >= expected:
                break
            kept.append((shape, c))
            cum += c
        return cls(tuple(s for s, _ in kept), tuple(c / cum for _, c in kept))

    def __len__(self) -> int:
        return len(self.shapes)


class _TypicalArrays:
    """Typical pods as arrays against one cluster's GPU models."""

    def __init__(self, typical: TypicalPods, cluster: Cluster) -> None:
        self.cpu: IntArray = np.array([s.cpu_milli for s in typical.shapes], dtype=np.int64)
        self.milli: IntArray = np.array([s.gpu_milli for s in typical.shapes], dtype=np.int64)
        self.num: IntArray = np.array([s.num_gpu for s in typical.shapes], dtype=np.int64)
        self.weight: FloatArray = np.array(typical.weights, dtype=np.float64)
        # access[t, model_id + 1]; column 0 stands for nodes without GPUs.
        access = np.zeros((len(typical), len(cluster.models) + 1), dtype=np.bool_)
        for t, s in enumerate(typical.shapes):
            access[t, 0] = not s.gpu_models
            keys = {model_key(x) for x in s.gpu_models}
            for m, model in enumerate(cluster.models):
                access[t, m + 1] = not s.gpu_models or model_key(model) in keys
        self.access: BoolArray = access
        self.island: BoolArray = np.array([s.island for s in typical.shapes], dtype=np.bool_)
        self.islands: IntArray | None = cluster.islands if cluster.island_count > 1 and self.island.any() else None
        """Island id per GPU of every node, only when some typical pod needs one island."""


def _island_best(gpu_free: IntArray, islands: IntArray) -> IntArray:
    """Most idle GPUs within one island, per row."""
    idle = gpu_free >= GPU_MILLI
    count = int(islands.max(initial=-1)) + 1
    best = np.zeros(len(gpu_free), dtype=np.int64)
    for i in range(count):
        np.maximum(best, (idle & (islands == i)).sum(axis=1), out=best)
    return best


DEDUP_ROWS = 512
"""From this many rows on, the fragmentation a pod adds is computed once per distinct node state."""

CHUNK_ROWS = 2048
"""Rows per pass: the temporaries are (rows x typical pods x GPUs), so a 5,000-node cluster with
a hundred typical shapes would otherwise allocate tens of MiB for a moment in every pass."""


def _parts(gpu_free: IntArray, ta: _TypicalArrays) -> tuple[FloatArray, IntArray, IntArray]:
    """Per row: idle share; per (row, typical pod): GPUs that fit its share, share on GPUs too small."""
    idle = gpu_free.sum(axis=1).astype(np.float64)
    rows = gpu_free.shape[0]
    count = np.empty((rows, len(ta.milli)), dtype=np.int64)
    small = np.empty((rows, len(ta.milli)), dtype=np.int64)
    for i in range(0, rows, CHUNK_ROWS):
        g = gpu_free[i : i + CHUNK_ROWS, None, :]
        fits = g >= ta.milli[None, :, None]
        count[i : i + CHUNK_ROWS] = fits.sum(axis=2)
        small[i : i + CHUNK_ROWS] = np.where(fits, 0, g).sum(axis=2)
    return idle, count, small


def _combine(
    cpu_free: IntArray,
    model_id: IntArray,
    idle: FloatArray,
    count: IntArray,
    small: IntArray,
    ta: _TypicalArrays,
    best: IntArray | None = None,
) -> FloatArray:
    if best is not None:  # island pods count idle GPUs of one island, not of the node
        count = np.where(ta.island[None, :], best[:, None], count)
    hosts = (
        (ta.milli > 0)[None, :]
        & ta.access[:, model_id + 1].T
        & (count >= ta.num[None, :])
        & (cpu_free[:, None] >= ta.cpu[None, :])
    )
    per_t = np.where(hosts, small, idle[:, None])  # (R, T)
    result: FloatArray = per_t @ ta.weight
    return result


def frag_of_rows(
    cpu_free: IntArray,
    gpu_free: IntArray,
    model_id: IntArray,
    ta: _TypicalArrays,
    islands: IntArray | None = None,
) -> FloatArray:
    """Fragmentation of each row (a node state): CPU left, per-GPU free share, GPU model (and the
    rows' island ids per GPU, read when some typical pod needs one island)."""
    out = np.empty(len(cpu_free), dtype=np.float64)
    for i in range(0, len(cpu_free), CHUNK_ROWS):
        j = slice(i, i + CHUNK_ROWS)
        best = _island_best(gpu_free[j], islands[j]) if islands is not None and ta.islands is not None else None
        out[j] = _combine(cpu_free[j], model_id[j], *_parts(gpu_free[j], ta), ta, best)
    return out


def _frag_after_share(
    cpu_free: IntArray,
    gpu_free: IntArray,
    model_id: IntArray,
    r_idx: npt.NDArray[np.intp],
    g_idx: npt.NDArray[np.intp],
    cpu: int,
    milli: int,
    ta: _TypicalArrays,
    islands: IntArray | None = None,
) -> FloatArray:
    """Fragmentation of rows ``r_idx`` after a share of ``milli`` lands on their GPU ``g_idx``.

    Only one GPU changes, so the per-row parts are corrected instead of recomputed.
    """
    idle, count, small = _parts(gpu_free, ta)
    m = ta.milli[None, :]
    out = np.empty(r_idx.size, dtype=np.float64)
    for i in range(0, r_idx.size, CHUNK_ROWS):
        r, j = r_idx[i : i + CHUNK_ROWS], slice(i, i + CHUNK_ROWS)
        before = gpu_free[r, g_idx[j]][:, None]  # (C, 1)
        after = before - milli
        count_c = count[r] - (before >= m) + (after >= m)
        small_c = small[r] - np.where(before < m, before, 0) + np.where(after < m, after, 0)
        best = None
        if ta.islands is not None and islands is not None:
            after_gpu = gpu_free[r].copy()
            after_gpu[np.arange(r.size), g_idx[j]] -= milli
            best = _island_best(after_gpu, islands[r])
        out[j] = _combine(cpu_free[r] - cpu, model_id[r], idle[r] - milli, count_c, small_c, ta, best)
    return out


def node_fragmentation(state: ClusterState, typical: TypicalPods) -> FloatArray:
    """Fragmentation of every node of ``state`` (thousandths of a GPU)."""
    ta = _TypicalArrays(typical, state.cluster)
    return frag_of_rows(state.cpu_free, state.gpu_free, state.cluster.model_id, ta, state.cluster.islands)


def _sigmoid_score(delta: FloatArray) -> IntArray:
    """The FGD node score: int(sigmoid((F_before - F_after) / 1000) * 100)."""
    out: IntArray = np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)
    return out


@dataclass
class _ShapeCache:
    cpu_used: IntArray
    gpu_used: IntArray
    delta: FloatArray  # fragmentation added by one pod, +inf where it cannot go
    score: IntArray  # FGD integer score, -1 where it cannot go
    gpu: IntArray  # GPU index for a fractional pod (-1 otherwise)
    per_gpu: FloatArray  # fractional pods: fragmentation added per (node, GPU), +inf where it cannot go; (n, 0) else
    seen: tuple[object, int] | None = None


class FragScorer:
    """Fragmentation added by placing one pod on each node, with per-shape caching.

    ``delta(state, shape)`` gives, for every node, the increase in fragmentation
    if one pod of ``shape`` were placed there, on its best GPU for fractional
    pods (FGD's choice: highest integer score, lowest index on ties), along with
    FGD's integer score and that GPU index.  Nodes that cannot host the pod by
    GPU count, model or CPU get ``inf``; memory is left to the fit filter.

    Returned arrays are updated in place by later calls: use them before the
    next call, copy them to keep them.
    """

    def __init__(self, cluster: Cluster, typical: TypicalPods) -> None:
        self.cluster = cluster
        self.typical = typical
        self._ta = _TypicalArrays(typical, cluster)
        # Keyed without memory, which no score or fragmentation reads.
        self._cache: dict[tuple[int, int, int, frozenset[str]], _ShapeCache] = {}
        self._frag_cpu: IntArray | None = None
        self._frag_gpu: IntArray | None = None
        self._frag_seen: tuple[object, int] | None = None
        self._frag: FloatArray = np.zeros(len(cluster), dtype=np.float64)

    def current(self, state: ClusterState) -> FloatArray:
        """Fragmentation of every node now (cached per node)."""
        rows = self._changed(state, self._frag_seen, self._frag_cpu, self._frag_gpu)
        if rows is None:
            self._frag = frag_of_rows(state.cpu_free, state.gpu_free, self.cluster.model_id, self._ta, self._ta.islands)
        elif rows.size:
            isl = self._ta.islands[rows] if self._ta.islands is not None else None
            self._frag[rows] = frag_of_rows(
                state.cpu_free[rows], state.gpu_free[rows], self.cluster.model_id[rows], self._ta, isl
            )
        self._frag_cpu, self._frag_gpu = state.cpu_used, state.gpu_used
        self._frag_seen = state.stamp
        return self._frag

    @staticmethod
    def _changed(
        state: ClusterState,
        seen: tuple[object, int] | None,
        cpu_used: IntArray | None,
        gpu_used: IntArray | None,
    ) -> npt.NDArray[np.intp] | None:
        """Rows that differ from the state last seen; None when everything must be computed.

        ``cpu_used`` and ``gpu_used`` are that state's arrays, which a greedy pass may have
        updated in place since (``ClusterState.apply(consume=True)``): on the rows its change log
        names after ``seen``, so those are computed again whatever the arrays say.
        """
        if cpu_used is None or gpu_used is None:
            return None
        if seen is not None:
            rows = state.changed_since(seen)
            if rows is not None:
                return rows
        diff = np.flatnonzero((cpu_used != state.cpu_used) | (gpu_used != state.gpu_used).any(axis=1))
        if seen is None:
            return diff
        return np.union1d(diff, ClusterState.changed_after(seen))

    def delta(self, state: ClusterState, shape: PodShape) -> tuple[FloatArray, IntArray, IntArray]:
        """(fragmentation added, FGD score, GPU index) per node for one pod of ``shape``."""
        c = self._entry(state, shape)
        return c.delta, c.score, c.gpu

    def gpu_delta(self, state: ClusterState, shape: PodShape) -> FloatArray:
        """Fragmentation added per (node, GPU) by one fractional pod of ``shape`` on that GPU.

        Only for fractional shapes; for the others the array has no columns.
        """
        return self._entry(state, shape).per_gpu

    def _entry(self, state: ClusterState, shape: PodShape) -> _ShapeCache:
        key = (shape.cpu_milli, shape.num_gpu, shape.gpu_milli, shape.gpu_models)
        cached = self._cache.get(key)
        rows = None if cached is None else self._changed(state, cached.seen, cached.cpu_used, cached.gpu_used)
        n = len(self.cluster)
        if cached is None or rows is None:
            cached = _ShapeCache(
                state.cpu_used,
                state.gpu_used,
                np.full(n, np.inf),
                np.full(n, -1, dtype=np.int64),
                np.full(n, -1, dtype=np.int64),
                np.full((n, self.cluster.max_gpus if shape.is_fractional else 0), np.inf),
            )
            rows = np.arange(n)
            self._cache[key] = cached
        if rows.size:
            base = self.current(state)
            d, s, g, pg = self._compute(state, shape, rows, base)
            cached.delta[rows], cached.score[rows], cached.gpu[rows] = d, s, g
            cached.per_gpu[rows] = pg
        cached.cpu_used, cached.gpu_used = state.cpu_used, state.gpu_used
        cached.seen = state.stamp
        return cached

    def _compute(
        self, state: ClusterState, shape: PodShape, rows: npt.NDArray[np.intp], base: FloatArray
    ) -> tuple[FloatArray, IntArray, IntArray, FloatArray]:
        """``_rows`` for ``rows``, computed once per distinct node state among them: what it returns
        for a row depends only on the row's free CPU, free share per GPU, model and islands, and
        a large cluster has a few hundred distinct ones among thousands of nodes (those of one
        type that nothing runs on are all alike)."""
        if rows.size >= DEDUP_ROWS:
            parts = [state.cpu_free[rows, None], self.cluster.model_id[rows, None], state.gpu_free[rows]]
            if self._ta.islands is not None:
                parts.append(self._ta.islands[rows])
            alike = _distinct_rows(np.hstack(parts))
            if alike is not None and alike[0].size * 2 <= rows.size:
                first, inverse = alike
                d, s, g, pg = self._rows(state, shape, rows[first], base)
                return d[inverse], s[inverse], g[inverse], pg[inverse]
        return self._rows(state, shape, rows, base)

    def _rows(
        self, state: ClusterState, shape: PodShape, rows: npt.NDArray[np.intp], base: FloatArray
    ) -> tuple[FloatArray, IntArray, IntArray, FloatArray]:
        cpu = state.cpu_free[rows]
        gpu = state.gpu_free[rows]
        model = self.cluster.model_id[rows]
        c = score_cpu(shape.cpu_milli)
        nrows = rows.size
        delta = np.full(nrows, np.inf)
        score = np.full(nrows, -1, dtype=np.int64)
        best_gpu = np.full(nrows, -1, dtype=np.int64)
        per_gpu = np.full((nrows, gpu.shape[1] if shape.is_fractional else 0), np.inf)
        ok = cpu >= shape.cpu_milli
        if shape.num_gpu:
            ok &= self.cluster.model_mask(shape.gpu_models)[rows]
        f0 = base[rows]
        if shape.is_fractional:
            g_count = gpu.shape[1]
            cand = (gpu >= shape.gpu_milli) & ok[:, None]  # (R, G)
            r_idx, g_idx = np.nonzero(cand)
            if r_idx.size:
                isl = self._ta.islands[rows] if self._ta.islands is not None else None
                f1 = _frag_after_share(cpu, gpu, model, r_idx, g_idx, c, shape.gpu_milli, self._ta, isl)
                d = f1 - f0[r_idx]
                per_gpu[r_idx, g_idx] = d
                s = _sigmoid_score(-d)
                # Best GPU per row: highest integer score, then lowest index.
                key = s * (g_count + 1) + (g_count - g_idx)
                order = np.lexsort((-key, r_idx))
                r_sorted = r_idx[order]
                first = np.ones(r_sorted.size, dtype=np.bool_)
                first[1:] = r_sorted[1:] != r_sorted[:-1]
                pick = order[first]
                delta[r_idx[pick]] = d[pick]
                score[r_idx[pick]] = s[pick]
                best_gpu[r_idx[pick]] = g_idx[pick]
            return delta, score, best_gpu, per_gpu
        if shape.num_gpu:
            ok &= (gpu >= GPU_MILLI).sum(axis=1) >= shape.num_gpu
        sel = np.flatnonzero(ok)
        if sel.size:
            new_gpu = gpu[sel].copy()
            if shape.num_gpu:
                # Whole GPUs: which idle ones does not change fragmentation.
                full = new_gpu >= GPU_MILLI
                take = np.cumsum(full, axis=1) <= shape.num_gpu
                new_gpu[full & take] -= GPU_MILLI
            isl = self._ta.islands[rows[sel]] if self._ta.islands is not None else None
            f1 = frag_of_rows(cpu[sel] - c, new_gpu, model[sel], self._ta, isl)
            d = f1 - f0[sel]
            delta[sel] = d
            score[sel] = _sigmoid_score(-d)
        return delta, score, best_gpu, per_gpu


_MIX = np.random.default_rng(0x5EED).integers(1, 2**62, size=256, dtype=np.int64) | 1
"""Odd multipliers that mix a row's columns into one 64-bit key (columns beyond 256 are not mixed)."""


def _distinct_rows(key: IntArray) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """(a row index of each distinct row of ``key``, each row's distinct-row number), or None if
    two different rows hash alike (then every row is computed on its own).

    Rows are mixed into one 64-bit number and those are sorted, far faster than sorting the rows
    themselves; every row is then compared with its group's representative, so the answer is
    exact."""
    cols = min(key.shape[1], _MIX.size)
    with np.errstate(over="ignore"):
        mixed = key[:, :cols] @ _MIX[:cols]
        mixed ^= mixed >> 29
    _, first, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not np.array_equal(key[first[inverse]], key):
        return None
    return first, inverse


def cluster_frag_ratio(state: ClusterState, typical: TypicalPods, nodes: BoolArray | None = None) -> float:
    """Fragmented / idle GPU share across the cluster, or across ``nodes`` (a mask) only (0 when
    nothing is idle)."""
    f = node_fragmentation(state, typical)
    free = state.gpu_free
    if nodes is not None:
        f, free = f[nodes], free[nodes]
    idle = float(free.sum())
    return float(f.sum()) / idle if idle > 0 else 0.0


def typical_from(pods: Sequence[Pod]) -> TypicalPods:
    """Typical pods of a trace, as the reference protocol derives them (name order, 95%)."""
    return TypicalPods.from_pods(sorted(pods, key=lambda p: p.name))
