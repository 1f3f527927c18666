"""`gpusched run` against the real API server, with exactly the RBAC that manifests/ grants."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.kube.client import MERGE_PATCH, Kube
from tests.controlplane import SCHEDULER_NAMESPACE, ControlPlane
from tests.e2e import kit

MODELS = ("A100-SXM4-80GB", "V100-SXM2-32GB", "T4", "H800")


def sched_name() -> str:
    return f"gs-{uuid.uuid4().hex[:8]}"


def cluster_40() -> list[dict[str, Any]]:
    """40 nodes of mixed models: 10 x 8 A100, 10 x 4 V100, 10 x 2 T4, 10 x 8 H800 (200 GPUs)."""
    sizes = {"A100-SXM4-80GB": 8, "V100-SXM2-32GB": 4, "T4": 2, "H800": 8}
    return [kit.node(f"gpu-{m.split('-')[0].lower()}-{i}", sizes[m], m) for m in MODELS for i in range(10)]


def workload_300(scheduler: str, rng: random.Random) -> tuple[list[dict[str, Any]], set[str]]:
    """300 pods in random order asking for ~75% of the free GPUs; the ones named unfit-* fit nowhere."""
    pods: list[dict[str, Any]] = []
    pods += [kit.pod(f"share-{i}", scheduler, milli=(250, 500, 300)[i % 3], cpu="2") for i in range(120)]
    pods += [kit.pod(f"one-{i}", scheduler, gpus=1, cpu="2") for i in range(40)]
    pods += [kit.pod(f"two-{i}", scheduler, gpus=2, cpu="4", models=("A100-SXM4-80GB", "H800")) for i in range(12)]
    pods += [kit.pod(f"four-{i}", scheduler, gpus=4, cpu="8", models=("V100-SXM2-32GB",)) for i in range(4)]
    pods += [kit.pod(f"eight-{i}", scheduler, gpus=8, cpu="16") for i in range(2)]
    pods += [kit.pod(f"cpu-{i}", scheduler, cpu="1") for i in range(112)]
    rng.shuffle(pods)
    unfit = [
        kit.pod("unfit-16gpu-0", scheduler, gpus=16),
        kit.pod("unfit-16gpu-1", scheduler, gpus=16),
        kit.pod("unfit-model-0", scheduler, gpus=1, models=("B200",)),
        kit.pod("unfit-model-1", scheduler, gpus=2, models=("B200",)),
        kit.pod("unfit-cpu-0", scheduler, gpus=1, cpu="200"),
        kit.pod("unfit-cpu-1", scheduler, cpu="500"),
        kit.pod("unfit-t4x4-0", scheduler, gpus=4, models=("T4",)),
        kit.pod("unfit-mem-0", scheduler, gpus=1, memory="4Ti"),
        kit.pod("unfit-share-0", scheduler, milli=600, models=("B200",)),
        kit.pod("unfit-16gpu-2", scheduler, gpus=16, models=("H800",)),
    ]
    return pods + unfit, {p["metadata"]["name"] for p in unfit}


async def other_scheduler_pods(kube: Kube, ns: str) -> None:
    """Pods bound by someone else, straight onto nodes: their GPUs and CPU must be respected."""
    objs = [
        kit.pod(f"other-{i}", "other-scheduler", gpus=g, cpu="8", node_name=n)
        for i, (n, g) in enumerate([("gpu-a100-0", 6), ("gpu-h800-0", 8), ("gpu-v100-0", 3), ("gpu-t4-0", 2)])
    ]
    await kit.create_all(kube, f"/api/v1/namespaces/{ns}/pods", objs)


def patient_solver(tmp_path: Path) -> str:
    """A configuration file giving each solve ten seconds.  The solves of these tests end proven
    optimal in a fraction of a second, but a busy machine can make one outlast the default second,
    and one cut short without a solution ends as ``UNKNOWN_FALLBACK`` (the warm start's plan),
    which these tests count as a failure."""
    path = tmp_path / "solver.yaml"
    path.write_text("solver:\n  timeLimitSeconds: 10\n")
    return str(path)


async def test_300_pods_on_40_nodes(control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path) -> None:
    name = sched_name()
    nodes = cluster_40()
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    await other_scheduler_pods(kube, namespace)
    pods, unfit = workload_300(name, random.Random(7))
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", patient_solver(tmp_path))
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
        final = await kit.wait_settled(kube, namespace, len(pods) + 4, timeout=180)
        ours = [p for p in final if p["spec"]["schedulerName"] == name]
        # Each pod's Event is written after its Binding, or beside its condition.
        told = [
            ("Scheduled/" if p["spec"].get("nodeName") else "FailedScheduling/") + p["metadata"]["name"] for p in ours
        ]
        await kit.wait_events(kube, namespace, told)
    finally:
        code = daemon.stop()
    assert code == 0, "".join(daemon.raw[-30:])
    bound = {p["metadata"]["name"] for p in ours if p["spec"].get("nodeName")}
    missing = {p["metadata"]["name"] for p in pods} - unfit - bound
    why = {
        p["metadata"]["name"]: (kit.condition(p) or {}).get("message") for p in ours if p["metadata"]["name"] in missing
    }
    assert not missing, f"placeable pods left pending: {why}"
    assert not bound & unfit
    kit.check_placements(nodes, final)
    events = await kit.scheduled_events(kube, namespace)
    for p in ours:
        n = p["metadata"]["name"]
        if n in bound:
            assert len(events.get(f"Scheduled/{n}", [])) == 1, n  # bound once, told once
            assert (p["metadata"].get("annotations") or {}).get("gpusched.io/gpu-indices") or kit.milli_of(p)[0] == 0
        else:
            cond = kit.condition(p)
            assert cond is not None, n
            assert (cond["status"], cond["reason"]) == ("False", "Unschedulable"), n
            assert cond["message"].startswith("0/40 nodes are available: "), cond["message"]
            assert events.get(f"FailedScheduling/{n}"), n
    by_name = {p["metadata"]["name"]: kit.condition(p) for p in ours}
    assert "40 GPU model not accepted" in by_name["unfit-model-0"]["message"]
    assert "Insufficient nvidia.com/gpu" in by_name["unfit-16gpu-0"]["message"]
    assert "Insufficient cpu" in by_name["unfit-cpu-1"]["message"]
    batches = daemon.events("batch")
    assert batches
    statuses = {b["status"].removesuffix("+FILLED") for b in batches}
    assert statuses <= {"OPTIMAL", "OPTIMAL_PRUNED", "FEASIBLE", "NO_CANDIDATES", "QUICK"}, batches[:3]
    assert all(b["placed"] == b["pods"] for b in batches if b["status"] == "QUICK"), batches
    assert sum(b["placed"] for b in batches) == len(bound)


async def test_a_backlog_is_started_quick_and_then_solved(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    # 150 pods wait before the scheduler starts, more than its client burst (30).  The first
    # batches, as many pods as the client sends at once (10 at qps 20), are bound as the FGD
    # warm start placed them, while the client has tokens to spare; once the binds have spent
    # them, full batches are solved by CP-SAT again.
    name = sched_name()
    nodes = [kit.node(f"backlog-{i}", 8, "A100-SXM4-80GB") for i in range(20)]  # names no other test uses
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    pods = [kit.pod(f"one-{i}", name, gpus=1) for i in range(100)]
    pods += [kit.pod(f"share-{i}", name, milli=500) for i in range(50)]
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
    daemon = kit.Daemon.start(
        control_plane,
        name,
        *("--no-leader-elect", "--kube-api-qps", "20", "--kube-api-burst", "30"),
        *("--config", patient_solver(tmp_path)),
    )
    try:
        final = await kit.wait_settled(kube, namespace, len(pods), timeout=120)
        await kit.wait_events(kube, namespace, [f"Scheduled/{p['metadata']['name']}" for p in final])
    finally:
        code = daemon.stop()
    assert code == 0, "".join(daemon.raw[-30:])
    left = {
        p["metadata"]["name"]: (kit.condition(p) or {}).get("message") for p in final if not p["spec"].get("nodeName")
    }
    assert not left, left
    kit.check_placements(nodes, final)
    events = await kit.scheduled_events(kube, namespace)
    assert all(len(events.get(f"Scheduled/{p['metadata']['name']}", [])) == 1 for p in final)
    batches = sorted(daemon.events("batch"), key=lambda b: b["batch_id"])
    assert (batches[0]["status"], batches[0]["pods"], batches[0]["placed"]) == ("QUICK", 10, 10), batches[0]
    quick = [b for b in batches if b["status"] == "QUICK"]
    assert all(b["pods"] == b["placed"] <= 10 for b in quick), quick
    solved = [b for b in batches if b["status"].removesuffix("+FILLED") in ("OPTIMAL", "OPTIMAL_PRUNED", "FEASIBLE")]
    assert solved, batches
    assert solved[0]["pods"] > 10, "a solved batch is a full one"
    assert sum(b["placed"] for b in batches) == len(pods)


async def test_unschedulable_pod_is_retried_when_the_cluster_changes(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("small-0", 2, "T4")])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [kit.pod("big", name, gpus=8)])
        (p,) = await kit.wait_settled(kube, namespace, 1, timeout=90)
        message = (kit.condition(p) or {}).get("message")
        assert message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        explained = await kit.explain(control_plane, f"{namespace}/big", name)
        assert explained.returncode == 1, explained.stderr
        assert message in explained.stdout
        missing = await kit.explain(control_plane, "big", name)  # in the default namespace: not there
        assert missing.returncode == 2
        assert "error: pod default/big not found; name it as NAMESPACE/POD, or pass --namespace" in missing.stderr
        assert missing.stdout == ""
        # Parked, not solved again: the watch bringing back our own condition is no reason to
        # retry, and the condition was written once (its transition time has not moved).
        again = await kube.get(f"/api/v1/namespaces/{namespace}/pods/big")
        assert (kit.condition(again) or {}).get("lastTransitionTime") == (kit.condition(p) or {}).get(
            "lastTransitionTime"
        )
        assert again["metadata"]["resourceVersion"] == p["metadata"]["resourceVersion"]
        tries = daemon.wait_count("unschedulable", 1)  # the line is written beside the condition
        assert [t["pod"] for t in tries] == [f"{namespace}/big"], tries
        await kit.create_all(kube, "/api/v1/nodes", [kit.node("big-0", 8, "H800")])
        p = await kit.wait_bound(kube, f"/api/v1/namespaces/{namespace}/pods/big", timeout=kit.RETRIED_WITHIN)
        assert p["spec"].get("nodeName") == "big-0", "not retried when a node it fits on was added"
        assert p["metadata"]["annotations"]["gpusched.io/gpu-indices"] == "0,1,2,3,4,5,6,7"
    finally:
        daemon.stop()


async def test_tainted_gpu_nodes_take_only_pods_that_tolerate_them(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    gpu = kit.node("tainted-gpu-0", 4, "T4")
    gpu["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    await kit.create_all(kube, "/api/v1/nodes", [gpu, kit.node("tainted-cpu-0", 0, "")])
    tolerating = kit.pod("tolerating", name, gpus=1)
    tolerating["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pods = [tolerating, kit.pod("intolerant", name, gpus=1), kit.pod("cpu", name)]
    final = await kit.schedule(control_plane, kube, namespace, name, pods)
    assert final["tolerating"]["spec"].get("nodeName") == "tainted-gpu-0"
    assert final["cpu"]["spec"].get("nodeName") == "tainted-cpu-0"
    assert not final["intolerant"]["spec"].get("nodeName")
    message = (kit.condition(final["intolerant"]) or {}).get("message", "")
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in message, message


async def test_a_cordoned_node_takes_only_pods_that_tolerate_the_cordon(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    # No node controller runs here to add the node.kubernetes.io/unschedulable taint: the
    # cordon is read from spec.unschedulable, as kube-scheduler's NodeUnschedulable reads it.
    name = sched_name()
    cordoned = kit.node("cordoned-0", 4, "T4")
    cordoned["spec"] = {"unschedulable": True}
    await kit.create_all(kube, "/api/v1/nodes", [cordoned, kit.node("uncordoned-0", 1, "T4")])
    tolerating = kit.pod("tolerating", name, gpus=2)
    tolerating["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(
            kube, f"/api/v1/namespaces/{namespace}/pods", [tolerating, kit.pod("waiting", name, gpus=2)]
        )
        final = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, 2, timeout=90)}
        assert final["tolerating"]["spec"].get("nodeName") == "cordoned-0"
        assert not final["waiting"]["spec"].get("nodeName")
        message = (kit.condition(final["waiting"]) or {}).get("message", "")
        assert message == ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."), (
            message
        )
        # Uncordoned, the node takes the waiting pod: a cordon lifted is a change in the cluster.
        r = await kube.request(
            "PATCH", "/api/v1/nodes/cordoned-0", body={"spec": {"unschedulable": None}}, content_type=MERGE_PATCH
        )
        assert r.ok, r.body
        p = await kit.wait_bound(kube, f"/api/v1/namespaces/{namespace}/pods/waiting")
        assert p["spec"].get("nodeName") == "cordoned-0"
        indices = [q["metadata"]["annotations"]["gpusched.io/gpu-indices"].split(",") for q in (p, final["tolerating"])]
        assert sorted(map(len, indices)) == [2, 2], indices
        assert not set(indices[0]) & set(indices[1]), indices
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])


async def _priority_classes(kube: Kube, prefix: str, **classes: tuple[int, str]) -> list[str]:
    """PriorityClasses ``prefix-NAME`` of (value, preemptionPolicy or ""), in the order given."""
    names = []
    for suffix, (value, policy) in classes.items():
        body: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        body |= {"metadata": {"name": f"{prefix}-{suffix}"}, "value": value}
        if policy:
            body["preemptionPolicy"] = policy
        r = await kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        assert r.status == 201, r.body
        names.append(f"{prefix}-{suffix}")
    return names


def _of_class(p: dict[str, Any], cls: str) -> dict[str, Any]:
    """``p`` with the PriorityClass ``cls``."""
    p["spec"]["priorityClassName"] = cls
    return p


def _running(name: str, node: str, cls: str) -> dict[str, Any]:
    """A one-GPU pod of another scheduler, bound to ``node``, of PriorityClass ``cls``; with no
    kubelet here, once deleted it lingers for its grace period."""
    p = _of_class(kit.pod(name, "default-scheduler", gpus=1, node_name=node), cls)
    p["spec"]["terminationGracePeriodSeconds"] = 30
    return p


async def _drop_priority_classes(kube: Kube, *names: str) -> None:
    for n in names:
        await kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{n}")


async def _until(kube: Kube, path: str, ok: Any, timeout: float = 60.0) -> dict[str, Any]:
    """The object at ``path`` once ``ok(obj)`` holds (or as it is after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        r = await kube.request("GET", path)
        assert r.ok, r.body
        if ok(r.body) or time.monotonic() > deadline:
            return dict(r.body)
        await asyncio.sleep(0.2)


async def test_a_pod_of_higher_priority_preempts_a_pod_of_lower_priority_and_takes_its_room(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    low, high, never = await _priority_classes(kube, name, low=(10, ""), high=(1000, ""), never=(1000, "Never"))
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("preempt-0", 2, "T4")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    running = []
    for i, cls in enumerate((low, high)):  # one of each priority fills the node
        p = _running(f"running-{i}", "preempt-0", cls)
        p["metadata"]["annotations"]["gpusched.io/gpu-indices"] = str(i)
        running.append(p)
    await kit.create_all(kube, pods, running)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        # As urgent as can be, but it may not preempt: it waits, and nothing is evicted.
        await kit.create_all(kube, pods, [_of_class(kit.pod("polite", name, gpus=1), never)])
        (polite,) = [
            p for p in await kit.wait_settled(kube, namespace, 3, timeout=60) if p["metadata"]["name"] == "polite"
        ]
        assert (kit.condition(polite) or {}).get("message") == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        await kit.create_all(kube, pods, [_of_class(kit.pod("urgent", name, gpus=1), high)])
        victim = await _until(kube, f"{pods}/running-0", lambda o: o["metadata"].get("deletionTimestamp"))
        assert victim["metadata"].get("deletionTimestamp"), "the pod of lower priority was not preempted"
        marked = [c for c in victim["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]
        assert [(c["status"], c["reason"]) for c in marked] == [("True", "PreemptionByScheduler")]
        urgent = await _until(kube, f"{pods}/urgent", lambda o: (o.get("status") or {}).get("nominatedNodeName"))
        assert urgent["status"]["nominatedNodeName"] == "preempt-0"
        told = (kit.condition(urgent) or {}).get("message")
        fits = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        # Tried again as the victim's deletion starts (a pod being deleted counts no more for
        # spread), it says what it waits for instead.
        assert told in (
            f"{fits} Preempting 1 pod(s) of lower priority on node preempt-0.",
            f"{fits} Waiting for 1 preempted pod(s) to leave node preempt-0.",
        ), told
        # While the victim terminates, its GPU is held for urgent: a pod arriving now waits.
        await kit.create_all(kube, pods, [_of_class(kit.pod("late", name, gpus=1), low)])
        late = await _until(kube, f"{pods}/late", lambda o: kit.condition(o) is not None)
        assert "Insufficient nvidia.com/gpu" in (kit.condition(late) or {}).get("message", "")
        assert not urgent["spec"].get("nodeName")
        # The kubelet's part: the victim has stopped; it leaves, and urgent takes its GPU.
        r = await kube.request("DELETE", f"{pods}/running-0", query={"gracePeriodSeconds": "0"})
        assert r.ok, r.body
        urgent = await kit.wait_bound(kube, f"{pods}/urgent")
        assert urgent["spec"].get("nodeName") == "preempt-0"
        assert urgent["metadata"]["annotations"]["gpusched.io/gpu-indices"] == "0"
        await asyncio.sleep(1.0)  # the two left waiting were tried again with it, and still wait
        for n in ("polite", "late", "running-1"):
            obj = (await kube.request("GET", f"{pods}/{n}")).body
            assert not obj["metadata"].get("deletionTimestamp"), n
            assert bool(obj["spec"].get("nodeName")) == (n == "running-1"), n
        events = await kit.wait_events(kube, namespace, ["Preempted/running-0"])
        (told,) = events["Preempted/running-0"]
        assert told["message"] == f"Preempted by pod {namespace}/urgent on node preempt-0"
        assert [x["pod"] for x in daemon.events("preempt")] == [f"{namespace}/urgent"]  # once, not again
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await _drop_priority_classes(kube, low, high, never)


async def test_preemption_evicts_a_pod_no_disruption_budget_protects_before_one_of_lower_priority(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    low, mid, high = await _priority_classes(kube, name, low=(10, ""), mid=(20, ""), high=(1000, ""))
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("pdb-0", 1, "T4"), kit.node("pdb-1", 1, "T4")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # No disruption controller runs here: the budget's status says no disruption is allowed.
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    r = await kube.request("POST", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", body=budget)
    assert r.status == 201, r.body
    web = _running("web-0", "pdb-0", low)
    web["metadata"]["labels"] = {"app": "web"}
    await kit.create_all(kube, pods, [web, _running("batch-0", "pdb-1", mid)])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods, [_of_class(kit.pod("urgent", name, gpus=1), high)])
        victim = await _until(kube, f"{pods}/batch-0", lambda o: o["metadata"].get("deletionTimestamp"))
        assert victim["metadata"].get("deletionTimestamp"), "the unprotected pod was not preempted"
        urgent = await _until(kube, f"{pods}/urgent", lambda o: (o.get("status") or {}).get("nominatedNodeName"))
        assert urgent["status"]["nominatedNodeName"] == "pdb-1"
        web = (await kube.request("GET", f"{pods}/web-0")).body
        assert not web["metadata"].get("deletionTimestamp")  # protected, though of lower priority
        (line,) = daemon.wait_count("preempt", 1)
        assert (line["victims"], line["violations"]) == ([f"{namespace}/batch-0@20"], 0)
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await _drop_priority_classes(kube, low, mid, high)


async def test_a_prefer_no_schedule_node_is_used_only_when_nothing_else_fits(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    # The autoscaler marked "leaving" for removal.  Half of its GPU is taken: a half-GPU pod
    # would fill it (elsewhere it may strand half a GPU that whole-GPU pods cannot use), so
    # packing would choose it.  The first three pods fill "staying" instead; the fourth fits
    # only on "leaving".
    name = sched_name()
    leaving = kit.node("soft-leaving-0", 1, "T4")
    leaving["spec"] = {"taints": [{"key": "DeletionCandidateOfClusterAutoscaler", "effect": "PreferNoSchedule"}]}
    await kit.create_all(kube, "/api/v1/nodes", [leaving, kit.node("soft-staying-0", 2, "T4")])
    old = kit.pod("old", name, milli=500, node_name="soft-leaving-0")
    old["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "0"
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [old])
    first = [kit.pod("half-0", name, milli=500), kit.pod("half-1", name, milli=500), kit.pod("whole", name, gpus=1)]
    final = await kit.schedule(control_plane, kube, namespace, name, first, count=4)
    assert {final[n]["spec"].get("nodeName") for n in ("half-0", "half-1", "whole")} == {"soft-staying-0"}
    final = await kit.schedule(control_plane, kube, namespace, name, [kit.pod("third", name, milli=500)], count=5)
    assert final["third"]["spec"].get("nodeName") == "soft-leaving-0"


async def test_a_gated_pod_waits_for_its_gates_then_is_bound(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("gated-gpu-0", 2, "T4")])
    gated = kit.pod("gated", name, gpus=1)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [gated, kit.pod("free", name, gpus=1)])
        daemon.wait_log("bind", where=lambda x: x["pod"] == f"{namespace}/free")
        await asyncio.sleep(1.0)
        p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/gated")
        assert not p["spec"].get("nodeName")
        assert not [x for x in daemon.lines if x.get("pod") == f"{namespace}/gated"], "a gated pod was tried"
        r = await kube.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/gated",
            body={"spec": {"schedulingGates": None}},
            content_type=MERGE_PATCH,
        )
        assert r.ok, r.body
        bound = daemon.wait_log("bind", where=lambda x: x["pod"] == f"{namespace}/gated")
        assert bound["result"] == "bound"
    finally:
        daemon.stop()


async def test_invalid_request_gets_an_event_and_condition(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("n-0", 8, "A100-SXM4-80GB")])
    bad = kit.pod("both", name, gpus=1, milli=500)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [bad])
        (p,) = await kit.wait_settled(kube, namespace, 1, timeout=90)
        events = await kit.wait_events(kube, namespace, ["FailedScheduling/both"])
    finally:
        daemon.stop()
    cond = kit.condition(p)
    assert cond is not None
    assert "not both" in cond["message"]
    assert "not both" in events["FailedScheduling/both"][0]["message"]


async def test_sigkill_mid_batch_then_restart(control_plane: ControlPlane, kube: Kube, namespace: str) -> None:
    name = sched_name()
    nodes = [kit.node(f"k-{i}", 8, "A100-SXM4-80GB") for i in range(30)]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    rng = random.Random(3)
    pods = [
        kit.pod(f"p-{i}", name, gpus=rng.choice((1, 1, 2)))
        if rng.random() < 0.6
        else kit.pod(f"p-{i}", name, milli=rng.choice((250, 500)))
        for i in range(200)
    ]
    # A slow client makes batches long, so the kill lands while binds are in flight.
    first = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--kube-api-qps", "20", "--kube-api-burst", "5")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
        deadline = time.monotonic() + 60  # the daemon's start alone can take seconds on a busy machine
        while time.monotonic() < deadline:
            bound = [x for x in first.events("bind") if x["result"] == "bound"]
            if len(bound) >= 20:
                break
            await asyncio.sleep(0.05)
    finally:
        first.kill()
    assert first.proc.returncode == -9
    killed_at = len([x for x in first.events("bind") if x["result"] == "bound"])
    assert 20 <= killed_at < len(pods), "the kill did not land mid-stream"
    second = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        final = await kit.wait_settled(kube, namespace, len(pods), timeout=120)
    finally:
        second.stop()
    assert all(p["spec"].get("nodeName") for p in final), "every pod fits, so every pod is bound"
    kit.check_placements(nodes, final)
    events = await kit.scheduled_events(kube, namespace)
    assert all(len(events.get(f"Scheduled/{p['metadata']['name']}", [])) <= 1 for p in final)
    second_bound = {x["pod"] for x in second.events("bind") if x["result"] == "bound"}
    first_bound = {x["pod"] for x in first.events("bind") if x["result"] == "bound"}
    assert not first_bound & second_bound, "a pod bound by the first instance was bound again"


def _bound(line: dict[str, Any]) -> bool:
    return bool(line["result"] == "bound")


async def test_two_replicas_one_leader_and_failover(control_plane: ControlPlane, kube: Kube, namespace: str) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"l-{i}", 8, "H800") for i in range(10)])
    timing = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")
    a = kit.Daemon.start(control_plane, name, *timing, identity=f"{name}-a")
    b = kit.Daemon.start(control_plane, name, *timing, identity=f"{name}-b")
    ns_pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        leader_line = None
        deadline = time.monotonic() + 60  # two daemons starting at once on a busy machine
        while time.monotonic() < deadline:
            lines = [d.events("leadership changed") for d in (a, b)]
            if any(lines):
                leader_line = lines
                break
            await asyncio.sleep(0.05)
        assert leader_line is not None
        leader, standby = (a, b) if a.events("leadership changed") else (b, a)
        await kit.create_all(kube, ns_pods, [kit.pod(f"first-{i}", name, gpus=1) for i in range(20)])
        await kit.wait_settled(kube, namespace, 20, timeout=90)
        assert not standby.events("bind"), "the standby must not schedule"
        assert len(leader.wait_count("bind", 20, where=_bound)) == 20
        leader.kill()
        killed = datetime.now(UTC)
        await kit.create_all(kube, ns_pods, [kit.pod(f"second-{i}", name, gpus=1) for i in range(20)])
        await kit.wait_settled(kube, namespace, 40, timeout=90)
        took_over = standby.wait_log("leadership changed", where=lambda x: x["leader"] is True)
        took = (datetime.fromisoformat(took_over["timestamp"]) - killed).total_seconds()
        # The standby counts the lease (4 s) from when it last saw a renewal, up to a retry period
        # (0.5 s) after the kill, and notices the expiry up to a retry period late: 5 s, plus the
        # few requests in between, which a busy machine can make last a second or two.  A standby
        # that waited out two leases would take 8 s or more.
        assert took <= 4 + 0.5 + 0.5 + 2.0, f"takeover took {took:.1f}s (lease 4s, retry 0.5s)"
        assert len(standby.wait_count("bind", 20, where=_bound)) == 20
        second = [f"Scheduled/second-{i}" for i in range(20)]
        events = await kit.wait_events(kube, namespace, second)
        who = {e["reportingInstance"] for k, v in events.items() if k.startswith("Scheduled/second-") for e in v}
        assert who == {standby.identity}
    finally:
        for d in (a, b):
            d.stop()


