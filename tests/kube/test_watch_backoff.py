"""How a reflector waits between lists and watches: backoff that grows, is capped, honours the
server's Retry-After, and starts over after a success; a watch that expires as soon as it is
opened must not turn into back-to-back relists."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.kube import client, watch
from gpusched.kube.client import ApiError, Kube
from gpusched.kube.watch import Reflector
from tests.kube import virtual_time
from tests.kube.virtual_time import VirtualTimeLoop


class ExpiringApi:
    """Lists fine; every watch is answered 410 Gone at once (a watch cache rebuilt past our list)."""

    def __init__(self) -> None:
        self.lists = 0

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        self.lists += 1
        await asyncio.sleep(0)  # a real list yields to the loop
        return [], str(self.lists)

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        raise ApiError(410, "too old resource version", "Expired")
        yield {}  # pragma: no cover - makes this an async generator


class Nothing:
    def replace(self, objects: list[dict[str, Any]]) -> None:
        pass

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        pass


def _reflect_for_a_second(api: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a reflector against ``api`` for one second of a clock of the loop's own: a loaded
    machine neither adds requests nor takes them away."""
    loop = VirtualTimeLoop()
    monkeypatch.setattr(watch, "time", virtual_time.clock_of(loop))

    async def main() -> None:
        task = asyncio.create_task(Reflector(cast(Kube, api), "pods", "/api/v1/pods", Nothing()).run())
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    virtual_time.run(loop, main())


def test_a_watch_expiring_right_after_each_list_relists_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ExpiringApi()
    _reflect_for_a_second(api, monkeypatch)
    # 0.2, 0.4, 0.8 s (+ up to half again of jitter) between lists: the second comes by 0.3 s,
    # the third by 0.9 s, the fourth not before 1.4 s.  A handful in a second, not thousands.
    assert api.lists == 3, api.lists


class Clock:
    """A monotonic clock the test moves: a list of a large cluster takes seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


async def test_a_slow_list_does_not_hide_that_the_watch_expired_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    waits: list[float] = []

    async def back_off(delay: float, at_least: float = 0.0) -> float:
        waits.append(delay)
        await asyncio.sleep(0)
        return min(delay * 2, 10.0)

    class SlowList(ExpiringApi):
        async def list(
            self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
        ) -> tuple[list[Any], str]:
            clock.now += 2.0  # forty pages of pods
            return await super().list(path, query, page, each)

    monkeypatch.setattr(watch, "time", clock)
    monkeypatch.setattr(watch, "_back_off", back_off)
    api = SlowList()
    task = asyncio.create_task(Reflector(cast(Kube, api), "pods", "/api/v1/pods", Nothing()).run())
    while api.lists < 4:
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert waits[:3] == [0.2, 0.4, 0.8]  # each expiry came at once after its list: growing waits


class ClosingApi:
    """Lists fine; every watch is accepted and ended at once without an event (a proxy that cuts
    streaming answers, an API server going away)."""

    def __init__(self) -> None:
        self.watches = 0
        self.timeouts: list[int] = []

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        await asyncio.sleep(0)
        return [], "5"

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        self.timeouts.append(int(query["timeoutSeconds"]))
        await asyncio.sleep(0.001)  # the round trip
        return
        yield {}  # pragma: no cover - makes this an async generator


def test_a_watch_ended_at_once_without_an_event_is_reopened_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ClosingApi()
    _reflect_for_a_second(api, monkeypatch)
    # Reopened after 0.2, 0.4 s (+ up to half again): three watches in the first second, where
    # reopening at once would have sent one per round trip, a thousand, each spending a token
    # of the client the Bindings share.
    assert api.watches == 3, api.watches
    assert all(300 <= t < 600 for t in api.timeouts), api.timeouts  # spread, so watches do not reopen together


class ScriptedApi:
    """Lists and watches that do what a script says, in turn; each call is recorded with when it
    began and ended on the loop's clock.  A call past the end of its script waits for ever.

    A step is ``(seconds, outcome)``: the call takes ``seconds``, then a list returns (``None``)
    or raises (an ``ApiError``); a watch ends without an event (``None``), raises, or, for
    ``"bookmark"``, sends one bookmark and ends."""

    def __init__(self, lists: list[tuple[float, Any]], watches: list[tuple[float, Any]]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, float, float]] = []

    async def _step(self, kind: str, script: list[tuple[float, Any]]) -> Any:
        loop = asyncio.get_running_loop()
        if not script:
            await asyncio.sleep(1e9)
        seconds, outcome = script.pop(0)
        began = loop.time()
        await asyncio.sleep(seconds)
        self.calls.append((kind, began, loop.time()))
        if isinstance(outcome, ApiError):
            raise outcome
        return outcome

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        await self._step("list", self.lists)
        return [], "7"

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        if await self._step("watch", self.watches) == "bookmark":
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}

    def waits(self) -> list[tuple[str, float]]:
        """Each call after the first, with how long after the previous call ended it began."""
        return [
            (kind, round(began - ended, 3))
            for (_, _, ended), (kind, began, _) in zip(self.calls, self.calls[1:], strict=False)
        ]


def _reflect(api: ScriptedApi, seconds: float, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """Run a reflector against ``api`` for ``seconds`` of the loop's clock, without jitter."""
    loop = VirtualTimeLoop()
    monkeypatch.setattr(watch, "time", virtual_time.clock_of(loop))
    monkeypatch.setattr(watch, "random", SimpleNamespace(random=lambda: 0.0))

    async def main() -> None:
        task = asyncio.create_task(Reflector(cast(Kube, api), "pods", "/api/v1/pods", Nothing()).run())
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    virtual_time.run(loop, main())
    return api.waits()


