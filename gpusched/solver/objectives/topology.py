"""Topology wishes and MIG layouts: pods preferring one GPU island placed across islands, gangs
preferring one topology domain spread over several, and idle GPUs partitioned into MIG slices."""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """-island_spill * spilled pods - mig_partition * GPUs partitioned
    - gang_domains * (domains used - 1) per preferring gang."""
    terms: list[cp_model.LinearExprT] = [-w.island_spill * s for s in v.spill.values()]
    terms.extend(-w.mig_partition * var for var in v.layout.values())
    per_gang: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    for (name, _), d in v.domain.items():
        per_gang[name].append(d)
    for name, doms in per_gang.items():
        if len(doms) > 1:
            terms.append(-w.gang_domains * (sum(doms) - v.gang[name]))
    return sum(terms)


def stake(inst: Instance, w: Weights) -> int:
    """Every pod preferring one island spilled, every MIG pod on a GPU partitioned for it alone,
    every member of a gang preferring one domain in a domain of its own."""
    spills = sum(len(g.pods) for g in inst.groups if g.shape.island == "preferred")
    slices = sum(len(g.pods) for g in inst.groups if g.shape.mig_profile)
    members: dict[str, int] = defaultdict(int)
    for g in inst.groups:
        for p in g.pods:
            if p.gang is not None and p.gang.topology == "preferred":
                members[p.gang.name] += 1
    spans = sum(n - 1 for n in members.values())
    return w.island_spill * spills + w.mig_partition * slices + w.gang_domains * spans
