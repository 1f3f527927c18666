"""API JSON -> typed records: resource names, GPU feature discovery labels, annotations.

Objects arrive as decoded JSON (``dict``), exactly as the API server sends them;
decoding into generated client classes is skipped because it costs more than the
rest of the watch path together on large clusters.

GPU inventory of a node
    ``status.allocatable["nvidia.com/gpu"]`` (the label ``nvidia.com/gpu.count`` alone only
    draws a warning); pod limit from ``status.allocatable["pods"]`` (none without it); model from
    ``nvidia.com/gpu.product``, memory per GPU (MiB) from ``nvidia.com/gpu.memory``; MIG slices
    from ``nvidia.com/mig-<profile>``.

GPU request of a pod
    whole GPUs: ``nvidia.com/gpu`` in the container limits (requests equal limits);
    a fractional share of one GPU: the annotation ``gpusched.io/gpu-milli`` (1..1000
    thousandths of a GPU) or the extended resource ``gpusched.io/gpu-milli``, with no
    ``nvidia.com/gpu``; accepted models: the annotation ``gpusched.io/gpu-models``
    (comma separated) and/or ``nodeSelector["nvidia.com/gpu.product"]``; other
    ``nodeSelector`` labels and the required node affinity restrict the nodes
    (``gpusched.model.affinity``); preferred node affinity is weighed (``_preferred_nodes``).

One MIG slice: ``nvidia.com/mig-<profile>: 1`` (NVIDIA's mixed strategy), alone.

Requests of a pod
    as kube-scheduler adds them up: the app containers and sidecars (init containers with
    ``restartPolicy: Always``) together, at least each init container beside the sidecars
    started before it; a pod-level request (``spec.resources``, CPU and memory) instead of the
    containers'; then ``spec.overhead``.  A running container resized in place holds the larger
    of its old and new CPU and memory requests (the old ones while the resize is infeasible).

GPU islands of a node
    the annotation ``gpusched.io/gpu-islands`` (``0-3;4-7``), else a default from
    ``nvidia.com/gpu.product`` (``gpusched.model.topology``); a multi-GPU pod asks
    for one island with the annotation ``gpusched.io/gpu-island: required|preferred``.

Gangs
    the coscheduling label ``scheduling.x-k8s.io/pod-group`` names the group (within
    the pod's namespace); ``gpusched.io/gang-min-members`` says how many members
    must be pending before any is placed; without it, the ``spec.minMember`` of the
    group's PodGroup (``scheduling.x-k8s.io/v1alpha1``, ``pod_group_record``), when
    given (the annotation wins over it); else 1 (the members pending together),
    ``gpusched.io/gang-topology-key`` (a node label such as ``rack`` or
    ``nvidia.com/gpu.clique``) with ``gpusched.io/gang-topology: required|preferred``
    keeps the gang within one domain of it.

Volumes
    the claims a pod mounts (``persistentVolumeClaim`` volumes, and the claim
    ``<pod>-<volume>`` of each generic ephemeral volume) are kept on its record;
    ``gpusched.state.volumes`` decides whether they let the pod be bound.

The scheduler writes the GPU indices it chose to ``gpusched.io/gpu-indices`` (``"0,1"``)
together with the Binding.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpusched.model import GPU_MILLI, Node, Pod, QuantityError, cpu_milli, memory_mib, parse_quantity
from gpusched.model.affinity import (
    NodeSelector,
    PodAffinityTerm,
    Preference,
    Requirement,
    Spread,
    both,
    check_label_selector,
    int64,
    is_int64,
    label_selector_selects,
)
from gpusched.model.mig import MIG_CONFIG_PREFIX, geometry_for, gpu_fraction, profile_of
from gpusched.model.node import LABEL_GPU_COUNT, MAX_GPUS, Taint, label_number, single_mig_profile
from gpusched.model.pod import TOLERATION_OPERATORS, Gang, Toleration, gang_conflicts, model_key
from gpusched.model.ports import host_port
from gpusched.model.topology import ISLANDS_ANNOTATION, default_islands, parse_islands
from gpusched.solver.preempt import Budget
from gpusched.state.records import HELD_REASONS, NodeRecord, PodRecord
from gpusched.state.volumes import ClaimRecord, StorageClassRecord, VolumeRecord

__all__ = [
    "ANNOTATION_GANG_KEY",
    "ANNOTATION_GANG_MIN",
    "ANNOTATION_GANG_TOPOLOGY",
    "ANNOTATION_GPU_INDICES",
    "ANNOTATION_GPU_ISLAND",
    "ANNOTATION_GPU_MILLI",
    "ANNOTATION_GPU_MODELS",
    "GPU_RESOURCE",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_MIG_CONFIG",
    "LABEL_MIG_PREVIOUS",
    "LABEL_MIG_REPARTITION",
    "LABEL_MIG_REQUESTED",
    "LABEL_MIG_STATE",
    "LABEL_POD_GROUP",
    "MIG_BUSY_STATES",
    "MIG_CONFIG_PREFIX",
    "PODGROUP_GROUP_VERSION",
    "PODGROUP_RESOURCE",
    "ConvertError",
    "PodGroups",
    "budget_record",
    "claim_record",
    "csi_node_limits",
    "gang_disagreements",
    "node_record",
    "pod_group_record",
    "pod_record",
    "storage_class_record",
    "volume_record",
]

GPU_RESOURCE = "nvidia.com/gpu"
VOLATILE_NODE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
"""Node labels rewritten on a timer that no pod selects on: left out of the books, so that
their churn (GPU feature discovery stamps every node each minute) is no change of the node.
Each such change would otherwise wake every parked pod and void the batch being solved."""
STORAGE_RESOURCE = "ephemeral-storage"
MIG_PREFIX = "nvidia.com/mig-"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
ANNOTATION_GPU_MILLI = "gpusched.io/gpu-milli"
ANNOTATION_GPU_MODELS = "gpusched.io/gpu-models"
ANNOTATION_GPU_INDICES = "gpusched.io/gpu-indices"
ANNOTATION_GPU_ISLAND = "gpusched.io/gpu-island"
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"
PODGROUP_GROUP_VERSION = "scheduling.x-k8s.io/v1alpha1"
PODGROUP_RESOURCE = "podgroups.scheduling.x-k8s.io"
"""The coscheduling PodGroup (kubernetes-sigs/scheduler-plugins): its ``spec.minMember`` is a
gang's minimum when its pods carry no ``gpusched.io/gang-min-members``."""
ANNOTATION_CONSOLIDATE = "gpusched.io/consolidate"
"""``"true"``: the pod may be evicted to consolidate GPU work onto fewer nodes (with a controller)."""
ANNOTATION_GANG_MIN = "gpusched.io/gang-min-members"
ANNOTATION_GANG_KEY = "gpusched.io/gang-topology-key"
ANNOTATION_GANG_TOPOLOGY = "gpusched.io/gang-topology"
LABEL_MIG_REPARTITION = "gpusched.io/mig-repartition"
"""``"true"`` on a node: while all of its GPUs are idle, gpusched may re-partition them into MIG
instances (``mig.repartition`` in the config; NVIDIA's MIG manager applies the layout)."""
LABEL_MIG_CONFIG = "nvidia.com/mig.config"
"""The MIG manager's label: the name of the configuration it is to apply to the node."""
LABEL_MIG_STATE = "nvidia.com/mig.config.state"
"""The MIG manager's word on that: ``pending``, ``rebooting``, ``success`` or ``failed``."""
MIG_BUSY_STATES = ("pending", "rebooting")
LABEL_MIG_PREVIOUS = "gpusched.io/mig-previous"
"""Set with ``all-disabled`` when gpusched sets a node of its back to whole GPUs: the layout it
had, for any leader to label it with again should the MIG manager not get to it."""
LABEL_MIG_RESTORE_FAILED = "gpusched.io/mig-restore-failed-at"
"""Set when a node gpusched set back to whole GPUs did not come back (Unix seconds): no leader
sets it back again for a day."""
LABEL_MIG_REQUESTED = "gpusched.io/mig-requested-at"
"""Set with ``nvidia.com/mig.config`` when gpusched asks for a layout: when (Unix seconds), so that
any leader keeps the node sealed until the instances come or the request times out."""
LABEL_MIG_SETTING_BACK = "gpusched.io/mig-setting-back-at"
"""Set with ``nvidia.com/mig.config`` when gpusched labels a node back after a layout (or a
restore) failed or did not come: when (Unix seconds), so that any leader keeps the node sealed
until the MIG manager has applied that, since it may reset the GPUs meanwhile."""
MAX_MIG_SLICES = MAX_GPUS * 7
"""The most instances of one MIG profile a node holds (seven a GPU): ``Node`` refuses more."""
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
"""GPU feature discovery's label for the device plugin's MIG strategy: only ``mixed`` advertises
``nvidia.com/mig-<profile>`` resources."""
UNKNOWN_MODEL = "unknown"
"""Model of GPUs on a node that has no ``nvidia.com/gpu.product`` label."""

_KEEP_OFF_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects a pod must tolerate to be placed (PreferNoSchedule is only a preference: ``Node.soft_taints``)."""


class ConvertError(ValueError):
    """An API object that cannot be read; the message names the object and the field."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise ConvertError("object without metadata.name")
    return meta


