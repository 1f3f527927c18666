"""GPU islands: a multi-GPU pod asking for one island gets all its GPUs inside one.

Only nodes with more than one island need variables.  There, per island, the
idle GPUs the batch takes (``island_taken``; the ``whole`` booleans' sum where
shares may also land) add up to everything the node's whole-GPU pods and MIG
layouts take, and the pods placed inside an island (``island[c, i]``, k GPUs
each) fit in what is taken there.  Pods that do not ask take the rest, wherever
it is, which is exact: they fit any GPUs.  ``required`` pods must all be inside
an island; ``preferred`` ones may spill across islands (``spill[c]``, charged
by the ``island_spill`` objective).
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI
from gpusched.solver.constraints.whole_gpu import whole_need
from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per island: sum of k * island[c, i] <= GPUs taken in the island; sum over islands == taken."""
    state = inst.state
    cl = state.cluster
    asking: dict[int, list[int]] = defaultdict(list)
    for ci, c in enumerate(inst.candidates):
        shape = inst.groups[c.group].shape
        if shape.island and int(cl.islands[c.node].max(initial=0)) > 0:
            asking[c.node].append(ci)
    for n, cis in asking.items():
        count = cl.nodes[n].gpu_count
        idle_in: dict[int, list[int]] = defaultdict(list)
        for g in range(count):
            if state.gpu_free[n, g] >= GPU_MILLI:
                idle_in[int(cl.islands[n, g])].append(g)
        taken: dict[int, cp_model.LinearExprT] = {}
        for i, gpus in idle_in.items():
            if (n, gpus[0]) in v.whole:
                taken[i] = sum(v.whole[n, g] for g in gpus)
            else:
                t = model.new_int_var(0, len(gpus), f"t{n}_{i}")
                v.island_taken[n, i] = t
                taken[i] = t
        if not any((n, g) in v.whole for gpus in idle_in.values() for g in gpus):
            model.add(sum(taken.values()) == whole_need(inst, v, n))
        inside: dict[int, list[cp_model.LinearExprT]] = defaultdict(list)
        for ci in cis:
            c = inst.candidates[ci]
            shape = inst.groups[c.group].shape
            k = shape.num_gpu
            parts = []
            for i, gpus in idle_in.items():
                if len(gpus) >= k:
                    z = model.new_int_var(0, min(c.ub, len(gpus) // k), f"i{ci}_{i}")
                    v.island[ci, i] = z
                    parts.append(z)
                    inside[i].append(k * z)
            if shape.island == "required":
                model.add(v.x[ci] == sum(parts))
            else:
                s = model.new_int_var(0, c.ub, f"s{ci}")
                v.spill[ci] = s
                model.add(v.x[ci] == sum(parts) + s)
        for i, loads in inside.items():
            model.add(sum(loads) <= taken[i])
