"""The client's token bucket: the burst is free, then tokens come at exactly qps."""

from __future__ import annotations

import asyncio

import pytest

from gpusched.kube import client
from gpusched.kube.client import RateLimiter


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
