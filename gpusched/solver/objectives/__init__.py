"""Objective terms of the batch model, one module each, each exposing
``build(inst, model, v, weights) -> LinearExpr`` (to be maximised) and
``stake(inst, weights) -> int``: the most the term can differ between two plans of
the batch, which ``placed.placement_first`` weighs one placed pod above.  ``priority`` is
weighed above all of them together, and so is built apart (with their stakes)."""

from gpusched.solver.objectives import (
    active_nodes,
    fragmentation,
    packing,
    placed,
    preference,
    priority,
    topology,
    warm_start,
)

ALL = (placed, fragmentation, active_nodes, packing, warm_start, topology, preference)
"""Every objective term; the model maximises their sum."""

__all__ = [
    "ALL",
    "active_nodes",
    "fragmentation",
    "packing",
    "placed",
    "preference",
    "priority",
    "topology",
    "warm_start",
]
