"""Host ports: no two pods the batch places on one node hold clashing host port bindings (the same
port on every address, or on the same one: ``model.ports``).

Nodes where a port is already bound are no candidates for pods that ask for it
(``ClusterState.fit_mask``), and a candidate holds at most one such pod.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model.ports import port_cliques
from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per node and set of clashing bindings (``port_cliques``): at most one placed pod holds one."""
    for cis in v.by_node.values():
        users: dict[str, set[int]] = defaultdict(set)
        for ci in cis:
            for port in inst.groups[inst.candidates[ci].group].shape.host_ports:
                users[port].add(ci)
        for clique in port_cliques(users).values():
            group = sorted(set().union(*(users[k] for k in clique)))
            if len(group) > 1:
                model.add(sum(v.x[ci] for ci in group) <= 1)
