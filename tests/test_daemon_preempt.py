"""Preemption as the scheduler carries it out: who is evicted, what the preemptor waits for, and
what happens when an eviction is refused.

These drive a real ``Scheduler`` with watch events as the API server sends them; the Bindings and
deletions are answered as scripted (tests/e2e covers them on a real API server)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpusched.daemon import Scheduler, preemption
from gpusched.daemon import scheduler as daemon
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import condition_changes
from gpusched.kube.convert import pod_record
from gpusched.kube.watch import OptionalHandler
from gpusched.model import Pod
from tests.doubles import RecordingApi, member_pod, one_node_scheduler, settle, web_budget
from tests.e2e import kit

DRAWN_WITHIN_S = 10.0


class _Api(RecordingApi):
    """Bindings succeed; deletions succeed unless refused, and are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[tuple[str, str, str]] = []
        self.refuse = False
        self.refused: set[str] = set()  # victims whose deletion is refused
        self.nominated: dict[str, str | None] = {}

    async def preempt(self, victim: Pod, by: Pod, node: str) -> bool:
        self.evicted.append((victim.key, by.key, node))
        return not self.refuse and victim.key not in self.refused

    async def unschedulable(
        self,
        pod: Pod,
        message: str,
        current: str | None = None,
        nominated: str | None = None,
        current_nominated: str | None = None,
        still: Callable[[], bool] | None = None,
        **_: str | None,
    ) -> None:
        if still is not None and not still():  # as the binder asks before it sends
            return
        self.nominated[pod.key] = nominated


def _pod(name: str, priority: int, node: str = "", never: bool = False) -> dict[str, Any]:
    obj = member_pod(name, node=node)
    obj["spec"]["priority"] = priority
    if never:
        obj["spec"]["preemptionPolicy"] = "Never"
    return obj


def _member(name: str, priority: int, gang: str = "g") -> dict[str, Any]:
    """A one-GPU member of ``gang`` (at least 2 members)."""
    obj = member_pod(name, gang=gang)
    obj["spec"]["priority"] = priority
    return obj


async def _cycle(s: Scheduler) -> list[str]:
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    await s.schedule_batch(batch)
    await settle(s)
    return [r.key for r in batch]


async def test_the_preemptor_waits_for_its_victim_and_then_takes_its_room_before_anyone_else() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    for name, prio in (("low", 0), ("high", 100)):
        s._bound.apply("ADDED", _pod(name, prio, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == [("default/low", "default/urgent", "n0")]
    assert api.nominated["default/urgent"] == "n0"
    scraped = s.metrics.render()[0].decode()
    assert "gpusched_preemption_victims_total 1.0" in scraped
    assert "gpusched_preemption_attempts_total 1.0" in scraped
    assert api.failed("default/urgent")[-1].endswith("Preempting 1 pod(s) of lower priority on node n0.")
    # The victim is being deleted; a pod of equal priority that arrives now finds no room, and
    # the preemptor, tried again, waits and evicts no one else.
    victim = _pod("low", 0, node="n0")
    victim["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", victim)
    s._pending.apply("ADDED", _pod("rival", 50, never=True))
    drawn = await _cycle(s)
    assert "default/rival" in drawn
    assert api.evicted == [("default/low", "default/urgent", "n0")]
    assert api.failed("default/urgent")[-1].endswith("Waiting for 1 preempted pod(s) to leave node n0.")
    # Gone: the preemptor is bound to the room held for it, and the rival waits on.
    s._bound.apply("DELETED", victim)
    assert sorted(await _cycle(s)) == ["default/rival", "default/urgent"]  # both woken, one batch
    assert api.bound == ["default/urgent"]
    assert s.cache.nomination("default/urgent") is None
    assert "default/rival" in s.queue


async def test_a_refused_eviction_frees_the_preemptor_to_look_again_when_the_cluster_changes() -> None:
    api = _Api()
    api.refuse = True  # the victim cannot be deleted (a webhook, say)
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == [("default/low", "default/urgent", "n0")]
    assert s.cache.nomination("default/urgent") is None  # not waiting for a victim that stays
    # Not at once (the refusal is likely to stand), but when the cluster changes it looks again.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s.queue.next_batch(), 0.5)
    NodeHandler(s).apply("ADDED", kit.node("cpu-only", 0, ""))
    assert await _cycle(s) == ["default/urgent"]
    assert len(api.evicted) == 2


async def test_room_held_while_victims_leave_is_taken_by_no_pod_of_the_batch() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    for name in ("v1", "v2"):
        s._bound.apply("ADDED", _pod(name, 0, node="n0"))
    urgent = _pod("urgent", 50)
    urgent["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", urgent)
    assert await _cycle(s) == ["default/urgent"]
    assert sorted(v for v, _, _ in api.evicted) == ["default/v1", "default/v2"]
    # v1 is gone, v2 still terminating; a pod of lower priority arrives and is drawn with urgent.
    leaving = _pod("v2", 0, node="n0")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", leaving)
    s._bound.apply("DELETED", _pod("v1", 0, node="n0"))
    s._pending.apply("ADDED", _pod("q", 0, never=True))
    assert sorted(await _cycle(s)) == ["default/q", "default/urgent"]
    assert api.bound == []  # v1's GPU is urgent's, though v2 has not left yet
    s._bound.apply("DELETED", leaving)
    assert sorted(await _cycle(s)) == ["default/q", "default/urgent"]
    assert api.bound == ["default/urgent"]
    assert len(api.evicted) == 2  # and no one evicted again


async def test_a_victim_is_evicted_once_and_one_created_again_under_its_name_is_another_pod() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("web-0", 0, node="n0"))
    s._pending.apply("ADDED", _pod("u1", 50))
    assert await _cycle(s) == ["default/u1"]
    # Before the watch shows web-0 being deleted, u2 arrives: web-0 is u1's already.
    s._pending.apply("ADDED", _pod("u2", 50))
    assert await _cycle(s) == ["default/u2"]
    assert api.evicted == [("default/web-0", "default/u1", "n0")]
    assert api.failed("default/u2")[-1] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    # web-0 goes, and its StatefulSet creates it again at once, bound to n0 by its scheduler:
    # u1 waits for its victim no longer, and looks again.
    s._bound.apply("DELETED", _pod("web-0", 0, node="n0"))
    again = _pod("web-0", 0, node="n0")
    again["metadata"]["uid"] = "uid-web-0-again"
    s._bound.apply("ADDED", again)
    assert s.cache.nomination("default/u1") == ("n0", (0,), 0)
    drawn = await _cycle(s)
    assert "default/u1" in drawn
    assert api.evicted[-1] == ("default/web-0", "default/u1", "n0")
    assert len(api.evicted) == 2
    assert api.bound == []


async def test_no_preemption_for_a_pod_that_may_not_or_for_a_gang() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("polite", 50, never=True))
    assert await _cycle(s) == ["default/polite"]
    assert api.evicted == []
    assert api.failed("default/polite")[-1] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    # Nothing of lower priority runs: nothing to evict.
    s._pending.apply("ADDED", _pod("peer", 0))
    assert await _cycle(s) == ["default/peer"]
    assert api.evicted == []
    assert api.failed("default/peer")[-1] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    # Gangs are placed whole or not at all: one member's room is no use, so no pod is evicted
    # for a gang that could not all fit.
    s._pending.apply("DELETED", _pod("polite", 50, never=True))
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert api.evicted == []
    assert api.bound == []
    assert api.failed("default/m1")[-1].startswith("gang default/g: its 2 members do not all fit at once")
    assert s.cache.nomination("default/m1") is None