def _repartitionable(
    labels: Mapping[str, str], gpus: int, model: str, slices: bool, where: str, warnings: list[str]
) -> bool:
    """Whether a node that asks to be re-partitioned (``LABEL_MIG_REPARTITION``) may be: its GPUs
    are of a MIG model, all whole (every GPU that GPU feature discovery counts is advertised, and
    no MIG instance is), and the MIG manager is not at work on it nor failed on it last."""
    if labels.get(LABEL_MIG_REPARTITION, "").lower() != "true" or not gpus:
        return False
    state = labels.get(LABEL_MIG_STATE, "")
    config = labels.get(LABEL_MIG_CONFIG, "")
    counted = labels.get(LABEL_GPU_COUNT, "")
    why = ""
    strategy = labels.get(LABEL_MIG_STRATEGY, "")
    if geometry_for(model) is None:
        why = f"its GPUs ({model}) have no MIG mode this scheduler knows"
    elif strategy and strategy != "mixed":
        why = (
            f"{LABEL_MIG_STRATEGY}={strategy}: the device plugin would advertise its instances as "
            "nvidia.com/gpu, not as the nvidia.com/mig-* instances pods ask for; set the GPU operator's "
            "mig.strategy to mixed"
        )
    elif slices:
        return False  # re-partitioned already: its instances are packed as advertised
    elif config.startswith(MIG_CONFIG_PREFIX) and LABEL_MIG_REQUESTED in labels and state != "failed":
        return False  # a layout asked for and not there yet: the daemon keeps the node out meanwhile
    elif label_number(counted) not in (None, gpus):
        why = f"{LABEL_GPU_COUNT} counts {counted} GPUs but {gpus} are advertised, so which GPU is which is not known"
    elif state in MIG_BUSY_STATES:
        return False
    elif state == "failed" or config.startswith(MIG_CONFIG_PREFIX):
        # A layout of this scheduler's that did not bring MIG instances: not asked for again.
        done = "failed to apply" if state == "failed" else f"has not applied (state {state or 'unset'})"
        # The MIG manager acts when the label changes, and on the label it finds as it starts:
        # the value the node has already, set again, changes nothing.
        fixes = [f"set {LABEL_MIG_CONFIG}=all-disabled"] if config != "all-disabled" else []
        if state == "failed":
            fixes.append("restart the MIG manager's pod on the node (it applies the label again as it starts)")
        why = f"the MIG manager {done} {LABEL_MIG_CONFIG}={config}; see its log, then {' or '.join(fixes)}"
        why += " to offer the node again"
    if why:
        warnings.append(f"{where}: label {LABEL_MIG_REPARTITION}=true but it is not re-partitioned: {why}")
        return False
    return True


def _int_quantity(text: Any, where: str) -> int:
    try:
        value = parse_quantity(text)
    except QuantityError as exc:
        raise ConvertError(f"{where}: {exc}") from None
    if value != int(value):
        raise ConvertError(f"{where}: must be a whole number, got {text!r}")
    return int(value)


def node_record(obj: Mapping[str, Any]) -> NodeRecord:
    """The node's inventory and schedulability; raises ``ConvertError`` naming the bad field."""
    meta = _meta(obj)
    name = str(meta["name"])
    where = f"node {name}"
    labels = _string_map(meta.get("labels"), where, "metadata.labels")
    spec = _object(obj.get("spec"), where, "spec")
    status = _object(obj.get("status"), where, "status")
    reported = "allocatable" if status.get("allocatable") else "capacity"
    alloc = _object(status.get(reported), where, f"status.{reported}")
    if not isinstance(spec.get("unschedulable"), bool | None):
        raise ConvertError(f"{where}: spec.unschedulable must be true or false, got {_shown(spec['unschedulable'])}")
    try:
        cpu = cpu_milli(alloc.get("cpu", 0), round_up=False)
    except QuantityError as exc:
        raise ConvertError(f"{where}: status.{reported} cpu: {exc}") from None
    try:
        mem = memory_mib(alloc.get("memory", 0), round_up=False)
    except QuantityError as exc:
        raise ConvertError(f"{where}: status.{reported} memory: {exc}") from None
    # Only what the device plugin advertises counts: the kubelet admits pods against allocatable,
    # and in MIG mode the GPU feature discovery count also covers the partitioned GPUs.
    gpus = _int_quantity(alloc[GPU_RESOURCE], f"{where}: allocatable {GPU_RESOURCE}") if GPU_RESOURCE in alloc else 0
    warnings: list[str] = []
    if gpus > MAX_GPUS:  # before anything is built per GPU; the node's CPU and memory still serve
        replicas = str(labels.get("nvidia.com/gpu.replicas", ""))
        shared = (
            f" (nvidia.com/gpu.replicas={replicas}: the device plugin time-slices each GPU; gpusched shares GPUs "
            "itself, with gpusched.io/gpu-milli: leave GPU sharing off on the nodes it schedules)"
            if (label_number(replicas) or 0) > 1
            else ""
        )
        warnings.append(
            f"{where}: allocatable {GPU_RESOURCE} {gpus} is more GPUs than a node holds ({MAX_GPUS}){shared}; "
            "its GPUs are not offered, pods that ask for no GPU still are"
        )
        gpus = 0
    model = str(labels.get(LABEL_GPU_PRODUCT, "")) or (UNKNOWN_MODEL if gpus else "")
    mig = tuple(
        sorted((k, _int_quantity(v, f"{where}: allocatable {k}")) for k, v in alloc.items() if k.startswith(MIG_PREFIX))
    )
    if any(v > MAX_MIG_SLICES for _, v in mig):  # as for too many GPUs: its other resources still serve
        warnings += [
            f"{where}: allocatable {k} {v} is more MIG slices than a node holds ({MAX_MIG_SLICES}); left out"
            for k, v in mig
            if v > MAX_MIG_SLICES
        ]
        mig = tuple((k, v) for k, v in mig if v <= MAX_MIG_SLICES)
    annotations = _string_map(meta.get("annotations"), where, "metadata.annotations")
    # A node is never dropped for these: a GPU memory label that is not a count (it only
    # narrows pods that ask for GPU memory) counts as unknown, an islands annotation that no
    # longer matches the GPU count (a GPU went unhealthy, or into MIG mode) falls back to the
    # default, and a MIG resource this scheduler does not know is left out; all are reported
    # in ``warning``.
    gpu_mem = 0
    if LABEL_GPU_MEMORY in labels:
        try:
            gpu_mem = _int_quantity(labels[LABEL_GPU_MEMORY], f"{where}: label {LABEL_GPU_MEMORY}")
        except ConvertError as exc:
            warnings.append(f"{exc}; GPU memory counted as unknown (MiB expected, as GPU feature discovery writes it)")
    max_pods: int | None = 0  # not reported: none, as kube-scheduler reads it (no pod fits)
    if "pods" in alloc:
        try:
            max_pods = _int_quantity(alloc["pods"], f"{where}: allocatable pods")
        except ConvertError as exc:
            max_pods = None
            warnings.append(f"{exc}; its pod limit is not checked")
    else:
        warnings.append(f"{where}: no allocatable pods, so it takes no pod, as for kube-scheduler")
    storage = 0  # not reported: none, as kube-scheduler reads it (a pod asking for some does not fit)
    if STORAGE_RESOURCE in alloc:
        try:
            storage = memory_mib(alloc[STORAGE_RESOURCE], round_up=False)
        except QuantityError as exc:
            warnings.append(
                f"{where}: allocatable {STORAGE_RESOURCE} counted as 0, as if not reported, so no pod asking "
                f"for ephemeral storage fits it: {exc}"
            )
    if GPU_RESOURCE not in alloc and labels.get(LABEL_GPU_COUNT, "0") not in ("", "0") and not mig:
        warnings.append(
            f"{where}: label {LABEL_GPU_COUNT}={labels[LABEL_GPU_COUNT]} but no allocatable {GPU_RESOURCE} "
            "(is the device plugin running?); counted as 0 GPUs"
        )
    replicas = str(labels.get("nvidia.com/gpu.replicas", ""))
    if gpus and (label_number(replicas) or 0) > 1:
        warnings.append(
            f"{where}: nvidia.com/gpu.replicas={replicas}: the device plugin time-slices each GPU, so its "
            f"{gpus} {GPU_RESOURCE} are slices, not GPUs; gpusched counts them as GPUs, as kube-scheduler does, "
            "and the GPU indices it writes name slices (leave GPU sharing off where gpusched.io/gpu-milli shares)"
        )
    islands: tuple[int, ...] = ()
    if gpus:
        text = annotations.get(ISLANDS_ANNOTATION)
        try:
            islands = parse_islands(text, gpus) if text else default_islands(model, gpus)
        except ValueError as exc:
            islands = default_islands(model, gpus)
            warnings.append(f"{where}: annotation {exc}; using the default islands for {model}")
    slices: list[tuple[str, int]] = []
    for k, v in mig:
        try:
            profile = profile_of(k)
        except ValueError as exc:
            warnings.append(f"{where}: allocatable {k} left out: {exc}")
            continue
        if profile is not None and v:
            slices.append((profile, v))
    all_taints = [
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect")))
        for t in _objects(spec.get("taints"), where, "spec.taints")
    ]
    taints = tuple(t for t in all_taints if t.effect in _KEEP_OFF_EFFECTS)
    soft_taints = tuple(t for t in all_taints if t.effect == "PreferNoSchedule")
    if slices and not model:
        model = UNKNOWN_MODEL
    mig_warnings: list[str] = []
    repartition = _repartitionable(labels, gpus, model, bool(slices), where, mig_warnings)
    try:
        node = Node(
            name,
            cpu,
            mem,
            gpus,
            model,
            gpu_mem,
            {k: v for k, v in labels.items() if k not in VOLATILE_NODE_LABELS},
            islands,
            tuple(slices),
            taints=taints,
            storage_mib=storage,
            max_pods=max_pods,
            soft_taints=soft_taints,
            unschedulable=bool(spec.get("unschedulable")),
            mig_repartition=repartition,
        )
    except ValueError as exc:
        raise ConvertError(str(exc)) from None
    if profile := single_mig_profile(node):
        warnings.append(
            f"{where}: its {gpus} {GPU_RESOURCE} are MIG {profile} instances ({LABEL_GPU_PRODUCT}={model}, "
            f"single strategy), each {gpu_fraction(profile):.3g} of a GPU as GPU counts and the cost report count "
            "them; tenants' quotas and limits count each as a whole GPU, as a pod's request does not say which "
            "node it gets"
        )
    return NodeRecord(node, tuple((k, v) for k, v in mig if v), "; ".join(warnings), "; ".join(mig_warnings))


