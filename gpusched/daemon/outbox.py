"""Writes of which only the latest matters, sent at the pace the API client allows.

A pod found unschedulable again and again (parked pods are tried every minute, and every
change in the cluster draws them) would otherwise queue one Event and one condition patch per
verdict behind the Events client's rate limit, without bound: memory grows, and the condition
a user reads lags minutes behind.  Here a write for a key (a pod's condition, a pod's Event of
one reason) that comes while an older one for that key still waits takes its place in the
line; at most ``workers`` writes run at once, so Events never hold more connections than that;
and beyond ``limit`` waiting writes the oldest is dropped (the next verdict on that pod writes
again).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import structlog

__all__ = ["Outbox"]

log = structlog.get_logger("gpusched.outbox")

Write = Callable[[], Awaitable[None]]


class Outbox:
    """Writes waiting to be sent, one per key, oldest first."""

    def __init__(self, workers: int = 16, limit: int = 20_000) -> None:
        self.workers = workers
        self.limit = limit
        self.dropped = 0
        """Writes dropped because ``limit`` were waiting."""
        self._waiting: OrderedDict[Hashable, Write] = OrderedDict()
        self._running = 0
        self._counted_out: set[asyncio.Task[Any] | None] = set()
        """Worker tasks that counted themselves out as they ended (``work``)."""
        self._told_dropped = 0.0

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, key: Hashable, write: Write) -> int:
        """Queue ``write`` for ``key`` (in the place of one still waiting for it); the number of
        workers to start now (``work``) so that up to ``workers`` run while writes wait."""
        fresh = key not in self._waiting
        self._waiting[key] = write  # an existing key keeps its place in the line
        if fresh and len(self._waiting) > self.limit:
            self._waiting.popitem(last=False)
            self.dropped += 1
            now = time.monotonic()
            if now - self._told_dropped >= 60.0:
                self._told_dropped = now
                log.warning(
                    "status writes dropped",
                    waiting=len(self._waiting),
                    dropped=self.dropped,
                    why="verdicts come faster than the Events client's rate; the next verdict on a pod writes again",
                )
        start = max(0, min(self.workers, len(self._waiting)) - self._running)
        self._running += start  # counted now: a worker started is not running before the next put
        return start

    def discard(self, key: Hashable) -> None:
        """Drop the write waiting for ``key``, if any (one sent another way supersedes it)."""
        self._waiting.pop(key, None)

    async def work(self) -> None:
        """Send waiting writes, oldest first, until none wait.  A write that fails is logged; it
        never stops the others.  Run as a task that calls ``worker_done`` when it ends."""
        try:
            while self._waiting:
                key, write = self._waiting.popitem(last=False)
                try:
                    await write()
                except Exception as exc:
                    log.error("status write failed", key=str(key), error=repr(exc))
        finally:
            # Counted out as it leaves the loop, not when its task's callbacks run: a write put
            # in between must start a worker, or it would wait for the next put.
            self._running -= 1
            self._counted_out.add(asyncio.current_task())

    def worker_done(self, task: object = None) -> None:
        """A worker's task ended: counted out here only if it never ran (cancelled before)."""
        if task in self._counted_out:
            self._counted_out.discard(task)
            return
        self._running -= 1
