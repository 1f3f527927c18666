"""Each pod is placed at most once: per group, placements never exceed its pod count."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum over a group's candidates of x <= pods in the group."""
    for gi, cis in v.by_group.items():
        count = len(inst.groups[gi].pods)
        if sum(inst.candidates[ci].ub for ci in cis) > count:
            model.add(sum(v.x[ci] for ci in cis) <= count)
