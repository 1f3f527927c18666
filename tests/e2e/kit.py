"""Helpers for the daemon tests: a `gpusched run` subprocess, object builders and checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.kube.client import Kube
from tests.controlplane import REPO_ROOT, SCHEDULER_NAMESPACE, ControlPlane


@dataclass
class Daemon:
    """One `gpusched run` process as the scheduler identity; its JSON log lines are collected."""

    proc: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, cp: ControlPlane, scheduler_name: str, *extra: str, identity: str = "") -> Daemon:
        argv = [
            sys.executable,
            "-m",
            "gpusched",
            "run",
            "--kubeconfig",
            str(cp.scheduler_kubeconfig),
            "--namespace",
            SCHEDULER_NAMESPACE,
            "--scheduler-name",
            scheduler_name,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            "0",
            "--identity",
            identity or f"{scheduler_name}-{os.getpid()}-{time.monotonic_ns() % 100000}",
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        proc = subprocess.Popen(
            argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO_ROOT
        )
        d = cls(proc)
        d.reader = threading.Thread(target=d._read, daemon=True)
        d.reader.start()
        return d

    def _close(self) -> None:
        if self.reader is not None:
            self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.raw.append(line)
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [x for x in list(self.lines) if x.get("event") == name]

    def wait_log(
        self, name: str, timeout: float = 60.0, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for x in self.events(name):
                if where is None or where(x):
                    return x
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{''.join(self.raw[-40:])}")
            time.sleep(0.05)
        raise AssertionError(f"no {name!r} log line in {timeout}s:\n{''.join(self.raw[-40:])}")

    def wait_count(
        self, name: str, count: int, timeout: float = 60.0, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> list[dict[str, Any]]:
        """The matching log lines once there are at least ``count``: the API shows a binding before the
        daemon has written its line about it, so a count read straight after ``wait_settled`` can be short."""
        deadline = time.monotonic() + timeout
        while True:
            found = [x for x in self.events(name) if where is None or where(x)]
            if len(found) >= count or time.monotonic() >= deadline or self.proc.poll() is not None:
                return found
            time.sleep(0.05)

    @property
    def metrics_port(self) -> int:
        return int(self.wait_log("started")["metrics_port"])

    @property
    def identity(self) -> str:
        return str(self.wait_log("started")["identity"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._close()
        return self.proc.returncode


async def admin(cp: ControlPlane, qps: float = 500) -> Kube:
    """A client as cluster admin (system:masters), rate-limited only to keep the server responsive."""
    from kubernetes_asyncio import config

    api = await config.new_client_from_config(config_file=str(cp.admin_kubeconfig))
    return Kube(api, qps=qps, burst=int(qps))


def node(name: str, gpus: int, model: str, cpu: str = "64", memory: str = "256Gi", **labels: str) -> dict[str, Any]:
    status = {"cpu": cpu, "memory": memory, "pods": "250", "nvidia.com/gpu": str(gpus)}
    lab = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": model, "nvidia.com/gpu.count": str(gpus), **labels}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab},
        "status": {"capacity": status, "allocatable": status},
    }


def pod(
    name: str,
    scheduler: str,
    *,
    gpus: int = 0,
    milli: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    models: Sequence[str] = (),
    node_name: str = "",
) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    ann: dict[str, str] = {}
    if milli:
        ann["gpusched.io/gpu-milli"] = str(milli)
    if models:
        ann["gpusched.io/gpu-models"] = ",".join(models)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}],
        "terminationGracePeriodSeconds": 0,
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann}, "spec": spec}


async def create_all(kube: Kube, path: str, objs: Sequence[dict[str, Any]], parallel: int = 32) -> None:
    sem = asyncio.Semaphore(parallel)

    async def one(o: dict[str, Any]) -> None:
        async with sem:
            r = await kube.request("POST", path, body=o)
            assert r.status == 201, (o["metadata"]["name"], r.status, r.body)

    await asyncio.gather(*(one(o) for o in objs))


async def list_all(kube: Kube, path: str) -> list[dict[str, Any]]:
    items, _ = await kube.list(path)
    return items


async def delete_all_nodes(kube: Kube) -> None:
    r = await kube.request("DELETE", "/api/v1/nodes")
    assert r.ok, r.body


RETRIED_WITHIN = 30.0
"""How long a pod parked as unschedulable has, from the change it waits for, to be retried and
bound: well under the queue's 60 s flush of parked pods (``Batcher.flush_after``), so that a
change that does not wake the pod fails the test instead of the flush binding it later."""


async def wait_bound(kube: Kube, path: str, timeout: float = 60.0) -> dict[str, Any]:
    """The pod at ``path`` once it has a node, or as it is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = await kube.request("GET", path)
        assert got.ok, got.body
        body: dict[str, Any] = got.body
        if body["spec"].get("nodeName") or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.1)


