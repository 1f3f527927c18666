"""Stay with the warm start unless departing from it places more.

The greedy (FGD) warm start places each pod where it adds the least
fragmentation given every pod placed before it, which the linear
fragmentation term can only approximate: left free to rearrange, the solver
exploits that approximation and packs worse.  This term pays ``keep_hint``
per pod left where the warm start put it, so the solver moves pods where that
places more of the batch (the part a one-pod-at-a-time policy cannot see) or
saves more fragmentation than ``keep_hint`` is worth.
"""

from __future__ import annotations

from collections import Counter

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """keep_hint * pods placed on the node the warm start chose for their shape."""
    if not w.keep_hint:
        return 0
    hinted = Counter((inst.group_index(a.pod), a.node) for a in inst.hint.assignments)
    terms: list[cp_model.IntVar] = []
    for ci, c in enumerate(inst.candidates):
        count = hinted.get((c.group, c.node), 0)
        if not count:
            continue
        kept = model.new_int_var(0, min(count, c.ub), f"k{ci}")
        model.add(kept <= v.x[ci])
        v.kept[ci] = kept
        terms.append(kept)
    return w.keep_hint * cp_model.LinearExpr.sum(terms)


def stake(inst: Instance, w: Weights) -> int:
    """Every pod the warm start placed, kept or moved."""
    return w.keep_hint * len(inst.hint.assignments)
