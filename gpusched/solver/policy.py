"""The one interface every placement policy implements, CP-SAT and greedy alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpusched.model import ClusterState, Plan, Pod

__all__ = ["Policy"]


class Policy(Protocol):
    """Places a batch of pods against a cluster state.

    Contract: the returned plan names every input pod exactly once, either in
    ``assignments`` or in ``unplaced``; it is valid against ``state`` as
    ``solver.validate.validate_plan`` checks; the policy does not keep the state.
    """

    name: str

    def place(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        """Place ``pods`` on ``state``; never raises for pods that do not fit."""
        ...
