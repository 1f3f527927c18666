"""Placed GPU demand and placed pods: the terms that make the solver place work at all."""

from __future__ import annotations

from dataclasses import replace

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.objectives import preference
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


def placement_first(inst: Instance, w: Weights) -> Weights:
    """``w`` with the placement weights raised, in the work-conserving mode, until the least a
    placed pod is worth exceeds all the batch's terms that do not grow with placement together:
    leaving every pod where the warm start put it, and every preference.  Then neither keeps out
    a pod that fits (two pods kept in place, or two wishes met, cannot outweigh a third pod).
    Fragmentation is capped per pod below its worth (``fragmentation``), nodes activated are
    part of that cap.  Outside the work-conserving mode a pod may be declined anyway: unchanged."""
    if not w.work_conserving or not inst.groups:
        return w
    pods = sum(len(g.pods) for g in inst.groups)
    stake = w.keep_hint * pods + w.preferred_affinity * preference.swing(inst)
    least = min(w.placed_gpu * g.shape.gpu_demand_milli + w.placed_pods for g in inst.groups)
    if least > stake or least <= 0:
        return w
    factor = stake // least + 1
    return replace(w, placed_gpu=w.placed_gpu * factor, placed_pods=w.placed_pods * factor)
