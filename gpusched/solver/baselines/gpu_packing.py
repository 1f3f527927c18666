"""GpuPacking: share partly used GPUs first, then partly used nodes, then idle nodes.

A fractional pod on a partly used GPU scores 50..100 (fuller GPU is better);
taking an idle GPU on a partly used node scores 33..49; a completely idle node
scores ``max(33 - F, F)`` for its F idle GPUs.  CPU-only pods score 0.
"""

from __future__ import annotations

import numpy as np

from gpusched.model import GPU_MILLI, ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes

__all__ = ["GpuPackingPolicy"]


class GpuPackingPolicy(GreedyPolicy):
    """Pack GPU shares onto used GPUs and used nodes."""

    name = "gpupacking"

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        if pod.num_gpu == 0:
            return np.zeros(nodes.size, dtype=np.int64)
        free = state.gpu_free[nodes]
        count = state.cluster.gpu_count[nodes]
        idle = (free >= GPU_MILLI).sum(axis=1)
        all_idle = idle == count
        idle_score = np.maximum(100 // 3 - idle, idle)
        if pod.is_fractional:
            # The tightest GPU that fits is the first in ascending free order.
            tight = np.where(free >= pod.gpu_milli, free, GPU_MILLI + 1).min(axis=1)
            uses_idle = tight >= GPU_MILLI
            s = tight * 100 // GPU_MILLI
            partial = np.maximum(100 - s // 10, 50)
            used = np.where(uses_idle, max(50 - 1, 33), partial)
        else:
            used = np.full(nodes.size, max(50 - pod.num_gpu, 33))
        out: IntArray = np.where(all_idle, idle_score, used).astype(np.int64)
        return out