def _leaving(name: str, priority: int, node: str, preempted: bool = True) -> dict[str, Any]:
    """A pod being deleted on ``node``; with ``preempted``, marked so by a scheduler."""
    obj = _pod(name, priority, node=node)
    obj["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    if preempted:
        mark = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        obj["status"] = {"phase": "Running", "conditions": [mark]}
    return obj


async def test_room_is_held_for_a_pod_that_preempted_under_the_last_leader() -> None:
    # A new leader learns from nominatedNodeName where the pod preempted: while its victim
    # leaves, the room is held (a pod of lower priority drawn first does not take it), and it
    # evicts no one else.
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    victim = _leaving("victim", 0, "n0")
    s._bound.apply("ADDED", victim)
    urgent = _pod("urgent", 50)
    urgent["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    s._pending.apply("ADDED", urgent)
    assert s.cache.nomination("default/urgent") == ("n0", (0,), 1)
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == []
    assert api.failed("default/urgent")[-1].endswith("Waiting for 1 preempted pod(s) to leave node n0.")
    assert api.nominated["default/urgent"] == "n0"
    s._bound.apply("DELETED", victim)
    s._pending.apply("ADDED", _pod("early", 0))  # drawn in the same batch as urgent
    assert sorted(await _cycle(s)) == ["default/early", "default/urgent"]
    assert api.bound == ["default/urgent"]
    assert api.evicted == []


async def test_pods_deleted_for_other_reasons_are_no_one_s_room() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    s._bound.apply("ADDED", _leaving("rollout", 0, "n0", preempted=False))
    s._bound.apply("ADDED", _pod("other", 0, node="n0"))
    urgent = _pod("urgent", 50)
    urgent["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    s._pending.apply("ADDED", urgent)
    assert s.cache.nomination("default/urgent") is None
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == [("default/other", "default/urgent", "n0")]


async def _gang_preempting(api: _Api) -> Scheduler:
    """``_two_nodes`` with gang m1 + m2 (priority 50), each of which has evicted a pod there."""
    s = _two_nodes(api)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    await _cycle(s)
    assert len(api.evicted) == 2
    return s


def _two_nodes(api: _Api, priorities: tuple[int, int] = (0, 0)) -> Scheduler:
    """Nodes n0 and n1 of one GPU, running low-0 and low-1 of ``priorities``."""
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    for i, priority in enumerate(priorities):
        s._bound.apply("ADDED", _pod(f"low-{i}", priority, node=f"n{i}"))
    return s


async def test_a_victim_stuck_on_a_node_that_went_away_frees_the_preemptor() -> None:
    # The victim's node becomes unreachable: it will not leave, and the node takes nothing
    # new anyway.  The preemptor gives its room up and preempts elsewhere.
    api = _Api()
    s = _two_nodes(api, (0, 1))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted == [("default/low-0", "default/urgent", "n0")]
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))
    down = kit.node("n0", 1, "A100")
    down["spec"] = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("MODIFIED", down)
    assert await _cycle(s) == ["default/urgent"]
    assert api.evicted[-1] == ("default/low-1", "default/urgent", "n1")
    assert s.cache.nomination("default/urgent") == ("n1", (0,), 1)


def test_disruption_budgets_follow_the_watch() -> None:
    s = one_node_scheduler(_Api(), gpus=1)
    handler = next(r.handler for r in s.reflectors if r.name == "disruption-budgets")

    def budget(name: str, allowed: int, selector: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": allowed},
        }

    web = {"matchLabels": {"app": "web"}}
    bad = {"matchExpressions": [{"key": "app", "operator": "Gt"}]}
    handler.replace([budget("web", 0, web), budget("bad", 1, bad)])
    assert {k: b.allowed for k, b in s.budgets.items()} == {"default/web": 0}  # bad: protects nothing
    handler.apply("MODIFIED", budget("web", 2, web))
    handler.apply("ADDED", budget("db", 1, {"matchLabels": {"app": "db"}}))
    assert {k: b.allowed for k, b in s.budgets.items()} == {"default/web": 2, "default/db": 1}
    handler.apply("MODIFIED", budget("db", 1, bad))  # a selector made unreadable: it protects nothing
    handler.apply("DELETED", budget("web", 2, web))
    assert s.budgets == {}


async def test_a_gang_preempts_for_all_its_members_waits_for_every_victim_then_binds_whole() -> None:
    api = _Api()
    s = _two_nodes(api)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert sorted(v for v, _, _ in api.evicted) == ["default/low-0", "default/low-1"]
    assert sorted(api.nominated[f"default/{m}"] or "" for m in ("m1", "m2")) == ["n0", "n1"]
    assert api.failed("default/m1")[-1].endswith(
        "Preempting 2 pod(s) of lower priority on node(s) n0, n1 to make room for the whole gang."
    )
    assert "gpusched_preemption_attempts_total 2.0" in s.metrics.render()[0].decode()
    # low-0 goes, low-1 is still leaving.  A pod of the gang's priority drawn now does not take
    # the room freed on n0: the gang would then never fit.  Nor is anyone else evicted.
    leaving = _leaving("low-1", 0, "n1")
    s._bound.apply("MODIFIED", leaving)
    s._bound.apply("DELETED", _pod("low-0", 0, node="n0"))
    s._pending.apply("ADDED", _pod("rival", 50, never=True))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2", "default/rival"]
    assert api.bound == []
    assert len(api.evicted) == 2
    assert api.failed("default/m2")[-1].endswith("Waiting for 1 preempted pod(s) to leave node(s) n0, n1.")
    assert sorted(api.nominated[f"default/{m}"] or "" for m in ("m1", "m2")) == ["n0", "n1"]
    # The last victim goes: the whole gang is bound to its room, before the rival is solved.
    s._bound.apply("DELETED", leaving)
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2", "default/rival"]
    assert sorted(api.bound) == ["default/m1", "default/m2"]
    assert s.cache.nomination("default/m1") is None
    assert len(api.evicted) == 2
    assert "default/rival" in s.queue


async def test_a_gang_that_cannot_make_room_for_every_member_preempts_for_its_minimum() -> None:
    """One node of 2 GPUs, both held by pods of priority 0; a gang of 3 one-GPU members of
    priority 50, minimum 2: no room can be made for all 3, but for 2.  Two members hold room,
    the third waits beside them; once the victims are gone the two are bound to their room."""
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    for i in (0, 1):
        s._bound.apply("ADDED", _pod(f"low-{i}", 0, node="n0"))
    keys = [f"default/m{i}" for i in (1, 2, 3)]
    for key in keys:
        s._pending.apply("ADDED", _member(key.split("/")[1], 50))
    await _cycle(s)
    assert sorted(v for v, _, _ in api.evicted) == ["default/low-0", "default/low-1"]
    roomed = sorted(k for k in keys if api.nominated.get(k) == "n0")
    [extra] = set(keys) - set(roomed)
    assert len(roomed) == 2
    assert api.nominated[extra] is None
    doing = "Preempting 2 pod(s) of lower priority on node(s) n0 to make room for 2 of its 3 pending members, at least"
    assert all(api.failed(k)[-1].endswith(f"{doing} its minimum.") for k in roomed)
    assert api.failed(extra)[-1].endswith(f"{doing} its minimum. This member is placed beside them once it fits.")
    for i in (0, 1):
        s._bound.apply("MODIFIED", _leaving(f"low-{i}", 0, "n0"))
        s._bound.apply("DELETED", _leaving(f"low-{i}", 0, "n0"))
    await _cycle(s)
    assert sorted(api.bound) == roomed
    assert len(api.evicted) == 2
    assert extra in s.queue, "the member left without room still waits"


async def test_a_gang_preempts_for_every_member_where_it_can_rather_than_its_minimum() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=3)
    for i in (0, 1, 2):
        s._bound.apply("ADDED", _pod(f"low-{i}", 0, node="n0"))
    for i in (1, 2, 3):
        s._pending.apply("ADDED", _member(f"m{i}", 50))
    await _cycle(s)
    assert len(api.evicted) == 3
    assert all(api.nominated[f"default/m{i}"] == "n0" for i in (1, 2, 3))
    assert api.failed("default/m1")[-1].endswith("to make room for the whole gang.")


async def test_a_gang_preempts_only_pods_of_lower_priority_than_every_member() -> None:
    api = _Api()
    s = _two_nodes(api, (0, 30))
    s._pending.apply("ADDED", _member("m1", 50))
    s._pending.apply("ADDED", _member("m2", 20))  # may evict low-0 but not low-1
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert api.evicted == []
    assert api.failed("default/m2")[-1].startswith("gang default/g: its 2 members do not all fit at once")
    # A member that may not preempt holds the whole gang back.
    s._pending.apply("DELETED", _member("m1", 50))
    s._pending.apply("DELETED", _member("m2", 20))
    polite = _member("p2", 50, gang="h")
    polite["spec"]["preemptionPolicy"] = "Never"
    s._pending.apply("ADDED", _member("p1", 50, gang="h"))
    s._pending.apply("ADDED", polite)
    assert sorted(await _cycle(s)) == ["default/p1", "default/p2"]
    assert api.evicted == []
    assert api.failed("default/p1")[-1].startswith("gang default/h: its 2 members do not all fit at once")


