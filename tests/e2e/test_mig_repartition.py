"""`gpusched run` re-partitioning an idle node into MIG instances against the real API server: the
layout goes into the MIG manager's ConfigMap and the node's ``nvidia.com/mig.config`` label; the
MIG pods wait, and the node takes no other GPU pod, until the node advertises the instances (the
test plays the MIG manager and the device plugin); a layout that fails leaves every pod pending
and told why."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.kube.client import MERGE_PATCH, Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit
from tests.e2e.test_daemon import _until

A100 = "NVIDIA-A100-SXM4-80GB"
CM = "/api/v1/namespaces/gpu-operator/configmaps/gpusched-mig-parted-config"


@pytest.fixture(scope="module")
def mig_rbac(control_plane: ControlPlane) -> None:
    """The optional RBAC of manifests/mig-repartition.yaml, in place once the authorizer has it."""
    control_plane.kubectl("create", "namespace", "gpu-operator", check=False)
    control_plane.kubectl("apply", "-f", str(kit.repo_file("manifests", "mig-repartition.yaml")))
    deadline = time.monotonic() + 60
    while True:
        ask = ("auth", "can-i", "update", "configmaps/gpusched-mig-parted-config", "-n", "gpu-operator")
        can = control_plane.kubectl(*ask, kubeconfig=control_plane.scheduler_kubeconfig, check=False)
        nodes = control_plane.kubectl(
            "auth", "can-i", "patch", "nodes", kubeconfig=control_plane.scheduler_kubeconfig, check=False
        )
        if can.stdout.strip() == nodes.stdout.strip() == "yes":
            return
        assert time.monotonic() < deadline, (can.stdout, can.stderr, nodes.stdout, nodes.stderr)
        time.sleep(0.2)


def mig_pod(name: str, scheduler: str, profile: str = "1g.10gb") -> dict[str, Any]:
    p = kit.pod(name, scheduler)
    p["spec"]["containers"][0]["resources"]["limits"][f"nvidia.com/mig-{profile}"] = "1"
    return p


async def _mig_state(kube: Kube, node: str, state: str) -> None:
    """The MIG manager's word on ``node``."""
    body = {"metadata": {"labels": {"nvidia.com/mig.config.state": state}}}
    r = await kube.request("PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)
    assert r.ok, r.body


async def _advertise(kube: Kube, node: str, alloc: Mapping[str, str | None]) -> None:
    """The device plugin's part: ``node`` advertises ``alloc`` (None removes a resource)."""
    body = {"status": {"allocatable": alloc, "capacity": alloc}}
    r = await kube.request("PATCH", f"/api/v1/nodes/{node}/status", body=body, content_type=MERGE_PATCH)
    assert r.ok, r.body


def _message(p: dict[str, Any]) -> str:
    return str((kit.condition(p) or {}).get("message", ""))


async def _start(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, pods: int
) -> tuple[kit.Daemon, str, str, dict[str, Any]]:
    """A daemon with re-partitioning on, an idle A100 node of two GPUs that allows it, ``pods`` MIG
    pods; returns once the daemon has asked for a layout: it, the node, the config, its line."""
    name = f"gs-{uuid.uuid4().hex[:8]}"
    node = f"a100-{name}"
    config = tmp_path / "mig.yaml"
    config.write_text("mig:\n  repartition: true\n  timeoutSeconds: 60\n  configDelaySeconds: 0\n")
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(node, 2, A100, **{"gpusched.io/mig-repartition": "true"})])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [mig_pod(f"s{i}", name) for i in range(pods)])
    line = daemon.wait_log("mig repartition")
    assert line["node"] == node
    assert sorted(line["pods"]) == [f"{namespace}/s{i}" for i in range(pods)]
    return daemon, name, node, line


