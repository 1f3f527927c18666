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

The pending pod asks more than room in the other cases: a zone (nodeSelector, required node
affinity), no untolerated taint, a host port bound pods hold, no pod of a label beside it
(required anti-affinity, per node or per zone; a bound pod's against it too; of its own
revision or of another, by ``matchLabelKeys`` or ``mismatchLabelKeys``), a bound pod of a label
beside it (required pod affinity), a DoNotSchedule topology spread (its domains decided by
``minDomains`` and the node inclusion policies too), or no preemption at all
(``preemptionPolicy: Never``); seeded, and picked by hand with kube-scheduler's answer written
down.  kube-scheduler weighs one node's victims at a time, all else in place: evicting the pods
of a label on a node clears anti-affinity per node, not per zone while another node of the zone
holds one; evicting a node's pods of the spread's label lowers that node's count (its domain's)
in the skew.  It takes all of a node's victims off before it checks that the pod fits there,
so a pod that its pod affinity needs beside it is lost with them: no room is made beside a
victim it needs (unless, with that pod gone, it is the first of its series).

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
from collections.abc import Sequence
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
CONSTRAINED_SEED = 20261209
KINDS = ("affinity", "taint", "ports", "anti", "spread", "never")
CONSTRAINED = 8 * len(KINDS)
MORE_SEED = 20261210
MORE_KINDS = ("together", "domains", "anti-keys")
MORE = 12 * len(MORE_KINDS)

PRIORITIES = {"neg": -10, "zero": 0, "low": 3, "mid": 7, "high": 15, "peer": 1000}
"""The PriorityClasses of the bound pods (``peer``: the pending pod's priority, most of the time)."""
PREEMPTOR = "urgent"
PREEMPTOR_PRIORITY = 1000
NEVER = "never"
"""A class of the pending pod's priority that preempts no one (``preemptionPolicy: Never``)."""
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
    kind: str = "fit"
    """What the pending pod asks beyond room (``_constrained``)."""


@dataclass(frozen=True)
class Outcome:
    kind: str
    theirs: tuple[str | None, frozenset[str]]
    preempted: bool
    """kube-scheduler nominated a node."""
    broken: bool
    """gpusched's victims break a budget."""


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
    for suffix, value in {**PRIORITIES, PREEMPTOR: PREEMPTOR_PRIORITY, NEVER: PREEMPTOR_PRIORITY, PROBE: -100}.items():
        body: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"{prefix}-{suffix}"},
            "value": value,
        }
        if suffix in (PROBE, NEVER):
            body["preemptionPolicy"] = "Never"
        r = await kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        assert r.status == 201, r.body
        names.append(f"{prefix}-{suffix}")
    return names


