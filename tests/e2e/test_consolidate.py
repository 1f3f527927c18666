"""`gpusched run` consolidating against the real API server: the pods of the emptiest node that
asked to be moved are evicted through the Eviction API, and nothing else is."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from gpusched.kube.client import Kube
from tests.controlplane import ControlPlane
from tests.e2e import kit
from tests.e2e.test_daemon import _until


def batch_pod(name: str, scheduler: str, node: str, gpu: int) -> dict[str, Any]:
    """A one-GPU pod of ``scheduler`` bound to ``node``, owned by a (pretend) Job and willing to
    move; it lingers for its grace period once evicted (no kubelet here)."""
    p = kit.pod(name, scheduler, gpus=1, node_name=node)
    p["metadata"]["annotations"] |= {"gpusched.io/consolidate": "true", "gpusched.io/gpu-indices": str(gpu)}
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": str(uuid.uuid4()), "controller": True}
    ]
    p["spec"]["terminationGracePeriodSeconds"] = 30
    return p


async def test_the_emptiest_node_is_emptied_through_the_eviction_api_and_only_once(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    name = f"gs-{uuid.uuid4().hex[:8]}"
    full, light = f"full-{name}", f"light-{name}"
    config = tmp_path / "consolidate.yaml"
    config.write_text("consolidation:\n  enabled: true\n  intervalSeconds: 1\n")
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(full, 4, "T4"), kit.node(light, 4, "T4")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    spread = [batch_pod("a0", name, full, 0), batch_pod("a1", name, full, 1), batch_pod("b0", name, light, 0)]
    await kit.create_all(kube, pods, spread)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    try:
        line = daemon.wait_log("consolidate")
        assert (line["node"], line["pods"], line["to"]) == (light, [f"{namespace}/b0"], [full])
        b0 = await _until(kube, f"{pods}/b0", lambda o: o["metadata"].get("deletionTimestamp"))
        assert b0["metadata"].get("deletionTimestamp"), "b0 was not evicted"
        marked = [c for c in b0["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]
        assert [(c["status"], c["reason"]) for c in marked] == [("True", "EvictionByEvictionAPI")]
        events = await kit.wait_events(kube, namespace, ["Consolidating/b0"])
        (told,) = events["Consolidating/b0"]
        assert told["message"].startswith(f"Evicted from node {light}: consolidating GPU work")
        # The kubelet's part: b0 stops and leaves; the node is idle, and a's pods stay where they are.
        r = await kube.request("DELETE", f"{pods}/b0", query={"gracePeriodSeconds": "0"})
        assert r.ok, r.body
        await asyncio.sleep(3.0)  # three more rounds
        assert len(daemon.events("consolidate")) == 1
        for n in ("a0", "a1"):
            obj = (await kube.request("GET", f"{pods}/{n}")).body
            assert not obj["metadata"].get("deletionTimestamp"), n
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