_POD_LEVEL_RESOURCES = ("cpu", "memory")
"""Resources a pod may request for all its containers together in ``spec.resources``."""


def _container_requests(container: Mapping[str, Any], where: str, what: str) -> dict[str, Any]:
    """The requests of a container (``what`` names it), or of the pod as a whole (``spec``);
    raises ``ConvertError`` naming the field that is not an object."""
    res = _object(container.get("resources"), where, f"{what}.resources")
    merged = dict(_object(res.get("limits"), where, f"{what}.resources.limits"))  # a request defaults to its limit
    merged.update(_object(res.get("requests"), where, f"{what}.resources.requests"))
    return merged


def _containers(spec: Mapping[str, Any], field: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The pod's ``containers`` or ``initContainers`` (lists of objects, as ``pod_record`` has
    left them), each with the path that names it in a message."""
    return [(f"spec.{field}[{i}]", c) for i, c in enumerate(spec.get(field) or ())]


def _effective_requests(spec: Mapping[str, Any], where: str, status: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Per resource: the sum over containers, at least the largest init container, plus overhead.
    A pod-level request (``spec.resources``, CPU and memory) stands for the containers' instead.
    A running container being resized in place holds the larger of its old and new CPU and
    memory requests (``status``: what the kubelet reports), or only the old ones while the
    resize is infeasible.

    CPU in millicores, memory and ephemeral storage in MiB (added up in bytes and rounded up
    once, as the kubelet adds quantities: three containers of 100M take 287 MiB, not 288),
    anything else as a whole count.
    """

    def read(reqs: Mapping[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, value in reqs.items():
            try:
                if key == "cpu":
                    out[key] = cpu_milli(value)
                elif key in _BYTES:
                    out[key] = math.ceil(parse_quantity(value))
                elif "/" in key:
                    try:
                        out[key] = _int_quantity(value, f"{where}: resources {key}")
                    except ConvertError:
                        if key in _TRACKED_RESOURCES or key.startswith(MIG_PREFIX):
                            raise
                        # Not one placement reads (kubernetes.io/batch-cpu may be 1.5): the pod's
                        # other requests count all the same; a pod of ours asking for it is
                        # refused as asking for a resource nodes are not checked for.
            except QuantityError as exc:
                raise ConvertError(f"{where}: resources {key}: {exc}") from None
        return out

    running, infeasible = _running(status or {})

    def held(c: Mapping[str, Any], what: str) -> dict[str, int]:
        """What a container or sidecar holds: its requests, or while it is resized in place
        the larger of those and the ones the kubelet reports it runs with."""
        reqs = read(_container_requests(c, where, what))
        cs = running.get(str(c.get("name") or ""))
        if cs is None or not isinstance(cs.get("resources"), Mapping):
            return reqs
        allocated = cs.get("allocatedResources")
        told = _object(cs["resources"].get("requests"), where, f"the status of {what}: resources.requests")
        reported = [read(told)]
        reported += [read(allocated)] if isinstance(allocated, Mapping) else []
        if not infeasible:
            reported.append(dict(reqs))
        for k in _RESIZABLE:
            reqs[k] = max(r.get(k, 0) for r in reported)
        return reqs

    # As the kubelet counts: init containers run one at a time, each beside the sidecars
    # (init containers with restartPolicy Always) started before it; the sidecars keep running
    # beside the app containers.
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for what, c in _containers(spec, "initContainers"):
        if c.get("restartPolicy") == "Always":
            reqs = held(c, what)
            for k, v in reqs.items():
                sidecars[k] = sidecars.get(k, 0) + v
            step = sidecars
        else:
            reqs = read(_container_requests(c, where, what))
            step = {k: sidecars.get(k, 0) + reqs.get(k, 0) for k in sidecars.keys() | reqs.keys()}
        for k, v in step.items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    total = dict(sidecars)
    for what, c in _containers(spec, "containers"):
        for k, v in held(c, what).items():
            total[k] = total.get(k, 0) + v
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    # The API server has defaulted these from the pod-level limits already where they apply.
    pod_res = _object(spec.get("resources"), where, "spec.resources")
    pod_level = read(_object(pod_res.get("requests"), where, "spec.resources.requests"))
    total.update((k, v) for k, v in pod_level.items() if k in _POD_LEVEL_RESOURCES)
    for k, v in read(spec.get("overhead") or {}).items():
        total[k] = total.get(k, 0) + v
    for k in _BYTES:
        if k in total:
            try:
                total[k] = memory_mib(total[k])
            except QuantityError as exc:
                raise ConvertError(f"{where}: resources {k}: {exc}") from None
    return total


_BYTES = ("memory", STORAGE_RESOURCE)
"""Requests added up in bytes, then rounded up to MiB."""


_RESIZABLE = ("cpu", "memory")
"""Requests of a running container that may be changed in place."""


def _running(status: Mapping[str, Any]) -> tuple[dict[str, Mapping[str, Any]], bool]:
    """The kubelet's status of each container and sidecar by name, and whether it found the
    pod's resize infeasible (condition ``PodResizePending``, reason ``Infeasible``)."""
    statuses = [*(status.get("containerStatuses") or ()), *(status.get("initContainerStatuses") or ())]
    by_name = {str(cs.get("name") or ""): cs for cs in statuses if isinstance(cs, Mapping)}
    infeasible = any(
        isinstance(c, Mapping) and c.get("type") == "PodResizePending" and c.get("reason") == "Infeasible"
        for c in status.get("conditions") or ()
    )
    return by_name, infeasible


def _epoch(ts: Any) -> float:
    if not isinstance(ts, str) or not ts:
        return 0.0
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _indices(text: Any) -> tuple[int, ...] | None:
    """The GPU indices of ``gpusched.io/gpu-indices`` (``"0,1"``); None unless each is a number."""
    if not isinstance(text, str) or not text.strip():
        return None
    found = [int64(x.strip()) for x in text.split(",")]
    return None if None in found else tuple(i for i in found if i is not None)


Namespaces = Mapping[str, Mapping[str, str]]
"""Labels per namespace: what a pod (anti-)affinity term's ``namespaceSelector`` picks from."""
PodGroups = Mapping[str, int]
"""The PodGroups' ``spec.minMember`` by ``namespace/name``: a gang's minimum when its pods carry
no ``gpusched.io/gang-min-members``."""


def pod_record(
    obj: Mapping[str, Any], namespaces: Namespaces | None = None, pod_groups: PodGroups | None = None
) -> PodRecord:
    """The pod's request and state.

    A pod whose request this scheduler cannot honour is still returned, with
    ``error`` saying why, so that it can be told (Event, condition) instead of
    silently ignored; a member of a gang keeps its gang, so that its peers wait for it
    and are told why.  Raises ``ConvertError`` only without a name.  ``namespaces``
    resolves the terms' ``namespaceSelector`` (None: unknown, such a term is refused);
    ``pod_groups`` gives a gang member without ``gpusched.io/gang-min-members`` its minimum
    (None, or its PodGroup not in it: 1).
    """
    meta = _meta(obj)
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
    where = f"pod {namespace}/{name}"
    # A field of the wrong JSON type is left out (what is left is still read) and told as the error.
    shape: list[str] = []
    spec = _pod_part(obj.get("spec"), where, "spec", _SPEC_LISTS, _SPEC_OBJECTS, shape)
    status = _pod_part(obj.get("status"), where, "status", _STATUS_LISTS, (), shape)
    annotations = _pod_names(meta.get("annotations"), where, "metadata.annotations", shape)
    labels = _pod_names(meta.get("labels"), where, "metadata.labels", shape)
    uid = str(meta.get("uid", ""))
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
        shape.append(f"{where}: spec.priority must be a whole number from -2^31 to 2^31-1, got {_shown(priority)}")
        priority = 0
    claims, ephemeral = _claims(name, spec)
    affinity = _affinity(spec)  # read once: the request, its fallback and the namespace selectors
    try:
        pod, error = _pod(
            name, namespace, uid, priority, spec, affinity, annotations, labels, where, namespaces, status, pod_groups
        )
        if meta.get("deletionTimestamp"):
            pod = replace(pod, terminating=True)
        if _preempted(status):
            pod = replace(pod, preempted=True)
        owner = _controller(meta)
        if owner is not None:
            kind, owner_uid = owner
            pod = replace(pod, owner=owner_uid, daemon=kind == "DaemonSet")
            if (
                annotations.get(ANNOTATION_CONSOLIDATE, "").strip().lower() == "true"
                and not pod.has_preferences
                and not _kept_from_disruption(annotations)
            ):
                pod = replace(pod, movable=True)
        if annotations.get("kubernetes.io/config.mirror"):  # a static pod, run by the kubelet itself
            pod = replace(pod, daemon=True)
        if claims:
            pod = replace(pod, claims=claims)
    except ConvertError as exc:  # kept with what others' anti-affinity and spread need of it
        anti, _ = _pod_terms(
            namespace,
            labels,
            {} if isinstance(affinity, str) else affinity.get("podAntiAffinity") or {},
            namespaces=namespaces,
        )
        gang, _ = _gang(namespace, labels, annotations, where, pod_groups)  # its peers wait for it, told why
        pod = Pod(
            name,
            0,
            0,
            namespace=namespace,
            uid=uid,
            priority=priority,
            gang=gang,
            labels=_labels(labels),
            anti_affinity=anti,
            terminating=bool(meta.get("deletionTimestamp")),
            claims=claims,
        )
        error = str(exc)
    if shape:  # the first cause: what is read beside it may be wrong for want of the field
        error = shape[0]
    return PodRecord(
        pod,
        uid=uid,
        scheduler=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=str(spec.get("nodeName") or ""),
        gpu_indices=_indices(annotations.get(ANNOTATION_GPU_INDICES)),
        resource_version=str(meta.get("resourceVersion", "")),
        created=_epoch(meta.get("creationTimestamp")),
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        deleting=bool(meta.get("deletionTimestamp")),
        error=error,
        unschedulable=(told := _unschedulable(status))[0],
        unschedulable_reason=told[1],
        nominated=str(status.get("nominatedNodeName") or ""),
        gated=bool(spec.get("schedulingGates")),
        claims=claims,
        ephemeral_claims=ephemeral,
        namespace_selectors=_namespace_selectors(affinity),
        pod_group=f"{namespace}/{_group(labels)}" if _group(labels) and ANNOTATION_GANG_MIN not in annotations else "",
    )


_SPEC_LISTS = ("containers", "initContainers", "volumes", "tolerations", "topologySpreadConstraints")
_SPEC_OBJECTS = ("nodeSelector", "overhead", "resources")
_STATUS_LISTS = ("conditions", "containerStatuses", "initContainerStatuses")


def _pod_part(
    value: Any, where: str, what: str, lists: tuple[str, ...], objects: tuple[str, ...], shape: list[str]
) -> Mapping[str, Any]:
    """A pod's ``spec`` or ``status`` (``what``) without the fields of the wrong JSON type: those
    of ``lists`` that are no list of objects, those of ``objects`` that are no object; each left
    out is told in ``shape`` (as is a ``value`` that is no object: then ``{}``)."""
    try:
        part = _object(value, where, what)
    except ConvertError as exc:
        shape.append(str(exc))
        return {}
    bad: dict[str, str] = {}
    for key in lists:
        items = part.get(key)
        if items and not (isinstance(items, list) and all(isinstance(x, Mapping) for x in items)):
            bad[key] = "a list of objects"
    for key in objects:
        if part.get(key) and not isinstance(part[key], Mapping):
            bad[key] = "an object"
    if not bad:
        return part
    shape.extend(f"{where}: {what}.{key} must be {kind}, got {_shown(part[key])}" for key, kind in bad.items())
    return {k: v for k, v in part.items() if k not in bad}


def _pod_names(value: Any, where: str, what: str, shape: list[str]) -> Mapping[str, str]:
    """A pod's labels or annotations (``what``) as ``_string_map`` reads them; one that cannot be
    read is told in ``shape``, and only its entries with string values are kept."""
    try:
        return _string_map(value, where, what)
    except ConvertError as exc:
        shape.append(str(exc))
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, Mapping) else {}


def namespace_labels(obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """A Namespace's name and labels.  Raises ``ConvertError`` without a name, or for labels that
    are no labels."""
    meta = _meta(obj)
    name = str(meta["name"])
    return name, dict(_string_map(meta.get("labels"), f"namespace {name}", "metadata.labels"))


def _namespace_selectors(affinity: dict[str, Mapping[str, Any]] | str) -> tuple[tuple[Requirement, ...], ...]:
    """The distinct ``namespaceSelector``s with requirements of a pod's (anti-)affinity terms:
    those whose result a change of namespaces' labels can move (``{}`` picks every namespace
    whatever their labels, and a malformed one is refused whatever they are).  ``affinity`` is
    what ``_affinity`` read."""
    if isinstance(affinity, str):
        return ()
    out: dict[tuple[Requirement, ...], None] = {}
    for kind in ("podAffinity", "podAntiAffinity"):
        section = affinity.get(kind) or {}
        with contextlib.suppress(ValueError):
            terms = _list(section.get("requiredDuringSchedulingIgnoredDuringExecution"), "")
            terms += [
                item.get("podAffinityTerm")
                for item in _list(section.get("preferredDuringSchedulingIgnoredDuringExecution"), "")
                if isinstance(item, Mapping)
            ]
            for t in terms:
                chosen = t.get("namespaceSelector") if isinstance(t, Mapping) else None
                if isinstance(chosen, Mapping) and _has_requirements(chosen):
                    with contextlib.suppress(ValueError):
                        selector = _selector(chosen)
                        check_label_selector(selector)
                        out[selector] = None
    return tuple(out)


def _affinity(spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]] | str:
    """The pod's ``affinity`` sections by kind (absent ones left out), or what is wrong with them."""
    try:
        affinity = _obj(spec.get("affinity"), "affinity")
        return {k: _obj(affinity.get(k), k) for k in ("nodeAffinity", "podAffinity", "podAntiAffinity")}
    except ValueError as exc:
        return str(exc)


def _claims(pod_name: str, spec: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names of the claims the pod mounts, and of those its generic ephemeral volumes create."""
    mounted: list[str] = []
    ephemeral: list[str] = []
    for v in spec.get("volumes") or ():
        if not isinstance(v, Mapping):
            continue
        pvc = v.get("persistentVolumeClaim")
        if isinstance(pvc, Mapping) and pvc.get("claimName"):
            mounted.append(str(pvc["claimName"]))
        elif isinstance(v.get("ephemeral"), Mapping) and v.get("name"):
            ephemeral.append(f"{pod_name}-{v['name']}")  # the claim the ephemeral volume controller creates
            mounted.append(ephemeral[-1])
    return tuple(dict.fromkeys(mounted)), tuple(ephemeral)


BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""The claim annotation that names the node its volume is provisioned for (kube-scheduler's
volume binding writes it; the provisioner reads it, and removes it to ask for another node)."""
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
"""The volume annotation that says its claim was written by a controller (or scheduler), not a user."""
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
"""The claim annotation that names its storage class before ``spec.storageClassName`` does."""
"""The annotation the volume controller writes on a claim with its volume's name, once it has
bound them (before the claim's phase): kube-scheduler takes a claim without it for unbound."""


def claim_record(obj: Mapping[str, Any]) -> ClaimRecord:
    """A PersistentVolumeClaim: the volume it is bound to, if any (bound as kube-scheduler reads
    it: named and the binding completed, phase written or not), and whether it is one pod's at a
    time (access mode ``ReadWriteOncePod``).  Raises ``ConvertError`` naming a field of the wrong
    JSON type."""
    meta = _meta(obj)
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    where = f"PersistentVolumeClaim {namespace}/{name}"
    spec = _object(obj.get("spec"), where, "spec")
    status = _object(obj.get("status"), where, "status")
    owners = _objects(meta.get("ownerReferences"), where, "metadata.ownerReferences")
    volume = str(spec.get("volumeName") or "")
    lost = status.get("phase") == "Lost"
    annotations = _object(meta.get("annotations"), where, "metadata.annotations")
    completed = BIND_COMPLETED in annotations
    # The annotation first, as kube-scheduler reads it.
    field = f"annotation {BETA_STORAGE_CLASS}" if BETA_STORAGE_CLASS in annotations else "spec.storageClassName"
    cls = annotations.get(BETA_STORAGE_CLASS, spec.get("storageClassName"))
    if cls is not None and not isinstance(cls, str):
        raise ConvertError(f"{where}: {field} must be a string, got {_shown(cls)}")
    selected = annotations.get(SELECTED_NODE) or ""
    if not isinstance(selected, str):
        raise ConvertError(f"{where}: annotation {SELECTED_NODE} must be a string, got {_shown(selected)}")
    requests = _object(_object(spec.get("resources"), where, "spec.resources").get("requests"), where, "requests")
    try:
        request = _bytes(requests.get("storage"))
    except QuantityError as exc:
        raise ConvertError(f"{where}: spec.resources.requests.storage: {exc}") from None
    chosen = spec.get("selector")
    selector: tuple[Requirement, ...] | None = None
    if chosen is not None:
        if not isinstance(chosen, Mapping):
            raise ConvertError(f"{where}: spec.selector must be a label selector (an object), got {_shown(chosen)}")
        try:
            selector = _selector(chosen)
            check_label_selector(selector)
        except ValueError as exc:
            raise ConvertError(f"{where}: spec.selector: {exc}") from None
    return ClaimRecord(
        namespace,
        name,
        volume=volume,
        bound=bool(volume) and completed and not lost,
        lost=lost,
        deleting=bool(meta.get("deletionTimestamp")),
        owner=next((str(o.get("uid") or "") for o in owners if o.get("controller")), ""),
        one_pod=isinstance(modes := spec.get("accessModes"), (list, tuple)) and "ReadWriteOncePod" in modes,
        storage_class=cls or "",
        selected_node=selected,
        uid=str(meta.get("uid") or ""),
        request=request,
        modes=_modes(spec.get("accessModes")),
        block=spec.get("volumeMode") == "Block",
        selector=selector,
    )


def _lenient(value: Any) -> Mapping[str, Any]:
    """``value`` if it is an object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _bytes(value: Any) -> int:
    """A storage quantity (absent: 0) in bytes, rounded up; raises ``QuantityError``."""
    return 0 if value is None else math.ceil(parse_quantity(value))


def _modes(value: Any) -> frozenset[str]:
    return frozenset(str(m) for m in value) if isinstance(value, list | tuple) else frozenset()


IN_TREE_SOURCES = {
    "awsElasticBlockStore": ("ebs.csi.aws.com", "volumeID"),
    "gcePersistentDisk": ("pd.csi.storage.gke.io", "pdName"),
    "azureDisk": ("disk.csi.azure.com", "diskURI"),
    "cinder": ("cinder.csi.openstack.org", "volumeID"),
}
"""In-tree volume sources, with the CSI driver they are migrated to and the field that names the
disk: kube-scheduler counts them against that driver's attach limit."""


def csi_node_limits(obj: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
    """A CSINode: its node's name, and how many volumes each CSI driver may attach there (a
    driver without ``allocatable.count`` has no limit and is left out).  Raises ``ConvertError``
    naming a field of the wrong JSON type."""
    meta = _meta(obj)
    name = str(meta["name"])
    where = f"CSINode {name}"
    spec = _object(obj.get("spec"), where, "spec")
    limits: dict[str, int] = {}
    for driver in _objects(spec.get("drivers"), where, "spec.drivers"):
        count = _object(driver.get("allocatable"), where, "spec.drivers.allocatable").get("count")
        if count is None:
            continue
        whole = _whole(count)
        if whole is None or whole < 0:
            raise ConvertError(f"{where}: spec.drivers.allocatable.count must be a whole number, got {_shown(count)}")
        limits[str(driver.get("name") or "")] = whole
    return name, limits


def storage_class_record(obj: Mapping[str, Any]) -> StorageClassRecord:
    """A StorageClass: its provisioner, whether it waits for the first consumer, and the nodes
    its ``allowedTopologies`` provision for (read as kube-scheduler's volume binding reads them:
    terms ORed, a term's expressions ANDed, a term without one selects nothing; one that cannot
    be read, or selects nothing, is in ``error``).  Raises ``ConvertError`` naming a field of
    the wrong JSON type."""
    meta = _meta(obj)
    name = str(meta["name"])
    where = f"StorageClass {name}"
    provisioner = obj.get("provisioner") or ""
    mode = obj.get("volumeBindingMode") or "Immediate"
    if not isinstance(provisioner, str) or not isinstance(mode, str):
        raise ConvertError(f"{where}: provisioner and volumeBindingMode must be strings")
    terms: list[tuple[Requirement, ...]] = []
    error = ""
    allowed = _objects(obj.get("allowedTopologies"), where, "allowedTopologies")
    for term in allowed:
        expressions = _objects(term.get("matchLabelExpressions"), where, "allowedTopologies.matchLabelExpressions")
        try:
            reqs = tuple(
                Requirement(str(e.get("key") or ""), "In", tuple(str(v) for v in _list(e.get("values"), "values")))
                for e in expressions
            )
        except ValueError as exc:
            error = f"allowedTopologies: {exc}"
            break
        if reqs:
            terms.append(reqs)
    if allowed and not terms and not error:
        error = "allowedTopologies has no term with an expression, so it provisions for no node"
    return StorageClassRecord(
        name, provisioner, wait_for_consumer=mode == "WaitForFirstConsumer", topology=tuple(terms), error=error
    )


def budget_record(obj: Mapping[str, Any]) -> tuple[str, Budget]:
    """A PodDisruptionBudget (``policy/v1``), by ``namespace/name``, as preemption reads it.
    Raises ``ConvertError`` for a selector it cannot read (such a budget protects no pod, as for
    kube-scheduler)."""
    meta = _meta(obj)
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    where = f"PodDisruptionBudget {namespace}/{name}"
    spec = _object(obj.get("spec"), where, "spec")
    status = _object(obj.get("status"), where, "status")
    chosen = spec.get("selector")
    if chosen is not None and not isinstance(chosen, Mapping):
        raise ConvertError(f"{where}: selector must be a label selector (an object), got {_shown(chosen)}")
    selector: tuple[Requirement, ...] = ()
    everyone = isinstance(chosen, Mapping) and not _has_requirements(chosen)
    if isinstance(chosen, Mapping):
        try:
            selector = _selector(chosen)
            check_label_selector(selector)
        except ValueError as exc:
            raise ConvertError(f"{where}: selector: {exc}") from None
    allowed = _whole(status.get("disruptionsAllowed") or 0)
    if allowed is None:
        raise ConvertError(
            f"{where}: status.disruptionsAllowed must be a whole number, got {_shown(status.get('disruptionsAllowed'))}"
        )
    disrupted = _object(status.get("disruptedPods"), where, "status.disruptedPods")
    return f"{namespace}/{name}", Budget(
        namespace, selector, allowed, frozenset(str(k) for k in disrupted), everyone=everyone
    )


def pod_group_record(obj: Mapping[str, Any]) -> tuple[str, int]:
    """A coscheduling PodGroup, by ``namespace/name``, with its ``spec.minMember`` (missing or
    below 1: 1, as the coscheduling plugin, which then waits for no other member).  Raises
    ``ConvertError`` for a minimum that is not a whole number."""
    meta = _meta(obj)
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    value = _object(obj.get("spec"), f"PodGroup {namespace}/{name}", "spec").get("minMember")
    if value is None:
        return f"{namespace}/{name}", 1
    minimum = _whole(value)
    if minimum is None:
        raise ConvertError(f"PodGroup {namespace}/{name}: spec.minMember must be a whole number, got {_shown(value)}")
    return f"{namespace}/{name}", max(1, minimum)


def _object(value: Any, where: str, what: str) -> Mapping[str, Any]:
    """``value`` as an object (absent or empty: ``{}``); raises ``ConvertError`` naming ``what``
    for a value of another JSON type (a CRD without a schema, or a newer API, can bring one)."""
    if not value:
        return {}
    if not isinstance(value, Mapping):
        raise ConvertError(f"{where}: {what} must be an object, got {_shown(value)}")
    return value


def _string_map(value: Any, where: str, what: str) -> Mapping[str, str]:
    """``value`` as labels or annotations: an object whose values are all strings (absent or
    empty: ``{}``); raises ``ConvertError`` naming ``what`` otherwise."""
    found = _object(value, where, what)
    for k, v in found.items():
        if not isinstance(v, str):
            raise ConvertError(f"{where}: {what} must map names to strings, got {k!r}: {_shown(v)}")
    return found


def _objects(value: Any, where: str, what: str) -> list[Mapping[str, Any]]:
    """``value`` as a list of objects (absent or empty: ``[]``); raises ``ConvertError`` naming
    ``what`` otherwise."""
    if not value:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(x, Mapping) for x in value):
        raise ConvertError(f"{where}: {what} must be a list of objects, got {_shown(value)}")
    return list(value)


def _whole(value: Any) -> int | None:
    """A JSON number that is a whole number (``2.0`` too) as an int; None for anything else: a
    boolean, a string, a fraction, or a float that is not finite (JSON's ``1e400`` decodes as
    infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        return None
    return int(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxdict = 4


def _shown(value: Any) -> str:
    """``value`` as an error message shows it: its ``repr``, cut short (a list or object as the
    watch brought it may be large)."""
    return _SHOWN.repr(value)


def volume_record(obj: Mapping[str, Any]) -> VolumeRecord:
    """A PersistentVolume: the nodes that can use it (``spec.nodeAffinity.required``, read as a
    pod's required node affinity is, and its zone and region labels, as kube-scheduler's
    VolumeZone reads them: ``_volume_zones``; unreadable, the reason in ``error``)."""
    meta = _meta(obj)
    name = str(meta["name"])
    spec = obj.get("spec") or {}
    labels = meta.get("labels")
    zones = _volume_zones(labels if isinstance(labels, Mapping) else {})
    try:
        affinity = _obj(_obj(spec, "spec").get("nodeAffinity") or {}, "spec.nodeAffinity")
    except ValueError as exc:  # the message names the field
        return VolumeRecord(name, error=str(exc))
    binding = _volume_binding(obj, spec, meta, labels)
    required = affinity.get("required")
    if not required:
        return replace(binding, affinity=zones)
    try:
        selector = _node_selector({}, {"requiredDuringSchedulingIgnoredDuringExecution": required})
    except ValueError as exc:
        return VolumeRecord(name, error=f"spec.nodeAffinity.required: {exc}")
    return replace(binding, affinity=both(selector, zones))


def _volume_binding(
    obj: Mapping[str, Any], spec: Mapping[str, Any], meta: Mapping[str, Any], labels: Any
) -> VolumeRecord:
    """What of a PersistentVolume matching a claim to it reads (class, capacity, access and
    volume modes, its claim, whether it is available, its labels), read leniently: a field of
    a wrong type matches no claim."""
    annotations = _lenient(meta.get("annotations"))
    cls = annotations.get(BETA_STORAGE_CLASS, spec.get("storageClassName"))
    try:
        capacity = _bytes(_lenient(spec.get("capacity")).get("storage"))
    except QuantityError:
        capacity = 0
    ref = _lenient(spec.get("claimRef"))
    csi = _lenient(spec.get("csi"))
    migrated = ("", "")
    for field, (driver, key) in IN_TREE_SOURCES.items():
        if disk := _lenient(spec.get(field)).get(key):
            migrated = (driver, str(disk))
            break
    claim = f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if ref else ""
    status = _lenient(obj.get("status"))
    return VolumeRecord(
        str(meta["name"]),
        storage_class=cls if isinstance(cls, str) else "",
        capacity=capacity,
        modes=_modes(spec.get("accessModes")),
        block=spec.get("volumeMode") == "Block",
        claim=claim,
        claim_uid=str(ref.get("uid") or ""),
        available=status.get("phase") == "Available" and not meta.get("deletionTimestamp"),
        deleting=bool(meta.get("deletionTimestamp")),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, Mapping) else (),
        version=str(meta.get("resourceVersion") or ""),
        driver=str(csi.get("driver") or "") or migrated[0],
        handle=str(csi.get("volumeHandle") or "") or migrated[1],
    )


ZONE_LABELS = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region": "topology.kubernetes.io/region",
}
"""The volume labels kube-scheduler's VolumeZone reads, each with the node label it also
matches a beta one against (a node without the beta label is read by the GA one)."""


def _volume_zones(labels: Mapping[str, Any]) -> NodeSelector:
    """The nodes a volume with ``labels`` can be used on by its zone and region labels, as
    kube-scheduler's VolumeZone reads them (``()``: every node): a node without any of
    ``ZONE_LABELS`` takes it; any other needs, for each such label of the volume, one of its
    values (``__`` parts its zones) in that label, or, for a beta label the node lacks, in the
    GA label.  A value with an empty part is left out, as VolumeZone leaves it."""
    choices: list[list[tuple[Requirement, ...]]] = []
    for key, ga in ZONE_LABELS.items():
        if key not in labels:
            continue
        values = tuple(sorted({v.strip() for v in str(labels[key]).split("__")}))
        if "" in values:
            continue
        ways: list[tuple[Requirement, ...]] = [(Requirement(key, "In", values),)]
        if ga != key:
            ways.append((Requirement(key, "DoesNotExist"), Requirement(ga, "In", values)))
        choices.append(ways)
    if not choices:
        return ()
    unlabelled = tuple(Requirement(k, "DoesNotExist") for k in ZONE_LABELS)
    return (unlabelled, *(tuple(r for way in combo for r in way) for combo in itertools.product(*choices)))


def _kept_from_disruption(annotations: Mapping[str, str]) -> bool:
    """Whether the pod asks the autoscalers not to disrupt it (the cluster autoscaler's
    ``safe-to-evict: "false"``, Karpenter's ``do-not-disrupt: "true"``): consolidation, which
    empties nodes for them, honours that over ``gpusched.io/consolidate``."""
    return (
        annotations.get("cluster-autoscaler.kubernetes.io/safe-to-evict", "").strip().lower() == "false"
        or annotations.get("karpenter.sh/do-not-disrupt", "").strip().lower() == "true"
    )


def _controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """The kind and UID of the controller that owns the object (None: none does)."""
    refs = meta.get("ownerReferences")
    for r in refs if isinstance(refs, list) else ():
        if isinstance(r, Mapping) and r.get("controller") is True:
            return str(r.get("kind") or ""), str(r.get("uid") or "")
    return None


def _preempted(status: Mapping[str, Any]) -> bool:
    """The pod carries kube-scheduler's (or gpusched's) mark of a preemption victim."""
    return any(
        isinstance(c, Mapping)
        and c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == "PreemptionByScheduler"
        for c in status.get("conditions") or ()
    )


def _unschedulable(status: Mapping[str, Any]) -> tuple[str | None, str]:
    """The message and reason of the pod's ``PodScheduled=False`` condition, as gpusched (or
    kube-scheduler) writes it on a pod it cannot place: ``(None, "")`` without one."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled":
            if c.get("status") == "False" and (reason := c.get("reason")) in HELD_REASONS:
                return str(c.get("message") or ""), str(reason)
            return None, ""
    return None, ""


def _pod(
    name: str,
    namespace: str,
    uid: str,
    priority: int,
    spec: Mapping[str, Any],
    affinity: dict[str, Mapping[str, Any]] | str,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    where: str,
    namespaces: Namespaces | None = None,
    status: Mapping[str, Any] | None = None,
    pod_groups: PodGroups | None = None,
) -> tuple[Pod, str]:
    """The request, and what about it cannot be honoured ("" when all can).

    Bad quantities raise; unsupported placement constraints only set the error, so
    that a pod bound by another scheduler is still counted with its real request.
    """
    reqs = _effective_requests(spec, where, status)
    num_gpu = reqs.get(GPU_RESOURCE, 0)
    # What this scheduler cannot honour sets ``error`` and keeps the rest of the request: a pod
    # bound by another scheduler is still counted with its CPU, memory, GPUs and slices (a share
    # it asks for wrongly is not counted: there is no telling which part of a GPU it holds).
    milli, share_error = _share(reqs, annotations, num_gpu, where)
    mig_profile, mig_held, error = _mig_request(reqs, num_gpu, where)  # against the GPUs it asks for, not its share
    if mig_profile and milli:  # the slice is what the kubelet gives it: counted, the share not
        error = error or (
            f"{where}: asks for a MIG slice ({MIG_PREFIX}{mig_profile}) and a share of a GPU "
            f"({ANNOTATION_GPU_MILLI}); a pod takes one or the other, so drop one of them"
        )
        milli = 0
    if milli and not num_gpu:
        num_gpu = 1
    elif num_gpu and not milli:
        milli = GPU_MILLI
    error = share_error or error
    island = annotations.get(ANNOTATION_GPU_ISLAND, "").strip()
    if island not in ("", "required", "preferred"):
        error = error or f"{where}: annotation {ANNOTATION_GPU_ISLAND} must be required or preferred, got {island!r}"
        island = ""
    gang, gang_error = _gang(namespace, labels, annotations, where, pod_groups)
    error = error or gang_error
    models: set[str] = set()
    text = annotations.get(ANNOTATION_GPU_MODELS, "")
    if text.strip():
        models = {m.strip() for m in text.split(",") if m.strip()}
        if not models:  # only commas: read as no restriction, it would place the pod on any model
            error = error or (
                f"{where}: annotation {ANNOTATION_GPU_MODELS}={text!r} names no GPU model; write "
                "comma-separated nvidia.com/gpu.product values (NVIDIA-A100-SXM4-80GB,...) or remove it"
            )
    selector: Mapping[str, str] = spec.get("nodeSelector") or {}
    if LABEL_GPU_PRODUCT in selector:
        product = str(selector[LABEL_GPU_PRODUCT])
        wanted = {product}  # the label's own spelling, where the annotation names it loosely
        models = wanted if not models or model_key(product) in {model_key(m) for m in models} else set()
        if not models:
            error = error or (
                f"{where}: nodeSelector {LABEL_GPU_PRODUCT}={selector[LABEL_GPU_PRODUCT]} "
                f"excludes every model in {ANNOTATION_GPU_MODELS}"
            )
    if isinstance(affinity, str):  # ``_affinity``'s reason it could not be read
        error = error or f"{where}: {affinity}"
        affinity = {}
    try:
        node_affinity = affinity.get("nodeAffinity") or {}
        node_selector = _node_selector(_obj(selector, "nodeSelector"), node_affinity)
        preferred = _preferred_nodes(node_affinity)
    except ValueError as exc:
        error = error or f"{where}: {exc}"
        node_selector, preferred = (), ()
    wished: dict[str, tuple[tuple[int, PodAffinityTerm], ...]] = {}
    for kind in ("podAffinity", "podAntiAffinity"):
        try:
            wished[kind] = _preferred_pod_terms(namespace, labels, affinity.get(kind) or {}, namespaces)
        except ValueError as exc:
            error = error or f"{where}: preferred {kind}: {exc}"
            wished[kind] = ()
    apart = wished["podAntiAffinity"]
    terms: dict[str, tuple[PodAffinityTerm, ...]] = {}
    for kind in ("podAffinity", "podAntiAffinity"):
        terms[kind], problem = _pod_terms(
            namespace, labels, affinity.get(kind) or {}, kind == "podAffinity", namespaces
        )
        if problem:
            error = error or f"{where}: required {kind}: {problem}"
    try:
        spread, wishes = _spread(namespace, labels, spec.get("topologySpreadConstraints") or ())
    except ValueError as exc:
        error = error or f"{where}: topologySpreadConstraints: {exc}"
        spread, wishes = (), ()
    soft_spread = tuple(t for _, t in wishes if all(t != mine for _, mine in apart))
    apart = tuple(dict.fromkeys((*apart, *wishes)))
    for t in spec.get("tolerations") or ():
        operator = str(t.get("operator") or "Equal") if isinstance(t, Mapping) else "Equal"
        if operator not in TOLERATION_OPERATORS:
            error = error or (
                f"{where}: tolerations: operator {operator!r} (key {str(t.get('key') or '')!r}) is not one of "
                f"{', '.join(TOLERATION_OPERATORS)}, so it tolerates no taint; fix or remove the toleration"
            )
    unknown = _unsupported_resources(spec, where)
    if unknown:
        error = error or (
            f"{where}: resources {', '.join(unknown)} are not tracked by this scheduler, so it cannot "
            "tell which nodes have them; schedule this pod with another scheduler"
        )
    claims = _resource_claims(spec)
    if claims:
        error = error or (
            f"{where}: resourceClaims {', '.join(claims)} ask for devices by dynamic resource allocation, "
            "which this scheduler does not allocate, so the pod could not start on a node it chose; "
            "schedule this pod with another scheduler"
        )
    try:
        pod = Pod(
            name,
            reqs.get("cpu", 0),
            reqs.get("memory", 0),
            num_gpu,
            milli,
            frozenset(models),
            priority,
            namespace,
            uid,
            mig_profile,
            island,
            gang,
            _tolerations(spec),
            node_selector,
            reqs.get(STORAGE_RESOURCE, 0),
            _host_ports(spec, where),
            _labels(labels),
            terms["podAntiAffinity"],
            spread,
            terms["podAffinity"],
            preferred_nodes=preferred,
            preferred_apart=apart,
            preferred_together=wished["podAffinity"],
            soft_spread=soft_spread,
            preempts=spec.get("preemptionPolicy") != "Never",
            started=_epoch((status or {}).get("startTime")) or math.inf,
            mig_held=mig_held,
        )
    except ValueError as exc:
        raise ConvertError(str(exc)) from None
    return pod, error


def _preferred_nodes(node_affinity: Mapping[str, Any]) -> Preference:
    """The preferred node affinity terms, (weight, requirements); raises ``ValueError`` for a
    malformed one.  A term without requirements matches every node, so it changes no choice."""
    out: list[tuple[int, tuple[Requirement, ...]]] = []
    for item in _list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), "preferred node affinity"):
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ValueError(f"preferred node affinity: weight must be 1..100, got {weight!r}")
        term = _obj(item.get("preference"), "preferred node affinity: preference")
        reqs = _requirements(term)
        if reqs:
            out.append((weight, reqs))
    return tuple(out)


