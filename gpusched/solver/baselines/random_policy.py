"""Random: a uniformly random feasible node, and a random GPU that fits for a share."""

from __future__ import annotations

import numpy as np

from gpusched.model import ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes

__all__ = ["RandomPolicy"]


class RandomPolicy(GreedyPolicy):
    """A uniformly random feasible node (not the fixed tie order of the other baselines)."""

    name = "random"

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        return np.zeros(nodes.size, dtype=np.int64)

    def choose(self, pod: Pod, state: ClusterState, nodes: Nodes) -> int:
        return int(nodes[self.rng.randrange(nodes.size)])

    def gpus(self, pod: Pod, state: ClusterState, node: int) -> tuple[int, ...]:
        if pod.is_fractional:
            fits = np.flatnonzero(state.gpu_free[node] >= pod.gpu_milli)
            return (int(fits[self.rng.randrange(fits.size)]),)
        return super().gpus(pod, state, node)