def test_a_lease_the_role_does_not_grant_is_logged_with_the_fix(control_plane: ControlPlane) -> None:
    # The scheduler's RBAC grants the Lease gpu-scheduler only: a second instance sharing the
    # namespace under another --lease-name is refused, and says what to grant.
    d = kit.Daemon.start(control_plane, sched_name(), "--lease-name", "another-scheduler", "--retry-period", "0.5")
    try:
        line = d.wait_log("lease request failed", where=lambda x: x.get("status") == 403)
        assert "Lease named another-scheduler" in line["fix"]
        assert "--lease-name" in line["fix"]
        # Refused every retry period: said once, and the replica, which can never lead, is not
        # ready (a rollout with such a Role stops at the first new pod).
        deadline = time.monotonic() + 30
        while (ready := _readyz(d.metrics_port))[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready[0] == 503
        assert ready[1].startswith("not ready: cannot take the Lease: ")
        assert "--lease-name" in ready[1]
        time.sleep(2.0)  # four more refusals
        warned = [x for x in d.events("lease request failed") if x.get("level") == "warning"]
        assert len(warned) == 1
        assert not d.events("leadership changed")
    finally:
        d.stop()


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _metric(port: int, name: str) -> float | None:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return None


async def _metric_once(port: int, name: str, value: float, timeout: float = 60.0) -> float | None:
    """The metric once it reads ``value``, or as it reads after ``timeout`` seconds: the daemon
    counts a bind when the Binding's answer reaches it, which can be after the pod shows bound."""
    deadline = time.monotonic() + timeout
    while True:
        got = await _metric(port, name)
        if got == value or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


async def _set_config(kube: Kube, cm: str, text: str) -> None:
    path = f"/api/v1/namespaces/{SCHEDULER_NAMESPACE}/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}, "data": {"config.yaml": text}}
    r = await kube.request("PUT", f"{path}/{cm}", body=body)
    if r.status == 404:
        r = await kube.request("POST", path, body=body)
    assert r.ok, r.body


async def test_bad_configmap_is_rejected_and_old_weights_stay(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    cm = "gpu-scheduler-config"  # the one the manifests' RBAC lets the scheduler read
    await _set_config(kube, cm, "weights:\n  fragmentation: 77\n")
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("c-0", 8, "A100-SXM4-80GB")])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", f"configmap/{cm}")
    try:
        port = daemon.metrics_port
        weight = 'gpusched_solver_weight{term="fragmentation"}'
        assert await _metric_once(port, weight, 77) == 77
        await _set_config(kube, cm, "weights:\n  fragmentation: -5\n  nosuch: 1\n")
        line = daemon.wait_log("configuration rejected; the last good configuration stays")
        assert "weights.fragmentation" in line["error"]
        assert "weights.nosuch: unknown key" in line["error"]
        assert await _metric(port, weight) == 77
        assert await _metric(port, 'gpusched_config_reloads_total{result="rejected"}') == 1
        deadline = time.monotonic() + 60
        while True:
            evs = await kit.list_all(kube, f"/api/v1/namespaces/{SCHEDULER_NAMESPACE}/events")
            bad = [e for e in evs if e["reason"] == "InvalidConfiguration" and e["involvedObject"]["name"] == cm]
            if bad or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert bad
        assert "weights.fragmentation" in bad[-1]["message"]
        assert bad[-1]["type"] == "Warning"
        # Still scheduling, with the old configuration.
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [kit.pod("after", name, gpus=1)])
        (p,) = await kit.wait_settled(kube, namespace, 1, timeout=90)
        assert p["spec"].get("nodeName") == "c-0"
    finally:
        daemon.stop()
        await _set_config(kube, cm, "{}\n")


