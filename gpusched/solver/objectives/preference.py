"""Preferences: preferred node affinity earns a pod its terms' weight on a node meeting them;
preferred pod anti-affinity costs it its terms' weight in a domain running a pod they select
(pods already placed, and the batch's own pods of its group beyond the first per domain)."""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """preferred_affinity * (weight of preferred node terms met - weight of preferred
    anti-affinity terms broken), per pod."""
    if not w.preferred_affinity:
        return 0
    cl = inst.state.cluster
    terms: list[cp_model.LinearExprT] = []
    for gi, group in enumerate(inst.groups):
        shape = group.shape
        if not (shape.preferred_nodes or shape.preferred_apart):
            continue
        scores = cl.preference_scores(shape.preferred_nodes)
        apart = inst.state.apart_penalty(group.pods[0])
        for ci in v.by_group[gi]:
            node = inst.candidates[ci].node
            score = int(scores[node]) - (int(apart[node]) if apart is not None else 0)
            if score:
                terms.append(w.preferred_affinity * score * v.x[ci])
        for ti, (weight, term) in enumerate(shape.preferred_apart):
            if not group.pods[0].selected_by(term):
                continue
            by_domain: dict[str, list[int]] = defaultdict(list)
            for ci in v.by_group[gi]:
                value = cl.nodes[inst.candidates[ci].node].labels.get(term.topology_key)
                if value is not None:
                    by_domain[value].append(ci)
            for value, mine in by_domain.items():
                most = sum(inst.candidates[ci].ub for ci in mine)
                if most < 2:
                    continue
                excess = model.new_int_var(0, most - 1, f"ap{gi}_{ti}_{value}")
                model.add(excess >= sum(v.x[ci] for ci in mine) - 1)
                v.apart_excess[gi, ti, value] = (excess, tuple(mine))
                terms.append(-w.preferred_affinity * weight * excess)
    return sum(terms)
