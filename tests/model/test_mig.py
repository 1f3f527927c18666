"""MIG geometry: the NVIDIA tables, validity, maximal layouts, packing, labels and mig-parted configs."""

from __future__ import annotations

import re
from itertools import combinations
from typing import Any

import pytest
import yaml

from gpusched.model import Cluster, Node, Pod, mig_plan
from gpusched.model.cluster import mig_config_name
from gpusched.model.mig import (
    GEOMETRIES,
    MIG_RESOURCE_PREFIX,
    MigGeometry,
    MigLayout,
    MigProfile,
    geometry_for,
    gpu_fraction,
    mig_config,
    product_key,
    profile_of,
    resource_name,
)
from gpusched.model.tenants import demand_of

A100_40 = GEOMETRIES["A100-SXM4-40GB"]

# NVIDIA MIG User Guide, "Supported MIG Profiles" and the -lgipp placement listing:
# profile -> (compute slices, memory slices, valid start slots, GB in the name).
ONE = (0, 1, 2, 3, 4, 5, 6)
EXPECTED: dict[str, dict[str, tuple[int, int, tuple[int, ...], int]]] = {
    "A100-SXM4-40GB": {
        "1g.5gb": (1, 1, ONE, 5),
        "1g.10gb": (1, 2, (0, 2, 4, 6), 10),
        "2g.10gb": (2, 2, (0, 2, 4), 10),
        "3g.20gb": (3, 4, (0, 4), 20),
        "4g.20gb": (4, 4, (0,), 20),
        "7g.40gb": (7, 8, (0,), 40),
    },
    "A100-SXM4-80GB": {
        "1g.10gb": (1, 1, ONE, 10),
        "1g.20gb": (1, 2, (0, 2, 4, 6), 20),
        "2g.20gb": (2, 2, (0, 2, 4), 20),
        "3g.40gb": (3, 4, (0, 4), 40),
        "4g.40gb": (4, 4, (0,), 40),
        "7g.80gb": (7, 8, (0,), 80),
    },
    "H100-80GB": {
        "1g.10gb": (1, 1, ONE, 10),
        "1g.20gb": (1, 2, (0, 2, 4, 6), 20),
        "2g.20gb": (2, 2, (0, 2, 4), 20),
        "3g.40gb": (3, 4, (0, 4), 40),
        "4g.40gb": (4, 4, (0,), 40),
        "7g.80gb": (7, 8, (0,), 80),
    },
    "H200-141GB": {
        "1g.18gb": (1, 1, ONE, 18),
        "1g.35gb": (1, 2, (0, 2, 4, 6), 35),
        "2g.35gb": (2, 2, (0, 2, 4), 35),
        "3g.71gb": (3, 4, (0, 4), 71),
        "4g.71gb": (4, 4, (0,), 71),
        "7g.141gb": (7, 8, (0,), 141),
    },
}
# "Number of Instances Available" column, in the same profile order as above.
INSTANCES = (7, 4, 3, 2, 1, 1)


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_tables_match_nvidia_documentation(model: str) -> None:
    geometry = GEOMETRIES[model]
    assert (geometry.model, geometry.slots, geometry.compute) == (model, 8, 7)
    actual = {n: (p.compute, p.size, p.starts, p.memory_gb) for n, p in geometry.profiles.items()}
    assert actual == EXPECTED[model]
    assert all(name == p.name for name, p in geometry.profiles.items())


def test_only_the_four_models_and_no_media_extension_profiles() -> None:
    assert set(GEOMETRIES) == set(EXPECTED)
    assert not any("+" in name for g in GEOMETRIES.values() for name in g.profiles)


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_documented_instance_counts_are_the_most_that_fit(model: str) -> None:
    geometry = GEOMETRIES[model]
    for name, most in zip(EXPECTED[model], INSTANCES, strict=True):
        assert geometry.pack({name: most}) is not None, name
        assert geometry.pack({name: most + 1}) is None, name


