"""FGD: place each pod where it adds the least fragmentation (Weng et al., ATC'23).

The node score is ``int(sigmoid((F_before - F_after) / 1000) * 100)``; a
fractional pod goes to the GPU with the best such score (lowest index on ties).
"""

from __future__ import annotations

from gpusched.model import Cluster, ClusterState, Pod
from gpusched.model.cluster import IntArray
from gpusched.solver.baselines.base import GreedyPolicy, Nodes
from gpusched.solver.fragmentation import FragScorer, TypicalPods

__all__ = ["FgdPolicy", "WarmStart"]


class FgdPolicy(GreedyPolicy):
    """Fragmentation gradient descent."""

    name = "fgd"

    def __init__(self, cluster: Cluster, typical: TypicalPods, seed: int = 0) -> None:
        super().__init__(seed)
        self.scorer = FragScorer(cluster, typical)

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        _, score, _ = self.scorer.delta(state, pod.shape)
        out: IntArray = score[nodes]
        return out

    def gpus(self, pod: Pod, state: ClusterState, node: int) -> tuple[int, ...]:
        if pod.is_fractional:
            _, _, gpu = self.scorer.delta(state, pod.shape)
            return (int(gpu[node]),)
        return super().gpus(pod, state, node)


class WarmStart(FgdPolicy):
    """FGD as the CP-SAT policy's warm start: between nodes it scores alike, one with a GPU in use
    before an idle GPU node.  The solve keeps the warm start's placements (``keepHint``, per pod)
    far more than it weighs waking a node (``activeNodes``, per node), so a tie FGD broke toward
    an idle node would stand."""

    def tie_rank(self, state: ClusterState, ties: Nodes) -> IntArray:
        idle = (state.cluster.gpu_count[ties] > 0) & ~state.gpu_used[ties].any(axis=1)
        out: IntArray = self.rank(state)[ties] + idle * len(state.cluster)
        return out
