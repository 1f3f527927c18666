"""Leader election against an API that stops answering: the leader steps down in time."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from gpusched.kube.client import Kube, Response
from gpusched.kube.leader import LeaderElector


class HangingApi:
    """Creates the Lease for the first caller, then never answers again (a wedged connection)."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, path: str, **_: Any) -> Response:
        self.calls += 1
        if self.calls == 1:
            return Response(404, {})
        if self.calls == 2:
            return Response(201, {})
        await asyncio.Event().wait()  # forever
        raise AssertionError("unreachable")


async def test_a_leader_whose_renewal_hangs_steps_down_by_the_renew_deadline() -> None:
    changes: list[tuple[bool, float]] = []
    elector = LeaderElector(
        cast(Kube, HangingApi()),
        "ns",
        "lease",
        "me",
        lease_duration=1.5,
        renew_deadline=0.6,
        retry_period=0.1,
        on_change=lambda leader: changes.append((leader, time.monotonic())),
    )
    task = asyncio.create_task(elector.run())
    try:
        for _ in range(100):
            if len(changes) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert [c[0] for c in changes] == [True, False]
    # Renewals hang from the first one on: leadership must end at the renew deadline (0.6 s after
    # the Lease was won), before the Lease (1.5 s) can pass to another replica.
    assert changes[1][1] - changes[0][1] < 1.5
