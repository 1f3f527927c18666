"""Leader election on a ``coordination.k8s.io/v1`` Lease, after client-go's leaderelection.

Every replica runs ``LeaderElector.run``; the one holding the Lease schedules.
A holder is considered alive while its record keeps changing: expiry is
measured on *this* replica's clock from the moment it last saw the record
change, never from the timestamps inside it, so clock skew between nodes
cannot hand the Lease to two replicas.  Writes carry the resourceVersion they
read, so of two replicas racing for an expired Lease exactly one wins (the
other gets 409).  A leader that cannot renew within ``renew_deadline`` steps
down before its Lease can expire for the others.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from gpusched.kube.client import ApiError, Kube, segment

__all__ = ["LeaderElector"]

log = structlog.get_logger("gpusched.leader")


def timing_problem(lease_duration: float, renew_deadline: float, retry_period: float) -> str | None:
    """Why these timings cannot work, or None: a leader must renew before its lease runs out,
    and retry more than once before it gives up."""
    if lease_duration > renew_deadline > retry_period > 0:
        return None
    return (
        "leader election needs lease duration > renew deadline > retry period > 0, got "
        f"{lease_duration:g} / {renew_deadline:g} / {retry_period:g}"
    )


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires and renews one Lease; calls back on every change of leadership."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        problem = timing_problem(lease_duration, renew_deadline, retry_period)
        if problem:
            raise ValueError(problem)
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{segment(namespace)}/leases"
        self.lease_path = f"{self.path}/{segment(name)}"
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change
        self.is_leader = False
        self.renewed_at = -math.inf
        """Monotonic time the last renewal that was answered in time was sent; the lead holds a
        renew deadline from then (``holds``)."""
        self.holder = ""
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._lost = False
        """A renewal found the Lease held by another replica: the lead ends at once, not at the
        renew deadline (two leaders would bind onto the same GPUs meanwhile)."""
        self.refused = ""
        """Why the API server refused the last request about the Lease (403), with the fix; ""
        once a write of it is answered, or a read when the read was refused, or while another
        replica holds it (then this one has nothing to write; ``/readyz`` says so: a replica that
        can never lead while none leads is not ready)."""
        self._read_refused = False

    async def run(self) -> None:
        """Forever: acquire, renew while possible, step down when not."""
        try:
            while True:
                # Times are taken when a request is sent, not when its answer comes: the others
                # count the Lease's life from when they see the write, which is no earlier.  An
                # answer later than the renew deadline is not trusted (the next attempt renews).
                while True:
                    sent = time.monotonic()
                    if await self._renew(self.renew_deadline):
                        break
                    await asyncio.sleep(self.retry_period)
                self.renewed_at = sent
                self._set(True)
                while True:
                    await asyncio.sleep(self.retry_period)
                    sent = time.monotonic()
                    if await self._renew(self.renew_deadline - (sent - self.renewed_at)):
                        self.renewed_at = sent
                    elif self._lost:
                        log.warning(
                            "leadership lost: the lease is held by another", lease=self.name, holder=self.holder
                        )
                        self._lost = False
                        self._set(False)
                        break
                    elif time.monotonic() - self.renewed_at >= self.renew_deadline:
                        log.warning("leadership lost: lease not renewed in time", lease=self.name)
                        self._set(False)
                        break
        finally:
            if self.is_leader:
                self._set(False)

    def holds(self) -> bool:
        """Leader, and within the renew deadline of the last renewal, by the clock rather than by
        the loop that steps down (which a busy event loop may run late)."""
        return self.is_leader and time.monotonic() < self.renewed_at + self.renew_deadline

    def time_left(self) -> float:
        """Seconds this instance may still act as leader (0 when it does not lead): a request
        made for the leader must be over by then, for the Lease may then pass to another."""
        if not self.is_leader:
            return 0.0
        return max(0.0, self.renewed_at + self.renew_deadline - time.monotonic())

    async def _renew(self, time_left: float) -> bool:
        """One attempt to acquire or renew, cut off when the renew deadline passes: a slow API
        must not keep (or make) a leader after its Lease may have gone to another replica."""
        try:
            async with asyncio.timeout(max(time_left, 0.001)):  # not wait_for: it can lose a cancellation
                return await self._try()
        except TimeoutError:
            return False

    async def release(self) -> None:
        """Give the Lease up at shutdown so another replica takes over at once; given up itself
        after a renew deadline (an API server that does not answer must not keep the process
        past its grace period: the Lease then runs out)."""
        if self.holder != self.identity:
            return
        try:
            async with asyncio.timeout(self.renew_deadline):
                await self._release()
        except TimeoutError:
            log.warning(
                "lease not released: no answer in time; the other replicas take over once it runs out",
                lease=self.name,
                waited=self.renew_deadline,
                seconds=self.lease_duration,
            )

    async def _release(self) -> None:
        try:
            lease = await self.kube.get(self.lease_path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            for attempt in range(2):  # a renewal sent just before may have moved it on: once more
                if spec.get("holderIdentity") != self.identity:
                    return
                spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro_now()})
                r = await self.kube.request("PUT", self.lease_path, body=lease)
                if r.ok:
                    log.info("lease released", lease=self.name)
                    return
                if r.status != 409 or attempt:
                    raise r.error()
                lease = await self.kube.get(self.lease_path)
                spec = lease.get("spec") or {}
        except ApiError as exc:
            log.warning(
                "lease not released; the other replicas take over once it runs out",
                lease=self.name,
                error=str(exc),
                seconds=self.lease_duration,
            )

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.is_leader = leader
            log.info("leadership changed", leader=leader, identity=self.identity, lease=self.name)
            if self.on_change is not None:
                self.on_change(leader)

    async def _try(self) -> bool:
        """One attempt to acquire or renew; True when we hold the Lease afterwards."""
        now = _micro_now()
        try:
            r = await self.kube.request("GET", self.lease_path)
            if r.status != 403 and self._read_refused:  # read again: the next write says the rest
                self._allowed()
            self._read_refused = r.status == 403
            if r.status == 404:
                seen = self._observed
                if (
                    not self.is_leader
                    and seen is not None
                    and seen[0] not in ("", self.identity)
                    and time.monotonic() < self._observed_at + self.lease_duration
                ):
                    # Deleted while another held it (kubectl delete lease, to force a hand-over):
                    # that replica may lead until its lease would have run out; so wait as long.
                    return False
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0),
                }
                c = await self.kube.request("POST", self.path, body=body)
                won = self._won(c.ok, c.status)
                self._lost = self.is_leader and not won and c.status == 409  # another created it first
                return won
            if not r.ok:
                raise r.error()
            if not isinstance(r.body, dict):  # a proxy's page, say: as a failed request
                log.warning("lease request failed", lease=self.name, error=f"not a Lease object: {str(r.body)[:80]!r}")
                return False
            lease: dict[str, Any] = r.body
            spec: dict[str, Any] = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""))
            if record != self._observed:
                self._observed, self._observed_at = record, time.monotonic()
            self.holder = holder
            if self.is_leader and holder and holder != self.identity:  # taken over: no leader any more
                self._lost = True
                return False
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if holder and holder != self.identity and time.monotonic() < self._observed_at + duration:
                # Another leads: nothing to write, so no write to be refused.  A refusal seen
                # before (the Role since fixed, or not) is told again at the next write.
                self._allowed()
                return False
            transitions = int(spec.get("leaseTransitions") or 0)
            if holder == self.identity:
                acquired = str(spec.get("acquireTime") or now)
            else:
                acquired, transitions = now, transitions + 1
            lease["spec"] = self._spec(acquired, now, transitions)
            u = await self.kube.request("PUT", self.lease_path, body=lease)
            return self._won(u.ok, u.status)
        except ApiError as exc:
            self._refused(exc.status, str(exc))
            return False

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            # Whole seconds in the API: rounded up, so that the others never count the lease out
            # before this instance stops binding (its renew deadline, checked against the float).
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    def _won(self, ok: bool, status: int) -> bool:
        if ok or status == 409:  # the write was allowed (409: another's came first)
            self._allowed()
        if ok:
            self.holder = self.identity
            self._observed_at = time.monotonic()
            return True
        if status != 409:
            self._refused(status, "lease write refused")
        return False

    def _allowed(self) -> None:
        if self.refused:
            log.info("lease requests allowed again", lease=self.name)
        self.refused = ""

    def _refused(self, status: int, error: str) -> None:
        if status != 403:
            log.warning("lease request failed", lease=self.name, status=status, error=error)
            return
        fix = (
            f"the Role in {self.namespace} must grant get and update on the Lease named {self.name} "
            "(and create on leases); a second gpusched there needs its own --lease-name"
        )
        said = f"{error}; {fix}"
        # Refused every retry period until the Role is fixed: said once (and when it changes).
        emit = log.warning if said != self.refused else log.debug
        emit("lease request failed", lease=self.name, status=status, error=error, fix=fix)
        self.refused = said
