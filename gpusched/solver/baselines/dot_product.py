"""DotProd: prefer the node whose free (CPU, GPU) vector has the smallest dot product with the pod's.

Both vectors are normalised by the largest node spec (128 cores, 8 GPUs);
the score is ``int(100 * (1 - dot / 2))``.
"""

from __future__ import annotations

import numpy as np

from gpusched.model import ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes
from gpusched.solver.fragmentation import score_cpu

__all__ = ["MAX_CPU", "MAX_GPU", "DotProductPolicy"]

MAX_CPU = 128_000
"""Largest node CPU in millicores, the normaliser the reference scores use."""
MAX_GPU = 8_000
"""Largest node GPU share in thousandths (8 GPUs)."""


class DotProductPolicy(GreedyPolicy):
    """Dot product of free resources and request; smaller is better."""

    name = "dotprod"

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        cpu = state.cpu_free[nodes] / MAX_CPU
        gpu = state.gpu_free[nodes].sum(axis=1) / MAX_GPU
        dot = (cpu * (score_cpu(pod.cpu_milli) / MAX_CPU) + gpu * (pod.gpu_demand_milli / MAX_GPU)) / 2
        out: IntArray = np.trunc(100 * (1 - dot)).astype(np.int64)
        return out
