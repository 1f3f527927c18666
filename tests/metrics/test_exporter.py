"""The scheduler's Prometheus metrics and the /metrics, /healthz and /readyz server."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess

import aiohttp
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusched.daemon.volumes import TIMED_OUT, outcome
from gpusched.kube.binder import LEAD_LOST
from gpusched.metrics import HealthServer, SchedulerMetrics
from gpusched.metrics.exporter import BATCH_SIZE_BUCKETS, VOLUME_BINDING_RESULTS

EXPECTED_FAMILIES = {
    "gpusched_batch_size": "histogram",
    "gpusched_solve_seconds": "histogram",
    "gpusched_solve_gap_ratio": "gauge",
    "gpusched_pods_scheduled": "counter",
    "gpusched_pods_unschedulable": "counter",
    "gpusched_bind_errors": "counter",
    "gpusched_pending_pods": "gauge",
    "gpusched_gpu_allocation_ratio": "gauge",
    "gpusched_gpu_fragmentation_ratio": "gauge",
    "gpusched_gpus": "gauge",
    "gpusched_gpu_nodes_active": "gauge",
    "gpusched_is_leader": "gauge",
    "gpusched_config_reloads": "counter",
}


def text(metrics: SchedulerMetrics) -> str:
    body, content_type = metrics.render()
    assert content_type == prometheus_client.CONTENT_TYPE_LATEST
    return body.decode()


def lines(metrics: SchedulerMetrics) -> set[str]:
    return set(text(metrics).splitlines())


def test_every_metric_is_exported_with_help_and_type() -> None:
    families = {f.name: f for f in text_string_to_metric_families(text(SchedulerMetrics()))}
    for name, kind in EXPECTED_FAMILIES.items():
        assert name in families, name
        assert families[name].type == kind, name
        assert families[name].documentation, name


def test_no_gauge_is_named_as_a_counter() -> None:
    """A ``_total`` suffix tells dashboards and ``rate()`` users the series is a counter."""
    m = SchedulerMetrics()
    m.set_cluster(8, 0.5, 0.25, 1)
    gauges = {f.name for f in text_string_to_metric_families(text(m)) if f.type == "gauge"}
    assert "gpusched_gpus" in gauges
    assert not {name for name in gauges if name.endswith("_total")}


def _promtool() -> str:
    """Prometheus's own linter, shipped beside it (Debian's package has both)."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool missing: bash hack/prometheus.sh installs Debian's prometheus package", pytrace=False)
        pytest.skip("no promtool on PATH (bash hack/prometheus.sh installs it)")
    return found


