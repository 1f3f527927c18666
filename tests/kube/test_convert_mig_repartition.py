"""Which nodes gpusched may re-partition into MIG instances: those labelled so whose GPUs it can
address, and never while the MIG manager is at work on them or after a layout of its own did not
bring instances; each refusal is a warning that names the fix."""

from __future__ import annotations

import pytest

from gpusched.kube.binder import merge_mig_configs
from gpusched.kube.convert import node_record
from tests.kube.test_convert import node_obj

A100 = "NVIDIA-A100-SXM4-80GB"
OPT_IN = {"gpusched.io/mig-repartition": "true", "nvidia.com/gpu.product": A100}


def test_an_opted_in_node_of_whole_mig_capable_gpus_may_be_repartitioned() -> None:
    rec = node_record(node_obj(labels={**OPT_IN, "nvidia.com/gpu.count": "8", "nvidia.com/mig.config": "all-disabled"}))
    assert rec.node.mig_repartition
    assert not rec.mig_warning
    rec = node_record(node_obj(labels={**OPT_IN, "nvidia.com/mig.config.state": "success"}))
    assert rec.node.mig_repartition
    assert node_record(node_obj(labels={**OPT_IN, "nvidia.com/mig.strategy": "mixed"})).node.mig_repartition
    plain = node_record(node_obj(labels={"nvidia.com/gpu.product": A100}))
    assert not plain.node.mig_repartition
    assert not plain.warning


RELABEL = "set nvidia.com/mig.config=all-disabled"
RESTART = "restart the MIG manager's pod on the node (it applies the label again as it starts)"


@pytest.mark.parametrize(
    ("labels", "gpus", "warning", "fix"),
    [
        ({"nvidia.com/gpu.product": "Tesla-T4"}, "4", "its GPUs (Tesla-T4) have no MIG mode", ""),
        ({"nvidia.com/gpu.count": "8"}, "6", "nvidia.com/gpu.count counts 8 GPUs but 6 are advertised", ""),
        (
            {"nvidia.com/mig.strategy": "single"},
            "8",
            "nvidia.com/mig.strategy=single: the device plugin would advertise its instances as nvidia.com/gpu",
            "set the GPU operator's mig.strategy to mixed",
        ),
        (
            {"nvidia.com/mig.config.state": "failed", "nvidia.com/mig.config": "x"},
            "8",
            "failed to apply",
            f"{RELABEL} or {RESTART} to offer the node again",
        ),
        (
            {"nvidia.com/mig.config.state": "failed", "nvidia.com/mig.config": "all-disabled"},
            "8",
            "failed to apply nvidia.com/mig.config=all-disabled",
            f"see its log, then {RESTART} to offer the node again",
        ),
        (
            {"nvidia.com/mig.config": "gpusched-0123456789ab"},
            "8",
            "has not applied (state unset)",
            f"{RELABEL} to offer the node again",
        ),
        (
            {"nvidia.com/mig.config": "gpusched-0123456789ab", "nvidia.com/mig.config.state": "success"},
            "8",
            "has not applied (state success)",
            f"{RELABEL} to offer the node again",
        ),
    ],
)
def test_a_node_that_cannot_be_repartitioned_says_why_and_what_would_offer_it_again(
    labels: dict[str, str], gpus: str, warning: str, fix: str
) -> None:
    rec = node_record(node_obj(gpus=gpus, labels={**OPT_IN, **labels}))
    assert not rec.node.mig_repartition
    assert warning in rec.mig_warning
    assert fix in rec.mig_warning
    if labels.get("nvidia.com/mig.config") == "all-disabled":
        assert RELABEL not in rec.mig_warning, "the label the node has already, set again, changes nothing"


@pytest.mark.parametrize("state", ["pending", "rebooting"])
def test_a_node_the_mig_manager_is_at_work_on_is_left_alone_quietly(state: str) -> None:
    rec = node_record(node_obj(labels={**OPT_IN, "nvidia.com/mig.config.state": state}))
    assert not rec.node.mig_repartition
    assert not rec.mig_warning


def test_a_node_advertising_instances_is_packed_as_it_is() -> None:
    obj = node_obj(gpus="1", labels=OPT_IN)
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    rec = node_record(obj)
    assert not rec.node.mig_repartition
    assert not rec.mig_warning
    assert rec.node.mig_slices == (("1g.10gb", 7),)


ENTRIES = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def test_merging_keeps_other_configs_and_drops_only_unused_ones_of_ours() -> None:
    text = (
        "version: v1\nmig-configs:\n  all-1g.10gb: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}]\n"
        "  gpusched-old: []\n  gpusched-used: []\n"
    )
    doc = merge_mig_configs(text, "gpusched-new", ENTRIES, keep={"gpusched-used"})
    assert set(doc["mig-configs"]) == {"all-1g.10gb", "all-disabled", "gpusched-used", "gpusched-new"}
    assert doc["mig-configs"]["gpusched-new"] == ENTRIES
    assert doc["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert doc["version"] == "v1"
    assert merge_mig_configs(None, "gpusched-new", ENTRIES, ())["mig-configs"]["gpusched-new"] == ENTRIES


@pytest.mark.parametrize(("text", "message"), [("a: [", "is not YAML"), ("- 1\n", "is not a mig-parted document")])
def test_a_document_that_is_not_mig_parted_is_not_overwritten(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        merge_mig_configs(text, "gpusched-new", ENTRIES, ())
