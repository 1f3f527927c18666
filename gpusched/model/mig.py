"""NVIDIA Multi-Instance GPU (MIG) geometry: profiles, placements and layouts.

The tables follow NVIDIA's *Multi-Instance GPU User Guide*: the "Supported MIG
Profiles" tables (profile names, compute and memory fractions, instance counts)
and the profile-placement figures / ``nvidia-smi mig -lgipp`` listing
(``{start,...}:size`` on the 8-slot memory-slice grid).  A GPU instance of a
profile occupies ``size`` consecutive memory slices beginning at one of its
``starts``; instances may not share a memory slice and their compute slices
may not exceed the GPU's 7.  Media-extension ("+me") profiles are left out.

Everything here is pure data and pure functions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "GEOMETRIES",
    "MIG_CONFIG_PREFIX",
    "MIG_RESOURCE_PREFIX",
    "MigGeometry",
    "MigLayout",
    "MigProfile",
    "geometry_for",
    "gpu_fraction",
    "mig_config",
    "product_key",
    "profile_of",
    "resource_name",
]

MIG_CONFIG_PREFIX = "gpusched-"
"""Names of the MIG manager configurations this scheduler writes on a live cluster."""

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_PROFILE = re.compile(r"^([1-9][0-9]*)g\.([1-9][0-9]*)gb$")
# The device plugin advertises a "+me" profile with the "+" turned into ".".
_RESOURCE_PROFILE = re.compile(r"^([1-9][0-9]*g\.[1-9][0-9]*gb)(\.me)?$")


def _parse_profile(name: str) -> tuple[int, int]:
    match = _PROFILE.match(name)
    if match is None:
        raise ValueError(f"malformed MIG profile {name!r}: expected <compute>g.<memory>gb, e.g. '1g.10gb'")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile: its compute slices and its run of memory slices."""

    name: str
    compute: int
    size: int
    starts: tuple[int, ...]
    memory_gb: int


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A set of GPU instances, each a (profile name, start slot); kept sorted."""

    placements: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", tuple(sorted(self.placements)))

    @property
    def counts(self) -> Mapping[str, int]:
        """Instances per profile, as a read-only mapping in profile-name order."""
        tally = Counter(name for name, _ in self.placements)
        return MappingProxyType(dict(sorted(tally.items())))


@dataclass(frozen=True)
class MigGeometry:
    """The MIG geometry of one GPU model."""

    model: str
    slots: int
    compute: int
    profiles: Mapping[str, MigProfile] = field(hash=False)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key, profile in self.profiles.items():
            if key != profile.name or _parse_profile(key) != (profile.compute, profile.memory_gb):
                raise ValueError(f"{self.model}: profile {key!r} does not match its name: {profile}")
            if not profile.starts or any(s < 0 or s + profile.size > self.slots for s in profile.starts):
                raise ValueError(f"{self.model}: profile {key!r} has starts outside the {self.slots}-slot grid")
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))

    def valid(self, placements: Iterable[tuple[str, int]]) -> bool:
        """Known profiles at allowed starts, no shared memory slice, compute within budget."""
        used = compute = 0
        for name, start in placements:
            profile = self.profiles.get(name)
            if profile is None or start not in profile.starts:
                return False
            mask = ((1 << profile.size) - 1) << start
            if used & mask:
                return False
            used |= mask
            compute += profile.compute
        return compute <= self.compute

    def layouts(self) -> tuple[MigLayout, ...]:
        """Every maximal valid layout, one per distinct profile multiset (the first found)."""
        cached = self._cache.get("layouts")
        if cached is None:
            # Every (profile, start, slot mask, compute), largest profiles first: a fixed search order.
            order = sorted(self.profiles.values(), key=lambda p: (-p.compute, -p.size, p.name))
            cands = [(p.name, s, ((1 << p.size) - 1) << s, p.compute) for p in order for s in p.starts]
            found: dict[tuple[tuple[str, int], ...], MigLayout] = {}

            def extend(chosen: tuple[tuple[str, int], ...], used: int, compute: int, first: int) -> None:
                fits = [i for i, c in enumerate(cands) if not used & c[2] and compute + c[3] <= self.compute]
                if not fits:  # maximal: nothing at all can be added
                    layout = MigLayout(chosen)
                    found.setdefault(tuple(layout.counts.items()), layout)
                for i in fits:
                    if i >= first:
                        name, start, mask, c = cands[i]
                        extend((*chosen, (name, start)), used | mask, compute + c, i + 1)

            extend((), 0, 0, 0)
            cached = self._cache["layouts"] = tuple(found.values())
        result: tuple[MigLayout, ...] = cached
        return result

    def pack(self, counts: Mapping[str, int]) -> MigLayout | None:
        """Place exactly the requested instances (searching starts), or None when impossible.

        A profile this GPU does not offer makes the request impossible.
        """
        if any(n < 0 for n in counts.values()):
            raise ValueError(f"instance counts must not be negative: {dict(counts)}")
        wanted = {name: n for name, n in counts.items() if n}
        if any(name not in self.profiles for name in wanted):
            return None
        items = [self.profiles[name] for name, n in wanted.items() for _ in range(n)]
        if sum(p.compute for p in items) > self.compute or sum(p.size for p in items) > self.slots:
            return None
        items.sort(key=lambda p: (-p.size, -p.compute, p.name))

        def place(i: int, used: int, chosen: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...] | None:
            if i == len(items):
                return chosen
            profile = items[i]
            # Identical instances go in increasing start order, so each set is tried once.
            low = chosen[-1][1] + 1 if i and items[i - 1] is profile else 0
            for start in profile.starts:
                mask = ((1 << profile.size) - 1) << start
                if start >= low and not used & mask:
                    done = place(i + 1, used | mask, (*chosen, (profile.name, start)))
                    if done is not None:
                        return done
            return None

        placed = place(0, 0, ())
        return None if placed is None else MigLayout(placed)


# GA100 and GH100 share one placement grid: (compute, size, starts) per profile shape.
_GRID: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (1, 2, (0, 2, 4, 6)),
    (2, 2, (0, 2, 4)),
    (3, 4, (0, 4)),
    (4, 4, (0,)),
    (7, 8, (0,)),
)


def _geometry(model: str, memory_gb: tuple[int, ...]) -> MigGeometry:
    profiles = {
        f"{c}g.{gb}gb": MigProfile(f"{c}g.{gb}gb", c, size, starts, gb)
        for (c, size, starts), gb in zip(_GRID, memory_gb, strict=True)
    }
    return MigGeometry(model=model, slots=8, compute=7, profiles=profiles)


GEOMETRIES: Mapping[str, MigGeometry] = MappingProxyType(
    {
        "A100-SXM4-40GB": _geometry("A100-SXM4-40GB", (5, 10, 10, 20, 20, 40)),
        "A100-SXM4-80GB": _geometry("A100-SXM4-80GB", (10, 20, 20, 40, 40, 80)),
        "H100-80GB": _geometry("H100-80GB", (10, 20, 20, 40, 40, 80)),
        "H200-141GB": _geometry("H200-141GB", (18, 35, 35, 71, 71, 141)),
    }
)

# nvidia.com/gpu.product spellings (upper-cased, without "NVIDIA-") -> geometry key.
_PRODUCTS: Mapping[str, str] = MappingProxyType(
    {
        alias: model
        for model, aliases in (
            ("A100-SXM4-40GB", ("A100-SXM4-40GB", "A100-PCIE-40GB")),
            ("A100-SXM4-80GB", ("A100-SXM4-80GB", "A100-80GB-PCIE", "A100-PCIE-80GB")),
            ("H100-80GB", ("H100-80GB", "H100-80GB-HBM3", "H100-SXM5-80GB", "H100-PCIE", "H100-80GB-PCIE")),
            ("H200-141GB", ("H200", "H200-141GB", "H200-141GB-HBM3E", "H200-SXM5-141GB", "H200-NVL")),
        )
        for alias in aliases
    }
)
# GPU feature discovery appends "-MIG-<profile>" (single strategy) and "-SHARED" (sharing).
_PRODUCT_SUFFIX = re.compile(r"(-MIG-[0-9]+G\.[0-9]+GB)?(-SHARED)?$")


def product_key(product: str) -> str:
    """An ``nvidia.com/gpu.product`` value, or a name a person wrote for it, as products are
    compared: upper case, without the maker's prefix (``NVIDIA-``, ``Tesla-``) and without the
    suffixes GPU feature discovery appends (``-MIG-<profile>``, ``-SHARED``).
    ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`` and ``a100-sxm4-80gb`` are one product."""
    key = _PRODUCT_SUFFIX.sub("", product.strip().upper(), count=1)
    return key.removeprefix("NVIDIA-").removeprefix("TESLA-")


def geometry_for(product: str) -> MigGeometry | None:
    """The geometry for an ``nvidia.com/gpu.product`` label value, None for a GPU without MIG."""
    model = _PRODUCTS.get(product_key(product))
    return None if model is None else GEOMETRIES[model]


# The A30's profiles: its GPU has 4 compute slices, not 7 (the "Supported MIG Profiles" table).
_FOUR_SLICE_PROFILES = frozenset({"1g.6gb", "2g.12gb", "4g.24gb"})


def gpu_fraction(profile: str) -> float:
    """The part of one GPU an instance of ``profile`` is, by its compute slices: ``3g.40gb``
    -> 3/7, and on the A30, whose GPU has 4, ``2g.12gb`` -> 2/4 (1.0 for a name that is not a
    profile)."""
    base = profile.removesuffix("+me").removesuffix(".me")
    head = base.split("g.", 1)[0]
    if not head.isdigit():
        return 1.0
    total = 4 if base in _FOUR_SLICE_PROFILES else 7
    return min(total, int(head)) / total


def resource_name(profile: str) -> str:
    """The extended resource the device plugin advertises: "1g.10gb" -> "nvidia.com/mig-1g.10gb"."""
    base = profile.removesuffix("+me")
    _parse_profile(base)
    return MIG_RESOURCE_PREFIX + base + (".me" if base != profile else "")


def profile_of(resource: str) -> str | None:
    """The MIG profile of a resource name; None if it is not a MIG resource at all."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    rest = resource.removeprefix(MIG_RESOURCE_PREFIX)
    match = _RESOURCE_PROFILE.match(rest)
    if match is None:
        raise ValueError(
            f"malformed MIG resource name {resource!r}: expected {MIG_RESOURCE_PREFIX}<compute>g.<memory>gb,"
            f" e.g. {MIG_RESOURCE_PREFIX}1g.10gb"
        )
    return match.group(1) + ("+me" if match.group(2) else "")


