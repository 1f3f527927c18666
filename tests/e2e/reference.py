"""The real kube-scheduler as the reference for gpusched's filters, pod by node.

kube-scheduler (the binary of the control plane's assets, with one profile, ``REFERENCE``) runs
against the test API server.  For a pod and every node, a copy of the pod pinned to that node
(``pinned``: a ``matchFields metadata.name In [node]`` requirement added to each of its node
selector terms, or one term of it alone) is created; kube-scheduler binds it (the node is
feasible) or marks it ``PodScheduled=False`` (it is not).  gpusched's verdict for the very same
copy comes from the books the daemon keeps (the nodes and the bound pods as ``kube.convert``
reads them, with the namespaces' labels, frozen into a snapshot) and ``ClusterState.pod_mask``,
the nodes its batches may use; its words are ``explain``'s, which the pod's ``FailedScheduling``
Event carries.  A pod the converter refuses (``PodRecord.error``) fits nowhere.

Copies that cannot see each other (their pod's filters look at no other pod) are created
together (``kube_verdicts``); copies of a pod that other pods' placement concerns are created one
at a time, each deleted before the next (``kube_verdict_alone``), so that no copy weighs a
sibling bound before it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from gpusched.daemon.settings import BOUND_SELECTOR
from gpusched.kube.client import Kube
from gpusched.kube.convert import ConvertError, namespace_labels, node_record, pod_record
from gpusched.model import ClusterState
from gpusched.model.affinity import NodeSelector
from gpusched.solver.explain import explain
from gpusched.state.cache import Cache
from tests.controlplane import ControlPlane

REFERENCE = "kube-reference"
"""The schedulerName of kube-scheduler's only profile here."""
PAUSE = "registry.k8s.io/pause:3.10"


# --------------------------------------------------------------------------- kube-scheduler


@dataclass
class KubeScheduler:
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=insecure) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def kube_scheduler_running(control_plane: ControlPlane, workdir: Path) -> Iterator[KubeScheduler]:
    """kube-scheduler with one profile, ``REFERENCE``, the control plane's admin identity, no
    leader election; ready once its /readyz says so, stopped on leaving."""
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(control_plane.admin_kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": REFERENCE}],
    }
    path = workdir / "kube-scheduler.yaml"
    path.write_text(json.dumps(cfg))
    port = _free_port()
    log = workdir / "kube-scheduler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(control_plane.assets / "kube-scheduler"),
                f"--config={path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sched = KubeScheduler(proc, log)
    try:
        deadline = time.monotonic() + 60
        while not _ready(f"https://127.0.0.1:{port}/readyz"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"kube-scheduler not ready (exit {proc.poll()}); its log:\n{sched.tail()}")
            time.sleep(0.1)
        yield sched
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --------------------------------------------------------------------------- objects


def make_node(
    name: str,
    *,
    cpu: str = "8",
    memory: str = "16Gi",
    pods: str | None = "110",
    storage: str | None = "20Gi",
    gpus: int = 0,
    product: str = "NVIDIA-A100-SXM4-80GB",
    labels: dict[str, str] | None = None,
    taints: Sequence[tuple[str, str, str]] = (),
    unschedulable: bool = False,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory}
    if pods is not None:
        alloc["pods"] = pods
    if storage is not None:
        alloc["ephemeral-storage"] = storage
    lab = {"kubernetes.io/hostname": name, **(labels or {})}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
        lab |= {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus)}
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [{"key": k, "value": v, "effect": e} if v else {"key": k, "effect": e} for k, v, e in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab},
        "spec": spec,
        "status": {"capacity": dict(alloc), "allocatable": dict(alloc)},
    }


def container(
    name: str,
    requests: dict[str, str] | None = None,
    ports: Sequence[dict[str, Any]] = (),
    sidecar: bool = False,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": PAUSE}
    reqs = dict(requests or {})
    gpus = reqs.pop("nvidia.com/gpu", None)
    res: dict[str, Any] = {}
    if reqs:
        res["requests"] = reqs
    if gpus is not None:  # extended resources are given as limits (requests follow them)
        res["limits"] = {"nvidia.com/gpu": gpus}
    if res:
        c["resources"] = res
    if ports:
        c["ports"] = [dict(p) for p in ports]
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def make_pod(
    name: str, spec: dict[str, Any], labels: dict[str, str] | None = None, namespace: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace is not None:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"terminationGracePeriodSeconds": 0, **spec},
    }


def pinned(pod: dict[str, Any], node: str, name: str) -> dict[str, Any]:
    """A copy of ``pod`` that only ``node`` can take: ``metadata.name In [node]`` added to every
    node selector term that has a requirement (terms are ORed, a term's requirements ANDed; an
    empty term matches no node, and stays so), or, without terms, a term of it alone."""
    out = copy.deepcopy(pod)
    out["metadata"]["name"] = name
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    node_affinity = out["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required and required.get("nodeSelectorTerms"):
        for term in required["nodeSelectorTerms"]:
            if term.get("matchExpressions") or term.get("matchFields"):
                term.setdefault("matchFields", []).append(pin)
    else:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchFields": [pin]}]
        }
    return out


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    fits: bool
    message: str