def _requirements(term: Mapping[str, Any]) -> tuple[Requirement, ...]:
    """A node selector term's ``matchExpressions`` and ``matchFields``.  Raises ``ValueError``
    for an entry that is not shaped as the API's requirement."""
    return tuple(_expression(e) for e in _list(term.get("matchExpressions"), "matchExpressions")) + tuple(
        _expression(f, field=True) for f in _list(term.get("matchFields"), "matchFields")
    )


def _expression(e: Any, field: bool = False) -> Requirement:
    """One ``{key, operator, values}`` entry of a selector."""
    if not isinstance(e, Mapping):
        raise ValueError(f"a selector requirement must be an object with key, operator and values, got {e!r}")
    values = _strings(e.get("values"), f"values of {e.get('key')!r}")
    return Requirement(str(e.get("key") or ""), str(e.get("operator") or ""), tuple(values), field)


def _node_selector(labels: Mapping[str, Any], node_affinity: Mapping[str, Any]) -> NodeSelector:
    """``nodeSelector`` ANDed into each term of the required node affinity.  For a pod taking GPUs
    ``nvidia.com/gpu.product`` is also read as the accepted GPU models, and stays here too: the
    kubelet checks the selector, and topology spread counts only the nodes it selects.  Raises
    ``ValueError`` for a malformed selector."""
    common = tuple(Requirement(str(k), "In", (str(v),)) for k, v in sorted(labels.items()))
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return (common,) if common else ()
    terms: list[tuple[Requirement, ...]] = []
    terms_in = _list(_obj(required, "required node affinity").get("nodeSelectorTerms"), "nodeSelectorTerms")
    uncomparable = False
    for term in terms_in:
        if not isinstance(term, Mapping):
            raise ValueError("required node affinity: a nodeSelectorTerm must be an object")
        if _compares_no_number(term):  # the API server admits it; kube-scheduler skips the term
            uncomparable = True
            continue
        reqs = _requirements(term)
        if reqs:  # an empty term matches no node
            terms.append(common + reqs)
    if not terms and uncomparable:
        raise ValueError(
            "required node affinity matches no node: every nodeSelectorTerm with a requirement has a Gt or Lt "
            "whose value is not an integer, and such a term matches no node"
        )
    if not terms:
        raise ValueError("required node affinity has no nodeSelectorTerm with a requirement, so it matches no node")
    return tuple(terms)


