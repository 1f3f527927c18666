"""gpusched's preemption of single pods against the real kube-scheduler's DefaultPreemption.

kube-scheduler is the reference, run as ``tests/e2e/reference.py`` runs it.  Each case, drawn
from a fixed seed, is a namespace of its own with a few small nodes (GPUs, or CPUs only), pods
of several PriorityClasses bound to them (another scheduler's; ``status.startTime`` written,
each at a second of its own, so that no two pods tie on it), PodDisruptionBudgets
covering some of them (their status written: no disruption controller runs here) and then
one pending pod for kube-scheduler's profile (of the highest priority, now and then of a bound
class's) that fits on none of the nodes as they are.  kube-scheduler picks a node and deletes
its victims: with no kubelet, a victim's graceful delete leaves it terminating, and the
pending pod gets ``status.nominatedNodeName``.  gpusched's answer for the same cluster comes from
``find_preemption``, fed as the daemon feeds it: the nodes and bound pods read into the books
(``kube.convert``, ``Cache``), the budgets as ``budget_record`` reads them beside the running
gangs', and the pending pod as created.  The node and the set of victims must agree.

kube-scheduler breaks a tie left after the latest start of the most important victims at
random; with every pod started at a second of its own, no two nodes tie that far.  Pods being
deleted already are left out of these cases: gpusched does not count them as victims
(docs/deploy.md, "Priority and preemption"), kube-scheduler does; the last test asserts that
difference as such.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpusched.kube.client import MERGE_PATCH, Kube
from gpusched.kube.convert import budget_record, pod_record
from gpusched.solver.preempt import Budget, find_preemption, gang_budgets
from gpusched.state.cache import Cache
from tests.e2e.reference import REFERENCE, KubeScheduler, books, condition, container, create, make_node, make_pod

SEED = 20261208
CASES = 32

PRIORITIES = {"neg": -10, "zero": 0, "low": 3, "mid": 7, "high": 15, "peer": 1000}
"""The PriorityClasses of the bound pods (``peer``: the pending pod's priority, most of the time)."""
PREEMPTOR = "urgent"
PREEMPTOR_PRIORITY = 1000
PROBE = "probe"
"""The class of the pods that ask kube-scheduler what it sees: they preempt no one."""

SELECTORS: tuple[dict[str, Any], ...] = (
    {"matchLabels": {"app": "a"}},
    {"matchLabels": {"app": "b"}},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "c"]}]},
    {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]},
    {"matchLabels": {"tier": "x"}},
    {},
)
"""PodDisruptionBudget selectors: some take pods with no labels (as the Eviction API reads
them), one is empty (it takes no pod, as preemption reads it)."""


@dataclass
class Case:
    name: str
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    started: dict[str, str | None]
    """Each bound pod's ``status.startTime`` (None: not written, it has not started)."""
    budgets: list[dict[str, Any]]
    budget_status: dict[str, dict[str, Any]]
    preemptor: dict[str, Any]
    prefix: str
    """The PriorityClasses' prefix."""
    summary: list[str] = field(default_factory=list)


