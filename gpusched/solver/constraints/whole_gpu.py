"""Whole-GPU pods (and MIG layouts) take idle GPUs of one node.

Where no fractional pod may use the node, a count suffices: whole GPUs taken
(by pods, and partitioned into MIG instances) <= idle GPUs.  Where shares may
also land there, each idle GPU gets a boolean ``whole[n, g]`` so that a GPU is
never both shared and taken whole.
"""

from __future__ import annotations

from itertools import pairwise

from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI
from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def whole_need(inst: Instance, v: Vars, n: int) -> cp_model.LinearExprT:
    """Idle GPUs of node ``n`` the batch takes: k per k-GPU pod, one per partitioned GPU."""
    cis = [ci for ci in v.by_node[n] if _takes_whole(inst, ci)]
    terms: list[cp_model.LinearExprT] = [inst.groups[inst.candidates[ci].group].shape.num_gpu * v.x[ci] for ci in cis]
    return sum([*terms, *v.partitioned(n)])


def _takes_whole(inst: Instance, ci: int) -> bool:
    shape = inst.groups[inst.candidates[ci].group].shape
    return shape.num_gpu > 0 and not shape.is_fractional


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum of k * x over whole-GPU candidates + partitioned GPUs == taken idle GPUs <= idle GPUs."""
    state = inst.state
    for n, cis in v.by_node.items():
        whole = [ci for ci in cis if _takes_whole(inst, ci)]
        if not whole and not v.layouts.get(n):
            continue
        need = whole_need(inst, v, n)
        shared = any(inst.candidates[ci].gpus for ci in cis)
        idle = [g for g in range(state.cluster.nodes[n].gpu_count) if state.gpu_free[n, g] >= GPU_MILLI]
        if not shared:
            bound = sum(inst.groups[inst.candidates[ci].group].shape.num_gpu * inst.candidates[ci].ub for ci in whole)
            if v.layouts.get(n) or bound > len(idle):
                model.add(need <= len(idle))
            continue
        for g in idle:
            v.whole[n, g] = model.new_bool_var(f"w{n}_{g}")
        model.add(need == sum(v.whole[n, g] for g in idle))
        # Interchangeable idle GPUs (of one island): take them in index order.
        islands = state.cluster.islands[n]
        for a, b in pairwise(idle):
            if islands[a] == islands[b]:
                model.add_implication(v.whole[n, b], v.whole[n, a])
