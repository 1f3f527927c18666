"""Solver parameters: objective weights and limits, as plain frozen data.

``gpusched.config`` builds these from the validated ConfigMap document; the
solver itself never parses anything.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits", "SolverParams", "Weights"]


@dataclass(frozen=True, slots=True)
class Weights:
    """Objective weights; every term is scaled to thousandths of a GPU first.

    The default order is: place GPU demand first, then avoid fragmenting, then
    avoid waking idle GPU nodes, then pack tightly.
    """

    placed_gpu: int = 100
    """Per thousandth of a GPU placed."""
    placed_pods: int = 2000
    """Per pod placed (so CPU-only pods are placed too)."""
    fragmentation: int = 100
    """Per thousandth of a GPU of expected fragmentation (FGD's measure) added."""
    active_nodes: int = 0
    """Per GPU node that the plan takes from idle to in use, in thousandths of a GPU."""
    packing: int = 1
    """Tie-break per pod toward the node with the least capacity left (best fit)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits on one CP-SAT solve."""

    time_limit_s: float = 1.0
    """Wall-clock limit per batch solve."""
    workers: int = 2
    """CP-SAT search workers (threads)."""
    candidates_per_pod: int = 24
    """Candidate nodes kept per pod shape after pruning (equivalent nodes merged first)."""
    relative_gap: float = 0.001
    """Stop once the proven gap is below this fraction."""


@dataclass(frozen=True, slots=True)
class SolverParams:
    """Everything a batch solve is parameterised by."""

    weights: Weights = Weights()
    limits: Limits = Limits()
    seed: int = 0
