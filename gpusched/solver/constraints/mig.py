"""MIG slices: pods of a profile take free instances, or instances of a layout the batch gives an
idle re-partitionable GPU.

Per node and profile: pods placed <= free instances + sum over layouts of (instances of the
profile in the layout) x (idle GPUs partitioned with it), where the batch places pods of the
profile (pods may hold more instances than the node advertises now: fewer than none free, which
only the pods placed there must make up for).  The GPUs partitioned are counted by
``whole_gpu`` with the GPUs whole-GPU pods take, so a GPU is never both; layouts come from the
GPU model's valid MIG placements (``gpusched.model.mig``), merged where they offer the same
counts of the profiles the batch asks for.
"""

from __future__ import annotations

from collections import defaultdict

from ortools.sat.python import cp_model

from gpusched.model.mig import MigLayout
from gpusched.solver.instance import Instance
from gpusched.solver.vars import Vars


def _layouts(inst: Instance, n: int, wanted: set[str]) -> list[MigLayout]:
    geom = inst.state.cluster.geometry[n]
    if geom is None:
        return []
    best: dict[tuple[int, ...], MigLayout] = {}
    order = sorted(wanted)
    for lay in geom.layouts():
        key = tuple(lay.counts.get(p, 0) for p in order)
        if not any(key):
            continue
        old = best.get(key)
        if old is None or sum(lay.counts.values()) > sum(old.counts.values()):
            best[key] = lay
    return list(best.values())


def build(inst: Instance, model: cp_model.CpModel, v: Vars) -> None:
    """Instance counts per node and profile, and a layout count per partitioned layout."""
    state = inst.state
    by_node: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for ci, c in enumerate(inst.candidates):
        profile = inst.groups[c.group].shape.mig_profile
        if profile:
            by_node[c.node][profile].append(ci)
    hinted: dict[tuple[int, str], int] = defaultdict(int)
    for a in inst.hint.assignments:
        if a.pod.mig_profile:
            hinted[a.node, a.pod.mig_profile] += 1
    for n, per_profile in by_node.items():
        idle = int(state.partitionable_gpus[n])
        layouts = _layouts(inst, n, set(per_profile)) if idle else []
        v.layouts[n] = layouts
        v.layout_profiles[n] = tuple(sorted(per_profile))
        for k in range(len(layouts)):
            v.layout[n, k] = model.new_int_var(0, idle, f"mig{n}_{k}")
        if layouts:
            model.add(sum(v.partitioned(n)) <= idle)
        for profile, cis in per_profile.items():
            col = state.cluster.mig_index[profile]
            offered = sum(lay.counts.get(profile, 0) * v.layout[n, k] for k, lay in enumerate(layouts))
            placed = sum(v.x[ci] for ci in cis)
            free = int(state.mig_free[n, col])
            bound = model.add(placed <= free + offered)
            if free < 0:  # with none placed here, nothing is short: no GPU is partitioned for it
                there = model.new_bool_var(f"migat{n}_{col}")
                model.add(placed <= sum(inst.candidates[ci].ub for ci in cis) * there)
                bound.only_enforce_if(there)
                model.add_hint(there, int(hinted[n, profile] > 0))  # the warm start's, as ``hint_from_plan``
