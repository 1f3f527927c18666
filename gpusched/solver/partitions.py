"""Which of a plan's MIG partitions its pods need (no CP-SAT here: the daemon checks a plan
against the books as they are after the solve without loading the solver)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from gpusched.model import Assignment, ClusterState
from gpusched.model.placement import MigPartition

__all__ = ["needed_partitions"]


def needed_partitions(
    partitions: Sequence[MigPartition], assignments: Sequence[Assignment], state: ClusterState
) -> tuple[MigPartition, ...]:
    """Of ``partitions``, those the MIG pods of ``assignments`` need: the model partitioned GPUs
    for pods that may then wait for the next batch (``peer_order``), and a GPU partitioned drains
    its node on a live cluster.  Per node, the pods of each profile beyond the instances free
    there take instances of the partitions; the partitions without which those are still
    offered are left out, one after another, the last first."""
    taken: dict[tuple[int, str], int] = defaultdict(int)
    for a in assignments:
        if a.pod.mig_profile:
            taken[a.node, a.pod.mig_profile] += 1
    column = state.cluster.mig_index
    kept = list(range(len(partitions)))
    for i in reversed(range(len(partitions))):
        n = partitions[i][0]
        offered: dict[str, int] = defaultdict(int)
        for j in kept:
            if j != i and partitions[j][0] == n:
                for profile, count in partitions[j][2].counts.items():
                    offered[profile] += count
        if all(
            count <= int(state.mig_free[m, column[profile]]) + offered[profile]
            for (m, profile), count in taken.items()
            if m == n
        ):
            kept.remove(i)
    return tuple(partitions[i] for i in kept)
