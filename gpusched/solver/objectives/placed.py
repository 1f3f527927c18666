"""Placed GPU demand and placed pods: the terms that make the solver place work at all."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """placed_gpu * GPU demand placed + placed_pods * pods placed."""
    terms = []
    for ci, c in enumerate(inst.candidates):
        coef = w.placed_gpu * inst.groups[c.group].shape.gpu_demand_milli + w.placed_pods
        if coef:
            terms.append(coef * v.x[ci])
    return sum(terms)
