"""Gangs: at least a gang's minimum of its members in the batch is placed, or none is.

One boolean per gang; its groups together place between ``min_members * gang`` and
``size * gang`` pods, ``size`` being its members in the batch: once the minimum fits,
the members beyond it are placed as they fit (the placed-demand terms reward each), as
Coscheduling's Permit at ``minMember`` and Volcano's ``minAvailable`` start a gang.
``min_members`` is what is left of the minimum beside members already running
(``Gang.beside``).  A gang with fewer members in the batch than that is not placed at
all (the rest has not arrived).  With a topology key, one boolean
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
    """minimum * gang[name] <= sum of x over a gang's groups <= its size * gang[name];
    x <= ub * domain[name, value]."""
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
    placed: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    for gi, g in enumerate(inst.groups):
        if g.gang is not None:
            placed[g.gang.name].extend(v.x[ci] for ci in v.by_group.get(gi, []))
    for name, gang in gangs.items():
        z, xs = v.gang[name], placed[name]
        model.add(sum(xs) >= gang.min_members * z)
        model.add(sum(xs) <= members[name] * z)
    for gi, g in enumerate(inst.groups):
        if g.gang is None or not g.gang.topology_key:
            continue
        z = v.gang[g.gang.name]
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
