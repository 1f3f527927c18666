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
    - gang_domains * (domains used - 1) per preferring gang, or, for one whose members run in
    a domain already, * the other domains used."""
    terms: list[cp_model.LinearExprT] = [-w.island_spill * s for s in v.spill.values()]
    terms.extend(-w.mig_partition * var for var in v.layout.values())
    held = _held(inst)
    per_gang: dict[str, list[tuple[str, cp_model.IntVar]]] = defaultdict(list)
    for (name, value), d in v.domain.items():
        per_gang[name].append((value, d))
    for name, doms in per_gang.items():
        if name in held:  # where its running members are is where the rest belong
            terms.extend(-w.gang_domains * d for value, d in doms if value != held[name])
        elif len(doms) > 1:
            terms.append(-w.gang_domains * (sum(d for _, d in doms) - v.gang[name]))
    return sum(terms)


def _held(inst: Instance) -> dict[str, str]:
    """The domain of each gang of the batch that prefers one and has members running there."""
    return {
        g.gang.name: g.gang.domain
        for g in inst.groups
        if g.gang is not None and g.gang.topology == "preferred" and g.gang.domain
    }


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
    held = _held(inst)
    spans = sum(n if name in held else n - 1 for name, n in members.items())
    return w.island_spill * spills + w.mig_partition * slices + w.gang_domains * spans
