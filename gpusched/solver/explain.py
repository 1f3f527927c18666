"""Why a pod does not fit: per node, the unmet requirements kube-scheduler would report,
counted the way it counts them ("0/12 nodes are available: 4 GPU model not accepted,
8 Insufficient nvidia.com/gpu.").

Checks run in kube-scheduler's filter order (cordoned nodes, taints, node affinity, host ports, resources,
topology spread, inter-pod affinity), and a node is counted under the first filter it fails,
as kube-scheduler stops at a node's first failing filter.  Within the resource filter every
resource the node lacks is counted, as kube-scheduler's NodeResourcesFit lists them all (the
pod count, cpu, memory, ephemeral storage, then the GPUs), so a node short of both cpu and
memory counts under each and the counts can add up to more than the nodes.  The GPU model
check sits with node affinity, as a selector on the GPU product would; GPU shares, islands and
MIG slices with the other resources, after whole GPUs, one reason per node among them (a node
without GPUs is short of GPUs, not also of islands).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.model import ClusterState, Pod
from gpusched.model.node import UNSCHEDULABLE_TAINT
from gpusched.model.pod import Gang, tolerated, untolerated
from gpusched.solver.baselines.best_fit import BestFitPolicy

__all__ = [
    "AFFINITY",
    "ANTI_AFFINITY",
    "BIND_CONFLICT",
    "DEFERRED",
    "EXISTING_ANTI_AFFINITY",
    "INSUFFICIENT_CPU",
    "INSUFFICIENT_GPU",
    "INSUFFICIENT_ISLAND",
    "INSUFFICIENT_MEMORY",
    "INSUFFICIENT_SHARE",
    "INSUFFICIENT_STORAGE",
    "MAX_VOLUME_COUNT",
    "MODEL_NOT_ACCEPTED",
    "PORTS_TAKEN",
    "SELECTOR_MISMATCH",
    "SPREAD_LABEL_MISSING",
    "SPREAD_MISMATCH",
    "TOO_MANY_PODS",
    "VOLUME_CONFLICT",
    "Explanation",
    "explain",
    "explain_gang",
    "insufficient_mig",
    "together",
]

CORDONED = "node(s) were unschedulable"
MODEL_NOT_ACCEPTED = "GPU model not accepted"
SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
INSUFFICIENT_GPU = "Insufficient nvidia.com/gpu"
INSUFFICIENT_SHARE = "insufficient GPU share"
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
INSUFFICIENT_STORAGE = "Insufficient ephemeral-storage"
TOO_MANY_PODS = "Too many pods"
"""kube-scheduler's words for a node at its ``maxPods``."""
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"
SPREAD_LABEL_MISSING = "node(s) didn't match pod topology spread constraints (missing required label)"
SPREAD_MISMATCH = "node(s) didn't match pod topology spread constraints"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
DEFERRED = "deferred by the solver"
INSUFFICIENT_ISLAND = "no GPU island with enough idle GPUs"
VOLUME_CONFLICT = "node(s) had volume node affinity conflict"
"""kube-scheduler's words for a node a volume the pod mounts cannot be used on."""
MAX_VOLUME_COUNT = "node(s) exceed max volume count"
"""kube-scheduler's words for a node where the pod's CSI volumes would pass a driver's limit."""
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
"""kube-scheduler's words for a node its claims still to be bound cannot be had on."""


def insufficient_mig(profile: str) -> str:
    """The reason for nodes without a free (or partitionable) instance of ``profile``."""
    return f"Insufficient nvidia.com/mig-{profile}"


@dataclass(frozen=True)
class Explanation:
    """Where a pod fits now and, for the other nodes, why not."""

    pod: str
    total: int
    fits: int
    reasons: Mapping[str, int]
    """Reason -> number of nodes (a node short of several resources counts under each)."""

    @property
    def reason(self) -> str:
        """The short, stable reason label (for metrics): the most common one."""
        if self.fits:
            return DEFERRED
        if not self.reasons:
            return "no nodes"
        return max(self.reasons.items(), key=lambda kv: (kv[1], kv[0]))[0]

    @property
    def message(self) -> str:
        """A kube-scheduler style message, its "count reason" parts sorted as strings, as
        kube-scheduler sorts them (so "10 ..." comes before "2 ...")."""
        if self.fits:
            return (
                f"{self.fits}/{self.total} nodes could take the pod now, but the batch solve "
                f"left it out to keep capacity for the rest of the batch; it is retried with the next batch."
            )
        parts = ", ".join(sorted(f"{n} {r}" for r, n in self.reasons.items()))
        return f"0/{self.total} nodes are available: {parts}." if parts else f"0/{self.total} nodes are available."


