"""The cost report: held GPUs priced by namespace, idle ones found by the utilisation view."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from gpusched.kube.convert import node_record, pod_record
from gpusched.metrics.cost import CostReport, Prices, cost_report, parse_prices, render_report, report_json
from gpusched.metrics.source import UtilisationView
from gpusched.model import Assignment, Cluster, Node, Pod
from gpusched.state.cache import Cache
from tests.factories import gpu_node, pod

PRICES = Prices({"A100": 3.0}, default=1.0, currency="EUR")


def on(ns: str, p: Pod) -> Pod:
    from dataclasses import replace

    return replace(p, namespace=ns)


def cluster() -> Cluster:
    mig = Node("m", 64000, 65536, gpu_count=0, gpu_model="A100", mig_slices=(("3g.40gb", 2),))
    return Cluster([gpu_node("a", gpus=4), gpu_node("t", gpus=2, model="T4"), gpu_node("idle", gpus=8), mig])


def placed() -> list[Assignment]:
    return [
        Assignment(on("train", pod("w", gpus=2)), 0, (0, 1)),
        Assignment(on("infer", pod("s1", gpus=1, milli=500)), 0, (2,)),
        Assignment(on("infer", pod("s2", gpus=1, milli=250)), 1, (0,)),
        Assignment(on("infer", Pod("slice", 100, 100, mig_profile="3g.40gb", namespace="infer")), 3, ()),
        Assignment(on("web", pod("cpu-only")), 1, ()),
    ]


def test_held_gpus_are_priced_by_namespace_dearest_first() -> None:
    r = cost_report(cluster(), placed(), PRICES)
    assert [(n.namespace, n.pods, n.gpus) for n in r.namespaces] == [("train", 1, 2.0), ("infer", 3, 0.75 + 3 / 7)]
    train, infer = r.namespaces
    assert train.per_hour == pytest.approx(6.0)
    assert infer.per_hour == pytest.approx(0.5 * 3.0 + 0.25 * 1.0 + 3 / 7 * 3.0)
    # The MIG node advertises two 3g slices, not GPUs: 6/7 of a GPU by their compute share.
    assert r.gpus_total == pytest.approx(14 + 6 / 7)
    assert r.per_hour_total == pytest.approx(4 * 3.0 + 2 * 1.0 + 8 * 3.0 + 6 / 7 * 3.0)
    assert r.per_hour_held == pytest.approx(train.per_hour + infer.per_hour)
    # a: GPU 2 half free, GPU 3 idle; t: GPU 0 three quarters free, GPU 1 free; m: one 3g slice free.
    assert r.free_gpus_in_use_nodes == pytest.approx(1.5 + 1.75 + 3 / 7)
    assert r.per_hour_free_in_use_nodes == pytest.approx(1.5 * 3.0 + 1.75 * 1.0 + 3 / 7 * 3.0)
    assert (r.idle_nodes, r.idle_node_gpus, r.per_hour_idle_nodes) == (1, 8, 24.0)  # the MIG node is in use
    assert not r.measured
    assert r.per_hour_idle_held == 0.0
    assert r.currency == "EUR"


def test_held_gpus_under_the_idle_percentage_are_idle_in_proportion() -> None:
    view = UtilisationView(0.0, {"a": {0: 1.0, 1: 80.0, 2: 4.9, 3: 0.0}, "t": {0: 5.0}, "elsewhere": {0: 0.0}})
    r = cost_report(cluster(), placed(), PRICES, view, idle_percent=5, indices_honoured=True)
    by = {n.namespace: n for n in r.namespaces}
    assert by["train"].idle_gpus == 1.0  # GPU 0 of its two
    assert by["train"].idle_per_hour == pytest.approx(3.0)
    assert by["infer"].idle_gpus == 0.5  # s1's half of GPU 2; s2's GPU is at 5.0, not under it
    assert r.per_hour_idle_held == pytest.approx(3.0 + 1.5)
    assert r.measured


def test_a_pod_the_device_plugin_put_on_other_gpus_than_booked_is_not_billed_idle_for_them() -> None:
    """NVIDIA's device plugin chooses a container's GPUs itself: the books' GPU 0 and 1 may be
    GPUs 3 and 5.  A node's idle GPUs are counted as the scheduler's gauge counts them, and split
    among its pods by what they hold."""
    eight = Cluster([gpu_node("n", gpus=8)])
    busy = dict.fromkeys(range(8), 0.0) | {3: 97.0, 5: 95.0}  # the two GPUs the job runs on
    job = [Assignment(on("train", pod("w", gpus=2)), 0, (0, 1))]
    (train,) = cost_report(eight, job, PRICES, UtilisationView(0.0, {"n": busy})).namespaces
    assert train.idle_gpus == 0.0  # by the books' indices it was billed 2 GPUs idle
    assert cost_report(eight, job, PRICES, UtilisationView(0.0, {"n": busy}), indices_honoured=True).namespaces[
        0
    ].idle_gpus == pytest.approx(2.0)
    # Two pods hold three GPUs and two are in use: one idle, split by what each holds.
    two = [*job, Assignment(on("infer", pod("s", gpus=1)), 0, (2,))]
    r = cost_report(eight, two, PRICES, UtilisationView(0.0, {"n": busy}))
    by = {n.namespace: n.idle_gpus for n in r.namespaces}
    assert by == {"train": pytest.approx(2 / 3), "infer": pytest.approx(1 / 3)}
    # GPUs the view does not name count as in use: nothing idle without a full measurement.
    assert cost_report(eight, job, PRICES, UtilisationView(0.0, {"n": {0: 0.0}})).namespaces[0].idle_gpus == 0.0


def test_the_report_as_json_and_as_a_table() -> None:
    view = UtilisationView(0.0, {"a": {0: 0.0}})
    r = cost_report(cluster(), placed(), PRICES, view, indices_honoured=True)
    out = report_json(r)
    assert out["namespaces"][0] == {
        "namespace": "train",
        "pods": 1,
        "gpus": 2.0,
        "idle_gpus": 1.0,
        "per_hour": 6.0,
        "idle_per_hour": 3.0,
    }
    assert out["per_hour_total"] == 40.57  # 38 for the whole GPUs, 18/7 for the two MIG slices
    assert out["measured"] is True
    console = Console(width=120, record=True)
    render_report(r, console)
    text = console.export_text()
    assert "GPU cost per hour (EUR)" in text
    assert "14.86 GPUs cost 40.57 EUR/h" in text
    assert "held but idle: 3.00 EUR/h" in text
    assert "nodes with no GPU held: 1 (8 GPUs), 24.00 EUR/h" in text


def test_every_gpu_count_of_the_json_report_is_given_to_thousandths() -> None:
    # One A100 node with a 3g slice held and two 1g slices nobody holds; one with a 1g slice alone.
    used = Node("m", 64000, 65536, gpu_count=0, gpu_model="A100", mig_slices=(("3g.40gb", 1), ("1g.10gb", 2)))
    unused = Node("u", 64000, 65536, gpu_count=0, gpu_model="A100", mig_slices=(("1g.10gb", 1),))
    slice_ = Pod("slice", 100, 100, mig_profile="3g.40gb", namespace="infer")
    out = report_json(cost_report(Cluster([used, unused]), [Assignment(slice_, 0, ())], PRICES))
    gpus = {k: v for k, v in out.items() if "gpus" in k}
    assert gpus == {
        "gpus_total": 0.857,  # 6/7
        "gpus_held": 0.429,  # 3/7
        "free_gpus_in_use_nodes": 0.286,  # 2/7
        "idle_node_gpus": 0.143,  # 1/7
    }
    assert (out["namespaces"][0]["gpus"], out["namespaces"][0]["per_hour"]) == (0.429, 1.29)  # money to cents


def test_a_single_strategy_mig_node_is_priced_as_its_gpu_not_as_seven() -> None:
    # One A100 in MIG mode, single strategy: GPU feature discovery labels the instances as the
    # node's GPUs, and the device plugin advertises its seven 1g.5gb instances as nvidia.com/gpu.
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "7",
        "nvidia.com/mig.strategy": "single",
    }
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "7"}
    rec = node_record({"metadata": {"name": "m", "labels": labels}, "spec": {}, "status": {"allocatable": alloc}})
    assert rec.node.gpu_count == 7  # placement still sees seven devices to give out
    prices = Prices({"NVIDIA-A100-SXM4-40GB": 3.0}, currency="EUR")
    cl = Cluster([rec.node])
    r = cost_report(cl, [], prices)
    assert (r.gpus_total, r.per_hour_total) == (pytest.approx(1.0), pytest.approx(3.0))  # one A100-hour
    assert (r.idle_nodes, r.idle_node_gpus) == (1, pytest.approx(1.0))
    view = UtilisationView(0.0, {"m": {0: 0.0, 1: 0.0}})  # the view's indices are no instance's
    r = cost_report(cl, [Assignment(on("infer", pod("i", gpus=1)), 0, (0,))], prices, view)
    (infer,) = r.namespaces
    assert (infer.gpus, infer.per_hour, infer.idle_gpus) == (pytest.approx(1 / 7), pytest.approx(3 / 7), 0.0)
    assert r.free_gpus_in_use_nodes == pytest.approx(6 / 7)
    # Tenants still count each instance whole (a pending pod does not say where it goes): told.
    assert "MIG 1g.5gb instances" in rec.warning
    assert "tenants' quotas and limits count each as a whole GPU" in rec.warning


def test_a_large_cluster_s_gpus_are_counted_in_plain_numbers() -> None:
    from dataclasses import replace

    r = replace(cost_report(cluster(), placed(), PRICES), gpus_total=10_400.0, idle_nodes=1299, idle_node_gpus=10_392.0)
    console = Console(width=120, record=True)
    render_report(r, console)
    text = console.export_text()
    assert "10,400 GPUs cost" in text
    assert "nodes with no GPU held: 1299 (10,392 GPUs)" in text


def test_prices_are_read_and_bad_ones_refused_with_the_key() -> None:
    got = parse_prices({"currency": "EUR", "default": 2, "gpuHour": {"H100-SXM5-80GB": 4.5}})
    assert got == Prices({"H100-SXM5-80GB": 4.5}, 2.0, "EUR")
    with pytest.raises(ValueError, match="prices: empty; name what the prices are in"):
        parse_prices(None)  # an empty file
    quoted = parse_prices({"currency": "USD", "default": "0.5", "gpuHour": {"T4": "1e-1"}})  # YAML: 1e-1 a string
    assert quoted == Prices({"T4": 0.1}, 0.5, "USD")
    for data, why in [
        ({"gpuHour": {"T4": "nan"}}, "prices: gpuHour.T4: expected a price per GPU-hour"),
        ({"gpuhour": {}}, "prices: gpuhour: unknown key (known here: currency, default, gpuHour)"),
        (
            {"gpuHour": {"T4": -1}},
            "prices: gpuHour.T4: expected a price per GPU-hour, a number from 0 to 1e+09, got -1",
        ),
        ({"gpuHour": {"T4": "cheap"}}, "prices: gpuHour.T4: expected a price per GPU-hour"),
        ({"default": True}, "prices: default: expected a price per GPU-hour"),
        ({"gpuHour": [1]}, "prices: gpuHour: expected a mapping of GPU product to price, got list"),
        ({"currency": 3}, "prices: currency: expected a name such as USD, got 3"),
        ({"gpuHour": {"T4": 0.5}}, "prices: currency: missing; name what the prices are in, such as currency: USD"),
        ([1, 2], "prices: expected a mapping, got list"),
        ({None: 1, 2: 3, "currency": "USD"}, "prices: 2: unknown key"),  # YAML's `~: 1` and `2: 3`
    ]:
        with pytest.raises(ValueError, match="^" + re.escape(why)):
            parse_prices(data)


def test_a_price_list_at_the_highest_price_still_gives_json() -> None:
    import json

    with pytest.raises(ValueError, match=r"^prices: default: expected a price per GPU-hour, a number from 0 to 1e\+09"):
        parse_prices({"default": 1.0e308})  # any sum of such would be no number JSON has
    prices = parse_prices({"currency": "EUR", "default": 1e9})
    big = Cluster([Node(f"n{i}", 64000, 65536, gpu_count=8, gpu_model="A100") for i in range(100)])
    out = json.dumps(report_json(cost_report(big, [], prices)))
    json.loads(out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


def test_a_price_written_without_the_makers_prefix_prices_the_labelled_product() -> None:
    # Nodes carry what GPU feature discovery writes; operators write the product's name.
    prices = Prices({"A100-SXM4-80GB": 3.0, "T4": 0.5, "H100-SXM5-80GB": 9.0}, default=1.0)
    assert prices.of("NVIDIA-A100-SXM4-80GB") == 3.0
    assert prices.of("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb") == 3.0  # a node in MIG mode (single strategy)
    assert prices.of("Tesla-T4") == 0.5
    assert prices.of("NVIDIA-A100-SXM4-40GB") == 1.0  # another product: the default
    exact = Prices({"NVIDIA-A100-SXM4-80GB": 4.0, "A100-SXM4-80GB": 3.0})
    assert exact.of("NVIDIA-A100-SXM4-80GB") == 4.0  # an exact entry wins
    assert prices.unmatched(["NVIDIA-A100-SXM4-80GB", "Tesla-T4", ""]) == ["H100-SXM5-80GB"]


@pytest.mark.parametrize("counted", [True, False])
def test_an_a30_instance_is_priced_by_the_four_compute_slices_of_its_gpu(counted: bool) -> None:
    # An A30 in MIG mode offers one 4g.24gb instance: the whole GPU, not 4/7 of one.
    labels = {"nvidia.com/gpu.count": "1"} if counted else {}
    a30 = Node("m", 64000, 65536, gpu_count=0, gpu_model="A30", mig_slices=(("4g.24gb", 1),), labels=labels)
    held = [Assignment(on("infer", Pod("slice", 100, 100, mig_profile="4g.24gb")), 0, ())]
    r = cost_report(Cluster([a30]), held, Prices({"A30": 2.0}))
    assert r.gpus_total == pytest.approx(1.0)
    assert [(n.namespace, n.gpus, n.per_hour) for n in r.namespaces] == [("infer", 1.0, 2.0)]
    assert r.free_gpus_in_use_nodes == pytest.approx(0.0)


def test_a_time_sliced_node_is_priced_by_its_gpus_not_its_slices() -> None:
    # 4 T4s, each time-sliced 4 ways: the device plugin advertises 16; four pods hold one each.
    t4 = Node("ts", 64000, 65536, gpu_count=16, gpu_model="T4", labels={"nvidia.com/gpu.replicas": "4"})
    held = [Assignment(on("infer", pod(f"p{i}", gpus=1)), 0, (i,)) for i in range(4)]
    prices = Prices({"T4": 0.35}, currency="EUR")
    r = cost_report(Cluster([t4]), held, prices)
    assert r.gpus_total == pytest.approx(4.0)
    assert r.per_hour_total == pytest.approx(4 * 0.35)
    assert [(n.gpus, n.per_hour) for n in r.namespaces] == [(pytest.approx(1.0), pytest.approx(0.35))]
    assert r.free_gpus_in_use_nodes == pytest.approx(3.0)
    # The view names the 4 GPUs, not the slices: a pod is idle only when all of them are.
    some = UtilisationView(0.0, {"ts": {0: 0.0, 1: 0.0, 2: 90.0, 3: 0.0}})
    assert cost_report(Cluster([t4]), held, prices, some).per_hour_idle_held == 0.0
    every = UtilisationView(0.0, {"ts": dict.fromkeys(range(4), 0.0)})
    assert cost_report(Cluster([t4]), held, prices, every).per_hour_idle_held == pytest.approx(0.35)


def _books(gpus: int, slices: dict[str, int], *limits: dict[str, str]) -> Cache:
    """A cache reading one A100 node ``m`` (``gpus`` whole, the rest in MIG mode offering
    ``slices``) and a pod of another scheduler bound to it per ``limits``, as the API gives them."""
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}
    alloc |= {f"nvidia.com/mig-{p}": str(n) for p, n in slices.items()}
    labels = {"nvidia.com/gpu.product": "A100-SXM4-80GB", "nvidia.com/gpu.count": str(gpus + 2)}
    node = {"metadata": {"name": "m", "labels": labels}, "spec": {}, "status": {"allocatable": alloc}}
    cache = Cache()
    cache.replace_nodes([node_record(node)])
    cache.replace_pods(
        pod_record(
            {
                "metadata": {"name": f"p{i}", "namespace": "team", "uid": f"u{i}"},
                "spec": {
                    "schedulerName": "default-scheduler",
                    "nodeName": "m",
                    "containers": [{"name": "c", "resources": {"limits": lim}}],
                },
                "status": {"phase": "Running"},
            }
        )
        for i, lim in enumerate(limits)
    )
    return cache


def _report(cache: Cache) -> CostReport:
    prices = Prices({"A100-SXM4-80GB": 3.5}, currency="USD")
    return cost_report(cache.snapshot().cluster, cache.placed(), prices, None, 5.0, cache.guessed_gpus())


@pytest.mark.parametrize(
    ("limits", "gpus", "per_hour", "free"),
    [
        ({"nvidia.com/mig-1g.10gb": "2"}, 0.286, 1.0, 2.714),  # two sevenths of a GPU
        ({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}, 0.571, 2.0, 2.429),
        ({"nvidia.com/mig-1g.10gb": "7"}, 1.0, 3.5, 2.0),  # the seven sevenths: one GPU's price
        ({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}, 1.143, 4.0, 1.857),  # a GPU and a slice
    ],
    ids=["two-1g", "1g-and-3g", "seven-1g", "gpu-and-1g"],
)
def test_a_pod_another_scheduler_bound_is_charged_every_mig_slice_it_holds(
    limits: dict[str, str], gpus: float, per_hour: float, free: float
) -> None:
    # One whole A100 and two in MIG mode: the pod holds several slices, or a GPU beside one.
    out = report_json(_report(_books(1, {"1g.10gb": 7, "3g.40gb": 1}, limits)))
    row = {"namespace": "team", "pods": 1, "gpus": gpus, "idle_gpus": 0.0, "per_hour": per_hour, "idle_per_hour": 0.0}
    assert out["namespaces"] == [row]
    assert (out["gpus_held"], out["per_hour_held"]) == (gpus, per_hour)
    assert (out["gpus_total"], out["per_hour_total"]) == (3.0, 10.5)
    assert out["free_gpus_in_use_nodes"] == free  # what it holds is not free for packing
    assert out["per_hour_free_in_use_nodes"] == round(free * 3.5, 2)


def test_a_pod_with_an_unreadable_mig_resource_is_charged_the_slice_it_holds_on_a_node_in_use() -> None:
    # Two A100s in MIG mode.  The converter refuses the pod for its malformed resource, but the
    # books hold its 1g.10gb slice: the report charges it, and the node is no spare capacity.
    bogus = {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-bogus": "1"}
    cache = _books(0, {"1g.10gb": 7}, bogus)
    console = Console(width=120, record=True)
    render_report(_report(cache), console)
    text = console.export_text()
    assert re.search(r"│ team\s+│\s+1 │\s+0\.14 │\s+- │\s+0\.50 │", text), text
    assert "held 0.14 GPUs, 0.50 USD/h" in text
    assert "free on nodes in use: 1.86 GPUs, 6.50 USD/h" in text
    assert "nodes with no GPU held: 0 (0 GPUs), 0.00 USD/h" in text


def test_gpu_nodes_the_utilisation_answer_says_nothing_of_are_named() -> None:
    from gpusched.daemon.gauges import unmeasured
    from gpusched.state.cache import Cache
    from gpusched.state.records import NodeRecord
    from tests.factories import gpu_node

    cache = Cache()
    cache.replace_nodes([NodeRecord(gpu_node(n, gpus=g)) for n, g in (("a", 2), ("b", 4), ("cpu", 0))])
    # dcgm-exporter runs on a only (its DaemonSet lacks b's toleration, say); a CPU node has no GPU to measure.
    assert unmeasured({"a": {0: 1.0}}, cache) == ["b"]
    assert unmeasured({"a": {}, "b": {}}, cache) == []
