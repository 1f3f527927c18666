"""Small builders shared by the unit tests."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.model import GPU_MILLI, Node, Pod


def gpu_node(name: str = "n0", gpus: int = 2, cpu: int = 8000, mem: int = 32768, model: str = "A100") -> Node:
    """A node with ``gpus`` GPUs of ``model`` (no model when it has no GPU)."""
    return Node(name, cpu, mem, gpu_count=gpus, gpu_model=model if gpus else "")


def pod(name: str, cpu: int = 1000, gpus: int = 0, milli: int = 0, models: Sequence[str] = (), mem: int = 1024) -> Pod:
    """A pod; ``gpus`` without ``milli`` means whole GPUs."""
    if gpus and not milli:
        milli = GPU_MILLI
    return Pod(name, cpu, mem, num_gpu=gpus, gpu_milli=milli, gpu_models=frozenset(models))