def explain(pod: Pod, state: ClusterState) -> Explanation:
    """Explain ``pod`` against ``state`` (the cluster after this batch's placements)."""
    cluster = state.cluster
    n = len(cluster)
    left = np.ones(n, dtype=np.bool_)
    reasons: Counter[str] = Counter()

    def check(ok: np.ndarray, reason: str) -> None:
        check_all([(ok, reason)])

    def check_all(checks: list[tuple[np.ndarray, str]]) -> None:
        """One filter that reports every check a node fails (NodeResourcesFit)."""
        nonlocal left
        passed = left.copy()
        for ok, reason in checks:
            failed = left & ~ok
            if failed.any():
                reasons[reason] += int(failed.sum())
            passed &= ok
        left = passed

    def first_of(chain: list[tuple[np.ndarray, str]]) -> list[tuple[np.ndarray, str]]:
        """Checks that each fail a node only where the earlier ones in ``chain`` passed it."""
        rest = np.ones(n, dtype=np.bool_)
        out = []
        for ok, reason in chain:
            out.append((~rest | ok, reason))
            rest = rest & ok
        return out

    # NodeUnschedulable (a cordoned node, unless the pod tolerates its taint), TaintToleration,
    # then NodeAffinity (with the accepted GPU models, a selector on the product).
    if cluster.tainted and not tolerated(pod.tolerations, (UNSCHEDULABLE_TAINT,)):
        check(~cluster.cordoned, CORDONED)
    if cluster.tainted:
        for i, taints in enumerate(cluster.taint_sets):
            missing = untolerated(pod.tolerations, taints)
            if missing:
                check(cluster.taint_id != i, f"node(s) had untolerated taint {missing[0]}")
    if pod.node_selector:
        check(cluster.selector_mask(pod.node_selector), SELECTOR_MISMATCH)
    if pod.gpu_models and pod.num_gpu:
        check(cluster.model_mask(pod.gpu_models), MODEL_NOT_ACCEPTED)
    elif pod.gpu_models and pod.mig_profile:
        check(cluster.product_mask(pod.gpu_models), MODEL_NOT_ACCEPTED)
    # NodePorts.
    if pod.host_ports:
        check(state.ports_free(pod.host_ports), PORTS_TAKEN)
    # NodeResourcesFit: the pod count, cpu, memory, ephemeral storage, then GPUs, all reported.
    fit: list[tuple[np.ndarray, str]] = []
    if cluster.pods_metered:
        fit.append((state.pods_free >= 1, TOO_MANY_PODS))
    fit.append((state.cpu_free >= pod.cpu_milli, INSUFFICIENT_CPU))
    fit.append((state.mem_free >= pod.memory_mib, INSUFFICIENT_MEMORY))
    if pod.storage_mib:
        fit.append((state.storage_free >= pod.storage_mib, INSUFFICIENT_STORAGE))
    if pod.num_gpu:
        gpu = [(cluster.gpu_count > 0, INSUFFICIENT_GPU)]
        if pod.is_fractional:
            gpu.append((state.max_gpu_free >= pod.gpu_milli, INSUFFICIENT_SHARE))
        else:
            gpu.append((state.full_free_gpus >= pod.num_gpu, INSUFFICIENT_GPU))
            if pod.island == "required" and pod.num_gpu > 1:
                gpu.append((state.island_idle.max(axis=1, initial=0) >= pod.num_gpu, INSUFFICIENT_ISLAND))
        fit += first_of(gpu)
    elif pod.mig_profile:
        fit.append((state.mig_available(pod.mig_profile), insufficient_mig(pod.mig_profile)))
    check_all(fit)
    # NodeVolumeLimits: its CSI volumes within each driver's attach limit.
    if pod.attach_selector:
        check(cluster.selector_mask(pod.attach_selector), MAX_VOLUME_COUNT)
    # VolumeBinding: the node affinity of the volumes its claims are bound to, then where those
    # still to be provisioned may be.
    if pod.volume_selector:
        check(cluster.selector_mask(pod.volume_selector), VOLUME_CONFLICT)
    if pod.provision_selector:
        check(cluster.selector_mask(pod.provision_selector), BIND_CONFLICT)
    # PodTopologySpread: the constraint's label first, then the skew.
    spread = state.spread_mask(pod)
    if spread is not None:
        check(state.spread_keys_mask(pod), SPREAD_LABEL_MISSING)
        check(spread, SPREAD_MISMATCH)
    # InterPodAffinity: the pod's affinity, its anti-affinity, then the running pods' anti-affinity.
    affinity = state.affinity_mask(pod)
    if affinity is not None:
        check(affinity, AFFINITY)
    for existing, reason in ((False, ANTI_AFFINITY), (True, EXISTING_ANTI_AFFINITY)):
        anti = state.anti_mask(pod, existing)
        if anti is not None:
            check(anti, reason)
    return Explanation(pod.key, n, int(left.sum()), dict(reasons))


