"""GpuClustering: keep pods of one kind (fractional, 1-GPU, 2-GPU, ...) together.

A node already running only this pod kind scores +75, one running this kind
among others +50, an empty node +25; on top, up to 25 for less free GPU.
CPU-only pods score 0 everywhere (a random feasible node).
"""

from __future__ import annotations

import numpy as np

from gpusched.model import ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes
from gpusched.solver.baselines.dot_product import MAX_GPU

__all__ = ["GpuClusteringPolicy"]


class GpuClusteringPolicy(GreedyPolicy):
    """Affinity of pod kinds, then GPU packing."""

    name = "gpuclustering"

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        if pod.num_gpu == 0:
            return np.zeros(nodes.size, dtype=np.int64)
        kind = 0 if pod.is_fractional else min(pod.num_gpu, state.cluster.max_gpus)
        kinds = state.kinds[nodes]
        free = state.gpu_free[nodes].sum(axis=1)
        base = (25 * (MAX_GPU - free)) // MAX_GPU
        present = (kinds > 0).sum(axis=1)
        same = kinds[:, kind] > 0
        bonus = np.where(same, np.where(present == 1, 75, 50), np.where(present == 0, 25, 0))
        out: IntArray = (base + bonus).astype(np.int64)
        return out
