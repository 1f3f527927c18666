"""CPU and memory on each node: what the batch places fits in what is free."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum of requests on a node <= its free CPU and free memory."""
    cpu_free, mem_free = inst.state.cpu_free, inst.state.mem_free
    for n, cis in v.by_node.items():
        for free, req in (
            (int(cpu_free[n]), [inst.groups[inst.candidates[ci].group].shape.cpu_milli for ci in cis]),
            (int(mem_free[n]), [inst.groups[inst.candidates[ci].group].shape.memory_mib for ci in cis]),
        ):
            # Skip constraints that cannot bind (each ub already respects capacity alone).
            if sum(r * inst.candidates[ci].ub for r, ci in zip(req, cis, strict=True)) > free:
                model.add(sum(r * v.x[ci] for r, ci in zip(req, cis, strict=True)) <= free)
