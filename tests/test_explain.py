"""`gpusched explain` over a recorded cluster: gated pods, and the scheduler's own word beside its answer."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.daemon import run as daemon
from gpusched.kube.client import Response
from tests.e2e import kit


class FakeKube:
    def __init__(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        self.pod, self.nodes = pod, nodes

    async def request(self, method: str, path: str, *a: Any, **k: Any) -> Response:
        return Response(200, self.pod)

    async def list(self, path: str, query: Any = None, page: int = 500) -> tuple[list[Any], str]:
        if path == "/api/v1/nodes":
            return self.nodes, "1"
        return [], "1"

    async def close(self) -> None:
        return None


async def explain(monkeypatch: pytest.MonkeyPatch, pod: dict[str, Any]) -> tuple[str, int]:
    fake = FakeKube(pod, [kit.node("n0", 1, "NVIDIA-A100-SXM4-80GB")])

    async def connect(*_: Any) -> FakeKube:
        return fake

    monkeypatch.setattr(daemon, "connect", connect)
    return await daemon.explain_pod(None, None, "default", "p")


async def test_a_gated_pod_is_not_said_to_fit_nor_its_gate_put_in_the_schedulers_mouth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = kit.pod("p", daemon.SCHEDULER_NAME, gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    p["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    p["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
                "lastTransitionTime": "2026-12-06T10:00:00Z",
            }
        ]
    }
    text, code = await explain(monkeypatch, p)
    assert code != 0, "a gated pod is said to fit (exit 0); nobody may bind it until its gates are removed"
    assert "the scheduler said" not in text, "the API server's SchedulingGated condition put in the scheduler's mouth"


async def test_the_time_printed_is_not_when_the_pod_first_became_unschedulable(monkeypatch: pytest.MonkeyPatch) -> None:
    p = kit.pod("p", daemon.SCHEDULER_NAME, gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    # Unschedulable since 10:00 (a tenant limit); the message was replaced at 12:00 by the binder,
    # which keeps the condition's lastTransitionTime when only the message changes.
    p["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "Waiting for node n0 to be re-partitioned into MIG instances",
                "lastTransitionTime": "2026-12-06T10:00:00Z",
            }
        ]
    }
    text, _ = await explain(monkeypatch, p)
    assert "said at 2026-12-06T10:00:00Z" not in text, text
    assert "unschedulable since 2026-12-06T10:00:00Z" in text
    assert "Waiting for node n0 to be re-partitioned into MIG instances" in text
