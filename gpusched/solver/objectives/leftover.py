"""Leftover share on the GPUs a batch touches: rewards filling a GPU completely.

The fragmentation term charges each placement against the node as it is
before the batch, so it cannot see that two shares of 470 on one idle GPU leave
only 60 free while apart they leave 530 twice.  This term charges, per GPU the
batch places shares on, the share that stays free on it: an idle GPU costs its
whole capacity as soon as it is touched and every share placed pays it back.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI
from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """-leftover * (free share left on each touched idle GPU; reward per share on partly used ones)."""
    if not w.leftover:
        return 0
    per_gpu: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for ci, c in enumerate(inst.candidates):
        milli = inst.groups[c.group].shape.gpu_milli
        for g, _, _ in c.gpus:
            per_gpu[c.node, g].append((ci, milli))
    terms: list[cp_model.LinearExprT] = []
    for (n, g), items in per_gpu.items():
        load = sum(m * v.y[ci, g] for ci, m in items)
        if inst.state.gpu_free[n, g] >= GPU_MILLI:
            touched = model.new_bool_var(f"t{n}_{g}")
            for ci, _ in items:
                model.add(v.y[ci, g] == 0).only_enforce_if(~touched)
            terms.append(-w.leftover * (GPU_MILLI * touched - load))
        else:
            terms.append(w.leftover * load)
    return sum(terms)
