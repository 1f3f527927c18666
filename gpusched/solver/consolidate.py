"""Consolidation: which GPU nodes to empty by moving their batch pods onto other nodes in use.

Pods finish one by one, and what stays is spread over more nodes than it needs.  A node whose
pods could all run on the free GPUs of other nodes in use can be emptied: its pods are evicted,
their controllers create them again, and the scheduler places the new pods where the plan found
room.  The node is then idle (an autoscaler may remove it, or a pod of eight GPUs may take it).

A node is a candidate when all of the following hold:

* it is not cordoned and has a GPU (or MIG slice) in use;
* every pod on it is movable (``Pod.movable``: it asks to be, and a controller owns it), not a
  member of a gang, not a MIG pod, and not being deleted;
* evicting its pods breaks no disruption budget (budgets are hard here: nothing forces this).

Candidates are tried emptiest first (least GPU in use, then by name).  For each, its pods are
placed largest first, best fit, only on other nodes that stay in use: not idle nodes (that
would wake one to empty another), not nodes emptied before it in the plan, not nodes where a pod
is being deleted.  A candidate whose pods do not all fit is left as it is.  At most
``max_nodes`` nodes are emptied per plan, and no node that takes pods in the plan is emptied
later in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.model import Assignment, ClusterState
from gpusched.solver.baselines.base import GreedyPolicy
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.preempt import Budget

__all__ = ["Move", "plan_consolidation"]

_GPUS = GreedyPolicy()  # only its GPU choice on one node is used: stateless


@dataclass(frozen=True)
class Move:
    """Empty ``node``: evict ``pods``; ``targets`` are where the plan found room for each."""

    node: int
    pods: tuple[Assignment, ...]
    targets: tuple[Assignment, ...]


def plan_consolidation(
    state: ClusterState, placed: Sequence[Assignment], max_nodes: int = 1, budgets: Sequence[Budget] = ()
) -> list[Move]:
    """The nodes to empty (at most ``max_nodes``), with where their pods would go.  ``placed``:
    every pod on the books (bound or being bound, of any scheduler), as counted in ``state``."""
    cl = state.cluster
    by_node: dict[int, list[Assignment]] = defaultdict(list)
    for a in placed:
        by_node[a.node].append(a)
    in_use = (state.gpu_used.sum(axis=1) > 0) | (state.mig.sum(axis=1) > 0)
    leaving = np.zeros(len(cl), dtype=np.bool_)
    for a in placed:
        if a.pod.terminating:
            leaving[a.node] = True
    targets = in_use & ~cl.cordoned & ~leaving
    allowed_left = [b.allowed for b in budgets]

    def movable(pods: list[Assignment]) -> bool:
        return bool(pods) and all(
            a.pod.movable and a.pod.gang is None and not a.pod.mig_profile and not a.pod.terminating for a in pods
        )

    candidates = [n for n in np.flatnonzero(in_use & ~cl.cordoned & ~leaving) if movable(by_node[int(n)])]
    candidates.sort(key=lambda n: (int(state.gpu_used[n].sum()), cl.nodes[n].name))
    fit = BestFitPolicy()
    moves: list[Move] = []
    receivers: set[int] = set()  # nodes that take pods in the plan: not emptied later in it
    for n in (int(c) for c in candidates):
        if len(moves) >= max_nodes:
            break
        if n in receivers:
            continue
        pods = by_node[n]
        spend = [sum(1 for a in pods if b.covers(a.pod)) for b in budgets]
        if any(s > left for s, left in zip(spend, allowed_left, strict=True)):
            continue
        work = state.release(pods)
        where = targets.copy()
        where[n] = False
        found: list[Assignment] = []
        for a in sorted(pods, key=lambda a: (-a.pod.num_gpu, -a.pod.gpu_milli, -a.pod.cpu_milli, a.pod.key)):
            nodes = np.flatnonzero(work.pod_mask(a.pod) & where)
            if not nodes.size:
                break
            to = fit.choose(a.pod, work, nodes)
            found.append(Assignment(a.pod, to, _GPUS.gpus(a.pod, work, to)))
            work = work.apply(found[-1:])
        else:
            moves.append(Move(n, tuple(pods), tuple(found)))
            state = work
            targets[n] = False  # idle now: no target for the next
            allowed_left = [left - s for left, s in zip(allowed_left, spend, strict=True)]
            receivers.update(m.node for m in found)
    return moves