def condition(p: dict[str, Any]) -> dict[str, Any] | None:
    for c in (p.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None


async def wait_settled(kube: Kube, ns: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Until all ``count`` pods in ``ns`` are bound or carry PodScheduled=False."""
    deadline = time.monotonic() + timeout
    while True:
        pods = await list_all(kube, f"/api/v1/namespaces/{ns}/pods")
        settled = [p for p in pods if p["spec"].get("nodeName") or (condition(p) or {}).get("status") == "False"]
        if len(pods) == count and len(settled) == count:
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(settled)}/{count} pods settled after {timeout}s")
        await asyncio.sleep(0.3)


async def schedule(
    cp: ControlPlane, kube: Kube, ns: str, scheduler: str, pods: Sequence[dict[str, Any]], count: int | None = None
) -> dict[str, dict[str, Any]]:
    """Start a daemon, create ``pods`` in ``ns``, and return every pod there by name once all
    ``count`` (default: as many as created) are bound or marked unschedulable."""
    daemon = Daemon.start(cp, scheduler, "--no-leader-elect")
    try:
        await create_all(kube, f"/api/v1/namespaces/{ns}/pods", pods)
        settled = await wait_settled(kube, ns, len(pods) if count is None else count, timeout=90)
    finally:
        daemon.stop()
    return {p["metadata"]["name"]: p for p in settled}


def milli_of(p: dict[str, Any]) -> tuple[int, int]:
    """(whole GPUs, share milli) a test pod asks for."""
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    ann = p["metadata"].get("annotations") or {}
    if "gpusched.io/gpu-milli" in ann:
        return 1, int(ann["gpusched.io/gpu-milli"])
    g = int(limits.get("nvidia.com/gpu", 0))
    return g, 1000 if g else 0


def cpu_of(p: dict[str, Any]) -> int:
    from gpusched.model import cpu_milli

    return cpu_milli(p["spec"]["containers"][0]["resources"]["limits"]["cpu"])


def check_placements(nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]) -> None:
    """Every bound pod fits its node: CPU, GPU count, GPU indices exclusive/shared, models."""
    cap = {n["metadata"]["name"]: n for n in nodes}
    cpu_used: dict[str, int] = defaultdict(int)
    gpu_used: dict[tuple[str, int], int] = defaultdict(int)
    unindexed: dict[str, int] = defaultdict(int)
    indexed: dict[str, set[int]] = defaultdict(set)
    for p in pods:
        node_name = p["spec"].get("nodeName")
        if not node_name:
            continue
        n = cap[node_name]
        cpu_used[node_name] += cpu_of(p)
        g, milli = milli_of(p)
        if not g:
            continue
        ann = p["metadata"].get("annotations") or {}
        models = ann.get("gpusched.io/gpu-models")
        if models and p["spec"]["schedulerName"] != "other-scheduler":
            assert n["metadata"]["labels"]["nvidia.com/gpu.product"] in models.split(","), p["metadata"]["name"]
        idx = ann.get("gpusched.io/gpu-indices")
        if idx is None:  # bound by another scheduler: which GPUs is unknown, the count is not
            unindexed[node_name] += g
            continue
        gpus = [int(x) for x in idx.split(",")]
        assert len(gpus) == g, (p["metadata"]["name"], idx)
        for i in gpus:
            assert 0 <= i < int(n["status"]["allocatable"]["nvidia.com/gpu"]), (p["metadata"]["name"], idx)
            gpu_used[(node_name, i)] += milli
            indexed[node_name].add(i)
    for name, used in cpu_used.items():
        from gpusched.model import cpu_milli

        assert used <= cpu_milli(cap[name]["status"]["allocatable"]["cpu"]), f"{name}: CPU over-committed"
    for (name, i), used in gpu_used.items():
        assert used <= 1000, f"{name} GPU {i} over-committed: {used}"
    for name in set(indexed) | set(unindexed):
        total = len(indexed[name]) + unindexed[name]
        assert total <= int(cap[name]["status"]["allocatable"]["nvidia.com/gpu"]), f"{name}: {total} GPUs in use"


async def scheduled_events(kube: Kube, ns: str) -> dict[str, list[dict[str, Any]]]:
    events = await list_all(kube, f"/api/v1/namespaces/{ns}/events")
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[f"{e['reason']}/{e['involvedObject']['name']}"].append(e)
    return out


async def wait_events(
    kube: Kube, ns: str, keys: Iterable[str], timeout: float = 60.0
) -> dict[str, list[dict[str, Any]]]:
    """``scheduled_events`` once there is one for each of ``keys`` ("Reason/pod"), or as they are
    after ``timeout`` seconds.  The daemon writes a pod's Event beside its condition or after its
    Binding, so a pod seen settled can still be waiting for its Event."""
    wanted = set(keys)
    deadline = time.monotonic() + timeout
    while True:
        events = await scheduled_events(kube, ns)
        if wanted <= {k for k, v in events.items() if v} or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.2)


def repo_file(*parts: str) -> Path:
    return REPO_ROOT.joinpath(*parts)


async def explain(cp: ControlPlane, target: str, scheduler: str) -> subprocess.CompletedProcess[str]:
    """``gpusched explain TARGET`` for the scheduler named ``scheduler`` (the pods' schedulerName),
    as the scheduler's identity, in a subprocess."""
    argv = [sys.executable, "-m", "gpusched", "explain", target, "--kubeconfig", str(cp.scheduler_kubeconfig)]
    argv += ["--scheduler-name", scheduler]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, cwd=repo_file(), timeout=60)
