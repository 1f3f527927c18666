"""The client's token bucket: the burst is free, then tokens come at exactly qps; what it makes of
answers that are not the API server's."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gpusched.kube import client
from gpusched.kube.client import RateLimiter
from gpusched.kube.watch import Reflector
from tests.kube.conftest import serving


async def test_burst_then_steady_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(client.asyncio, "sleep", fake_sleep)
    lim = RateLimiter(qps=50, burst=10, clock=lambda: now[0])
    for _ in range(10):
        await lim.acquire()
    assert waits == []  # the burst is free
    for _ in range(5):
        await lim.acquire()
    # Each caller reserves the next token: 1/50 s, 2/50 s, ... after now.
    assert waits == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.10])
    now[0] = 10.0  # a long idle spell refills the bucket to the burst, not beyond
    waits.clear()
    for _ in range(10):
        await lim.acquire()
    assert waits == []
    await lim.acquire()
    assert waits == pytest.approx([0.02])
    assert asyncio.sleep is fake_sleep


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        RateLimiter(0, 1)
    with pytest.raises(ValueError, match="burst >= 1, got qps=1 burst=0"):
        RateLimiter(1, 0)
    RateLimiter(1, 1)  # the smallest bucket there is


async def test_available_tokens_refill_up_to_the_burst() -> None:
    now = [0.0]
    limiter = RateLimiter(10, 5, clock=lambda: now[0])
    for _ in range(4):  # within the burst: no caller waits
        await limiter.acquire()
    assert limiter.available() == pytest.approx(1.0)
    now[0] = 0.2
    assert limiter.available() == pytest.approx(3.0)
    now[0] = 10.0
    assert limiter.available() == 5.0


async def test_connect_keeps_a_pool_sized_to_the_request_rate(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    kube = await client.connect(kubeconfig, None, 50, 100)
    try:
        assert client.connection_limit(50) == 58
        assert client.connection_limit(500) == 128
        connector = kube.api.rest_client.pool_manager.connector
        assert connector is not None
        assert connector.limit == 58
    finally:
        await kube.close()


def test_binds_in_flight_follow_the_rate_and_fit_the_pool() -> None:
    assert client.bind_concurrency(50) == 25  # 50 binds a second at 0.5 s each
    assert client.bind_concurrency(5) == 8
    assert client.bind_concurrency(51) == 26  # half a second rounds up: 25.5 binds need 26
    assert client.bind_concurrency(500) == 100
    assert client.bind_concurrency(5000) == 100
    for qps in (50, 200, 500, 5000):
        assert client.bind_concurrency(qps) <= client.connection_limit(qps) - 8  # watches keep theirs


@pytest.mark.parametrize(
    ("code", "message", "reason"),
    [
        (20, "unable to get local issuer certificate", client.CERTIFICATE_UNTRUSTED),
        (19, "self-signed certificate in certificate chain", client.CERTIFICATE_UNTRUSTED),
        (62, "Hostname mismatch, certificate is not valid for 'api.example'.", client.CERTIFICATE_NAME_MISMATCH),
        (10, "certificate has expired", client.CERTIFICATE_OUT_OF_DATE),
    ],
)
def test_a_refused_certificate_says_which_fix_applies(code: int, message: str, reason: str) -> None:
    cause = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    cause.verify_code, cause.verify_message = code, message
    error = client.certificate_error(cause)
    assert (error.status, error.reason) == (0, reason)
    assert f"({message.rstrip('.')})" in error.message


async def test_a_watch_on_a_server_that_answers_a_web_page_says_it_is_no_api_server(tmp_path: Path) -> None:
    async def sign_in_page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>Sign in</body></html>", content_type="text/html")

    async with serving(sign_in_page, tmp_path) as kubeconfig:
        kube = await client.connect(kubeconfig, None, 50, 100)
        reflector = Reflector(kube, "nodes", "/api/v1/nodes", _Nothing())
        try:
            with capture_logs() as logs:
                task = asyncio.create_task(reflector.run())
                await asyncio.sleep(0.1)  # the first list, and its warning; the retry comes after 0.2 s
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await kube.close()
    assert [e["log_level"] for e in logs] == ["warning"], logs  # told once, not a stack of AttributeError
    said = logs[0]
    assert said["event"] == "watch failed, retrying"
    assert "to GET /api/v1/nodes is not a Kubernetes object (a web page: '<html><body>Sign in" in said["error"]
    assert "must be a Kubernetes API server's address" in said["fix"]


class _Nothing:
    def replace(self, objects: list[dict[str, Any]]) -> None:
        pass

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        pass
