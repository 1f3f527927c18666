"""BestFit: the node with the least CPU and GPU left after placement.

``raw = int(100 * (1 - (0.5 * cpu_left / 128000 + 0.5 * gpu_left / 8000)))``,
min-max normalised to 0..100 over the feasible nodes with integer division
(so close raw scores can tie), highest wins.  Memory is only a fit check.
"""

from __future__ import annotations

import numpy as np

from gpusched.model import ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes
from gpusched.solver.baselines.dot_product import MAX_CPU, MAX_GPU
from gpusched.solver.fragmentation import score_cpu

__all__ = ["BestFitPolicy", "normalise"]


def normalise(raw: IntArray) -> IntArray:
    """Min-max to 0..100 with integer division; all equal gives all 0."""
    hi, lo = int(raw.max()), int(raw.min())
    if hi == lo:
        return np.zeros_like(raw)
    out: IntArray = (raw - lo) * 100 // (hi - lo)
    return out


class BestFitPolicy(GreedyPolicy):
    """Least CPU and GPU left after placement."""

    name = "bestfit"

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        cpu_left = (state.cpu_free[nodes] - score_cpu(pod.cpu_milli)) / MAX_CPU
        gpu_left = (state.gpu_free[nodes].sum(axis=1) - pod.gpu_demand_milli) / MAX_GPU
        raw = np.trunc(100 * (1 - (0.5 * cpu_left + 0.5 * gpu_left))).astype(np.int64)
        return normalise(raw)