def _compares_no_number(term: Mapping[str, Any]) -> bool:
    """Whether a node selector term has a ``Gt`` or ``Lt`` requirement whose one value is not a
    64-bit integer.  The API server admits such a term (it checks only that there is one value);
    kube-scheduler cannot parse it, so the term matches no node while the pod's other terms
    still do."""
    for e in _list(term.get("matchExpressions"), "matchExpressions"):
        if isinstance(e, Mapping) and e.get("operator") in ("Gt", "Lt"):
            values = e.get("values")
            if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) and not is_int64(values[0]):
                return True
    return False


def _pod_terms(
    namespace: str,
    labels: Mapping[str, str],
    section: Mapping[str, Any],
    follow: bool = False,
    namespaces: Namespaces | None = None,
) -> tuple[tuple[PodAffinityTerm, ...], str]:
    """The required terms of a ``podAffinity`` or ``podAntiAffinity``, as the API reads them, and
    what cannot be honoured (empty when all can).  No ``labelSelector`` selects no pod: an
    anti-affinity term is dropped, an affinity term (``follow``) can never be met.  No namespaces
    means the pod's own, an empty ``namespaceSelector`` every namespace; one with requirements
    adds the namespaces of ``namespaces`` whose labels it picks to those listed.  A term that
    cannot be read is left out, and one with a ``namespaceSelector`` with requirements when
    ``namespaces`` is unknown is kept for every namespace: a pod bound by another scheduler keeps
    others away (anti-affinity) at least as far as it asked."""
    out: dict[PodAffinityTerm, None] = {}
    problems: list[str] = []
    try:
        required = _list(section.get("requiredDuringSchedulingIgnoredDuringExecution"), "the terms")
    except ValueError as exc:
        return (), str(exc)
    for term in required:
        if not isinstance(term, Mapping):
            problems.append("a term must be an object")
            continue
        key = str(term.get("topologyKey") or "")
        if not key:
            problems.append("a term needs a topologyKey, the node label whose values are the domains")
            continue
        try:
            reqs = _label_selector(term, labels)
            if reqs is None:
                if follow:  # a term selecting no pod: nothing to follow, so no node will do
                    problems.append("a term without a labelSelector selects no pod, so no node can meet it")
                continue
            names = frozenset(_strings(term.get("namespaces"), "namespaces"))
            ns_selector = term.get("namespaceSelector")
            picked: frozenset[str] | None = names or frozenset({namespace})
            if ns_selector is not None and not isinstance(ns_selector, Mapping):
                raise ValueError("namespaceSelector must be a label selector")
            if ns_selector is not None and not _has_requirements(ns_selector):
                picked = None  # {}: every namespace
            elif ns_selector is not None and namespaces is None:
                problems.append(
                    "a namespaceSelector with requirements cannot be resolved yet (namespaces unknown); "
                    "list the namespaces in `namespaces`, or use {} for all of them"
                )
                picked = None
            elif ns_selector is not None and namespaces is not None:
                chosen = _selector(ns_selector)
                check_label_selector(chosen)  # refused even while no namespace exists
                picked = names | {
                    ns for ns, ns_labels in namespaces.items() if label_selector_selects(chosen, ns_labels)
                }
            out[PodAffinityTerm(reqs, picked, key)] = None
        except ValueError as exc:
            problems.append(str(exc))
    return tuple(out), problems[0] if problems else ""


