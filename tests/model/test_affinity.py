"""Node selectors and required node affinity, matched as the Kubernetes API defines them."""

from __future__ import annotations

import pytest

from gpusched.model import Cluster, Node
from gpusched.model.affinity import Requirement, selects

NODE = Node(
    "gpu-7",
    8000,
    32768,
    labels={"pool": "train", "gen": "4", "zone": "a", "underscored": "1_0", "huge": "9" * 20, "signed": "-2"},
)


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (Requirement("pool", "In", ("train", "batch")), True),
        (Requirement("pool", "In", ("infer",)), False),
        (Requirement("missing", "In", ("x",)), False),
        (Requirement("pool", "NotIn", ("infer",)), True),
        (Requirement("pool", "NotIn", ("train",)), False),
        (Requirement("missing", "NotIn", ("x",)), True),  # an absent label is not in any set
        (Requirement("zone", "Exists"), True),
        (Requirement("missing", "Exists"), False),
        (Requirement("missing", "DoesNotExist"), True),
        (Requirement("zone", "DoesNotExist"), False),
        (Requirement("gen", "Gt", ("3",)), True),
        (Requirement("gen", "Gt", ("4",)), False),
        (Requirement("gen", "Lt", ("5",)), True),
        (Requirement("zone", "Lt", ("5",)), False),  # not a number: no match
        (Requirement("underscored", "Gt", ("3",)), False),  # "1_0" is not a base-10 integer to the API
        (Requirement("huge", "Gt", ("3",)), False),  # beyond int64
        (Requirement("signed", "Lt", ("0",)), True),
        (Requirement("missing", "Gt", ("0",)), False),
        (Requirement("metadata.name", "In", ("gpu-7",), field=True), True),
        (Requirement("metadata.name", "NotIn", ("gpu-7",), field=True), False),
    ],
)
def test_each_operator(req: Requirement, expected: bool) -> None:
    assert req.matches(NODE) is expected


def test_terms_are_ored_and_requirements_within_a_term_anded() -> None:
    train, infer = Requirement("pool", "In", ("train",)), Requirement("pool", "In", ("infer",))
    zone_b = Requirement("zone", "In", ("b",))
    assert selects((), NODE)
    assert selects(((train,),), NODE)
    assert not selects(((train, zone_b),), NODE)
    assert selects(((infer,), (train,)), NODE)
    assert not selects(((infer,), (zone_b,)), NODE)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "a", "operator": "Near"}, "operator 'Near' is not one of"),
        ({"key": "a", "operator": "In"}, "needs at least one value"),
        ({"key": "a", "operator": "Exists", "values": ("x",)}, "takes no values"),
        ({"key": "a", "operator": "Gt", "values": ("many",)}, "one integer value"),
        ({"key": "a", "operator": "Gt", "values": ("1", "2")}, "one integer value"),
        ({"key": "metadata.uid", "operator": "In", "values": ("x",), "field": True}, "only metadata.name"),
        ({"key": "", "operator": "Exists"}, "without a key"),
    ],
)
def test_malformed_requirements_are_rejected_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Requirement(**kwargs)  # type: ignore[arg-type]


def test_a_cluster_keeps_a_bounded_number_of_selector_masks() -> None:
    cluster = Cluster([NODE])
    for i in range(1000):  # one selector per pod, as tools that pin each pod to a host write them
        pinned = ((Requirement("metadata.name", "In", (f"host-{i}",), field=True),),)
        assert not cluster.selector_mask(pinned).any()
    assert len(cluster._selector_masks) <= 256
