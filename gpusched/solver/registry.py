"""Policies by name, for the CLI, the simulator and the benchmarks."""

from __future__ import annotations

from gpusched.model import Cluster
from gpusched.solver.baselines import (
    BestFitPolicy,
    DotProductPolicy,
    FgdPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    RandomPolicy,
)
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import SolverParams
from gpusched.solver.policy import Policy

__all__ = ["POLICIES", "make_policy"]

POLICIES = ("cpsat", "fgd", "bestfit", "gpupacking", "gpuclustering", "dotprod", "random")
"""Every policy name, best first."""


def make_policy(
    name: str,
    cluster: Cluster,
    typical: TypicalPods,
    seed: int,
    params: SolverParams | None = None,
    *,
    learn_typical: bool = True,
) -> Policy:
    """A fresh policy instance.

    FGD scores against ``typical``.  CP-SAT learns its typical pods from the pods it has seen
    (as the daemon does), or, with ``learn_typical=False``, is given ``typical`` as FGD is.
    """
    key = name.strip().lower()
    simple = {
        "random": RandomPolicy,
        "dotprod": DotProductPolicy,
        "gpuclustering": GpuClusteringPolicy,
        "gpupacking": GpuPackingPolicy,
        "bestfit": BestFitPolicy,
    }
    if key in simple:
        return simple[key](seed)
    if key == "fgd":
        return FgdPolicy(cluster, typical, seed)
    if key == "cpsat":
        from gpusched.solver.solve import CpSatPolicy  # ortools is slow to import; only when used

        p = params or SolverParams()
        return CpSatPolicy(cluster, SolverParams(p.weights, p.limits, seed), None if learn_typical else typical)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
