"""GPU islands inside a node: which GPUs share an NVLink domain or a PCIe switch / NUMA node.

A node names its islands in the annotation ``gpusched.io/gpu-islands`` as GPU
index lists separated by ``;``, each a comma list of indices and ranges:
``0-3;4-7`` is two islands of four.  Without it the default follows the GPU
product: SXM boards (NVSwitch, every GPU reaches every other at full NVLink
bandwidth) are one island; PCIe cards in a node of four or more are split in
two halves, one per CPU socket, as the common two-socket servers wire them.
The NVL cards (``NVIDIA-H100-NVL``, ``NVIDIA-H200-NVL``) are PCIe cards joined
in pairs or fours by NVLink bridges, not by a switch: they count as PCIe cards.
"""

from __future__ import annotations

__all__ = ["ISLANDS_ANNOTATION", "default_islands", "format_islands", "parse_islands"]

ISLANDS_ANNOTATION = "gpusched.io/gpu-islands"

_ONE_FABRIC = ("SXM", "HGX", "DGX", "HBM", "GH200", "GB200", "B200", "H200")
"""Product name parts of boards whose GPUs all share one NVLink/NVSwitch fabric."""


def default_islands(product: str, gpu_count: int) -> tuple[int, ...]:
    """Island id per GPU for a node of ``gpu_count`` GPUs of ``product`` (its gpu.product label)."""
    name = product.upper()
    pcie = "PCIE" in name or name.endswith("-NVL")
    if gpu_count < 4 or (not pcie and any(part in name for part in _ONE_FABRIC)):
        return (0,) * gpu_count
    half = gpu_count // 2
    return tuple(0 if g < half else 1 for g in range(gpu_count))


def parse_islands(text: str, gpu_count: int) -> tuple[int, ...]:
    """Island id per GPU from ``0-3;4-7``; every GPU index 0..gpu_count-1 exactly once."""
    out: list[int | None] = [None] * gpu_count
    parts = [p.strip() for p in text.split(";") if p.strip()]
    if not parts:
        raise ValueError(f"{ISLANDS_ANNOTATION}={text!r}: no islands; write GPU index lists such as 0-3;4-7")
    for island, part in enumerate(parts):
        for item in part.split(","):
            lo_text, _, hi_text = item.strip().partition("-")
            try:
                lo = int(lo_text)
                hi = int(hi_text) if hi_text else lo
            except ValueError:
                raise ValueError(
                    f"{ISLANDS_ANNOTATION}={text!r}: {item.strip()!r} is not a GPU index or range such as 0-3"
                ) from None
            for g in range(lo, hi + 1):
                if not 0 <= g < gpu_count:
                    raise ValueError(f"{ISLANDS_ANNOTATION}={text!r}: GPU {g} does not exist (node has {gpu_count})")
                if out[g] is not None:
                    raise ValueError(f"{ISLANDS_ANNOTATION}={text!r}: GPU {g} is in two islands")
                out[g] = island
    missing = [g for g, i in enumerate(out) if i is None]
    if missing:
        raise ValueError(f"{ISLANDS_ANNOTATION}={text!r}: GPUs {missing} are in no island")
    return tuple(i for i in out if i is not None)


def format_islands(islands: tuple[int, ...]) -> str:
    """The annotation value for an island id per GPU (inverse of ``parse_islands``)."""
    groups: dict[int, list[int]] = {}
    for g, i in enumerate(islands):
        groups.setdefault(i, []).append(g)
    return ";".join(",".join(str(g) for g in gpus) for gpus in groups.values())
