"""One-pod-at-a-time greedy placement, the frame every baseline shares.

Each pod in turn: filter the nodes it fits on, score them, take the highest
score, pick GPU indices on that node, and place it before looking at the
next pod.

Ties go to the first node in a fixed node order that is a random permutation
drawn from the policy's seed.  The reference simulator renames its nodes with
a random-permutation prefix per seed and its scheduler takes the first of the
equal best scores; breaking ties uniformly at random instead spreads tied pods
(CPU-only pods above all) over many nodes and costs the packing policies 1-5
points of allocation, which the published numbers do not show.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpusched.model import GPU_MILLI, Assignment, ClusterState, Plan, Pod, SolveStats
from gpusched.model.cluster import BoolArray, IntArray
from gpusched.model.mig import MigLayout
from gpusched.model.placement import MigPartition
from gpusched.model.pod import gang_conflicts

__all__ = [
    "GPU_CHOICE",
    "GreedyPolicy",
    "domains_of",
    "island_gpus",
    "lowest_idle_gpus",
    "mig_layout_for",
    "tightest_gpu",
]

Nodes = npt.NDArray[np.intp]


def lowest_idle_gpus(state: ClusterState, node: int, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-indexed completely idle GPUs of ``node``."""
    idle = np.flatnonzero(state.gpu_free[node] >= GPU_MILLI)
    return tuple(int(g) for g in idle[:count])


def island_gpus(state: ClusterState, node: int, count: int) -> tuple[int, ...] | None:
    """``count`` idle GPUs of ``node`` within one island, from the island with the fewest idle GPUs
    that still has enough (lowest indices there); None when no island has ``count`` idle GPUs."""
    idle = state.gpu_free[node] >= GPU_MILLI
    islands = state.cluster.islands[node]
    best: tuple[int, ...] | None = None
    for i in range(int(islands.max(initial=-1)) + 1):
        gpus = np.flatnonzero(idle & (islands == i))
        if gpus.size >= count and (best is None or gpus.size < len(best)):
            best = tuple(int(g) for g in gpus)
    return best[:count] if best is not None else None


def mig_layout_for(state: ClusterState, node: int, profile: str) -> MigLayout:
    """The layout a greedy policy gives a freshly partitioned GPU for ``profile``: the most
    instances of that profile, then the most instances in all (as MIG manager's all-<profile>)."""
    geom = state.cluster.geometry[node]
    assert geom is not None
    return max(geom.layouts(), key=lambda lay: (lay.counts.get(profile, 0), sum(lay.counts.values())))


def domains_of(state: ClusterState, key: str) -> dict[str, BoolArray]:
    """Nodes per value of label ``key``; nodes without the label are in no domain."""
    values = np.array([n.labels.get(key, "") for n in state.cluster.nodes], dtype=object)
    return {str(v): values == v for v in sorted(set(values.tolist()) - {""})}


def tightest_gpu(state: ClusterState, node: int, milli: int) -> int:
    """The GPU with the least free share that still fits ``milli`` (lowest index on ties)."""
    free = state.gpu_free[node]
    fits = np.where(free >= milli, free, GPU_MILLI + 1)
    return int(np.argmin(fits))


