"""CP-SAT variables of a batch model, with the queries constraints and objectives need."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from gpusched.model.mig import MigLayout
from gpusched.solver.instance import Instance

__all__ = ["Vars"]


@dataclass
class Vars:
    """``x[c]``: pods placed by candidate ``c``; ``y[c, g]``: of those, on GPU ``g`` (shares);
    ``whole[n, g]``: idle GPU ``g`` of node ``n`` taken by a whole-GPU pod (or a MIG layout);
    ``active[n]``: an idle node is woken; ``layout[n, k]``: idle GPUs of ``n`` partitioned with
    the ``k``-th layout of ``layouts[n]``; ``island[c, i]``: of ``x[c]``, pods inside island ``i``;
    ``spill[c]``: pods preferring one island placed across islands; ``gang[name]``: the gang is
    placed; ``domain[name, value]``: it uses that topology domain; ``apart[g, key, value]``: group
    ``g`` uses that domain, where pod anti-affinity keeps another group out of it."""

    x: dict[int, cp_model.IntVar] = field(default_factory=dict)
    y: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    whole: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    active: dict[int, cp_model.IntVar] = field(default_factory=dict)
    kept: dict[int, cp_model.IntVar] = field(default_factory=dict)
    by_node: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    by_group: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    layout: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    layouts: dict[int, list[MigLayout]] = field(default_factory=dict)
    layout_profiles: dict[int, tuple[str, ...]] = field(default_factory=dict)
    island: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    island_taken: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    spill: dict[int, cp_model.IntVar] = field(default_factory=dict)
    gang: dict[str, cp_model.IntVar] = field(default_factory=dict)
    domain: dict[tuple[str, str], cp_model.IntVar] = field(default_factory=dict)
    apart: dict[tuple[int, str, str], cp_model.IntVar] = field(default_factory=dict)
    first: dict[tuple[int, str, str], tuple[cp_model.IntVar, tuple[int, ...]]] = field(default_factory=dict)
    """(series, key, value) -> (the first-of-series pods of that series go to that domain, the
    candidates there of its groups that follow no batch pod)."""
    first_escapes: dict[tuple[int, str, str], list[tuple[tuple[int, ...], tuple[int, ...]]]] = field(
        default_factory=dict
    )
    """(series, key, value) -> per group of the series that may also follow batch pods: its
    candidates there, and the candidates there of the pods it would follow."""
    starts: dict[int, tuple[tuple[str, ...], dict[tuple[str | None, ...], cp_model.IntVar]]] = field(
        default_factory=dict
    )
    """series whose terms use several keys -> (those keys, per the nodes' values of them where pods
    of the series may go: the series starts on such a node, and its domains are that node's)."""
    series: dict[int, int] = field(default_factory=dict)
    """group -> its series, for the groups of the series in ``starts``."""
    follow: dict[tuple[int, str, str], tuple[cp_model.IntVar, tuple[int, ...]]] = field(default_factory=dict)
    """(group, key, value) -> (the group places pods in that domain, where no pod it follows runs
    yet, its candidates there)."""
    apart_pairs: dict[tuple[int, int, str], tuple[cp_model.IntVar, tuple[int, ...]]] = field(default_factory=dict)
    """(group, preferred anti-affinity term, value) -> (pairs of the group's pods in that domain,
    where the term selects the group's own pods; its candidates there)."""
    cross_pairs: dict[
        tuple[int, int, str, str],
        tuple[cp_model.IntVar, cp_model.IntVar, cp_model.IntVar, tuple[int, ...], tuple[int, ...]],
    ] = field(default_factory=dict)
    """(group a, group b, key, value) -> (pairs of a's and b's pods in that domain, where a
    preferred term of one selects the other's pods; a's and b's pods there; their candidates there).
    With b == a (a group drawn to its own pods), the pairs are the square of its pods there."""
    spread_in: dict[tuple[int, int, int], tuple[cp_model.IntVar, tuple[int, ...]]] = field(default_factory=dict)
    """(group, spread constraint, domain id) -> (the group places pods there, its candidates there)."""
    spread_low: dict[tuple[int, int], tuple[cp_model.IntVar, tuple[tuple[int, tuple[int, ...]], ...]]] = field(
        default_factory=dict
    )
    """(group, spread constraint) -> (at most the emptiest eligible domain's count, and the counts it
    is bounded by: pods counted already and candidates that count, per eligible domain with such
    candidates, plus the emptiest of the others)."""

    def partitioned(self, n: int) -> list[cp_model.IntVar]:
        """Per layout, the idle GPUs of node ``n`` that the batch partitions with it."""
        return [self.layout[n, k] for k in range(len(self.layouts.get(n, ())))]

    @classmethod
    def create(cls, inst: Instance, model: cp_model.CpModel) -> Vars:
        """One count variable per candidate and one per (fractional candidate, GPU)."""
        v = cls()
        for ci, c in enumerate(inst.candidates):
            v.x[ci] = model.new_int_var(0, c.ub, f"x{ci}")
            v.by_node[c.node].append(ci)
            v.by_group[c.group].append(ci)
            for g, fit, _ in c.gpus:
                v.y[ci, g] = model.new_int_var(0, min(fit, c.ub), f"y{ci}_{g}")
        return v
