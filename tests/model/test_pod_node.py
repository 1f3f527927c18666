"""Validation and immutability of nodes and pods."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpusched.model import GPU_MILLI, Node, Pod, PodShape


class TestNode:
    def test_defaults_to_cpu_only(self) -> None:
        n = Node("cpu-0", 4000, 8192)
        assert n.gpu_count == 0
        assert n.gpu_model == ""
        assert dict(n.labels) == {}

    @pytest.mark.parametrize("field", ["cpu_milli", "memory_mib", "gpu_count", "gpu_memory_mib"])
    def test_negative_resource_is_rejected_naming_the_field(self, field: str) -> None:
        kwargs: dict[str, Any] = {
            "cpu_milli": 1000,
            "memory_mib": 1024,
            "gpu_count": 0,
            "gpu_memory_mib": 0,
            field: -1,
        }
        with pytest.raises(ValueError, match=rf"node n1: {field} must not be negative, got -1"):
            Node("n1", **kwargs)

    def test_empty_name_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="name must not be empty"):
            Node("", 1000, 1024)

    def test_gpus_without_model_are_rejected(self) -> None:
        with pytest.raises(ValueError, match="has 2 GPUs but no GPU model"):
            Node("g1", 1000, 1024, gpu_count=2)

    def test_labels_are_a_read_only_copy(self) -> None:
        labels = {"zone": "a"}
        n = Node("n1", 1000, 1024, labels=labels)
        labels["zone"] = "b"
        assert n.labels["zone"] == "a"
        with pytest.raises(TypeError):
            n.labels["zone"] = "c"  # type: ignore[index]

    def test_is_frozen(self) -> None:
        n = Node("n1", 1000, 1024)
        with pytest.raises(dataclasses.FrozenInstanceError):
            n.cpu_milli = 5  # type: ignore[misc]

    def test_equality_and_hash_ignore_labels(self) -> None:
        a = Node("n1", 1000, 1024, 1, "A100", labels={"x": "1"})
        b = Node("n1", 1000, 1024, 1, "A100", labels={"x": "2"})
        assert a == b
        assert len({a, b}) == 1


class TestPod:
    def test_key_is_namespace_and_name(self) -> None:
        assert Pod("p", 100, 100).key == "default/p"
        assert Pod("p", 100, 100, namespace="ml").key == "ml/p"

    def test_cpu_only_pod_with_whole_gpu_share_is_normalised(self) -> None:
        p = Pod("p", 100, 100, num_gpu=0, gpu_milli=GPU_MILLI)
        assert p.gpu_milli == 0
        assert p.gpu_demand_milli == 0

    def test_gpu_share_without_a_gpu_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="gpu_milli=500 without a GPU"):
            Pod("p", 100, 100, num_gpu=0, gpu_milli=500)

    @pytest.mark.parametrize("milli", [0, -1, 1001])
    def test_gpu_share_out_of_range_is_rejected(self, milli: int) -> None:
        with pytest.raises(ValueError, match=rf"gpu_milli must be in 1..1000 per GPU, got {milli}"):
            Pod("p", 100, 100, num_gpu=1, gpu_milli=milli)

    def test_multi_gpu_pod_must_take_whole_gpus(self) -> None:
        with pytest.raises(ValueError, match="with 2 GPUs must take whole GPUs"):
            Pod("p", 100, 100, num_gpu=2, gpu_milli=500)

    def test_negative_requests_are_rejected(self) -> None:
        with pytest.raises(ValueError, match="must not be negative"):
            Pod("p", -1, 100)
        with pytest.raises(ValueError, match="must not be negative"):
            Pod("p", 1, -100)
        with pytest.raises(ValueError, match="num_gpu must not be negative"):
            Pod("p", 1, 1, num_gpu=-1, gpu_milli=1000)

    def test_error_names_the_pod(self) -> None:
        with pytest.raises(ValueError, match="pod ml/train-1:"):
            Pod("train-1", 100, 100, num_gpu=3, gpu_milli=10, namespace="ml")

    def test_fractional_and_demand(self) -> None:
        frac = Pod("f", 100, 100, num_gpu=1, gpu_milli=250)
        whole = Pod("w", 100, 100, num_gpu=1, gpu_milli=1000)
        multi = Pod("m", 100, 100, num_gpu=4, gpu_milli=1000)
        assert (frac.is_fractional, whole.is_fractional, multi.is_fractional) == (True, False, False)
        assert (frac.gpu_demand_milli, whole.gpu_demand_milli, multi.gpu_demand_milli) == (250, 1000, 4000)
        assert frac.shape.is_fractional
        assert multi.shape.gpu_demand_milli == 4000

    def test_gpu_models_become_a_frozenset(self) -> None:
        p = Pod("p", 1, 1, num_gpu=1, gpu_milli=1000, gpu_models=["A100", "V100"])  # type: ignore[arg-type]
        assert p.gpu_models == frozenset({"A100", "V100"})
        hash(p)

    def test_pods_of_one_shape_share_it(self) -> None:
        a = Pod("a", 100, 200, 1, 500, frozenset({"T4"}), priority=5)
        b = Pod("b", 100, 200, 1, 500, frozenset({"T4"}), namespace="other")
        c = Pod("c", 100, 200, 1, 600, frozenset({"T4"}))
        assert a.shape == b.shape
        assert hash(a.shape) == hash(b.shape)
        assert a.shape != c.shape
        assert a.shape == PodShape(100, 200, 1, 500, frozenset({"T4"}))

    def test_model_constraint(self) -> None:
        any_model = Pod("a", 1, 1, 1, 1000).shape
        t4_only = Pod("b", 1, 1, 1, 1000, frozenset({"T4"})).shape
        assert any_model.accepts("A100")
        assert t4_only.accepts("T4")
        assert not t4_only.accepts("A100")

    def test_is_frozen(self) -> None:
        p = Pod("p", 1, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.cpu_milli = 2  # type: ignore[misc]


def test_a_gang_beside_members_running_needs_only_the_rest_of_its_minimum() -> None:
    from gpusched.model.pod import Gang

    left = Gang("ns/g", 4, "rack", "required").beside(1, "r1")
    assert (left.min_members, left.running, left.domain) == (3, 1, "r1")
    more = left.beside(5, "r2")  # past the minimum: each member left is placed on its own, in r1 still
    assert (more.min_members, more.running, more.domain) == (1, 6, "r1")
    assert Gang("ns/g", 2).beside(0) == Gang("ns/g", 2)