class GreedyPolicy:
    """Base class: subclasses implement ``score`` and may override ``gpus``."""

    name = "greedy"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self._rank: IntArray | None = None
        self.preferences = True
        """Honour preferred node affinity and pod anti-affinity (off: the policy's score alone)."""

    def rank(self, state: ClusterState) -> IntArray:
        """Tie-break rank of every node (lower wins): a permutation fixed by the seed."""
        if self._rank is None or self._rank.size != len(state.cluster):
            order = list(range(len(state.cluster)))
            random.Random(self.rng.random()).shuffle(order)
            self._rank = np.array(order, dtype=np.int64)
        return self._rank

    def score(self, pod: Pod, state: ClusterState, nodes: Nodes) -> IntArray:
        """Integer score per candidate node; the highest wins."""
        raise NotImplementedError

    def gpus(self, pod: Pod, state: ClusterState, node: int) -> tuple[int, ...]:
        """GPU indices for ``pod`` on ``node``: tightest GPU for a share, lowest idle ones otherwise."""
        if pod.num_gpu == 0:
            return ()
        if pod.is_fractional:
            return (tightest_gpu(state, node, pod.gpu_milli),)
        if pod.island and pod.num_gpu > 1:
            inside = island_gpus(state, node, pod.num_gpu)
            if inside is not None:
                return inside
        return lowest_idle_gpus(state, node, pod.num_gpu)

    def choose(self, pod: Pod, state: ClusterState, nodes: Nodes) -> int:
        """The node to use among ``nodes`` (all feasible): of those its preferred node affinity
        and pod anti-affinity score highest, the one the policy scores highest."""
        avoided = state.cluster.avoided(pod.tolerations) if self.preferences else None
        if avoided is not None and nodes.size > 1:  # PreferNoSchedule taints weigh most (as in kube-scheduler)
            nodes = nodes[avoided[nodes] == avoided[nodes].min()]
        theirs = state.wished(pod) if self.preferences and nodes.size > 1 else None
        if self.preferences and (pod.has_preferences or theirs is not None) and nodes.size > 1:
            prefer = state.cluster.preference_scores(pod.preferred_nodes)[nodes]
            apart = state.wish_penalty(pod)
            if apart is not None:
                prefer = prefer - apart[nodes]
            nodes = nodes[prefer == prefer.max()]
        if nodes.size == 1:
            return int(nodes[0])
        scores = self.score(pod, state, nodes)
        ties = nodes[scores == scores.max()]
        return int(ties[np.argmin(self.tie_rank(state, ties))]) if ties.size > 1 else int(ties[0])

    def tie_rank(self, state: ClusterState, ties: Nodes) -> IntArray:
        """Rank of each of ``ties`` (nodes the policy scores alike; lower wins): ``rank``."""
        out: IntArray = self.rank(state)[ties]
        return out

    def place(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        """Place ``pods`` one after another in the given order; a gang's members all at once, where
        its first member comes: at least its minimum, and then those beyond it that fit, or none.
        A gang whose members disagree on its rules (minimum, topology) is not placed: which of
        them holds is not this policy's to pick."""
        start = time.perf_counter()
        placed: list[Assignment] = []
        partitions: list[MigPartition] = []
        failed: list[Pod] = []
        gangs: dict[str, list[Pod]] = {}
        for pod in pods:
            if pod.gang is not None:
                gangs.setdefault(pod.gang.name, []).append(pod)
        disagree = gang_conflicts(pods) if gangs else {}
        done: set[str] = set()
        given = state  # the caller's: copied once, then the states made here are updated in place
        for pod in pods:
            if pod.gang is None:
                step = self._step(pod, state, None)
                if step is None:
                    failed.append(pod)
                    continue
                state = self._commit(step, state, placed, partitions, consume=state is not given)
                continue
            if pod.gang.name in done:
                continue
            done.add(pod.gang.name)
            members = gangs[pod.gang.name]
            if pod.gang.name in disagree:
                failed.extend(members)
                continue
            steps, new_state = self._place_gang(members, state)
            if steps is None:
                failed.extend(members)
                continue
            for st in steps:
                placed.append(st[0])
                partitions.extend(st[1])
            taken = {st[0].pod.key for st in steps}
            failed.extend(p for p in members if p.key not in taken)
            state = new_state
        # A pod whose affinity follows, or whose spread counts, pods that came after it may fit now.
        progress = True
        while progress:
            progress = False
            for pod in [p for p in failed if p.gang is None and (p.affinity or p.spread)]:
                step = self._step(pod, state, None)
                if step is not None:
                    failed.remove(pod)
                    state = self._commit(step, state, placed, partitions, consume=state is not given)
                    progress = True
        ms = (time.perf_counter() - start) * 1000
        gpu = float(sum(a.pod.gpu_demand_milli for a in placed))
        return Plan(tuple(placed), tuple(failed), SolveStats(self.name, "HEURISTIC", gpu, gpu, ms), tuple(partitions))

    def _commit(
        self,
        step: tuple[Assignment, tuple[MigPartition, ...]],
        state: ClusterState,
        placed: list[Assignment],
        partitions: list[MigPartition],
        consume: bool,
    ) -> ClusterState:
        """``state`` with the step applied; ``consume``: ``state`` was made by this pass alone."""
        a, parts = step
        if parts:
            partitions.extend(parts)
            state, consume = state.partition(parts), True
        placed.append(a)
        return state.apply((a,), consume=consume)

    def _step(
        self, pod: Pod, state: ClusterState, allowed: BoolArray | None
    ) -> tuple[Assignment, tuple[MigPartition, ...]] | None:
        mask = state.pod_mask(pod)
        if allowed is not None:
            mask = mask & allowed
        nodes = np.flatnonzero(mask)
        if nodes.size == 0:
            return None
        if pod.mig_profile:
            # Use an existing free instance before partitioning another GPU.
            col = state.cluster.mig_index[pod.mig_profile]
            free = nodes[state.mig_free[nodes, col] > 0]
            node = self.choose(pod, state, free if free.size else nodes)
            parts: tuple[MigPartition, ...] = ()
            if state.mig_free[node, col] <= 0:
                gpu = lowest_idle_gpus(state, node, 1)[0]
                parts = ((node, gpu, mig_layout_for(state, node, pod.mig_profile)),)
            return Assignment(pod, node), parts
        node = self.choose(pod, state, nodes)
        return Assignment(pod, node, self.gpus(pod, state, node)), ()

    def _place_gang(
        self, members: Sequence[Pod], state: ClusterState
    ) -> tuple[list[tuple[Assignment, tuple[MigPartition, ...]]] | None, ClusterState]:
        """Every member, or failing that at least the gang's minimum and those beyond it that fit
        beside it, or none; within one domain of the gang's topology key when it asks (each
        domain tried for every member before any is tried for the minimum)."""
        gang = members[0].gang
        assert gang is not None
        if len(members) < gang.min_members:
            return None, state  # the rest of the gang has not arrived
        tries: list[BoolArray | None] = []
        if gang.topology_key:
            doms = domains_of(state, gang.topology_key)
            if gang.domain:  # members already run there
                doms = {d: m for d, m in doms.items() if d == gang.domain}
            free = {d: int(state.gpu_free[m].sum()) for d, m in doms.items()}
            tries.extend(doms[d] for d in sorted(doms, key=lambda d: (free[d], d)))  # tightest first
        if gang.topology != "required":
            tries.append(None)
        # Every member where all of them fit together; failing that, the minimum and those beyond
        # it that fit beside it.
        for need in sorted({len(members), gang.min_members}, reverse=True):
            for allowed in tries:
                trial = state
                steps: list[tuple[Assignment, tuple[MigPartition, ...]]] = []
                for i, pod in enumerate(members):
                    if len(steps) + len(members) - i < need:
                        break  # out of reach here
                    step = self._step(pod, trial, allowed)
                    if step is None:
                        continue
                    steps.append(step)
                    fresh = trial is not state  # made by this trial alone: updated in place
                    if step[1]:
                        trial, fresh = trial.partition(step[1]), True
                    trial = trial.apply((step[0],), consume=fresh)
                if len(steps) >= need:
                    return steps, trial
        return None, state


GPU_CHOICE = GreedyPolicy()
"""A greedy policy used only for its choice of GPUs on a given node (``gpus``), which is
stateless: where a placement's node is decided elsewhere (preemption, consolidation, room held
again after a failover)."""
