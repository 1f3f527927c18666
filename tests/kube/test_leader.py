"""Leader election against an API that stops answering: the leader steps down in time.

These run on an event loop with a clock of its own (``virtual_time``): what they check are
margins of tens of milliseconds between a renewal's answer and the renew deadline, which a
loaded machine's scheduling delays would otherwise decide.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from gpusched.daemon.settings import default_identity
from gpusched.kube import leader
from gpusched.kube.client import Kube, Response
from gpusched.kube.leader import LeaderElector
from tests.kube import virtual_time
from tests.kube.virtual_time import VirtualTimeLoop


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualTimeLoop]:
    """The loop the test runs on; the elector reads its clock."""
    loop = VirtualTimeLoop()
    monkeypatch.setattr(leader, "time", virtual_time.clock_of(loop))
    yield loop
    if not loop.is_closed():  # a test that failed before running it
        loop.close()


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

    async def get(self, path: str) -> Any:
        return (await self.request("GET", path)).body


def _elector(api: object, on_change: Callable[[bool], None]) -> LeaderElector:
    """An elector with short timings: lease 1.5 s, renew deadline 0.6 s, retry every 0.1 s."""
    return LeaderElector(
        cast(Kube, api),
        "ns",
        "lease",
        "me",
        lease_duration=1.5,
        renew_deadline=0.6,
        retry_period=0.1,
        on_change=on_change,
    )


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_leader_whose_renewal_hangs_steps_down_by_the_renew_deadline(loop: VirtualTimeLoop) -> None:
    changes: list[tuple[bool, float]] = []

    async def main() -> None:
        elector = _elector(HangingApi(), lambda leader: changes.append((leader, loop.time())))
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(5.0)
        await _stop(task)

    virtual_time.run(loop, main())
    assert [c[0] for c in changes] == [True, False]
    # Renewals hang from the first one on: leadership must end by the renew deadline (0.6 s after
    # the Lease was won), before the Lease (1.5 s) can pass to another replica.
    assert changes[1][1] - changes[0][1] <= 0.6 + 1e-6


class SlowApi:
    """Answers every request, but each answer takes ``delay`` seconds (an API server under load)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.created = False

    async def request(self, method: str, path: str, **_: Any) -> Response:
        await asyncio.sleep(self.delay)
        if method == "GET" and not self.created:
            return Response(404, {})
        if method == "POST":
            self.created = True
            return Response(201, {})
        if method == "GET":
            return Response(
                200, {"spec": {"holderIdentity": "me", "renewTime": str(asyncio.get_running_loop().time())}}
            )
        return Response(200, {})


def _leadership_changes(loop: VirtualTimeLoop, delay: float, seconds: float = 2.0) -> list[bool]:
    """Leadership changes of one instance whose API answers every request after ``delay`` s,
    over ``seconds`` (renew deadline 0.6 s, retry period 0.1 s, lease 1.5 s)."""
    changes: list[bool] = []

    async def main() -> list[bool]:
        elector = _elector(SlowApi(delay), changes.append)
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(seconds)
        seen = list(changes)  # before the cancellation steps down
        await _stop(task)
        return seen

    return virtual_time.run(loop, main())


def test_an_answer_later_than_the_renew_deadline_makes_no_leader(loop: VirtualTimeLoop) -> None:
    """The others count the Lease from when they see it written; an instance that hears of its
    win only after the renew deadline cannot know how much of the Lease is left: it does not lead."""
    assert _leadership_changes(loop, delay=0.4) == []  # GET then POST: 0.8 s per attempt


def test_a_leader_counts_its_lease_from_when_it_asked(loop: VirtualTimeLoop) -> None:
    """Renewals answered in 0.24 s keep the lead: each is sent 0.34 s after the last one was
    (0.24 s of answer, 0.1 s of retry period), so it has 0.26 s of the 0.6 s deadline left.  The
    lead is timed from each request's start, so a leader never outlives the deadline measured
    from what the others saw."""
    assert _leadership_changes(loop, delay=0.12) == [True]


def test_a_leader_whose_event_loop_was_held_up_past_the_deadline_no_longer_holds(loop: VirtualTimeLoop) -> None:
    """A long synchronous stretch (a solve on the loop, a stalled GC) can keep the step-down from
    running in time; ``holds`` reads the clock, so Bindings stop at the deadline all the same."""
    changes: list[bool] = []

    async def main() -> None:
        elector = _elector(SlowApi(0.0), changes.append)
        task = asyncio.create_task(elector.run())
        try:
            for _ in range(100):
                if changes:
                    break
                await asyncio.sleep(0.01)
            assert changes == [True]
            assert elector.holds()
            loop.advance(0.7)  # the loop is held past the 0.6 s renew deadline: no renewal ran
            assert elector.is_leader  # the loop that steps down has not run yet
            assert not elector.holds()
        finally:
            await _stop(task)

    virtual_time.run(loop, main())


