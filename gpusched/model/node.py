"""GPU nodes as the scheduler sees them: allocatable CPU, memory and GPUs."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched.model.mig import gpu_fraction

__all__ = [
    "GPU_MILLI",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_REPLICAS",
    "UNSCHEDULABLE_TAINT",
    "Node",
    "Taint",
    "booked_gpus",
    "label_number",
    "single_mig_profile",
    "slices_of",
    "whole_part",
]

GPU_MILLI = 1000
"""Capacity of one whole GPU in thousandths; fractional shares are carved from it."""

_EMPTY: Mapping[str, str] = MappingProxyType({})


LABEL_GPU_COUNT = "nvidia.com/gpu.count"
"""GPU feature discovery's count of a node's GPUs, those in MIG mode and unhealthy ones too."""

LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"
"""GPU feature discovery's count of the slices the device plugin time-slices each GPU into."""

MAX_GPUS = 64
"""GPUs one node may have (the books keep a column per GPU of the largest node)."""


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint: NoSchedule or NoExecute keep off pods that do not tolerate it,
    PreferNoSchedule only steers them elsewhere while another node fits."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{{{self.key}: {self.value}}}"


UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
"""The taint the node controller gives a cordoned node; a pod that tolerates it may still land there."""


@dataclass(frozen=True, slots=True)
class Node:
    """One schedulable node.

    GPUs on a node are of one model (as GPU feature discovery labels them with a
    single ``nvidia.com/gpu.product``); each GPU has ``GPU_MILLI`` of capacity.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False)
    gpu_islands: tuple[int, ...] = ()
    """Island id per GPU (GPUs of one NVLink domain or PCIe switch / NUMA node share an id);
    empty means one island of every GPU.  See ``gpusched.model.topology``."""
    mig_slices: tuple[tuple[str, int], ...] = ()
    """MIG instances the node advertises (``nvidia.com/mig-<profile>`` counts), on GPUs in MIG
    mode; those GPUs are not in ``gpu_count``."""
    mig_repartition: bool = False
    """Idle GPUs may be re-partitioned: the solver may choose a MIG layout for them."""
    taints: tuple[Taint, ...] = ()
    """Taints a pod must tolerate to be placed here."""
    storage_mib: int | None = None
    """Allocatable ephemeral storage, MiB; None: not metered (a simulated node), never short of it.  A
    Kubernetes node that does not report any has 0, as kube-scheduler reads it (``kube.convert``)."""
    max_pods: int | None = None
    """Allocatable pods (the kubelet's ``maxPods``); None: not metered (a simulated node).  A
    Kubernetes node that does not report any has 0, as kube-scheduler reads it (``kube.convert``)."""
    soft_taints: tuple[Taint, ...] = ()
    """PreferNoSchedule taints: pods that do not tolerate them go elsewhere when they can (the
    cluster autoscaler marks nodes it means to remove so)."""
    unschedulable: bool = False
    """Cordoned (``spec.unschedulable``): the node carries ``UNSCHEDULABLE_TAINT`` (added here when
    the node controller has not added it yet), so only pods that tolerate it are placed here, as
    kube-scheduler's NodeUnschedulable filter allows."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name must not be empty")
        for what, value in (
            ("cpu_milli", self.cpu_milli),
            ("memory_mib", self.memory_mib),
            ("gpu_count", self.gpu_count),
            ("gpu_memory_mib", self.gpu_memory_mib),
            ("storage_mib", self.storage_mib or 0),
            ("max_pods", self.max_pods or 0),
        ):
            if value < 0:
                raise ValueError(f"node {self.name}: {what} must not be negative, got {value}")
        if self.gpu_count > MAX_GPUS or any(c > MAX_GPUS * 7 for _, c in self.mig_slices):
            raise ValueError(
                f"node {self.name}: more GPUs or MIG slices than a node holds (at most {MAX_GPUS} GPUs, "
                f"7 slices each); check what its device plugin advertises"
            )
        if (self.gpu_count or self.mig_slices) and not self.gpu_model:
            raise ValueError(f"node {self.name}: has {self.gpu_count} GPUs but no GPU model")
        if self.gpu_islands and len(self.gpu_islands) != self.gpu_count:
            raise ValueError(
                f"node {self.name}: {len(self.gpu_islands)} island ids for {self.gpu_count} GPUs"
                " (give one island id per GPU)"
            )
        if any(i < 0 for i in self.gpu_islands):
            raise ValueError(f"node {self.name}: island ids must not be negative, got {list(self.gpu_islands)}")
        ids: dict[int, int] = {}
        object.__setattr__(self, "gpu_islands", tuple(ids.setdefault(i, len(ids)) for i in self.gpu_islands))
        for profile, count in self.mig_slices:
            if count < 0:
                raise ValueError(f"node {self.name}: MIG {profile} count must not be negative, got {count}")
        object.__setattr__(self, "mig_slices", tuple(sorted((p, c) for p, c in self.mig_slices if c)))
        if self.unschedulable and not any(
            t.key == UNSCHEDULABLE_TAINT.key and t.effect == UNSCHEDULABLE_TAINT.effect for t in self.taints
        ):
            object.__setattr__(self, "taints", (*self.taints, UNSCHEDULABLE_TAINT))
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def islands(self) -> tuple[int, ...]:
        """Island id per GPU, all 0 when the node describes none."""
        return self.gpu_islands or (0,) * self.gpu_count


_SINGLE_MIG = re.compile(r"-MIG-([1-9][0-9]*g\.[1-9][0-9]*gb)$", re.IGNORECASE)


def single_mig_profile(node: Node) -> str:
    """The MIG profile of the instances ``node`` advertises as ``nvidia.com/gpu`` when its GPUs
    are in MIG mode under NVIDIA's single strategy (GPU feature discovery then appends
    ``-MIG-<profile>`` to ``nvidia.com/gpu.product``, and each advertised GPU is one instance);
    "" otherwise."""
    match = _SINGLE_MIG.search(node.gpu_model) if node.gpu_count else None
    return match.group(1).lower() if match is not None else ""


def whole_part(node: Node) -> float:
    """The part of a physical GPU one of ``node``'s advertised ``nvidia.com/gpu`` is: an
    instance's compute slices' part of its GPU on a single-strategy MIG node (``1g.5gb``: a
    seventh), a slice's on a node that time-slices its GPUs, else 1."""
    profile = single_mig_profile(node)
    return gpu_fraction(profile) if profile else 1.0 / slices_of(node)


def slices_of(node: Node) -> int:
    """How many of ``node``'s advertised GPUs one physical GPU is: its ``nvidia.com/gpu.replicas``
    when the device plugin time-slices GPUs, else 1."""
    slices = label_number(node.labels.get(LABEL_GPU_REPLICAS, ""))
    return slices if slices is not None and slices > 1 else 1


def label_number(text: str) -> int | None:
    """A label's value as a whole number (a count of GPUs, a Unix time): ASCII digits, no more
    than a label value holds (63); None for anything else (``str.isdigit`` alone takes ``²``,
    which ``int`` refuses)."""
    return int(text) if len(text) <= 63 and text.isascii() and text.isdigit() else None


def booked_gpus(node: Node, physical: Collection[int]) -> frozenset[int]:
    """The GPUs of ``node`` as the books number them (as its device plugin advertises them) that
    the GPUs ``physical`` stand for, as the node numbers them (nvidia-smi, DCGM).  The same
    indices but where the device plugin time-slices: there the books' GPUs are slices, and
    which slice runs on which GPU is the device plugin's choice, so every slice when all the
    node's GPUs are of ``physical``, else none."""
    slices = slices_of(node)
    if slices == 1:
        return frozenset(physical)
    whole = node.gpu_count // slices
    return frozenset(range(node.gpu_count)) if whole and set(range(whole)) <= set(physical) else frozenset()
