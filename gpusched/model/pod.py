"""Pods as resource requests: CPU, memory, whole GPUs or one fractional GPU share."""

from __future__ import annotations

from dataclasses import dataclass

from gpusched.model.node import GPU_MILLI

__all__ = ["Pod", "PodShape"]


@dataclass(frozen=True, slots=True)
class PodShape:
    """The part of a pod that placement depends on; pods of one shape are interchangeable."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str]

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU demand in thousandths of a GPU."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_fractional(self) -> bool:
        """True when the pod takes a share of exactly one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    def accepts(self, gpu_model: str) -> bool:
        """Whether a node with GPUs of ``gpu_model`` satisfies the model constraint."""
        return not self.gpu_models or gpu_model in self.gpu_models


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod to place.

    ``gpu_milli`` is per GPU: a fractional pod (``num_gpu == 1`` and
    ``gpu_milli < 1000``) shares one GPU with others and never spans GPUs; a
    multi-GPU pod always takes whole GPUs.  ``gpu_models`` empty means any model.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()
    priority: int = 0
    namespace: str = "default"
    uid: str = ""

    def __post_init__(self) -> None:
        where = f"pod {self.key}"
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"{where}: CPU and memory requests must not be negative")
        if self.num_gpu < 0:
            raise ValueError(f"{where}: num_gpu must not be negative, got {self.num_gpu}")
        if self.num_gpu == 0:
            if self.gpu_milli not in (0, GPU_MILLI):
                raise ValueError(f"{where}: gpu_milli={self.gpu_milli} without a GPU (num_gpu=0)")
            object.__setattr__(self, "gpu_milli", 0)
        else:
            if not 0 < self.gpu_milli <= GPU_MILLI:
                raise ValueError(f"{where}: gpu_milli must be in 1..{GPU_MILLI} per GPU, got {self.gpu_milli}")
            if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
                raise ValueError(
                    f"{where}: a pod with {self.num_gpu} GPUs must take whole GPUs "
                    f"(gpu_milli={GPU_MILLI}), got {self.gpu_milli}"
                )
        if not isinstance(self.gpu_models, frozenset):
            object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))

    @property
    def key(self) -> str:
        """``namespace/name``, unique in a cluster."""
        return f"{self.namespace}/{self.name}"

    @property
    def shape(self) -> PodShape:
        """The resource shape that placement depends on."""
        return PodShape(self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_models)

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU demand in thousandths of a GPU."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_fractional(self) -> bool:
        """True when the pod takes a share of exactly one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI
