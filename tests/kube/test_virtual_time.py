"""The test clock itself: a test whose code would hang fails instead."""

from __future__ import annotations

import asyncio

import pytest

from tests.kube.virtual_time import START, VIRTUAL_LIMIT_S, VirtualTimeLoop, run


def test_a_sleep_takes_its_time_on_the_loops_clock() -> None:
    loop = VirtualTimeLoop()

    async def main() -> float:
        await asyncio.sleep(3600)
        return loop.time()

    assert run(loop, main()) == START + 3600


async def _for_ever() -> None:
    while True:  # a retry that never gives up
        await asyncio.sleep(60)


async def _spin() -> None:
    while True:  # never waits for anything
        await asyncio.sleep(0)


async def _stuck() -> None:
    await asyncio.Event().wait()  # nothing will ever set it


@pytest.mark.parametrize(
    ("main", "message"),
    [
        (_for_ever, f"{VIRTUAL_LIMIT_S:.0f} s passed on the test's clock"),
        (_spin, "without a wait: a busy loop"),
        (_stuck, "nothing left to run"),
    ],
)
def test_code_that_would_hang_fails_the_test(main: object, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        run(VirtualTimeLoop(), main())  # type: ignore[operator]
