"""A gang with a member whose request cannot be honoured as written, or short of its minimum.

These drive a real ``Scheduler`` (queue, cache, policy) with watch events as the API server
sends them; only the API server's answers (Bindings, Events, conditions) are scripted.  What is
checked is what a user sees: a gang short of its minimum without the invalid member binds no
member, the invalid member is told what is wrong with it, and its peers are told which member
holds the gang back and why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder
from gpusched.kube.client import Kube
from tests.doubles import IdleClient, RecordingApi, one_node_scheduler, settle
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0
HELD = "; no member is placed until all of them can be, together."


def _member(name: str, min_members: str | None = "2") -> dict[str, Any]:
    obj = kit.pod(name, "s", gpus=1)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}"})
    obj["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "g"}
    if min_members is not None:
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = min_members
    return obj


def _bad_min(obj: dict[str, Any]) -> None:
    obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "two"


def _fpga(obj: dict[str, Any]) -> None:
    obj["spec"]["containers"][0]["resources"]["limits"]["example.com/fpga"] = "1"


def _bad_cpu(obj: dict[str, Any]) -> None:
    obj["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "lots"


async def _run(members: list[dict[str, Any]], gpus: int = 8) -> RecordingApi:
    api = RecordingApi()
    s = one_node_scheduler(api, gpus)
    for obj in members:
        s._pending.apply("ADDED", obj)
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert sorted(r.key for r in batch) == sorted(f"default/{o['metadata']['name']}" for o in members)
    await s.schedule_batch(batch)
    await asyncio.sleep(0)
    while s.pending_tasks():
        await asyncio.wait(s.pending_tasks())
    return api


@pytest.mark.parametrize(
    ("spoil", "cause"),
    [
        (_bad_min, "annotation gpusched.io/gang-min-members must be a whole number, got 'two'"),
        (
            _fpga,
            "resources example.com/fpga are not tracked by this scheduler, so it cannot tell which nodes "
            "have them; schedule this pod with another scheduler",
        ),
        (_bad_cpu, "resources cpu: "),
    ],
    ids=["malformed-annotation", "unsupported-resource", "unreadable-quantity"],
)
async def test_the_peers_of_an_invalid_member_are_told_which_member_holds_the_gang_and_why(
    spoil: Callable[[dict[str, Any]], None], cause: str
) -> None:
    """Two members of a gang of at least 2, one asking for what cannot be honoured: the peer is
    not told that a member is missing but which member is invalid and what is wrong with it."""
    invalid = _member("a")
    spoil(invalid)
    api = await _run([invalid, _member("b")])
    assert api.bound == []
    [told_a] = api.failed("default/a")
    assert told_a.startswith(f"pod default/a: {cause}")
    [told_b] = api.failed("default/b")
    assert (
        told_b
        == f"gang default/g: member default/a cannot be scheduled: {told_a.removeprefix('pod default/a: ')}{HELD}"
    )
    assert cause in told_b


@pytest.mark.parametrize("min_members", [None, "2"], ids=["default-minimum", "minimum-met-by-the-others"])
async def test_the_valid_members_are_placed_when_they_alone_reach_the_minimum(min_members: str | None) -> None:
    """A gang's minimum is what must be placed together (as with the coscheduling plugin): the
    valid members reach it without the invalid one, so they go, and the invalid one is told why
    it does not."""
    invalid = _member("a", min_members)
    _fpga(invalid)
    api = await _run([invalid, _member("b", min_members), _member("c", min_members)])
    assert sorted(api.bound) == ["default/b", "default/c"]
    [told] = api.failed("default/a")
    assert told.startswith("pod default/a: resources example.com/fpga ")
    assert api.failed("default/b") == api.failed("default/c") == []


async def test_when_the_valid_members_reach_the_minimum_capacity_is_blamed_not_the_invalid_one() -> None:
    """One GPU for a gang of at least 2 whose two valid members would be enough: what holds them
    back is the GPU, and that is what they are told."""
    invalid = _member("a")
    _fpga(invalid)
    api = await _run([invalid, _member("b"), _member("c")], gpus=1)
    assert api.bound == []
    for peer in ("default/b", "default/c"):
        [told] = api.failed(peer)
        assert "member default/a" not in told
        assert told.startswith("gang default/g: its 2 members do not all fit at once")


def _racks_scheduler(nodes: list[dict[str, Any]]) -> tuple[Scheduler, RecordingApi]:
    api = RecordingApi()
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy="cpsat"), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    for n in nodes:
        NodeHandler(s).apply("ADDED", n)
    return s, api


def _ranked(name: str, min_members: str, gpus: int = 8, key: str = "", node: str = "") -> dict[str, Any]:
    obj = _member(name, min_members)
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    if key:
        obj["metadata"]["annotations"]["gpusched.io/gang-topology-key"] = key
    if node:
        obj["spec"]["nodeName"] = node
    return obj


async def _one_batch(s: Scheduler) -> None:
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)


@pytest.mark.parametrize("launcher_first", [True, False])
async def test_members_that_disagree_on_the_gangs_rules_are_all_refused_whichever_comes_first(
    launcher_first: bool,
) -> None:
    """A launcher and its worker from two pod templates, only one of which asks for one rack: no
    rack holds both, and which rules win must not depend on which pod the watch delivered first."""
    s, api = _racks_scheduler([kit.node("n0", 8, "H100", rack="r1"), kit.node("n1", 8, "H100", rack="r2")])
    pods = [_ranked("launcher", "2"), _ranked("worker", "2", key="rack")]
    for obj in pods if launcher_first else pods[::-1]:
        s._pending.apply("ADDED", obj)
    await _one_batch(s)
    assert api.bound == []
    for key in ("default/launcher", "default/worker"):
        [told] = api.failed(key)
        assert told.startswith("gang default/g: its members disagree: ")
        assert "at least 2 members, no topology" in told
        assert "at least 2 members, required one rack" in told
        assert told.endswith(
            "give every member the same gpusched.io/gang-min-members, gpusched.io/gang-topology-key "
            "and gpusched.io/gang-topology"
        )


async def test_a_required_topology_key_that_no_node_has_is_named_in_the_message() -> None:
    s, api = _racks_scheduler([kit.node(f"n{i}", 8, "H100", rack="r1") for i in range(2)])
    for i in range(2):
        s._pending.apply("ADDED", _ranked(f"m{i}", "2", gpus=1, key="rakc"))  # a typo for rack
    await _one_batch(s)
    assert api.bound == []
    [told] = api.failed("default/m0")
    assert told == (
        "gang default/g: its members must share one rakc domain, but no node has a rakc label; "
        "label the nodes, or check the gang's topology key"
    )


async def test_members_of_a_gang_still_terminating_do_not_let_a_new_member_go_alone() -> None:
    """A job restarted while its old members terminate: the old members hold their GPUs until they
    are gone, but the new members are placed together, not one by one on the strength of the old."""
    s, api = _racks_scheduler([kit.node(f"n{i}", 8, "H100") for i in range(8)])
    for i in range(4):
        old = _ranked(f"old{i}", "4", node=f"n{i}")
        old["metadata"]["deletionTimestamp"] = "2026-12-06T08:00:00Z"
        s._bound.apply("ADDED", old)
    s._pending.apply("ADDED", _ranked("new0", "4"))
    await _one_batch(s)
    assert api.bound == []
    [told] = api.failed("default/new0")
    assert told.startswith("gang default/g: 1 of at least 4 members are pending")
    assert s.cache.snapshot().state.gpu_used.sum() == 4 * 8 * 1000  # the old ones still hold theirs


@pytest.mark.parametrize("why", ["invalid-member", "disagreeing-members"])
async def test_members_no_new_node_would_place_are_no_demand_for_new_nodes(why: str) -> None:
    """The autoscaling signal counts the pods more nodes would place: not a gang held back by a
    member no node takes as written, nor one whose members disagree on its rules."""
    s, api = _racks_scheduler([kit.node("n0", 1, "H100", rack="r1")])
    if why == "invalid-member":
        pods = [_member("a"), _member("b")]
        _fpga(pods[0])
    else:
        pods = [_ranked("a", "2", gpus=1), _ranked("b", "2", gpus=1, key="rack")]
    for obj in pods:
        s._pending.apply("ADDED", obj)
    await _one_batch(s)
    assert api.bound == []
    assert len(s.unschedulable_records()) == 2
    assert s.waiting(s.unschedulable_records()) == []


async def test_a_member_told_its_gang_is_short_is_drawn_again_when_a_peer_shows_up_bound() -> None:
    """After a fail-over the last leader's Binding of one member lands after the other member was
    told its gang is short (or a member is pinned to its node): the gang has its minimum now, and
    the waiting member is placed at once, not after the next flush of parked pods."""
    api = RecordingApi()
    s = one_node_scheduler(api, 4)
    s._pending.apply("ADDED", _member("m2"))
    await _one_batch(s)
    assert s.queue.counts().unschedulable == 1
    peer = _member("m1")
    peer["spec"]["nodeName"] = "n0"
    s._bound.apply("ADDED", peer)
    await _one_batch(s)
    assert api.bound == ["default/m2"]


async def test_a_gang_with_a_member_running_is_told_its_minimum_as_its_owner_wrote_it() -> None:
    api = RecordingApi()
    s = one_node_scheduler(api, 8)
    running = _member("m1", "4")
    running["spec"]["nodeName"] = "n0"
    s._bound.apply("ADDED", running)
    for name in ("m2", "m3"):
        s._pending.apply("ADDED", _member(name, "4"))
    await _one_batch(s)
    assert api.bound == []
    [told] = api.failed("default/m2")
    assert told.startswith("gang default/g: 2 pending and 1 running of at least 4 members;"), told


async def test_deleting_the_member_that_disagrees_lets_its_peers_be_placed_at_once() -> None:
    """The member asking for another minimum is deleted: the rest are placed now, not after the
    next flush of parked pods."""
    api = RecordingApi()
    s = one_node_scheduler(api, 8)
    for name, minimum in (("a", "2"), ("b", "3"), ("c", "2")):
        s._pending.apply("ADDED", _member(name, minimum))
    await _one_batch(s)
    assert api.bound == []
    s._pending.apply("DELETED", _member("b", "3"))
    await _one_batch(s)  # TimeoutError: nobody drawn
    assert sorted(api.bound) == ["default/a", "default/c"]


async def test_the_peers_of_an_invalid_member_of_a_gang_larger_than_its_minimum_are_told_its_minimum() -> None:
    """Four members of a gang of at least 3, two of them invalid: the other two wait for at least
    3 members to be placeable together, not for all four."""
    invalid = [_member(name, "3") for name in ("a", "b")]
    for obj in invalid:
        _fpga(obj)
    api = await _run([*invalid, _member("c", "3"), _member("d", "3")])
    assert api.bound == []
    [told_c] = api.failed("default/c")
    assert told_c.startswith("gang default/g: member default/")
    assert told_c.endswith("; no member is placed until at least 3 of them can be, together.")
