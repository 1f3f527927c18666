"""Required pod anti-affinity within the batch: pods whose terms keep them apart never share a
topology domain (the nodes with one value of the term's label key).

Domains that pods already placed rule out are no candidates (``ClusterState.anti_mask``);
this module keeps the batch's own pods apart.  A group whose pods select each other places
at most one pod per domain; two groups that exclude each other may not both use a domain.
Nodes without the label are no domain and take any number.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations_with_replacement

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per conflicting pair of groups, key and domain: at most one pod (same group), or one group."""
    if not inst.terms:
        return
    nodes = inst.state.cluster.nodes
    involved = [gi for gi, g in enumerate(inst.groups) if g.shape.anti_affinity or g.selected_by]

    def placed(gi: int, key: str) -> dict[str, list[int]]:
        by_domain: dict[str, list[int]] = defaultdict(list)
        for ci in v.by_group[gi]:
            value = nodes[inst.candidates[ci].node].labels.get(key)
            if value is not None:
                by_domain[value].append(ci)
        return by_domain

    def uses(gi: int, key: str, value: str, cands: list[int]) -> cp_model.IntVar:
        b = v.apart.get((gi, key, value))
        if b is None:
            b = v.apart[gi, key, value] = model.new_bool_var(f"aa{gi}_{key}_{value}")
            model.add(sum(v.x[ci] for ci in cands) <= sum(inst.candidates[ci].ub for ci in cands) * b)
        return b

    for a, b in combinations_with_replacement(involved, 2):
        for key in inst.conflicts(a, b):
            in_a = placed(a, key)
            if a == b:
                for cands in in_a.values():
                    if sum(inst.candidates[ci].ub for ci in cands) > 1:
                        model.add(sum(v.x[ci] for ci in cands) <= 1)
                continue
            in_b = placed(b, key)
            for value in in_a.keys() & in_b.keys():
                model.add(uses(a, key, value, in_a[value]) + uses(b, key, value, in_b[value]) <= 1)