async def test_mig_pods_wait_for_the_layout_and_are_bound_once_the_node_advertises_it(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    daemon, name, node, line = await _start(control_plane, kube, namespace, tmp_path, pods=3)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        config = line["config"]
        assert config.startswith("gpusched-")
        labelled = await _until(
            kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"].get("nvidia.com/mig.config")
        )
        assert labelled["metadata"]["labels"]["nvidia.com/mig.config"] == config
        cm = (await kube.request("GET", CM)).body
        written = json.loads(cm["metadata"]["annotations"]["gpusched.io/mig-configs-written"])
        assert config in written, "when it was first written, for the next leader to wait from"
        doc = yaml.safe_load(cm["data"]["config.yaml"])
        assert doc["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
        entries = doc["mig-configs"][config]
        offered: Counter[str] = Counter()
        for e in entries:
            for profile, count in (e.get("mig-devices") or {}).items():
                offered[profile] += count * len(e["devices"])
        assert offered["1g.10gb"] >= 3
        parted = sum(len(e["devices"]) for e in entries if e["mig-enabled"])
        for i in range(3):
            p = await _until(kube, f"{pods}/s{i}", lambda o: "re-partitioned" in _message(o))
            assert not p["spec"].get("nodeName")
            assert f"Waiting for node {node} to be re-partitioned into MIG instances" in _message(p)
        explained = await kit.explain(control_plane, f"{namespace}/s0", name)
        assert explained.returncode == 1, explained.stderr
        assert "1 Insufficient nvidia.com/mig-1g.10gb" in explained.stdout, "its own analysis: capacity as advertised"
        assert f"Waiting for node {node} to be re-partitioned into MIG instances" in explained.stdout
        # A whole-GPU pod meanwhile: the node takes no GPU pod while the MIG manager is at work.
        await kit.create_all(kube, pods, [kit.pod("whole", name, gpus=1)])
        whole = await _until(kube, f"{pods}/whole", kit.condition)
        assert not whole["spec"].get("nodeName"), "a GPU pod went to a node being re-partitioned"
        # The MIG manager's part, then the device plugin's.
        await _mig_state(kube, node, "pending")
        alloc = {"nvidia.com/gpu": str(2 - parted), **{f"nvidia.com/mig-{p}": str(c) for p, c in offered.items()}}
        await _advertise(kube, node, alloc)
        await asyncio.sleep(1.0)
        for n in ("s0", "whole"):
            assert not (await kube.request("GET", f"{pods}/{n}")).body["spec"].get("nodeName"), n
        await _mig_state(kube, node, "success")
        for i in range(3):
            bound = await kit.wait_bound(kube, f"{pods}/s{i}", timeout=30)
            assert bound["spec"].get("nodeName") == node, (f"s{i}", _message(bound))
        done = daemon.wait_log("mig repartition done")
        assert done["node"] == node
        if parted < 2:  # a whole GPU is left: the pod that waited takes it
            bound = await kit.wait_bound(kube, f"{pods}/whole", timeout=30)
            assert bound["spec"].get("nodeName") == node
        assert len(daemon.events("mig repartition")) == 1, "the node was asked for one layout only"
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_a_layout_the_mig_manager_fails_leaves_the_pods_pending_and_told_why(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    daemon, _, node, line = await _start(control_plane, kube, namespace, tmp_path, pods=2)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        await _until(kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"].get("nvidia.com/mig.config"))
        await _mig_state(kube, node, "failed")
        failed = daemon.wait_log("mig repartition failed")
        assert (failed["node"], failed["result"]) == (node, "failed")
        # Told in an Event; drawn again at once, they are told where they stand now: still pending.
        deadline = time.monotonic() + 30
        while True:
            events = await kit.scheduled_events(kube, namespace)
            told_all = {
                i: [
                    e["message"]
                    for e in events.get(f"FailedScheduling/s{i}", [])
                    if "was not re-partitioned" in e["message"]
                ]
                for i in range(2)
            }
            if all(told_all.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        for told in told_all.values():
            assert told == [
                f"Node {node} was not re-partitioned into MIG instances for this pod: the MIG manager "
                f"failed to apply nvidia.com/mig.config={line['config']}."
            ]
        await asyncio.sleep(1.0)
        for i in range(2):
            p = (await kube.request("GET", f"{pods}/s{i}")).body
            assert not p["spec"].get("nodeName")
            # Whichever of its two verdicts landed last: both are true.
            assert "Insufficient nvidia.com/mig-1g.10gb" in _message(p) or "was not re-partitioned" in _message(p)
        assert len(daemon.events("mig repartition")) == 1, "a node whose layout failed is not asked again"
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_a_restarted_daemon_lets_the_pods_wait_for_the_layout_asked_for_rather_than_split_another_node(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    daemon, name, node, _ = await _start(control_plane, kube, namespace, tmp_path, pods=1)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        await _until(kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"].get("nvidia.com/mig.config"))
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
    # While gpusched is down, the MIG manager sets to work and another idle node joins.
    await _mig_state(kube, node, "pending")
    other = f"other-{name}"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(other, 2, A100, **{"gpusched.io/mig-repartition": "true"})])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(tmp_path / "mig.yaml"))
    try:
        told = await _until(kube, f"{pods}/s0", lambda o: "no node is given a new MIG layout" in _message(o))
        assert f"until node {node}, asked for one before this instance led, advertises it" in _message(told)
        # The layout comes: the pod takes one of its instances.
        await _advertise(kube, node, {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7"})
        await _mig_state(kube, node, "success")
        bound = await kit.wait_bound(kube, f"{pods}/s0", timeout=30)
        assert bound["spec"].get("nodeName") == node
        assert not daemon.events("mig repartition"), "another node re-partitioned for the pod"
        labels = (await kube.request("GET", f"/api/v1/nodes/{other}")).body["metadata"]["labels"]
        assert "nvidia.com/mig.config" not in labels
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_layouts_asked_for_together_all_stay_in_the_config_map(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    nodes = [f"one-{name}", f"two-{name}"]
    config = tmp_path / "mig.yaml"
    config.write_text("mig:\n  repartition: true\n  configDelaySeconds: 0\n")
    opt_in = {"gpusched.io/mig-repartition": "true"}
    await kit.create_all(
        kube, "/api/v1/nodes", [kit.node(nodes[0], 1, A100, **opt_in), kit.node(nodes[1], 2, A100, **opt_in)]
    )
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [mig_pod(f"s{i}", name) for i in range(21)])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    try:
        daemon.wait_count("mig repartition", 2)
        asked = {line["node"]: line["config"] for line in daemon.events("mig repartition")}
        assert set(asked) == set(nodes)
        assert asked[nodes[0]] != asked[nodes[1]], "two layouts, two configurations"
        for node in nodes:
            await _until(kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"].get("nvidia.com/mig.config"))
        doc = yaml.safe_load((await kube.request("GET", CM)).body["data"]["config.yaml"])
        assert set(asked.values()) <= set(doc["mig-configs"]), "a later write dropped a layout still asked for"
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_a_repartitioned_node_no_pod_uses_is_given_back_its_whole_gpus(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    node = f"parted-{name}"
    config = tmp_path / "mig.yaml"
    config.write_text("mig:\n  repartition: true\n  restoreIdleSeconds: 1\n")
    parted = kit.node(node, 0, A100, **{"gpusched.io/mig-repartition": "true"})
    parted["metadata"]["labels"] |= {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.count": "1",  # GPU feature discovery counts the GPU in MIG mode too
    }
    parted["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    parted["status"]["capacity"]["nvidia.com/mig-1g.10gb"] = "7"
    await kit.create_all(kube, "/api/v1/nodes", [parted])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        assert daemon.wait_log("mig restore", timeout=30)["node"] == node
        labelled = await _until(
            kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
        )
        assert labelled["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
        # Meanwhile the node is sealed: a MIG pod is not bound to the instances being taken away.
        await kit.create_all(kube, pods, [mig_pod("late", name)])
        late = await _until(kube, f"{pods}/late", kit.condition)
        assert not late["spec"].get("nodeName")
        await _mig_state(kube, node, "pending")
        alloc = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": None}
        await _advertise(kube, node, alloc)
        await _mig_state(kube, node, "success")
        assert daemon.wait_log("mig repartition done", timeout=30)["node"] == node
        # Whole again, the node may take a layout once more: the one the pod that waited needs.
        asked = daemon.wait_log("mig repartition", timeout=30)
        assert (asked["node"], asked["pods"]) == (node, [f"{namespace}/late"])
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_an_idle_layout_is_set_back_sooner_for_a_waiting_pod_and_given_the_layout_it_needs(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    node = f"sooner-{name}"
    config = tmp_path / "mig.yaml"
    config.write_text(
        "mig:\n  repartition: true\n  configDelaySeconds: 0\n"
        "  restoreIdleSeconds: 3600\n  restoreForWaitingSeconds: 1\n"
    )
    parted = kit.node(node, 0, A100, **{"gpusched.io/mig-repartition": "true"})
    parted["metadata"]["labels"] |= {
        "nvidia.com/mig.config": "gpusched-0123456789ab",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.count": "1",
    }
    for st in ("allocatable", "capacity"):
        parted["status"][st]["nvidia.com/mig-1g.10gb"] = "7"
    await kit.create_all(kube, "/api/v1/nodes", [parted])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        await kit.create_all(kube, pods, [mig_pod("big", name, "7g.80gb")])  # the layout has no such instance
        restore = daemon.wait_log("mig restore", timeout=30)
        assert restore["node"] == node
        assert "1 waiting pod(s) could use its GPUs once whole" in restore["why"]
        await _until(
            kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
        )
        await _mig_state(kube, node, "pending")
        alloc = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": None}
        await _advertise(kube, node, alloc)
        await _mig_state(kube, node, "success")
        asked = daemon.wait_log("mig repartition", timeout=30)
        assert (asked["node"], asked["pods"]) == (node, [f"{namespace}/big"])
        assert "1 x 7g.80gb" in asked["instances"]
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def test_a_burst_larger_than_a_batch_gets_the_node_partitioned_for_all_of_it_at_once(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path, mig_rbac: None
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    node = f"ahead-{name}"
    config = tmp_path / "mig.yaml"
    config.write_text(
        "mig:\n  repartition: true\n  configDelaySeconds: 0\nbatching:\n  maxSize: 2\n  quickStart: false\n"
    )
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(node, 2, A100, **{"gpusched.io/mig-repartition": "true"})])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await kit.create_all(kube, pods, [mig_pod(f"s{i:02d}", name) for i in range(12)])  # before the daemon: all queued
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    try:
        asked = daemon.wait_log("mig repartition", timeout=30)
        assert asked["node"] == node
        assert len(asked["pods"]) <= 2, asked
        assert asked["instances"] == "14 x 1g.10gb", "both GPUs, for the pods queued beyond the batch"
        labelled = await _until(
            kube, f"/api/v1/nodes/{node}", lambda o: o["metadata"]["labels"].get("nvidia.com/mig.config")
        )
        await _mig_state(kube, node, "pending")
        alloc = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"}
        await _advertise(kube, node, alloc)
        await _mig_state(kube, node, "success")
        for i in range(12):
            bound = await kit.wait_bound(kube, f"{pods}/s{i:02d}", timeout=30)
            assert bound["spec"].get("nodeName") == node
        assert len(daemon.events("mig repartition")) == 1, "one layout for the whole burst"
        assert labelled["metadata"]["labels"]["nvidia.com/mig.config"] == asked["config"]
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