@pytest.mark.parametrize(
    ("placements", "ok"),
    [
        ([("1g.5gb", s) for s in range(7)], True),
        ([("4g.20gb", 0), ("3g.20gb", 4)], True),
        ([("7g.40gb", 0)], True),
        ([("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)], True),
        ([("1g.10gb", 6), ("1g.5gb", 0)], True),
        ([], True),
        ([("4g.20gb", 0), ("4g.20gb", 0)], False),  # two 4g.20gb: only start 0 exists
        ([("4g.20gb", 0), ("4g.20gb", 4)], False),
        ([("3g.20gb", 2)], False),  # 3g starts at 0 or 4 only
        ([("1g.5gb", 7)], False),
        ([("2g.10gb", 0), ("1g.5gb", 1)], False),  # overlapping memory slices
        ([("3g.20gb", 4), ("1g.10gb", 6)], False),
        ([("7g.40gb", 0), ("1g.5gb", 3)], False),
        ([("1g.5gb", 0), ("1g.5gb", 0)], False),
        ([("7g.80gb", 0)], False),  # not an A100-40GB profile
    ],
)
def test_valid_a100_40gb(placements: list[tuple[str, int]], ok: bool) -> None:
    assert A100_40.valid(placements) is ok
    assert A100_40.valid(iter(placements)) is ok


def test_valid_rejects_more_compute_than_the_gpu_has() -> None:
    # On the real grids the memory slots run out first, so test the compute budget on a toy grid.
    toy = MigGeometry("toy", 8, 7, {"1g.1gb": MigProfile("1g.1gb", 1, 1, tuple(range(8)), 1)})
    assert toy.valid([("1g.1gb", s) for s in range(7)])
    assert not toy.valid([("1g.1gb", s) for s in range(8)])
    assert toy.pack({"1g.1gb": 8}) is None
    assert all(sum(layout.counts.values()) == 7 for layout in toy.layouts())


def test_geometry_rejects_a_profile_that_contradicts_its_name_or_the_grid() -> None:
    with pytest.raises(ValueError, match="does not match"):
        MigGeometry("bad", 8, 7, {"2g.10gb": MigProfile("2g.10gb", 1, 2, (0,), 10)})
    with pytest.raises(ValueError, match="outside"):
        MigGeometry("bad", 8, 7, {"3g.20gb": MigProfile("3g.20gb", 3, 4, (6,), 20)})


def _addable(geometry: MigGeometry, layout: MigLayout) -> list[tuple[str, int]]:
    return [
        (name, start)
        for name, profile in geometry.profiles.items()
        for start in profile.starts
        if geometry.valid([*layout.placements, (name, start)])
    ]


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_layouts_are_valid_maximal_and_distinct(model: str) -> None:
    geometry = GEOMETRIES[model]
    layouts = geometry.layouts()
    assert layouts
    for layout in layouts:
        assert geometry.valid(layout.placements), layout
        assert _addable(geometry, layout) == [], layout
    multisets = [tuple(sorted(layout.counts.items())) for layout in layouts]
    assert len(multisets) == len(set(multisets))
    assert geometry.layouts() is layouts  # cached


def test_a100_40gb_layouts_include_the_documented_ones() -> None:
    counts = [dict(layout.counts) for layout in A100_40.layouts()]
    for expected in (
        {"7g.40gb": 1},
        {"1g.5gb": 7},
        {"3g.20gb": 2},
        {"4g.20gb": 1, "3g.20gb": 1},
        {"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1},
        {"2g.10gb": 3, "1g.5gb": 1},
        {"1g.10gb": 4},
    ):
        assert expected in counts
    assert {"2g.10gb": 3} not in counts  # a 1g still fits at slot 6
    assert {"3g.20gb": 1} not in counts


def test_a100_40gb_layouts_are_every_maximal_multiset() -> None:
    # Independent brute force over sets of (profile, start).
    cands = [(n, s) for n, p in A100_40.profiles.items() for s in p.starts]
    maximal = set()
    for k in range(1, 8):
        for combo in combinations(cands, k):
            if A100_40.valid(combo) and not any(A100_40.valid([*combo, c]) for c in cands):
                maximal.add(tuple(sorted(MigLayout(combo).counts.items())))
    assert {tuple(sorted(layout.counts.items())) for layout in A100_40.layouts()} == maximal


def test_layouts_are_deterministic() -> None:
    fresh = MigGeometry(A100_40.model, 8, 7, dict(A100_40.profiles))
    assert fresh.layouts() == A100_40.layouts()
    assert fresh.layouts()[0].placements == (("7g.40gb", 0),)


@pytest.mark.parametrize(
    "counts",
    [
        {"4g.20gb": 1, "3g.20gb": 1},
        {"2g.10gb": 3, "1g.5gb": 1},
        {"1g.10gb": 3, "1g.5gb": 1},
        {"3g.20gb": 1, "1g.5gb": 4},
        {"2g.10gb": 2, "1g.10gb": 1, "1g.5gb": 2},  # the first choice of slot for 1g.10gb fails
        {"1g.5gb": 2},
        {"7g.40gb": 1, "1g.5gb": 0},
        {},
    ],
)
def test_pack_finds_a_layout_for_feasible_multisets(counts: dict[str, int]) -> None:
    layout = A100_40.pack(counts)
    assert layout is not None
    assert A100_40.valid(layout.placements)
    assert dict(layout.counts) == {n: c for n, c in counts.items() if c}


@pytest.mark.parametrize(
    "counts",
    [
        {"4g.20gb": 2},
        {"3g.20gb": 3},
        {"3g.20gb": 2, "1g.5gb": 1},
        {"7g.40gb": 1, "1g.5gb": 1},
        {"1g.5gb": 8},
        {"1g.10gb": 4, "1g.5gb": 1},
        {"4g.20gb": 1, "2g.10gb": 2},
        {"1g.18gb": 1},  # an H200 profile
    ],
)
def test_pack_returns_none_when_impossible(counts: dict[str, int]) -> None:
    assert A100_40.pack(counts) is None


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_pack_can_rebuild_every_maximal_layout(model: str) -> None:
    geometry = GEOMETRIES[model]
    for layout in geometry.layouts():
        packed = geometry.pack(layout.counts)
        assert packed is not None
        assert packed.counts == layout.counts
        assert geometry.valid(packed.placements)


def test_pack_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="negative"):
        A100_40.pack({"1g.5gb": -1})


def test_layout_is_sorted_and_read_only() -> None:
    layout = MigLayout((("3g.20gb", 4), ("1g.5gb", 1), ("1g.5gb", 0)))
    assert layout.placements == (("1g.5gb", 0), ("1g.5gb", 1), ("3g.20gb", 4))
    assert dict(layout.counts) == {"1g.5gb": 2, "3g.20gb": 1}
    with pytest.raises(TypeError):
        layout.counts["1g.5gb"] = 3  # type: ignore[index]
    with pytest.raises(TypeError):
        A100_40.profiles["x"] = A100_40.profiles["1g.5gb"]  # type: ignore[index]
    assert MigLayout((("1g.5gb", 0), ("2g.10gb", 2))) == MigLayout((("2g.10gb", 2), ("1g.5gb", 0)))


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-SXM4-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-SXM5-80GB", "H100-80GB"),
        ("NVIDIA-H100-PCIe", "H100-80GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-H200-141GB-HBM3e", "H200-141GB"),
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("a100-80gb-pcie", "A100-SXM4-80GB"),
        ("h100-pcie", "H100-80GB"),
        ("nvidia-h200", "H200-141GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "H100-80GB"),  # GFD, single MIG strategy
        ("NVIDIA-A100-SXM4-40GB-SHARED", "A100-SXM4-40GB"),
    ],
)
def test_geometry_for_product_labels(product: str, model: str) -> None:
    geometry = geometry_for(product)
    assert geometry is not None
    assert geometry is GEOMETRIES[model]


@pytest.mark.parametrize(
    "product",
    ["Tesla-T4", "NVIDIA-L4", "NVIDIA-Tesla-V100-SXM2-16GB", "NVIDIA-L40S", "NVIDIA-H100-NVL", "NVIDIA-", ""],
)
def test_geometry_for_gpus_without_a_modelled_mig_geometry(product: str) -> None:
    assert geometry_for(product) is None


def test_resource_names_round_trip() -> None:
    assert MIG_RESOURCE_PREFIX == "nvidia.com/mig-"
    assert resource_name("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert profile_of("nvidia.com/mig-1g.10gb") == "1g.10gb"
    for geometry in GEOMETRIES.values():
        for name in geometry.profiles:
            assert profile_of(resource_name(name)) == name
    # The device plugin spells a media-extension profile "+me" as ".me".
    assert resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert profile_of("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "cpu", "memory", "amd.com/gpu", "nvidia.com/mig"])
def test_profile_of_other_resources_is_none(resource: str) -> None:
    assert profile_of(resource) is None


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/mig-foo", "nvidia.com/mig-", "nvidia.com/mig-1g", "nvidia.com/mig-0g.5gb", "nvidia.com/mig-1g.5GB"],
)
def test_profile_of_malformed_mig_resource_raises(resource: str) -> None:
    with pytest.raises(ValueError, match=r"malformed MIG resource name .*expected nvidia.com/mig-"):
        profile_of(resource)


@pytest.mark.parametrize("profile", ["foo", "", "1g", "1g.5gb+xx", "nvidia.com/mig-1g.5gb"])
def test_resource_name_rejects_malformed_profiles(profile: str) -> None:
    with pytest.raises(ValueError, match="malformed MIG profile"):
        resource_name(profile)


def test_mig_config_groups_and_renders() -> None:
    gpus: dict[int, dict[str, int] | None] = {
        3: {"1g.10gb": 7},
        1: None,
        2: {"3g.40gb": 1, "1g.10gb": 1, "2g.20gb": 1},
        0: {"1g.10gb": 7, "2g.20gb": 0},
        5: None,
        4: {},
    }
    config = mig_config("gpusched", gpus)
    assert config == {
        "version": "v1",
        "mig-configs": {
            "gpusched": [
                {"devices": [0, 3], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                {"devices": [1, 5], "mig-enabled": False},
                {"devices": [2], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}},
                {"devices": [4], "mig-enabled": True, "mig-devices": {}},
            ]
        },
    }
    entries = config["mig-configs"]["gpusched"]
    assert [list(e["mig-devices"]) for e in entries if "mig-devices" in e] == [
        ["1g.10gb"],
        ["1g.10gb", "2g.20gb", "3g.40gb"],
        [],
    ]


def test_mig_config_yaml_round_trips() -> None:
    layout = GEOMETRIES["H100-80GB"].pack({"3g.40gb": 1, "2g.20gb": 1, "1g.20gb": 1})
    assert layout is not None
    config = mig_config("mixed", {0: layout.counts, 1: layout.counts, 2: None})
    text = yaml.safe_dump(config)
    assert yaml.safe_load(text) == config
    assert "mig-enabled: false" in text
    assert "1g.20gb: 1" in text


@pytest.mark.parametrize(
    ("name", "gpus", "message"),
    [
        ("", {0: None}, "name"),
        ("c", {}, "names no GPU"),  # mig-parted refuses a config without entries
        ("c", {-1: None}, "GPU index"),
        ("c", {True: None}, "GPU index"),
        ("c", {0: {"1g.10gb": -1}}, "negative"),
        ("c", {0: {"big": 1}}, "malformed MIG profile"),
    ],
)
def test_mig_config_rejects_bad_input(name: str, gpus: dict[int, dict[str, int] | None], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mig_config(name, gpus)


def _repartitionable(name: str, gpus: int, **kw: Any) -> Node:
    return Node(name, 64000, 262144, gpu_count=gpus, gpu_model="NVIDIA-H100-80GB-HBM3", mig_repartition=True, **kw)


def test_a_mig_plan_names_each_config_by_a_valid_label_value() -> None:
    long_name = "gpu-node-" + "a" * 60 + ".example.internal"  # a DNS name, too long for a label value
    cluster = Cluster([_repartitionable("n0", 1), _repartitionable(long_name, 1)])
    layout = GEOMETRIES["H100-80GB"].pack({"7g.80gb": 1})
    assert layout is not None
    doc = mig_plan(cluster, [(0, 0, layout), (1, 0, layout)])
    assert list(doc["mig-configs"]) == ["n0", mig_config_name(long_name)]
    name = mig_config_name(long_name)
    assert len(name) <= 63
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name)
    assert name != mig_config_name(long_name.replace(".example", ".example2"))  # the hash tells them apart


@pytest.mark.parametrize(
    ("node", "why"),
    [
        # GPU 0 is in MIG mode already: the whole GPU the solver numbers 0 is physical GPU 1.
        (_repartitionable("n0", 1, mig_slices=(("1g.10gb", 7),)), "and MIG slices"),
        # Feature discovery counts two GPUs, the device plugin offers one (the other unhealthy).
        (_repartitionable("n0", 1, labels={"nvidia.com/gpu.count": "2"}), "of the 2 that nvidia.com/gpu.count counts"),
    ],
)
def test_a_mig_plan_is_refused_for_a_node_whose_gpu_indices_are_not_known(node: Node, why: str) -> None:
    layout = GEOMETRIES["H100-80GB"].pack({"3g.40gb": 2})
    assert layout is not None
    with pytest.raises(ValueError, match=f"node n0: .*{why}.*wrong GPU"):
        mig_plan(Cluster([node]), [(0, 0, layout)])


def test_a_mig_plan_without_partitions_is_refused_rather_than_written_empty() -> None:
    with pytest.raises(ValueError, match="no GPU is partitioned"):
        mig_plan(Cluster([_repartitionable("n0", 1)]), [])


def test_products_are_compared_as_operators_write_them() -> None:
    assert product_key("NVIDIA-A100-SXM4-80GB") == product_key("a100-sxm4-80gb") == "A100-SXM4-80GB"
    assert product_key("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb") == "H100-80GB-HBM3"
    assert product_key("NVIDIA-A10-SHARED") == "A10"
    assert product_key("Tesla-T4") == "T4"
    assert product_key("A100-SXM4-80GB") != product_key("A100-SXM4-40GB")


@pytest.mark.parametrize(
    ("profile", "part"),
    [("1g.10gb", 1 / 7), ("3g.40gb", 3 / 7), ("7g.80gb", 1.0), ("1g.6gb", 1 / 4), ("2g.12gb", 2 / 4), ("4g.24gb", 1.0)],
)
def test_an_instance_is_the_part_of_a_gpu_its_compute_slices_are(profile: str, part: float) -> None:
    # The A30 (1g.6gb, 2g.12gb, 4g.24gb) has 4 compute slices; A100, H100 and H200 have 7.
    assert gpu_fraction(profile) == pytest.approx(part)
    assert demand_of(Pod("p", 1, 1, mig_profile=profile)) == int(1000 * part + 1e-9)
