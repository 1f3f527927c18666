"""An event loop on a clock of its own, for tests about timing that do no real I/O.

Whenever nothing is ready to run, the loop's clock jumps to the next timer instead of the
process sleeping until it is due.  A sleep of 0.12 s then takes exactly 0.12 s of that clock
however loaded the machine is, so margins of a few milliseconds are tested as they are
written, and the test takes no wall-clock time waiting.  Code under test that reads
``time.monotonic()`` is pointed at the same clock with :func:`clock_of`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

T = TypeVar("T")

START = 1000.0
"""Where the clock starts (not zero, as ``time.monotonic()`` never is)."""


BUSY_POLLS = 100_000
"""Polls in a row with something always ready to run: code that never waits, whose test would
otherwise spin for ever with the clock standing still."""


VIRTUAL_LIMIT_S = 86_400.0
"""How far the clock may move in one test: code that sleeps in a loop for ever (a retry that
never gives up) would otherwise hang the test while the clock runs on."""


class _Selector(selectors.DefaultSelector):
    """Polls without blocking; a wait for a timer moves the loop's clock on instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop
        self._busy = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            self._busy += 1
            if self._busy > BUSY_POLLS:
                raise AssertionError(f"{BUSY_POLLS} turns of the event loop without a wait: a busy loop")
            return ready
        self._busy = 0
        if timeout is None:  # no timer and nothing ready: a real loop would wait for ever
            raise AssertionError("the event loop has nothing left to run: the test would hang")
        self._loop.now += timeout
        if self._loop.now - START > VIRTUAL_LIMIT_S:
            raise AssertionError(
                f"{VIRTUAL_LIMIT_S:.0f} s passed on the test's clock: the code under test waits for ever"
            )
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is ``now``, moved on only by waiting for timers
    (or by a test calling :meth:`advance`: the loop held up that long)."""

    def __init__(self) -> None:
        self.now = START
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Time passes without the loop running, as while a callback blocks it."""
        self.now += seconds


def clock_of(loop: VirtualTimeLoop) -> Any:
    """A stand-in for the ``time`` module whose ``monotonic()`` reads ``loop``'s clock."""
    return SimpleNamespace(monotonic=loop.time)


def run(loop: VirtualTimeLoop, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on ``loop`` to its end, then close the loop (tasks left are cancelled)."""
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