def _cpu(milli: int) -> str:
    return f"{milli}m"


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _case(rng: random.Random, index: int, prefix: str, start: datetime) -> Case:
    """One seeded case: nodes full enough that the pending pod fits on none of them as they are."""
    name = f"{prefix}-c{index:02d}"
    while True:
        gpu_mode = rng.random() < 0.7
        nodes: list[dict[str, Any]] = []
        pods: list[dict[str, Any]] = []
        free: list[tuple[int, int]] = []  # (GPUs, CPU millis) left per node
        caps: list[tuple[int, int]] = []
        summary = []
        for n in range(rng.randint(2, 4)):
            node = f"{name}-n{n}"
            gpus = rng.choice((1, 2, 2, 3, 4)) if gpu_mode else 0
            cpu = rng.choice((4000, 8000)) if gpu_mode else rng.choice((2000, 3000, 4000))
            nodes.append(make_node(node, cpu=_cpu(cpu), memory="32Gi", gpus=gpus, labels={"pcase": name}))
            caps.append((gpus, cpu))
            left_g, left_c = gpus, cpu
            for j in range(6):
                if gpu_mode:
                    g = min(left_g, rng.choice((1, 1, 1, 2)))
                    c = min(left_c, rng.choice((500, 1000, 2000)))
                    if g <= 0 and rng.random() < 0.7:
                        break
                else:
                    g, c = 0, min(left_c, rng.choice((500, 1000, 1500)))
                if c < 500:
                    break
                cls = rng.choice(("neg", "zero", "zero", "low", "low", "mid", "high", "peer"))
                requests = {"cpu": _cpu(c), "memory": "512Mi"}
                if g:
                    requests["nvidia.com/gpu"] = str(g)
                labels: dict[str, str] = {}
                if rng.random() < 0.75:
                    labels["app"] = rng.choice(("a", "b", "c"))
                if rng.random() < 0.25:
                    labels["tier"] = "x"
                spec = {
                    "nodeName": node,
                    "schedulerName": "elsewhere",
                    "priorityClassName": f"{prefix}-{cls}",
                    "terminationGracePeriodSeconds": 3600,  # deleted, it stays: no kubelet ends it
                    "containers": [container("m", requests)],
                }
                pods.append(make_pod(f"{node}-p{j}", spec, labels, namespace=name))
                summary.append(f"{node}-p{j}: {cls} {requests} {labels} started")
                left_g, left_c = left_g - g, left_c - c
                if gpu_mode and left_g <= 0 and rng.random() < 0.5:
                    break
            free.append((left_g, left_c))
        if not pods:
            continue
        # The pending pod: more than any node has free, no more than the largest node holds.
        if gpu_mode:
            most = max(g for g, _ in caps)
            want_g = rng.randint(1, most)
            want_c = rng.choice((500, 1000))
        else:
            want_g, want_c = 0, rng.choice((1000, 1500, 2000, 3000))
        if any(g >= want_g and c >= want_c for g, c in free):
            continue
        if not any(g >= want_g and c >= want_c for g, c in caps):
            continue
        break
    requests = {"cpu": _cpu(want_c), "memory": "256Mi"}
    if want_g:
        requests["nvidia.com/gpu"] = str(want_g)
    # Now and then a pending pod of a bound class's priority: the pods of that class, its
    # peers, are no victims of it.
    mine = PREEMPTOR if rng.random() < 0.8 else rng.choice(("mid", "high"))
    preemptor = make_pod(
        PREEMPTOR,
        {
            "schedulerName": REFERENCE,
            "priorityClassName": f"{prefix}-{mine}",
            "nodeSelector": {"pcase": name},
            "containers": [container("m", requests)],
        },
        namespace=name,
    )
    # Every pod started at a second of its own (one, now and then, not started yet).
    seconds = rng.sample(range(1, 100_000), len(pods))
    started: dict[str, str | None] = {
        p["metadata"]["name"]: _stamp(start + timedelta(seconds=s)) for p, s in zip(pods, seconds, strict=True)
    }
    if rng.random() < 0.15:
        started[rng.choice(pods)["metadata"]["name"]] = None
    summary = [f"{line} {at or 'not yet'}" for line, at in zip(summary, started.values(), strict=True)]
    summary.append(f"pending: {mine} {requests}")
    budgets: list[dict[str, Any]] = []
    status: dict[str, dict[str, Any]] = {}
    for b in range(rng.choice((0, 1, 2, 2, 3))):
        pdb = f"pdb{b}"
        budgets.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": pdb, "namespace": name},
                "spec": {"selector": dict(rng.choice(SELECTORS)), "maxUnavailable": 1},
            }
        )
        st: dict[str, Any] = {
            "disruptionsAllowed": rng.choice((0, 0, 0, 1, 2)),
            "currentHealthy": 0,
            "desiredHealthy": 0,
            "expectedPods": 0,
        }
        if rng.random() < 0.2:  # a pod whose eviction the budget has counted already
            st["disruptedPods"] = {rng.choice(pods)["metadata"]["name"]: _stamp(start)}
        status[pdb] = st
        summary.append(f"{pdb}: {budgets[-1]['spec']['selector']} {st}")
    summary[:0] = [f"{name}: {len(nodes)} node(s) {caps} (GPUs, CPU millis)"]
    return Case(name, nodes, pods, started, budgets, status, preemptor, prefix, summary)


async def _priority_classes(kube: Kube, prefix: str) -> list[str]:
    names = []
    for suffix, value in {**PRIORITIES, PREEMPTOR: PREEMPTOR_PRIORITY, PROBE: -100}.items():
        body: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"{prefix}-{suffix}"},
            "value": value,
        }
        if suffix == PROBE:
            body["preemptionPolicy"] = "Never"
        r = await kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        assert r.status == 201, r.body
        names.append(f"{prefix}-{suffix}")
    return names