@dataclass
class Outcome:
    pairs: int = 0
    disagreements: dict[tuple[str, str], str] = field(default_factory=dict)
    """(case, node) -> what each said."""
    verdicts: dict[tuple[str, str], tuple[Verdict, Verdict]] = field(default_factory=dict)
    """(case, node) -> (kube-scheduler's, gpusched's)."""
    specs: dict[str, Any] = field(default_factory=dict)
    """The pod of each case, as written (before its copies were pinned), and what the case
    needs to be read (the pods already bound)."""

    def record(self, label: str, node: str, theirs: Verdict, ours: Verdict) -> None:
        """One (pod, node) pair's verdicts: a disagreement when they differ."""
        self.pairs += 1
        self.verdicts[label, node] = (theirs, ours)
        if theirs.fits != ours.fits:
            self.disagreements[label, node] = (
                f"{label} on {node}: kube-scheduler {'binds' if theirs.fits else 'refuses'} ({theirs.message}); "
                f"gpusched {'fits' if ours.fits else 'refuses'} ({ours.message})"
            )


def condition(p: dict[str, Any]) -> dict[str, Any] | None:
    for c in (p.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None


async def create(kube: Kube, path: str, objs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    async def one(o: dict[str, Any]) -> dict[str, Any]:
        r = await kube.request("POST", path, body=o)
        assert r.status == 201, (o["metadata"]["name"], r.status, r.body.get("message"))
        body: dict[str, Any] = r.body
        return body

    return list(await asyncio.gather(*(one(o) for o in objs)))


async def read_namespaces(kube: Kube) -> dict[str, dict[str, str]]:
    """Every namespace's labels, as the daemon's namespace watch keeps them."""
    items, _ = await kube.list("/api/v1/namespaces")
    return dict(namespace_labels(o) for o in items)


async def books(kube: Kube, namespaces: Mapping[str, Mapping[str, str]] | None = None) -> Cache:
    """The nodes and bound pods, read into the daemon's books as ``gpusched explain`` reads them
    (``namespaces``: the namespaces' labels, which resolve ``namespaceSelector``s)."""
    cache = Cache()
    nodes, _ = await kube.list("/api/v1/nodes")
    records = []
    for obj in nodes:
        try:
            records.append(node_record(obj))
        except ConvertError as exc:
            raise AssertionError(f"gpusched refuses a test node: {exc}") from exc
    cache.replace_nodes(records)
    bound, _ = await kube.list("/api/v1/pods", {"fieldSelector": BOUND_SELECTOR})
    cache.replace_pods(pod_record(o, namespaces) for o in bound)
    return cache


def our_verdict(
    state: ClusterState,
    obj: Mapping[str, Any],
    node: str,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    volumes: NodeSelector = (),
    provisioned: NodeSelector = (),
) -> tuple[Verdict, str]:
    """gpusched's verdict on the pod ``obj`` (as created) for ``node``, and, when ``pod_mask`` and
    ``explain`` do not agree with each other, what each said.  ``volumes``: the nodes the
    volumes of its claims may be used on (``Claims.selector``), and ``provisioned``: those its
    claims still to be provisioned may be provisioned for (``Claims.provision_selector``), as
    the daemon gives it them."""
    rec = pod_record(obj, namespaces)
    if rec.error:
        return Verdict(False, f"refused: {rec.error}"), ""
    if volumes or provisioned:
        rec = replace(rec, pod=replace(rec.pod, volume_selector=volumes, provision_selector=provisioned))
    fits = bool(state.pod_mask(rec.pod)[state.cluster.index[node]])
    e = explain(rec.pod, state)
    torn = "" if bool(e.fits) == fits else f"gpusched's pod_mask says {fits}, explain {e.message}"
    return Verdict(fits, "fits" if fits else e.message), torn


async def compare(
    kube: Kube,
    ns: str,
    sched: KubeScheduler,
    nodes: Sequence[dict[str, Any]],
    residents: Sequence[dict[str, Any]],
    cases: Sequence[tuple[str, dict[str, Any]]],
    leaving: Sequence[str] = (),
) -> Outcome:
    """Create ``nodes`` and ``residents`` (and delete ``leaving`` of them, which has a grace
    period and no kubelet to end it: it stays, terminating), then each case's pinned copies,
    all together (the cases' filters must look at no other pod); each pair's verdicts."""
    await create(kube, "/api/v1/nodes", nodes)
    await create(kube, f"/api/v1/namespaces/{ns}/pods", residents)
    for name in leaving:
        r = await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
        assert r.ok, r.body
    state = (await books(kube)).snapshot().state
    await sees_nodes(kube, ns, len(state.cluster), sched)
    out = Outcome()
    names = [n["metadata"]["name"] for n in nodes]
    for label, spec in cases:
        out.specs[label] = spec
        copies = [
            pinned(make_pod("", {**spec, "schedulerName": REFERENCE}, {"case": label}), node, f"{label}-{i}")
            for i, node in enumerate(names)
        ]
        created = await create(kube, f"/api/v1/namespaces/{ns}/pods", copies)
        ours: dict[str, Verdict] = {}
        for node, obj in zip(names, created, strict=True):
            ours[node], torn = our_verdict(state, obj, node)
            if torn:
                out.disagreements[label, node] = f"{label} on {node}: {torn}"
        theirs = await kube_verdicts(kube, ns, label, names, sched)
        for node in names:
            out.record(label, node, theirs[node], ours[node])
        r = await kube.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"case={label}", "gracePeriodSeconds": 0}
        )
        assert r.ok, r.body
    return out


