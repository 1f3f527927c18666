"""`gpusched run` reading GPU utilisation from a real Prometheus that scrapes a DCGM-format exporter."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit
from tests.e2e.test_daemon import _metric_once
from tests.promstack import DcgmExporter, Prometheus

QUERY = "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)"
"""The latest value, not the shipped two-minute average: the test changes it and waits seconds."""


async def measure(
    dcgm: DcgmExporter, prometheus: Prometheus, node: str, value: float, pod: tuple[str, str] = ("", "")
) -> None:
    """GPU 0 of ``node`` at ``value`` %, once Prometheus has scraped it."""
    dcgm.set(node, 0, value, pod=pod)
    await asyncio.to_thread(prometheus.wait_for, f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}"}}', value)


async def test_busy_gpus_take_no_new_pods_until_they_cool_down(
    control_plane: ControlPlane, kube: Kube, namespace: str, prometheus: Prometheus, dcgm: DcgmExporter
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    hot, cool = f"hot-{name}", f"cool-{name}"
    model = "A100-SXM4-80GB"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(hot, 1, model), kit.node(cool, 1, model)])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # A share already running on hot: a new share packs beside it, while hot is not busy.
    running = kit.pod("running", "other-scheduler", milli=600, node_name=hot)
    running["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0"
    await kit.create_all(kube, pods, [running])
    await measure(dcgm, prometheus, hot, 40, (namespace, "running"))
    await measure(dcgm, prometheus, cool, 10)
    daemon = kit.Daemon.start(
        control_plane,
        name,
        "--no-leader-elect",
        "--prometheus-url",
        prometheus.url,
        "--utilisation-query",
        QUERY,
        "--utilisation-poll",
        "0.5",
    )
    try:
        port = daemon.metrics_port
        read = daemon.wait_log("GPU utilisation read")
        assert read["url"] == prometheus.url
        await kit.create_all(kube, pods, [kit.pod("share-a", name, milli=200)])
        a = await kit.wait_bound(kube, f"{pods}/share-a")
        assert a["spec"].get("nodeName") == hot

        # hot turns busy: the next share goes to cool, although hot has room left for it.
        await measure(dcgm, prometheus, hot, 97, (namespace, "running"))
        assert await _metric_once(port, "gpusched_gpus_busy", 1) == 1
        await kit.create_all(kube, pods, [kit.pod("share-b", name, milli=200)])
        b = await kit.wait_bound(kube, f"{pods}/share-b")
        assert b["spec"].get("nodeName") == cool

        # Both busy: a pod that fits on either waits, and says why.
        await measure(dcgm, prometheus, cool, 95, (namespace, "share-b"))
        assert await _metric_once(port, "gpusched_gpus_busy", 2) == 2
        await kit.create_all(kube, pods, [kit.pod("share-c", name, milli=100)])
        (c,) = [p for p in await kit.wait_settled(kube, namespace, 4) if p["metadata"]["name"] == "share-c"]
        assert not c["spec"].get("nodeName")
        message = (kit.condition(c) or {}).get("message", "")
        assert message.endswith(
            "; 2 GPUs with room for it were not offered: busy, at 90 % utilisation or more (DCGM)."
        ), message
        events = await kit.wait_events(kube, namespace, ["FailedScheduling/share-c"])
        assert events["FailedScheduling/share-c"][0]["message"] == message

        # hot cools down: the waiting pod is drawn again at once (no cluster event is needed) and bound.
        started = time.monotonic()
        dcgm.set(hot, 0, 0, pod=(namespace, "running"))
        c = await kit.wait_bound(kube, f"{pods}/share-c", timeout=30)
        assert c["spec"].get("nodeName") == hot, time.monotonic() - started
        daemon.wait_log("GPUs no longer busy; unschedulable pods drawn again")
        # hot holds three pods and is idle; cool is busy: one GPU is held idle.
        assert await _metric_once(port, "gpusched_gpus_allocated_idle", 1) == 1
        assert await _metric_once(port, "gpusched_gpus_busy", 1) == 1
        settled = await kit.list_all(kube, pods)
        nodes = await kit.list_all(kube, "/api/v1/nodes")
        kit.check_placements(nodes, settled)
    finally:
        daemon.stop()
        dcgm.drop(hot)
        dcgm.drop(cool)


async def test_a_prometheus_that_is_down_leaves_placement_as_it_would_be(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    from tests.promstack import free_port

    name = f"gs-{uuid.uuid4().hex[:8]}"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"n-{name}", 1, "A100-SXM4-80GB")])
    url = f"http://127.0.0.1:{free_port()}"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--prometheus-url", url)
    try:
        warned = daemon.wait_log("GPU utilisation not read; the last answer is used until it is too old")
        assert warned["cause"].startswith(f"cannot read GPU utilisation from {url}: ConnectionError")
        assert await _metric_once(daemon.metrics_port, 'gpusched_utilisation_polls_total{result="error"}', 1) == 1
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [kit.pod("p", name, gpus=1)])
        p = await kit.wait_bound(kube, f"/api/v1/namespaces/{namespace}/pods/p")
        assert p["spec"].get("nodeName") == f"n-{name}"
    finally:
        daemon.stop()


async def test_the_cost_report_prices_what_each_namespace_holds_and_finds_it_idle(
    control_plane: ControlPlane, kube: Kube, namespace: str, prometheus: Prometheus, dcgm: DcgmExporter, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    busy, spare = f"busy-{tag}", f"spare-{tag}"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(busy, 4, "A100-SXM4-80GB"), kit.node(spare, 2, "T4")])
    train = kit.pod("train", "other-scheduler", gpus=2, node_name=busy)
    train["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0,1"
    share = kit.pod("share", "other-scheduler", milli=500, node_name=busy)
    share["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "2"
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [train, share])
    await measure(dcgm, prometheus, busy, 0, (namespace, "train"))  # GPU 0: idle
    dcgm.set(busy, 1, 80, pod=(namespace, "train"))
    dcgm.set(busy, 2, 60, pod=(namespace, "share"))
    dcgm.set(busy, 3, 0)  # held by nobody: dcgm-exporter reports every GPU of its node
    await asyncio.to_thread(prometheus.wait_for, f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{busy}",gpu="3"}}', 0)
    await asyncio.to_thread(prometheus.wait_for, f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{busy}",gpu="2"}}', 60)
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\ngpuHour:\n  A100-SXM4-80GB: 3.0\n  T4: 0.5\n")
    argv = [sys.executable, "-m", "gpusched", "report", "--kubeconfig", str(control_plane.scheduler_kubeconfig)]
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [
                *argv,
                "--prices",
                str(prices),
                "--prometheus-url",
                prometheus.url,
                "--utilisation-query",
                QUERY,
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=kit.repo_file(),
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["namespaces"] == [
            {"namespace": namespace, "pods": 2, "gpus": 2.5, "idle_gpus": 1.0, "per_hour": 7.5, "idle_per_hour": 3.0}
        ]
        assert (report["gpus_total"], report["per_hour_total"], report["currency"]) == (6, 13.0, "EUR")
        assert (report["idle_nodes"], report["idle_node_gpus"], report["per_hour_idle_nodes"]) == (1, 2, 1.0)
        assert report["free_gpus_in_use_nodes"] == 1.5
        assert report["measured"] is True

        # A query Prometheus refuses: exit 2 with its error, no report half measured.
        refused = await asyncio.to_thread(
            subprocess.run,
            [*argv, "--prometheus-url", prometheus.url, "--utilisation-query", "sum(("],
            capture_output=True,
            text=True,
            cwd=kit.repo_file(),
        )
        assert refused.returncode == 2
        assert "--utilisation-query: cannot read GPU utilisation from" in refused.stderr
        assert "Prometheus refused the query (bad_data)" in refused.stderr
        assert "fix the query" in refused.stderr
        assert "last answer is used" not in refused.stderr  # the daemon's wording has no place here

        # A price list with a typo: exit 2, one line naming the key and the fix.
        prices.write_text("gpuHours:\n  T4: 0.5\n")
        bad = await asyncio.to_thread(
            subprocess.run, [*argv, "--prices", str(prices)], capture_output=True, text=True, cwd=kit.repo_file()
        )
        assert bad.returncode == 2
        assert bad.stderr.strip() == (
            f"gpusched report: error: --prices {prices}: gpuHours: unknown key (known here: currency, default, gpuHour)"
        )
    finally:
        dcgm.drop(busy)


def report(cp: ControlPlane, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpusched", "report", "--kubeconfig", str(cp.scheduler_kubeconfig), *extra]
    return subprocess.run(argv, check=False, capture_output=True, text=True, cwd=kit.repo_file(), timeout=60)


async def test_empty_and_cpu_only_clusters(control_plane: ControlPlane, kube: Kube) -> None:
    done = await asyncio.to_thread(report, control_plane)
    assert done.returncode == 0, done.stderr
    assert "0 GPUs cost 0.00 GPU-h/h" in done.stdout, done.stdout  # no price list: GPU-hours, not dollars
    assert "no --prices: every GPU-hour counts 1" in done.stdout
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"cpu-{uuid.uuid4().hex[:6]}", 0, "")])
    done = await asyncio.to_thread(report, control_plane, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus_total"] == 0


async def test_an_answer_naming_no_node_of_the_cluster_is_noted(
    control_plane: ControlPlane, kube: Kube, namespace: str, prometheus: Prometheus, dcgm: DcgmExporter
) -> None:
    tag = uuid.uuid4().hex[:8]
    node = f"n-{tag}"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(node, 1, "A100-SXM4-80GB")])
    held = kit.pod("held", "other", gpus=1, node_name=node)
    held["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0"
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [held])
    # dcgm-exporter without NODE_NAME: Hostname is the exporter pod's name, not the node's.
    await measure(dcgm, prometheus, f"dcgm-exporter-{tag}", 0)
    try:
        done = await asyncio.to_thread(
            report, control_plane, "--prometheus-url", prometheus.url, "--utilisation-query", QUERY, "--json"
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["measured"] is False  # nothing was measured of this cluster's GPUs
        assert done.stderr.startswith("note: no node of the utilisation answer is a node of the cluster")
        assert "--utilisation-node-label" in done.stderr
        # One exporter fixed, the other not: what the fixed one measures is read, and the
        # other's GPUs are named as unmeasured.
        await measure(dcgm, prometheus, node, 0)
        done = await asyncio.to_thread(
            report, control_plane, "--prometheus-url", prometheus.url, "--utilisation-query", QUERY, "--json"
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["measured"] is True
        assert "name(s) in the utilisation answer are no node of the cluster" in done.stderr
        assert f"dcgm-exporter-{tag}" in done.stderr
    finally:
        dcgm.drop(f"dcgm-exporter-{tag}")
        dcgm.drop(node)


def hung_server() -> tuple[int, list[socket.socket]]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            held.append(c)  # read nothing, answer nothing

    threading.Thread(target=accept, daemon=True).start()
    held.append(srv)
    return srv.getsockname()[1], held


async def test_sigterm_with_a_hung_prometheus_exits_promptly(control_plane: ControlPlane, kube: Kube) -> None:
    port, held = hung_server()
    name = f"gs-{uuid.uuid4().hex[:8]}"
    daemon = kit.Daemon.start(
        control_plane,
        name,
        "--no-leader-elect",
        "--prometheus-url",
        f"http://127.0.0.1:{port}",
        "--utilisation-poll",
        "0.5",
    )
    try:
        daemon.wait_log("caches synced")
        time.sleep(1.0)  # a poll is in flight, waiting on the server
        sent = time.monotonic()
        daemon.proc.send_signal(15)
        daemon.proc.wait(60)
        took = time.monotonic() - sent
        stopped = daemon.wait_count("stopped", 1, timeout=1)
        assert stopped, daemon.raw[-20:]
        assert took < 3.0, f"exited {took:.1f}s after SIGTERM, the log said 'stopped' long before"
    finally:
        daemon.stop()
        for s in held:
            s.close()
