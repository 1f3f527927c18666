"""Which bound pods wake a parked pod: those its pod affinity follows or its spread counts
when they arrive; when they leave, those that freed what it may lack."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from gpusched.daemon.handlers import NodeHandler, frees_for, moved_selectors, waits_for
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread
from gpusched.model.pod import Gang
from tests.doubles import RecordingApi, member_pod, one_node_scheduler, settle
from tests.e2e import kit
from tests.factories import pod

DRAWN_WITHIN_S = 10.0


def _select(key: str, value: str) -> tuple[Requirement, ...]:
    return (Requirement(key, "In", (value,)),)


def test_a_pod_wakes_followers_that_all_their_terms_select_it_for_and_spreads_that_count_it() -> None:
    terms = (PodAffinityTerm(_select("app", "db"), None, "zone"), PodAffinityTerm(_select("tier", "x"), None, "zone"))
    follower = replace(pod("f"), affinity=terms)
    assert waits_for(follower, replace(pod("a"), labels=(("app", "db"), ("tier", "x"))))
    assert not waits_for(follower, replace(pod("b"), labels=(("app", "db"),)))  # one term is not enough
    spread = replace(pod("s"), spread=(Spread(1, "zone", _select("app", "llm"), "default"),))
    assert waits_for(spread, replace(pod("c"), labels=(("app", "llm"),)))
    assert not waits_for(spread, replace(pod("d"), labels=(("app", "llm"),), namespace="other"))
    assert not waits_for(pod("plain"), replace(pod("e"), labels=(("app", "llm"),)))


def test_a_namespace_change_moves_only_the_selectors_that_now_pick_differently() -> None:
    team_a, tier = _select("team", "a"), (Requirement("tier", "Exists", ()),)
    exclude_b = (Requirement("team", "NotIn", ("b",)),)
    selectors = [team_a, tier, exclude_b, team_a]
    # A label added that no selector reads: nothing moves.
    assert moved_selectors(selectors, [({"team": "a"}, {"team": "a", "x": "1"})]) == set()
    # The namespace gains tier: only the selector asking for tier moves.
    assert moved_selectors(selectors, [({"team": "a"}, {"team": "a", "tier": "1"})]) == {tier}
    # A new namespace team=b: picked by none before (absent) nor after.
    assert moved_selectors(selectors, [(None, {"team": "b"})]) == set()
    # A namespace team=a deleted: every selector that picked it moves.
    assert moved_selectors(selectors, [({"team": "a"}, None)]) == {team_a, exclude_b}


def test_a_pod_that_held_no_gpu_on_a_node_with_none_frees_for_gpu_pods_only_across_nodes() -> None:
    cron = replace(pod("cron"), labels=(("app", "cron"),))
    assert frees_for(pod("cpu"), cron)  # its CPU, memory, pod slot may be what a CPU pod lacked
    assert frees_for(replace(pod("m"), mig_profile="1g.10gb", num_gpu=0), cron) is False
    gpu = pod("g", gpus=1)
    assert not frees_for(gpu, cron)  # it cannot go where cron was: nothing freed for it
    # ... but for what spans nodes: a zone cron kept it out of, a spread that counted cron, the
    # affinity cron was the last pod for, cron's own anti-affinity, or its gang.
    by_cron = _select("app", "cron")
    assert frees_for(replace(gpu, anti_affinity=(PodAffinityTerm(by_cron, None, "zone"),)), cron)
    assert frees_for(replace(gpu, spread=(Spread(1, "zone", by_cron, "default"),)), cron)
    assert frees_for(replace(gpu, affinity=(PodAffinityTerm(by_cron, None, "zone"),)), cron)
    keeps_gpus_away = PodAffinityTerm(_select("app", "llm"), None, "zone")
    assert frees_for(replace(gpu, labels=(("app", "llm"),)), replace(cron, anti_affinity=(keeps_gpus_away,)))
    assert not frees_for(replace(gpu, labels=(("app", "db"),)), replace(cron, anti_affinity=(keeps_gpus_away,)))
    assert frees_for(replace(gpu, gang=Gang("g", 2)), replace(cron, gang=Gang("g", 2)))
    assert not frees_for(replace(gpu, gang=Gang("g", 2)), replace(cron, gang=Gang("other", 2)))


def _cpu_pod(name: str, node: str, cpu: str = "1") -> dict[str, Any]:
    """Another scheduler's pod asking for no GPU, bound to ``node``."""
    obj = kit.pod(name, "default-scheduler", cpu=cpu, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    obj["status"] = {"phase": "Running"}
    return obj


async def test_a_cpu_pod_leaving_a_cpu_node_does_not_queue_a_gpu_backlog_ahead_of_a_new_pod() -> None:
    """A CronJob's pod on a CPU node comes and goes: the GPU pods parked for lack of H100s are
    not drawn again (each woken pod is queued anew, after a pod that came meanwhile), so a new
    pod that fits is bound by the next batch.  A CPU pod leaving a GPU node wakes them: the CPU
    it frees there may be what a GPU pod lacked."""
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    NodeHandler(s).apply("ADDED", kit.node("cpu-0", 0, ""))
    backlog = s.queue.max_size + 8  # more than one batch
    for i in range(backlog):
        s._pending.apply("ADDED", member_pod(f"h{i:03}", models=("H100",)))
    while s.queue.counts().active:
        await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert s.queue.counts().unschedulable == backlog
    s._bound.apply("ADDED", _cpu_pod("cron", "cpu-0"))
    s._bound.apply("DELETED", _cpu_pod("cron", "cpu-0"))
    assert s.queue.counts().unschedulable == backlog
    s._pending.apply("ADDED", member_pod("new"))
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert api.bound == ["default/new"]
    # n0 (64 CPUs) has a GPU left but, with this pod on it, not the CPU for a GPU pod: parked.
    s._bound.apply("ADDED", _cpu_pod("big", "n0", cpu="63"))
    s._pending.apply("ADDED", member_pod("after"))
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert s.queue.counts().unschedulable == backlog + 1
    s._bound.apply("DELETED", _cpu_pod("big", "n0", cpu="63"))
    assert s.queue.counts().unschedulable == 0
    while "default/after" not in api.bound:
        await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
        await settle(s)


async def test_a_pod_this_scheduler_binds_draws_the_parked_pods_that_follow_it_at_once() -> None:
    # web must run beside a pod labelled app=db: none runs, so it is parked.  db comes and this
    # scheduler binds it; the watch will show db as bound by us (no wake there), so the bind
    # itself draws web again, rather than the minute's flush.
    api = RecordingApi()
    s = one_node_scheduler(api, gpus=2)
    web = member_pod("web")
    web["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    s._pending.apply("ADDED", web)
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert s.queue.counts().unschedulable == 1
    db = member_pod("db")
    db["metadata"]["labels"]["app"] = "db"
    s._pending.apply("ADDED", db)
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert api.bound == ["default/db"]
    assert s.queue.counts().unschedulable == 0  # drawn again by the bind, not parked till the flush
    await s.handle_batch(await asyncio.wait_for(s.queue.next_batch(), DRAWN_WITHIN_S))
    await settle(s)
    assert api.bound == ["default/db", "default/web"]
