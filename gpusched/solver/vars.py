"""CP-SAT variables of a batch model, with the queries constraints and objectives need."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance

__all__ = ["Vars"]


@dataclass
class Vars:
    """``x[c]``: pods placed by candidate ``c``; ``y[c, g]``: of those, on GPU ``g`` (shares);
    ``whole[n, g]``: idle GPU ``g`` of node ``n`` taken by a whole-GPU pod; ``active[n]``: an
    idle node is woken."""

    x: dict[int, cp_model.IntVar] = field(default_factory=dict)
    y: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    whole: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    active: dict[int, cp_model.IntVar] = field(default_factory=dict)
    kept: dict[int, cp_model.IntVar] = field(default_factory=dict)
    by_node: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    by_group: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def create(cls, inst: Instance, model: cp_model.CpModel) -> Vars:
        """One count variable per candidate and one per (fractional candidate, GPU)."""
        v = cls()
        for ci, c in enumerate(inst.candidates):
            v.x[ci] = model.new_int_var(0, c.ub, f"x{ci}")
            v.by_node[c.node].append(ci)
            v.by_group[c.group].append(ci)
            for g, fit, _ in c.gpus:
                v.y[ci, g] = model.new_int_var(0, min(fit, c.ub), f"y{ci}_{g}")
        return v
