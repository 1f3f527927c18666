"""Compose the constraint and objective modules into one CP-SAT model."""

from __future__ import annotations

from ortools.sat.python import cp_model, cp_model_helper

from gpusched.solver import constraints, objectives
from gpusched.solver.instance import Instance, domain_of
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars

__all__ = ["build_model", "hint_from_plan", "maximize"]


def build_model(inst: Instance, weights: Weights) -> tuple[cp_model.CpModel, Vars]:
    """The model for ``inst``: every constraint module, then the sum of every objective term
    (placement weighted first, ``objectives.placed.placement_first``, and within placement, the
    higher priority levels first, ``objectives.priority``)."""
    stakes = sum(o.stake(inst, weights) for o in objectives.ALL)
    weights = objectives.placed.placement_first(inst, weights, stakes)
    model = cp_model.CpModel()
    v = Vars.create(inst, model)
    for c in constraints.ALL:
        c.build(inst, model, v)
    terms = [o.build(inst, model, v, weights) for o in objectives.ALL]
    terms.append(objectives.priority.build(inst, model, v, weights, stakes))
    maximize(model, cp_model.LinearExpr.sum(terms))
    return model, v


def maximize(model: cp_model.CpModel, objective: cp_model.LinearExprT) -> None:
    """``model.maximize(objective)`` for an integer objective, with its terms written to the proto
    in bulk: ``maximize`` appends them one at a time, 60 ms for a 10,000-node batch."""
    if isinstance(objective, int) or not isinstance(objective, cp_model.LinearExpr):
        model.maximize(objective)
        return
    flat = cp_model_helper.FlatIntExpr(objective)
    model.clear_objective()  # type: ignore[no-untyped-call]
    proto = model.proto.objective
    proto.vars.extend([var.index for var in flat.vars])
    proto.coeffs.extend([-c for c in flat.coeffs])  # CP-SAT minimises: maximising is minimising -f
    proto.scaling_factor = -1.0
    proto.offset = -flat.offset