async def test_metrics_health_and_readiness(control_plane: ControlPlane, kube: Kube, namespace: str) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("m-0", 8, "A100-SXM4-80GB"), kit.node("m-1", 2, "T4")])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        port = daemon.metrics_port
        pods = [kit.pod(f"m{i}", name, gpus=1, models=("A100-SXM4-80GB",)) for i in range(3)]
        pods += [kit.pod("too-big", name, gpus=16), kit.pod("too-big-share", name, milli=300, models=("H800",))]
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
        await kit.wait_settled(kube, namespace, 5, timeout=90)
        async with aiohttp.ClientSession() as s:
            for path in ("/healthz", "/readyz"):
                async with s.get(f"http://127.0.0.1:{port}{path}") as r:
                    assert r.status == 200, path
        assert await _metric_once(port, "gpusched_pods_scheduled_total", 3) == 3
        assert await _metric(port, "gpusched_gpus") == 10
        assert await _metric(port, "gpusched_gpu_allocation_ratio") == pytest.approx(3 / 10)
        # The autoscaling signals: one GPU node with nothing on it, 16.3 GPUs asked for in vain.
        assert await _metric(port, "gpusched_gpu_nodes_idle") == 1
        assert await _metric_once(port, "gpusched_unschedulable_gpu_demand", 16.3) == 16.3
    finally:
        daemon.stop()


