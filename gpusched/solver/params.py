"""Solver parameters: objective weights and limits, as plain frozen data.

``gpusched.config`` builds these from the validated ConfigMap document; the
solver itself never parses anything.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits", "SolverParams", "Weights"]


@dataclass(frozen=True, slots=True)
class Weights:
    """Objective weights: integer coefficients of the maximised objective.

    The defaults make placement dominate (a placed pod is worth more than any
    fragmentation it can cause), then fragmentation, then waking idle GPU
    nodes, then a best-fit tie-break.
    """

    placed_gpu: int = 1000
    """Per thousandth of a GPU placed."""
    placed_pods: int = 100_000
    """Per pod placed, on top of its GPU demand (so CPU-only pods count too)."""
    fragmentation: int = 10
    """Per thousandth of a GPU of fragmentation (FGD's measure) a placement adds (0 or more)."""
    active_nodes: int = 1000
    """Per GPU node the plan takes from idle to in use."""
    packing: int = 1
    """Per pod, per point (0..200) of how full its node already is (CPU and GPU)."""
    keep_hint: int = 50_000
    """Per pod left where the greedy warm start placed it (0: the solver rearranges freely)."""
    mig_partition: int = 150_000
    """Per idle GPU the batch partitions into MIG instances (a GPU no whole-GPU pod can use then)."""
    island_spill: int = 200_000
    """Per pod that prefers its GPUs within one island and gets them across islands."""
    gang_domains: int = 100_000
    """Per topology domain beyond the first that a gang preferring one domain spans."""
    preferred_affinity: int = 100
    """Per pod, per point of its preference score on its node (``objectives.preference``): 0..100
    for node and pod affinity, normalised; 0..150 for untolerated PreferNoSchedule taints; less,
    as a cost, each preferred anti-affinity weight per pod it selects in the node's domain (and
    per pair of replicas sharing one); 0: off."""
    work_conserving: bool = True
    """A pod that fits is placed: each placement's fragmentation charge is capped below the pod's
    worth, and the placement weights are raised per batch above everything every other term
    can add up to (``objectives.placed.placement_first``)."""
    placement_factor: int = 1
    """Not configured: the factor ``objectives.placed.placement_first`` multiplies the placement
    weights by for one batch (the other terms, and the fragmentation cap, keep their weights)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits on one CP-SAT solve."""

    time_limit_s: float = 1.0
    """Wall-clock limit per batch solve."""
    workers: int = 2
    """CP-SAT search workers (threads)."""
    candidates_per_pod: int = 24
    """Candidate nodes kept per pod shape after pruning (equivalent nodes merged first)."""
    relative_gap: float = 0.0
    """Stop once the proven gap is below this fraction (0: only at proven optimum or the time limit).

    The gap is relative to the whole objective, which the placement terms dominate, so a
    non-zero value stops before fragmentation and packing are optimised."""


@dataclass(frozen=True, slots=True)
class SolverParams:
    """Everything a batch solve is parameterised by."""

    weights: Weights = Weights()
    limits: Limits = Limits()
    seed: int = 0
