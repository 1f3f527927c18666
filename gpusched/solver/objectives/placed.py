"""Placed GPU demand and placed pods: the terms that make the solver place work at all."""

from __future__ import annotations

from dataclasses import replace

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars

OBJECTIVE_LIMIT = 2**50
"""The largest objective value ``placement_first`` lets a batch reach: far inside int64, where
CP-SAT checks for overflow, and exact as a double, which it reports the objective in."""


def worth(w: Weights, gpu_demand_milli: int) -> int:
    """What placing one pod of this GPU demand is worth, before ``placement_first`` raises it."""
    return w.placed_gpu * gpu_demand_milli + w.placed_pods


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """placement_factor * (placed_gpu * GPU demand placed + placed_pods * pods placed)."""
    xs, coefs = [], []
    for ci, c in enumerate(inst.candidates):
        coef = w.placement_factor * worth(w, inst.groups[c.group].shape.gpu_demand_milli)
        if coef:
            xs.append(v.x[ci])
            coefs.append(coef)
    return cp_model.LinearExpr.weighted_sum(xs, coefs)


def stake(inst: Instance, w: Weights) -> int:
    """The placement terms are what the others are weighed against: nothing at stake."""
    return 0


def placement_first(inst: Instance, w: Weights, stakes: int) -> Weights:
    """``w`` with ``placement_factor`` set, in the work-conserving mode, so that the least a placed
    pod is worth exceeds ``stakes``: the most all the other terms together can differ between two
    plans of the batch (each term's ``stake``: pods kept where the warm start put them, wishes,
    fragmentation, nodes woken, MIG partitions, ...).  Then no other term keeps out a pod that
    fits.  Pods worth nothing (``placedPods: 0`` and no GPU) are not counted as the least.

    The factor stops where the objective would pass ``OBJECTIVE_LIMIT``; only weights far off the
    defaults reach that, and the solver's fallback (never fewer pods than the warm start) holds.
    Outside the work-conserving mode a pod may be declined anyway: unchanged."""
    if not w.work_conserving or not inst.groups:
        return w
    worths = [(worth(w, g.shape.gpu_demand_milli), len(g.pods)) for g in inst.groups]
    least = min((value for value, _ in worths if value > 0), default=0)
    if least == 0 or least > stakes:
        return w
    total = sum(value * n for value, n in worths)
    factor = min(stakes // least + 1, max((OBJECTIVE_LIMIT - stakes) // total, 1))
    return replace(w, placement_factor=factor)
