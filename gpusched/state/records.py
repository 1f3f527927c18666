"""Typed views of Nodes and Pods: what the scheduler reads from each API object.

``kube.convert`` builds these from the API's JSON; the cache, the queue and the
explainer use them and never see raw API objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusched.model import Node, Pod
from gpusched.model.affinity import Requirement

__all__ = [
    "HELD_REASONS",
    "REASON_MIG_REPARTITION",
    "REASON_TENANT_LIMIT",
    "REASON_UNSCHEDULABLE",
    "NodeRecord",
    "PodRecord",
]

REASON_UNSCHEDULABLE = "Unschedulable"
"""The ``PodScheduled=False`` reason of a pod that fits nowhere now, as kube-scheduler writes
it (and the cluster autoscaler reads it: it adds a node for such a pod)."""
REASON_TENANT_LIMIT = "TenantLimit"
"""The ``PodScheduled=False`` reason of a pod held back only by its tenant's GPU limit: a new
node would not place it, so the cluster autoscaler must not add one for it."""
REASON_MIG_REPARTITION = "MigRepartition"
"""The ``PodScheduled=False`` reason of a pod waiting for a node to be re-partitioned into the
MIG instances it is to take (or a gang member waiting beside such pods): it is as good as placed,
so the cluster autoscaler must not add a node for it."""
HELD_REASONS = frozenset({REASON_UNSCHEDULABLE, REASON_TENANT_LIMIT, REASON_MIG_REPARTITION})
"""The reasons of the conditions gpusched writes on the pods it cannot place."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A Node: its model view, and what else was read from it."""

    node: Node
    mig: tuple[tuple[str, int], ...] = ()
    """Allocatable MIG slices by resource name (``nvidia.com/mig-1g.10gb``), sorted."""
    warning: str = ""
    """What on the node was read with a fallback (a stale islands annotation, an unknown MIG resource)."""
    mig_warning: str = ""
    """Why a node labelled for MIG re-partitioning may not be re-partitioned (told only while
    ``mig.repartition`` is on)."""

    @property
    def name(self) -> str:
        """The node name."""
        return self.node.name


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A Pod as the scheduler needs it.

    ``pod`` is the resource request.  ``error`` is set when the pod asks for
    something this scheduler cannot honour (the reason goes into its Event),
    and ``pod`` is then only good for naming it.
    """

    pod: Pod
    uid: str
    scheduler: str
    node_name: str = ""
    """Empty while pending; the node it is bound to otherwise."""
    gpu_indices: tuple[int, ...] | None = None
    """GPU indices from the pod's annotation, when a scheduler wrote one."""
    resource_version: str = ""
    created: float = 0.0
    """Creation time, seconds since the epoch."""
    terminal: bool = False
    """Succeeded or Failed: holds no resources."""
    deleting: bool = False
    error: str = ""
    unschedulable: str | None = None
    """The message of the pod's ``PodScheduled=False`` condition (reason ``Unschedulable`` or
    ``TenantLimit``, as gpusched writes them), if it has one."""
    unschedulable_reason: str = ""
    """That condition's reason ("" without one)."""
    nominated: str = ""
    """``status.nominatedNodeName``: where it preempted pods (this instance, or one that led before)."""
    gated: bool = False
    """The pod has ``spec.schedulingGates``: nobody may bind it until they are removed."""
    claims: tuple[str, ...] = ()
    """Names of the PersistentVolumeClaims the pod mounts (in its namespace)."""
    ephemeral_claims: tuple[str, ...] = ()
    """Those of ``claims`` that its generic ephemeral volumes create for it."""
    namespace_selectors: tuple[tuple[Requirement, ...], ...] = ()
    """The selectors by which the pod's (anti-)affinity terms pick namespaces by label: ``pod``
    holds the namespaces they picked when it was read, and it must be read again when a
    namespace's labels change what one of them picks."""
    pod_group: str = ""
    """The gang (``namespace/name``) whose PodGroup gives the pod its minimum: it is labelled with a
    pod group and carries no ``gpusched.io/gang-min-members``.  Empty otherwise.  ``pod`` holds
    the minimum the PodGroup had when it was read (1 without one); it must be read again when
    the PodGroup changes."""

    @property
    def namespace_selected(self) -> bool:
        """Some term picks namespaces by label."""
        return bool(self.namespace_selectors)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return self.pod.key

    @property
    def bound(self) -> bool:
        """Whether the pod has a node."""
        return bool(self.node_name)
