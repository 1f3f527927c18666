"""`gpusched explain` over a recorded cluster: gated pods, the scheduler's own word beside its answer,
objects it cannot read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpusched.daemon import run as daemon
from gpusched.kube.client import ApiError, Response
from tests.e2e import kit


class FakeKube:
    def __init__(
        self,
        pod: dict[str, Any],
        nodes: list[dict[str, Any]],
        pending: Sequence[dict[str, Any]] = (),
        bound: Sequence[dict[str, Any]] = (),
        groups: Sequence[dict[str, Any]] | None = (),
        more: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.pod, self.nodes, self.pending, self.bound = pod, nodes, list(pending), list(bound)
        self.groups = groups
        """The PodGroups of ``default`` (None: the API server serves none)."""
        self.more = dict(more or {})
        """Any other list, by path."""
        self.refused: set[str] = set()
        """Lists the RBAC does not grant."""

    async def request(self, method: str, path: str, *a: Any, **k: Any) -> Response:
        return Response(200, self.pod)

    async def list(self, path: str, query: Any = None, page: int = 500) -> tuple[list[Any], str]:
        if path == "/api/v1/nodes":
            return self.nodes, "1"
        if path == "/api/v1/pods":
            return self.bound, "1"
        if path == "/api/v1/namespaces/default/pods":
            assert query == {"fieldSelector": "spec.nodeName="}
            return [self.pod, *self.pending], "1"
        if path == "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups":
            if self.groups is None:
                raise ApiError(404, "the server could not find the requested resource", "NotFound")
            return list(self.groups), "1"
        if path in self.refused:
            raise ApiError(403, f"cannot list {path}", "Forbidden")
        return self.more.get(path, []), "1"

    async def close(self) -> None:
        return None


async def explain(
    monkeypatch: pytest.MonkeyPatch,
    pod: dict[str, Any],
    gpus: int = 1,
    pending: Sequence[dict[str, Any]] = (),
    bound: Sequence[dict[str, Any]] = (),
    groups: Sequence[dict[str, Any]] | None = (),
    more: Mapping[str, list[dict[str, Any]]] | None = None,
) -> tuple[str, int]:
    fake = FakeKube(pod, [kit.node("n0", gpus, "NVIDIA-A100-SXM4-80GB")], pending, bound, groups, more)

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


async def test_a_pod_its_tenants_limit_holds_back_is_told_what_the_scheduler_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = kit.pod("p", daemon.SCHEDULER_NAME, gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    said = "tenant default is at its GPU limit: it holds 2 of 2 GPUs and this pod asks for 1 more."
    p["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "TenantLimit",
                "message": said,
                "lastTransitionTime": "2026-12-06T10:00:00Z",
            }
        ]
    }
    text, _ = await explain(monkeypatch, p)
    assert f"the scheduler says (unschedulable since 2026-12-06T10:00:00Z): {said}" in text, text


def _member(name: str, minimum: int | None, node: str = "") -> dict[str, Any]:
    """A member of the gang ``train``; ``minimum`` None: without the annotation."""
    obj = kit.pod(name, daemon.SCHEDULER_NAME, gpus=1, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"u-{name}"})
    obj["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "train"}
    if minimum is not None:
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = str(minimum)
    return obj


async def test_a_gang_member_is_weighed_with_its_podgroups_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    group = {"metadata": {"name": "train", "namespace": "default"}, "spec": {"minMember": 3}}
    text, code = await explain(monkeypatch, _member("m0", None), gpus=2, pending=[_member("m1", None)], groups=[group])
    assert code == 1, text
    assert "member of gang default/train (at least 3 members" in text
    assert "gang default/train: 2 of at least 3 members are pending" in text
    assert "no PodGroup object" not in text
    # No PodGroup: one by one, and said so.
    text, code = await explain(monkeypatch, _member("m0", None), gpus=2, groups=None)
    assert code == 0, text
    assert (
        "note: pod group default/train has no PodGroup object (the API server does not serve "
        "podgroups.scheduling.x-k8s.io/v1alpha1) and no gpusched.io/gang-min-members annotation: "
        "members are placed one by one"
    ) in text


async def test_a_gang_member_is_not_said_to_fit_while_its_gang_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """It fits alone, but its gang of at least 4 has one member pending: the scheduler places none."""
    text, code = await explain(monkeypatch, _member("m0", 4))
    assert code == 1, text
    assert "gang default/train: 1 of at least 4 members are pending" in text
    assert "nodes can take it now" not in text


async def test_a_gang_whose_pending_members_fit_together_is_said_to_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=2, pending=[_member("m1", 2)])
    assert code == 0, text
    assert "gang default/train: its 2 pending members fit together now" in text
    # On one GPU the two do not fit at once, though each would alone.
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=1, pending=[_member("m1", 2)])
    assert code == 1, text
    assert "gang default/train: its members" not in text
    assert "fit together now" not in text
    assert "do not all fit at once" in text


async def test_a_gang_whose_minimum_fits_but_not_every_member_is_said_to_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """At least 2 of 3 pending, room for 2: the scheduler places two now."""
    pending = [_member("m1", 2), _member("m2", 2)]
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=2, pending=pending)
    assert code == 0, text
    assert "gang default/train: 2 of its 3 pending members fit together now (at least 2 must)" in text


async def test_a_gang_member_running_counts_toward_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """One member runs on n0 (its replacement is pending): the gang of 2 needs only it."""
    text, code = await explain(monkeypatch, _member("m1", 2), gpus=2, bound=[_member("m0", 2, node="n0")])
    assert code == 0, text
    assert "gang default/train: its 1 pending member fits now beside the 1 running (at least 2 in all)" in text
    text, code = await explain(monkeypatch, _member("m1", 3), gpus=2, bound=[_member("m0", 3, node="n0")])
    assert code == 1, text
    assert "gang default/train: 1 pending and 1 running of at least 3 members" in text


async def test_gang_members_that_disagree_on_the_rules_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=2, pending=[_member("m1", 3)])
    assert code == 1, text
    assert "gang default/train: its members disagree" in text


async def test_a_pod_whose_read_write_once_pod_claim_another_pod_uses_is_told_which(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def mounting(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["namespace"] = "default"
        obj["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "solo"}}]
        return obj

    pvc = {
        "metadata": {"name": "solo", "namespace": "default", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"accessModes": ["ReadWriteOncePod"], "volumeName": "pv-solo"},
        "status": {"phase": "Bound"},
    }
    more = {
        "/api/v1/persistentvolumeclaims": [pvc],
        "/api/v1/persistentvolumes": [{"metadata": {"name": "pv-solo"}, "spec": {"nfs": {}}}],
    }
    holder = mounting(kit.pod("holder", "default-scheduler", cpu="1", node_name="n0"))
    text, code = await explain(monkeypatch, mounting(kit.pod("p", "gpu-scheduler", gpus=1)), bound=[holder], more=more)
    assert code == 1
    assert text == (
        'pod default/p cannot be bound: persistentvolumeclaim "solo" has access mode ReadWriteOncePod and pod '
        "default/holder uses it (node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode "
        "already in-use by another pod); the pod is retried when that pod is gone"
    )
    text, code = await explain(monkeypatch, mounting(kit.pod("p", "gpu-scheduler", gpus=1)), more=more)
    assert code == 0, text  # nobody else uses it: it fits


async def test_a_bound_pod_without_a_name_is_left_out_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    p = kit.pod("p", daemon.SCHEDULER_NAME, gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    text, code = await explain(monkeypatch, p, bound=[{"spec": {"nodeName": "n0"}}])
    assert "bound pod ignored: object without metadata.name" in text
    assert code == 0, text  # the others are weighed as ever: the pod fits on n0


@pytest.mark.parametrize("state", ["deleting", "finished", "another scheduler's"])
async def test_a_pod_no_scheduler_here_will_place_is_not_said_to_fit(
    monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    p = kit.pod("p", daemon.SCHEDULER_NAME if state != "another scheduler's" else "default-scheduler", gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    if state == "deleting":
        p["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    elif state == "finished":
        p["status"] = {"phase": "Failed"}
    text, code = await explain(monkeypatch, p)
    assert code == 1, text
    assert "nodes can take it now" not in text
    assert {"deleting": "is being deleted", "finished": "has finished (Failed)"}.get(state, "does not place it") in text


async def test_a_gang_member_whose_claim_is_missing_is_counted_out_as_the_scheduler_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At least 2 of 3 pending; one mounts a claim that does not exist: the scheduler places the
    other two, and explain says so (not that the gang cannot be bound)."""
    broken = _member("m2", 2)
    broken["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "absent"}}]
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=2, pending=[_member("m1", 2), broken])
    assert code == 0, text
    assert "gang default/train: its 2 pending members fit together now" in text
    # With only it beside, the gang falls short: its claim is why.
    text, code = await explain(monkeypatch, _member("m0", 2), gpus=2, pending=[broken])
    assert code == 1, text
    assert 'member default/m2 cannot be bound: persistentvolumeclaim "absent" not found' in text


async def test_claims_of_other_namespaces_not_granted_are_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pods of other namespaces attach their volumes too: their claims are read (cluster-wide);
    where the RBAC grants only the pod's namespace, the answer says what it leaves out."""
    p = kit.pod("p", daemon.SCHEDULER_NAME, gpus=1)
    p["metadata"].update({"namespace": "default", "uid": "u"})
    p["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    pvc = {
        "metadata": {"name": "data", "namespace": "default", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-data"},
        "status": {"phase": "Bound"},
    }
    fake = FakeKube(
        p,
        [kit.node("n0", 1, "NVIDIA-A100-SXM4-80GB")],
        more={
            "/api/v1/namespaces/default/persistentvolumeclaims": [pvc],
            "/api/v1/persistentvolumes": [{"metadata": {"name": "pv-data"}, "spec": {"nfs": {}}}],
        },
    )
    fake.refused.add("/api/v1/persistentvolumeclaims")

    async def connect(*_: Any) -> FakeKube:
        return fake

    monkeypatch.setattr(daemon, "connect", connect)
    text, code = await daemon.explain_pod(None, None, "default", "p")
    assert code == 0, text
    assert "note: the claims of other namespaces not read" in text
