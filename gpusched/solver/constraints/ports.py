"""Host ports: no two pods the batch places on one node bind the same host port.

Nodes where a port is already bound are no candidates for pods that ask for it
(``ClusterState.fit_mask``), and a candidate holds at most one such pod.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per node and host port: at most one placed pod binds it."""
    for cis in v.by_node.values():
        users: dict[str, list[int]] = defaultdict(list)
        for ci in cis:
            for port in inst.groups[inst.candidates[ci].group].shape.host_ports:
                users[port].append(ci)
        for group in users.values():
            if len(group) > 1:
                model.add(sum(v.x[ci] for ci in group) <= 1)
