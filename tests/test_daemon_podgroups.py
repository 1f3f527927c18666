"""Gangs sized by their coscheduling PodGroup: members wait for its ``minMember`` unless they
carry ``gpusched.io/gang-min-members`` (which wins); a PodGroup created or changed while members
wait has them read again at once; with no PodGroup and no annotation, members are placed one by
one, and each is warned once.

These drive a real ``Scheduler`` (queue, cache, policy) with watch events as the API server
sends them; only the API server's answers (Bindings, Events) are recorded.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpusched.daemon import Scheduler
from gpusched.kube.watch import OptionalHandler
from tests.doubles import RecordingApi, one_node_scheduler, settle
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0
NOT_SERVED = "the API server does not serve podgroups.scheduling.x-k8s.io/v1alpha1"


def _member(name: str, group: str = "train", minimum: int | None = None) -> dict[str, Any]:
    """A one-GPU member of ``group`` in ``default``; with ``minimum``, the gang annotation too."""
    obj = kit.pod(name, "s", gpus=1)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}"})
    obj["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    if minimum is not None:
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = str(minimum)
    return obj


def _pod_group(name: str, minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": minimum, "scheduleTimeoutSeconds": 60},
    }


def _groups(s: Scheduler) -> OptionalHandler:
    return cast(OptionalHandler, next(r.handler for r in s.reflectors if r.name == "podgroups"))


def _scheduler(api: RecordingApi, gpus: int = 8) -> Scheduler:
    s = one_node_scheduler(api, gpus)
    s.queue.gang_wait = 0.05  # a short gang is drawn (and told) soon after its last member came
    return s


async def _one_batch(s: Scheduler) -> None:
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)


async def test_members_wait_for_their_podgroups_minimum_then_are_bound_together() -> None:
    api = RecordingApi()
    s = _scheduler(api)
    _groups(s).replace([_pod_group("train", 3)])
    for name in ("m0", "m1"):
        s._pending.apply("ADDED", _member(name))
    await _one_batch(s)
    assert api.bound == []
    assert "gang default/train: 2 of at least 3 members are pending" in api.failed("default/m0")[-1]
    s._pending.apply("ADDED", _member("m2"))
    while s.queue.counts().active or s.queue.counts().backoff:
        await _one_batch(s)
    assert sorted(api.bound) == ["default/m0", "default/m1", "default/m2"]
    assert not [e for e in api.events if e[1] == "PodGroupMissing"]


async def test_the_annotation_wins_over_the_podgroup() -> None:
    api = RecordingApi()
    s = _scheduler(api)
    _groups(s).replace([_pod_group("train", 3)])
    for name in ("m0", "m1"):
        s._pending.apply("ADDED", _member(name, minimum=2))
    await _one_batch(s)
    assert sorted(api.bound) == ["default/m0", "default/m1"]


async def test_a_podgroup_changed_while_members_wait_wakes_them_with_its_new_minimum() -> None:
    api = RecordingApi()
    s = _scheduler(api)
    _groups(s).replace([_pod_group("train", 3)])
    for name in ("m0", "m1"):
        s._pending.apply("ADDED", _member(name))
    await _one_batch(s)
    assert api.bound == []
    assert s.queue.counts().unschedulable == 2  # parked: only a change wakes them before the flush
    _groups(s).apply("MODIFIED", _pod_group("train", 2))
    assert s.queue.counts().unschedulable == 0
    await _one_batch(s)
    assert sorted(api.bound) == ["default/m0", "default/m1"]


async def test_a_podgroup_created_after_its_members_holds_them_to_its_minimum() -> None:
    # No room for either member: they wait, as members of a gang of 1 each.  The PodGroup comes:
    # they are read again (woken), as members of a gang of 2.
    api = RecordingApi()
    s = _scheduler(api, gpus=0)
    _groups(s).replace([])
    for name in ("m0", "m1"):
        s._pending.apply("ADDED", _member(name))
    await _one_batch(s)
    assert s.queue.counts().unschedulable == 2
    assert all(e[1] == "PodGroupMissing" for e in api.events if e[1] != "FailedScheduling")
    _groups(s).apply("ADDED", _pod_group("train", 2))
    assert s.queue.counts().unschedulable == 0
    for key in ("default/m0", "default/m1"):
        record = s.queue.record(key)
        assert record is not None
        assert record.pod.gang is not None
        assert record.pod.gang.min_members == 2
    # Deleted: back to one by one.
    _groups(s).apply("DELETED", _pod_group("train", 2))
    record = s.queue.record("default/m0")
    assert record is not None
    assert record.pod.gang is not None
    assert record.pod.gang.min_members == 1


async def test_without_podgroup_nor_annotation_members_are_placed_one_by_one_and_warned_once() -> None:
    api = RecordingApi()
    s = _scheduler(api)
    _groups(s).unread(NOT_SERVED)
    s._pending.apply("ADDED", _member("m0"))
    await _one_batch(s)
    assert api.bound == ["default/m0"]  # the gang's other members have not come: placed anyway
    s._pending.apply("ADDED", _member("m1"))
    await _one_batch(s)
    assert api.bound == ["default/m0", "default/m1"]
    warned = [(key, message) for key, reason, message in api.events if reason == "PodGroupMissing"]
    message = (
        f"pod group default/train has no PodGroup object ({NOT_SERVED}) and no gpusched.io/gang-min-members "
        "annotation: members are placed one by one"
    )
    assert warned == [("default/m0", message), ("default/m1", message)]


async def test_a_member_drawn_again_is_not_warned_again_and_a_served_but_missing_podgroup_is_named() -> None:
    api = RecordingApi()
    s = _scheduler(api, gpus=0)  # no room: the member is drawn again and again
    _groups(s).replace([_pod_group("other", 2)])
    s._pending.apply("ADDED", _member("m0"))
    await _one_batch(s)
    s.queue.move_all()
    await _one_batch(s)
    assert len(api.failed("default/m0")) == 2  # drawn twice
    warned = [message for key, reason, message in api.events if reason == "PodGroupMissing"]
    assert warned == [
        "pod group default/train has no PodGroup object and no gpusched.io/gang-min-members annotation: "
        "members are placed one by one"
    ]
