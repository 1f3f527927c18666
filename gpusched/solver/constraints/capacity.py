"""CPU, memory and ephemeral storage on each node: what the batch places fits in what is free."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum of requests on a node <= its free CPU, free memory and free ephemeral storage."""
    state = inst.state
    storage = any(g.shape.storage_mib for g in inst.groups)
    for n, cis in v.by_node.items():
        shapes = [inst.groups[inst.candidates[ci].group].shape for ci in cis]
        checks = [
            (int(state.cpu_free[n]), [s.cpu_milli for s in shapes]),
            (int(state.mem_free[n]), [s.memory_mib for s in shapes]),
        ]
        if storage:
            checks.append((int(state.storage_free[n]), [s.storage_mib for s in shapes]))
        for free, req in checks:
            if not any(req):
                continue  # nothing asks for it here (the node may even be over-committed already)
            # Skip constraints that cannot bind (each ub already respects capacity alone).
            if sum(r * inst.candidates[ci].ub for r, ci in zip(req, cis, strict=True)) > free:
                model.add(sum(r * v.x[ci] for r, ci in zip(req, cis, strict=True)) <= free)
