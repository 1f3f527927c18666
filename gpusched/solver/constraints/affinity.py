"""Required pod affinity within the batch.

Candidates lie in domains where a pod each term selects already runs
(``ClusterState.affinity_mask``), so for most groups nothing is left to decide.
The exception is the first of a series: pods whose terms select themselves and no
pod running anywhere (kube-scheduler lets the first such pod go to any node with
every term's key).  Once one is placed, the rest must join it, so all pods that
are first of a series in a batch share one domain per key.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per key of the first-of-series groups' terms: one domain, and their pods only there."""
    state = inst.state
    nodes = state.cluster.nodes
    cands: dict[tuple[str, str], list[int]] = defaultdict(list)
    for gi, group in enumerate(inst.groups):
        if group.shape.affinity and state.affinity_first(group.pods[0]):
            for key in {t.topology_key for t in group.shape.affinity}:
                for ci in v.by_group[gi]:
                    cands[key, nodes[inst.candidates[ci].node].labels[key]].append(ci)
    by_key: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    for (key, value), mine in sorted(cands.items()):
        chosen = model.new_bool_var(f"first_{key}_{value}")
        model.add(sum(v.x[ci] for ci in mine) <= sum(inst.candidates[ci].ub for ci in mine) * chosen)
        v.first[key, value] = (chosen, tuple(mine))
        by_key[key].append(chosen)
    for chosen_ones in by_key.values():
        model.add(sum(chosen_ones) <= 1)
