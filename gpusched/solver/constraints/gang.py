"""Gangs: every member of a pod group in the batch is placed, or none is.

One boolean per gang; each of its groups places exactly ``len(group) * gang``
pods.  A gang with fewer members in the batch than its ``min_members`` is not
placed at all (the rest has not arrived).  With a topology key, one boolean
per (gang, domain) gates the candidates on that domain's nodes; ``required``
allows one domain, ``preferred`` any number (the ``gang_domains`` objective
charges each beyond the first).  A gang whose members disagree on its rules
(minimum, topology) is not placed either: which of them holds is not the
model's to pick, and the validator refuses such a gang whole.  Solving all gangs of a batch in one model is
what keeps interleaved gangs from holding each other's capacity half-placed.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model.pod import Gang
from gpusched.solver.instance import Instance, domain_of
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """sum of x over a gang group == its size * gang[name]; x <= ub * domain[name, value]."""
    gangs: dict[str, Gang] = {}
    members: dict[str, int] = defaultdict(int)
    for g in inst.groups:
        if g.gang is not None:
            gangs[g.gang.name] = g.gang
            members[g.gang.name] += len(g.pods)
    for name, gang in gangs.items():
        z = model.new_bool_var(f"gang_{name}")
        v.gang[name] = z
        if members[name] < gang.min_members:  # (a gang whose members disagree has no candidates: off too)
            model.add(z == 0)
    for gi, g in enumerate(inst.groups):
        if g.gang is None:
            continue
        z = v.gang[g.gang.name]
        model.add(sum(v.x[ci] for ci in v.by_group.get(gi, [])) == len(g.pods) * z)
        if not g.gang.topology_key:
            continue
        for ci in v.by_group.get(gi, []):
            c = inst.candidates[ci]
            dom = domain_of(inst.state, c.node, g.gang)
            d = v.domain.get((g.gang.name, dom))
            if d is None:
                d = v.domain[g.gang.name, dom] = model.new_bool_var(f"dom_{g.gang.name}_{dom}")
                model.add_implication(d, z)
            model.add(v.x[ci] <= c.ub * d)
    for name, gang in gangs.items():
        doms = [d for (n, _), d in v.domain.items() if n == name]
        if gang.topology == "required" and doms:
            model.add(sum(doms) <= 1)
