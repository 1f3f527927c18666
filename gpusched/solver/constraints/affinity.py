"""Required pod affinity within the batch.

Candidates lie in domains where a pod each term selects already runs
(``ClusterState.affinity_mask``), so for most groups nothing is left to decide.
Two exceptions:

* pods that may follow pods of the batch (``instance.followed``) may go to any
  node with the keys; in a domain where no pod they follow runs yet, one of the
  batch's must be placed with them (and is bound first: ``validate.peer_order``);
* the first of a series: pods whose terms select themselves, no pod running
  anywhere and none of the batch's other pods (kube-scheduler lets the first such
  pod go to any node with every term's key).  Once one is placed, the rest must join it, so all pods that are
  first of a series in a batch share one domain per key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance, followed
from gpusched.solver.vars import Vars


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Per key of the first-of-series groups' terms: one domain, and their pods only there; and
    followers only with a pod they follow."""
    state = inst.state
    nodes = state.cluster.nodes
    by_key: dict[str, list[cp_model.IntVar]] = defaultdict(list)

    def first(key: str, value: str) -> cp_model.IntVar:
        if (key, value) not in v.first:
            chosen = model.new_bool_var(f"first_{key}_{value}")
            v.first[key, value] = (chosen, ())
            by_key[key].append(chosen)
        return v.first[key, value][0]

    for gi, group in enumerate(inst.groups):
        if not group.shape.affinity:
            continue
        leaders = followed(inst.groups, inst.terms, gi)
        if leaders:
            _follow(inst, model, v, gi, leaders, first)
        elif state.affinity_first(group.pods[0]):
            for key in sorted({t.topology_key for t in group.shape.affinity}):
                here: dict[str, list[int]] = defaultdict(list)
                for ci in v.by_group[gi]:
                    here[nodes[inst.candidates[ci].node].labels[key]].append(ci)
                for value, mine in sorted(here.items()):
                    chosen = first(key, value)
                    model.add(sum(v.x[ci] for ci in mine) <= sum(inst.candidates[ci].ub for ci in mine) * chosen)
                    v.first[key, value] = (chosen, v.first[key, value][1] + tuple(mine))
    for chosen_ones in by_key.values():
        model.add(sum(chosen_ones) <= 1)


def _follow(
    inst: Instance,
    model: cp_model.CpModel,
    v: Vars,
    gi: int,
    leaders: list[int],
    first: Callable[[str, str], cp_model.IntVar],
) -> None:
    """In each domain of each key where none of the pods it follows runs yet, group ``gi`` places
    pods only with one of the batch's pods its terms (on that key) select.  Were it the first of
    its series, it may also go its own way, as long as none of those is placed at all."""
    state, group = inst.state, inst.groups[gi]
    nodes = state.cluster.nodes
    lead_any: cp_model.IntVar | None = None
    if state.affinity_first(group.pods[0]):
        theirs_all = tuple(ci for hi in leaders for ci in v.by_group[hi])
        lead_any = model.new_bool_var(f"lead{gi}")
        for ci in theirs_all:
            model.add(v.x[ci] <= inst.candidates[ci].ub * lead_any)
        v.leads[gi] = (lead_any, theirs_all)
    for key in sorted({t.topology_key for t in group.shape.affinity}):
        on_key = {inst.terms.index(t) for t in group.shape.affinity if t.topology_key == key}
        running = set().union(*(state.selected_domains(t) for t in group.shape.affinity if t.topology_key == key))
        led = [hi for hi in leaders if on_key & set(inst.groups[hi].selected_by)]
        mine: dict[str, list[int]] = defaultdict(list)
        for ci in v.by_group[gi]:
            value = nodes[inst.candidates[ci].node].labels[key]
            if value not in running:
                mine[value].append(ci)
        theirs: dict[str, list[int]] = defaultdict(list)
        for hi in led:
            for ci in v.by_group[hi]:
                theirs[nodes[inst.candidates[ci].node].labels.get(key, "")].append(ci)
        for value, cands in mine.items():
            used = model.new_bool_var(f"fw{gi}_{key}_{value}")
            model.add(sum(v.x[ci] for ci in cands) <= sum(inst.candidates[ci].ub for ci in cands) * used)
            followers = sum(v.x[ci] for ci in theirs.get(value, ()))
            if lead_any is None:
                model.add(followers >= used)
            else:
                alone = first(key, value)
                model.add(followers + alone >= used)
                model.add(alone + lead_any <= 1)
                v.first_escapes.setdefault((key, value), []).append((tuple(cands), v.leads[gi][1]))
            v.follow[gi, key, value] = (used, tuple(cands))