async def test_a_pod_a_gang_of_mixed_priorities_went_ahead_of_does_not_evict_its_member() -> None:
    """Members of priority 100 and 0, and a pod of priority 50, in one batch on 2 GPUs: the gang
    goes at its lowest member's priority, as it preempts, so the pod takes the room first and
    the gang is not placed only to be broken by that pod right after."""
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    for obj in (_member("hi", 100), _member("lo", 0), _pod("mid", 50)):
        s._pending.apply("ADDED", obj)
    await _cycle(s)
    assert api.bound == ["default/mid"]
    assert api.evicted == []
    assert api.failed("default/lo")[-1].startswith("gang default/g: its 2 members do not all fit at once")


async def test_a_gang_whose_eviction_is_refused_gives_all_its_room_up_and_looks_again_later() -> None:
    api = _Api()
    api.refuse = True
    s = _two_nodes(api)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    await _cycle(s)
    assert len(api.evicted) == 2
    # A refusal gives up the room of the whole gang; it looks again (and preempts anew) when
    # the cluster changes, not at once.
    assert s.cache.gang_nominations("default/g") == []
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s.queue.next_batch(), 0.5)
    NodeHandler(s).apply("ADDED", kit.node("cpu-only", 0, ""))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert len(api.evicted) == 4


async def test_a_gang_left_short_of_members_gives_up_the_room_its_members_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    # The room kept for a member created again under its name is kept no longer than the grace.
    monkeypatch.setattr(preemption, "GANG_MEMBER_GRACE_S", 0.0)
    api = _Api()
    s = await _gang_preempting(api)
    s._pending.apply("DELETED", _member("m2", 50))
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))  # wakes m1 while its victim leaves
    assert await _cycle(s) == ["default/m1"]
    assert s.cache.nomination("default/m1") is None
    assert api.nominated["default/m1"] is None
    assert api.failed("default/m1")[-1].startswith("gang default/g: 1 of at least 2 members are pending")
    assert len(api.evicted) == 2


async def test_a_gang_member_created_again_while_its_victims_leave_takes_its_namesakes_room() -> None:
    """m1 is deleted and created again (a controller replacing it) while the gang's victims
    leave: the gang keeps its room meanwhile, a pod of lower priority does not take it, and the
    gang is bound there once whole, with no one else evicted."""
    api = _Api()
    s = _two_nodes(api)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    s._pending.apply("DELETED", _member("m1", 50))
    for i in (0, 1):
        s._bound.apply("MODIFIED", _leaving(f"low-{i}", 0, f"n{i}"))
    s._bound.apply("DELETED", _leaving("low-0", 0, "n0"))
    s._pending.apply("ADDED", _pod("q", 10, never=True))
    assert sorted(await _cycle(s)) == ["default/m2", "default/q"]
    assert api.bound == [], "q takes no room of the gang"
    assert s.cache.nomination("default/m1") is not None
    assert api.nominated["default/m2"] == "n1"
    assert "deleted while the gang waited for its victims" in api.failed("default/m2")[-1]
    again = _member("m1", 50)
    again["metadata"]["uid"] = "uid-m1-again"
    s._pending.apply("ADDED", again)
    s._bound.apply("DELETED", _leaving("low-1", 0, "n1"))
    assert "default/m1" in await _cycle(s)
    assert sorted(api.bound) == ["default/m1", "default/m2"]
    assert s.cache.placement("default/m1") == ("n0", (0,)), "in its namesake's room"
    assert len(api.evicted) == 2


def _of_three(name: str) -> dict[str, Any]:
    obj = _member(name, 50)
    obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "3"
    return obj


@pytest.mark.parametrize("fourth", ["pending-already", "created-after"])
async def test_a_deleted_members_room_goes_to_a_pending_member_that_completes_the_gang(fourth: str) -> None:
    """A gang of four (minimum 3) finds room for three members only; one of them is deleted
    while the victims leave.  The fourth member, pending without room (or created just after),
    completes the gang with the other two: the room is not kept idle for a namesake that may
    never come, and the gang is bound as soon as the victims are gone."""
    api = _Api()
    s = one_node_scheduler(api, gpus=3)
    for i in (0, 1, 2):
        s._bound.apply("ADDED", _pod(f"low-{i}", 0, node="n0"))
    names = ["a", "b", "c", "d"] if fourth == "pending-already" else ["a", "b", "c"]
    for name in names:
        s._pending.apply("ADDED", _of_three(name))
    await _cycle(s)
    holding = sorted(k for k in s.queue.pending_keys() if s.cache.nomination(k) is not None)
    assert len(holding) == 3
    assert len(api.evicted) == 3
    gone = holding[0].split("/")[1]
    s._pending.apply("DELETED", _of_three(gone))
    if fourth == "created-after":
        s._pending.apply("ADDED", _of_three("d"))
    for i in (0, 1, 2):
        s._bound.apply("MODIFIED", _leaving(f"low-{i}", 0, "n0"))
        s._bound.apply("DELETED", _leaving(f"low-{i}", 0, "n0"))
    for _ in range(3):  # (a batch or two: not a minute of them)
        if len(api.bound) == 3:
            break
        await _cycle(s)
    assert sorted(api.bound) == sorted(f"default/{n}" for n in ["a", "b", "c", "d"] if n != gone)
    assert len(api.evicted) == 3


async def test_the_room_kept_for_a_member_deleted_in_its_batch_outlasts_an_unrelated_pod_leaving() -> None:
    """m1 is deleted (to be created again) while its gang is drawn again: its room is kept for
    its namesake.  Another pending pod leaving does not give it up: m1, deleted, is no member."""
    api = _Api()
    s = await _gang_preempting(api)
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))  # a victim leaves: the gang is drawn again
    drawn = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    assert "default/m1" in {r.key for r in drawn}
    s._pending.apply("DELETED", _member("m1", 50))  # deleted while in flight
    assert "default/m1" in s.rooms.kept
    s._pending.apply("ADDED", _pod("other", 0))
    s._pending.apply("DELETED", _pod("other", 0))
    s.rooms.expire_kept()  # (as each batch does)
    assert "default/m1" in s.rooms.kept
    assert s.cache.nomination("default/m1") is not None


async def test_the_room_kept_for_a_deleted_gang_member_goes_with_the_rest_of_its_gang() -> None:
    api = _Api()
    s = _two_nodes(api)
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    await _cycle(s)
    s._pending.apply("DELETED", _member("m1", 50))
    assert s.cache.nomination("default/m1") is not None
    s._pending.apply("DELETED", _member("m2", 50))  # the whole job is gone
    assert s.cache.nomination("default/m1") is None
    assert s.cache.nomination("default/m2") is None


async def test_no_room_is_kept_for_a_deleted_member_when_the_rest_of_its_gang_meet_its_minimum() -> None:
    """A gang of 3 (minimum 2) preempts for all three; m3 is deleted while the victims leave:
    m1 and m2 still make the minimum, so m3's room is given up at once (a pod of lower priority
    takes it), and m1 and m2 are bound once their victims are gone."""
    api = _Api()
    s = one_node_scheduler(api, gpus=3)
    for i in (0, 1, 2):
        s._bound.apply("ADDED", _pod(f"low-{i}", 0, node="n0"))
    for i in (1, 2, 3):
        s._pending.apply("ADDED", _member(f"m{i}", 50))
    await _cycle(s)
    assert len(api.evicted) == 3
    s._pending.apply("DELETED", _member("m3", 50))
    assert s.cache.nomination("default/m3") is None
    for i in (0, 1, 2):
        s._bound.apply("MODIFIED", _leaving(f"low-{i}", 0, "n0"))
        s._bound.apply("DELETED", _leaving(f"low-{i}", 0, "n0"))
    s._pending.apply("ADDED", _pod("q", 10, never=True))
    await _cycle(s)
    assert sorted(api.bound) == ["default/m1", "default/m2", "default/q"]
    assert len(api.evicted) == 3


