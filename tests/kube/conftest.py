"""A scripted HTTP server standing in for the API server where the test is about the client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serving(answer: Answer, tmp_path: Path) -> AsyncIterator[Path]:
    """An HTTP server on loopback where ``answer`` answers every request; yields a kubeconfig
    for it."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        yield kubeconfig
    finally:
        await runner.cleanup()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Path, list[web.Response], list[str]]]:
    """An HTTP server answering from a script; yields its kubeconfig, the script and the paths seen."""
    script: list[web.Response] = []
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return script.pop(0)

    async with serving(answer, tmp_path) as kubeconfig:
        yield kubeconfig, script, seen