def _broken(status: int = 0, retry_after: float | None = None) -> ApiError:
    return ApiError(status, "connection refused", "Unreachable", retry_after)


def test_a_failing_watch_backs_off_doubling_up_to_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi([(0.0, None)], [(0.0, _broken())] * 8)
    waits = _reflect(api, 60.0, monkeypatch)
    assert waits == [("watch", w) for w in (0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0)]


def test_a_failing_watch_waits_at_least_what_the_server_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi([(0.0, None)], [(0.0, _broken(429, retry_after=5.0)), (0.0, _broken(500)), (0.0, _broken())])
    waits = _reflect(api, 60.0, monkeypatch)
    assert waits == [("watch", 0.0), ("watch", 5.0), ("watch", 0.4)]  # the server's 5 s, then the backoff resumes


def test_a_successful_list_starts_the_watch_backoff_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi([(0.0, _broken(500)), (0.0, _broken(500)), (0.0, None)], [(0.0, _broken()), (0.0, _broken())])
    waits = _reflect(api, 60.0, monkeypatch)
    assert waits == [("list", 0.2), ("list", 0.4), ("watch", 0.0), ("watch", 0.2)]


def test_a_watch_that_ran_a_while_before_failing_is_retried_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = [(0.0, _broken())] * 3 + [(60.0, _broken()), (0.0, _broken())]
    api = ScriptedApi([(0.0, None)], steps)
    waits = _reflect(api, 120.0, monkeypatch)
    # 0.2, 0.4 s between the quick failures; the one that had been watching a minute starts over.
    assert waits == [("watch", 0.0), ("watch", 0.2), ("watch", 0.4), ("watch", 0.8), ("watch", 0.2)]


def test_a_watch_that_ran_a_while_before_expiring_relists_without_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = ApiError(410, "too old resource version", "Expired")
    api = ScriptedApi([(0.0, None)] * 5, [(0.0, gone), (0.0, gone), (60.0, gone), (0.0, gone)])
    waits = _reflect(api, 120.0, monkeypatch)
    # Expired at once after each list: 0.2, 0.4 s; after a minute of watching, relisted at once,
    # and the next expiry right after that list waits 0.2 s again, not 0.8 s.
    assert waits == [
        ("watch", 0.0),
        ("list", 0.2),
        ("watch", 0.0),
        ("list", 0.4),
        ("watch", 0.0),
        ("list", 0.0),
        ("watch", 0.0),
        ("list", 0.2),
    ]


def test_a_watch_ended_at_once_after_an_event_is_reopened_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi([(0.0, None)], [(0.001, "bookmark")] * 3)
    waits = _reflect(api, 10.0, monkeypatch)
    assert waits == [("watch", 0.0), ("watch", 0.0), ("watch", 0.0)]  # it said something: not a failure