async def test_a_running_gang_is_not_left_short_when_other_pods_can_make_room() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("n1", 2, "A100"))
    for name in ("w0", "w1"):  # a running job of two, the least important pods there are
        s._bound.apply("ADDED", member_pod(name, gang="job", node="n0"))
    for name in ("o0", "o1"):
        s._bound.apply("ADDED", _pod(name, 1, node="n1"))
    urgent = _pod("urgent", 50)
    urgent["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", urgent)
    assert await _cycle(s) == ["default/urgent"]
    assert sorted(api.evicted) == [("default/o0", "default/urgent", "n1"), ("default/o1", "default/urgent", "n1")]


@pytest.mark.parametrize("member", ["on-a-node-being-repartitioned", "binding-in-flight"])
async def test_a_running_gang_counts_the_members_preemption_may_not_touch_toward_its_minimum(
    monkeypatch: pytest.MonkeyPatch, member: str
) -> None:
    """Gang g (two members, its minimum) runs m1 on n1 and m2 on n0.  With m1 out of
    preemption's reach (its node being re-partitioned into MIG instances, or its Binding not
    confirmed yet), m2 is still one of two: evicting it would leave the job short, so the pod
    of lower priority elsewhere goes instead."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 2, "A100"))
    NodeHandler(s).apply("ADDED", kit.node("n2", 1, "A100"))
    first = member_pod("m1", gang="g", node="n1")
    if member == "binding-in-flight":
        first["spec"].pop("nodeName")
        s.cache.assume(pod_record(first).pod, "n1", (0,))
    else:
        s._bound.apply("ADDED", first)
        monkeypatch.setattr(s.mig, "sealed", lambda: {"n1"})
    s._bound.apply("ADDED", member_pod("m2", gang="g", node="n0"))
    s._bound.apply("ADDED", _pod("x", 5, node="n2"))
    s._bound.apply("ADDED", _pod("big", 1000, node="n1"))
    s._pending.apply("ADDED", _pod("p", 50))
    assert await _cycle(s) == ["default/p"]
    assert api.evicted == [("default/x", "default/p", "n2")]


async def test_a_gang_member_deleted_during_the_search_drops_the_gang_before_any_pod_evicts_for_its_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n0 runs v (priority 0, 3 GPUs) and w (priority 5, 1 GPU).  The search finds the gang g1+g2
    its room by evicting v, and p (2 GPUs) room in v's spare GPU and w's.  g2 is deleted while
    the search runs: the gang goes without, so no pod may count on v leaving: p evicts v, not w
    (which would have been evicted for nothing, p's room still taken by v)."""
    api = _Api()
    s = one_node_scheduler(api, gpus=4)
    v, w, p = _pod("v", 0, node="n0"), _pod("w", 5, node="n0"), _pod("p", 50)
    for obj, gpus in ((v, "3"), (p, "2")):
        obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    for obj in (v, w):
        s._bound.apply("ADDED", obj)
    for name in ("g1", "g2"):
        s._pending.apply("ADDED", _member(name, 100))
    s._pending.apply("ADDED", p)
    loop = asyncio.get_running_loop()
    real = preemption.plan_preemptions
    deleted = threading.Event()

    def racing(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)

        def delete() -> None:
            s._pending.apply("DELETED", _member("g2", 100))
            deleted.set()

        loop.call_soon_threadsafe(delete)
        deleted.wait(DRAWN_WITHIN_S)
        return found

    monkeypatch.setattr(preemption, "plan_preemptions", racing)
    await _cycle(s)
    assert deleted.is_set()
    assert s.cache.nomination("default/g1") is None
    assert [(victim, by) for victim, by, _ in api.evicted if by == "default/p"] in ([], [("default/v", "default/p")])
    monkeypatch.undo()
    for _ in range(3):  # p went without this time: it looks again soon, not after a minute
        if api.evicted:
            break
        await _cycle(s)
    assert [(victim, by) for victim, by, _ in api.evicted] == [("default/v", "default/p")]


async def test_a_pod_created_again_under_its_name_unseen_by_a_relist_does_not_inherit_the_room() -> None:
    """urgent preempted low and holds its room; the watch ends (410) and, before the relist,
    urgent is deleted and created again (priority 0, preemptionPolicy Never).  The relist shows
    the new pod only: the room and nomination were the old pod's, not the new one's, as the
    watch's DELETED would have told."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    assert s.cache.nomination("default/urgent") is not None
    again = _pod("urgent", 0, never=True)
    again["metadata"]["uid"] = "uid-urgent-again"
    s._pending.replace([again])
    assert s.cache.nomination("default/urgent") is None
    s._bound.apply("DELETED", _pod("low", 0, node="n0"))  # the victim leaves: its room is anyone's
    s._pending.apply("ADDED", _pod("rival", 10, never=True))
    await _cycle(s)
    assert api.bound == ["default/rival"]  # the more important of the two, not the room's inheritor


class _VictimLeavesDuringTheSolve:
    """The batch's solve waits in its worker thread until ``leave`` has run on the loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, leave: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        real: Callable[..., Any] = daemon._solve
        done = threading.Event()

        def run() -> None:
            leave()
            done.set()

        def solve(*args: Any) -> Any:
            loop.call_soon_threadsafe(run)
            done.wait(DRAWN_WITHIN_S)
            return real(*args)

        monkeypatch.setattr(daemon, "_solve", solve)


async def test_victims_gone_during_the_solve_leave_the_room_held_and_the_pod_is_bound_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The preemptor is drawn while its victim is still leaving, so the solve counts the victim
    # and finds no room; the victim goes during the solve.  The room was never offered to the
    # pod: it is kept, no one else is evicted, and the pod is bound to it next.
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    assert await _cycle(s) == ["default/urgent"]
    victim = _leaving("low", 0, "n0")
    s._bound.apply("MODIFIED", victim)
    s._bound.apply("ADDED", _pod("other", 10, node="cpu-0"))  # something else to evict, elsewhere
    _VictimLeavesDuringTheSolve(monkeypatch, lambda: s._bound.apply("DELETED", victim))
    s._pending.apply("ADDED", _pod("poke", 0, never=True))  # a batch is drawn with urgent in it
    drawn = await _cycle(s)
    assert "default/urgent" in drawn
    assert api.evicted == [("default/low", "default/urgent", "n0")]
    assert s.cache.nomination("default/urgent") == ("n0", (0,), 0)
    monkeypatch.undo()
    assert "default/urgent" in await _cycle(s)
    assert api.bound == ["default/urgent"]


