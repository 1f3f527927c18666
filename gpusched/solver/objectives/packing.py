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
    return sum(w.packing * c.pack * v.x[ci] for ci, c in enumerate(inst.candidates) if c.pack)