async def _sees_case(kube: Kube, case: Case, sched: KubeScheduler, timeout: float = 30.0) -> None:
    """Until kube-scheduler weighs the case's nodes with its pods on them: a pod of the case's
    nodes too large for any of them, created after every pod of the case (one watch shows
    kube-scheduler the pods in order), is told that each of them lacks CPU."""
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{case.name}/pods"
    for attempt in range(1000):
        probe = make_pod(
            f"probe-{attempt}",
            {
                "schedulerName": REFERENCE,
                "priorityClassName": f"{case.prefix}-{PROBE}",
                "nodeSelector": {"pcase": case.name},
                "containers": [container("m", {"cpu": "1000"})],
            },
        )
        await create(kube, path, [probe])
        said = ""
        while not said and time.monotonic() < deadline:
            got = await kube.get(f"{path}/probe-{attempt}")
            said = str((condition(got) or {}).get("message") or "")
            await asyncio.sleep(0.05)
        r = await kube.request("DELETE", f"{path}/probe-{attempt}", {"gracePeriodSeconds": 0})
        assert r.ok, r.body
        m = re.search(r"(\d+) Insufficient cpu", said)
        if m and int(m.group(1)) == len(case.nodes):
            return
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"kube-scheduler does not weigh the nodes of {case.name}; its log:\n{sched.tail()}")


async def _set_up(kube: Kube, case: Case, sched: KubeScheduler) -> None:
    r = await kube.request(
        "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": case.name}}
    )
    assert r.status == 201, r.body
    # The budgets first: kube-scheduler watches them apart from pods and nodes.
    base = f"/apis/policy/v1/namespaces/{case.name}/poddisruptionbudgets"
    await create(kube, base, case.budgets)
    for pdb, st in case.budget_status.items():
        r = await kube.request("PATCH", f"{base}/{pdb}/status", body={"status": st}, content_type=MERGE_PATCH)
        assert r.ok, r.body
    await create(kube, "/api/v1/nodes", case.nodes)
    await create(kube, f"/api/v1/namespaces/{case.name}/pods", case.pods)

    async def running(name: str, at: str | None) -> None:
        st: dict[str, Any] = {"phase": "Running"} | ({"startTime": at} if at else {})
        r = await kube.request(
            "PATCH",
            f"/api/v1/namespaces/{case.name}/pods/{name}/status",
            body={"status": st},
            content_type=MERGE_PATCH,
        )
        assert r.ok, r.body

    await asyncio.gather(*(running(n, at) for n, at in case.started.items()))
    await _sees_case(kube, case, sched)


async def _books(kube: Kube, case: Case) -> tuple[Cache, list[Budget]]:
    """The books and the budgets as the daemon keeps them, read before the pending pod exists
    (kube-scheduler starts deleting victims as soon as it sees it)."""
    cache = await books(kube)
    items, _ = await kube.list(f"/apis/policy/v1/namespaces/{case.name}/poddisruptionbudgets")
    return cache, [budget_record(o)[1] for o in items]


def _ours(
    case: Case, cache: Cache, budgets: list[Budget], created: dict[str, Any]
) -> tuple[str | None, frozenset[str], int]:
    """gpusched's answer: the node and the victims ``find_preemption`` picks, fed as the daemon
    feeds it the books, the budgets (a running gang's too) and the pending pod as created; and
    how many of the victims a budget protects."""
    snap = cache.snapshot()
    running = cache.preemptible()
    rec = pod_record(created)
    assert not rec.error, rec.error
    assert not snap.state.pod_mask(rec.pod).any(), f"{case.name}: the pending pod fits as things are"
    found = find_preemption(rec.pod, snap.state, running, budgets=[*budgets, *gang_budgets(running)])
    if found is None:
        return None, frozenset(), 0
    return snap.cluster.nodes[found.node].name, frozenset(v.pod.name for v in found.victims), found.violations