def _preferred_pod_terms(
    namespace: str, labels: Mapping[str, str], section: Mapping[str, Any], namespaces: Namespaces | None = None
) -> tuple[tuple[int, PodAffinityTerm], ...]:
    """The preferred terms of a ``podAffinity`` or ``podAntiAffinity``, (weight, term), read as
    the required ones are (a ``namespaceSelector`` with requirements, with ``namespaces``
    unknown, counts every namespace; a term that selects no pod is left out, as it weighs
    nothing).  Raises ``ValueError`` for a bad weight or a term that cannot be read."""
    out: list[tuple[int, PodAffinityTerm]] = []
    for item in _list(section.get("preferredDuringSchedulingIgnoredDuringExecution"), "the preferred terms"):
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ValueError(f"weight must be 1..100, got {weight!r}")
        term = item.get("podAffinityTerm")
        found, problem = _pod_terms(
            namespace, labels, {"requiredDuringSchedulingIgnoredDuringExecution": [term]}, namespaces=namespaces
        )
        if problem and not found:
            raise ValueError(problem)
        out.extend((weight, t) for t in found)
    return tuple(out)


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    """``value`` as an object (absent: empty); raises ``ValueError`` naming ``what`` otherwise."""
    if not value:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be an object, got {value!r}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    """``value`` as a list (absent: empty); raises ``ValueError`` naming ``what`` otherwise."""
    if not value:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list, got {value!r}")
    return list(value)