async def test_ready_only_once_the_watches_listed_and_the_solver_is_loaded(
    control_plane: ControlPlane, kube: Kube
) -> None:
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("r-0", 8, "A100-SXM4-80GB")])
    sched = Scheduler(DaemonSettings(scheduler_name=sched_name(), leader_elect=False), kube)
    ok, why = sched.ready()
    assert not ok
    listed = (
        "namespaces, nodes, bound-pods, pending-pods, claims, volumes, storage-classes, csi-nodes, "
        "disruption-budgets, podgroups"
    )
    assert why == f"waiting for the first list of {listed}"
    watches = [asyncio.create_task(r.run()) for r in sched.reflectors]
    tasks = list(watches)
    try:
        await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in sched.reflectors)), 30)
        assert sched.ready() == (False, "loading the solver")
        tasks.append(asyncio.create_task(sched.schedule_forever()))
        deadline = time.monotonic() + 60  # the solver's import alone can take seconds on a busy machine
        while not sched.ready()[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sched.ready() == (True, "")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _member(name: str, scheduler: str, group: str, minimum: int, gpus: int = 8, **annotations: str) -> dict[str, Any]:
    p = kit.pod(name, scheduler, gpus=gpus)
    p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    p["metadata"]["annotations"].update({"gpusched.io/gang-min-members": str(minimum), **annotations})
    return p


async def test_a_gang_of_higher_priority_preempts_for_all_its_members_in_one_rack(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    low, mid, high = await _priority_classes(kube, name, low=(10, ""), mid=(20, ""), high=(1000, ""))
    nodes = [kit.node(f"gp-{i}", 1, "T4", rack=f"r{i // 2}") for i in range(4)]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # Rack r0 runs two pods of low priority; r1 one of low and one of mid priority.
    running = [_running(f"run-{i}", f"gp-{i}", cls) for i, cls in enumerate((low, low, low, mid))]
    await kit.create_all(kube, pods, running)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    rack = {"gpusched.io/gang-topology-key": "rack", "gpusched.io/gang-topology": "required"}
    try:
        gang = [_of_class(_member(f"worker-{i}", name, "train", 2, gpus=1, **rack), high) for i in range(2)]
        await kit.create_all(kube, pods, gang)
        for victim in ("run-0", "run-1"):
            obj = await _until(kube, f"{pods}/{victim}", lambda o: o["metadata"].get("deletionTimestamp"))
            assert obj["metadata"].get("deletionTimestamp"), f"{victim} was not preempted"
        nominated = set()
        for i in range(2):
            w = await _until(kube, f"{pods}/worker-{i}", lambda o: (o.get("status") or {}).get("nominatedNodeName"))
            nominated.add(w["status"]["nominatedNodeName"])
            assert not w["spec"].get("nodeName")  # not before every victim has left
        assert nominated == {"gp-0", "gp-1"}
        # The victims leave one at a time; the gang is bound only once both have.
        r = await kube.request("DELETE", f"{pods}/run-0", query={"gracePeriodSeconds": "0"})
        assert r.ok, r.body
        await asyncio.sleep(1.0)
        for i in range(2):
            assert not (await kube.request("GET", f"{pods}/worker-{i}")).body["spec"].get("nodeName")
        r = await kube.request("DELETE", f"{pods}/run-1", query={"gracePeriodSeconds": "0"})
        assert r.ok, r.body
        bound = {(await kit.wait_bound(kube, f"{pods}/worker-{i}"))["spec"]["nodeName"] for i in range(2)}
        assert bound == {"gp-0", "gp-1"}
        for other in ("run-2", "run-3"):  # the other rack is left alone
            assert not (await kube.request("GET", f"{pods}/{other}")).body["metadata"].get("deletionTimestamp")
        events = await kit.wait_events(kube, namespace, ["Preempted/run-0", "Preempted/run-1"])
        assert events["Preempted/run-0"][0]["message"].startswith(f"Preempted by pod {namespace}/worker-")
        (line,) = daemon.wait_count("preempt", 1)  # once for the whole gang, not again
        assert line["gang"] == f"{namespace}/train"
        assert sorted(line["victims"]) == [f"{namespace}/run-0@10", f"{namespace}/run-1@10"]
    finally:
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await _drop_priority_classes(kube, low, mid, high)


async def _kubelet(kube: Kube, pods: str, rng: random.Random, gone: list[str]) -> None:
    """A kubelet's part for every node: a pod being deleted stops after 0.2-1.5 s and leaves
    (its name is added to ``gone``)."""
    seen: set[str] = set()

    async def stop(name: str) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        r = await kube.request("DELETE", f"{pods}/{name}", query={"gracePeriodSeconds": "0"})
        assert r.ok or r.status == 404, r.body
        gone.append(name)

    stopping = []
    try:
        while True:
            for p in await kit.list_all(kube, pods):
                name = p["metadata"]["name"]
                if p["metadata"].get("deletionTimestamp") and name not in seen:
                    seen.add(name)
                    stopping.append(asyncio.ensure_future(stop(name)))
            await asyncio.sleep(0.2)
    finally:
        for t in stopping:
            t.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)


async def test_waves_of_preemption_evict_exactly_what_the_pods_of_higher_priority_need(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    # 24 GPUs full of pods of low priority.  Then, at once, 8 pods of mid priority, 4 of high
    # priority and a high gang of two 4-GPU members that must share a rack; while their victims
    # leave (each after its own short delay), 2 more high pods.  Everything of mid and high
    # priority fits (22 GPUs): it must all be bound, by evicting exactly 22 low pods, never a
    # pod of mid or high priority, never twice, and never over-committing a GPU.
    name = sched_name()
    low, mid, high = await _priority_classes(kube, name, low=(10, ""), mid=(100, ""), high=(1000, ""))
    nodes = [kit.node(f"wave-{i}", 4, "T4", rack=f"r{i // 2}") for i in range(6)]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    gone: list[str] = []
    kubelet = asyncio.ensure_future(_kubelet(kube, pods, random.Random(11), gone))
    rack = {"gpusched.io/gang-topology-key": "rack", "gpusched.io/gang-topology": "required"}
    try:
        lows = [_of_class(kit.pod(f"low-{i}", name, gpus=1), low) for i in range(24)]
        for p in lows:
            p["spec"]["terminationGracePeriodSeconds"] = 30
        await kit.create_all(kube, pods, lows)
        await kit.wait_settled(kube, namespace, 24, timeout=60)
        wave = [_of_class(kit.pod(f"mid-{i}", name, gpus=1), mid) for i in range(8)]
        wave += [_of_class(kit.pod(f"high-{i}", name, gpus=1), high) for i in range(4)]
        wave += [_of_class(_member(f"gang-{i}", name, "train", 2, gpus=4, **rack), high) for i in range(2)]
        await kit.create_all(kube, pods, wave)
        await asyncio.sleep(0.5)
        late = [_of_class(kit.pod(f"high-{i}", name, gpus=1), high) for i in range(4, 6)]
        await kit.create_all(kube, pods, late)
        wanted = {p["metadata"]["name"] for p in wave + late}
        deadline = time.monotonic() + 90
        while True:
            everything = await kit.list_all(kube, pods)
            bound = {p["metadata"]["name"] for p in everything if p["spec"].get("nodeName")}
            if wanted <= bound or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert wanted <= bound, sorted(wanted - bound)
        await asyncio.sleep(2.0)  # any further eviction would show now
        everything = await kit.list_all(kube, pods)
        kit.check_placements(nodes, everything)
        by_name = {p["metadata"]["name"]: p for p in everything}
        assert not [n for n in by_name if n in wanted and by_name[n]["metadata"].get("deletionTimestamp")]
        assert sorted(n for n in gone if not n.startswith("low-")) == []
        assert len(set(gone)) == len(gone)
        assert len(gone) == 22, sorted(gone)
        assert len([n for n in by_name if n.startswith("low-")]) == 2
        racks = {by_name[f"gang-{i}"]["spec"]["nodeName"] for i in range(2)}
        assert len({int(n.split("-")[1]) // 2 for n in racks}) == 1, racks
        victims = [v for line in daemon.events("preempt") for v in line["victims"]]
        assert len(victims) == len(set(victims)) == 22, victims
        assert all(v.endswith("@10") for v in victims), victims
    finally:
        kubelet.cancel()
        await asyncio.gather(kubelet, return_exceptions=True)
        assert daemon.stop() == 0, "".join(daemon.raw[-30:])
        await _drop_priority_classes(kube, low, mid, high)


async def test_gangs_mig_slices_and_gpu_islands(control_plane: ControlPlane, kube: Kube, namespace: str) -> None:
    name = sched_name()
    nodes = [kit.node(f"h-{i}", 8, "NVIDIA-H100-80GB-HBM3", rack=f"r{i // 2}") for i in range(4)]
    nodes.append(kit.node("l4-0", 4, "NVIDIA-L4"))  # PCIe: islands 0-1 and 2-3 by default
    mig = kit.node("a100-mig", 0, "NVIDIA-A100-SXM4-80GB")
    for part in ("capacity", "allocatable"):
        mig["status"][part]["nvidia.com/mig-1g.10gb"] = "3"
    nodes.append(mig)
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    rack = {"gpusched.io/gang-topology-key": "rack", "gpusched.io/gang-topology": "required"}
    pods = [_member(f"big-{i}", name, "big", 3, **rack) for i in range(3)]  # no rack has three nodes
    pods += [_member(f"pair-{i}", name, "pair", 2, **rack) for i in range(2)]
    pods += [_member("early-0", name, "early", 2)]  # its second member has not been created
    for i in range(2):
        p = kit.pod(f"isl-{i}", name, gpus=2, models=("NVIDIA-L4",))
        p["metadata"]["annotations"]["gpusched.io/gpu-island"] = "required"
        pods.append(p)
    for i in range(4):
        p = kit.pod(f"slice-{i}", name)
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"
        pods.append(p)
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
        final = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, len(pods), timeout=90)}
        # A late member of the running pair counts the two as present and is held to their rack,
        # which is full, although the other rack has room.
        late = [_member("pair-2", name, "pair", 2, **rack)]
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", late)
        after = await kit.wait_settled(kube, namespace, len(pods) + 1, timeout=90)
        told = ("FailedScheduling/pair-2", "FailedScheduling/big-0", "FailedScheduling/early-0")
        events = await kit.wait_events(kube, namespace, told)
    finally:
        daemon.stop()
    (pair2,) = [p for p in after if p["metadata"]["name"] == "pair-2"]
    assert not pair2["spec"].get("nodeName")
    bound = {n: p["spec"].get("nodeName") for n, p in final.items() if p["spec"].get("nodeName")}
    pair_rack = {"h-0": "r0", "h-1": "r0", "h-2": "r1", "h-3": "r1"}[bound["pair-0"]]
    assert f"within rack {pair_rack}, where its members run" in events["FailedScheduling/pair-2"][0]["message"]
    # Gangs: whole or not at all; the pair in one rack.
    assert not any(n.startswith("big-") for n in bound)
    assert "do not all fit at once within one rack domain" in events["FailedScheduling/big-0"][0]["message"]
    assert {bound["pair-0"], bound["pair-1"]} in ({"h-0", "h-1"}, {"h-2", "h-3"})
    assert "early-0" not in bound
    assert "1 of at least 2 members are pending" in events["FailedScheduling/early-0"][0]["message"]
    # Islands: each 2-GPU pod inside one PCIe island of the L4 node.
    for i in range(2):
        assert bound[f"isl-{i}"] == "l4-0"
        gpus = final[f"isl-{i}"]["metadata"]["annotations"]["gpusched.io/gpu-indices"]
        assert gpus in ("0,1", "2,3"), gpus
    # MIG: three slices advertised, three pods bound there, the fourth told why.
    slices = [n for n in bound if n.startswith("slice-")]
    assert len(slices) == 3
    assert all(bound[n] == "a100-mig" for n in slices)
    (left,) = {f"slice-{i}" for i in range(4)} - set(slices)
    assert "Insufficient nvidia.com/mig-1g.10gb" in (kit.condition(final[left]) or {}).get("message", "")
    for pod_name, expected in ((left, "one MIG 1g.10gb slice"), ("early-0", "member of gang")):
        out = await asyncio.to_thread(
            subprocess.run,
            [
                *(sys.executable, "-m", "gpusched", "explain", f"{namespace}/{pod_name}"),
                *("--kubeconfig", str(control_plane.scheduler_kubeconfig), "--scheduler-name", name),
            ],
            capture_output=True,
            text=True,
            cwd=kit.repo_file(),
            timeout=60,
        )
        assert expected in out.stdout, out.stdout + out.stderr


def _volume(
    name: str, claim_ns: str, claim: str, *, pinned_to: str = "", mode: str = "ReadWriteOnce"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Gi"},
        "accessModes": [mode],
        "hostPath": {"path": f"/data/{name}"},
        "claimRef": {"namespace": claim_ns, "name": claim},
    }
    if pinned_to:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [pinned_to]}]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [term]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


