"""GPU nodes as the scheduler sees them: allocatable CPU, memory and GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["GPU_MILLI", "Node"]

GPU_MILLI = 1000
"""Capacity of one whole GPU in thousandths; fractional shares are carved from it."""

_EMPTY: Mapping[str, str] = MappingProxyType({})


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

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name must not be empty")
        for what, value in (
            ("cpu_milli", self.cpu_milli),
            ("memory_mib", self.memory_mib),
            ("gpu_count", self.gpu_count),
            ("gpu_memory_mib", self.gpu_memory_mib),
        ):
            if value < 0:
                raise ValueError(f"node {self.name}: {what} must not be negative, got {value}")
        if self.gpu_count and not self.gpu_model:
            raise ValueError(f"node {self.name}: has {self.gpu_count} GPUs but no GPU model")
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
