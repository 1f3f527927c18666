"""The reflector against the real API server: list, watch, resume, and relist on 410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gpusched.kube.client import ApiError
from gpusched.kube.watch import Reflector
from tests.controlplane import ControlPlane
from tests.e2e import kit


class Recorder:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.replaced = 0

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.replaced += 1
        self.names = {o["metadata"]["name"] for o in objects}

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.names.discard(name)
        else:
            self.names.add(name)


@contextlib.asynccontextmanager
async def running(r: Reflector) -> AsyncIterator[None]:
    """The reflector's loop, running until the block ends."""
    task = asyncio.create_task(r.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


SYNC_S = 30.0
"""Long enough for a list or a change to come through a busy machine's API server."""


async def _until(cond: Any, timeout: float = SYNC_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


async def test_list_then_watch_pages_and_changes(control_plane: ControlPlane, namespace: str) -> None:
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    try:
        await kit.create_all(kube, path, [{"metadata": {"name": f"c{i}"}, "data": {}} for i in range(7)])
        rec = Recorder()
        r = Reflector(kube, "cm", path, rec, page_size=3)  # the list takes three pages
        async with running(r):
            await asyncio.wait_for(r.synced.wait(), SYNC_S)
            assert rec.names == {f"c{i}" for i in range(7)}
            await kit.create_all(kube, path, [{"metadata": {"name": "late"}, "data": {}}])
            r2 = await kube.request("DELETE", f"{path}/c0")
            assert r2.ok
            await _until(lambda: "late" in rec.names and "c0" not in rec.names)
            assert rec.replaced == 1
    finally:
        await kube.close()


class Keeping(Recorder):
    """Keeps the objects it is given, as handlers that remember them do."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: list[dict[str, Any]] = []

    def replace(self, objects: list[dict[str, Any]]) -> None:
        super().replace(objects)
        self.objects.extend(objects)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        super().apply(kind, obj)
        self.objects.append(obj)


async def test_what_no_handler_reads_is_dropped_from_listed_and_watched_objects(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The API server writes managedFields on every object, and ``kubectl apply`` a copy of the
    object as an annotation: together most of a real pod. Listed or watched, neither is kept;
    the annotations the scheduler reads are."""
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def applied(name: str) -> dict[str, Any]:
        notes = {"kubectl.kubernetes.io/last-applied-configuration": '{"data":{"k":"' + "v" * 4000 + '"}}'}
        return {"metadata": {"name": name, "annotations": {**notes, "gpusched.io/gpu-milli": "500"}}, "data": {}}

    try:
        await kit.create_all(kube, path, [applied("listed")])
        assert (await kube.get(f"{path}/listed"))["metadata"]["managedFields"], "the server writes them"
        rec = Keeping()
        async with running(Reflector(kube, "cm", path, rec)):
            await _until(lambda: "listed" in rec.names)
            await kit.create_all(kube, path, [applied("watched")])
            await _until(lambda: "watched" in rec.names)
        assert [o["metadata"]["name"] for o in rec.objects] == ["listed", "watched"]
        for o in rec.objects:
            assert "managedFields" not in o["metadata"]
            assert o["metadata"]["annotations"] == {"gpusched.io/gpu-milli": "500"}
    finally:
        await kube.close()


class Failing(Recorder):
    """A handler with a bug that one object sets off."""

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "poison":
            raise ArithmeticError("a bug the object set off")
        super().apply(kind, obj)


async def test_a_handler_that_fails_on_a_change_gets_it_from_a_list_and_the_watch_goes_on(
    control_plane: ControlPlane, namespace: str
) -> None:
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    try:
        rec = Failing()
        r = Reflector(kube, "cm", path, rec)
        with capture_logs() as logs:
            async with running(r):
                await asyncio.wait_for(r.synced.wait(), SYNC_S)
                await kit.create_all(kube, path, [{"metadata": {"name": n}, "data": {}} for n in ("poison", "after")])
                await _until(lambda: rec.names == {"poison", "after"})
                await kit.create_all(kube, path, [{"metadata": {"name": "later"}, "data": {}}])
                await _until(lambda: "later" in rec.names)
        assert rec.replaced == 2  # the first list, and the one that recovered the failed change
        failed = [e for e in logs if e["event"] == "handler failed, relisting"]
        assert [(e["kind"], e["object"]) for e in failed] == [("ADDED", f"{namespace}/poison")]
    finally:
        await kube.close()


async def _compact(cp: ControlPlane, revision: int) -> None:
    """etcd's JSON gateway: drop history before ``revision``."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{cp.etcd_url}/v3/kv/compaction", json={"revision": str(revision), "physical": True}) as r,
    ):
        assert r.status == 200, await r.text()


async def test_expired_resource_version_relists(control_plane: ControlPlane, namespace: str) -> None:
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    try:
        for i in range(30):  # move the cluster's resourceVersion well past "1"
            await kit.create_all(kube, path, [{"metadata": {"name": f"x{i}"}, "data": {}}])
        _, rv = await kube.list(path)
        await _compact(control_plane, int(rv))  # what etcd does every few minutes in a real cluster
        rec = Recorder()
        r = Reflector(kube, "cm", path, rec)
        r.resource_version = "1"
        with pytest.raises(ApiError) as info:
            await asyncio.wait_for(r._watch(), 20)
        assert info.value.status == 410
        async with running(r):
            await asyncio.wait_for(r.synced.wait(), SYNC_S)
            assert len(rec.names) == 30
    finally:
        await kube.close()


async def test_a_dropped_watch_resumes_without_a_new_list(control_plane: ControlPlane, namespace: str) -> None:
    kube = await kit.admin(control_plane)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    real_stream = kube.stream
    cuts = 0

    async def cut_once(*args: Any, **kwargs: Any) -> Any:  # the first watch breaks after one event
        nonlocal cuts
        async for event in real_stream(*args, **kwargs):
            yield event
            if cuts == 0 and event.get("type") != "BOOKMARK":
                cuts += 1
                raise ApiError(0, "connection reset by peer", "Unreachable")

    kube.stream = cut_once  # type: ignore[method-assign]
    try:
        rec = Recorder()
        r = Reflector(kube, "cm", path, rec)
        async with running(r):
            await asyncio.wait_for(r.synced.wait(), SYNC_S)
            await kit.create_all(kube, path, [{"metadata": {"name": "before-cut"}, "data": {}}])
            await _until(lambda: cuts == 1)
            await kit.create_all(kube, path, [{"metadata": {"name": "after-cut"}, "data": {}}])
            await _until(lambda: {"before-cut", "after-cut"} <= rec.names)
            assert rec.replaced == 1  # resumed from its resourceVersion, not relisted
    finally:
        await kube.close()


async def test_a_watch_that_goes_silent_is_given_up_to_be_opened_again(
    control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that dies without a word would leave the scheduler blind until the watch's
    own timeout; a silence longer than the server's bookmark interval ends it (here shortened),
    quietly, as the watch's own timeout does: a quiet resource is no failure."""
    from gpusched.kube import client as client_module

    monkeypatch.setattr(client_module, "WATCH_IDLE_S", 0.5)
    kube = await kit.admin(control_plane)
    try:
        stream = kube.stream(f"/api/v1/namespaces/{namespace}/configmaps", {"timeoutSeconds": 60}, timeout=90)
        with capture_logs() as logs, pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), SYNC_S)  # (well short of the 60 s watch)
        assert [line["log_level"] for line in logs] == ["debug"]
    finally:
        await kube.close()
