"""The one interface every placement policy implements, CP-SAT and greedy alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from gpusched.model import ClusterState, Plan, Pod

__all__ = ["Policy", "QuickPolicy", "TimedPolicy", "place_quick"]


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


@runtime_checkable
class QuickPolicy(Protocol):
    """A policy with a cheaper answer for when waiting costs more than the last bit of packing."""

    def place_quick(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        """Same contract as ``place``, in less time."""
        ...


def place_quick(policy: Policy, pods: Sequence[Pod], state: ClusterState) -> Plan:
    """``policy.place_quick`` where the policy has one, else its ``place`` (already quick)."""
    if isinstance(policy, QuickPolicy):
        return policy.place_quick(pods, state)
    return policy.place(pods, state)


@runtime_checkable
class TimedPolicy(Protocol):
    """A policy with a time limit per batch that can also stop at a given moment."""

    @property
    def time_limit_s(self) -> float:
        """Seconds a batch may take."""
        ...

    def place_until(self, pods: Sequence[Pod], state: ClusterState, deadline: float, quick: bool) -> Plan:
        """``place`` (``place_quick`` when ``quick``) that stops at ``deadline`` (``time.perf_counter()``)."""
        ...
