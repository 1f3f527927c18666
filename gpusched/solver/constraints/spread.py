"""Topology spread (``whenUnsatisfiable: DoNotSchedule``): once the batch is placed, no domain
that a constrained group places pods in holds more than ``max_skew`` counted pods beyond the
emptiest domain eligible for it.

Pods counted are those on the nodes that count for the group's pods
(``ClusterState.spread_view``): those already there, and the batch's pods the
constraint's selector picks, of any group.  Such an end state can be bound one pod at
a time within the skew at every step when each pod has one constraint
(``validate.peer_order`` looks for the order; the validator has the last word).
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per constrained group and domain it uses: count there - max_skew <= the emptiest's count."""
    state = inst.state
    for gi, group in enumerate(inst.groups):
        for spread in group.shape.spread:
            k = inst.spreads.index(spread)
            column = state.cluster.domains(spread.topology_key)[0]
            view = state.spread_view(group.pods[0], spread)
            counting: dict[int, list[int]] = defaultdict(list)  # domain -> candidates whose pods count
            for hi, other in enumerate(inst.groups):
                if k in other.counted_by:
                    for ci in v.by_group[hi]:
                        node = inst.candidates[ci].node
                        if view.eligible[node]:
                            counting[int(column[node])].append(ci)
            eligible = [int(d) for d in view.present.nonzero()[0]]
            low: cp_model.LinearExprT = 0
            if view.domains >= spread.min_domains:
                moving = sum(inst.candidates[ci].ub for cs in counting.values() for ci in cs)
                low_var = model.new_int_var(0, int(view.counts.max(initial=0)) + moving, f"low{gi}_{k}")
                fixed = [int(view.counts[d]) for d in eligible if d not in counting]
                terms = [(int(view.counts[d]), tuple(counting[d])) for d in eligible if d in counting]
                if fixed:  # the domains no candidate counts in: their emptiest, once
                    terms.append((min(fixed), ()))
                for base, counted in terms:
                    model.add(low_var <= base + sum(v.x[ci] for ci in counted))
                v.spread_low[gi, k] = (low_var, tuple(terms))
                low = low_var
            own: dict[int, list[int]] = defaultdict(list)
            for ci in v.by_group[gi]:
                if (d := int(column[inst.candidates[ci].node])) >= 0:
                    own[d].append(ci)
            for d, mine in own.items():
                if d not in counting and isinstance(low, int):  # nothing here moves: decided now
                    if int(view.counts[d]) - spread.max_skew > low:
                        model.add(sum(v.x[ci] for ci in mine) == 0)
                    continue
                used = model.new_bool_var(f"sp{gi}_{k}_{d}")
                model.add(sum(v.x[ci] for ci in mine) <= sum(inst.candidates[ci].ub for ci in mine) * used)
                there = int(view.counts[d]) + sum(v.x[ci] for ci in counting.get(d, ()))
                model.add(there - spread.max_skew <= low).only_enforce_if(used)
                v.spread_in[gi, k, d] = (used, tuple(mine))