def test_promtool_finds_nothing_to_fix_in_a_scrape() -> None:
    m = SchedulerMetrics()
    m.set_cluster(8, 0.5, 0.25, 1)
    m.bind_error("failed")
    m.mig_repartition("success")
    checked = subprocess.run(
        [_promtool(), "check", "metrics"], input=text(m), capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_counters_carry_their_labels_and_values() -> None:
    m = SchedulerMetrics()
    m.scheduled()
    m.scheduled(3)
    m.unschedulable("insufficient_gpu", 2)
    m.unschedulable("insufficient_gpu")
    m.unschedulable("no_matching_model")
    m.bind_error("conflict")
    m.bind_error("conflict")
    m.bind_error("timeout")
    m.config_reload(ok=True)
    m.config_reload(ok=False)
    m.config_reload(ok=False)
    out = lines(m)
    assert "gpusched_pods_scheduled_total 4.0" in out
    assert 'gpusched_pods_unschedulable_total{reason="insufficient_gpu"} 3.0' in out
    assert 'gpusched_pods_unschedulable_total{reason="no_matching_model"} 1.0' in out
    assert 'gpusched_bind_errors_total{reason="conflict"} 2.0' in out
    assert 'gpusched_bind_errors_total{reason="timeout"} 1.0' in out
    assert 'gpusched_config_reloads_total{result="ok"} 1.0' in out
    assert 'gpusched_config_reloads_total{result="rejected"} 2.0' in out


def test_known_label_values_start_at_zero() -> None:
    out = lines(SchedulerMetrics())
    for queue in ("active", "backoff", "unschedulable"):
        assert f'gpusched_pending_pods{{queue="{queue}"}} 0.0' in out
    assert 'gpusched_config_reloads_total{result="ok"} 0.0' in out
    assert 'gpusched_config_reloads_total{result="rejected"} 0.0' in out
    assert "gpusched_pods_scheduled_total 0.0" in out
    assert "gpusched_is_leader 0.0" in out


def test_outcomes_that_happen_rarely_are_scraped_at_zero_before_the_first() -> None:
    """``increase()`` sees the first refused Binding, the first failed re-partition, only if
    the series was scraped before it: at 0."""
    out = lines(SchedulerMetrics())
    for reason in ("failed", "unknown", "taken"):
        assert f'gpusched_bind_errors_total{{reason="{reason}"}} 0.0' in out
    for result in ("requested", "success", "failed", "timeout", "error"):
        assert f'gpusched_mig_repartitions_total{{result="{result}"}} 0.0' in out
    for result in ("ready", "failed", "timeout", "gone", "lead_lost"):
        assert f'gpusched_volume_bindings_total{{result="{result}"}} 0.0' in out


def test_every_volume_wait_outcome_is_a_series_scraped_from_the_start() -> None:
    ends = ("", "pod deleted", LEAD_LOST, f"{TIMED_OUT} after 60 s", "claim refused")
    assert {outcome(why) for why in ends} == set(VOLUME_BINDING_RESULTS)


def test_gauges_hold_the_last_value() -> None:
    m = SchedulerMetrics()
    m.set_pending(active=5, backoff=2, unschedulable=7)
    m.set_pending(active=4, backoff=1, unschedulable=7)
    m.set_cluster(gpus=64, allocation_ratio=0.75, fragmentation_ratio=0.125, active_gpu_nodes=9)
    m.set_signals(idle_gpu_nodes=3, unschedulable_gpu_demand=2.5, kept_free=4)
    m.set_leader(True)
    out = lines(m)
    assert 'gpusched_pending_pods{queue="active"} 4.0' in out
    assert 'gpusched_pending_pods{queue="backoff"} 1.0' in out
    assert 'gpusched_pending_pods{queue="unschedulable"} 7.0' in out
    assert "gpusched_gpus 64.0" in out
    assert "gpusched_gpu_allocation_ratio 0.75" in out
    assert "gpusched_gpu_fragmentation_ratio 0.125" in out
    assert "gpusched_gpu_nodes_active 9.0" in out
    assert "gpusched_gpu_nodes_idle 3.0" in out
    assert "gpusched_unschedulable_gpu_demand 2.5" in out
    assert "gpusched_gpus_kept_free 4.0" in out
    assert "gpusched_is_leader 1.0" in out
    m.set_leader(False)
    assert "gpusched_is_leader 0.0" in lines(m)


def test_observe_batch_fills_the_histograms_and_the_gap() -> None:
    m = SchedulerMetrics()
    m.observe_batch(size=10, solve_seconds=0.2, gap_ratio=0.05)
    m.observe_batch(size=3, solve_seconds=1.5, gap_ratio=0.0)
    out = lines(m)
    assert "gpusched_batch_size_count 2.0" in out
    assert "gpusched_batch_size_sum 13.0" in out
    assert 'gpusched_batch_size_bucket{le="2.0"} 0.0' in out
    assert 'gpusched_batch_size_bucket{le="4.0"} 1.0' in out
    assert 'gpusched_batch_size_bucket{le="16.0"} 2.0' in out
    assert 'gpusched_batch_size_bucket{le="1024.0"} 2.0' in out
    assert 'gpusched_solve_seconds_bucket{le="0.25"} 1.0' in out
    assert 'gpusched_solve_seconds_bucket{le="30.0"} 2.0' in out
    assert "gpusched_solve_seconds_count 2.0" in out
    assert "gpusched_solve_gap_ratio 0.0" in out

    buckets = {
        s.labels["le"]
        for f in text_string_to_metric_families(text(m))
        if f.name == "gpusched_batch_size"
        for s in f.samples
        if s.name.endswith("_bucket")
    }
    assert buckets == {str(float(b)) for b in BATCH_SIZE_BUCKETS} | {"+Inf"}


def test_gap_may_be_nan_for_a_fallback() -> None:
    m = SchedulerMetrics()
    m.observe_batch(size=1, solve_seconds=0.01, gap_ratio=math.nan)
    assert "gpusched_solve_gap_ratio NaN" in lines(m)
    value = m.registry.get_sample_value("gpusched_solve_gap_ratio")
    assert value is not None
    assert math.isnan(value)


def test_instances_do_not_collide_or_touch_the_global_registry() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.scheduled(3)
    b.scheduled(1)
    b.bind_error("failed")
    assert "gpusched_pods_scheduled_total 3.0" in lines(a)
    assert "gpusched_pods_scheduled_total 1.0" in lines(b)
    assert 'gpusched_bind_errors_total{reason="failed"} 0.0' in lines(a)
    assert 'gpusched_bind_errors_total{reason="failed"} 1.0' in lines(b)
    assert a.registry is not b.registry
    assert prometheus_client.REGISTRY.get_sample_value("gpusched_pods_scheduled_total") is None


async def test_server_on_port_zero_serves_metrics_and_probes() -> None:
    state = {"ready": False}

    def ready() -> tuple[bool, str]:
        return (True, "") if state["ready"] else (False, "informer caches not synced")

    metrics = SchedulerMetrics()
    server = HealthServer(metrics, host="127.0.0.1", port=0, ready=ready)
    await server.start()
    try:
        assert server.running
        assert server.port > 0
        base = f"http://127.0.0.1:{server.port}"
        metrics.scheduled(3)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
                body = await resp.text()
            assert "gpusched_pods_scheduled_total 3.0" in body.splitlines()

            async with session.get(f"{base}/healthz") as resp:
                assert resp.status == 200
                assert await resp.text() == "ok"

            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                body = await resp.text()
            assert "not ready" in body
            assert "informer caches not synced" in body

            state["ready"] = True
            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 200
                assert await resp.text() == "ok"

            async with session.get(f"{base}/nope") as resp:
                assert resp.status == 404
    finally:
        await server.stop()
    assert not server.running


async def test_readiness_check_that_raises_is_not_ready() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("lease client gone")

    server = HealthServer(SchedulerMetrics(), host="127.0.0.1", port=0, ready=broken)
    await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/readyz") as resp,
        ):
            assert resp.status == 503
            assert "lease client gone" in await resp.text()
    finally:
        await server.stop()