async def test_a_gang_whose_victims_leave_during_the_solve_keeps_its_room(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _Api()
    s = await _gang_preempting(api)
    leaving = [_leaving(f"low-{i}", 0, f"n{i}") for i in range(2)]
    for obj in leaving:
        s._bound.apply("MODIFIED", obj)

    def leave() -> None:
        for obj in leaving:
            s._bound.apply("DELETED", obj)

    _VictimLeavesDuringTheSolve(monkeypatch, leave)
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2"]
    assert len(api.evicted) == 2
    monkeypatch.undo()
    s._pending.apply("ADDED", _pod("rival", 50, never=True))  # drawn with the gang: it waits
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2", "default/rival"]
    assert sorted(api.bound) == ["default/m1", "default/m2"]


async def test_one_refused_eviction_gives_up_the_whole_gangs_room_for_other_pods() -> None:
    # m1 fits on n1 as things are, m2 must evict low-0 on n0, whose deletion is refused: the
    # gang waits for nothing now, and the GPU held for m1 goes to the next pod.
    api = _Api()
    api.refused = {"default/low-0"}
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    s._bound.apply("ADDED", _pod("low-0", 0, node="n0"))
    for name in ("m1", "m2"):
        s._pending.apply("ADDED", _member(name, 50))
    await _cycle(s)
    assert api.evicted == [("default/low-0", api.evicted[0][1], "n0")]
    assert s.cache.gang_nominations("default/g") == []
    s._pending.apply("ADDED", _pod("q", 0, never=True))
    assert await _cycle(s) == ["default/q"]
    assert api.bound == ["default/q"]


async def test_after_a_failover_a_gang_member_keeps_room_it_held_without_victims() -> None:
    # The last leader preempted for m1 on n0 (its victim still leaving) and held free n1 for m2.
    # A pod of lower priority drawn with the gang does not take n1, and no one is evicted.
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    victim = _leaving("victim", 0, "n0")
    s._bound.apply("ADDED", victim)
    for name, node in (("m1", "n0"), ("m2", "n1")):
        obj = _member(name, 50)
        obj["status"] = {"phase": "Pending", "nominatedNodeName": node}
        s._pending.apply("ADDED", obj)
    assert s.cache.nomination("default/m2") == ("n1", (0,), 0)
    s._pending.apply("ADDED", _pod("q", 0, never=True))
    assert sorted(await _cycle(s)) == ["default/m1", "default/m2", "default/q"]
    assert api.bound == []
    assert api.failed("default/m2")[-1].endswith("Waiting for 1 preempted pod(s) to leave node(s) n0, n1.")
    s._bound.apply("DELETED", victim)
    await _cycle(s)
    assert sorted(api.bound) == ["default/m1", "default/m2"]
    assert api.evicted == []


def test_two_members_held_again_on_one_node_after_a_failover_hold_different_gpus() -> None:
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    for g in range(2):
        victim = _leaving(f"victim-{g}", 0, "n0")
        victim["metadata"]["annotations"]["gpusched.io/gpu-indices"] = str(g)
        s._bound.apply("ADDED", victim)
    s.cache.snapshot()  # the books as a running scheduler keeps them: GPUs picked
    for name in ("m1", "m2"):
        obj = _member(name, 50)
        obj["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
        s._pending.apply("ADDED", obj)
    rooms = [s.cache.nomination(f"default/{m}") for m in ("m1", "m2")]
    assert sorted(r[1] for r in rooms if r is not None) == [(0,), (1,)]


class _EchoApi(_Api):
    """Status writes come back on the pending watch, as the API server sends them (nothing is
    written for an unchanged message); ``refusal_first``: a refused deletion is answered before
    the echo of the preemptor's status write arrives."""

    def __init__(self, refusal_first: bool) -> None:
        super().__init__()
        self.refusal_first = refusal_first
        self.scheduler: Scheduler | None = None
        self.objects: dict[str, dict[str, Any]] = {}

    async def preempt(self, victim: Pod, by: Pod, node: str) -> bool:
        if not self.refusal_first:
            await asyncio.sleep(0.05)
        return await super().preempt(victim, by, node)

    async def unschedulable(
        self,
        pod: Pod,
        message: str,
        current: str | None = None,
        nominated: str | None = None,
        current_nominated: str | None = None,
        still: Callable[[], bool] | None = None,
        *,
        reason: str = "Unschedulable",
        current_reason: str | None = None,
        urgent: bool = False,
    ) -> None:
        await super().unschedulable(
            pod, message, current, nominated, current_nominated, still, reason=reason, current_reason=current_reason
        )
        if (
            not condition_changes(message, nominated, current, current_nominated, reason, current_reason)
            or (still is not None and not still())
            or pod.key not in self.objects
            or self.scheduler is None
        ):
            return
        obj = dict(self.objects[pod.key])
        told = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        obj["status"] = {"phase": "Pending", "nominatedNodeName": nominated, "conditions": [told]}
        if self.refusal_first:
            await asyncio.sleep(0.05)
        self.scheduler._pending.apply("MODIFIED", obj)


def _gang_beside_a_pod_that_will_not_go(api: _EchoApi) -> Scheduler:
    """n0 runs low-0, whose deletion is refused; n1 is free; gang g (m1, m2) of priority 50."""
    api.refused = {"default/low-0"}
    s = one_node_scheduler(api, gpus=1)
    api.scheduler = s
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    s._bound.apply("ADDED", _pod("low-0", 0, node="n0"))
    for name in ("m1", "m2"):
        api.objects[f"default/{name}"] = _member(name, 50)
        s._pending.apply("ADDED", api.objects[f"default/{name}"])
    return s


async def test_a_refused_gang_does_not_hold_its_room_again_from_its_own_status() -> None:
    api = _EchoApi(refusal_first=True)
    s = _gang_beside_a_pod_that_will_not_go(api)
    await _cycle(s)
    await asyncio.sleep(0.1)  # every echo delivered
    assert s.cache.gang_nominations("default/g") == []
    s._pending.apply("ADDED", _pod("q", 0, never=True))  # the GPU it held on n1 goes to the next pod
    assert await _cycle(s) == ["default/q"]
    assert api.bound == ["default/q"]


async def test_a_refused_gang_looks_again_once_per_change_not_in_a_loop() -> None:
    api = _EchoApi(refusal_first=False)
    s = _gang_beside_a_pod_that_will_not_go(api)
    s.queue.initial_backoff, s.queue.max_backoff = 0.1, 0.2
    await _cycle(s)
    await asyncio.sleep(0.1)
    NodeHandler(s).apply("ADDED", kit.node("cpu-only", 0, ""))  # one change: one more look
    batches = 0
    while batches < 10:
        try:
            batch = await asyncio.wait_for(s.queue.next_batch(), 1.0)
        except TimeoutError:
            break
        await s.schedule_batch(batch)
        await settle(s)
        batches += 1
    assert (batches, len(api.evicted)) == (1, 2)


def test_a_follower_holds_room_where_the_leaders_word_now_points() -> None:
    s = one_node_scheduler(_Api(), gpus=1)
    s._leadership(False)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    for name in ("m1", "m2"):
        obj = _member(name, 50)
        obj["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
        s._pending.apply("ADDED", obj)
    assert s.cache.nomination("default/m1") == ("n0", (0,), 0)
    for name, node in (("m1", "n1"), ("m2", None)):  # the leader moved m1's room, gave m2's up
        obj = _member(name, 50)
        obj["status"] = {"phase": "Pending", "nominatedNodeName": node}
        s._pending.apply("MODIFIED", obj)
    assert s.cache.nomination("default/m1") == ("n1", (0,), 0)
    assert s.cache.nomination("default/m2") is None


async def test_room_given_up_is_not_held_again_from_a_nomination_the_watch_shows_late() -> None:
    # Held again after a failover, on n0, which then becomes unreachable: the room is given up,
    # and nothing on n1 may be evicted.  An update of the pod that still shows the last
    # leader's nominatedNodeName does not bring the room back.
    api = _Api()
    s = _two_nodes(api, (0, 60))
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))
    urgent = _pod("urgent", 50)
    urgent["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    s._pending.apply("ADDED", urgent)
    assert s.cache.nomination("default/urgent") == ("n0", (0,), 1)
    down = kit.node("n0", 1, "A100")
    down["spec"] = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}
    NodeHandler(s).apply("MODIFIED", down)
    assert await _cycle(s) == ["default/urgent"]
    assert s.cache.nomination("default/urgent") is None
    assert api.nominated["default/urgent"] is None
    s._pending.apply("MODIFIED", urgent)  # late: still the last leader's word
    assert s.cache.nomination("default/urgent") is None
    assert api.evicted == []


async def test_a_running_gang_keeps_its_minimum_in_the_books_after_each_member_was_recreated() -> None:
    # A gang of 2 (minimum 2) runs; m1 and then m2 are deleted and recreated, each placed beside
    # the other (counted against a minimum of 1 for that solve).  The books must still read
    # the gang's minimum as 2: preemption may not evict one member and leave the job short.
    from gpusched.solver.preempt import gang_budgets

    api = _Api()
    s = one_node_scheduler(api, gpus=2)

    def running(name: str, uid: str) -> dict[str, Any]:
        obj = _member(name, 50)
        obj["metadata"]["uid"] = uid
        obj["spec"]["nodeName"] = "n0"
        return obj

    for m in ("m1", "m2"):
        s._bound.apply("ADDED", running(m, f"uid-{m}"))
    for m in ("m1", "m2"):
        s._bound.apply("DELETED", running(m, f"uid-{m}"))
        again = _member(m, 50)
        again["metadata"]["uid"] = f"uid-{m}-2"
        s._pending.apply("ADDED", again)
        await _cycle(s)
        assert f"default/{m}" in api.bound
        s._pending.apply("DELETED", again)
        s._bound.apply("ADDED", running(m, f"uid-{m}-2"))
    (budget,) = gang_budgets(s.cache.preemptible())
    assert budget.allowed == 0, budget


def _deleting(name: str, priority: int, node: str) -> dict[str, Any]:
    """A bound pod being deleted (its grace period running)."""
    obj = _pod(name, priority, node=node)
    obj["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    return obj


async def test_a_pod_of_higher_priority_takes_over_room_held_for_one_of_lower_priority() -> None:
    """ "mid" preempted "low"; while "low" terminates, "critical" comes. As kube-scheduler counts
    a nominated pod only against pods of no higher priority, critical takes mid's room, evicting
    no one more, and is bound once low is gone; mid gives it up and is told so."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._bound.apply("ADDED", _pod("other", 60, node="n1"))  # critical could preempt it: needlessly
    s._pending.apply("ADDED", _pod("mid", 50))
    await _cycle(s)
    assert api.evicted == [("default/low", "default/mid", "n0")]
    s._bound.apply("MODIFIED", _deleting("low", 0, "n0"))
    s._pending.apply("ADDED", _pod("critical", 1000))
    await _cycle(s)
    assert api.evicted == [("default/low", "default/mid", "n0")], "no one else evicted"
    assert s.cache.nomination("default/critical") == ("n0", (0,), 1)
    assert s.cache.nomination("default/mid") is None
    assert api.nominated == {"default/mid": None, "default/critical": "n0"}
    told = api.failed("default/mid")
    assert told
    assert "taken by pod default/critical, of higher priority (1000 > 50)" in told[-1]
    s._bound.apply("DELETED", _deleting("low", 0, "n0"))
    assert sorted(await _cycle(s)) == ["default/critical", "default/mid"]
    assert api.bound == ["default/critical"]
    assert [e for e in api.evicted if e[1] == "default/mid"] == [("default/low", "default/mid", "n0")]


async def test_a_pod_of_higher_priority_drawn_with_the_room_holder_gets_the_room() -> None:
    """mid's victim is gone and high comes in the same batch: as kube-scheduler counts a
    nominated pod only against pods of no higher priority, high takes the GPU; mid is not bound
    first only to be preempted by high at once, and looks again."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    assert await _cycle(s) == ["default/mid"]
    s._bound.apply("MODIFIED", _leaving("low", 0, "n0"))
    await _cycle(s)
    s._bound.apply("DELETED", _leaving("low", 0, "n0"))
    s._pending.apply("ADDED", _pod("high", 100))
    assert sorted(await _cycle(s)) == ["default/high", "default/mid"]
    assert api.bound == ["default/high"]
    assert api.evicted == [("default/low", "default/mid", "n0")], "no one else evicted"
    assert s.cache.nomination("default/mid") is None
    assert api.nominated["default/mid"] is None


async def test_a_pod_of_higher_priority_waiting_for_its_own_room_leaves_a_ready_room_to_its_holder() -> None:
    """high waits for its victim on n0, mid's victim on n1 is gone: mid is bound to its room.
    Were high to take it, the room high leaves would be of no use to mid, which would have to
    preempt again."""
    api = _Api()
    s = _two_nodes(api, (0, 1))
    s._pending.apply("ADDED", _pod("high", 100))
    assert await _cycle(s) == ["default/high"]
    s._pending.apply("ADDED", _pod("mid", 50))
    assert await _cycle(s) == ["default/mid"]
    assert api.evicted == [("default/low-0", "default/high", "n0"), ("default/low-1", "default/mid", "n1")]
    s._bound.apply("MODIFIED", _leaving("low-0", 0, "n0"))
    s._bound.apply("DELETED", _leaving("low-1", 1, "n1"))
    assert sorted(await _cycle(s)) == ["default/high", "default/mid"]
    assert api.bound == ["default/mid"]
    assert s.cache.nomination("default/high") == ("n0", (0,), 1)


async def test_a_never_pod_of_higher_priority_takes_over_a_lower_pods_room() -> None:
    """Taking over a nominated pod's room evicts no one, so a pod of higher priority that may not
    preempt may take it, as kube-scheduler lets it; and it keeps it while the victims leave."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    assert await _cycle(s) == ["default/mid"]
    s._bound.apply("MODIFIED", _leaving("low", 0, "n0"))
    s._pending.apply("ADDED", _pod("high", 100, never=True))
    assert "default/high" in await _cycle(s)
    assert s.cache.nomination("default/high") == ("n0", (0,), 1)
    assert api.nominated == {"default/mid": None, "default/high": "n0"}
    assert "taken by pod default/high, of higher priority (100 > 50)" in api.failed("default/mid")[-1]
    NodeHandler(s).apply("ADDED", kit.node("cpu-only", 0, ""))  # every parked pod looks again
    assert sorted(await _cycle(s)) == ["default/high", "default/mid"]
    assert api.nominated["default/high"] == "n0", "the room kept while its victim leaves"
    s._bound.apply("DELETED", _leaving("low", 0, "n0"))
    await _cycle(s)
    assert api.bound == ["default/high"]
    assert api.evicted == [("default/low", "default/mid", "n0")]


async def test_a_never_pod_does_not_evict_beside_a_room_it_cannot_take_alone() -> None:
    """Two GPUs: mid holds one (its victim leaving), low-b runs on the other.  high asks for
    both and may not preempt: it would have to evict low-b beside mid's room, which it may not."""
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._bound.apply("ADDED", _pod("low-b", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    assert await _cycle(s) == ["default/mid"]
    evicted = list(api.evicted)
    s._bound.apply("MODIFIED", _leaving(evicted[0][0].removeprefix("default/"), 0, "n0"))
    high = _pod("high", 100, never=True)
    high["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", high)
    assert "default/high" in await _cycle(s)
    assert api.evicted == evicted
    assert s.cache.nomination("default/high") is None
    assert s.cache.nomination("default/mid") is not None


async def test_a_room_holder_is_bound_first_beside_a_pod_of_higher_priority_that_its_room_would_not_take() -> None:
    """high asks for two GPUs: mid's room of one is no use to it, so mid is bound there first."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    assert await _cycle(s) == ["default/mid"]
    s._bound.apply("DELETED", _leaving("low", 0, "n0"))
    high = _pod("high", 100, never=True)
    high["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", high)
    assert sorted(await _cycle(s)) == ["default/high", "default/mid"]
    assert api.bound == ["default/mid"]


async def _mid_holds_room_while_low_leaves() -> tuple[Scheduler, _Api]:
    """One GPU: "mid" (50) preempted "low" (0), which is terminating; room is held for mid."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    await _cycle(s)
    s._bound.apply("MODIFIED", _deleting("low", 0, "n0"))
    return s, api


async def test_room_is_not_taken_over_by_a_pod_of_equal_or_lower_priority() -> None:
    s, api = await _mid_holds_room_while_low_leaves()
    s._pending.apply("ADDED", _pod("peer", 50))
    await _cycle(s)
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)
    assert s.cache.nomination("default/peer") is None
    s._bound.apply("DELETED", _deleting("low", 0, "n0"))
    await _cycle(s)
    assert api.bound == ["default/mid"]


async def test_a_refused_deletion_clears_the_preemptors_nominated_node() -> None:
    """The room is given up, and so is the pod's ``status.nominatedNodeName``: nothing (a cluster
    autoscaler, the next leader) is to take it for a pod on its way to that node."""
    api = _Api()
    api.refuse = True
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    await _cycle(s)
    await settle(s)
    assert s.cache.nomination("default/urgent") is None
    assert api.nominated["default/urgent"] is None
    told = api.failed("default/urgent")
    assert told
    assert "The deletion of pod default/low on node n0, which it preempted, failed" in told[-1]
    with pytest.raises(TimeoutError):  # not drawn again at once: a refused deletion is likely refused again
        await asyncio.wait_for(s.queue.next_batch(), 0.3)


async def test_a_budget_spent_by_an_earlier_batch_counts_until_its_status_is_written_again() -> None:
    """The disruption controller writes a budget's status some time after a deletion: until then
    the budget still reads as unspent, and the next batch's preemption must not spend it twice
    when a pod no budget protects would do."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    for n in ("n1", "n2"):
        NodeHandler(s).apply("ADDED", kit.node(n, 1, "A100"))
    web = {}
    for name, node, priority in (("web-0", "n0", 0), ("web-1", "n1", 0), ("other", "n2", 10)):
        obj = _pod(name, priority, node=node)
        if name.startswith("web"):
            obj["metadata"]["labels"]["app"] = "web"
            web[name] = obj
        s._bound.apply("ADDED", obj)
    budget = web_budget(s)
    s._pending.apply("ADDED", _pod("first", 50))
    await _cycle(s)
    assert [v for v, _, _ in api.evicted] == ["default/web-0"]
    web["web-0"]["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", web["web-0"])  # terminating; the budget's status not written yet
    s._pending.apply("ADDED", _pod("second", 50))
    await _cycle(s)
    assert [v for v, _, _ in api.evicted] == ["default/web-0", "default/other"]
    assert list(s.evicted_uncounted) == ["default/web-0"]
    # Its status written since (web-0 counted): it allows none, and says so itself.
    budgets = next(r.handler for r in s.reflectors if r.name == "disruption-budgets")
    budgets.apply("MODIFIED", {**budget, "status": {"disruptionsAllowed": 0}})
    assert not s.evicted_uncounted


class _Slow(_Api):
    """Deletions wait for ``release``, then are refused (a webhook, RBAC)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def preempt(self, victim: Pod, by: Pod, node: str) -> bool:
        self.evicted.append((victim.key, by.key, node))
        await self.release.wait()
        return False


async def test_room_taken_over_whose_victims_deletion_is_then_refused_is_given_up() -> None:
    """mid's victim's deletion is still in flight when critical takes mid's room over; then it is
    refused: the victim runs on, and critical must not wait for it for ever."""
    api = _Slow()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("mid", 50))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    s._pending.apply("ADDED", _pod("critical", 1000))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    assert s.cache.nomination("default/critical") == ("n0", (0,), 1)
    api.release.set()
    await settle(s)
    assert s.cache.nomination("default/critical") is None
    assert api.nominated["default/critical"] is None
    assert [a.pod.key for a in s.cache.preemptible()] == ["default/low"]  # it may be evicted again
    # Each is told what it waited for: critical preempted no one.
    assert api.failed("default/mid")[-1].startswith("The room held for it on node n0 was taken by pod")
    told = api.failed("default/critical")[-1]
    assert told == (
        "The deletion of pod default/low on node n0, that the room held for it there waited for, failed: "
        "the room is given up; it looks again when the cluster changes."
    )


async def test_a_pod_deleted_during_its_batch_takes_no_room_over() -> None:
    s, _ = await _mid_holds_room_while_low_leaves()
    s._pending.apply("ADDED", _pod("critical", 1000))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    s._pending.apply("DELETED", _pod("critical", 1000))  # while its batch is solved
    await s.schedule_batch(batch)
    await settle(s)
    assert s.cache.nomination("default/critical") is None
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)


async def test_a_refused_deletion_spends_no_budget() -> None:
    """The victim runs on: the budget that covers it still allows what it allowed."""
    api = _Api()
    api.refused = {"default/web-0"}
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("ADDED", kit.node("n1", 1, "A100"))
    for name, node, priority in (("web-0", "n0", 0), ("other", "n1", 10)):
        obj = _pod(name, priority, node=node)
        if name == "web-0":
            obj["metadata"]["labels"]["app"] = "web"
        s._bound.apply("ADDED", obj)
    web_budget(s)
    s._pending.apply("ADDED", _pod("first", 50))
    await _cycle(s)
    assert [v for v, _, _ in api.evicted] == ["default/web-0"]
    assert not s.evicted_uncounted


def test_the_start_time_the_kubelet_writes_after_the_bind_reaches_the_books() -> None:
    """Pods are seen bound before they start: their start time, which preemption's ties read,
    comes with a later update of the same pod."""
    s = one_node_scheduler(_Api(), gpus=1)
    obj = _pod("w", 0, node="n0")
    s._bound.apply("ADDED", obj)
    assert s.cache.preemptible()[0].pod.started == float("inf")
    obj["status"] = {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}
    s._bound.apply("MODIFIED", obj)
    assert s.cache.preemptible()[0].pod.started == 1_796_083_200.0


@pytest.mark.parametrize(
    "held",
    [
        {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"},
        {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "1"},
    ],
    ids=["two-slices", "a-gpu-and-a-slice"],
)
async def test_a_mig_pod_preempts_a_pod_another_scheduler_bound_onto_several_of_its_node_s_instances(
    held: dict[str, str],
) -> None:
    """Evicting such a pod frees every instance it holds: the slice the MIG pod wants among them."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    NodeHandler(s).apply("DELETED", kit.node("n0", 1, "A100"))
    m = kit.node("m", 1, "A100")
    m["status"]["allocatable"].update({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"})
    NodeHandler(s).apply("ADDED", m)
    foreign = kit.pod("foreign", "default-scheduler", node_name="m")
    foreign["spec"]["containers"][0]["resources"]["limits"] = dict(held)
    foreign["spec"]["priority"] = 0
    s._bound.apply("ADDED", foreign)
    want = _pod("want", 100)
    want["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-3g.40gb": "1"}
    s._pending.apply("ADDED", want)
    assert await _cycle(s) == ["default/want"]
    assert api.evicted == [("default/foreign", "default/want", "m")]
    assert api.failed("default/want")[-1].endswith("Preempting 1 pod(s) of lower priority on node m.")


async def test_room_taken_over_after_a_failover_is_not_held_again_from_the_last_leaders_word() -> None:
    """mid holds room from the last leader's nominatedNodeName; critical takes it over. Drawn
    again before the cleared nominatedNodeName reaches the watch, mid must not hold room on
    the same victim again: two pods would wait for one GPU."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _leaving("low", 0, "n0"))
    s._pending.apply("ADDED", _pod("critical", 1000))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    mid = _pod("mid", 50)
    mid["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    s._pending.apply("ADDED", mid)  # seen while critical's batch is drawn
    assert s.cache.nomination("default/mid") == ("n0", (0,), 1)
    await s.schedule_batch(batch)
    await settle(s)
    assert s.cache.nomination("default/critical") == ("n0", (0,), 1)
    assert s.cache.nomination("default/mid") is None
    assert api.nominated["default/mid"] is None
    assert await _cycle(s) == ["default/mid"]  # its status still shows the last leader's word
    assert s.cache.nomination("default/mid") is None
    assert s.cache.nomination("default/critical") == ("n0", (0,), 1)
    s._pending.apply("MODIFIED", mid)  # an update the watch shows late
    assert s.cache.nomination("default/mid") is None
    assert api.evicted == []


async def test_a_pod_of_higher_priority_evicts_beside_the_room_held_for_one_of_lower_priority() -> None:
    """mid preempted w; while w terminates, critical (2 GPUs) comes: evicting low and taking
    mid's room makes room for it, as kube-scheduler counts mid's room free for critical. Held
    for mid, that room stopped critical: once mid was bound, critical evicted it."""
    api = _Api()
    s = one_node_scheduler(api, gpus=2)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    w = _pod("w", 0, node="n0")
    w["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "1"
    s._bound.apply("ADDED", w)
    s._pending.apply("ADDED", _pod("mid", 10))
    await _cycle(s)
    assert api.evicted == [("default/w", "default/mid", "n0")]
    w["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    s._bound.apply("MODIFIED", w)
    critical = _pod("critical", 1000)
    critical["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    s._pending.apply("ADDED", critical)
    await _cycle(s)
    assert api.evicted == [("default/w", "default/mid", "n0"), ("default/low", "default/critical", "n0")]
    assert s.cache.nomination("default/critical") == ("n0", (0, 1), 2)  # it waits for w and low
    assert s.cache.nomination("default/mid") is None
    assert api.nominated == {"default/mid": None, "default/critical": "n0"}
    assert api.failed("default/critical")[-1] == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. Preempting 1 pod(s) of lower priority on node n0, "
        "and taking the room held there for pod default/mid of lower priority, whose 1 preempted pod(s) are leaving."
    )
    assert api.failed("default/mid")[-1] == (
        "The room held for it on node n0 was taken by pod default/critical, of higher priority (1000 > 10); "
        "it looks again."
    )
    s._bound.apply("DELETED", w)
    await _cycle(s)  # mid, woken, finds nothing to preempt; critical still waits for low
    assert api.bound == []
    s._bound.apply("DELETED", _deleting("low", 0, "n0"))
    await _cycle(s)
    assert api.bound == ["default/critical"]
    assert len(api.evicted) == 2


class _Backlogged(_Api):
    """Events wait until ``let_go`` (a backlog at the Events client's rate); a condition is
    written only while the scheduler still leads, as the binder fences it; the order of the
    preemptor's status write and its victims' deletions is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = asyncio.Event()
        self.leading: Callable[[], bool] = lambda: True
        self.order: list[str] = []

    async def event(self, pod: Pod, reason: str, message: str, kind: str = "Normal", fenced: bool = False) -> None:
        await self.let_go.wait()
        await super().event(pod, reason, message, kind, fenced)

    async def preempt(self, victim: Pod, by: Pod, node: str) -> bool:
        self.order.append(f"delete {victim.key}")
        return await super().preempt(victim, by, node)

    async def unschedulable(
        self,
        pod: Pod,
        message: str,
        current: str | None = None,
        nominated: str | None = None,
        current_nominated: str | None = None,
        still: Callable[[], bool] | None = None,
        **more: Any,
    ) -> None:
        if not self.leading():
            return
        if nominated:
            self.order.append(f"nominate {pod.key} {nominated}")
        await super().unschedulable(pod, message, current, nominated, current_nominated, still, **more)


async def test_a_preemptors_nomination_is_written_before_its_victims_go_whatever_events_wait() -> None:
    """The room a preemption makes is held by the preemptor's nominatedNodeName, which the next
    leader adopts: it must not wait behind a backlog of verdicts while the victims are deleted
    at once, or a lead lost meanwhile leaves the victims gone and the preemptor to preempt again."""
    api = _Backlogged()
    s = one_node_scheduler(api, gpus=1)
    api.leading = lambda: s.is_leader
    for i in range(200):  # verdicts on other pods wait for the Events client
        s.write_verdict(Pod(f"other{i}", 0, 0), "0/1 nodes are available", None)
    s._bound.apply("ADDED", _pod("low", 0, node="n0"))
    s._pending.apply("ADDED", _pod("urgent", 50))
    batch = await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S)
    await s.schedule_batch(batch)
    await asyncio.sleep(0.1)
    s._leadership(False)  # the lead is lost shortly after the preemption
    api.let_go.set()
    await settle(s)
    assert api.nominated.get("default/urgent") == "n0"
    assert api.order == ["nominate default/urgent n0", "delete default/low"]


class _SlowClear(_Backlogged):
    """``_Backlogged``, with the status writes of ``default/low`` and ``default/hi`` recorded as
    they start (pod, nominated node), and a cleared nomination of ``default/low`` held until
    ``let_clear``."""

    def __init__(self) -> None:
        super().__init__()
        self.let_clear = asyncio.Event()
        self.writes: list[tuple[str, str | None]] = []

    async def unschedulable(
        self,
        pod: Pod,
        message: str,
        current: str | None = None,
        nominated: str | None = None,
        current_nominated: str | None = None,
        still: Callable[[], bool] | None = None,
        **more: Any,
    ) -> None:
        if still is not None and not still():
            return
        if pod.key in ("default/low", "default/hi"):
            self.writes.append((pod.key, nominated))
        if pod.key == "default/low" and nominated is None:
            await self.let_clear.wait()
        await super().unschedulable(pod, message, current, nominated, current_nominated, still, **more)


async def test_a_room_taken_over_is_cleared_for_its_last_holder_before_the_new_holder_is_named() -> None:
    """low holds room on n0 while v leaves; hi takes it over.  Were hi's nominatedNodeName written
    while low's still named n0 (low's clear waiting behind a backlog of Events), a leader taking
    over then would see both pods hold room on the one GPU.  low's clear is sent at once, whatever
    Events wait, and hi's nomination only once it is over."""
    api = _SlowClear()
    s = one_node_scheduler(api, gpus=1)
    api.let_go.set()
    api.let_clear.set()
    s._bound.apply("ADDED", _pod("v", 0, node="n0"))
    s._pending.apply("ADDED", _pod("low", 10))
    await _cycle(s)
    assert api.nominated["default/low"] == "n0"
    low = _pod("low", 10)
    low["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    s._pending.apply("MODIFIED", low)  # as the watch shows it
    s._bound.apply("MODIFIED", _leaving("v", 0, "n0"))
    api.let_go.clear()
    api.let_clear.clear()
    for i in range(200):  # verdicts on other pods wait for the Events client
        s.write_verdict(Pod(f"other{i}", 0, 0), "0/1 nodes are available", None)
    api.writes.clear()
    s._pending.apply("ADDED", _pod("hi", 50, never=True))
    await s.schedule_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await asyncio.sleep(0.1)
    assert api.writes == [("default/low", None)], "low's clear is on its way, hi's nomination waits for it"
    api.let_clear.set()
    await asyncio.sleep(0.1)
    assert api.writes == [("default/low", None), ("default/hi", "n0")]
    assert api.nominated["default/low"] is None
    assert api.nominated["default/hi"] == "n0"
    api.let_go.set()
    await settle(s)
    assert s.cache.nomination("default/hi") == ("n0", (0,), 1)
    assert s.cache.nomination("default/low") is None


async def test_a_leader_that_finds_two_pods_naming_one_room_gives_it_to_the_higher() -> None:
    """Should the lead be lost between a take-over's two writes nonetheless (the old holder's
    clear written, not yet seen on the watch), the next leader reads both pods nominated to n0
    while v (preempted) leaves: once v is gone, the pod of higher priority is bound there."""
    api = _Api()
    s = one_node_scheduler(api, gpus=1)
    s._bound.apply("ADDED", _leaving("v", 0, "n0"))
    for name, priority, never in (("low", 10, False), ("hi", 50, True)):
        obj = _pod(name, priority, never=never)
        obj["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
        s._pending.apply("ADDED", obj)
    s._bound.apply("DELETED", _leaving("v", 0, "n0"))
    await _cycle(s)
    assert api.bound == ["default/hi"]


def _pod_group(name: str, minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": minimum},
    }


def _running_member(name: str, node: str) -> dict[str, Any]:
    """A running one-GPU member of PodGroup ``train`` (no gang annotation), priority 0."""
    obj = _pod(name, 0, node=node)
    obj["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "train"}
    return obj


def _job_beside_other(api: _Api) -> tuple[Scheduler, OptionalHandler, list[dict[str, Any]]]:
    """Four one-GPU nodes: w0..w2 (priority 0) of PodGroup train on n0..n2, other (priority 10)
    on n3; the running pods, not yet applied, and the PodGroups' handler."""
    s = one_node_scheduler(api, gpus=1)
    for n in ("n1", "n2", "n3"):
        NodeHandler(s).apply("ADDED", kit.node(n, 1, "A100"))
    groups = cast(OptionalHandler, next(r.handler for r in s.reflectors if r.name == "podgroups"))
    running = [_running_member(f"w{i}", f"n{i}") for i in range(3)] + [_pod("other", 10, node="n3")]
    return s, groups, running


@pytest.mark.parametrize("read", ["podgroup first", "podgroup after the pods' events", "podgroup after the pods' list"])
async def test_a_running_podgroup_gang_keeps_its_minimum_whenever_its_podgroup_is_read(read: str) -> None:
    """A pod of priority 50 preempts: it evicts other, not a member of the job, which would leave
    it short of its minMember of 3.  The watches list concurrently when the scheduler starts or
    takes the lead (and the PodGroups' after a look for their CRD): the PodGroup may come after
    its running members, as it may be created after them."""
    api = _Api()
    s, groups, running = _job_beside_other(api)
    if read == "podgroup first":
        groups.replace([_pod_group("train", 3)])
    if read == "podgroup after the pods' list":
        s._bound.replace(running)
    else:
        for obj in running:
            s._bound.apply("ADDED", obj)
    if read != "podgroup first":
        groups.replace([_pod_group("train", 3)])
    s._pending.apply("ADDED", _pod("urgent", 50))
    await _cycle(s)
    assert [v for v, _, _ in api.evicted] == ["default/other"]


async def test_a_running_gang_whose_podgroup_is_deleted_is_kept_no_more() -> None:
    """Its PodGroup deleted, the job has no minimum: a pod of priority 50 evicts one of its
    members (priority 0) rather than other (priority 10), as it would any pods."""
    api = _Api()
    s, groups, running = _job_beside_other(api)
    groups.replace([_pod_group("train", 3)])
    for obj in running:
        s._bound.apply("ADDED", obj)
    groups.apply("DELETED", _pod_group("train", 3))
    s._pending.apply("ADDED", _pod("urgent", 50))
    await _cycle(s)
    assert len(api.evicted) == 1
    assert api.evicted[0][0] in ("default/w0", "default/w1", "default/w2")
