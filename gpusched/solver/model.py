"""Compose the constraint and objective modules into one CP-SAT model."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver import constraints, objectives
from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars

__all__ = ["build_model", "hint_from_plan"]


def build_model(inst: Instance, weights: Weights) -> tuple[cp_model.CpModel, Vars]:
    """The model for ``inst``: every constraint module, then the sum of every objective term."""
    model = cp_model.CpModel()
    v = Vars.create(inst, model)
    for c in constraints.ALL:
        c.build(inst, model, v)
    model.maximize(sum(o.build(inst, model, v, weights) for o in objectives.ALL))
    return model, v


def hint_from_plan(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Warm start: hint every variable with the value it takes in ``inst.hint``."""
    index = {(c.group, c.node): ci for ci, c in enumerate(inst.candidates)}
    group_of = {g.shape: gi for gi, g in enumerate(inst.groups)}
    x: dict[int, int] = dict.fromkeys(v.x, 0)
    y: dict[tuple[int, int], int] = dict.fromkeys(v.y, 0)
    whole: dict[tuple[int, int], int] = dict.fromkeys(v.whole, 0)
    for a in inst.hint.assignments:
        ci = index.get((group_of[a.pod.shape], a.node))
        if ci is None:
            return  # the hint is not expressible; solve cold rather than hint part of it
        x[ci] += 1
        if a.pod.is_fractional:
            y[ci, a.gpus[0]] += 1
        else:
            for g in a.gpus:
                if (a.node, g) in whole:
                    whole[a.node, g] = 1
    # The model takes idle GPUs whole in index order; relabel interchangeable idle
    # GPUs in the hint so that it does the same (swap loads between the pairs).
    for n in {n for n, _ in whole}:
        idle = sorted(g for m, g in whole if m == n)
        used = [g for g in idle if whole[n, g]]
        target = idle[: len(used)]
        for src, dst in zip(sorted(set(used) - set(target)), sorted(set(target) - set(used)), strict=True):
            whole[n, src], whole[n, dst] = 0, 1
            for ci in v.by_node[n]:
                ys, yd = y.get((ci, src)), y.get((ci, dst))
                if ys is not None or yd is not None:
                    y[ci, src], y[ci, dst] = yd or 0, ys or 0
    for k, val in x.items():
        model.add_hint(v.x[k], val)
    for k2, val in y.items():
        model.add_hint(v.y[k2], val)
    for k3, val in whole.items():
        model.add_hint(v.whole[k3], val)
    for ci, k_var in v.kept.items():
        model.add_hint(k_var, min(x[ci], inst.candidates[ci].ub))
    for n, a_var in v.active.items():
        model.add_hint(a_var, int(any(x[ci] for ci in v.by_node[n])))