async def _claim(kube: Kube, ns: str, name: str, volume: str = "", mode: str = "ReadWriteOnce") -> None:
    """A claim; with ``volume``, bound to it as the volume controller binds one (none runs here,
    so the test binds it): the volume's name, the bind-completed annotation, then the phase."""
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}
    meta: dict[str, Any] = {"name": name}
    if volume:
        spec["volumeName"] = volume
        meta["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    await kit.create_all(kube, f"/api/v1/namespaces/{ns}/persistentvolumeclaims", [{"metadata": meta, "spec": spec}])
    if volume:
        r = await kube.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}/status",
            body={"status": {"phase": "Bound"}},
            content_type=MERGE_PATCH,
        )
        assert r.ok, r.body


def _with_claim(p: dict[str, Any], claim: str) -> dict[str, Any]:
    p["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return p


async def test_pods_are_bound_only_when_their_claims_are_bound_to_usable_volumes(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("vol-gpu-0", 4, "T4"), kit.node("vol-gpu-1", 4, "T4")])
    tag = uuid.uuid4().hex[:6]
    shared, local, later, gone = f"pv-shared-{tag}", f"pv-local-{tag}", f"pv-later-{tag}", f"pv-gone-{tag}"
    await kit.create_all(
        kube,
        "/api/v1/persistentvolumes",
        [
            _volume(shared, namespace, "shared"),
            _volume(local, namespace, "pinned", pinned_to="vol-gpu-1"),
            _volume(gone, namespace, "elsewhere", pinned_to="vol-gpu-no-more"),
        ],
    )
    await _claim(kube, namespace, "shared", shared)
    await _claim(kube, namespace, "pinned", local)
    await _claim(kube, namespace, "elsewhere", gone)
    await _claim(kube, namespace, "unbound")
    pods = [
        _with_claim(kit.pod("ok", name, gpus=1), "shared"),
        _with_claim(kit.pod("waits-for-its-claim", name, gpus=1), "unbound"),
        _with_claim(kit.pod("local-volume", name, gpus=1), "pinned"),
        _with_claim(kit.pod("volume-on-a-node-gone", name, gpus=1), "elsewhere"),
        _with_claim(kit.pod("claim-comes-later", name, gpus=1), "later"),
    ]
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", pods)
        final = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, 5, timeout=90)}
        assert final["ok"]["spec"].get("nodeName") in {"vol-gpu-0", "vol-gpu-1"}
        assert final["local-volume"]["spec"].get("nodeName") == "vol-gpu-1"  # the node its volume is on
        placed = ("ok", "local-volume")
        messages = {n: (kit.condition(p) or {}).get("message", "") for n, p in final.items() if n not in placed}
        assert messages["waits-for-its-claim"] == (  # of no storage class: the volume controller binds it
            'pod has unbound immediate PersistentVolumeClaims ("unbound"); the pod is retried once the claim is bound'
        )
        assert "node(s) had volume node affinity conflict" in messages["volume-on-a-node-gone"]
        assert messages["claim-comes-later"] == 'persistentvolumeclaim "later" not found'
        events = await kit.wait_events(kube, namespace, [f"FailedScheduling/{n}" for n in messages])
        for pod_name, message in messages.items():
            assert [e["message"] for e in events[f"FailedScheduling/{pod_name}"]] == [message]
        assert all(not p["spec"].get("nodeName") for n, p in final.items() if n not in placed)
        told = await kit.explain(control_plane, f"{namespace}/volume-on-a-node-gone", name)
        assert told.returncode == 1, told.stderr
        assert "node(s) had volume node affinity conflict" in told.stdout
        # The missing claim is created and bound: the parked pod is retried and bound.
        await kit.create_all(kube, "/api/v1/persistentvolumes", [_volume(later, namespace, "later")])
        await _claim(kube, namespace, "later", later)
        bound = daemon.wait_log(
            "bind", timeout=kit.RETRIED_WITHIN, where=lambda x: x["pod"] == f"{namespace}/claim-comes-later"
        )
        assert bound["result"] == "bound"
    finally:
        daemon.stop()
        for pv in (shared, local, later, gone):
            await kube.request("DELETE", f"/api/v1/persistentvolumes/{pv}")


