"""Required pod affinity within the batch.

Candidates lie in domains where pods all of a group's terms select already run
(``ClusterState.affinity_mask``), so for most groups nothing is left to decide.
Two exceptions:

* pods that may follow pods of the batch (``instance.followed``: groups without
  affinity of their own that all the terms select) may go to any node with the
  keys; in a domain where no pod they follow runs yet, one of those must be placed
  with them (it is bound first: ``validate.peer_order``);
* the first of a series: pods all of whose terms select themselves while no pod
  they all select runs (kube-scheduler lets the first such pod go to any node with
  every term's key).  Once one is placed the rest of the series must join it, so
  the groups of a series (those that select one another) share one such domain per
  key; a series that may also follow batch pods may use that domain without them.
  When the series' terms use several keys, those domains are the ones of one node
  where a pod of the series runs: that pod starts the series, and every later pod
  finds it in its domain of each of its own keys, whichever key that is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance, followed
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """One domain per key per first series; followers only with a pod they follow, or there."""
    state = inst.state
    nodes = state.cluster.nodes
    groups = inst.groups
    firsts = [gi for gi, g in enumerate(groups) if g.shape.affinity and state.affinity_first(g.pods[0])]
    series = _series(inst, firsts)
    by_series: dict[tuple[int, str], list[cp_model.IntVar]] = defaultdict(list)

    def first(root: int, key: str, value: str) -> cp_model.IntVar:
        if (root, key, value) not in v.first:
            chosen = model.new_bool_var(f"first{root}_{key}_{value}")
            v.first[root, key, value] = (chosen, ())
            by_series[root, key].append(chosen)
        return v.first[root, key, value][0]

    for gi, group in enumerate(groups):
        if not group.shape.affinity:
            continue
        leaders = followed(groups, inst.terms, gi)
        root = series.get(gi)
        if leaders:
            _follow(inst, model, v, gi, leaders, root, first)
            continue
        if root is None:
            continue
        for key in sorted({t.topology_key for t in group.shape.affinity}):
            here: dict[str, list[int]] = defaultdict(list)
            for ci in v.by_group[gi]:
                here[nodes[inst.candidates[ci].node].labels[key]].append(ci)
            for value, mine in sorted(here.items()):
                chosen = first(root, key, value)
                model.add(sum(v.x[ci] for ci in mine) <= sum(inst.candidates[ci].ub for ci in mine) * chosen)
                v.first[root, key, value] = (chosen, v.first[root, key, value][1] + tuple(mine))
    for chosen_ones in by_series.values():
        model.add(sum(chosen_ones) <= 1)
    for root in sorted(set(series.values())):
        _one_start(inst, model, v, [gi for gi, r in series.items() if r == root], root)


def _one_start(inst: Instance, model: cp_model.CpModel, v: Vars, members: list[int], root: int) -> None:
    """For a series whose terms use several keys: its domain of every key is the one of a single
    node where one of its pods is placed (that pod is bound first), not one chosen per key, which
    may pair domains that no one pod reaches."""
    keys = tuple(sorted({t.topology_key for gi in members for t in inst.groups[gi].shape.affinity}))
    if len(keys) < 2:
        return
    nodes = inst.state.cluster.nodes
    here: dict[tuple[str | None, ...], list[int]] = defaultdict(list)
    for gi in members:
        for ci in v.by_group[gi]:
            labels = nodes[inst.candidates[ci].node].labels
            here[tuple(labels.get(k) for k in keys)].append(ci)
    starts: dict[tuple[str | None, ...], cp_model.IntVar] = {}
    at: dict[tuple[str, str | None], list[cp_model.IntVar]] = defaultdict(list)
    for n, (where, mine) in enumerate(here.items()):
        start = starts[where] = model.new_bool_var(f"start{root}_{n}")
        model.add(sum(v.x[ci] for ci in mine) >= start)
        for key, value in zip(keys, where, strict=True):
            at[key, value].append(start)
    model.add(sum(starts.values()) <= 1)
    for (r, key, value), (chosen, _) in v.first.items():
        if r == root:
            model.add(chosen <= sum(at.get((key, value), ())))
    v.starts[root] = (keys, starts)
    v.series.update(dict.fromkeys(members, root))


def _series(inst: Instance, firsts: list[int]) -> dict[int, int]:
    """The first-of-series groups joined into series: groups one of which all the other's terms
    select, by the lowest group index of each series."""
    root = {gi: gi for gi in firsts}

    def find(gi: int) -> int:
        while root[gi] != gi:
            gi = root[gi]
        return gi

    for a in firsts:
        terms_a = {inst.terms.index(t) for t in inst.groups[a].shape.affinity}
        for b in firsts:
            if a != b and terms_a <= set(inst.groups[b].selected_by):
                ra, rb = find(a), find(b)
                root[max(ra, rb)] = min(ra, rb)
    return {gi: find(gi) for gi in firsts}


def _follow(
    inst: Instance,
    model: cp_model.CpModel,
    v: Vars,
    gi: int,
    leaders: list[int],
    root: int | None,
    first: Callable[[int, str, str], cp_model.IntVar],
) -> None:
    """In each domain where no pod group ``gi`` follows runs yet, it places pods only with one of
    ``leaders`` there, or, when it starts a series (``root``), in that series' own domain."""
    state, group = inst.state, inst.groups[gi]
    nodes = state.cluster.nodes
    pairs = state.affinity_pairs(group.shape.affinity)
    theirs_all = tuple(ci for hi in leaders for ci in v.by_group[hi])
    for key in sorted({t.topology_key for t in group.shape.affinity}):
        mine: dict[str, list[int]] = defaultdict(list)
        for ci in v.by_group[gi]:
            value = nodes[inst.candidates[ci].node].labels[key]
            if (key, value) not in pairs:
                mine[value].append(ci)
        theirs: dict[str, list[int]] = defaultdict(list)
        for ci in theirs_all:
            theirs[nodes[inst.candidates[ci].node].labels.get(key, "")].append(ci)
        for value, cands in mine.items():
            used = model.new_bool_var(f"fw{gi}_{key}_{value}")
            model.add(sum(v.x[ci] for ci in cands) <= sum(inst.candidates[ci].ub for ci in cands) * used)
            followers = sum(v.x[ci] for ci in theirs.get(value, ()))
            if root is None:
                model.add(followers >= used)
            else:
                alone = first(root, key, value)
                model.add(followers + alone >= used)
                v.first_escapes.setdefault((root, key, value), []).append((tuple(cands), tuple(theirs.get(value, ()))))
            v.follow[gi, key, value] = (used, tuple(cands))
