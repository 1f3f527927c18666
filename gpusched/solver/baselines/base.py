"""One-pod-at-a-time greedy placement, the frame every baseline shares.

Each pod in turn: filter the nodes it fits on, score them, take the highest
score, pick GPU indices on that node, and place it before looking at the
next pod.

Ties go to the first node in a fixed node order that is a random permutation
drawn from the policy's seed.  The reference simulator renames its nodes with
a random-permutation prefix per seed and its scheduler takes the first of the
equal best scores; breaking ties uniformly at random instead spreads tied pods
(CPU-only pods above all) over many nodes and costs the packing policies 1-5
points of allocation, which the published numbers do not show.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpusched.model import GPU_MILLI, Assignment, ClusterState, Plan, Pod, SolveStats
from gpusched.model.cluster import IntArray

__all__ = ["GreedyPolicy", "lowest_idle_gpus", "tightest_gpu"]

Nodes = npt.NDArray[np.intp]


def lowest_idle_gpus(state: ClusterState, node: int, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-indexed completely idle GPUs of ``node``."""
    idle = np.flatnonzero(state.gpu_free[node] >= GPU_MILLI)
    return tuple(int(g) for g in idle[:count])


def tightest_gpu(state: ClusterState, node: int, milli: int) -> int:
    """The GPU with the least free share that still fits ``milli`` (lowest index on ties)."""
    free = state.gpu_free[node]
    fits = np.where(free >= milli, free, GPU_MILLI + 1)
    return int(np.argmin(fits))


class GreedyPolicy:
    """Base class: subclasses implement ``score`` and may override ``gpus``."""

    name = "greedy"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self._rank: IntArray | None = None

    def rank(self, state: ClusterState) -> IntArray:
        """Tie-break rank of every node (lower wins): a permutation fixed by the seed."""
        if self._rank is None or self._rank.size != len(state.cluster):
            order = list(range(len(state.cluster)))
            random.Random(self.rng.random()).shuffle(order)
            self._rank = np.array(order, dtype=np.int64)
        return self._rank

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        """Integer score per candidate node; the highest wins."""
        raise NotImplementedError

    def gpus(self, pod: Pod, state: ClusterState, node: int) -> tuple[int, ...]:
        """GPU indices for ``pod`` on ``node``: tightest GPU for a share, lowest idle ones otherwise."""
        if pod.num_gpu == 0:
            return ()
        if pod.is_fractional:
            return (tightest_gpu(state, node, pod.gpu_milli),)
        return lowest_idle_gpus(state, node, pod.num_gpu)

    def choose(self, pod: Pod, state: ClusterState, nodes: Nodes) -> int:
        """The node to use among ``nodes`` (all feasible)."""
        if nodes.size == 1:
            return int(nodes[0])
        scores = self.score(pod, state, nodes)
        ties = nodes[scores == scores.max()]
        return int(ties[np.argmin(self.rank(state)[ties])]) if ties.size > 1 else int(ties[0])

    def place(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        """Place ``pods`` one after another in the given order."""
        start = time.perf_counter()
        placed: list[Assignment] = []
        failed: list[Pod] = []
        for pod in pods:
            nodes = np.flatnonzero(state.fit_mask(pod.shape))
            if nodes.size == 0:
                failed.append(pod)
                continue
            node = self.choose(pod, state, nodes)
            a = Assignment(pod, node, self.gpus(pod, state, node))
            placed.append(a)
            state = state.apply((a,))
        ms = (time.perf_counter() - start) * 1000
        gpu = float(sum(a.pod.gpu_demand_milli for a in placed))
        return Plan(tuple(placed), tuple(failed), SolveStats(self.name, "HEURISTIC", gpu, gpu, ms))