async def _theirs(
    kube: Kube, case: Case, sched: KubeScheduler, timeout: float = 30.0, quiet: float = 0.5
) -> tuple[str | None, frozenset[str]]:
    """kube-scheduler's answer: the node it nominates the pending pod to and the pods it
    deleted (they stay, terminating); no node once it marks the pod unschedulable without one.
    Victims are deleted after the nomination at times: the set counts once it has not changed
    for ``quiet`` seconds."""
    path = f"/api/v1/namespaces/{case.name}/pods"
    deadline = time.monotonic() + timeout
    while True:
        got = await kube.get(f"{path}/{PREEMPTOR}")
        assert not got["spec"].get("nodeName"), f"{case.name}: kube-scheduler bound the pending pod"
        node = (got.get("status") or {}).get("nominatedNodeName")
        if node or (condition(got) or {}).get("status") == "False":
            break
        if time.monotonic() > deadline or sched.proc.poll() is not None:
            raise AssertionError(f"{case.name}: kube-scheduler did not settle the pending pod; log:\n{sched.tail()}")
        await asyncio.sleep(0.05)
    victims: frozenset[str] = frozenset()
    steady = time.monotonic()
    while node:
        pods, _ = await kube.list(path)
        now = frozenset(p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp"))
        if now != victims:
            victims, steady = now, time.monotonic()
        elif victims and time.monotonic() - steady >= quiet:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{case.name}: kube-scheduler nominated {node} but deleted {sorted(victims)}")
        await asyncio.sleep(0.05)
    return node, victims


async def _tear_down(kube: Kube, case: Case) -> None:
    r = await kube.request("DELETE", f"/api/v1/namespaces/{case.name}/pods", {"gracePeriodSeconds": 0})
    assert r.ok, r.body
    r = await kube.request("DELETE", f"/apis/policy/v1/namespaces/{case.name}/poddisruptionbudgets")
    assert r.ok, r.body
    r = await kube.request("DELETE", "/api/v1/nodes", {"labelSelector": f"pcase={case.name}"})
    assert r.ok, r.body


async def test_seeded_preemptions_pick_kube_schedulers_node_and_victims(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    rng = random.Random(SEED)
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    cases = [_case(rng, i, prefix, start) for i in range(CASES)]
    classes = await _priority_classes(kube, prefix)
    disagreements: list[str] = []
    preempted = broken = 0
    try:
        for case in cases:
            await _set_up(kube, case, kube_scheduler)
            try:
                cache, budgets = await _books(kube, case)
                (created,) = await create(kube, f"/api/v1/namespaces/{case.name}/pods", [case.preemptor])
                node, victims, violations = _ours(case, cache, budgets, created)
                theirs = await _theirs(kube, case, kube_scheduler)
            finally:
                await _tear_down(kube, case)
            preempted += theirs[0] is not None
            broken += violations > 0
            ours = (node, victims)
            if ours != theirs:
                said = "\n  ".join(case.summary)
                disagreements.append(
                    f"{case.name}: kube-scheduler {theirs[0]} evicting {sorted(theirs[1])}; "
                    f"gpusched {ours[0]} evicting {sorted(ours[1])}\n  {said}"
                )
    finally:
        for name in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    # Most cases preempt, some where every way breaks a budget: the comparison weighs victims,
    # budgets and all, not only refusals.
    assert CASES // 2 <= preempted < CASES, preempted
    assert broken, "no case breaks a budget"
    assert not disagreements, f"{len(disagreements)} of {CASES} case(s) differ:\n" + "\n".join(disagreements)


async def test_a_pod_being_deleted_is_no_victim_a_documented_difference(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    """Two one-GPU nodes, each with a one-GPU pod of low priority; the one on the first node,
    started later, is being deleted already.  kube-scheduler counts it as a victim (it deletes
    it no more) and, the nodes otherwise alike, nominates its node, where it started later.
    gpusched counts only pods not being deleted as victims (docs/deploy.md, "Priority and
    preemption"): it evicts the other pod."""
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    name = f"{prefix}-leaving"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    nodes = [make_node(f"{name}-n{i}", gpus=1, labels={"pcase": name}) for i in range(2)]
    pods = [
        make_pod(
            f"{name}-n{i}-p0",
            {
                "nodeName": f"{name}-n{i}",
                "schedulerName": "elsewhere",
                "priorityClassName": f"{prefix}-low",
                "terminationGracePeriodSeconds": 3600,
                "containers": [container("m", {"cpu": "1", "nvidia.com/gpu": "1"})],
            },
            {"app": "a"},
            namespace=name,
        )
        for i in range(2)
    ]
    leaving, staying = (p["metadata"]["name"] for p in pods)
    preemptor = make_pod(
        PREEMPTOR,
        {
            "schedulerName": REFERENCE,
            "priorityClassName": f"{prefix}-{PREEMPTOR}",
            "nodeSelector": {"pcase": name},
            "containers": [container("m", {"cpu": "1", "nvidia.com/gpu": "1"})],
        },
        namespace=name,
    )
    started: dict[str, str | None] = {leaving: _stamp(start + timedelta(hours=1)), staying: _stamp(start)}
    case = Case(name, nodes, pods, started, [], {}, preemptor, prefix)
    classes = await _priority_classes(kube, prefix)
    try:
        await _set_up(kube, case, kube_scheduler)
        try:
            r = await kube.request("DELETE", f"/api/v1/namespaces/{name}/pods/{leaving}")
            assert r.ok, r.body
            cache, budgets = await _books(kube, case)
            (created,) = await create(kube, f"/api/v1/namespaces/{name}/pods", [preemptor])
            node, victims, _ = _ours(case, cache, budgets, created)
            theirs = await _theirs(kube, case, kube_scheduler)
        finally:
            await _tear_down(kube, case)
    finally:
        for cls in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{cls}")
    assert theirs == (f"{name}-n0", frozenset({leaving})), theirs
    assert (node, victims) == (f"{name}-n1", frozenset({staying}))