async def test_a_read_write_once_pod_claim_is_one_pods_at_a_time(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("rwop-gpu-0", 4, "T4")])
    solo = f"pv-solo-{uuid.uuid4().hex[:6]}"
    await kit.create_all(kube, "/api/v1/persistentvolumes", [_volume(solo, namespace, "solo", mode="ReadWriteOncePod")])
    await _claim(kube, namespace, "solo", solo, mode="ReadWriteOncePod")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # Another scheduler's pod uses the claim already.
    await kit.create_all(kube, pods, [_with_claim(kit.pod("holder", "other", gpus=1, node_name="rwop-gpu-0"), "solo")])
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods, [_with_claim(kit.pod(n, name, gpus=1), "solo") for n in ("first", "second")])
        final = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, 3, timeout=90)}
        held = (
            'persistentvolumeclaim "solo" has access mode ReadWriteOncePod and pod {} uses it (node(s) unavailable '
            "due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod); the pod "
            "is retried when that pod is gone"
        )
        for n in ("first", "second"):
            assert not final[n]["spec"].get("nodeName")
            assert (kit.condition(final[n]) or {}).get("message") == held.format(f"{namespace}/holder")
        events = await kit.wait_events(kube, namespace, ["FailedScheduling/first"])
        assert [e["message"] for e in events["FailedScheduling/first"]] == [held.format(f"{namespace}/holder")]
        told = await kit.explain(control_plane, f"{namespace}/first", name)
        assert told.returncode == 1, told.stderr
        assert f"pod {namespace}/first cannot be bound: {held.format(f'{namespace}/holder')}" in told.stdout
        # The holder goes: one of the two waiting pods takes the claim, the other waits for it.
        gone = await kube.request("DELETE", f"{pods}/holder", query={"gracePeriodSeconds": 0})
        assert gone.ok, gone.body
        bound = daemon.wait_log(
            "bind", timeout=kit.RETRIED_WITHIN, where=lambda x: x["pod"].endswith(("/first", "/second"))
        )
        assert bound["result"] == "bound"
        winner = bound["pod"].split("/")[1]
        loser = "second" if winner == "first" else "first"
        deadline = time.monotonic() + 30
        while True:
            now = {p["metadata"]["name"]: p for p in await kit.list_all(kube, pods)}
            message = (kit.condition(now[loser]) or {}).get("message")
            if message == held.format(f"{namespace}/{winner}") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert message == held.format(f"{namespace}/{winner}")
        assert now[winner]["spec"].get("nodeName") == "rwop-gpu-0"
        assert not now[loser]["spec"].get("nodeName")
    finally:
        daemon.stop()
        await kube.request("DELETE", f"/api/v1/persistentvolumes/{solo}")


async def test_node_selectors_and_required_node_affinity_choose_the_nodes(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    nodes = [
        kit.node("sel-infer-0", 4, "T4", pool="infer", **{"kubernetes.io/os": "linux"}),
        kit.node("sel-train-0", 4, "T4", pool="train", **{"kubernetes.io/os": "linux"}),
        kit.node("sel-train-1", 4, "T4", pool="train", **{"kubernetes.io/os": "linux"}),
    ]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    by_selector = kit.pod("by-selector", name, gpus=2)
    by_selector["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux", "pool": "train"}
    by_affinity = kit.pod("by-affinity", name, gpus=1)
    term = {
        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["sel-train-0"]}],
    }
    by_affinity["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    nowhere = kit.pod("nowhere", name, gpus=1)
    nowhere["spec"]["nodeSelector"] = {"pool": "gpu-b200"}
    final = await kit.schedule(control_plane, kube, namespace, name, [by_selector, by_affinity, nowhere])
    assert final["by-selector"]["spec"].get("nodeName") in {"sel-train-0", "sel-train-1"}
    assert final["by-affinity"]["spec"].get("nodeName") == "sel-train-1"
    assert not final["nowhere"]["spec"].get("nodeName")
    message = (kit.condition(final["nowhere"]) or {}).get("message")
    assert message == "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


async def test_ephemeral_storage_requests_are_counted_against_the_nodes(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    disk = kit.node("disk-gpu-0", 4, "T4")
    for part in ("capacity", "allocatable"):
        disk["status"][part]["ephemeral-storage"] = "100Gi"
    await kit.create_all(kube, "/api/v1/nodes", [disk])
    pods = []
    for i in range(2):
        p = kit.pod(f"scratch-{i}", name, gpus=1)
        p["spec"]["containers"][0]["resources"]["requests"] = {"ephemeral-storage": "60Gi"}
        pods.append(p)
    final = await kit.schedule(control_plane, kube, namespace, name, pods)
    bound = [p for p in final.values() if p["spec"].get("nodeName")]
    waiting = [p for p in final.values() if not p["spec"].get("nodeName")]
    assert [p["spec"]["nodeName"] for p in bound] == ["disk-gpu-0"]
    assert len(waiting) == 1
    message = (kit.condition(waiting[0]) or {}).get("message")
    assert message == "0/1 nodes are available: 1 Insufficient ephemeral-storage."


async def test_a_gang_waiting_for_one_members_claim_says_so_on_every_member(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("gang-vol-0", 8, "H800")])
    needs_claim = _with_claim(_member("a", name, "g1", 2, gpus=4), "checkpoints")
    plain = _member("b", name, "g1", 2, gpus=4)
    expected = (
        f'gang {namespace}/g1: member {namespace}/a: persistentvolumeclaim "checkpoints" not found; '
        "no member is placed until all of them can be, together."
    )
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [needs_claim, plain])
        await kit.wait_settled(kube, namespace, 2, timeout=90)
        # The members may come in two batches; the one that sees both writes the gang's reason.
        deadline = time.monotonic() + 60
        while True:
            final = {p["metadata"]["name"]: p for p in await kit.list_all(kube, f"/api/v1/namespaces/{namespace}/pods")}
            if (kit.condition(final["b"]) or {}).get("message") == expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        daemon.stop()
    assert not any(p["spec"].get("nodeName") for p in final.values())
    assert (kit.condition(final["a"]) or {}).get("message") == 'persistentvolumeclaim "checkpoints" not found'
    assert (kit.condition(final["b"]) or {}).get("message") == expected


