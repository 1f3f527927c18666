"""Consolidation: which GPU nodes to empty by moving their batch pods onto other nodes in use.

Pods finish one by one, and what stays is spread over more nodes than it needs.  A node whose
pods could all run on the free GPUs of other nodes in use can be emptied: its pods are evicted,
their controllers create them again, and the scheduler places the new pods (kept off the node
while the evicted pods terminate; the plan only shows there is room for them elsewhere).  The
node is then idle (an autoscaler may remove it, or a pod of eight GPUs may take it).

A node is a candidate when all of the following hold:

* it is not cordoned, not unreachable nor not ready, and a pod on it holds a GPU (or MIG slice);
* no pod on it is being deleted;
* every pod on it is movable (``Pod.movable``), not a gang member and not asked to stay
  (``stay``: the caller's word, e.g. a job moved lately), or else a pod that runs on every node
  (``Pod.daemon``: a DaemonSet's, or a static pod), which stays even when marked movable;
* evicting its pods breaks no disruption budget, read as the Eviction API reads it
  (``Budget.evicts``; budgets are hard here: nothing forces this);
* no pod to evict is selected by two budgets or more: the Eviction API refuses such a pod
  whatever the budgets allow, and the node's other pods, evicted beside it, would be evicted
  for nothing.

Candidates are tried emptiest first (least GPU in use, then by name).  For each, its pods are
placed largest first, best fit, on nodes that are no candidate themselves where one has room (a
pod sent to a node a later round empties would be evicted twice), and only on other nodes that
stay in use (a pod holds a GPU there):
not idle nodes (that would wake one to empty another), not nodes emptied before it in the
plan, not nodes where a pod is being deleted, and not nodes with more PreferNoSchedule taints
the pod does not tolerate than its own node has (its replacement would be steered back).  A MIG
pod goes only to a free instance of its profile that a node advertises: the plan partitions no
GPU.  A candidate whose pods do not all fit is left as it is.  At most ``max_nodes`` nodes are emptied
per plan, and no node that takes pods in the plan is emptied later in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpusched.model import Assignment, ClusterState, Node, Pod
from gpusched.solver.baselines.base import GPU_CHOICE
from gpusched.solver.baselines.best_fit import BestFitPolicy
from gpusched.solver.preempt import Budget

__all__ = ["Move", "node_down", "plan_consolidation"]


NODE_DOWN_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
"""Taints of a node that is not ready: its pods would not leave, nor new ones start."""


def node_down(node: Node) -> bool:
    """Whether ``node`` is not ready or unreachable (by its taints)."""
    return any(t.key in NODE_DOWN_TAINTS for t in node.taints)


@dataclass(frozen=True)
class Move:
    """Empty ``node``: evict ``pods``; ``targets`` are where the plan found room for each."""

    node: int
    pods: tuple[Assignment, ...]
    targets: tuple[Assignment, ...]


def plan_consolidation(
    state: ClusterState,
    placed: Sequence[Assignment],
    max_nodes: int = 1,
    budgets: Sequence[Budget] = (),
    skip: Collection[int] = (),
    stay: Collection[str] = (),
) -> list[Move]:
    """The nodes to empty (at most ``max_nodes``), with where their pods would go.  ``placed``:
    every pod on the books (bound or being bound, of any scheduler), as counted in ``state``.
    ``skip``: nodes not to be emptied now (they may still take pods); ``stay``: keys of pods
    not to be moved now (their nodes are no candidates)."""
    cl = state.cluster
    by_node: dict[int, list[Assignment]] = defaultdict(list)
    in_use = np.zeros(len(cl), dtype=np.bool_)  # by the pods on it: a GPU blocked in ``state`` is not use
    leaving = np.zeros(len(cl), dtype=np.bool_)
    for a in placed:
        by_node[a.node].append(a)
        if a.pod.gpu_demand_milli:
            in_use[a.node] = True
        if a.pod.terminating:
            leaving[a.node] = True
    down = np.array([node_down(node) for node in cl.nodes], dtype=np.bool_)
    targets = in_use & ~cl.cordoned & ~leaving & ~down
    allowed_left = [b.allowed for b in budgets]

    def evictable(pod: Pod) -> bool:  # the Eviction API evicts no pod that two budgets select
        return pod.movable and pod.gang is None and pod.key not in stay and sum(b.evicts(pod) for b in budgets) < 2

    def movable(pods: list[Assignment]) -> bool:
        ok = all(a.pod.daemon or evictable(a.pod) for a in pods)
        return ok and any(a.pod.movable and not a.pod.daemon for a in pods)

    candidates = [int(n) for n in np.flatnonzero(targets) if int(n) not in skip and movable(by_node[int(n)])]
    candidates.sort(key=lambda n: (sum(a.pod.gpu_demand_milli for a in by_node[n]), cl.nodes[n].name))
    settled = targets.copy()  # nodes in use that no round empties as they are: the first choice
    settled[candidates] = False
    fit = BestFitPolicy()
    moves: list[Move] = []
    receivers: set[int] = set()  # nodes that take pods in the plan: not emptied later in it
    for n in candidates:
        if len(moves) >= max_nodes:
            break
        if n in receivers:
            continue
        pods = [a for a in by_node[n] if a.pod.movable and not a.pod.daemon]  # a DaemonSet's or static pod stays
        spend = [sum(1 for a in pods if b.evicts(a.pod)) for b in budgets]
        if any(s > left for s, left in zip(spend, allowed_left, strict=True)):
            continue
        work = state.release(pods)
        where = targets.copy()
        where[n] = False
        found: list[Assignment] = []
        for a in sorted(pods, key=lambda a: (-a.pod.num_gpu, -a.pod.gpu_milli, -a.pod.cpu_milli, a.pod.key)):
            # A pod that prefers one island goes only where it gets one: split across islands,
            # its replacement would go back to an island on the node emptied.
            p = replace(a.pod, island="required") if a.pod.island == "preferred" and a.pod.num_gpu > 1 else a.pod
            ok = work.pod_mask(p) & where
            if p.mig_profile:  # to an instance there is: no GPU is partitioned for it
                ok &= work.mig_free[:, cl.mig_index[p.mig_profile]] > 0
            avoided = cl.avoided(p.tolerations)  # a PreferNoSchedule taint would send it back
            if avoided is not None:
                ok &= avoided <= avoided[n]
            nodes = np.flatnonzero(ok & settled)
            if not nodes.size:
                nodes = np.flatnonzero(ok)
            if not nodes.size:
                break
            to = fit.choose(p, work, nodes)
            found.append(Assignment(a.pod, to, GPU_CHOICE.gpus(p, work, to)))
            work = work.apply(found[-1:])
        else:
            moves.append(Move(n, tuple(pods), tuple(found)))
            state = work
            targets[n] = False  # idle now: no target for the next
            allowed_left = [left - s for left, s in zip(allowed_left, spend, strict=True)]
            receivers.update(m.node for m in found)
    return moves