def test_a_renewed_lead_ends_at_the_deadline_counted_from_when_the_renewal_was_sent(loop: VirtualTimeLoop) -> None:
    """The others count the Lease from the renewal they see written, which was sent before its
    answer came back: the lead must end a renew deadline after the send, not after the answer."""

    class Renewals(SlowApi):
        def __init__(self) -> None:
            super().__init__(0.12)
            self.renewed = asyncio.Event()

        async def request(self, method: str, path: str, **kw: Any) -> Response:
            r = await super().request(method, path, **kw)
            if method == "PUT":
                self.renewed.set()
            return r

    async def main() -> None:
        api = Renewals()
        changes: list[bool] = []
        elector = _elector(api, changes.append)
        task = asyncio.create_task(elector.run())
        try:
            while changes != [True]:
                await asyncio.sleep(0.01)
            api.renewed.clear()
            await api.renewed.wait()  # a renewal (GET then PUT, 0.12 s each) has just been answered
            for _ in range(3):
                await asyncio.sleep(0)
            assert elector.holds()
            loop.advance(0.6 - 0.24 + 0.01)  # a renew deadline after the GET was sent, and a bit
            assert not elector.holds()
        finally:
            await _stop(task)

    virtual_time.run(loop, main())


class LeaseStore:
    """No Lease at first; records every Lease written and accepts it."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Response:
        if method == "GET":
            return Response(404, {}) if not self.written else Response(200, self.written[-1])
        self.written.append(body)
        return Response(201, body)


@pytest.mark.parametrize(("duration", "deadline"), [(10.5, 10.4), (15.2, 15.1)])
def test_a_fractional_lease_duration_is_written_long_enough_to_outlast_the_renew_deadline(
    loop: VirtualTimeLoop, duration: float, deadline: float
) -> None:
    """The API takes whole seconds; the others count the lease out by what is written, so it must
    not come out shorter than the time this instance may go on binding unrenewed."""
    store = LeaseStore()

    async def main() -> None:
        elector = LeaderElector(
            cast(Kube, store), "ns", "lease", "me", lease_duration=duration, renew_deadline=deadline, retry_period=0.1
        )
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(0.5)
        await _stop(task)

    virtual_time.run(loop, main())
    assert store.written
    assert {w["spec"]["leaseDurationSeconds"] for w in store.written} == {int(duration) + 1}


class HeldLease:
    """A Lease another replica holds; ``alive`` says whether it keeps renewing it (each GET sees a
    new renewTime).  Every write is accepted and recorded with the loop's time."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive
        self.renewals = 0
        self.lease: dict[str, Any] = {
            "metadata": {"name": "lease", "namespace": "ns", "resourceVersion": "1"},
            "spec": {
                "holderIdentity": "other",
                "leaseDurationSeconds": 2,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseTransitions": 3,
            },
        }
        self.puts: list[tuple[float, dict[str, Any]]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Response:
        if method == "GET":
            if self.alive and self.lease["spec"]["holderIdentity"] == "other":
                self.renewals += 1
                self.lease["spec"]["renewTime"] = f"2026-01-01T00:00:{self.renewals % 60:02d}.000000Z"
            return Response(200, copy.deepcopy(self.lease))
        assert method == "PUT", method
        self.puts.append((asyncio.get_running_loop().time(), copy.deepcopy(body)))
        self.lease = copy.deepcopy(body)
        return Response(200, body)

    async def get(self, path: str) -> Any:
        r = await self.request("GET", path)
        return r.body


def test_a_lease_another_replica_keeps_renewing_is_never_taken(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=True)
    changes: list[bool] = []

    async def main() -> None:
        task = asyncio.create_task(_elector(store, changes.append).run())
        await asyncio.sleep(10.0)
        await _stop(task)

    virtual_time.run(loop, main())
    assert changes == []
    assert store.puts == []
    assert store.renewals > 50  # it kept asking


def test_a_lease_left_unrenewed_is_taken_once_its_duration_has_passed_on_our_clock(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=False)
    changes: list[tuple[bool, float]] = []

    async def main() -> None:
        elector = _elector(store, lambda leader: changes.append((leader, loop.time())))
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(3.0)
        assert elector.holder == "me"
        await _stop(task)

    start = loop.time()
    virtual_time.run(loop, main())
    # The record was first seen at the start: its 2 s run from then, whatever renewTime says.
    assert [c[0] for c in changes] == [True, False]  # False: the cancellation
    assert start + 2.0 <= changes[0][1] <= start + 2.1 + 1e-6
    taken, *renewed = [body["spec"] for _, body in store.puts]
    assert taken["holderIdentity"] == "me"
    assert taken["leaseTransitions"] == 4  # one more hand-over
    assert taken["acquireTime"] != "2026-01-01T00:00:00.000000Z"
    assert taken["leaseDurationSeconds"] == 2  # 1.5 s, rounded up
    assert renewed  # and kept: renewals change neither the acquisition nor the count
    assert {(r["acquireTime"], r["leaseTransitions"]) for r in renewed} == {(taken["acquireTime"], 4)}
    assert all(r["renewTime"] >= taken["renewTime"] for r in renewed)


@pytest.mark.parametrize(("duration", "deadline", "retry"), [(1.0, 1.0, 0.1), (1.5, 0.6, 0.6), (1.5, 0.6, 0.0)])
def test_timings_that_cannot_work_are_refused(duration: float, deadline: float, retry: float) -> None:
    assert leader.timing_problem(duration, deadline, retry) is not None
    with pytest.raises(ValueError, match="lease duration > renew deadline > retry period > 0"):
        LeaderElector(
            cast(Kube, None), "ns", "l", "me", lease_duration=duration, renew_deadline=deadline, retry_period=retry
        )
    assert leader.timing_problem(1.5, 0.6, 0.1) is None


def test_the_lead_lasts_a_renew_deadline_from_the_last_renewal(loop: VirtualTimeLoop) -> None:
    async def main() -> None:
        elector = _elector(SlowApi(0.0), lambda _: None)
        assert elector.time_left() == 0.0  # not leading
        task = asyncio.create_task(elector.run())
        try:
            for _ in range(100):
                if elector.is_leader:
                    break
                await asyncio.sleep(0.01)
            assert elector.time_left() == pytest.approx(0.6 - (loop.time() - elector.renewed_at))
            loop.advance(0.5)
            assert elector.time_left() == pytest.approx(0.6 - (loop.time() - elector.renewed_at))
            assert elector.time_left() < 0.11
            loop.advance(0.5)
            assert elector.time_left() == 0.0
        finally:
            await _stop(task)

    virtual_time.run(loop, main())


def test_a_leader_releases_its_lease_at_shutdown(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=False)
    store.lease["spec"]["holderIdentity"] = "me"

    async def main() -> None:
        elector = _elector(store, lambda _: None)
        await elector.release()  # not known to hold it yet: nothing written
        assert store.puts == []
        assert await elector._renew(0.6)
        await elector.release()

    virtual_time.run(loop, main())
    assert len(store.puts) == 2  # the renewal, then the release
    released = store.puts[-1][1]["spec"]
    assert released["holderIdentity"] == ""
    assert released["leaseDurationSeconds"] == 1


def test_a_lease_taken_over_meanwhile_is_not_released(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=False)
    store.lease["spec"]["holderIdentity"] = "me"

    async def main() -> None:
        elector = _elector(store, lambda _: None)
        assert await elector._renew(0.6)
        store.lease["spec"]["holderIdentity"] = "other"  # it lost the Lease without noticing yet
        await elector.release()

    virtual_time.run(loop, main())
    assert len(store.puts) == 1  # only the renewal
    assert store.lease["spec"]["holderIdentity"] == "other"


def test_a_released_lease_is_taken_at_once(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=False)
    store.lease["spec"].update({"holderIdentity": "", "leaseDurationSeconds": 1})  # given up at a shutdown
    changes: list[float] = []

    async def main() -> None:
        task = asyncio.create_task(_elector(store, lambda leader: changes.append(loop.time())).run())
        await asyncio.sleep(0.5)
        await _stop(task)

    start = loop.time()
    virtual_time.run(loop, main())
    assert changes[:1] == [start]  # no wait for the released Lease to run out
    assert store.puts[0][1]["spec"]["leaseTransitions"] == 4


def test_an_answer_that_is_not_a_lease_object_is_a_failed_try_not_the_end_of_the_elector(
    loop: VirtualTimeLoop,
) -> None:
    # A proxy's page in place of the Lease: the elector keeps trying, and takes the Lease once
    # the API server answers again.
    class ProxyPage:
        def __init__(self) -> None:
            self.gets = 0

        async def request(self, method: str, path: str, **_: Any) -> Response:
            if method == "GET":
                self.gets += 1
                return Response(200, "<html>bad gateway</html>") if self.gets <= 3 else Response(404, {})
            return Response(201, {})

    api = ProxyPage()
    changes: list[bool] = []

    async def main() -> None:
        task = asyncio.create_task(_elector(api, changes.append).run())
        await asyncio.sleep(2.0)
        assert not task.done()
        await _stop(task)

    virtual_time.run(loop, main())
    assert api.gets > 3
    assert changes[:1] == [True]


def test_a_leader_that_finds_its_lease_taken_steps_down_at_once(loop: VirtualTimeLoop) -> None:
    """Another replica holds it now (it found the Lease deleted and made its own, or it was
    edited): two leaders would bind onto the same GPUs until this one's renew deadline."""
    store = HeldLease(alive=False)
    store.lease["spec"].update({"holderIdentity": "", "leaseDurationSeconds": 1})
    changes: list[tuple[bool, float]] = []

    async def main() -> None:
        task = asyncio.create_task(_elector(store, lambda leader: changes.append((leader, loop.time()))).run())
        await asyncio.sleep(0.25)
        store.lease["spec"]["holderIdentity"] = "other"
        taken = loop.time()
        await asyncio.sleep(1.0)
        await _stop(task)
        assert changes[-1][0] is False
        assert changes[-1][1] <= taken + 0.1 + 1e-6  # at the next renewal, not the 0.6 s deadline

    virtual_time.run(loop, main())
    assert [c[0] for c in changes] == [True, False]


class DeletedLease(HeldLease):
    """Held and renewed by another replica until ``deleted_at`` (loop time), then deleted; the
    first create after that wins."""

    def __init__(self, deleted_at: float) -> None:
        super().__init__(alive=True)
        self.deleted_at = deleted_at
        self.created: list[float] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Response:
        now = asyncio.get_running_loop().time()
        if now >= self.deleted_at and not self.created:
            if method == "GET":
                return Response(404, {})
            assert method == "POST", method
            self.created.append(now)
            self.lease = copy.deepcopy(body)
            return Response(201, body)
        return await super().request(method, path, body)


def test_a_lease_deleted_while_another_held_it_is_created_only_once_that_one_has_stepped_down(
    loop: VirtualTimeLoop,
) -> None:
    """kubectl delete lease forces a hand-over; the replica that held it may not have noticed
    yet, so the others wait a lease duration from when they last saw it renewed."""
    store = DeletedLease(deleted_at=1.0)

    async def main() -> None:
        start = loop.time()
        store.deleted_at = start + 1.0
        task = asyncio.create_task(_elector(store, lambda _: None).run())
        await asyncio.sleep(4.0)
        await _stop(task)
        assert store.created, "never took over"
        assert store.created[0] >= start + 1.0 - 0.1 + 1.5  # its last sighting of a renewal, plus 1.5 s

    virtual_time.run(loop, main())


def test_a_release_that_meets_a_renewal_written_just_before_it_is_tried_once_more(loop: VirtualTimeLoop) -> None:
    store = HeldLease(alive=False)
    store.lease["spec"]["holderIdentity"] = "me"
    real = store.request
    conflicts = 1

    async def request(method: str, path: str, body: Any = None, **kw: Any) -> Response:
        nonlocal conflicts
        if method == "PUT" and body["spec"]["holderIdentity"] == "" and conflicts:
            conflicts -= 1
            return Response(409, {"kind": "Status", "code": 409, "reason": "Conflict", "message": "conflict"})
        return await real(method, path, body, **kw)

    store.request = request  # type: ignore[method-assign]

    async def main() -> None:
        elector = _elector(store, lambda _: None)
        assert await elector._renew(0.6)
        await elector.release()

    virtual_time.run(loop, main())
    assert store.lease["spec"]["holderIdentity"] == ""


def test_a_container_restarted_in_its_pod_waits_for_the_lease_its_last_run_held_to_run_out(
    loop: VirtualTimeLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed for memory (or by its liveness probe) while leading, the container comes back in
    the same pod at once: it must not take its last run's Lease as its own and bind at once,
    while Bindings that run sent may still land; it waits for the Lease to run out as another
    replica would."""
    monkeypatch.setenv("POD_NAME", "gpu-scheduler-7d9f-abcde")
    before, after = default_identity(), default_identity()
    store = HeldLease(alive=False)  # its last run held it, and renews it no more
    store.lease["spec"]["holderIdentity"] = before
    changes: list[tuple[bool, float]] = []

    async def main() -> None:
        elector = LeaderElector(
            cast(Kube, store),
            "ns",
            "lease",
            after,
            lease_duration=1.5,
            renew_deadline=0.6,
            retry_period=0.1,
            on_change=lambda leader: changes.append((leader, loop.time())),
        )
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(3.0)
        await _stop(task)

    start = loop.time()
    virtual_time.run(loop, main())
    assert changes[0][0] is True
    assert changes[0][1] >= start + 2.0  # the Lease's 2 s, not at once
    assert after.startswith("gpu-scheduler-7d9f-abcde_")  # what kubectl shows still names the pod


def test_a_release_the_api_server_does_not_answer_is_given_up_by_the_renew_deadline(loop: VirtualTimeLoop) -> None:
    """At shutdown the pod has its grace period (30 s) and no more: an API server that holds the
    release's requests must not keep it past, so the release gives up and the Lease runs out."""
    api = HangingApi()
    ended: list[float] = []

    async def main() -> None:
        elector = _elector(api, lambda _: None)
        assert await elector._renew(0.6)  # created: held
        start = loop.time()
        await asyncio.wait_for(elector.release(), 60.0)
        ended.append(loop.time() - start)

    virtual_time.run(loop, main())
    assert ended
    assert ended[0] <= 0.6 + 1e-6  # the renew deadline


class RefusingApi:
    """Refuses every request about the Lease (403) while ``refuse`` is set; then shows it held
    by another replica that keeps renewing it (so this one only reads)."""

    def __init__(self) -> None:
        self.refuse = True

    async def request(self, method: str, path: str, **_: Any) -> Response:
        if self.refuse:
            return Response(403, {"message": 'leases "lease" is forbidden'})
        renewed = str(asyncio.get_running_loop().time())
        return Response(200, {"spec": {"holderIdentity": "other", "renewTime": renewed, "leaseDurationSeconds": 15}})


def test_a_refused_lease_is_said_once_and_forgotten_once_read(loop: VirtualTimeLoop) -> None:
    """Refused every retry period: one warning, not one each time, and ``refused`` (what
    ``/readyz`` gives) holds the fix; once the Role allows reading it, the refusal is over even
    though this replica, a follower, never writes."""
    api = RefusingApi()
    seen: list[str] = []

    async def main() -> None:
        elector = _elector(api, lambda leader: None)
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(1.0)
        seen.append(elector.refused)
        api.refuse = False
        await asyncio.sleep(0.5)
        seen.append(elector.refused)
        await _stop(task)

    with capture_logs() as logs:
        virtual_time.run(loop, main())
    warned = [e for e in logs if e["event"] == "lease request failed" and e["log_level"] == "warning"]
    assert len(warned) == 1
    assert "grant get and update on the Lease named lease" in seen[0]
    assert seen[1] == ""


class WriteRefusingApi:
    """The Lease is free and may be read, but not written (the Role lacks update) while
    ``refuse`` is set; once the Role is fixed, another replica wins it and keeps renewing it."""

    def __init__(self) -> None:
        self.refuse = True

    async def request(self, method: str, path: str, **_: Any) -> Response:
        now = str(asyncio.get_running_loop().time())
        if self.refuse:
            if method == "GET":
                return Response(200, {"spec": {"holderIdentity": "", "renewTime": now}})
            return Response(403, {"message": 'leases "lease" is forbidden'})
        return Response(200, {"spec": {"holderIdentity": "other", "renewTime": now, "leaseDurationSeconds": 15}})


def test_a_refused_write_is_forgotten_once_another_replica_leads(loop: VirtualTimeLoop) -> None:
    """Every replica refused the write until the Role was fixed; one then took the Lease. This
    one only reads a Lease validly held: it is not told "cannot take the Lease" for ever."""
    api = WriteRefusingApi()
    seen: list[str] = []

    async def main() -> None:
        elector = _elector(api, lambda leader: None)
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(1.0)
        seen.append(elector.refused)
        api.refuse = False
        await asyncio.sleep(0.5)
        seen.append(elector.refused)
        await _stop(task)

    virtual_time.run(loop, main())
    assert "lease write refused" in seen[0]
    assert seen[1] == ""
