"""Consolidation: GPU nodes whose pods all may move and fit on the other nodes in use are
emptied, round by round, through the Eviction API; their controllers create the pods again and
the batches place them.  A round comes only while the cluster is quiet, and waits for the last
round's pods to be placed again."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from gpusched.kube.binder import NotLeading
from gpusched.kube.watch import FAILING_UNREADY_S
from gpusched.model import Assignment, Plan, Pod
from gpusched.solver.consolidate import Move, node_down, plan_consolidation
from gpusched.solver.validate import plan_problems
from gpusched.state.cache import Snapshot

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.daemon")


class Consolidator:
    """The consolidation rounds of one scheduler instance (they run while it leads)."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.moving: set[tuple[str, str]] = set()
        """Pods (key, UID) the last consolidation round evicted, until they leave the books."""
        self._awaiting: dict[str, int] = {}
        """Per controller (UID) whose pods the last round evicted: how many of its pods ran before
        it, until as many run again (their replacements are placed)."""
        self._round_deadline = 0.0
        """Monotonic time after which the next round no longer waits for the last one's pods."""
        self._emptying: dict[str, list[int]] = {}
        """Per node a round is emptying: [evictions left, evictions refused, evictions not sent
        because the lead ended]."""
        self._refused_until: dict[str, float] = {}
        """Nodes not emptied again until then: a round left them in use (an eviction refused), or
        the pods of the round that emptied them were placed back on them (``_emptied``)."""
        self._emptied: set[str] = set()
        """Nodes the last round emptied, until its evictions are settled: then each that holds GPU
        pods again (the batches placed the replacements on it after all) is held in
        ``_refused_until``, so that no policy has a round evict the same work from it each time."""
        self.interval_changed = asyncio.Event()
        """Set when a new configuration changes ``consolidation.intervalSeconds``."""
        self._led_at = -math.inf
        """When this instance took the lead (``time.monotonic``)."""
        self._moved_owners: dict[str, tuple[float, frozenset[str]]] = {}
        """Controllers (UID) whose pods a round evicted: until when, and the UIDs of their pods on
        the books then.  Their pods made since (the replacements) stay put until then, wherever
        the batches placed them: a pod is not moved twice for one move."""

    def lead(self) -> None:
        """This instance has taken the lead: for a while it waits for the replacements of pods
        that leave (``_leaving``), which a round of the last leader may have evicted."""
        self._led_at = time.monotonic()

    async def forever(self) -> None:
        """Every ``consolidation.intervalSeconds``, a round of ``consolidate``; a round that
        fails is logged, and the next one comes as usual.  A new interval counts at once, from
        the last round (or the start).  No round before every watch has listed, nor while one
        has failed for long (``FAILING_UNREADY_S``): a plan on partial books could miss a
        disruption budget (and leave a node half emptied) or pods waiting."""
        await asyncio.gather(*(r.synced.wait() for r in self.s.reflectors))
        last = time.monotonic()
        while True:
            left = last + self.s.config.consolidation.interval_seconds - time.monotonic()
            if left > 0:
                self.interval_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):  # not wait_for: it can lose a cancellation
                        await self.interval_changed.wait()
                continue
            last = time.monotonic()
            failing = next((r for r in self.s.reflectors if r.failing_for() > FAILING_UNREADY_S), None)
            if failing is not None:
                if self.s.config.consolidation.enabled:
                    log.info("consolidation round skipped: a watch is failing", watch=failing.name)
                continue
            try:
                await self.round()
            except Exception as exc:
                log.error("consolidation failed", error=repr(exc))

    def _with_volumes(self, placed: list[Assignment]) -> list[Assignment]:
        """``placed``, each pod held to the nodes the volumes its claims are bound to may be used
        on: a pod on a local volume has nowhere else to go (its replacement would come back)."""
        out = []
        for a in placed:
            ns = a.pod.namespace
            # Not a generic ephemeral volume's claim (the pod's own): its replacement gets a new one.
            kept = tuple(c for c in a.pod.claims if (r := self.s.claims.claim(f"{ns}/{c}")) and r.owner != a.pod.uid)
            selector = self.s.claims.selector(ns, kept) if kept else ()
            out.append(replace(a, pod=replace(a.pod, volume_selector=selector)) if selector else a)
        return out

    async def round(self) -> int:
        """Empty the GPU nodes whose pods all may move and fit on other nodes in use
        (``plan_consolidation``), evicting those pods; how many nodes.  Only while leading, with
        consolidation on, and the cluster quiet: no pod waiting for a batch or a retry, none in a
        batch, no room held for a preempting pod, and none of the pods evicted by the last round
        still on the books (their replacements are placed first)."""
        c = self.s.config.consolidation
        if not c.enabled or not self.s.is_leader:
            return 0
        if time.monotonic() >= self._round_deadline:  # the last round's pods are waited for no longer
            self.moving.clear()
            self._awaiting.clear()
        self.moving = {(k, uid) for k, uid in self.moving if self.s.cache.holds(k, uid)}
        if self.moving:
            return 0  # an evicted pod is still on the books: it still counts among its controller's
        if self._awaiting:
            running = self._running_by_owner()
            if any(running.get(o, 0) < n for o, n in self._awaiting.items()):
                return 0  # their replacements are not all placed yet: the room they need is theirs
            self._awaiting.clear()
        if self._emptied:
            self._hold_refilled()
        if not self._quiet():
            return 0
        snap = self._books()
        placed = self._with_volumes(self.s.cache.placed())  # as counted in ``snap``: taken together
        newly = time.monotonic() - self._led_at < self._wait_s()
        leaving = self._leaving(placed, snap) if newly else []
        if leaving:
            log.info("consolidation waits: GPU pods are leaving, their replacements come first", pods=leaving[:3])
            return 0
        now = time.monotonic()
        self._refused_until = {n: t for n, t in self._refused_until.items() if t > now}
        self._moved_owners = {o: m for o, m in self._moved_owners.items() if m[0] > now}
        refused = {i for n in self._refused_until if (i := snap.cluster.index.get(n)) is not None}
        held = self._held_tenants()
        young = time.time() - self._hold_s()  # started since: a replacement, perhaps of the last leader's round
        stay = {
            a.pod.key
            for a in placed
            if ((moved := self._moved_owners.get(a.pod.owner)) and a.pod.uid not in moved[1])
            or (held and self.s.tenants.of(a.pod) in held)
            or young < a.pod.started < math.inf
        }
        moves = await asyncio.to_thread(
            plan_consolidation, snap.state, placed, c.max_nodes_per_round, list(self.s.budgets.values()), refused, stay
        )
        if not self.s.is_leader or not self._quiet() or not self.s.config.consolidation.enabled:
            return 0  # pods came (or room was held, or it was turned off) during the plan
        moves = self._still_good(moves, snap)
        names = snap.cluster.nodes
        # Per controller moved: how many of its pods run now (to see its replacements placed),
        # and the UIDs of all it has now (its pods made later are the replacements).
        owners = {a.pod.owner for m in moves for a in m.pods}
        runs: Counter[str] = Counter()
        uids: dict[str, set[str]] = defaultdict(set)
        for a in self.s.cache.placed() if owners else ():
            if a.pod.owner in owners:
                uids[a.pod.owner].add(a.pod.uid)
                runs[a.pod.owner] += not a.pod.terminating
        for m in moves:
            node = names[m.node].name
            log.info(
                "consolidate",
                node=node,
                pods=[a.pod.key for a in m.pods],
                to=sorted({names[t.node].name for t in m.targets}),
            )
            why = (
                f"consolidating GPU work: every pod on node {node} fits on the free GPUs of other nodes in use, "
                "and the node is left idle; the pod's controller creates it again"
            )
            self._emptying[node] = [len(m.pods), 0, 0]
            self._emptied.add(node)
            for a in m.pods:
                self.moving.add((a.pod.key, a.pod.uid))
                self._awaiting[a.pod.owner] = runs[a.pod.owner]
                self._moved_owners[a.pod.owner] = (time.monotonic() + self._hold_s(), frozenset(uids[a.pod.owner]))
                self.s.spawn(self._evict_to_consolidate(a.pod, node, why), f"consolidate:{a.pod.key}")
        if moves:
            self._round_deadline = time.monotonic() + self._wait_s()
        return len(moves)

    def sealed(self) -> set[str]:
        """Nodes a round is emptying while a pod it evicted there is still on the books (it
        terminates for its grace period): no batch puts GPU work there meanwhile.  As the batches
        see it that node is still in use, so a replacement made at once would go back to the
        node it was moved off, and be moved again, round after round."""
        if time.monotonic() >= self._round_deadline:  # waited for long enough (a pod stuck terminating)
            return set()
        cache = self.s.cache
        return {where[0] for key, uid in self.moving if cache.holds(key, uid) and (where := cache.placement(key))}

    def _hold_refilled(self) -> None:
        """Hold the nodes the last round emptied that GPU pods took again once its evictions were
        settled: its pods' replacements went back to them (the batches follow their policy, not
        the plan), and emptying them again would only evict the same work once more."""
        until = time.monotonic() + self._hold_s()
        for node in sorted(self._emptied - self._refused_until.keys()):
            held = [h for k in self.s.cache.gpu_pods_on(node) if (h := self.s.cache.held_pod(k)) is not None]
            # Replacements: pods of a controller moved that it made since (not an evicted pod
            # itself, still terminating there).
            back = [p.key for p in held if (m := self._moved_owners.get(p.owner)) and p.uid not in m[1]]
            if not back:  # idle, or other work took it (a pod that needed the whole node, say)
                continue
            self._refused_until[node] = until
            hold = self._hold_s()
            log.warning("consolidation emptied a node that was filled again", node=node, pods=back[:3], retry_in_s=hold)
        self._emptied.clear()

    def _wait_s(self) -> float:
        """How long a round waits for the last round's pods to be replaced (and a new leader for
        the pods that leave, which a round before it may have evicted)."""
        return max(600.0, 2 * self.s.config.consolidation.interval_seconds)

    def _hold_s(self) -> float:
        """How long a node consolidation could not leave idle is left out of rounds."""
        return max(3600.0, 6 * self.s.config.consolidation.interval_seconds)

    def _still_good(self, moves: list[Move], snap: Snapshot) -> list[Move]:
        """The moves of a plan made on ``snap`` that still hold on the books as they are now: a
        batch may have bound pods (to the node being emptied, or to the room its pods were to
        take) while the plan was made."""
        fresh = self._books()
        if not moves or fresh.cluster is not snap.cluster:
            return []
        there: dict[int, set[str]] = defaultdict(set)
        for a in self.s.cache.placed():  # as counted in ``fresh``: taken together
            if not a.pod.daemon:
                there[a.node].add(a.pod.key)
        state, out = fresh.state, []
        for m in moves:
            trial = state.release(m.pods)
            if there[m.node] != {a.pod.key for a in m.pods} or plan_problems(Plan(m.targets, ()), trial):
                log.info(
                    "consolidation move dropped: the cluster changed while it was planned",
                    node=snap.cluster.nodes[m.node].name,
                )
                continue
            state = trial.apply(m.targets)
            out.append(m)
        return out

    def _books(self) -> Snapshot:
        """The books as a consolidation round reads them: busy GPUs, nodes being re-partitioned
        and the GPUs the headroom keeps are no target."""
        return self.s.cache.snapshot(busy=self.s.busy_gpus(), sealed=self.s.mig.sealed(), **self.s.keep_free())

    def _quiet(self) -> bool:
        """No pod waits for a batch or a retry, none is in a batch, no room is held, and no node
        is being re-partitioned (pods wait for its layout, with gang members planned elsewhere)."""
        counts = self.s.queue.counts()
        return not (counts.active or counts.backoff or counts.in_flight or self.s.cache.nominations or self.s.mig.jobs)

    def _leaving(self, placed: Sequence[Assignment], snap: Snapshot) -> list[str]:
        """GPU pods of a controller being deleted on nodes that are up: asked while this instance
        is newly leading, their replacements may come (a round of the last leader evicted them,
        which this one has no record of) and the room they leave is theirs.  On a node that is
        down a pod may stay deleting for good."""
        names = snap.cluster.nodes
        return [
            a.pod.key
            for a in placed
            if a.pod.terminating and a.pod.owner and a.pod.gpu_demand_milli and not node_down(names[a.node])
        ]

    def _held_tenants(self) -> set[str]:
        """Tenants a pod of which waits at the tenant's GPU limit: a pod of theirs evicted counts
        toward the limit no more, and the waiting pod would take its place before its
        replacement comes."""
        tenants = self.s.tenants
        if not tenants.active:
            return set()
        parked = [r.pod for r in self.s.unschedulable_records() if not r.error]
        if not parked:
            return set()
        _, over = tenants.admit(
            self.s._count_running_members(parked), self.s.cache.tenant_usage(tenants, terminating=True)
        )
        return {tenants.of(p) for p in parked if p.key in over}

    def _running_by_owner(self) -> Counter[str]:
        """Pods on the books not being deleted, per controller UID."""
        return Counter(a.pod.owner for a in self.s.cache.placed() if a.pod.owner and not a.pod.terminating)

    async def _evict_to_consolidate(self, pod: Pod, node: str, why: str) -> None:
        """Evict one pod of a node a round is emptying; the node counts as emptied once all of
        its pods are evicted."""
        lost = False
        try:
            done = await self.s.binder.evict(pod, node, why)
        except NotLeading:  # nothing refused it: the node is no worse a choice than before
            done, lost = False, True
        tally = self._emptying.setdefault(node, [1, 0, 0])
        tally[0] -= 1
        if done:
            self.s.metrics.consolidation(0, 1)
        else:
            tally[2 if lost else 1] += 1
            self.moving.discard((pod.key, pod.uid))
            if not lost:
                self.s.metrics.consolidation(0, 0, 1)
        if tally[0] <= 0:
            if tally[1]:  # left in use: not chosen again each round, each evicting some or none
                hold = self._hold_s()
                self._refused_until[node] = time.monotonic() + hold
                self._emptied.discard(node)
                log.warning("consolidation left a node in use", node=node, refused=tally[1], retry_in_s=hold)
            elif tally[2]:  # the next leader's rounds choose afresh
                self._emptied.discard(node)
                log.info("consolidation of a node stopped: no longer the leader", node=node, not_evicted=tally[2])
            else:
                self.s.metrics.consolidation(1, 0)
            del self._emptying[node]
