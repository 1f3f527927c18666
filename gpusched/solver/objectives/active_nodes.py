"""GPU nodes newly woken: each idle GPU node the batch starts using costs ``active_nodes``.

Fewer active nodes leave whole nodes free for large jobs and for scale-down.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def stake(inst: Instance, w: Weights) -> int:
    """Each pod wakes at most one node: the idle GPU nodes among candidates, or the GPU pods."""
    state = inst.state
    idle = {c.node for c in inst.candidates if state.cluster.gpu_count[c.node] and not state.gpu_used[c.node].any()}
    gpu_pods = sum(len(g.pods) for g in inst.groups if g.shape.num_gpu or g.shape.mig_profile)
    return w.active_nodes * min(len(idle), gpu_pods)


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """-active_nodes * idle GPU nodes that receive a GPU pod."""
    if not w.active_nodes:
        return 0
    state = inst.state
    terms = []
    for n, cis in v.by_node.items():
        if state.cluster.gpu_count[n] == 0 or state.gpu_used[n].any():
            continue
        gpu_cis = [
            ci
            for ci in cis
            if inst.groups[inst.candidates[ci].group].shape.num_gpu
            or inst.groups[inst.candidates[ci].group].shape.mig_profile
        ]
        if not gpu_cis:
            continue
        a = model.new_bool_var(f"a{n}")
        v.active[n] = a
        for ci in gpu_cis:
            model.add(v.x[ci] <= inst.candidates[ci].ub * a)
        terms.append(a)
    return -w.active_nodes * cp_model.LinearExpr.sum(terms)