def hint_from_plan(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Warm start: hint every variable with the value it takes in ``inst.hint``."""
    index = {(c.group, c.node): ci for ci, c in enumerate(inst.candidates)}
    islands = inst.state.cluster.islands
    x: dict[int, int] = dict.fromkeys(v.x, 0)
    y: dict[tuple[int, int], int] = dict.fromkeys(v.y, 0)
    whole: dict[tuple[int, int], int] = dict.fromkeys(v.whole, 0)
    inside: dict[tuple[int, int], int] = dict.fromkeys(v.island, 0)
    spill: dict[int, int] = dict.fromkeys(v.spill, 0)
    taken: dict[tuple[int, int], int] = dict.fromkeys(v.island_taken, 0)
    layout: dict[tuple[int, int], int] = dict.fromkeys(v.layout, 0)
    gang: dict[str, int] = dict.fromkeys(v.gang, 0)
    domain: dict[tuple[str, str], int] = dict.fromkeys(v.domain, 0)
    for a in inst.hint.assignments:
        ci = index.get((inst.group_index(a.pod), a.node))
        if ci is None:
            return  # the hint is not expressible; solve cold rather than hint part of it
        x[ci] += 1
        if a.pod.gang is not None:
            gang[a.pod.gang.name] = 1
            dom = domain_of(inst.state, a.node, a.pod.gang)
            if (a.pod.gang.name, dom) in domain:
                domain[a.pod.gang.name, dom] = 1
        if a.pod.is_fractional:
            y[ci, a.gpus[0]] += 1
            continue
        for g in a.gpus:
            if (a.node, g) in whole:
                whole[a.node, g] = 1
            if (a.node, int(islands[a.node, g])) in taken:
                taken[a.node, int(islands[a.node, g])] += 1
        ids = {int(islands[a.node, g]) for g in a.gpus}
        if len(ids) == 1 and (ci, next(iter(ids))) in inside:
            inside[ci, next(iter(ids))] += 1
        elif ci in spill:
            spill[ci] += 1
    for n, g, lay in inst.hint.partitions:
        if (n, g) in whole:
            whole[n, g] = 1
        if (n, int(islands[n, g])) in taken:
            taken[n, int(islands[n, g])] += 1
        wanted = v.layout_profiles.get(n, ())
        key = tuple(lay.counts.get(p, 0) for p in wanted)
        for k, cand in enumerate(v.layouts.get(n, ())):
            if tuple(cand.counts.get(p, 0) for p in wanted) == key:
                layout[n, k] += 1
                break
    _relabel_idle(inst, v, whole, y)
    hinted: list[tuple[cp_model.IntVar, int]] = [(v.x[ci], val) for ci, val in x.items()]
    hinted += [(v.spill[ci], val) for ci, val in spill.items()]
    for pairs, var_of in ((y, v.y), (whole, v.whole), (inside, v.island), (taken, v.island_taken), (layout, v.layout)):
        hinted += [(var_of[k2], val) for k2, val in pairs.items()]
    hinted += [(v.gang[name], val) for name, val in gang.items()]
    hinted += [(v.domain[dk], val) for dk, val in domain.items()]
    nodes = inst.state.cluster.nodes
    for (gi, label, value), b_var in v.apart.items():
        there = any(x[ci] for ci in v.by_group[gi] if nodes[inst.candidates[ci].node].labels.get(label) == value)
        hinted.append((b_var, int(there)))
    for pair_var, mine in v.apart_pairs.values():
        k = sum(x[ci] for ci in mine)
        hinted.append((pair_var, k * (k - 1) // 2))
    in_domain: dict[int, int] = {}  # a group's pods in a domain, shared by its pairs: hinted once
    for pair_var, a_var, b_var, mine, theirs in v.cross_pairs.values():
        ka, kb = sum(x[ci] for ci in mine), sum(x[ci] for ci in theirs)
        in_domain[a_var.index], in_domain[b_var.index] = ka, kb
        hinted.append((pair_var, ka * kb))
    hinted += [(model.get_int_var_from_proto_index(proto), k) for proto, k in in_domain.items()]
    for chosen, mine in v.follow.values():
        hinted.append((chosen, int(any(x[ci] for ci in mine))))
    for kv, (chosen, mine) in v.first.items():
        alone = any(x[ci] for ci in mine) or any(
            any(x[ci] for ci in own) and not any(x[ci] for ci in theirs) for own, theirs in v.first_escapes.get(kv, ())
        )
        hinted.append((chosen, int(alone)))
    started: dict[int, tuple[str | None, ...]] = {}  # the first pod of each series in the hint starts it
    for a in inst.hint.assignments:
        root = v.series.get(inst.group_index(a.pod))
        if root is not None and root not in started:
            labels = inst.state.cluster.nodes[a.node].labels
            started[root] = tuple(labels.get(k) for k in v.starts[root][0])
    for root, (_, starts) in v.starts.items():
        hinted += [(s, int(started.get(root) == where)) for where, s in starts.items()]
    for used, cands in v.spread_in.values():
        hinted.append((used, int(any(x[ci] for ci in cands))))
    for low, terms in v.spread_low.values():
        hinted.append((low, min(base + sum(x[ci] for ci in cands) for base, cands in terms)))
    hinted += [(k_var, min(x[ci], inst.candidates[ci].ub)) for ci, k_var in v.kept.items()]
    hinted += [(a_var, int(any(x[ci] for ci in v.by_node[n]))) for n, a_var in v.active.items()]
    # Written to the proto in two bulk appends: ``add_hint`` per variable costs two proto calls
    # each, a tenth of a second on a 10,000-node batch.  Every variable here is positive.
    assert all(var.index >= 0 for var, _ in hinted)
    hint = model.proto.solution_hint
    hint.vars.extend([var.index for var, _ in hinted])
    hint.values.extend([int(val) for _, val in hinted])


def _relabel_idle(inst: Instance, v: Vars, whole: dict[tuple[int, int], int], y: dict[tuple[int, int], int]) -> None:
    """The model takes idle GPUs of one island whole in index order; relabel interchangeable idle
    GPUs in the hint so that it does the same (swap loads between the pairs)."""
    islands = inst.state.cluster.islands
    by_node: dict[int, dict[int, list[int]]] = {}  # node -> island -> its idle GPUs, in index order
    for n, g in sorted(whole):
        by_node.setdefault(n, {}).setdefault(int(islands[n, g]), []).append(g)
    for n, per_island in by_node.items():
        for idle in per_island.values():
            used = [g for g in idle if whole[n, g]]
            target = idle[: len(used)]
            for src, dst in zip(sorted(set(used) - set(target)), sorted(set(target) - set(used)), strict=True):
                whole[n, src], whole[n, dst] = 0, 1
                for ci in v.by_node[n]:
                    ys, yd = y.get((ci, src)), y.get((ci, dst))
                    if ys is not None or yd is not None:
                        y[ci, src], y[ci, dst] = yd or 0, ys or 0
