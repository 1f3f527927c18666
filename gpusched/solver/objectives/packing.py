"""Best-fit tie-break: prefer nodes that are already fuller (CPU and GPU)."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """packing * fullness of the chosen node, per pod."""
    if not w.packing:
        return 0
    packed = [(v.x[ci], w.packing * c.pack) for ci, c in enumerate(inst.candidates) if c.pack]
    return cp_model.LinearExpr.weighted_sum([x for x, _ in packed], [k for _, k in packed])


def stake(inst: Instance, w: Weights) -> int:
    """Per pod, the fullest node it may land on."""
    fullest = [0] * len(inst.groups)
    for c in inst.candidates:
        fullest[c.group] = max(fullest[c.group], c.pack)
    return w.packing * sum(f * len(g.pods) for f, g in zip(fullest, inst.groups, strict=True))
