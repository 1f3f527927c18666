"""The published replay protocol of the FGD paper, reproduced step by step.

1. Pods are sorted by name, then shuffled with the run's seed.
2. The workload is tuned to ``tune`` x cluster GPU capacity: if total GPU
   demand is above the target, random pods are removed; if below, pods drawn
   with replacement from the trace are appended after the shuffled originals
   until one more would pass the target.  (Typical pods for fragmentation come
   from the original trace, before tuning.)
3. Pods arrive one at a time (or ``batch`` at a time, the extension gpusched
   adds) and are never removed; a pod that does not fit fails and the run goes on.
4. After every arriving pod the arrived GPU demand and the GPU allocation are
   recorded; ``gpusched.sim.engine`` reduces the records to the allocation at
   each whole percent of capacity arrived.

Gangs (an extension, absent from the Alibaba trace) are tuned as units: a
removal draw that hits a gang member removes the whole gang, and a resampling
draw that hits one appends a copy of the whole gang under a new gang name.  A
MIG pod's share for the stop test is its compute share.  A trace without gangs
and MIG pods draws exactly as before.

Everything is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from gpusched.model import GPU_MILLI, Pod

__all__ = ["prepare_workload"]


def prepare_workload(pods: Sequence[Pod], total_gpus: int, *, seed: int, tune: float) -> list[Pod]:
    """The arrival order of one run: sorted, shuffled with ``seed``, tuned to ``tune``."""
    if tune <= 0:
        raise ValueError(f"tune must be positive, got {tune}")
    if not pods:
        raise ValueError("the pod list is empty")
    rng = random.Random(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    rng.shuffle(ordered)
    target = tune * total_gpus * GPU_MILLI
    demand = sum(p.gpu_demand_milli for p in ordered)
    if demand > target:
        # Remove random pods until the remaining demand is within the target (a gang whole).
        keep = list(ordered)
        while demand > target:
            i = rng.randrange(len(keep))
            gang = keep[i].gang
            if gang is None:
                demand -= keep[i].gpu_demand_milli
                del keep[i]
                continue
            demand -= sum(q.gpu_demand_milli for q in keep if q.gang is not None and q.gang.name == gang.name)
            keep = [q for q in keep if q.gang is None or q.gang.name != gang.name]
        return keep
    if demand == target:  # as the reference: tuned already, nothing appended
        return ordered
    if demand == 0:
        raise ValueError("no pod requests a GPU, so the workload cannot be tuned to GPU capacity")
    # Resample with replacement from the name-sorted trace and append, unshuffled.
    # As in the reference simulator, the stop test looks at the sampled pod's
    # per-GPU share, so a multi-GPU pod can overshoot the target slightly.
    by_name = sorted(pods, key=lambda p: p.name)
    members: dict[str, list[Pod]] = {}
    for p in by_name:
        if p.gang is not None:
            members.setdefault(p.gang.name, []).append(p)
    out = list(ordered)
    taken = {p.name for p in pods} | set(members)  # pods' and gangs' names: a copy takes neither
    copy = 0
    while True:
        pick = by_name[rng.randrange(len(by_name))]
        if pick.gang is not None:
            group = members[pick.gang.name]
            added = sum(q.gpu_demand_milli for q in group)
            if demand + added > target:
                break
            suffix = _free_suffix(copy, [pick.gang.name, *(q.name for q in group)], taken)
            gang = replace(pick.gang, name=f"{pick.gang.name}{suffix}")
            out.extend(replace(q, name=f"{q.name}{suffix}", gang=gang) for q in group)
        else:
            share = pick.gpu_demand_milli if pick.mig_profile else pick.gpu_milli
            if demand + share > target:
                break
            added = pick.gpu_demand_milli
            out.append(replace(pick, name=f"{pick.name}{_free_suffix(copy, [pick.name], taken)}"))
        demand += added
        copy += 1
    return out


def _free_suffix(copy: int, names: Sequence[str], taken: set[str]) -> str:
    """``-tuned-<copy>``, or ``-tuned-<copy>.<k>`` should a name it makes be taken already (a
    trace saved after tuning holds such names): each copy's names are new; they are taken now."""
    suffix, k = f"-tuned-{copy}", 0
    while any(f"{name}{suffix}" in taken for name in names):
        k += 1
        suffix = f"-tuned-{copy}.{k}"
    taken.update(f"{name}{suffix}" for name in names)
    return suffix
