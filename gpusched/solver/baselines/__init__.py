"""Greedy baselines from the FGD paper, behind the same ``Policy`` interface as CP-SAT.

Each follows the reference simulator's scoring exactly (integer scores,
normalisation, random tie-breaks), so replays reproduce the published numbers.
"""

from gpusched.solver.baselines.base import GreedyPolicy
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.baselines.dot_product import DotProductPolicy
from gpusched.solver.baselines.fgd import FgdPolicy
from gpusched.solver.baselines.gpu_clustering import GpuClusteringPolicy
from gpusched.solver.baselines.gpu_packing import GpuPackingPolicy
from gpusched.solver.baselines.random_policy import RandomPolicy

__all__ = [
    "BestFitPolicy",
    "DotProductPolicy",
    "FgdPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "GreedyPolicy",
    "RandomPolicy",
]
