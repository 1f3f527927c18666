"""Default GPU islands by product: one NVLink fabric for SXM boards, a half per CPU socket for
PCIe cards (NVL cards included: NVLink bridges join them in pairs, not through a switch)."""

from __future__ import annotations

import pytest

from gpusched.model.topology import default_islands

HALVES = (0,) * 4 + (1,) * 4


@pytest.mark.parametrize(
    ("product", "islands"),
    [
        ("NVIDIA-H100-80GB-HBM3", (0,) * 8),  # HGX H100, NVSwitch
        ("NVIDIA-A100-SXM4-80GB", (0,) * 8),
        ("NVIDIA-H200", (0,) * 8),  # HGX H200
        ("NVIDIA-B200", (0,) * 8),
        ("NVIDIA-H100-NVL", HALVES),  # PCIe cards, bridged in pairs
        ("NVIDIA-H200-NVL", HALVES),
        ("NVIDIA-H100-PCIe", HALVES),
        ("NVIDIA-L40S", HALVES),
    ],
)
def test_default_islands_follow_how_the_product_is_wired(product: str, islands: tuple[int, ...]) -> None:
    assert default_islands(product, 8) == islands
