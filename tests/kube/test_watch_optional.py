"""A custom resource the API server may not serve (the coscheduling PodGroup): read when it is,
and otherwise counted as read with nothing in it, said once, and looked for again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

from structlog.testing import capture_logs

from gpusched.kube.client import ApiError, Kube, Response
from gpusched.kube.watch import OptionalReflector

GV = "scheduling.x-k8s.io/v1alpha1"
NOT_SERVED = "the API server does not serve podgroups.scheduling.x-k8s.io/v1alpha1"
WITHIN_S = 5.0


class Api:
    """Serves podgroups while ``served``; a list answers ``list_status`` when it is not 200."""

    def __init__(self) -> None:
        self.served = False
        self.list_status = 200
        self.looks = 0
        self.lists = 0
        self.items: list[dict[str, Any]] = [{"metadata": {"name": "train", "namespace": "ns"}, "spec": {}}]
        self.ended = asyncio.Event()

    async def request(self, method: str, path: str, *_: Any, **__: Any) -> Response:
        assert (method, path) == ("GET", f"/apis/{GV}")
        self.looks += 1
        if not self.served:
            return Response(404, {"kind": "Status", "reason": "NotFound", "message": "the server could not find"})
        return Response(200, {"kind": "APIResourceList", "resources": [{"name": "podgroups"}, {"name": "x/status"}]})

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        assert path == f"/apis/{GV}/podgroups"
        self.lists += 1
        if self.list_status != 200:
            raise ApiError(self.list_status, "refused", "Forbidden" if self.list_status == 403 else "NotFound")
        return list(self.items), "1"

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        await self.ended.wait()  # the definition deleted: the watch is refused from then on
        raise ApiError(404, "the server could not find the requested resource", "NotFound")
        yield {}  # pragma: no cover - makes this an async generator


class Groups:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.calls.append(("replace", [o["metadata"]["name"] for o in objects]))

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        self.calls.append((kind, obj["metadata"]["name"]))

    def unread(self, why: str) -> None:
        self.calls.append(("unread", why))


async def _until(check: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _running(api: Api, groups: Groups) -> AsyncIterator[OptionalReflector]:
    r = OptionalReflector(cast(Kube, api), "podgroups", GV, "podgroups", groups, rediscover_s=0.01)
    task = asyncio.create_task(r.run())
    try:
        yield r
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _said(logs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (e["log_level"], e["event"], e.get("why", ""))
        for e in logs
        if e.get("watch") == "podgroups" and e["log_level"] != "debug"
    ]


async def test_not_served_it_counts_as_read_with_nothing_in_it_and_is_said_once() -> None:
    api, groups = Api(), Groups()
    with capture_logs() as logs:
        async with _running(api, groups) as r:
            await _until(lambda: api.looks >= 5)  # looked for again and again
            assert r.synced.is_set()
            assert not r.served
            assert r.failing_for() == 0
    assert set(groups.calls) == {("unread", NOT_SERVED)}
    assert _said(logs) == [("info", "custom resource not read", NOT_SERVED)]


async def test_installed_later_it_is_read_and_deleted_again_it_is_said_once_more() -> None:
    api, groups = Api(), Groups()
    with capture_logs() as logs:
        async with _running(api, groups) as r:
            await _until(lambda: api.looks >= 2)
            api.served = True
            await _until(lambda: r.served)
            await _until(lambda: ("replace", ["train"]) in groups.calls)
            groups.calls.clear()
            api.served, api.list_status = False, 404
            api.ended.set()
            await _until(lambda: not r.served and api.looks >= 10)
    assert set(groups.calls) == {("unread", NOT_SERVED)}
    assert _said(logs) == [
        ("info", "custom resource not read", NOT_SERVED),
        ("info", "reading a custom resource", ""),
        ("info", "custom resource not read", NOT_SERVED),
    ]


async def test_not_granted_it_is_said_once_as_a_warning_with_the_fix() -> None:
    api, groups = Api(), Groups()
    api.served, api.list_status = True, 403
    with capture_logs() as logs:
        async with _running(api, groups) as r:
            await _until(lambda: api.lists >= 5)  # tried again and again: it may be granted later
            assert r.synced.is_set()
            assert not r.served
    why = "the RBAC does not grant reading podgroups.scheduling.x-k8s.io/v1alpha1"
    assert set(groups.calls) == {("unread", why)}
    told = [e for e in logs if e.get("watch") == "podgroups" and e["log_level"] == "warning"]
    assert [(e["event"], e["why"]) for e in told] == [("custom resource not read", why)]
    assert "manifests/" in told[0]["fix"]
    assert _said(logs) == [("warning", "custom resource not read", why)]  # said once