def mig_config(name: str, gpus: Mapping[int, Mapping[str, int] | None]) -> dict[str, Any]:
    """Render a mig-parted (NVIDIA MIG manager) v1 config with one named configuration.

    GPUs with the same layout share one entry; ``None`` disables MIG on that GPU.  A config
    names at least one GPU (mig-parted refuses an empty one).
    """
    if not name:
        raise ValueError("a MIG config needs a name")
    if not gpus:
        raise ValueError(f"MIG config {name!r} names no GPU")
    groups: dict[tuple[tuple[str, int], ...] | None, list[int]] = {}
    for index, counts in gpus.items():
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"GPU index must be a non-negative integer, got {index!r}")
        key: tuple[tuple[str, int], ...] | None = None
        if counts is not None:
            for profile, n in counts.items():
                _parse_profile(profile.removesuffix("+me"))
                if n < 0:
                    raise ValueError(f"GPU {index}: instance count of {profile!r} must not be negative, got {n}")
            key = tuple(sorted((p, n) for p, n in counts.items() if n))
        groups.setdefault(key, []).append(index)
    entries: list[dict[str, Any]] = []
    for key, devices in sorted(groups.items(), key=lambda item: min(item[1])):
        entry: dict[str, Any] = {"devices": sorted(devices), "mig-enabled": key is not None}
        if key is not None:
            entry["mig-devices"] = dict(key)
        entries.append(entry)
    return {"version": "v1", "mig-configs": {name: entries}}
