"""Fractional pods share one GPU each; shares on a GPU never exceed its free capacity."""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI
from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """x == sum of y over GPUs; per GPU sum of milli * y <= free (0 when taken whole)."""
    load: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for ci, c in enumerate(inst.candidates):
        if not c.gpus:
            continue
        model.add(v.x[ci] == cp_model.LinearExpr.sum([v.y[ci, g] for g, _, _ in c.gpus]))
        milli = inst.groups[c.group].shape.gpu_milli
        for g, fit, _ in c.gpus:
            load[c.node, g].append((milli, ci, min(fit, c.ub)))
    for (n, g), items in load.items():
        free = int(inst.state.gpu_free[n, g])
        taken = v.whole.get((n, g))
        used = cp_model.LinearExpr.weighted_sum([v.y[ci, g] for _, ci, _ in items], [m for m, _, _ in items])
        if taken is not None:
            model.add(used <= free - GPU_MILLI * taken)
        elif sum(m * ub for m, _, ub in items) > free:
            model.add(used <= free)