async def test_without_a_check_the_server_is_ready() -> None:
    server = HealthServer(SchedulerMetrics(), host="127.0.0.1", port=0)
    await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/readyz") as resp,
        ):
            assert resp.status == 200
    finally:
        await server.stop()


@pytest.mark.parametrize("fixed", [True, False])
async def test_by_default_probes_are_answered_over_ipv4_and_ipv6(fixed: bool) -> None:
    # A kubelet on an IPv6-only cluster probes the pod's IPv6 address.  Port 0 picks one port,
    # the same in both families (the one the server tells).
    port = 0
    if fixed:
        with socket.socket(socket.AF_INET6) as s6, socket.socket() as s4:
            s6.bind(("::1", 0))  # a port free in both families (the server binds it in each)
            port = s6.getsockname()[1]
            s4.bind(("127.0.0.1", port))
    server = HealthServer(SchedulerMetrics(), port=port)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for host in ("127.0.0.1", "[::1]"):
                async with session.get(f"http://{host}:{server.port}/healthz") as resp:
                    assert resp.status == 200, host
    finally:
        await server.stop()


async def test_stop_is_idempotent_and_the_server_restarts() -> None:
    server = HealthServer(SchedulerMetrics(), host="127.0.0.1", port=0)
    await server.stop()
    await server.start()
    with pytest.raises(RuntimeError, match="already running"):
        await server.start()
    await server.stop()
    await server.stop()
    assert not server.running
    await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        await server.stop()
        await server.stop()


async def test_two_servers_with_their_own_metrics() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.scheduled(2)
    b.scheduled(5)
    sa = HealthServer(a, host="127.0.0.1", port=0)
    sb = HealthServer(b, host="127.0.0.1", port=0)
    await sa.start()
    await sb.start()
    try:
        assert sa.port != sb.port
        async with aiohttp.ClientSession() as session:
            for server, expected in ((sa, "2.0"), (sb, "5.0")):
                async with session.get(f"http://127.0.0.1:{server.port}/metrics") as resp:
                    body = await resp.text()
                assert f"gpusched_pods_scheduled_total {expected}" in body.splitlines()
    finally:
        await sa.stop()
        await sb.stop()


def test_reason_labels_stay_few_whatever_taint_values_and_profiles_pods_bring() -> None:
    from gpusched.metrics.exporter import SchedulerMetrics, reason_label

    assert reason_label("node(s) had untolerated taint {ToBeDeletedByClusterAutoscaler: 1796610844}") == (
        "node(s) had untolerated taint"
    )
    assert reason_label("Insufficient nvidia.com/mig-1g.10gb") == "Insufficient nvidia.com/mig-1g.10gb"
    assert reason_label("Insufficient nvidia.com/mig-9g.999gb") == "Insufficient nvidia.com/mig"
    assert reason_label("Insufficient nvidia.com/gpu") == "Insufficient nvidia.com/gpu"
    m = SchedulerMetrics()
    for stamp in range(5):
        m.unschedulable(f"node(s) had untolerated taint {{ToBeDeletedByClusterAutoscaler: {stamp}}}")
    lines = [x for x in m.render()[0].decode().splitlines() if x.startswith("gpusched_pods_unschedulable_total{")]
    assert lines == ['gpusched_pods_unschedulable_total{reason="node(s) had untolerated taint"} 5.0']


def test_the_solve_gauges_say_nothing_until_the_first_batch_of_a_term() -> None:
    from gpusched.metrics.exporter import SchedulerMetrics

    m = SchedulerMetrics()

    def read(name: str) -> str:
        return next(x for x in m.render()[0].decode().splitlines() if x.startswith(name + " ")).split()[-1]

    assert read("gpusched_solve_gap_ratio") == "NaN"
    assert read("gpusched_gpu_fragmentation_ratio") == "NaN"
    m.observe_batch(3, 0.1, 0.0)
    m.set_cluster(8, 0.5, 0.2, 1)
    assert read("gpusched_solve_gap_ratio") == "0.0"
    m.new_term()
    assert read("gpusched_gpu_fragmentation_ratio") == "NaN"
