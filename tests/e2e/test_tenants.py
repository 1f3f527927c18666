"""`gpusched run` with tenant rules against the real API server: a limit holds a pod back and
says so, and a tenant within its quota takes back the GPUs another tenant borrowed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit
from tests.e2e.test_daemon import _metric_once, _until


def of_team(name: str, scheduler: str, team: str) -> dict[str, Any]:
    """A one-GPU pod of ``team`` that lingers for its grace period once deleted (no kubelet here)."""
    p = kit.pod(name, scheduler, gpus=1)
    p["metadata"]["labels"] = {"team": team}
    p["spec"]["terminationGracePeriodSeconds"] = 30
    return p


async def test_a_limit_holds_a_pod_back_and_a_tenant_within_its_quota_reclaims_borrowed_gpus(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    node = f"tn-{name}"
    config = tmp_path / "tenants.yaml"
    config.write_text("tenants:\n  label: team\n  quotas:\n    vision: {quotaGpus: 2}\n    batch: {limitGpus: 3}\n")
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(node, 4, "T4")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    try:
        await kit.create_all(kube, pods, [of_team(f"batch-{i}", name, "batch") for i in range(3)])
        await kit.wait_settled(kube, namespace, 3)
        await kit.create_all(kube, pods, [of_team("batch-3", name, "batch")])
        held = await _until(kube, f"{pods}/batch-3", lambda o: kit.condition(o) is not None)
        assert not held["spec"].get("nodeName")
        assert (kit.condition(held) or {}).get("message") == (
            "tenant batch is at its GPU limit: it holds 3 of 3 GPUs and this pod asks for 1 more."
        )
        # vision (quota 2) gets the free GPU, then takes one back from batch (quota 0) for its second pod.
        await kit.create_all(kube, pods, [of_team(f"vision-{i}", name, "vision") for i in range(2)])
        line = daemon.wait_log("reclaim")
        assert line["tenant"] == "vision"
        (victim,) = line["victims"]
        victim_name = victim.split("/", 1)[1].split("@", 1)[0]
        assert victim_name.startswith("batch-")
        gone = await _until(kube, f"{pods}/{victim_name}", lambda o: o["metadata"].get("deletionTimestamp"))
        assert gone["metadata"].get("deletionTimestamp"), "the borrowed GPU was not reclaimed"
        events = await kit.wait_events(kube, namespace, [f"Preempted/{victim_name}"])
        (told,) = events[f"Preempted/{victim_name}"]
        assert "reclaiming GPUs for tenant vision, within its quota of 2 GPUs" in told["message"], told
        # The kubelet's part: the victim stops and leaves; the reclaiming pod takes its GPU.
        r = await kube.request("DELETE", f"{pods}/{victim_name}", query={"gracePeriodSeconds": "0"})
        assert r.ok, r.body
        waiting = line["pod"].split("/", 1)[1]
        await kit.wait_bound(kube, f"{pods}/{waiting}")
        everyone = await kit.list_all(kube, pods)
        bound = sorted(p["metadata"]["name"] for p in everyone if p["spec"].get("nodeName"))
        assert [n for n in bound if n.startswith("vision-")] == ["vision-0", "vision-1"]
        assert len([n for n in bound if n.startswith("batch-")]) == 2  # the held one waits still
        kit.check_placements(await kit.list_all(kube, "/api/v1/nodes"), everyone)
        assert await _metric_once(daemon.metrics_port, 'gpusched_tenant_gpus{tenant="vision"}', 2) == 2
        assert len(daemon.events("reclaim")) == 1  # once, not again
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