async def sees_nodes(kube: Kube, ns: str, count: int, sched: KubeScheduler, timeout: float = 30.0) -> None:
    """Until kube-scheduler weighs all ``count`` nodes (it watches nodes and pods apart, so a pod
    may reach it before the nodes just created): a pod no node takes is told "0/N nodes"."""
    deadline = time.monotonic() + timeout
    for attempt in itertools.count():
        probe = make_pod(f"probe-{attempt}", {"schedulerName": REFERENCE, "containers": [container("m")]})
        probe["spec"]["nodeSelector"] = {"no-such-label": "x"}
        await create(kube, f"/api/v1/namespaces/{ns}/pods", [probe])
        said = ""
        while not said and time.monotonic() < deadline:
            got = await kube.get(f"/api/v1/namespaces/{ns}/pods/probe-{attempt}")
            said = str((condition(got) or {}).get("message") or "")
            await asyncio.sleep(0.05)
        r = await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/probe-{attempt}", {"gracePeriodSeconds": 0})
        assert r.ok, r.body
        if re.match(rf"0/{count} nodes are available", said):
            return
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"kube-scheduler does not weigh the {count} nodes in {timeout:.0f}s; its log:\n{sched.tail()}")


def settled(p: Mapping[str, Any], node: str) -> Verdict | None:
    """kube-scheduler's verdict on a copy pinned to ``node``: bound, or marked unschedulable
    (None: not yet either)."""
    bound = p["spec"].get("nodeName")
    if bound:
        assert bound == node, f"{p['metadata']['name']} pinned to {node} bound to {bound}"
        return Verdict(True, f"bound to {bound}")
    if (c := condition(dict(p))) is not None and c.get("status") == "False":
        return Verdict(False, str(c.get("message") or c.get("reason")))
    return None


async def kube_verdicts(
    kube: Kube, ns: str, label: str, names: Sequence[str], sched: KubeScheduler, timeout: float = 30.0
) -> dict[str, Verdict]:
    """kube-scheduler's verdicts on the copies of ``label`` (labelled ``case=label``, the copy
    for ``names[i]`` named ``label-i``), created together."""
    deadline = time.monotonic() + timeout
    while True:
        pods, _ = await kube.list(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"case={label}"})
        got: dict[str, Verdict] = {}
        for p in pods:
            node = names[int(p["metadata"]["name"].rsplit("-", 1)[1])]
            if (v := settled(p, node)) is not None:
                got[node] = v
        if len(got) == len(names):
            return got
        if time.monotonic() > deadline or sched.proc.poll() is not None:
            raise AssertionError(
                f"kube-scheduler settled {len(got)}/{len(names)} copies of {label} in {timeout:.0f}s; "
                f"its log:\n{sched.tail()}"
            )
        await asyncio.sleep(0.05)


async def kube_verdict_alone(
    kube: Kube, obj: dict[str, Any], node: str, sched: KubeScheduler, timeout: float = 30.0
) -> tuple[dict[str, Any], Verdict]:
    """Create the copy ``obj`` pinned to ``node`` (its namespace in its metadata), wait for
    kube-scheduler's verdict and delete it again: the object as created, and the verdict.
    kube-scheduler's one watch on pods shows it the deletion before any pod created after."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    (created,) = await create(kube, f"/api/v1/namespaces/{ns}/pods", [obj])
    deadline = time.monotonic() + timeout
    try:
        while True:
            got = await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            if (v := settled(got, node)) is not None:
                return created, v
            if time.monotonic() > deadline or sched.proc.poll() is not None:
                raise AssertionError(
                    f"kube-scheduler did not settle {ns}/{name} in {timeout:.0f}s; its log:\n{sched.tail()}"
                )
            await asyncio.sleep(0.01)
    finally:
        r = await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
        assert r.ok, r.body


def report(outcome: Outcome, sched: KubeScheduler) -> str:
    head = f"{len(outcome.disagreements)} disagreement(s) over {outcome.pairs} (pod, node) pairs:\n"
    cases = sorted({c for c, _ in outcome.disagreements})
    pods = "\n".join(f"{c}: {json.dumps(outcome.specs.get(c))}" for c in cases)
    said = "\n".join(outcome.disagreements.values())
    return f"{head}{said}\nthe pods:\n{pods}\nkube-scheduler's log:\n{sched.tail(20)}"
