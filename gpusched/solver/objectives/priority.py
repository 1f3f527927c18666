"""Priority: a pod of lower priority never takes the room a pod of higher priority in the same
solve needs, even where it would place more GPU demand (kube-scheduler's queue takes pods
highest priority first; so does the warm start).

Each priority level's pods are worth more, one pod alone, than everything the levels below and
every other term together can differ by: the objective is lexicographic over the levels, the
batch's placement terms within a level.  A gang counts at its lowest member's priority, as the
daemon's passes place it.  Only in the work-conserving mode (a pod that fits is placed there
anyway; outside it, a pod may be left to wait whatever its priority).
"""

from __future__ import annotations

from collections.abc import Iterable

from ortools.sat.python import cp_model

from gpusched.model import Pod
from gpusched.solver.instance import Instance
from gpusched.solver.objectives.placed import OBJECTIVE_LIMIT, worth
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def gang_priorities(pods: Iterable[Pod]) -> dict[str, int]:
    """The priority each gang of ``pods`` is placed at: its lowest member's."""
    least: dict[str, int] = {}
    for p in pods:
        if p.gang is not None:
            least[p.gang.name] = min(least.get(p.gang.name, p.priority), p.priority)
    return least


def levels(inst: Instance) -> list[int]:
    """The priority each group's pods are placed at: their own, a gang's lowest member's."""
    least = gang_priorities(p for g in inst.groups for p in g.pods)
    return [least[g.gang.name] if g.gang is not None else g.priority for g in inst.groups]


def bonuses(inst: Instance, w: Weights, stakes: int) -> list[int]:
    """Per group, what one placed pod is worth on top of ``placed``'s terms: 0 at the lowest
    level; at each higher one, one more than the most the levels below (their placed pods with
    their bonuses) and ``stakes`` (every other term) can add up to.  All 0 when the batch has
    one level, outside the work-conserving mode, or when the bonuses would take the objective
    past ``OBJECTIVE_LIMIT`` (levels so many, or weights so far off the defaults, that it cannot
    be exact; the daemon's passes place the highest levels apart anyway)."""
    lv = levels(inst)
    none = [0] * len(inst.groups)
    if not w.work_conserving or len(set(lv)) < 2:
        return none
    below = stakes
    bonus: dict[int, int] = {}
    for level in sorted(set(lv)):
        bonus[level] = below + 1 if bonus else 0
        for gi, g in enumerate(inst.groups):
            if lv[gi] == level:
                below += len(g.pods) * (w.placement_factor * worth(w, g.shape.gpu_demand_milli) + bonus[level])
        if below > OBJECTIVE_LIMIT:
            return none
    return [bonus[level] for level in lv]


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights, stakes: int) -> cp_model.LinearExprT:
    """Sum over placed pods of their level's bonus (``bonuses``)."""
    bonus = bonuses(inst, w, stakes)
    xs, coefs = [], []
    for ci, c in enumerate(inst.candidates):
        if bonus[c.group]:
            xs.append(v.x[ci])
            coefs.append(bonus[c.group])
    return cp_model.LinearExpr.weighted_sum(xs, coefs)
