"""Fragmentation added by the batch, FGD's measure against the typical pods.

Each placement is charged the fragmentation it would add to its node as it is
now (for shares, on the GPU it lands on); a placement that lowers a node's
fragmentation, such as filling a GPU's last slice, earns the difference.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """-fragmentation * added fragmentation."""
    if not w.fragmentation:
        return 0
    terms: list[cp_model.LinearExprT] = []
    for ci, c in enumerate(inst.candidates):
        if c.gpus:
            terms.extend(-w.fragmentation * d * v.y[ci, g] for g, _, d in c.gpus if d)
        elif c.frag:
            terms.append(-w.fragmentation * c.frag * v.x[ci])
    return sum(terms)
