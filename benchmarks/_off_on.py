"""One scenario run twice on one real API server, a feature off and then on, side by side.

Shared by the benchmarks of a single daemon feature (tenants, consolidation): the control
plane with the shipped RBAC, N fake nodes of 8 GPUs, a `gpusched run` per run with its own
configuration and a helper task playing the kubelet (or a controller), and the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from gpusched.kube.client import Kube
from tests.controlplane import REPO_ROOT, ControlPlane, control_plane, find_assets
from tests.e2e import kit

GPUS_PER_NODE = 8

RunOne = Callable[[Kube, ControlPlane, Path, str], Awaitable[dict[str, Any]]]
"""One run: (admin client, control plane, work folder, "off" or "on") -> its figures."""


async def off_and_on(prefix: str, nodes: int, head: dict[str, Any], run_one: RunOne) -> dict[str, Any]:
    """``head`` with the figures of ``run_one`` for "off" and for "on", on ``nodes`` nodes of
    ``GPUS_PER_NODE`` A100s (``gpu-0000``, ...), and the folder holding the logs."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    result = dict(head)
    with control_plane(work / "cp", find_assets()) as cp:
        cp.kubectl("apply", "-k", str(REPO_ROOT / "manifests"))
        kube = await kit.admin(cp, qps=1000)
        try:
            listed = [kit.node(f"gpu-{i:04d}", GPUS_PER_NODE, "A100-SXM4-80GB") for i in range(nodes)]
            await kit.create_all(kube, "/api/v1/nodes", listed, parallel=64)
            for mode in ("off", "on"):
                print(f"running {prefix.removeprefix('gpusched-').strip('-')} {mode} ...", file=sys.stderr, flush=True)
                result[mode] = await run_one(kube, cp, work, mode)
        finally:
            await kube.close()
    result["logs"] = str(work)
    return result


async def namespace(kube: Kube, name: str) -> str:
    """Create namespace ``name`` (there already: fine); its pods' path."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    r = await kube.request("POST", "/api/v1/namespaces", body=body)
    if not r.ok and r.status != 409:
        raise SystemExit(f"cannot create namespace {name}: {r.body}")
    return f"/api/v1/namespaces/{name}/pods"


def scheduler_name() -> str:
    """A fresh scheduler name, so that each run's pods are its own."""
    return f"gs-{uuid.uuid4().hex[:6]}"


@contextlib.asynccontextmanager
async def gpusched(
    cp: ControlPlane, work: Path, mode: str, name: str, config: str, helper: Coroutine[Any, Any, None]
) -> AsyncIterator[kit.Daemon]:
    """`gpusched run` as scheduler ``name`` with ``config`` (YAML), and ``helper`` running beside
    it.  On the way out the helper stops, then the daemon (its log is kept in ``work/MODE.log``;
    a failed exit ends the benchmark)."""
    path = work / f"{mode}.yaml"
    path.write_text(config)
    daemon = kit.Daemon.start(cp, name, "--no-leader-elect", "--config", str(path))
    task = asyncio.create_task(helper, name="helper")
    try:
        yield daemon
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        code = daemon.stop()
        (work / f"{mode}.log").write_text("".join(daemon.raw))
        if code != 0:
            raise SystemExit(f"gpusched exited with {code}; see {work / f'{mode}.log'}")


def table(r: dict[str, Any], title: str, rows: Sequence[tuple[str, str]], columns: tuple[str, str]) -> str:
    """``title``, then one line per (label, key) of ``rows``: the "off" figure, the "on" figure."""
    off, on = r["off"], r["on"]
    width = max(len(label) for label, _ in rows) + 2
    out = [title, f"{'':<{width}} {columns[0]:>11} {columns[1]:>11}"]
    out += [f"{label:<{width}} {off[key]!s:>11} {on[key]!s:>11}" for label, key in rows]
    return "\n".join(out)