async def test_host_ports_bound_on_a_node_keep_pods_that_need_them_off_it(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"port-gpu-{i}", 8, "H800") for i in range(2)])

    def with_port(p: dict[str, Any]) -> dict[str, Any]:
        p["spec"]["containers"][0]["ports"] = [{"containerPort": 29500, "hostPort": 29500}]
        return p

    # Another scheduler's pod already binds the port on port-gpu-0.
    held = with_port(kit.pod("elsewhere", "other-scheduler", gpus=1, node_name="port-gpu-0"))
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [held])
    workers = [with_port(kit.pod(f"worker-{i}", name, gpus=2)) for i in range(2)]
    final = await kit.schedule(control_plane, kube, namespace, name, workers, count=3)
    placed = [final[f"worker-{i}"]["spec"].get("nodeName") for i in range(2)]
    assert sorted(placed, key=str) == [None, "port-gpu-1"]  # str(None) sorts first
    waiting = next(final[f"worker-{i}"] for i in range(2) if not placed[i])
    assert (kit.condition(waiting) or {}).get("message") == (
        "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports."
    )


async def test_required_pod_anti_affinity_spreads_replicas_and_honours_running_pods(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"aa-gpu-{i}", 8, "H800") for i in range(3)])

    def labelled(p: dict[str, Any], app: str, keep_from: str = "") -> dict[str, Any]:
        p["metadata"]["labels"] = {"app": app}
        if keep_from:
            term = {"labelSelector": {"matchLabels": {"app": keep_from}}, "topologyKey": "kubernetes.io/hostname"}
            p["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        return p

    # Another scheduler's pod on aa-gpu-0 keeps web pods off its node.
    guard = labelled(kit.pod("guard", "other-scheduler", gpus=1, node_name="aa-gpu-0"), "guard", keep_from="web")
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [guard])
    replicas = [labelled(kit.pod(f"llm-{i}", name, gpus=1), "llm", keep_from="llm") for i in range(4)]
    web = labelled(kit.pod("web", name, gpus=1), "web")
    final = await kit.schedule(control_plane, kube, namespace, name, [*replicas, web], count=6)
    placed = [final[f"llm-{i}"]["spec"].get("nodeName") for i in range(4)]
    assert sorted(filter(None, placed)) == ["aa-gpu-0", "aa-gpu-1", "aa-gpu-2"]  # one replica per node
    assert final["web"]["spec"].get("nodeName") in {"aa-gpu-1", "aa-gpu-2"}
    waiting = next(final[f"llm-{i}"] for i in range(4) if not placed[i])
    assert (kit.condition(waiting) or {}).get("message") == (
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    )


async def test_hard_topology_spread_keeps_zones_even_and_says_when_a_label_is_missing(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    nodes = [kit.node(f"sp-gpu-{z}", 8, "H800", **{"topology.kubernetes.io/zone": z}) for z in ("z0", "z1", "z2")]
    nodes.append(kit.node("sp-gpu-nozone", 8, "H800"))
    await kit.create_all(kube, "/api/v1/nodes", nodes)

    def spread(p: dict[str, Any], key: str) -> dict[str, Any]:
        p["metadata"]["labels"] = {"app": "llm"}
        p["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "llm"}},
            }
        ]
        return p

    replicas = [spread(kit.pod(f"llm-{i}", name, gpus=1), "topology.kubernetes.io/zone") for i in range(6)]
    racked = spread(kit.pod("racked", name, gpus=1), "rack")  # no node has a rack label
    final = await kit.schedule(control_plane, kube, namespace, name, [*replicas, racked])
    zones = Counter(final[f"llm-{i}"]["spec"].get("nodeName") for i in range(6))
    assert zones == {"sp-gpu-z0": 2, "sp-gpu-z1": 2, "sp-gpu-z2": 2}  # packing alone would fill one node
    assert not final["racked"]["spec"].get("nodeName")
    assert (kit.condition(final["racked"]) or {}).get("message") == (
        "0/4 nodes are available: 4 node(s) didn't match pod topology spread constraints (missing required label)."
    )


async def test_required_pod_affinity_follows_running_pods_and_waits_for_a_missing_one(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    zone = "topology.kubernetes.io/zone"
    nodes = [kit.node(f"af-gpu-{z}-{i}", 8, "H800", **{zone: z}) for z in ("z0", "z1") for i in range(2)]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    pods_path = f"/api/v1/namespaces/{namespace}/pods"

    def labelled(p: dict[str, Any], app: str, near: str = "") -> dict[str, Any]:
        p["metadata"]["labels"] = {"app": app}
        if near:
            term = {"labelSelector": {"matchLabels": {"app": near}}, "topologyKey": zone}
            p["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        return p

    # A cache another scheduler runs in z1; web pods follow it, a batch job waits for its queue.
    await kit.create_all(
        kube, pods_path, [labelled(kit.pod("cache", "other", gpus=1, node_name="af-gpu-z1-0"), "cache")]
    )
    web = [labelled(kit.pod(f"web-{i}", name, gpus=1), "web", near="cache") for i in range(3)]
    job = labelled(kit.pod("job", name, gpus=1), "job", near="queue")
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods_path, [*web, job])
        settled = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, 5, timeout=90)}
        assert {settled[f"web-{i}"]["spec"].get("nodeName") for i in range(3)} <= {"af-gpu-z1-0", "af-gpu-z1-1"}
        assert (kit.condition(settled["job"]) or {}).get("message") == (
            "0/4 nodes are available: 4 node(s) didn't match pod affinity rules."
        )
        # The queue it follows is bound in z0 (by another scheduler): the job is retried and joins it.
        await kit.create_all(
            kube, pods_path, [labelled(kit.pod("queue", "other", cpu="1", node_name="af-gpu-z0-1"), "queue")]
        )
        got = await kit.wait_bound(kube, f"{pods_path}/job", timeout=kit.RETRIED_WITHIN)
    finally:
        daemon.stop()
    assert got["spec"].get("nodeName") in {"af-gpu-z0-0", "af-gpu-z0-1"}, "not retried when the pod it follows ran"