class TooNewApi:
    """Lists fine; every watch from a listed version is refused as too new for the server's cache
    (an etcd restored from a backup): only a fresh list gets past it."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        self.lists += 1
        await asyncio.sleep(0)
        return [], str(self.lists)

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if query["resourceVersion"] == "1":
            raise ApiError(504, "Too large resource version: 1, current: 0", "Timeout")
        await asyncio.sleep(10)  # the second list's version is watched quietly
        yield {}


def test_a_watch_from_a_version_too_new_for_the_server_lists_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    api = TooNewApi()
    _reflect_for_a_second(api, monkeypatch)
    assert api.lists == 2, (api.lists, api.watches)  # not retried from version 1 forever


def test_a_line_cut_off_mid_stream_resumes_the_watch_without_a_relist(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpusched.kube.client import Kube as RealKube
    from gpusched.kube.client import RateLimiter

    class Cut:
        status = 200

        def __init__(self) -> None:
            self.headers: dict[str, str] = {}
            self.lines = [b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": "7"}}}\n', b'{"type": "MOD']
            self.content = self

        async def readline(self) -> bytes:
            return self.lines.pop(0) if self.lines else b""

    async def raw(self: Any, *_: Any, **__: Any) -> Cut:
        return Cut()

    monkeypatch.setattr(RealKube, "_raw", raw)
    monkeypatch.setattr("gpusched.kube.client._let_go", lambda resp: None)
    kube = RealKube.__new__(RealKube)
    kube.limiter = RateLimiter(50, 100)
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in kube.stream("/api/v1/pods", {}, timeout=5):
            seen.append(event)

    async def main() -> None:
        with pytest.raises(ApiError) as caught:
            await read()
        assert caught.value.status == 0  # as a broken connection: watched again from version 7
        assert "not JSON" in str(caught.value)

    asyncio.run(main())
    assert len(seen) == 1


class RefusingApi(ExpiringApi):
    """Lists fine once; from then on every watch and list is refused (the RBAC was changed)."""

    async def list(
        self, path: str, query: Mapping[str, Any] | None = None, page: int = 500, each: Any = None
    ) -> tuple[list[Any], str]:
        if self.lists:
            raise ApiError(403, 'pods is forbidden: User "system:serviceaccount:x:y" cannot list', "Forbidden")
        return await super().list(path, query, page, each)

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        raise ApiError(403, 'pods is forbidden: User "system:serviceaccount:x:y" cannot watch', "Forbidden")
        yield {}  # pragma: no cover - makes this an async generator


def test_a_watch_refused_for_a_minute_says_so_and_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = VirtualTimeLoop()
    monkeypatch.setattr(watch, "time", virtual_time.clock_of(loop))
    reflector = Reflector(cast(Kube, RefusingApi()), "pods", "/api/v1/pods", Nothing())
    seen: list[float] = []

    async def main() -> None:
        task = asyncio.create_task(reflector.run())
        for _ in range(7):
            await asyncio.sleep(10.0)
            seen.append(reflector.failing_for())
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with capture_logs() as logs:
        virtual_time.run(loop, main())
    assert reflector.synced.is_set()  # the first list worked: only the failures since count
    assert seen[0] == pytest.approx(10.0, abs=0.5)
    assert seen[-1] > watch.FAILING_UNREADY_S
    assert "403" in reflector.last_error
    warned = [e for e in logs if e["event"] == "watch failed, retrying"]
    assert warned
    assert all("RBAC" in e["fix"] for e in warned)


@pytest.mark.parametrize(
    ("reason", "names"),
    [
        (client.CERTIFICATE_UNTRUSTED, "certificate-authority"),
        (client.CERTIFICATE_NAME_MISMATCH, "tls-server-name"),
        (client.CERTIFICATE_OUT_OF_DATE, "renewed"),
    ],
)
def test_a_watch_refused_by_a_certificate_names_the_setting_to_fix(reason: str, names: str) -> None:
    assert names in watch.fix_for(ApiError(0, "the API server's certificate ...", reason))
