"""Fixtures for end-to-end tests against a real kube-apiserver + etcd (see tests/controlplane.py)."""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient

from gpusched.kube.client import Kube
from tests.controlplane import (
    REPO_ROOT,
    AssetsMissing,
    ControlPlane,
    find_assets,
    start_control_plane,
)
from tests.e2e import kit
from tests.e2e.reference import KubeScheduler, kube_scheduler_running

MANIFESTS = REPO_ROOT / "manifests"


def _wait_for_scheduler_rbac(cp: ControlPlane, timeout: float = 60.0) -> None:
    """RBAC bindings reach the authorizer through an informer; wait until the scheduler's role applies."""
    deadline = time.monotonic() + timeout
    while True:
        can_i = ("auth", "can-i", "list", "pods", "--all-namespaces")
        proc = cp.kubectl(*can_i, kubeconfig=cp.scheduler_kubeconfig, check=False)
        if proc.stdout.strip() == "yes":
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"after `kubectl apply -k manifests/` the scheduler still cannot list pods: "
                f"{proc.stdout.strip()} {proc.stderr.strip()}"
            )
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def _leaks_show_up_here() -> Iterator[None]:
    """Collect garbage once the test's event loop is closed (this fixture is set up before it,
    so torn down after), so that a connection a test leaves open fails that test, not whichever
    later test the garbage collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One kube-apiserver + etcd per session, with manifests/ applied (RBAC, namespace, ConfigMap)."""
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        reason = f"control-plane binaries missing (hack/testbin.sh): {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    cp = start_control_plane(tmp_path_factory.mktemp("controlplane"), assets)
    try:
        cp.kubectl("apply", "-k", str(MANIFESTS))
        _wait_for_scheduler_rbac(cp)
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A fresh namespace per test. Not deleted: without a controller-manager it would never finish."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    return name


@pytest.fixture
async def admin_api(control_plane: ControlPlane) -> AsyncIterator[ApiClient]:
    """A kubernetes_asyncio ApiClient as cluster admin (system:masters); closed after the test."""
    async with await config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig)) as api:
        yield api


@pytest.fixture
async def scheduler_api(control_plane: ControlPlane) -> AsyncIterator[ApiClient]:
    """A kubernetes_asyncio ApiClient as the scheduler's ServiceAccount identity (RBAC from manifests/)."""
    async with await config.new_client_from_config(config_file=str(control_plane.scheduler_kubeconfig)) as api:
        yield api


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Kube]:
    """Admin client; every node is deleted after the test so tests do not share capacity."""
    k = await kit.admin(control_plane)
    try:
        await kit.delete_all_nodes(k)
        yield k
    finally:
        await kit.delete_all_nodes(k)
        await k.close()


@pytest.fixture
def kube_scheduler(control_plane: ControlPlane, tmp_path: Path) -> Iterator[KubeScheduler]:
    """The real kube-scheduler, with one profile (``reference.REFERENCE``): the reference the
    filter tests compare gpusched with; stopped after the test."""
    with kube_scheduler_running(control_plane, tmp_path) as sched:
        yield sched