async def test_preferred_node_affinity_picks_the_preferred_node_when_it_has_room(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    nodes = [kit.node("pref-reserved", 8, "H800", pool="reserved"), kit.node("pref-spot", 2, "H800", pool="spot")]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    term = {"weight": 50, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spot"]}]}}
    pods = []
    for i in range(3):
        p = kit.pod(f"job-{i}", name, gpus=1)
        p["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
        pods.append(p)
    final = await kit.schedule(control_plane, kube, namespace, name, pods)
    where = sorted(final[f"job-{i}"]["spec"].get("nodeName") for i in range(3))
    assert where == ["pref-reserved", "pref-spot", "pref-spot"]  # the spot node's two GPUs, then elsewhere


async def test_replicas_that_prefer_to_be_apart_are_spread_rather_than_packed(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"soft-gpu-{i}", 8, "H800") for i in range(3)])
    term = {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": "kubernetes.io/hostname"}
    preferred = [{"weight": 100, "podAffinityTerm": term}]
    replicas = []
    for i in range(3):
        p = kit.pod(f"llm-{i}", name, gpus=1)
        p["metadata"]["labels"] = {"app": "llm"}
        p["spec"]["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
        replicas.append(p)
    final = await kit.schedule(control_plane, kube, namespace, name, replicas)
    assert {final[f"llm-{i}"]["spec"].get("nodeName") for i in range(3)} == {"soft-gpu-0", "soft-gpu-1", "soft-gpu-2"}


async def test_soft_spread_and_preferred_pod_affinity_are_weighed(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    zones = ("z0", "z1", "z2")
    nodes = [kit.node(f"wish-gpu-{z}", 8, "H800", **{"topology.kubernetes.io/zone": z}) for z in zones]
    await kit.create_all(kube, "/api/v1/nodes", nodes)
    cache = kit.pod("cache", "another-scheduler", gpus=1)
    cache["metadata"]["labels"] = {"app": "cache"}
    cache["spec"]["nodeName"] = "wish-gpu-z2"  # bound by someone else
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [cache])
    soft = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app": "llm"}},
    }
    replicas = []
    for i in range(6):
        p = kit.pod(f"llm-{i}", name, gpus=1)
        p["metadata"]["labels"] = {"app": "llm"}
        p["spec"]["topologySpreadConstraints"] = [soft]
        replicas.append(p)
    near = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone"}
    reader = kit.pod("reader", name, gpus=1)
    reader["spec"]["affinity"] = {
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": near}]}
    }
    final = await kit.schedule(control_plane, kube, namespace, name, [*replicas, reader], count=8)
    spread = Counter(final[f"llm-{i}"]["spec"].get("nodeName") for i in range(6))
    assert spread == {f"wish-gpu-{z}": 2 for z in zones}  # packing alone would fill one node
    assert final["reader"]["spec"].get("nodeName") == "wish-gpu-z2"  # beside the cache


async def test_a_running_pods_preferred_anti_affinity_steers_new_pods_it_selects(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    # The database, bound by another scheduler, prefers batch pods on other nodes.  Half of a GPU
    # beside it is free, which a half-GPU batch pod would fill (packing's choice).  The batch pod
    # has no terms of its own; as kube-scheduler does, gpusched weighs the database's wish.
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"theirs-{i}", 8, "H800") for i in range(2)])
    db = kit.pod("db", "another-scheduler", gpus=4, node_name="theirs-0")
    db["metadata"]["labels"] = {"app": "db"}
    away = {"labelSelector": {"matchLabels": {"app": "batch"}}, "topologyKey": "kubernetes.io/hostname"}
    db["spec"]["affinity"] = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": away}]
        }
    }
    half = kit.pod("half", "another-scheduler", milli=500, node_name="theirs-0")
    half["metadata"]["annotations"]["gpusched.io/gpu-indices"] = "4"
    await kit.create_all(kube, f"/api/v1/namespaces/{namespace}/pods", [db, half])
    job = kit.pod("job", name, milli=500)
    job["metadata"]["labels"] = {"app": "batch"}
    final = await kit.schedule(control_plane, kube, namespace, name, [job, kit.pod("whole", name, gpus=1)], count=4)
    assert final["job"]["spec"].get("nodeName") == "theirs-1"


async def test_pod_affinity_picks_namespaces_by_label_and_follows_their_changes(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    name = sched_name()
    host = "kubernetes.io/hostname"
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"nsel-gpu-{i}", 8, "H800") for i in range(2)])
    mark = uuid.uuid4().hex[:8]
    other = f"o-{mark}"
    control_plane.kubectl("create", "namespace", other)
    ns_path = f"/api/v1/namespaces/{other}"
    r = await kube.request("PATCH", ns_path, body={"metadata": {"labels": {"team": mark}}}, content_type=MERGE_PATCH)
    assert r.ok, r.body

    def term(app: str, selector: dict[str, str]) -> dict[str, Any]:
        return {
            "labelSelector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": selector},
            "topologyKey": host,
        }

    # In the other namespace (labelled team=<mark>), another scheduler's db pod fills half of
    # nsel-gpu-0 and a cache pod runs on nsel-gpu-1.
    db = kit.pod("db", "other-scheduler", gpus=4, node_name="nsel-gpu-0")
    db["metadata"]["labels"] = {"app": "db"}
    cache = kit.pod("cache", "other-scheduler", cpu="1", node_name="nsel-gpu-1")
    cache["metadata"]["labels"] = {"app": "cache"}
    await kit.create_all(kube, f"{ns_path}/pods", [db, cache])
    # "away" keeps off db's node although packing would pick it; "near" follows cache pods in
    # namespaces labelled tier=<mark>, which none is yet.
    away = kit.pod("away", name, gpus=1)
    away["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("db", {"team": mark})]}
    }
    near = kit.pod("near", name, gpus=1)
    near["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("cache", {"tier": mark})]}
    }
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await kit.create_all(kube, pods_path, [away, near])
        settled = {p["metadata"]["name"]: p for p in await kit.wait_settled(kube, namespace, 2, timeout=90)}
        assert settled["away"]["spec"].get("nodeName") == "nsel-gpu-1"
        assert (kit.condition(settled["near"]) or {}).get("message") == (
            "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."
        )
        # Labelling the namespace brings its cache pod into the term's reach: "near" joins it.
        reread_event = "namespace labels changed; pods read again"
        before = len(daemon.events(reread_event))  # (one at the start if pods came before the namespaces)
        r = await kube.request(
            "PATCH", ns_path, body={"metadata": {"labels": {"tier": mark}}}, content_type=MERGE_PATCH
        )
        assert r.ok, r.body
        got = await kit.wait_bound(kube, f"{pods_path}/near")
        # Only the pod whose selector now picks differently was read again: "away"'s team=<mark>
        # still picks the namespace.
        reread = daemon.wait_count(reread_event, before + 1)[before]
    finally:
        daemon.stop()
    assert got["spec"].get("nodeName") == "nsel-gpu-1"
    assert (reread["bound"], reread["pending"]) == (0, 1)


async def test_headroom_keeps_idle_gpus_for_pods_of_high_priority_which_start_without_evicting(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    name = sched_name()
    low, high = await _priority_classes(kube, name, low=(10, ""), high=(1000, ""))
    config = tmp_path / "headroom.yaml"
    config.write_text("headroom:\n  gpus: 2\n  priorityAtLeast: 1000\n")
    await kit.create_all(kube, "/api/v1/nodes", [kit.node("hr-0", 4, "T4")])
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect", "--config", str(config))
    try:
        await kit.create_all(kube, pods, [_of_class(kit.pod(f"batch-{i}", name, gpus=1), low) for i in range(3)])
        settled = await kit.wait_settled(kube, namespace, 3)
        waiting = [p for p in settled if not p["spec"].get("nodeName")]
        assert len(waiting) == 1, [p["spec"].get("nodeName") for p in settled]
        message = (kit.condition(waiting[0]) or {}).get("message", "")
        assert message == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu; "
            "2 idle GPUs are kept free for pods of priority 1000 or more (headroom)."
        )
        assert await _metric_once(daemon.metrics_port, "gpusched_gpus_kept_free", 2) == 2
        # The pod the headroom is for starts at once, on the kept GPUs, and nobody is evicted.
        await kit.create_all(kube, pods, [_of_class(kit.pod("critical", name, gpus=2), high)])
        critical = await kit.wait_bound(kube, f"{pods}/critical")
        assert critical["spec"].get("nodeName") == "hr-0"
        everyone = await kit.list_all(kube, pods)
        assert all(not p["metadata"].get("deletionTimestamp") for p in everyone)
        kit.check_placements(await kit.list_all(kube, "/api/v1/nodes"), everyone)
        assert await _metric_once(daemon.metrics_port, "gpusched_gpus_kept_free", 0) == 0
    finally:
        daemon.stop()
        await _drop_priority_classes(kube, low, high)


async def test_sigterm_in_the_middle_of_a_stream_ends_the_daemon_at_once_and_loses_no_pod(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    """Stopped three times while pods stream in, batches are solved and Bindings are in flight
    (the moment a lost cancellation once kept the process running), the daemon exits 0 within
    seconds each time; the next instance binds what is left, and no pod is bound twice."""
    name = sched_name()
    await kit.create_all(kube, "/api/v1/nodes", [kit.node(f"term-{i}", 8, "A100-SXM4-80GB") for i in range(30)])
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    total = 0
    for round_ in range(3):
        daemon = kit.Daemon.start(control_plane, name, "--no-leader-elect")
        batch = [kit.pod(f"r{round_}-{i}", name, gpus=1, cpu="1") for i in range(60)]
        total += len(batch)
        creating = asyncio.create_task(kit.create_all(kube, pods_path, batch, parallel=4))
        await asyncio.to_thread(daemon.wait_count, "bind", 10 * (round_ + 1), 60.0)  # in the middle of the stream
        started = time.monotonic()
        code = await asyncio.to_thread(daemon.stop, 20.0)
        took = time.monotonic() - started
        assert code == 0, "".join(daemon.raw[-30:])
        assert took < 15.0, f"stopped in {took:.1f} s"
        await creating
    last = kit.Daemon.start(control_plane, name, "--no-leader-elect")
    try:
        await asyncio.to_thread(last.wait_log, "caches synced")  # (what the stopped ones left, it binds)
        final = await kit.wait_settled(kube, namespace, total, timeout=120)
        events = await kit.wait_events(kube, namespace, [f"Scheduled/{p['metadata']['name']}" for p in final])
    finally:
        assert last.stop() == 0, "".join(last.raw[-30:])
    assert all(p["spec"].get("nodeName") for p in final), "a pod was left pending"
    twice = [k for k, v in events.items() if k.startswith("Scheduled/") and len(v) != 1]
    assert not twice, twice  # each pod bound once, told once
