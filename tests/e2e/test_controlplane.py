"""The test control plane itself: real kube-apiserver + etcd, identities, and the pitfalls it works around."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from tests.controlplane import (
    SCHEDULER_GROUPS,
    SCHEDULER_NAMESPACE,
    SCHEDULER_USER,
    ControlPlane,
    start_control_plane,
)
from tests.e2e import kit


async def test_server_version(admin_api: ApiClient) -> None:
    info = await client.VersionApi(admin_api).get_code()
    assert info.git_version.startswith("v1.34."), info
    assert info.major == "1"
    assert info.minor == "34"


def test_kubectl_and_namespace(control_plane: ControlPlane, namespace: str) -> None:
    out = control_plane.kubectl("get", "namespace", namespace, "-o", "json").stdout
    assert json.loads(out)["status"]["phase"] == "Active"
    control_plane.kubectl("get", "namespace", SCHEDULER_NAMESPACE)


async def test_node_keeps_status_capacity_and_has_no_taints(admin_api: ApiClient) -> None:
    core = client.CoreV1Api(admin_api)
    name = f"gpu-node-{uuid.uuid4().hex[:8]}"
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    body = client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        status=client.V1NodeStatus(capacity=resources, allocatable=resources),
    )
    await core.create_node(body)
    try:
        node = await core.read_node(name)
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        # TaintNodesByCondition is disabled: no node.kubernetes.io/not-ready taint that nothing would remove.
        assert not node.spec.taints, node.spec.taints
    finally:
        await core.delete_node(name)


async def test_scheduler_identity_authenticates(scheduler_api: ApiClient) -> None:
    review = await client.AuthenticationV1Api(scheduler_api).create_self_subject_review(client.V1SelfSubjectReview())
    user = review.status.user_info
    assert user.username == SCHEDULER_USER
    assert set(SCHEDULER_GROUPS) <= set(user.groups)
    assert "system:authenticated" in user.groups


def test_scheduler_identity_whoami_kubectl(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=control_plane.scheduler_kubeconfig).stdout
    assert json.loads(out)["status"]["userInfo"]["username"] == SCHEDULER_USER


async def test_scheduler_cannot_read_secrets(scheduler_api: ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(scheduler_api)
    with pytest.raises(ApiException) as excinfo:
        await core.list_secret_for_all_namespaces()
    assert excinfo.value.status == 403
    for ns in (SCHEDULER_NAMESPACE, namespace):
        with pytest.raises(ApiException) as excinfo:
            await core.list_namespaced_secret(ns)
        assert excinfo.value.status == 403, ns


async def test_scheduler_rbac_from_manifests(scheduler_api: ApiClient) -> None:
    core = client.CoreV1Api(scheduler_api)
    await core.list_node()
    await core.list_pod_for_all_namespaces(limit=1)
    with pytest.raises(ApiException) as excinfo:
        await core.list_config_map_for_all_namespaces()
    assert excinfo.value.status == 403


def test_the_replicas_outrank_every_pod_and_a_drain_leaves_one(control_plane: ControlPlane) -> None:
    """As applied: the Deployment's priority class exists (or admission would refuse its pods),
    above any priority a user's class may have, and the disruption budget selects its pods."""

    def get(*args: str) -> Any:
        return json.loads(control_plane.kubectl("get", *args, "-o", "json").stdout)

    deploy = get("-n", SCHEDULER_NAMESPACE, "deployment", "gpu-scheduler")
    template = deploy["spec"]["template"]
    klass = get("priorityclass", template["spec"]["priorityClassName"])
    assert klass["value"] == 1_000_000_000
    budget = get("-n", SCHEDULER_NAMESPACE, "poddisruptionbudget", "gpu-scheduler")
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert budget["spec"]["maxUnavailable"] == 1
    assert deploy["spec"]["replicas"] == 2


def test_bad_token_is_unauthorized(control_plane: ControlPlane) -> None:
    ctx = ssl.create_default_context(cafile=str(control_plane.ca_file))
    request = urllib.request.Request(f"{control_plane.server}/api", headers={"Authorization": "Bearer nope"})
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(request, timeout=10, context=ctx)
    assert excinfo.value.code == 401
    excinfo.value.close()


def test_second_control_plane_start_and_stop(control_plane: ControlPlane, tmp_path: Path) -> None:
    """A second, independent control plane starts, and stop() cleans up and is idempotent."""
    cp = start_control_plane(tmp_path, control_plane.assets)
    try:
        assert cp.server != control_plane.server
        assert cp.etcd_data_dir is not None
        data_dir = cp.etcd_data_dir
        assert data_dir.is_dir()
        cp.kubectl("create", "namespace", "only-here")
        assert control_plane.kubectl("get", "namespace", "only-here", check=False).returncode != 0
    finally:
        cp.stop()
    assert not data_dir.exists()
    cp.stop()
    assert cp.kubectl("get", "namespaces", "--request-timeout=2s", check=False).returncode != 0


def _connections_to(port: int) -> set[str]:
    """Socket inodes of this process's established TCP connections to ``port`` on localhost."""
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    found = set()
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and int(remote.split(":")[1], 16) == port and inode in mine:
            found.add(inode)
    return found


async def test_warm_opens_connections_once_and_reuses_them(control_plane: ControlPlane) -> None:
    port = int(control_plane.server.rsplit(":", 1)[1])
    kube = await kit.admin(control_plane)
    try:
        before = _connections_to(port)
        await kube.warm(6)
        opened = _connections_to(port) - before
        assert len(opened) == 6, "one connection per concurrent request"
        await kube.warm(6)
        assert _connections_to(port) - before == opened, "the second round reuses them: no new handshakes"
        await asyncio.gather(*(kube.request("GET", "/version") for _ in range(6)))
        assert _connections_to(port) - before == opened, "requests after a warm-up find connections ready"
    finally:
        await kube.close()
