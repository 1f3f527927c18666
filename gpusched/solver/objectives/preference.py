"""Preferred node affinity: a pod on a node meeting its preferred terms earns their weight."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """preferred_affinity * the weight of the preferred terms the chosen node meets, per pod."""
    if not w.preferred_affinity:
        return 0
    terms: list[cp_model.LinearExprT] = []
    for ci, c in enumerate(inst.candidates):
        preference = inst.groups[c.group].shape.preferred_nodes
        if preference:
            score = int(inst.state.cluster.preference_scores(preference)[c.node])
            if score:
                terms.append(w.preferred_affinity * score * v.x[ci])
    return sum(terms)