async def _sees_case(kube: Kube, case: Case, sched: KubeScheduler, timeout: float = 30.0) -> None:
    """Until kube-scheduler weighs the case's nodes with its pods on them, and no other node (the
    cases before it deleted theirs; a spread that ignores the pod's node selector counts every
    node): a pod of the case's nodes too large for any of them, created after every pod of the
    case (one watch shows kube-scheduler the pods in order), is told that each of them lacks
    CPU, of as many nodes as the case has."""
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{case.name}/pods"
    for attempt in range(1000):
        probe = make_pod(
            f"probe-{attempt}",
            {
                "schedulerName": REFERENCE,
                "priorityClassName": f"{case.prefix}-{PROBE}",
                "nodeSelector": {"pcase": case.name},
                "tolerations": [{"operator": "Exists"}],  # a tainted node too says it lacks CPU
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
        if m and int(m.group(1)) == len(case.nodes) and said.startswith(f"0/{len(case.nodes)} nodes are available"):
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


async def _compare(kube: Kube, sched: KubeScheduler, cases: Sequence[Case]) -> tuple[list[str], list[Outcome]]:
    """Each case set up, answered by gpusched and by kube-scheduler, and torn down: the
    disagreements, and what kube-scheduler did in each case."""
    disagreements: list[str] = []
    outcomes: list[Outcome] = []
    for case in cases:
        await _set_up(kube, case, sched)
        try:
            cache, budgets = await _books(kube, case)
            (created,) = await create(kube, f"/api/v1/namespaces/{case.name}/pods", [case.preemptor])
            node, victims, violations = _ours(case, cache, budgets, created)
            theirs = await _theirs(kube, case, sched)
        finally:
            await _tear_down(kube, case)
        outcomes.append(Outcome(case.kind, theirs, theirs[0] is not None, violations > 0))
        ours = (node, victims)
        if ours != theirs:
            said = "\n  ".join(case.summary)
            disagreements.append(
                f"{case.name}: kube-scheduler {theirs[0]} evicting {sorted(theirs[1])}; "
                f"gpusched {ours[0]} evicting {sorted(ours[1])}\n  {said}"
            )
    return disagreements, outcomes


async def test_seeded_preemptions_pick_kube_schedulers_node_and_victims(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    rng = random.Random(SEED)
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    cases = [_case(rng, i, prefix, start) for i in range(CASES)]
    classes = await _priority_classes(kube, prefix)
    try:
        disagreements, outcomes = await _compare(kube, kube_scheduler, cases)
    finally:
        for name in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    preempted = sum(o.preempted for o in outcomes)
    # Most cases preempt, some where every way breaks a budget: the comparison weighs victims,
    # budgets and all, not only refusals.
    assert CASES // 2 <= preempted < CASES, preempted
    assert any(o.broken for o in outcomes), "no case breaks a budget"
    assert not disagreements, f"{len(disagreements)} of {CASES} case(s) differ:\n" + "\n".join(disagreements)


def _constrained(rng: random.Random, index: int, prefix: str, start: datetime, kind: str) -> Case:
    """A seeded case of ``_case`` whose pending pod also asks something of ``kind`` that the
    choice of victims must meet: ``affinity`` (a zone by nodeSelector or required node
    affinity), ``taint`` (tainted nodes it may or may not tolerate), ``ports`` (a host port
    some bound pods hold), ``anti`` (required pod anti-affinity against bound pods' label, per
    node or per zone), ``spread`` (a DoNotSchedule topology spread over the bound pods of a
    label, per node or per zone), ``never`` (``preemptionPolicy: Never``), ``together``
    (required pod affinity to bound pods' label), ``domains`` (a spread with ``minDomains``
    and node inclusion policies over tainted nodes and a zone it may not go to) or
    ``anti-keys`` (anti-affinity with ``matchLabelKeys`` or ``mismatchLabelKeys``)."""
    case = _case(rng, index, prefix, start)
    case.kind = kind
    spec = case.preemptor["spec"]
    labels = case.preemptor["metadata"]["labels"]
    zones = {n["metadata"]["name"]: rng.choice(("z1", "z2")) for n in case.nodes}
    for n in case.nodes:
        n["metadata"]["labels"]["zone"] = zones[n["metadata"]["name"]]
    key = rng.choice(("kubernetes.io/hostname", "zone"))
    said = f"pending {kind}:"
    if kind == "affinity":
        if rng.random() < 0.5:
            spec["nodeSelector"]["zone"] = "z1"
            said += " nodeSelector zone=z1"
        else:
            term = {"matchExpressions": [{"key": "zone", "operator": rng.choice(("In", "NotIn")), "values": ["z2"]}]}
            spec["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
            said += f" node affinity {term}"
    elif kind == "taint":
        tainted = [n for n in case.nodes if rng.random() < 0.5]
        for n in tainted:
            n["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
        if rng.random() < 0.4:
            spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
        said += f" tainted {[n['metadata']['name'] for n in tainted]} tolerated {'tolerations' in spec}"
    elif kind == "ports":
        holders = []
        for n in case.nodes:
            on = [p for p in case.pods if p["spec"]["nodeName"] == n["metadata"]["name"]]
            if on and rng.random() < 0.7:
                holder = rng.choice(on)
                holder["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
                holders.append(holder["metadata"]["name"])
        spec["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
        said += f" host port 8080 held by {holders}"
    elif kind == "anti":
        selector = rng.choice(SELECTORS[:3])
        labels["app"] = "z"
        term = {"labelSelector": selector, "topologyKey": key}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        said += f" {term}"
    elif kind == "spread":
        labels["app"] = "b"
        constraint = {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "b"}},
        }
        spec["topologySpreadConstraints"] = [constraint]
        said += f" {constraint}"
    elif kind == "together":
        # Required pod affinity to bound pods of a label, per node or per zone; now and then
        # the pending pod carries the label itself (the first of a series, once no such pod runs).
        labels["app"] = rng.choice(("z", "z", "a", "c"))
        term = {"labelSelector": rng.choice(SELECTORS[:3]), "topologyKey": key}
        spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        said += f" {labels} affinity {term}"
    elif kind == "domains":
        # A spread whose domains the node policies and minDomains decide: tainted nodes it may
        # not tolerate, a zone its node affinity may leave out.
        labels["app"] = "b"
        constraint = {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "b"}},
        }
        if rng.random() < 0.7:
            constraint["minDomains"] = rng.choice((2, 3))
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            if (value := rng.choice((None, "Honor", "Ignore"))) is not None:
                constraint[policy] = value
        spec["topologySpreadConstraints"] = [constraint]
        tainted = [n for n in case.nodes if rng.random() < 0.25]
        for n in tainted:
            n["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
        if rng.random() < 0.5:
            spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
        if rng.random() < 0.3:
            term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
            spec["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
        said += (
            f" {constraint} tainted {[n['metadata']['name'] for n in tainted]} tolerated {'tolerations' in spec}"
            f" zone z1 only {'affinity' in spec}"
        )
    elif kind == "anti-keys":
        # Required anti-affinity against a label of one revision (matchLabelKeys), or of the
        # other revisions (mismatchLabelKeys), as the pending pod carries it.
        versions = {}
        for p in case.pods:
            if rng.random() < 0.7:
                p["metadata"]["labels"]["ver"] = versions[p["metadata"]["name"]] = rng.choice(("v1", "v2"))
        labels.update(app="z", ver=rng.choice(("v1", "v2")))
        field = rng.choice(("matchLabelKeys", "matchLabelKeys", "mismatchLabelKeys"))
        term = {"labelSelector": rng.choice(SELECTORS[:3]), "topologyKey": key, field: ["ver"]}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        said += f" {labels} anti-affinity {term}, bound pods' ver {versions}"
    else:
        spec["priorityClassName"] = f"{prefix}-{NEVER}"
    case.summary.insert(1, f"zones {zones}")
    case.summary.append(said)
    return case


async def test_seeded_constrained_preemptions_pick_kube_schedulers_node_and_victims(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    """As the test above, the pending pod also asking what bound pods of lower priority may
    stand in the way of: evicting them must clear that too (a host port, anti-affinity, a skew
    too large), or a node it may not go to has no victims for it."""
    rng = random.Random(CONSTRAINED_SEED)
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    cases = [_constrained(rng, i, prefix, start, KINDS[i % len(KINDS)]) for i in range(CONSTRAINED)]
    classes = await _priority_classes(kube, prefix)
    try:
        disagreements, outcomes = await _compare(kube, kube_scheduler, cases)
    finally:
        for name in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    assert not disagreements, f"{len(disagreements)} of {CONSTRAINED} case(s) differ:\n" + "\n".join(disagreements)
    # Every kind that may preempt does, now and then, and most are refused now and then too,
    # though room alone could be made in each case.
    for kind in KINDS:
        did = {o.preempted for o in outcomes if o.kind == kind}
        assert did == ({False} if kind == "never" else {True} if kind == "spread" else {True, False}), (kind, did)


async def test_seeded_preemptions_with_pod_affinity_spread_domains_and_label_keys_pick_kube_schedulers_node_and_victims(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    """As the test above, the pending pod asking for a bound pod of a label beside it (which
    may be a victim: kube-scheduler takes all of a node's victims off before it checks, so a
    peer of lower priority on that node is lost, unless the pod is then the first of its
    series), a spread whose domains ``minDomains`` and the node policies decide, or no pod of
    its own revision (``matchLabelKeys``) or of another (``mismatchLabelKeys``) beside it."""
    rng = random.Random(MORE_SEED)
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    cases = [_constrained(rng, i, prefix, start, MORE_KINDS[i % len(MORE_KINDS)]) for i in range(MORE)]
    classes = await _priority_classes(kube, prefix)
    try:
        disagreements, outcomes = await _compare(kube, kube_scheduler, cases)
    finally:
        for name in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    assert not disagreements, f"{len(disagreements)} of {MORE} case(s) differ:\n" + "\n".join(disagreements)
    for kind in MORE_KINDS:
        did = {o.preempted for o in outcomes if o.kind == kind}
        assert did == {True, False}, (kind, did)


def _hand(
    prefix: str,
    kind: str,
    nodes: Sequence[tuple[int, dict[str, str], bool]],
    pods: Sequence[tuple[int, str, int, dict[str, str], bool]],
    preemptor: dict[str, Any],
    labels: dict[str, str] | None = None,
    cls: str = PREEMPTOR,
) -> Case:
    """A hand-picked case: ``nodes`` (millicores, labels, tainted ``dedicated=gpu:NoSchedule``),
    ``pods`` (node, class, millicores, labels, holds host port 8080), the n-th of them started
    n hours after the first, and the pending pod's ``preemptor`` spec (1 CPU, host port 8080
    when it says ``ports: True``)."""
    name = f"{prefix}-{kind}"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    made_nodes = [
        make_node(
            f"{name}-n{i}",
            cpu=_cpu(cpu),
            labels={"pcase": name, **lab},
            taints=[("dedicated", "gpu", "NoSchedule")] if tainted else (),
        )
        for i, (cpu, lab, tainted) in enumerate(nodes)
    ]
    made_pods = []
    for j, (node, pcls, cpu, lab, port) in enumerate(pods):
        ports = [{"containerPort": 80, "hostPort": 8080}] if port else ()
        spec = {
            "nodeName": f"{name}-n{node}",
            "schedulerName": "elsewhere",
            "priorityClassName": f"{prefix}-{pcls}",
            "terminationGracePeriodSeconds": 3600,
            "containers": [container("m", {"cpu": _cpu(cpu)}, ports)],
        }
        made_pods.append(make_pod(f"p{j}", spec, lab, namespace=name))
    started: dict[str, str | None] = {
        p["metadata"]["name"]: _stamp(start + timedelta(hours=j)) for j, p in enumerate(made_pods)
    }
    ask = dict(preemptor)
    port = ask.pop("ports", False)
    spec = {
        "schedulerName": REFERENCE,
        "priorityClassName": f"{prefix}-{cls}",
        "nodeSelector": {"pcase": name, **ask.pop("nodeSelector", {})},
        "containers": [container("m", {"cpu": "1"}, [{"containerPort": 80, "hostPort": 8080}] if port else ())],
        **ask,
    }
    pending = make_pod(PREEMPTOR, spec, labels, namespace=name)
    summary = [f"{name}: nodes {list(nodes)}", f"pods {list(pods)}", f"pending {preemptor} {labels}"]
    return Case(name, made_nodes, made_pods, started, [], {}, pending, prefix, summary, kind)


def _spread(key: str) -> dict[str, Any]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "s"}},
            }
        ]
    }


def _anti(key: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": key}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


def _their_anti(prefix: str) -> Case:
    case = _hand(
        prefix,
        "anti-theirs",
        [(4000, {}, False), (1000, {}, False)],
        [(0, "low", 500, {"app": "b"}, False), (0, "neg", 500, {}, False), (1, "peer", 1000, {}, False)],
        {},
        {"app": "z"},
    )
    term = {"labelSelector": {"matchLabels": {"app": "z"}}, "topologyKey": "kubernetes.io/hostname"}
    case.pods[0]["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    case.summary.append(f"p0 anti-affinity {term}")
    return case


async def test_hand_picked_constrained_preemptions_agree_with_kube_scheduler(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    """Cases where what the pending pod asks decides the victims, kube-scheduler's answer given
    too (so that each case shows the rule it stands for), and gpusched's must be the same."""
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    z1, z2 = {"zone": "z1"}, {"zone": "z2"}
    a, b, s = {"app": "a"}, {"app": "b"}, {"app": "s"}
    host = "kubernetes.io/hostname"
    cases: list[tuple[Case, tuple[str | None, set[str]]]] = [
        # The lowest victims are on a node it may not go to (by nodeSelector, by node affinity,
        # by a taint it does not tolerate): the other node's.
        (
            _hand(
                prefix,
                "selector",
                [(1000, z2, False), (1000, z1, False)],
                [(0, "neg", 1000, {}, False), (1, "low", 1000, {}, False)],
                {"nodeSelector": z1},
            ),
            ("n1", {"p1"}),
        ),
        (
            _hand(
                prefix,
                "affinity",
                [(1000, z2, False), (1000, z1, False)],
                [(0, "neg", 1000, {}, False), (1, "low", 1000, {}, False)],
                {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z2"]}]}
                                ]
                            }
                        }
                    }
                },
            ),
            ("n1", {"p1"}),
        ),
        (
            _hand(
                prefix,
                "taint",
                [(1000, {}, True), (1000, {}, False)],
                [(0, "neg", 1000, {}, False), (1, "low", 1000, {}, False)],
                {},
            ),
            ("n1", {"p1"}),
        ),
        # Tolerated, the taint is no bar: the neg pod goes.
        (
            _hand(
                prefix,
                "tolerated",
                [(1000, {}, True), (1000, {}, False)],
                [(0, "neg", 1000, {}, False), (1, "low", 1000, {}, False)],
                {"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]},
            ),
            ("n0", {"p0"}),
        ),
        # Room enough everywhere; the port is held on n0 by a low pod (a zero pod there, not
        # holding it, stays), on n1 by a mid one: the holder on n0 goes.
        (
            _hand(
                prefix,
                "ports",
                [(4000, {}, False), (4000, {}, False)],
                [(0, "low", 500, {}, True), (0, "zero", 500, {}, False), (1, "mid", 500, {}, True)],
                {"ports": True},
            ),
            ("n0", {"p0"}),
        ),
        # A port held by a pod of its own priority on every node: no preemption.
        (
            _hand(
                prefix,
                "ports-peer",
                [(4000, {}, False)],
                [(0, "peer", 500, {}, True), (0, "neg", 500, {}, False)],
                {"ports": True},
            ),
            (None, set()),
        ),
        # Anti-affinity per node: the app=a pod goes (not the neg app=b pod beside it); n1's
        # app=a pod is of its own priority.
        (
            _hand(
                prefix,
                "anti-host",
                [(4000, {}, False), (4000, {}, False)],
                [(0, "low", 500, a, False), (0, "neg", 500, b, False), (1, "peer", 500, a, False)],
                _anti(host),
                {"app": "z"},
            ),
            ("n0", {"p0"}),
        ),
        # Anti-affinity per zone: evicting the app=a pods of one node leaves those of the other
        # node of its zone; kube-scheduler weighs one node's victims at a time, so no preemption.
        (
            _hand(
                prefix,
                "anti-zone",
                [(4000, z1, False), (4000, z1, False), (4000, z2, False)],
                [(0, "low", 500, a, False), (1, "low", 500, a, False), (2, "peer", 500, a, False)],
                _anti("zone"),
                {"app": "z"},
            ),
            (None, set()),
        ),
        # A low pod on n0 whose anti-affinity keeps it off n0 (n1 full with a pod of its own
        # priority): evicting that pod clears the way, the neg pod beside it stays.
        (_their_anti(prefix), ("n0", {"p0"})),
        # Spread per node, skew at most 1: n0 holds three app=s pods (n1 one, of its own
        # priority, and no room left). Evicting all three, the most important one comes back
        # (skew 1 with n1's), the other two go.
        (
            _hand(
                prefix,
                "spread-host",
                [(4000, {}, False), (1000, {}, False)],
                [
                    (0, "low", 500, s, False),
                    (0, "zero", 500, s, False),
                    (0, "neg", 500, s, False),
                    (1, "peer", 1000, s, False),
                ],
                _spread(host),
                s,
            ),
            ("n0", {"p1", "p2"}),
        ),
        # Spread per zone: z1 (n0, n1) holds three app=s pods, z2 (n2, full) one. Evicting n0's
        # two leaves n1's one: skew 1, so both go; n1's single pod alone would leave 2 in z1.
        (
            _hand(
                prefix,
                "spread-zone",
                [(4000, z1, False), (4000, z1, False), (1000, z2, False)],
                [
                    (0, "low", 500, s, False),
                    (0, "low", 500, s, False),
                    (1, "zero", 500, s, False),
                    (2, "peer", 1000, s, False),
                ],
                _spread("zone"),
                s,
            ),
            ("n0", {"p0", "p1"}),
        ),
        # preemptionPolicy Never: no preemption, though one low pod is in the way.
        (_hand(prefix, "never", [(1000, {}, False)], [(0, "low", 1000, {}, False)], {}, cls=NEVER), (None, set())),
    ]
    await _agree_as_written(kube, kube_scheduler, prefix, cases)


async def _agree_as_written(
    kube: Kube, sched: KubeScheduler, prefix: str, cases: Sequence[tuple[Case, tuple[str | None, set[str]]]]
) -> None:
    """Each hand-picked case answered by kube-scheduler as written beside it (its node, by
    suffix, and its victims), and by gpusched the same."""
    classes = await _priority_classes(kube, prefix)
    try:
        disagreements, outcomes = await _compare(kube, sched, [c for c, _ in cases])
    finally:
        for name in classes:
            await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    theirs = {case.kind: o.theirs for (case, _), o in zip(cases, outcomes, strict=True)}
    expected = {
        case.kind: (None if node is None else f"{case.name}-{node}", frozenset(victims))
        for case, (node, victims) in cases
    }
    assert theirs == expected
    assert not disagreements, f"{len(disagreements)} of {len(cases)} case(s) differ:\n" + "\n".join(disagreements)


def _together(key: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": "t"}}, "topologyKey": key}
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


def _domains(key: str, **extra: Any) -> dict[str, Any]:
    spec = _spread(key)
    spec["topologySpreadConstraints"][0].update(extra)
    return spec


async def test_hand_picked_preemptions_with_pod_affinity_spread_domains_and_label_keys_agree_with_kube_scheduler(
    kube: Kube, kube_scheduler: KubeScheduler
) -> None:
    """Cases where the pending pod's pod affinity, the domains its spread counts, or its
    anti-affinity's label keys decide the victims, with kube-scheduler's answer written down."""
    prefix = f"pd{uuid.uuid4().hex[:6]}"
    z1, z2 = {"zone": "z1"}, {"zone": "z2"}
    t, s, z = {"app": "t"}, {"app": "s"}, {"app": "z"}
    host = "kubernetes.io/hostname"

    # Two nodes: n0 (z1, 2 CPUs) with two app=s pods of lower priority, n1 (z2, 1 CPU) full with a
    # pod of its own priority (app=s in the cases about minDomains; tainted in those about
    # taints).  The pending pod is app=s and asks 1 CPU.  Where z2 counts as a domain with no
    # app=s pod, or fewer domains count than minDomains, n0 must be left with none: both go;
    # else only room is needed: the zero pod goes, the low one stays.
    def two_zones(kind: str, spec: dict[str, Any], tainted: bool = False, peer: dict[str, str] | None = None) -> Case:
        return _hand(
            prefix,
            kind,
            [(2000, z1, False), (1000, z2, tainted)],
            [(0, "low", 1000, s, False), (0, "zero", 1000, s, False), (1, "peer", 1000, peer or {}, False)],
            spec,
            s,
        )

    both, one = ("n0", {"p0", "p1"}), ("n0", {"p1"})
    cases: list[tuple[Case, tuple[str | None, set[str]]]] = [
        # The pod it must be beside is of lower priority on the only node with room to make:
        # kube-scheduler takes all of a node's victims off before it checks the pod fits, and
        # does not make room beside a victim it needs; no preemption, though the neg pod alone
        # would do.
        (
            _hand(
                prefix,
                "together-with-a-victim",
                [(2000, {}, False), (1000, {}, False)],
                [(0, "low", 1000, t, False), (0, "neg", 1000, {}, False), (1, "neg", 1000, {}, False)],
                _together(host),
                z,
            ),
            (None, set()),
        ),
        # That pod of its own priority: it stays, the neg pod beside it goes.
        (
            _hand(
                prefix,
                "together-with-a-peer",
                [(2000, {}, False), (1000, {}, False)],
                [(0, "peer", 1000, t, False), (0, "neg", 1000, {}, False), (1, "neg", 1000, {}, False)],
                _together(host),
                z,
            ),
            ("n0", {"p1"}),
        ),
        # Per zone: the app=t pod on n1 is not n0's victim, so it stays for the pod on n0 (the neg
        # pod there goes); on n1 it would be the victim, and n2 is in the other zone.
        (
            _hand(
                prefix,
                "together-zone",
                [(1000, z1, False), (1000, z1, False), (1000, z2, False)],
                [(0, "low", 1000, {}, False), (1, "neg", 1000, t, False), (2, "neg", 1000, {}, False)],
                _together("zone"),
                z,
            ),
            ("n0", {"p0"}),
        ),
        # The pod is app=t itself: with its one app=t peer gone it is the first of its series,
        # free to go anywhere, so that peer is its victim on n0, though a neg pod fills n1 (in
        # a zone with no app=t pod, where it may not go while that peer runs).
        (
            _hand(
                prefix,
                "together-first-of-series",
                [(1000, z1, False), (1000, z2, False)],
                [(0, "low", 1000, t, False), (1, "neg", 1000, {}, False)],
                _together("zone"),
                t,
            ),
            ("n0", {"p0"}),
        ),
        # Spread over zones: z2 holds no app=s pod, so n0 must hold none; with one there, one.
        (two_zones("spread-zones", _spread("zone")), both),
        (two_zones("spread-zones-even", _spread("zone"), peer=s), one),
        # minDomains 3 of 2 zones: the emptiest counts as 0 whatever it holds; 2 of 2, as it is.
        (two_zones("spread-min-domains", _domains("zone", minDomains=3), peer=s), both),
        (two_zones("spread-min-domains-met", _domains("zone", minDomains=2), peer=s), one),
        # Its node affinity keeps it out of z2: under Honor (the default) z2 is no domain, under
        # Ignore it is.
        (two_zones("spread-affinity-honoured", {**_spread("zone"), "nodeSelector": z1}), one),
        (
            two_zones("spread-affinity-ignored", {**_domains("zone", nodeAffinityPolicy="Ignore"), "nodeSelector": z1}),
            both,
        ),
        (
            two_zones(
                "spread-affinity-honoured-min-domains",
                {**_domains("zone", nodeAffinityPolicy="Honor", minDomains=2), "nodeSelector": z1},
            ),
            both,
        ),
        # n1 tainted, not tolerated: under Ignore (the default) z2 is a domain, under Honor it is
        # not, unless tolerated.
        (two_zones("spread-taints-ignored", _spread("zone"), tainted=True), both),
        (two_zones("spread-taints-honoured", _domains("zone", nodeTaintsPolicy="Honor"), tainted=True), one),
        (
            two_zones(
                "spread-taints-tolerated",
                {
                    **_domains("zone", nodeTaintsPolicy="Honor"),
                    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                },
                tainted=True,
            ),
            both,
        ),
        (
            two_zones(
                "spread-taints-honoured-min-domains",
                _domains("zone", nodeTaintsPolicy="Honor", minDomains=2),
                tainted=True,
            ),
            both,
        ),
        # Anti-affinity against app=a pods of its own revision (matchLabelKeys): the v1 pod may
        # stay beside it, the v2 one goes, and so does the zero pod, for room.  Read without the
        # key, the low v1 pod would go instead of the zero pod.
        (
            _hand(
                prefix,
                "anti-match-label-keys",
                [(2000, {}, False)],
                [
                    (0, "low", 500, {"app": "a", "ver": "v1"}, False),
                    (0, "neg", 500, {"app": "a", "ver": "v2"}, False),
                    (0, "zero", 1000, {}, False),
                ],
                _apart_from_a(host, "matchLabelKeys"),
                {"app": "z", "ver": "v2"},
            ),
            ("n0", {"p1", "p2"}),
        ),
        # Against app=a pods of the other revisions (mismatchLabelKeys): the v1 pod goes, and the
        # neg v2 pod, for room; the zero pod stays.
        (
            _hand(
                prefix,
                "anti-mismatch-label-keys",
                [(2000, {}, False)],
                [
                    (0, "low", 500, {"app": "a", "ver": "v1"}, False),
                    (0, "neg", 500, {"app": "a", "ver": "v2"}, False),
                    (0, "zero", 1000, {}, False),
                ],
                _apart_from_a(host, "mismatchLabelKeys"),
                {"app": "z", "ver": "v2"},
            ),
            ("n0", {"p0", "p1"}),
        ),
    ]
    await _agree_as_written(kube, kube_scheduler, prefix, cases)


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


def _apart_from_a(topology_key: str, keys_field: str) -> dict[str, Any]:
    """Required anti-affinity against the app=a pods, by ``ver`` through ``keys_field``
    (``matchLabelKeys``: those of its own revision; ``mismatchLabelKeys``: of the others)."""
    term = {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": topology_key, keys_field: ["ver"]}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
