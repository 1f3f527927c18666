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

from collections.abc import Iterator

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.objectives.placed import worth
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def _charges(inst: Instance, w: Weights) -> Iterator[tuple[int, int | None, int]]:
    """(candidate, GPU for a share or None, charge per pod placed so)."""
    for ci, c in enumerate(inst.candidates):
        # Worth of the pod net of waking its node, so the cap holds on an idle node too.  The
        # worth before ``placement_first`` raises it: the cap is part of what is at stake.
        cap = max(worth(w, inst.groups[c.group].shape.gpu_demand_milli) - w.active_nodes - 1, 0)
        options = [(g, d) for g, _, d in c.gpus] if c.gpus else [(None, c.frag)] if c.frag else []
        for g, d in options:
            cost = min(w.fragmentation * d, cap) if w.work_conserving else w.fragmentation * d
            if cost:
                yield ci, g, cost


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """-fragmentation * added fragmentation."""
    if not w.fragmentation:
        return 0
    charges = list(_charges(inst, w))
    xs = [v.x[ci] if g is None else v.y[ci, g] for ci, g, _ in charges]
    return cp_model.LinearExpr.weighted_sum(xs, [-cost for _, _, cost in charges])


def stake(inst: Instance, w: Weights) -> int:
    """Per pod, its dearest charge plus its richest reward."""
    if not w.fragmentation:
        return 0
    dearest = [0] * len(inst.groups)
    richest = [0] * len(inst.groups)
    for ci, _, cost in _charges(inst, w):
        gi = inst.candidates[ci].group
        dearest[gi] = max(dearest[gi], cost)
        richest[gi] = max(richest[gi], -cost)
    return sum((dearest[gi] + richest[gi]) * len(g.pods) for gi, g in enumerate(inst.groups))