def _strings(value: Any, what: str) -> list[str]:
    """``value`` as a list of strings; raises ``ValueError`` naming ``what`` otherwise."""
    items = _list(value, what)
    if not all(isinstance(x, str) for x in items):
        raise ValueError(f"{what} must be a list of strings, got {value!r}")
    return items


def _has_requirements(selector: Mapping[str, Any]) -> bool:
    """A label selector with ``matchLabels`` or ``matchExpressions`` (``{}`` selects everything)."""
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def _selector(selector: Mapping[str, Any]) -> tuple[Requirement, ...]:
    """A label selector's ``matchLabels`` and ``matchExpressions`` as requirements.  Raises
    ``ValueError`` for one that is not shaped as the API's ``LabelSelector``."""
    match = selector.get("matchLabels") or {}
    if not isinstance(match, Mapping):
        raise ValueError(f"matchLabels must map label keys to values, got {match!r}")
    reqs = [Requirement(str(k), "In", (str(v),)) for k, v in sorted(match.items())]
    return (*reqs, *(_expression(e) for e in _list(selector.get("matchExpressions"), "matchExpressions")))


def _labels(labels: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in labels.items())


def _label_selector(term: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[Requirement, ...] | None:
    """The term's ``labelSelector`` (None when it has none: it selects no pod), with the pod's own
    values of its ``matchLabelKeys`` (and, when given, ``mismatchLabelKeys``) added.  Raises
    ``ValueError`` for a malformed requirement."""
    chosen = term.get("labelSelector")
    if not isinstance(chosen, Mapping):
        return None
    reqs = list(_selector(chosen))
    # The API server merges these into the selector at creation; a key already there is not
    # added again, so that a label changed since does not turn the term into one selecting nothing.
    present = {r.key for r in reqs}
    for field, op in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
        reqs += [
            Requirement(str(k), op, (str(labels[k]),))
            for k in _strings(term.get(field), field)
            if k in labels and k not in present
        ]
    return tuple(reqs)


SPREAD_WISH_WEIGHT = 100
"""The preferred anti-affinity weight a ``ScheduleAnyway`` spread constraint is weighed with."""


def _spread(
    namespace: str, labels: Mapping[str, str], constraints: Any
) -> tuple[tuple[Spread, ...], tuple[tuple[int, PodAffinityTerm], ...]]:
    """The ``whenUnsatisfiable: DoNotSchedule`` constraints as the API reads them, and the
    ``ScheduleAnyway`` ones as wishes to be apart from the pods they count: a preferred pod
    anti-affinity term of weight ``SPREAD_WISH_WEIGHT`` over the constraint's key, selector and
    the pod's namespace (so each pod counted in a domain weighs against it, as kube-scheduler's
    spread score counts them; ``maxSkew`` and the node policies are not weighed).  A selector
    that is absent or empty (``{}``, with no ``matchLabelKeys`` the pod has) counts no pod, as
    kube-scheduler counts none.  Raises ``ValueError`` for a malformed one."""
    out: dict[Spread, None] = {}
    wishes: dict[tuple[int, PodAffinityTerm], None] = {}
    for c in constraints:
        if not isinstance(c, Mapping):
            raise ValueError("a constraint must be an object")
        if c.get("whenUnsatisfiable", "DoNotSchedule") == "ScheduleAnyway":
            key = str(c.get("topologyKey") or "")
            if not key:
                raise ValueError("a constraint needs a topologyKey, the node label whose values are the domains")
            reqs = _label_selector(c, labels)
            if reqs:  # no selector, or an empty one, counts no pod: nothing to weigh
                wishes[SPREAD_WISH_WEIGHT, PodAffinityTerm(reqs, frozenset({namespace}), key)] = None
            continue
        if c.get("whenUnsatisfiable", "DoNotSchedule") != "DoNotSchedule":
            raise ValueError(
                f"whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, got {c.get('whenUnsatisfiable')!r}"
            )
        policies = {}
        for field, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
            policies[field] = str(c.get(field) or default)
            if policies[field] not in ("Honor", "Ignore"):
                raise ValueError(f"{field} must be Honor or Ignore, got {policies[field]!r}")
        skew, least = c.get("maxSkew"), c.get("minDomains") or 1
        if not isinstance(skew, int) or not isinstance(least, int):
            raise ValueError(f"maxSkew and minDomains must be integers, got {skew!r} and {least!r}")
        spread = Spread(
            skew,
            str(c.get("topologyKey") or ""),
            # kube-scheduler counts no pod for an empty selector ({}), unlike a pod (anti-)affinity
            # term's, which picks every pod: such a constraint asks only for the key.
            _label_selector(c, labels) or None,
            namespace,
            least,
            policies["nodeAffinityPolicy"] == "Honor",
            policies["nodeTaintsPolicy"] == "Honor",
        )
        out[spread] = None
    return tuple(out), tuple(wishes)


def _host_ports(spec: Mapping[str, Any], where: str) -> frozenset[str]:
    """Every host port its containers and sidecars bind, as ``model.ports.host_port`` keys (the API
    server has already set ``hostPort`` for each container port of a ``hostNetwork`` pod).  Raises
    ``ConvertError`` for ``ports`` that are no list of objects."""
    containers = _containers(spec, "containers")
    containers += [(what, c) for what, c in _containers(spec, "initContainers") if c.get("restartPolicy") == "Always"]
    out: set[str] = set()
    for what, c in containers:
        for port in _objects(c.get("ports"), where, f"{what}.ports"):
            number = port.get("hostPort")
            if isinstance(number, int) and number > 0:  # the API server admits only int32 values
                out.add(host_port(str(port.get("protocol") or "TCP"), number, str(port.get("hostIP") or "")))
    return frozenset(out)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """The pod's tolerations that can matter for placement, in a canonical order."""
    out = {
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or ()
        if isinstance(t, Mapping) and (t.get("effect") or "") in ("", *_KEEP_OFF_EFFECTS, "PreferNoSchedule")
    }
    return tuple(sorted(out, key=lambda t: (t.key, t.operator, t.value, t.effect)))


_TRACKED_RESOURCES = frozenset({"cpu", "memory", STORAGE_RESOURCE, GPU_RESOURCE, ANNOTATION_GPU_MILLI})


def _unsupported_resources(spec: Mapping[str, Any], where: str) -> list[str]:
    """Requested resources that nodes are not checked for (hugepages, other extended resources), by
    a container or by the pod as a whole (``spec.resources``)."""
    names: set[str] = set()
    for what, c in [*_containers(spec, "containers"), *_containers(spec, "initContainers"), ("spec", spec)]:
        for key, value in _container_requests(c, where, what).items():
            if key not in _TRACKED_RESOURCES and not key.startswith(MIG_PREFIX) and str(value) not in ("0", ""):
                names.add(key)
    return sorted(names)


def _resource_claims(spec: Mapping[str, Any]) -> list[str]:
    """Names of the pod's ``spec.resourceClaims``: devices that must be allocated (and the pod
    reserved on the claims) before the kubelet starts it."""
    claims = spec.get("resourceClaims")
    if not isinstance(claims, (list, tuple)):
        return []
    return [str(c.get("name") or "?") for c in claims if isinstance(c, Mapping)]


def _mig_request(reqs: Mapping[str, int], num_gpu: int, where: str) -> tuple[str, tuple[tuple[str, int], ...], str]:
    """The MIG profile to count the pod on ("" when none), every slice it holds, (profile, count),
    when that is more than the profile's one, and why it cannot be scheduled ("" when it can): one
    ``nvidia.com/mig-<profile>: 1`` and no GPUs is what this scheduler places.  A pod another
    scheduler bound holds every slice it asks for, so all are kept for the books."""
    asked = {k: v for k, v in sorted(reqs.items()) if k.startswith(MIG_PREFIX) and v}
    if not asked:
        return "", (), ""
    held: dict[str, int] = {}
    malformed = ""
    for resource, count in asked.items():
        try:
            profile = profile_of(resource) or ""
        except ValueError as exc:
            malformed = malformed or f"{where}: resources {resource}: {exc}"
            continue
        held[profile] = held.get(profile, 0) + count
    if malformed:  # the slices it names rightly are still held
        return "", tuple(held.items()), malformed
    first = next(iter(held))
    if len(asked) > 1 or held[first] != 1 or num_gpu:
        error = (
            f"{where}: asks for {', '.join(f'{v} {k}' for k, v in asked.items())}"
            f"{f' and {num_gpu} {GPU_RESOURCE}' if num_gpu else ''}; a pod takes one MIG slice "
            f"(one {MIG_PREFIX}<profile>: 1) or GPUs, so split it into one pod per slice"
        )
        return ("" if num_gpu else first), tuple(held.items()), error
    return first, (), ""


def _share(reqs: Mapping[str, int], annotations: Mapping[str, str], num_gpu: int, where: str) -> tuple[int, str]:
    """The share of one GPU a pod asks for (0: none), and what is wrong with it ("" when all
    is well; the share is then 0)."""
    text = annotations.get(ANNOTATION_GPU_MILLI)
    if text is not None:
        wanted = (
            f"{where}: annotation {ANNOTATION_GPU_MILLI} must be a whole number of thousandths of a GPU, "
            f'1..{GPU_MILLI} ("500" is half a GPU), got {text!r}'
        )
        try:
            milli = _int_quantity(text, f"{where}: annotation {ANNOTATION_GPU_MILLI}")
        except ConvertError:
            return 0, wanted
        if not milli:  # 0 would silently make it a CPU-only pod
            return 0, wanted
    else:
        milli = reqs.get(ANNOTATION_GPU_MILLI, 0)
    if milli and num_gpu:
        return 0, (
            f"{where}: asks for {num_gpu} {GPU_RESOURCE} and a {ANNOTATION_GPU_MILLI} share; "
            f"use {GPU_RESOURCE} for whole GPUs or {ANNOTATION_GPU_MILLI} for a share of one GPU, not both"
        )
    if milli and not 0 < milli <= GPU_MILLI:
        return 0, f"{where}: {ANNOTATION_GPU_MILLI} must be 1..{GPU_MILLI}, got {milli}"
    return milli, ""


def gang_disagreements(pods: Iterable[Pod]) -> dict[str, str]:
    """Gangs whose members give different rules (minimum, topology key or mode), by name, with
    the message that says which members and how to fix it: a gang has one set of rules, and
    no member's may silently win over another's."""
    return {
        name: (
            f"gang {name}: its members disagree: {a.key} asks {a.gang.describe()}, {b.key} asks "
            f"{b.gang.describe()}; give every member the same {ANNOTATION_GANG_MIN}, {ANNOTATION_GANG_KEY} "
            f"and {ANNOTATION_GANG_TOPOLOGY}"
        )
        for name, (a, b) in gang_conflicts(pods).items()
        if a.gang is not None and b.gang is not None
    }


def _group(labels: Mapping[str, str]) -> str:
    """The pod group the pod's label names ("" for none)."""
    return str(labels.get(LABEL_POD_GROUP, "")).strip()


def _gang(
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    where: str,
    pod_groups: PodGroups | None = None,
) -> tuple[Gang | None, str]:
    group = _group(labels)
    keys = (ANNOTATION_GANG_MIN, ANNOTATION_GANG_KEY, ANNOTATION_GANG_TOPOLOGY)
    names = f"(annotations {', '.join(keys)})"
    if not group:
        given = [a for a in keys if a in annotations]
        if given:
            return None, (
                f"{where}: annotation {given[0]} needs the label {LABEL_POD_GROUP} naming the gang; "
                f"add the label, or remove the gang annotations {names}"
            )
        return None, ""
    # A member whose gang annotations cannot be read still belongs to the gang, so that its
    # peers wait for it and are told what is wrong with it.
    name = f"{namespace}/{group}"
    text = annotations.get(ANNOTATION_GANG_MIN)  # the annotation wins
    # Digits only, as a person writes a count: int() would also take "1_000" and other scripts' digits.
    minimum = (pod_groups or {}).get(name, 1) if text is None else int64(text.strip())
    if minimum is None:
        return Gang(name), f"{where}: annotation {ANNOTATION_GANG_MIN} must be a whole number, got {text!r}"
    key = annotations.get(ANNOTATION_GANG_KEY, "").strip()
    topology = annotations.get(ANNOTATION_GANG_TOPOLOGY, "").strip() or ("required" if key else "")
    try:
        return Gang(name, minimum, key, topology), ""
    except ValueError as exc:
        return Gang(name), f"{where}: {exc} {names}"
