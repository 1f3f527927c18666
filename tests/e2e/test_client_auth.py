"""Credentials from a kubeconfig: a plugin's short-lived token is fetched again before it expires."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
import yaml

from gpusched.kube import client as client_module
from tests.controlplane import ControlPlane


def _exec_kubeconfig(cp: ControlPlane, tmp_path: Path, runs: Path) -> Path:
    """The admin kubeconfig with its user's token replaced by an exec plugin (as EKS and GKE
    configure) whose token expires 3 s after it is issued; each run appends a line to ``runs``."""
    plugin = tmp_path / "credential-plugin.sh"
    credential = (
        '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"{cp.admin_token}","expirationTimestamp":"\'"$expires"\'"}}}}'
    )
    plugin.write_text(
        f"#!/bin/sh\necho run >> {runs}\nexpires=$(date -u -d '+3 seconds' +%Y-%m-%dT%H:%M:%SZ)\necho '{credential}'\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    config = yaml.safe_load(cp.admin_kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(plugin),
                "interactiveMode": "Never",
            }
        }
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_a_credential_plugins_token_is_fetched_again_before_it_expires(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "TOKEN_CHECK_S", 0.5)
    runs = tmp_path / "runs"
    kube = await client_module.connect(_exec_kubeconfig(control_plane, tmp_path, runs), None, 50, 100)
    try:
        for _ in range(3):
            r = await kube.request("GET", "/api/v1/namespaces/default")
            assert r.ok, r.body
            await asyncio.sleep(1.0)
        assert len(runs.read_text().split()) > 1, "the plugin ran once: its token would expire unrenewed"
    finally:
        await kube.close()
    assert kube.refresher is not None
    assert kube.refresher.done()