def together(gang: Gang, size: int = 0) -> str:
    """The rule a gang's member waits by: no member is placed until all of them can be, when its
    ``size`` members known (pending and running; 0: not known) are its minimum, else until at
    least its minimum (less its members running, beside them) can be."""
    if 0 < size <= gang.min_members + gang.running:
        return "no member is placed until all of them can be, together."
    if gang.running:
        return (
            f"no member is placed until at least {gang.min_members} more of them can be, together, "
            f"beside the {gang.running} running."
        )
    return f"no member is placed until at least {gang.min_members} of them can be, together."


def explain_gang(pod: Pod, members: int, state: ClusterState) -> str:
    """Why ``pod``'s gang (``members`` of it in the batch) was not placed: too few members, or
    not its minimum of them fit at once (within one topology domain when the gang requires one)."""
    gang = pod.gang
    assert gang is not None
    if members < gang.min_members:
        if gang.running:  # as the user wrote the minimum, the running members counted in
            return (
                f"gang {gang.name}: {members} pending and {gang.running} running of at least "
                f"{gang.min_members + gang.running} members; {together(gang)}"
            )
        return f"gang {gang.name}: {members} of at least {gang.min_members} members are pending; {together(gang)}"
    where = ""
    if gang.topology == "required":
        key = gang.topology_key
        if not any(state.cluster.domains(key)[1]):  # no node has a non-empty value of it
            return (
                f"gang {gang.name}: its members must share one {key} domain, but no node has a {key} label; "
                f"label the nodes, or check the gang's topology key"
            )
        where = f" within {key} {gang.domain}, where its members run" if gang.domain else f" within one {key} domain"
    e = explain(pod, state)
    detail = e.message if not e.fits else f"{e.fits}/{e.total} nodes could take this member alone."
    pending = "pending " if gang.running else ""
    beside = f" (beside {gang.running} running)" if gang.running else ""
    if members == 1:
        fit = f"its {pending}member{beside} does not fit{where}"
    elif gang.min_members == 1:  # its members running make its minimum: any one of these would do
        fit = f"none of its {members} {pending}members{beside} fits{where}"
    elif members > gang.min_members:
        fit = f"no {gang.min_members} of its {members} {pending}members{beside} fit at once{where}"
    else:
        fit = f"its {members} {pending}members{beside} do not all fit at once{where}"
    return f"gang {gang.name}: {fit}; {detail}"


def gang_fits(members: Sequence[Pod], state: ClusterState) -> int:
    """How many of ``members`` (a gang's pending members) fit at once in ``state`` as a greedy
    pass places a gang (best fit, at least its minimum, within one domain where it must); 0 when
    not its minimum: else what left them out of a batch was the solve, not capacity."""
    return len(BestFitPolicy().place(list(members), state).assignments)
