"""Fragmentation added by the batch, FGD's measure against the typical pods.

Each placement is charged the fragmentation it would add to its node as it is
now (for shares, on the GPU it lands on); a placement that lowers a node's
fragmentation, such as filling a GPU's last slice, earns the difference.

With ``work_conserving`` (the default) the charge is capped just below what
placing the pod is worth, so the solver never leaves a pod pending that fits
somewhere only because every placement fragments; without it, such pods wait
for a better moment.
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
        # Worth of the pod net of waking its node, so the cap holds on an idle node too.
        cap = max(w.placed_gpu * inst.groups[c.group].shape.gpu_demand_milli + w.placed_pods - w.active_nodes - 1, 0)
        if c.gpus:
            for g, _, d in c.gpus:
                cost = min(w.fragmentation * d, cap) if w.work_conserving else w.fragmentation * d
                if cost:
                    terms.append(-cost * v.y[ci, g])
        elif c.frag:
            cost = min(w.fragmentation * c.frag, cap) if w.work_conserving else w.fragmentation * c.frag
            terms.append(-cost * v.x[ci])
    return sum(terms)
