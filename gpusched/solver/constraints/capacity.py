"""CPU, memory, ephemeral storage and pod slots on each node: what the batch places fits in what
is free."""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum of requests on a node <= its free CPU, free memory and free ephemeral storage, and
    the pods placed on it <= the pods it still takes (the kubelet's ``maxPods``)."""
    state = inst.state
    storage = any(g.shape.storage_mib for g in inst.groups)
    pods = state.cluster.pods_metered
    for n, cis in v.by_node.items():
        shapes = [inst.groups[inst.candidates[ci].group].shape for ci in cis]
        checks = [
            (int(state.cpu_free[n]), [s.cpu_milli for s in shapes]),
            (int(state.mem_free[n]), [s.memory_mib for s in shapes]),
        ]
        if storage:
            checks.append((int(state.storage_free[n]), [s.storage_mib for s in shapes]))
        if pods:
            checks.append((int(state.pods_free[n]), [1] * len(shapes)))
        for free, req in checks:
            if not any(req):
                continue  # nothing asks for it here (the node may even be over-committed already)
            # Skip constraints that cannot bind (each ub already respects capacity alone).
            if sum(r * inst.candidates[ci].ub for r, ci in zip(req, cis, strict=True)) > free:
                model.add(cp_model.LinearExpr.weighted_sum([v.x[ci] for ci in cis], req) <= free)
