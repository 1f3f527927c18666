"""The scheduler: batches drawn from the queue, solved in a worker thread, bound; preemption,
reclaim, consolidation and the gauges around them.  Only the leader schedules."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import structlog

from gpusched.config import GpuschedConfig
from gpusched.daemon.handlers import (
    BoundHandler,
    BudgetHandler,
    ClaimHandler,
    Labels,
    NamespaceHandler,
    NodeHandler,
    PendingHandler,
    Selecting,
    VolumeHandler,
    moved_selectors,
    waits_for,
)
from gpusched.daemon.mig import Repartitioner
from gpusched.daemon.outbox import Outbox
from gpusched.daemon.settings import BOUND_SELECTOR, DaemonSettings, default_identity
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube, bind_concurrency
from gpusched.kube.configmap import ConfigMapHandler
from gpusched.kube.convert import (
    gang_disagreements,
    pod_record,
)
from gpusched.kube.leader import LeaderElector
from gpusched.kube.watch import Reflector
from gpusched.metrics.cost import mig_gpus
from gpusched.metrics.exporter import SchedulerMetrics
from gpusched.metrics.source import UtilisationSource, UtilisationView
from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.mig import gpu_fraction
from gpusched.model.pod import gang_conflicts
from gpusched.model.tenants import demand_of
from gpusched.queue.batcher import SchedulingQueue
from gpusched.solver.baselines.base import GPU_CHOICE
from gpusched.solver.consolidate import Move, plan_consolidation
from gpusched.solver.explain import DEFERRED, Explanation, explain, explain_gang, gang_fits
from gpusched.solver.fragmentation import TypicalPods, TypicalShape, cluster_frag_ratio
from gpusched.solver.params import SolverParams
from gpusched.solver.policy import Policy, TimedPolicy, place_quick
from gpusched.solver.preempt import (
    Budget,
    Preemption,
    elsewhere,
    gang_budgets,
    harm,
    plan_preemptions,
    still_standing,
    through_room,
)
from gpusched.solver.reclaim import (
    at_limit_searched,
    plan_at_limit,
    plan_reclaims,
    reclaim_through_room,
    reclaimable,
)
from gpusched.solver.registry import make_policy
from gpusched.solver.validate import plan_problems
from gpusched.state.cache import Cache, Room, Snapshot, same_offer
from gpusched.state.records import PodRecord
from gpusched.state.volumes import Claims

log = structlog.get_logger("gpusched.daemon")

GANG_ROOM_TRIES = 3
"""Refused Bindings in a row after which a gang member whose peers run gives its room up."""

READ_BACK_RETRY_S = 1.0
READ_BACK_RETRY_MAX_S = 60.0
"""How often a pod a relist missed is asked for again while the API server cannot answer."""
_READ_BACKS = ("resolve:", "read-back:")
"""Names of the tasks that read a pod back until it is settled (``drain`` does not wait for them)."""
OUTBOX_WORKERS = 16
"""Verdicts' Events and conditions sent at once at most: the connections they may hold (the
pool has more: Bindings and watches keep theirs)."""


class Scheduler:
    """One scheduler instance (the leader schedules; the others stand by)."""

    def __init__(self, settings: DaemonSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self.identity = settings.identity or default_identity()
        self.config = settings.config
        b = self.config.batching
        self.queue = SchedulingQueue(b.max_size, b.max_wait_seconds, busy=self._busy)
        self._binds_in_flight = 0
        self._binds_unstarted = 0
        """Binds spawned that have not taken their client token yet."""
        self._bind_room = asyncio.Event()
        self._bind_room.set()
        self.max_binds_in_flight = max(2 * b.max_size, settings.kube_burst)
        """Backpressure: no new batch is drawn while this many binds wait, so decisions stay fresh
        (made against the cluster as it is, not minutes ahead of the binder) and memory stays flat."""
        self.cache = Cache()
        self.claims = Claims()
        self.metrics = SchedulerMetrics()
        self.binder = Binder(
            kube,
            self.identity,
            events=kube.sibling(),
            leading=lambda: self.is_leader,
            lead_left=self._lead_left,
            node_known=lambda name: name in self.cache.nodes,
        )
        self._bind_slots = asyncio.Semaphore(bind_concurrency(settings.kube_qps))
        self.warm_connections = bind_concurrency(settings.kube_qps)
        """Connections kept open while idle (``keep_warm``), one per bind slot."""
        self.quick_size = bind_concurrency(settings.kube_qps)
        """Pods per batch while the client is idle: enough to fill the bind slots.  A quick
        batch is bound as the greedy warm start places it, pod by pod, so its size changes no
        placement, only how long the binder waits for its first pod."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.nodes_gone: dict[str, float] = {}
        """Nodes deleted lately, by name, and when (``time.monotonic``): the utilisation answer
        may name them for minutes after, which is no misconfiguration."""
        self._mig_shares_of: tuple[Cluster, npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
        self._crashed: set[str] = set()
        """Pods, by key, whose batch's handling raised: handled alone (or in halves) next time."""
        self.outbox = Outbox(workers=OUTBOX_WORKERS)
        """Verdicts' Events and conditions waiting for the Events client: one per pod and kind."""
        self._policy: Policy | None = None
        self._policy_cluster: Cluster | None = None
        self._policy_params: SolverParams | None = None
        self._shapes: Counter[TypicalShape] = Counter()
        self._kept_last: tuple[tuple[str, int], ...] = ()
        """The GPUs the last batch kept free (node name, index): kept first again, so that what
        is kept does not wander from node to node as pods come and go."""
        self._models_checked: tuple[str, ...] = ()
        """The ``headroom.models`` setting last checked against the cluster's GPU products."""
        self._consolidating: set[tuple[str, str]] = set()
        """Pods (key, UID) the last consolidation round evicted, until they leave the books."""
        self._awaiting: dict[str, int] = {}
        """Per controller (UID) whose pods the last round evicted: how many of its pods ran before
        it, until as many run again (their replacements are placed)."""
        self._round_deadline = 0.0
        """Monotonic time after which the next round no longer waits for the last one's pods."""
        self._emptying: dict[str, list[int]] = {}
        """Per node a round is emptying: [evictions left, evictions refused, evictions in all]."""
        self._refused_until: dict[str, float] = {}
        """Nodes not emptied again until then: a round left them in use (an eviction refused), or
        the pods of the round that emptied them were placed back on them (``_emptied``)."""
        self._emptied: set[str] = set()
        """Nodes the last round emptied, until its evictions are settled: then each that holds GPU
        pods again (the batches placed the replacements on it after all) is held in
        ``_refused_until``, so that no policy has a round evict the same work from it each time."""
        self._interval_changed = asyncio.Event()
        """Set when a new configuration changes ``consolidation.intervalSeconds``."""
        self._refusals: dict[str, int] = {}
        """Gang members whose Bindings were refused in a row since they were last bound: how many."""
        self.evicted_uncounted: dict[str, Pod] = {}
        """Victims deleted here that the status of a disruption budget covering them may not
        count yet (the disruption controller writes it after the deletion): by key, until such
        a budget's status is written again, or the victim has left the books."""
        self.mig = Repartitioner(self)
        """MIG layouts asked for and given back (``mig.repartition``)."""
        self.placed_here: set[str] = set()
        """Pods whose ``nominatedNodeName`` this instance has written while leading (a node it
        preempted on, or none): its own word, never a reason to hold room again (``adopt_room``)."""
        self._leading = asyncio.Event()
        self._solver_loaded = False
        self._batches = 0
        self.utilisation: UtilisationSource | None = None
        if settings.prometheus_url:
            self.utilisation = UtilisationSource(
                settings.prometheus_url,
                query=settings.utilisation_query,
                node_label=settings.utilisation_node_label,
                gpu_label=settings.utilisation_gpu_label,
                poll_s=settings.utilisation_poll_s,
                on_poll=self.metrics.utilisation_poll,
            )
        self.set_config(self.config)
        self.metrics.on_scrape(self._scrape)
        self.namespaces: dict[str, dict[str, str]] = {}
        """Labels per namespace (``namespaceSelector`` picks from them)."""
        self.selecting_bound: Selecting = {}
        self.selecting_pending: Selecting = {}
        """The pods, bound and pending, whose pod (anti-)affinity picks namespaces by label: their
        latest objects, read again when namespaces' labels change."""
        self.budgets: dict[str, Budget] = {}
        """PodDisruptionBudgets by ``namespace/name``."""
        self._bound = BoundHandler(self)
        self._pending = PendingHandler(self)
        self.reflectors = [
            Reflector(kube, "namespaces", "/api/v1/namespaces", NamespaceHandler(self)),
            Reflector(kube, "nodes", "/api/v1/nodes", NodeHandler(self)),
            Reflector(
                kube,
                "bound-pods",
                "/api/v1/pods",
                self._bound,
                field_selector=BOUND_SELECTOR,
            ),
            Reflector(
                kube,
                "pending-pods",
                "/api/v1/pods",
                self._pending,
                field_selector=f"spec.schedulerName={settings.scheduler_name},spec.nodeName=",
            ),
            Reflector(kube, "claims", "/api/v1/persistentvolumeclaims", ClaimHandler(self)),
            Reflector(kube, "volumes", "/api/v1/persistentvolumes", VolumeHandler(self)),
            Reflector(kube, "disruption-budgets", "/apis/policy/v1/poddisruptionbudgets", BudgetHandler(self)),
        ]
        self.config_handler: ConfigMapHandler | None = None
        self.configured = asyncio.Event()
        """Set once the configuration in force is the one asked for: at once for a file (or
        none), for a ConfigMap once a document of it was accepted.  Until then no batch is
        placed and the Lease is not tried for: not the built-in defaults in its place."""
        if not settings.config_map:
            self.configured.set()
        else:
            self.config_handler = ConfigMapHandler(
                settings.namespace,
                settings.config_map,
                self._config_accepted,
                on_rejected=self._config_rejected,
                spawn=self.spawn,
                on_result=self.metrics.config_reload,
            )
            self.reflectors.append(
                Reflector(
                    kube,
                    "config",
                    f"/api/v1/namespaces/{settings.namespace}/configmaps",
                    self.config_handler,
                    field_selector=f"metadata.name={settings.config_map}",
                )
            )
        self.elector: LeaderElector | None = None
        if settings.leader_elect:
            self.elector = LeaderElector(
                kube.apart(),  # its own rate limit and connections: nothing else delays a renewal
                settings.namespace,
                settings.lease_name,
                self.identity,
                lease_duration=settings.lease_duration_s,
                renew_deadline=settings.renew_deadline_s,
                retry_period=settings.retry_period_s,
                on_change=self._leadership,
            )
        else:
            self._leadership(True)

    # -- configuration and leadership -----------------------------------------------------
    def set_config(self, cfg: GpuschedConfig) -> None:
        """Take a validated configuration; the next batch uses it.  Pods waiting as unschedulable
        are drawn again when what kept GPUs from them (busy GPUs, headroom, tenants' rules)
        changed."""
        if (cfg.utilisation, cfg.headroom, cfg.tenants) != (
            self.config.utilisation,
            self.config.headroom,
            self.config.tenants,
        ):
            self.queue.move_all()
        if cfg.consolidation.interval_seconds != self.config.consolidation.interval_seconds:
            self._interval_changed.set()
        age_changed = cfg.utilisation.max_age_seconds != self.config.utilisation.max_age_seconds
        self.config = cfg
        if age_changed:
            self._check_poll_age()
        self.tenants = cfg.tenants.tenants()
        self.queue.set_tenants(self.tenants, self._tenant_usage, self.cache.has_room)
        self.metrics.set_weights({k: float(v) for k, v in cfg.weights.model_dump(by_alias=True).items()})
        self.queue.max_size = cfg.batching.max_size
        self.queue.max_wait = cfg.batching.max_wait_seconds
        self.queue.nudge()  # the batch being gathered closes by the new size and wait
        self.max_binds_in_flight = max(2 * cfg.batching.max_size, self.settings.kube_burst)
        self._policy = None  # rebuilt with the new weights

    def _config_accepted(self, cfg: GpuschedConfig) -> None:
        self.set_config(cfg)
        self.configured.set()

    def _not_configured(self) -> str:
        """Why the ConfigMap's configuration is not in force yet, and the fix."""
        h = self.config_handler
        assert h is not None
        why = h.rejected or "the ConfigMap was not found"
        return (
            f"no valid configuration from ConfigMap {h.namespace}/{h.name} yet ({why}); "
            "fix it, and pods are placed once a valid document is in it"
        )

    async def lead(self) -> None:
        """Try for the Lease (``elector.run``) once configured: a replica whose ConfigMap was
        never valid does not take the lead from one that runs on the last good document."""
        assert self.elector is not None
        if not self.configured.is_set():
            log.error("not trying for the lead", why=self._not_configured())
            await self.configured.wait()
        await self.elector.run()

    def _limit_usage(self, todo: list[PodRecord]) -> dict[str, int]:
        """What each tenant holds, as its limit counts it against the pods of ``todo``: pods being
        deleted count until they are gone, but not those being moved (their replacements count
        instead), and room still held for a pod of ``todo`` counts with its pod."""
        return self.cache.tenant_usage(
            self.tenants, [r.key for r in todo], terminating=True, moving=self._consolidating
        )

    def _tenant_usage(self) -> dict[str, int]:
        return self.cache.tenant_usage(self.tenants)

    def _wait_in_rooms(self, todo: list[PodRecord]) -> list[PodRecord]:
        """``todo`` but for the pods of tenants with a limit that room is held for while their
        victims are still leaving (a gang: all its members here, while any member's are): they
        wait for it (told so, the room kept), since taking free room elsewhere while their
        victims leave would take their tenant past its limit (its victims count until they are
        gone).  Once the victims are gone, a pod whose room ``_bind_nominated`` could not bind
        it to goes on to the solve, which gives the room up where it no longer fits."""
        leaving: dict[str, tuple[str, int]] = {}  # pod, or gang -> a node its victims leave, how many
        for r in todo:
            room = self.cache.nomination(r.key)
            if room is None or not room[2] or self.tenants.rule(self.tenants.of(r.pod)).limit is None:
                continue
            node, count = leaving.get(r.pod.unit, (room[0], 0))
            leaving[r.pod.unit] = (node, count + room[2])
        if not leaving:
            return todo
        out = []
        for r in todo:
            if r.pod.unit not in leaving:
                out.append(r)
                continue
            node, left = leaving[r.pod.unit]
            room = self.cache.nomination(r.key)
            self.tell_unschedulable(
                r.pod,
                f"Waiting for {left} preempted pod(s) to leave node {node}: tenant {self.tenants.of(r.pod)} has a "
                "GPU limit, so the pod takes only the room they leave.",
                "TenantLimit",
                nominated=None if room is None else room[0],
            )
        return out

    def _lowest_by_tenant(self) -> dict[str, int]:
        """The lowest priority among each tenant's pods that preemption may evict."""
        out: dict[str, int] = {}
        for a in self.cache.preemptible():
            t = self.tenants.of(a.pod)
            out[t] = min(out.get(t, a.pod.priority), a.pod.priority)
        return out

    def _scope(self) -> Callable[[Pod], str] | None:
        """Whose pods a pod may preempt by priority: its own tenant's, when tenants are set
        (between tenants, only quota decides: ``_preempt_for(reclaim=True)``); else anyone's."""
        return self.tenants.of if self.tenants.active else None

    async def _config_rejected(self, involved: dict[str, str], message: str) -> None:
        assert self.config_handler is not None
        await self.binder.object_event(
            involved, "InvalidConfiguration", f"{message}; {self.config_handler.kept()}", "Warning"
        )

    def _leadership(self, leader: bool) -> None:
        self.metrics.set_leader(leader)
        if leader:
            self.metrics.new_term()
            self._leading.set()
            self.mig.lead()  # what failed under the last leader is set back now
        else:
            self._leading.clear()
            self.placed_here.clear()
            if self.cache.clear_nominations():  # the next leader holds room for whom it preempts
                self.queue.move_all()

    @property
    def is_leader(self) -> bool:
        """Whether this instance schedules now (with an elector: its last renewal still holds)."""
        return self._leading.is_set() and (self.elector is None or self.elector.holds())

    def _lead_left(self) -> float:
        """Seconds a request made for the leader may still take (without an elector, unbounded)."""
        return math.inf if self.elector is None else self.elector.time_left()

    def ready(self) -> tuple[bool, str]:
        """For ``/readyz``: every watch has listed and the solver is loaded, so a pod that
        arrives now is placed at once."""
        waiting = [r.name for r in self.reflectors if not r.synced.is_set()]
        if waiting:
            return False, f"waiting for the first list of {', '.join(waiting)}"
        if not self.configured.is_set():
            return False, self._not_configured()
        if not self._solver_loaded:
            return False, "loading the solver"
        return True, ""

    def read_pod(self, obj: dict[str, Any], selecting: Selecting, gone: bool = False) -> PodRecord:
        """``pod_record`` against the namespaces' labels, remembering in ``selecting`` the pods
        whose terms pick namespaces by label, with their selectors (and forgetting them once
        ``gone``)."""
        rec = pod_record(obj, self.namespaces)
        if rec.pod.movable and rec.scheduler != self.settings.scheduler_name:  # its replacement is not ours to place
            rec = replace(rec, pod=replace(rec.pod, movable=False))
        if rec.namespace_selected and not gone and not rec.terminal:
            selecting[rec.key] = (obj, rec.namespace_selectors)
        else:
            selecting.pop(rec.key, None)
        return rec

    def reread_selecting(self, changes: list[tuple[Labels | None, Labels | None]]) -> None:
        """Namespaces' labels changed (``changes``: each one's before and after): read again, as if
        they had changed, the pods with a selector that now picks differently (bound ones may now
        keep others away, or no longer; pending ones may now fit, or no longer)."""
        held = [*self.selecting_bound.values(), *self.selecting_pending.values()]
        moved = moved_selectors((sel for _, sels in held for sel in sels), changes)
        if not moved:
            return
        bound = [obj for obj, sels in list(self.selecting_bound.values()) if not moved.isdisjoint(sels)]
        for obj in bound:
            self._bound.apply("MODIFIED", obj)  # wakes the parked pods when the pod's terms changed
        pending = 0
        for key, (obj, sels) in list(self.selecting_pending.items()):
            if key in self.queue and not moved.isdisjoint(sels):  # (bound since: not queued again)
                self._pending.apply("MODIFIED", obj)
                pending += 1
        if bound or pending:
            log.info("namespace labels changed; pods read again", bound=len(bound), pending=pending)

    def _client_idle(self) -> bool:
        """More than half the bind client's burst is unspent: it has requests to spare.

        Tokens saved beyond the burst are lost, so while the client is idle the time a
        batch spends gathering pods or in CP-SAT is request budget thrown away.  Binds
        started but not yet sent count as spent.
        """
        limiter = self.kube.limiter
        return limiter.available() - self._binds_unstarted > limiter.burst / 2

    def _burst(self) -> bool:
        """More pods wait, more than an eighth of a batch arrived within the last second, or two
        within the last tenth (a burst's first batch, drawn after the queue's short wait while
        idle): a burst is on, and its first batches are drawn before the rest of it has arrived.
        A quiet cluster's pods, one at a time, are still solved."""
        q = self.queue
        return q.counts().active > 0 or q.arrived_within(1.0) > max(1, q.max_size // 8) or q.arrived_within(0.1) > 1

    def _busy(self) -> bool:
        """Binds in flight and the client busy with them: the next batch may gather pods."""
        return self._binds_in_flight > 0 and not self._client_idle()

    # -- tasks -----------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A short supervised task (binds, Events); its failure is logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", task=task.get_name(), error=repr(task.exception()))

    def pending_tasks(self) -> list[asyncio.Task[None]]:
        """Binds and Events not finished yet."""
        return list(self._tasks)

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for in-flight binds and Events, and for the Events of binds that land
        meanwhile (a Binding's answer starts its Scheduled Event as a new task).  Read-backs that
        wait between tries are not waited for: the next leader reads the pods afresh."""
        deadline = time.monotonic() + timeout
        while (busy := self._draining()) and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(busy, timeout=left)

    def unfinished_binds(self) -> int:
        """Bindings still in flight (or of unknown outcome, being read back): cut off now, each
        may still land on the API server."""
        return sum(1 for t in self._tasks if t.get_name().startswith(("bind:", "resolve:")) and not t.done())

    async def give_up_lead(self, cut_off: int) -> None:
        """At shutdown, after the drain: release the Lease so that another replica takes over at
        once, unless ``cut_off`` Bindings were cut off.  Then it runs out (``leaseDurationSeconds``
        after the last renewal), so that no Binding of this instance lands after another may be
        binding."""
        if self.elector is None:
            return
        if cut_off:
            log.warning("lease left to run out: Bindings were cut off and may still land", cut_off=cut_off)
            return
        await self.elector.release()

    def _draining(self) -> set[asyncio.Task[None]]:
        return {t for t in self._tasks if not t.get_name().startswith(_READ_BACKS)}

    # -- scheduling --------------------------------------------------------------------------
    async def schedule_forever(self) -> None:
        """Wait for the caches, then place batch after batch while leading."""
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        log.info("caches synced", nodes=len(self.cache.nodes), bound_pods=self.cache.held_count)
        if not self.configured.is_set():
            log.error("no pod is placed", why=self._not_configured())
            await self.configured.wait()
        # Build the policy (and import the solver) now rather than inside the first batch.
        await asyncio.to_thread(self._policy_for, self.cache.snapshot().cluster)
        self._solver_loaded = True
        while True:
            await self._leading.wait()
            await self._bind_room.wait()
            quick = self.config.batching.quick_start and self._client_idle()
            # While the client idles, two pods are a burst (``_burst``): draw them at once.
            batch = await self.queue.next_batch(self.quick_size, early=2) if quick else await self.queue.next_batch()
            if not self.is_leader:
                for r in batch:
                    self.queue.requeue(r.key)
                await asyncio.sleep(0.1)  # the Lease lapsed and the step-down has yet to run
                continue
            await self.handle_batch(batch)

    async def handle_batch(self, batch: list[PodRecord]) -> None:
        """``schedule_batch`` for a batch drawn, in the parts ``_isolated`` makes of it; one
        whose handling raises backs off (``_batch_failed``) rather than stop scheduling."""
        for part in self._isolated(batch):
            if not self.is_leader:  # stepped down between parts: the new leader places them
                for r in part:
                    self.queue.requeue(r.key)
                continue
            try:
                await self.schedule_batch(part)
            except Exception as exc:  # a defect must not stop scheduling, nor lose the batch's pods
                self._batch_failed(part, exc)
            else:
                for r in part:
                    self._crashed.discard(r.key)

    def _isolated(self, batch: list[PodRecord]) -> list[list[PodRecord]]:
        """``batch`` in the parts it is handled in: each unit (a pod, or a gang's members) that
        was in a batch whose handling raised alone, first, then the rest together; so a pod that
        sets off a defect neither holds its batchmates back for ever nor goes untold."""
        if len(batch) < 2 or not any(r.key in self._crashed for r in batch):
            return [batch]
        units: dict[str, list[PodRecord]] = defaultdict(list)
        for r in batch:
            units[r.pod.unit].append(r)
        suspects = [rs for rs in units.values() if any(r.key in self._crashed for r in rs)]
        rest = [r for rs in units.values() if not any(r.key in self._crashed for r in rs) for r in rs]
        if len(suspects) > ISOLATED_UNITS:  # halves first, so that a large batch is not solved pod by pod
            half = len(suspects) // 2
            parts = [[r for rs in suspects[:half] for r in rs], [r for rs in suspects[half:] for r in rs]]
        else:
            parts = suspects
        return parts + ([rest] if rest else [])

    def _batch_failed(self, part: list[PodRecord], exc: Exception) -> None:
        """Handling ``part`` raised: its pods still drawn back off; a unit that raised alone is
        told (an internal error is the scheduler's, and the log has the trace)."""
        log.exception("batch failed", pods=[r.key for r in part][:8], size=len(part))
        self.metrics.batch_failed()
        drawn = [r for r in part if not self.cache.holds(r.key, r.uid)]
        alone = len({r.pod.unit for r in part}) == 1
        if len(self._crashed) > 10_000:  # pods long gone are forgotten
            self._crashed.clear()
        self._crashed.update(r.key for r in part)
        if alone:
            message = f"internal error while placing it ({exc!r}); tried again after a backoff"
            for r in drawn:  # not those the batch told already (parked, or backed off)
                if self.queue.in_flight(r.key) and self.queue.current(r.key, r.uid):
                    self.metrics.unschedulable("InternalError")
                    held = self.cache.nomination(r.key)  # room held for it stays, and says so
                    self._write_verdict(r.pod, message, held[0] if held is not None else None)
        self.queue.back_off_drawn(r.key for r in drawn)

    async def keep_warm(self, every: float = 10.0) -> None:
        """While leading and no bind is in flight, hold a connection open per bind slot (``Kube.warm``), so
        that the first Bindings of a burst do not each wait for a TLS handshake with an API
        server busy with the burst's creates."""
        while True:
            if self.is_leader and not self._binds_in_flight and not self.queue.counts().active:
                try:
                    await self.kube.warm(self.warm_connections)
                except Exception as exc:  # never worth stopping the scheduler for
                    log.warning("keeping connections open failed", error=repr(exc))
            await asyncio.sleep(every)

    async def consolidate_forever(self) -> None:
        """Every ``consolidation.intervalSeconds``, a round of ``consolidate``; a round that
        fails is logged, and the next one comes as usual.  A new interval counts at once, from
        the last round (or the start)."""
        last = time.monotonic()
        while True:
            left = last + self.config.consolidation.interval_seconds - time.monotonic()
            if left > 0:
                self._interval_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._interval_changed.wait(), left)
                continue
            last = time.monotonic()
            try:
                await self.consolidate()
            except Exception as exc:
                log.error("consolidation failed", error=repr(exc))

    async def consolidate(self) -> int:
        """Empty the GPU nodes whose pods all may move and fit on other nodes in use
        (``plan_consolidation``), evicting those pods; how many nodes.  Only while leading, with
        consolidation on, and the cluster quiet: no pod waiting for a batch or a retry, none in a
        batch, no room held for a preempting pod, and none of the pods evicted by the last round
        still on the books (their replacements are placed first)."""
        c = self.config.consolidation
        if not c.enabled or not self.is_leader:
            return 0
        if time.monotonic() >= self._round_deadline:  # the last round's pods are waited for no longer
            self._consolidating.clear()
            self._awaiting.clear()
        self._consolidating = {(k, uid) for k, uid in self._consolidating if self.cache.holds(k, uid)}
        if self._consolidating:
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
        placed = self.cache.placed()  # as counted in ``snap``: taken together
        now = time.monotonic()
        self._refused_until = {n: t for n, t in self._refused_until.items() if t > now}
        refused = {i for n in self._refused_until if (i := snap.cluster.index.get(n)) is not None}
        moves = await asyncio.to_thread(
            plan_consolidation, snap.state, placed, c.max_nodes_per_round, list(self.budgets.values()), refused
        )
        if not self.is_leader or not self._quiet() or not self.config.consolidation.enabled:
            return 0  # pods came (or room was held, or it was turned off) during the plan
        moves = self._still_good(moves, snap)
        names = snap.cluster.nodes
        running = self._running_by_owner() if moves else Counter[str]()
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
            self._emptying[node] = [len(m.pods), 0, len(m.pods)]
            self._emptied.add(node)
            for a in m.pods:
                self._consolidating.add((a.pod.key, a.pod.uid))
                self._awaiting[a.pod.owner] = running.get(a.pod.owner, 0)
                self.spawn(self._evict_to_consolidate(a.pod, node, why), f"consolidate:{a.pod.key}")
        if moves:
            self._round_deadline = time.monotonic() + max(600.0, 2 * c.interval_seconds)
        return len(moves)

    def _hold_refilled(self) -> None:
        """Hold the nodes the last round emptied that GPU pods took again once its evictions were
        settled: its pods' replacements went back to them (the batches follow their policy, not
        the plan), and emptying them again would only evict the same work once more."""
        until = time.monotonic() + self._hold_s()
        for node in sorted(self._emptied - self._refused_until.keys()):
            if not self.cache.gpu_pods_on(node):
                continue
            self._refused_until[node] = until
            log.warning("consolidation emptied a node that was filled again", node=node, retry_in_s=self._hold_s())
        self._emptied.clear()

    def _hold_s(self) -> float:
        """How long a node consolidation could not leave idle is left out of rounds."""
        return max(3600.0, 6 * self.config.consolidation.interval_seconds)

    def _still_good(self, moves: list[Move], snap: Snapshot) -> list[Move]:
        """The moves of a plan made on ``snap`` that still hold on the books as they are now: a
        batch may have bound pods (to the node being emptied, or to the room its pods were to
        take) while the plan was made."""
        fresh = self._books()
        if not moves or fresh.cluster is not snap.cluster:
            return []
        there: dict[int, set[str]] = defaultdict(set)
        for a in self.cache.placed():  # as counted in ``fresh``: taken together
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
        return self.cache.snapshot(busy=self.busy_gpus(), sealed=self.mig.sealed(), **self._keep())

    def _quiet(self) -> bool:
        """No pod waits for a batch or a retry, none is in a batch, no room is held, and no node
        is being re-partitioned (pods wait for its layout, with gang members planned elsewhere)."""
        counts = self.queue.counts()
        return not (counts.active or counts.backoff or counts.in_flight or self.cache.nominations or self.mig.jobs)

    def _running_by_owner(self) -> Counter[str]:
        """Pods on the books not being deleted, per controller UID."""
        return Counter(a.pod.owner for a in self.cache.placed() if a.pod.owner and not a.pod.terminating)

    async def _evict_to_consolidate(self, pod: Pod, node: str, why: str) -> None:
        """Evict one pod of a node a round is emptying; the node counts as emptied once all of
        its pods are evicted."""
        done = await self.binder.evict(pod, node, why)
        tally = self._emptying.setdefault(node, [1, 0, 1])
        tally[0] -= 1
        if done:
            self.metrics.consolidation(0, 1)
        else:
            tally[1] += 1
            self._consolidating.discard((pod.key, pod.uid))
        if tally[0] <= 0:
            if not tally[1]:
                self.metrics.consolidation(1, 0)
            else:  # left in use: not chosen again each round, each evicting some or none
                hold = self._hold_s()
                self._refused_until[node] = time.monotonic() + hold
                self._emptied.discard(node)
                log.warning("consolidation left a node in use", node=node, refused=tally[1], retry_in_s=hold)
            del self._emptying[node]

    def _policy_for(self, cluster: Cluster) -> Policy:
        """The policy for ``cluster`` under the config as it is now: the first one is built in a
        worker thread, and a reload that lands meanwhile must not be overwritten by it."""
        params = self.config.solver_params(self.settings.seed)
        if self._policy is None or self._policy_cluster is not cluster or self._policy_params != params:
            typical = TypicalPods((), ())
            self._policy = make_policy(self.settings.policy, cluster, typical, self.settings.seed, params)
            self._policy_cluster = cluster
            self._policy_params = params
        return self._policy

    async def schedule_batch(self, batch: list[PodRecord]) -> None:
        """Solve one batch and start its binds; every pod ends bound, parked or backed off."""
        self._batches += 1
        batch_id = self._batches
        start = time.perf_counter()
        invalid = [r for r in batch if r.error]
        for r in invalid:
            self.tell_unschedulable(r.pod, r.error, "InvalidRequest")
        todo: list[PodRecord] = []
        waiting = 0  # pods held back by their volumes
        held_back: dict[str, str] = {}  # gang -> why one of its members cannot be bound yet
        mig = self.config.mig
        self.cache.set_repartition(
            "idle-nodes" if mig.repartition and time.monotonic() >= self.mig.off_until else "off",
            {p for job in self.mig.jobs.values() for _, layout in job.layouts for p in layout.counts},
        )
        self.mig.expire_asks()
        aside = self.mig.set_aside()
        for r in batch:
            if not r.error and (r.key, r.uid) in aside:  # told already; back once the layout is done
                self.queue.park(r.key)
                waiting += 1
                if r.pod.gang is not None:
                    node = aside[r.key, r.uid]
                    held_back.setdefault(
                        r.pod.gang.name, f"members wait for node {node} to be re-partitioned into MIG instances"
                    )
                continue
            if r.error:
                if r.pod.gang is not None:
                    cause = r.error.removeprefix(f"pod {r.key}: ")
                    held_back.setdefault(r.pod.gang.name, f"member {r.key} cannot be scheduled: {cause}")
                continue
            if self.cache.holds(r.key, r.uid):  # a bind of it is already in flight or done: never twice
                self.queue.done(r.key)
                continue
            volumes = self.claims.problem(r.key, r.uid, r.claims, r.ephemeral_claims) if r.claims else ""
            if volumes:
                self.tell_unschedulable(r.pod, volumes, "Volumes")
                waiting += 1
                if r.pod.gang is not None:
                    held_back.setdefault(r.pod.gang.name, f"member {r.key}: {volumes}")
                continue
            todo.append(r)
        todo = self._bind_nominated(todo)
        disagree = gang_disagreements(r.pod for r in todo)
        if disagree:  # one gang, two sets of rules: no member's may win by arriving first
            split = {r.key: disagree[g.name] for r in todo if (g := r.pod.gang) is not None and g.name in disagree}
            for r in todo:
                if r.key in split:
                    self.tell_unschedulable(r.pod, split[r.key], "InvalidRequest")
            invalid += [r for r in todo if r.key in split]
            todo = [r for r in todo if r.key not in split]
        first: frozenset[str] = frozenset()  # pods within their tenant's quota: placed first
        limit_usage: dict[str, int] = {}
        tenants = self.tenants  # the rules usage is counted by (a reload during the solve may change them)
        if self.tenants.active and todo:
            todo = self._wait_in_rooms(todo)
            limit_usage = self._limit_usage(todo)
            admitted, over = self.tenants.admit([r.pod for r in todo], limit_usage)
            at_limit: list[tuple[Pod, Explanation | _Verdict]] = []
            gangs_at_limit: dict[str, dict[str, tuple[Pod, str]]] = defaultdict(dict)
            lowest = self._lowest_by_tenant() if over else {}
            alone: list[tuple[Pod, _Verdict]] = []
            for r in todo:
                if r.key not in over:
                    continue
                if r.pod.gang is not None:
                    gangs_at_limit[r.pod.gang.name][r.key] = (r.pod, over[r.key])
                else:
                    alone.append((r.pod, _Verdict(over[r.key], "TenantLimit")))
            # A pod may take over the room held for a lower one of its tenant, within the limit,
            # before it looks for pods to preempt.
            # Within the limit beside the pods of this batch it admitted, which the solve places.
            admitted_demand: Counter[str] = Counter()
            for p in admitted:
                admitted_demand[self.tenants.of(p)] += demand_of(p)
            taking = self._take_over(alone, None, admitted_demand)
            if len(taking) < len(alone):  # rooms taken over count toward the limit from now on
                limit_usage = self._limit_usage(todo)
            for p, verdict in taking:
                if p.priority > lowest.get(self.tenants.of(p), p.priority):
                    at_limit.append((p, verdict))
                else:  # nothing of its tenant below it to preempt
                    self.tell_unschedulable(p, verdict.message, verdict.reason)
            for name, told in list(gangs_at_limit.items()):
                floor = min(p.priority for p, _ in told.values())
                tenant = self.tenants.of(next(iter(told.values()))[0])
                if floor <= lowest.get(tenant, floor):  # nothing of its tenant below it to preempt
                    for p, message in told.values():
                        self.tell_unschedulable(p, message, "TenantLimit")
                    del gangs_at_limit[name]
            if at_limit or gangs_at_limit:  # they may preempt pods of lower priority of their tenant, in their room
                await self._preempt_for(at_limit, list(gangs_at_limit.values()), batch_id, None, at_limit=True)
            waiting += len(over)
            todo = [r for r in todo if r.key not in over]
            usage = self.cache.tenant_usage(self.tenants, without=[r.key for r in todo])
            first = frozenset(self.tenants.guaranteed(admitted, usage))
            if any(p.affinity for p in admitted if p.key in first):
                # A pod that must run beside a peer of the same batch is solved with it.
                first = frozenset()
        if not todo:  # every pod told why already (or in flight): nothing to solve
            log.info(
                "batch",
                batch_id=batch_id,
                pods=len(batch),
                placed=0,
                unplaced=waiting,
                invalid=len(invalid),
                policy=None,
                status="NOT_SOLVED",
                total_ms=round((time.perf_counter() - start) * 1000, 1),
            )
            return
        freed = set(self._room_ready(r.pod for r in todo))
        pods = self._count_running_members([r.pod for r in todo])
        joinable = {n: job for n, job in self.mig.jobs.items() if job.layouts}  # offered as instances to come
        snap = self.cache.snapshot(
            free=freed, busy=self.busy_gpus(), sealed=self.mig.sealed(), coming=self.mig.coming(), **self._keep(pods)
        )
        if snap.kept:
            self._kept_last = tuple((snap.cluster.nodes[i].name, g) for i, g in snap.kept)
        self._check_headroom_models(snap.cluster)
        policy = self._policy_for(snap.cluster)
        for p in pods:
            self._shapes[TypicalShape.of(p)] += 1
        typical = TypicalPods.from_counts(self._shapes)
        # At the start of a burst the client is idle and more pods wait: bind the greedy
        # plan at once when it places every pod, rather than leave the client idle.
        quick = self.config.batching.quick_start and self._client_idle() and self._burst()
        try:
            plan, after, frag = await asyncio.to_thread(_solve, policy, pods, snap.state, typical, quick, first)
        except Exception as exc:
            log.error("solve failed; batch requeued with backoff", batch_id=batch_id, error=repr(exc))
            for r in todo:
                self.queue.backoff(r.key)
            return
        problems = plan_problems(plan, snap.state, pods)
        if problems:
            log.error("plan rejected; batch requeued", batch_id=batch_id, problems=problems[:5])
            for r in todo:
                self.queue.backoff(r.key)
            return
        after_low = after  # what pods below the headroom's priority are weighed against
        if snap.kept:  # pods of high priority left out may take the GPUs kept free for them
            placed, after, frag = await self._place_on_kept(plan, after, frag, snap, policy, typical, quick, batch_id)
            if placed is not plan:  # the GPUs still kept are idle in ``after``: not to pods of low priority
                taken = {(a.node, g) for a in placed.assignments[len(plan.assignments) :] for g in a.gpus}
                snap = replace(snap, kept=tuple(c for c in snap.kept if c not in taken))
                after_low = after.with_gpus_at(snap.kept, GPU_MILLI)
                plan = placed
        if not self.is_leader:  # lost the Lease during the solve: the new leader places these
            log.info("leadership lost during a solve; batch requeued", batch_id=batch_id, pods=len(todo))
            for r in todo:
                self.queue.requeue(r.key)
            return
        plan = self._recheck(plan, snap, batch_id)
        # Pods of one tenant that together would pass its limit: the last in queue order wait
        # for the next batch, which weighs them beside what this one bound.
        order = {p.key: i for i, p in enumerate(pods)}
        if self.tenants is not tenants and self.tenants.active:  # reloaded during the solve: count anew
            limit_usage = self._limit_usage(todo)
        over_limit = (
            self.tenants.trim(sorted((a.pod for a in plan.assignments), key=lambda p: order[p.key]), limit_usage)
            if self.tenants.active
            else set()
        )
        # A gang whose member was deleted or replaced during the solve would run short of it:
        # none of its members is bound, and the rest are drawn again with the gang as it is now.
        broken = {
            a.pod.gang.name
            for a in plan.assignments
            if a.pod.gang is not None and not self.queue.current(a.pod.key, a.pod.uid)
        }
        if broken:
            log.info("gang changed during the solve; its members drawn again", batch_id=batch_id, gangs=sorted(broken))
        names = snap.cluster.nodes
        untaken = False  # a placement of the plan not acted on: what it counted as taken is free
        # A node the plan re-partitions takes no GPU pod until the MIG manager is done with it:
        # its MIG pods wait for the new instances, other GPU pods are drawn again.  A gang with a
        # member there is bound whole or not at all: its MIG members there wait and the rest are
        # told so, or, with none of them waiting, all its members are drawn again.
        parted = {n for n, _, _ in plan.partitions}
        for_layout: dict[int, list[Pod]] = defaultdict(list)
        coming = {i for n in joinable if (i := snap.cluster.index.get(n)) is not None}
        gangs_parted = {a.pod.gang.name for a in plan.assignments if a.node in parted and a.pod.gang is not None}
        gangs_waiting = {
            a.pod.gang.name: names[a.node].name
            for a in plan.assignments
            if (a.node in parted or a.node in coming) and a.pod.mig_profile and a.pod.gang is not None
        }
        gang_waits: list[tuple[Pod, str]] = []  # members waiting beside a layout, and their planned node
        sealed_at_solve = set(snap.sealed)
        sealed_names = {names[i].name for i in sealed_at_solve}
        sealed_now = self.mig.sealed()

        def unsealed_since(a: Assignment) -> bool:
            """Its layout given up, or its node sealed (set back to whole GPUs), during the solve."""
            name = names[a.node].name
            joins = a.pod.mig_profile and name in joinable and self.mig.jobs.get(name) is joinable[name]
            gpu = bool(a.pod.mig_profile or a.pod.num_gpu or a.pod.gpu_milli)
            return not joins and (
                bool(a.pod.mig_profile and a.node in sealed_at_solve) or (gpu and name in sealed_now - sealed_names)
            )

        # A gang with such a member is drawn again whole, as one changed during the solve.
        broken |= {a.pod.gang.name for a in plan.assignments if a.pod.gang is not None and unsealed_since(a)}
        for a in plan.assignments:
            if (a.pod.gang is not None and a.pod.gang.name in broken) or a.pod.key in over_limit:
                self.queue.requeue(a.pod.key)
                untaken = True
                continue
            if self.cache.holds(a.pod.key, a.pod.uid):  # bound by someone else during the solve
                self.queue.done(a.pod.key)
                untaken = True
                continue
            if a.node in parted and a.pod.mig_profile:
                for_layout[a.node].append(a.pod)
                continue
            name = names[a.node].name
            if a.pod.mig_profile and name in joinable and self.mig.jobs.get(name) is joinable[name]:
                self.mig.join(name, a.pod)  # on an instance to come
                continue
            if unsealed_since(a):
                self.queue.requeue(a.pod.key)
                untaken = True
                continue
            member_of = a.pod.gang.name if a.pod.gang is not None else None
            if member_of in gangs_waiting:
                gang_waits.append((a.pod, names[a.node].name))
                continue
            if member_of in gangs_parted or (a.node in parted and (a.pod.num_gpu or a.pod.gpu_milli)):
                self.queue.requeue(a.pod.key)
                untaken = True
                continue
            self._start_bind(a.pod, names[a.node].name, a.gpus)
        for a in plan.assignments:  # a node a plan counts on is not idle: not set back to whole GPUs now
            self.mig.idle_since.pop(names[a.node].name, None)
        if for_layout:
            self.mig.repartition(plan, snap.cluster, for_layout, batch_id, after_low, {r.key for r in batch})
        for p, planned in gang_waits:
            assert p.gang is not None
            node = gangs_waiting[p.gang.name]
            if node in self.mig.jobs:
                self.mig.jobs[node].beside[p.key] = (p.uid, planned)
                waits = f"gang {p.gang.name}: members wait for node {node} to be re-partitioned into MIG instances"
                self.tell_unschedulable(p, f"{waits}; no member is placed until all of them can be, together.", "Gang")
            else:  # the layout could not be asked for: solved again
                self.queue.backoff(p.key)
        members = Counter(p.gang.name for p in pods if p.gang is not None)
        preempting: list[tuple[Pod, Explanation]] = []
        rejected: dict[str, list[Pod]] = defaultdict(list)  # gang -> its members left out
        if untaken and plan.unplaced:
            # The pods the plan left out were weighed against capacity it gave to pods that are
            # not bound after all: drawn again with the books as they are, not told they do not fit.
            log.info("placements not bound; pods left out drawn again", batch_id=batch_id, pods=len(plan.unplaced))
        for p in plan.unplaced:
            if self.cache.holds(p.key, p.uid):  # bound by someone else during the solve
                self.queue.done(p.key)
                continue
            if untaken:
                self.queue.requeue(p.key)
                continue
            if p.gang is not None:
                rejected[p.gang.name].append(p)
                continue
            seen = after_low if self._below_headroom(p) else after
            e = explain(p, seen)
            if e.fits or not p.preempts:
                self.tell_unschedulable(p, self._notes(p, e.message, snap, seen), e.reason)
            elif not self._waits_for_victims(p, e, seen, freed):
                preempting.append((p, e))
        gangs: list[dict[str, tuple[Pod, str]]] = []  # gangs that may preempt: key -> member, why it waits
        for name, group in rejected.items():
            gang = group[0].gang
            assert gang is not None
            # A member left out is what the gang waits for only if the rest fall short of its
            # minimum (already bound members counted in); otherwise capacity is.
            why = held_back.get(name) if members[name] < gang.min_members else None
            low_gang = any(self._below_headroom(p) for p in group)  # the kept GPUs are for all its members or none
            told = {
                p.key: (
                    p,
                    f"gang {name}: {why}; no member is placed until all of them can be, together."
                    if why
                    else self._notes(p, explain_gang(p, members[name], after_low), snap, after_low, low_gang),
                )
                for p in group
            }
            if why is None and members[name] >= gang.min_members and gang_fits(group, after_low):
                deferred = (
                    f"gang {name}: its {len(group)} members fit together now, but the batch solve left them out "
                    "to keep capacity for the rest of the batch; they are retried with the next batch."
                )
                for p in group:  # as a pod that fits: backed off, not parked
                    self.tell_unschedulable(p, deferred, DEFERRED)
            elif members[name] < gang.min_members or not all(p.preempts for p in group):
                for p, message in told.values():  # preempting would not help: room held is given up
                    self.tell_unschedulable(p, message, "Gang")
            elif not self._gang_waits_for_victims(told, after_low, freed):
                gangs.append(told)
        if preempting or gangs:
            await self._preempt(preempting, gangs, batch_id, snap)
        stats = plan.stats
        gap = stats.gap_pct
        solve_s = stats.wall_ms / 1000
        self.metrics.observe_batch(len(batch), solve_s, gap / 100 if not math.isnan(gap) else math.nan)
        if snap.busy or snap.kept:  # they count as full in ``after``: the gauges say what pods hold
            books = self.cache.snapshot().state
            if len(typical):
                frag = await asyncio.to_thread(cluster_frag_ratio, books, typical, ~books.cluster.cordoned)
            self._cluster_metrics(books, frag)
        else:
            self._cluster_metrics(after, frag)
        log.info(
            "batch",
            batch_id=batch_id,
            pods=len(batch),
            placed=len(plan.assignments),
            unplaced=len(plan.unplaced) + waiting,
            invalid=len(invalid),
            policy=stats.policy,
            status=stats.status,
            solve_ms=round(stats.wall_ms, 1),
            gap_pct=None if math.isnan(gap) else round(gap, 3),
            nodes=len(snap.cluster),
            busy_gpus=snap.busy,
            kept_gpus=len(snap.kept),
            within_quota=len(first) if self.tenants.active else None,
            generation=snap.generation,
            total_ms=round((time.perf_counter() - start) * 1000, 1),
        )

    def _count_running_members(self, pods: list[Pod]) -> list[Pod]:
        return count_running_members(pods, self.cache)

    def _recheck(self, plan: Plan, snap: Snapshot, batch_id: int) -> Plan:
        """Events seen during the solve may have taken capacity: keep only what still fits."""
        if self.cache.generation == snap.generation:
            return plan
        fresh = self.cache.snapshot(
            free=self._room_ready((*(a.pod for a in plan.assignments), *plan.unplaced)),
            sealed=self.mig.sealed(),
            coming=self.mig.coming(),
        )
        if fresh.cluster is not snap.cluster and not _same_offers(snap.cluster, fresh.cluster):
            # Nodes came, went or changed: the plan, node by node name, against them as they are
            # now (a label no pod reads changing, or a node added, leaves it as good as it was).
            moved = _renumbered(plan, snap.cluster, fresh.cluster)
            problems = plan_problems(moved, fresh.state) if isinstance(moved, Plan) else [moved]
        else:
            problems = plan_problems(plan, fresh.state)
        if not problems:
            return plan
        log.warning("plan no longer fits after the solve; batch requeued", batch_id=batch_id, problems=problems[:3])
        for p in [a.pod for a in plan.assignments] + list(plan.unplaced):
            self.queue.requeue(p.key)  # all of the batch: pods it left out are in flight too
        return Plan((), (), plan.stats)

    def _room_ready(self, pods: Iterable[Pod]) -> list[str]:
        """Keys of those of ``pods`` that hold room whose victims are all gone: the room is theirs
        in a solve (the others' victims still hold it; and room left free for a pod is free for
        every pod of its batch, so none is freed before it is needed).  A gang's members are
        freed only together, once every one's victims are gone: until then the gang cannot be
        placed, and the room freed for one member would go to other pods."""
        ready: list[str] = []
        waiting: set[str] = set()  # gangs a member of which still waits for its victims
        gang_of: dict[str, str] = {}
        for p in pods:
            held = self.cache.nomination(p.key)
            if held is None:
                continue
            if p.gang is not None:
                gang_of[p.key] = p.gang.name
                if held[2]:
                    waiting.add(p.gang.name)
            if not held[2]:
                ready.append(p.key)
        return [k for k in ready if gang_of.get(k) not in waiting]

    def _start_bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> None:
        record = self.queue.record(pod.key)
        if pod.gang is not None and record is not None and record.uid == pod.uid:
            # Its gang as written, not as ``_count_running_members`` counted it for this solve:
            # the books read the gang's minimum from its members (``gang_budgets``).
            self.cache.assume(record.pod, node, gpus)
        else:
            self.cache.assume(pod, node, gpus)
        self.mig.idle_since.pop(node, None)
        self._binds_in_flight += 1
        self._binds_unstarted += 1
        self.spawn(self._bind(pod, node, gpus), f"bind:{pod.key}")
        if self._binds_in_flight >= self.max_binds_in_flight:
            self._bind_room.clear()

    def _bind_nominated(self, todo: list[PodRecord]) -> list[PodRecord]:
        """Bind each pod whose victims are gone to the room held for it, as kube-scheduler tries
        a pod's nominated node first: no other pod of the batch may take that room.  A gang's
        members are bound so only all together.  The rest of ``todo`` (and such pods when their
        room no longer fits them) is solved as usual."""
        units: dict[str, list[PodRecord]] = defaultdict(list)  # a pod, or a gang's members
        for r in todo:
            units[r.pod.unit].append(r)
        bound = {r.key for group in units.values() if self._bind_rooms(group) for r in group}
        return [r for r in todo if r.key not in bound]  # in their order: it matters to greedy policies

    def _bind_rooms(self, records: list[PodRecord]) -> bool:
        """Bind ``records`` (one pod, or the members of one gang in the batch) to the rooms held
        for them, if each holds one whose victims are gone and they all fit there together."""
        rooms = [self.cache.nomination(r.key) for r in records]
        held = [h for h in rooms if h is not None and not h[2]]
        if len(held) < len(records):
            return False
        snap = self.cache.snapshot(free=[r.key for r in records], sealed=self.mig.sealed())
        pods = self._count_running_members([r.pod for r in records])
        placed: list[Assignment] = []
        problems: list[str] = []
        for p, (node, gpus, _) in zip(pods, held, strict=True):
            i = snap.cluster.index.get(node)
            if i is None:
                problems = [f"node {node} is gone"]
                break
            placed.append(Assignment(p, i, gpus))
        else:
            problems = plan_problems(Plan(tuple(placed), ()), snap.state, pods)
        if problems:
            log.info(
                "held room no longer fits; solved with the batch",
                pods=[r.key for r in records],
                nodes=sorted({h[0] for h in held}),
                problems=problems[:3],
            )
            return False
        for p, (node, gpus, _) in zip(pods, held, strict=True):
            self._start_bind(p, node, gpus)
        return True

    def _waits_for_victims(self, pod: Pod, e: Explanation, after: ClusterState, freed: Collection[str]) -> bool:
        """Whether ``pod`` preempted pods that are still leaving: it is told so and waits for
        them, and preempts no more.  Once they are gone and it still does not fit in the room
        they left (``freed``: the pods whose room the solve left free), or once its node could
        not take it anyway (gone, tainted, no longer selected), the room held for it is given
        up, and it may preempt again.  Should they go during the solve, it is drawn again at
        once, to its room.  Room is held likewise for a pod that preempted under another leader
        (``status.nominatedNodeName``), as kube-scheduler's nominator does."""
        held = self._held_room(pod)
        if held is None:
            return False
        node, _, left = held
        if not after.cluster.could_take(pod, node) or (not left and pod.key in freed):
            self.give_up_room(pod.key)
            return False
        if not left:  # its victims left during the solve, which counted them: its room was never tried
            self.queue.requeue(pod.key)
            return True
        message = f"{e.message} Waiting for {left} preempted pod(s) to leave node {node}."
        self.tell_unschedulable(pod, message, e.reason, nominated=node)
        return True

    def _gang_waits_for_victims(
        self, told: dict[str, tuple[Pod, str]], after: ClusterState, freed: Collection[str]
    ) -> bool:
        """``_waits_for_victims`` for the members of one gang left out (``told``: key -> member,
        why it is left out): while any member's victims are leaving, every member waits and the
        gang preempts no more.  Once they are all gone and the gang still does not fit in its
        room, or once a member's node could not take it anyway, every member's room is given up."""
        rooms = {k: held for k, (p, _) in told.items() if (held := self._held_room(p)) is not None}
        left = sum(held[2] for held in rooms.values())
        tried = all(k in freed for k in rooms)  # the solve left all its room free
        if (
            not rooms
            or (not left and tried)
            or any(not after.cluster.could_take(told[k][0], held[0]) for k, held in rooms.items())
        ):
            for k in rooms:
                self.give_up_room(k)
            return False
        if not left:  # the last victims left during the solve: drawn again at once, to its room
            for k in told:
                self.queue.requeue(k)
            return True
        nodes = ", ".join(sorted({held[0] for held in rooms.values()}))
        for k, (p, message) in told.items():
            node = rooms[k][0] if k in rooms else None
            self.tell_unschedulable(
                p, f"{message} Waiting for {left} preempted pod(s) to leave node(s) {nodes}.", "Gang", nominated=node
            )
        return True

    def _held_room(self, pod: Pod) -> tuple[str, tuple[int, ...], int] | None:
        """The room held for ``pod`` (``Cache.nomination``); held now when it preempted under
        another leader (``status.nominatedNodeName``) and its victims are still leaving."""
        held = self.cache.nomination(pod.key)
        record = self.queue.record(pod.key)
        if held is None and record is not None and record.nominated and self.adopt_room(pod, record.nominated):
            held = self.cache.nomination(pod.key)
        return held

    def follow_nomination(self, pod: Pod, node: str) -> None:
        """A pending pod's ``status.nominatedNodeName`` as the watch shows it: room held from
        another leader's word follows it (given up when it moves or is cleared, held again where
        it points); room this instance placed is its own business."""
        if pod.key in self.placed_here:
            return
        held = self.cache.nomination(pod.key)
        if held is not None and held[0] != node:
            self.give_up_room(pod.key)
        if node:
            self.adopt_room(pod, node)

    def adopt_room(self, pod: Pod, node: str) -> bool:
        """Hold room for ``pod`` on ``node`` (its ``status.nominatedNodeName``) as the last leader
        held it: while pods it preempted there are leaving (``Cache.adopt_nomination``); for a
        gang member, which may have held room without victims, also where it fits as things are.
        True when room is now held.  Never for a pod whose nominatedNodeName this instance has
        written: room it gave up is not held again from its own status write, nor from an
        older one the watch shows late."""
        if pod.key in self.placed_here:
            return False
        if self.cache.adopt_nomination(pod, node):
            return True
        if pod.gang is None or self.cache.nomination(pod.key) is not None:
            return False
        snap = self.cache.snapshot()
        i = snap.cluster.index.get(node)
        if i is None or not snap.state.pod_mask(pod)[i]:
            return False
        self.cache.nominate(pod, node, GPU_CHOICE.gpus(pod, snap.state, i), ())
        return True

    async def _preempt(
        self,
        pods: list[tuple[Pod, Explanation]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None = None,
    ) -> None:
        """Look for running pods of lower priority whose eviction lets each of ``pods`` fit, and
        each of ``gangs`` (key -> member, why it is left out) fit whole; evict them, hold their
        room, and tell every pod where it stands (``batch``: the batch's snapshot, for what it
        kept from the pods: busy GPUs, GPUs kept free).  With tenants, a pod within its
        tenant's quota first reclaims GPUs that other tenants borrowed, and preempts pods of
        lower priority (of its own tenant) only where that finds nothing."""
        pods = self._take_over(pods, batch)
        # Pods at the headroom's priority or more may have the kept GPUs; those below may not.
        # Searched together, the kept GPUs would be out of reach of both: the first look first
        # (reclaim, then preemption), and the others only if they evict nobody (else they look
        # again once victims left).
        if self.config.headroom.gpus:
            high = [(p, e) for p, e in pods if not self._below_headroom(p)]
            high_gangs = [g for g in gangs if not any(self._below_headroom(p) for p, _ in g.values())]
            low = [(p, e) for p, e in pods if self._below_headroom(p)]
            low_gangs = [g for g in gangs if any(self._below_headroom(p) for p, _ in g.values())]
            if (high or high_gangs) and (low or low_gangs):
                if await self._preempt_pass(high, high_gangs, batch_id, batch):
                    told_now = [(p, self._notes(p, e.message, batch), e.reason) for p, e in low]
                    told_now += [(p, message, "Gang") for told in low_gangs for p, message in told.values()]
                    for p, message, reason in told_now:  # as things are after the search
                        if self.cache.holds(p.key, p.uid):  # bound by someone else meanwhile
                            self.queue.done(p.key)
                        elif self.queue.current(p.key, p.uid):
                            self.tell_unschedulable(p, message, reason)
                        else:  # deleted, or created again under its name: the queue settles it
                            self.queue.requeue(p.key)
                    return
                pods, gangs = low, low_gangs
        await self._preempt_pass(pods, gangs, batch_id, batch)

    async def _preempt_pass(
        self,
        pods: list[tuple[Pod, Explanation]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None,
    ) -> bool:
        """One pass of ``_preempt`` (pods all of one side of the headroom's priority, or the
        headroom off): with tenants, reclaims first, then preemption for what they left; whether
        anything is evicted."""
        evicting = False
        if (pods or gangs) and self.tenants.active and self.tenants.reclaim:
            left: list[tuple[Pod, Explanation]] = []
            left_gangs: list[dict[str, tuple[Pod, str]]] = []
            evicting = await self._preempt_for(pods, gangs, batch_id, batch, reclaim=left, reclaim_gangs=left_gangs)
            pods, gangs = left, left_gangs
        lowest = self.cache.lowest_priority()
        hopeless = [(p, e) for p, e in pods if lowest is None or p.priority <= lowest]
        for p, e in hopeless:  # every running pod matters as much: told as usual, at no cost
            self.tell_unschedulable(p, self._notes(p, e.message, batch), e.reason)
        pods = [(p, e) for p, e in pods if lowest is not None and p.priority > lowest]
        for told in [g for g in gangs if lowest is None or min(p.priority for p, _ in g.values()) <= lowest]:
            for p, message in told.values():
                self.tell_unschedulable(p, message, "Gang")
        gangs = [g for g in gangs if lowest is not None and min(p.priority for p, _ in g.values()) > lowest]
        if not pods and not gangs:
            return evicting
        return await self._preempt_for(pods, gangs, batch_id, batch) or evicting

    def _take_over(
        self, pods: list[tuple[Pod, _Why]], batch: Snapshot | None, beside: Mapping[str, int] | None = None
    ) -> list[tuple[Pod, _Why]]:
        """Of ``pods``, those that do not take over room held for a pod of lower priority (not
        a gang's; of its own tenant, with tenants) while its victims leave: a pod that fits
        there, those victims gone, is nominated there in its place, evicting no one, and the
        pod of lower priority gives it up and looks again (kube-scheduler counts a nominated pod
        only against pods of no higher priority than its own, and clears the nominations it
        outranks).  So may a pod its tenant's limit holds back, as ``_room_for`` keeps to it
        (``beside``: GPU demand by tenant the batch admitted besides, held to the limit too)."""
        left: list[tuple[Pod, _Why]] = []
        for p, e in sorted(pods, key=lambda pe: -pe[0].priority):
            live = self.queue.current(p.key, p.uid) and not self.cache.holds(p.key, p.uid)
            room = self._room_for(p, beside) if live and p.preempts and p.gang is None and self.is_leader else None
            if room is None:
                left.append((p, e))
                continue
            taken, node, gpus = room
            lower = taken.pod
            self.cache.unnominate(lower.key)
            self.placed_here.add(p.key)
            self.cache.nominate(p, node, gpus, [v.pod for v in taken.victims], self._reclaimed(taken))
            log.info(
                "room taken over",
                pod=p.key,
                priority=p.priority,
                node=node,
                from_pod=lower.key,
                from_priority=lower.priority,
                victims=[v.pod.key for v in taken.victims],
            )
            said = (
                f"The room held for it on node {node} was taken by pod {p.key}, of higher priority "
                f"({p.priority} > {lower.priority}); it looks again."
            )
            if self.queue.current(lower.key, lower.uid):
                self._tell_room_lost(lower, said)
            leaving = f", whose {len(taken.victims)} preempted pod(s) are leaving" if taken.victims else ""
            message = f"{e.message} Taking the room held on node {node} for pod {lower.key} of lower priority{leaving}."
            self.tell_unschedulable(p, self._notes(p, message, batch), e.reason, nominated=node)
            if not taken.victims:  # its room is ready: bound there with the next batch
                self._wake_one(p.key)
        return left

    def _tell_room_lost(self, pod: Pod, message: str, wake: bool = True) -> None:
        """``pod`` (queued, wherever it is) no longer holds room: its Event and condition say so,
        with no nominated node; and, parked, it looks again (with ``wake``).  Its nominatedNodeName
        is this instance's word from now on: the last leader's, until the cleared one reaches the
        watch, holds no room again (``adopt_room``)."""
        if self.is_leader:
            self.placed_here.add(pod.key)
        self._write_verdict(pod, message, None)
        if wake:
            self._wake_one(pod.key)

    def _wake_one(self, key: str) -> None:
        """The pod ``key``, parked, looks again at once."""
        self.queue.move_all(lambda r: r.key == key)

    def _room_for(self, pod: Pod, beside: Mapping[str, int] | None = None) -> tuple[Room, str, tuple[int, ...]] | None:
        """Room held for a pod of lower priority than ``pod`` that ``pod`` fits in once the
        victims it waits for are gone: the room (the lowest priority's first), its node and the
        GPUs ``pod`` would take there.  Not on a node with GPUs busy by utilisation (whose
        holders are not known to leave), nor across tenants (priority does not decide between
        them), nor where its tenant would pass its limit or, for room reclaimed, its quota
        (``_may_take``)."""
        mine = self.tenants.of(pod) if self.tenants.active else None
        busy = self.busy_gpus() or {}
        rooms = [
            r
            for r in self.cache.rooms()
            if r.pod.priority < pod.priority
            and r.pod.gang is None
            and r.pod.key != pod.key
            and not busy.get(r.node)
            and (mine is None or self.tenants.of(r.pod) == mine)
        ]
        if rooms and mine is not None:
            may = self._may_take(pod, beside)
            rooms = [r for r in rooms if may(r, 0)]
        if not rooms:
            return None
        # One look with every such room free (a superset of what any one leaves), then the
        # rooms that pass it one at a time.
        sealed = self.mig.sealed()
        every = self.cache.snapshot(free=[r.pod.key for r in rooms] + [pod.key], sealed=sealed, **self._keep([pod]))
        for room in sorted(rooms, key=lambda r: (r.pod.priority, r.pod.key)):
            i = every.cluster.index.get(room.node)
            if i is None or not every.cluster.could_take(pod, room.node):
                continue
            if not every.state.release(room.victims).pod_mask(pod)[i]:
                continue
            snap = self.cache.snapshot(free=[room.pod.key, pod.key], sealed=sealed, **self._keep([pod]))
            state = snap.state.release(room.victims)
            if state.pod_mask(pod)[i]:
                return room, room.node, GPU_CHOICE.gpus(pod, state, i)
        return None

    def _may_take(self, pod: Pod, beside: Mapping[str, int] | None = None) -> Callable[[Room, int], bool]:
        """Whether ``pod`` may take over a room held for a pod of its tenant (first), evicting
        pods of its tenant whose demand adds up to the second: if it takes its tenant further,
        within its limit, and for room reclaimed (``_reclaimed``), within its quota (GPUs
        reclaimed for a tenant's guarantee are not borrowed past it)."""
        mine = self.tenants.of(pod)
        left = self._limit_left(pod)
        if left is not None and beside:
            left -= beside.get(mine, 0)
        within: list[int] = []  # what the quota still covers, once asked for

        def may(room: Room, freed: int) -> bool:
            more = demand_of(pod) - demand_of(room.pod) - freed
            if more <= 0:
                return True
            if left is not None and more > left:
                return False
            if not self._reclaimed(room):
                return True
            if not within:
                usage = self.cache.tenant_usage(self.tenants, [pod.key])
                within.append(self.tenants.rule(mine).quota - usage.get(mine, 0))
            return more <= within[0]

        return may

    def _reclaimed(self, room: Room) -> bool:
        """Whether ``room`` holds GPUs reclaimed from other tenants: it was reclaimed (or taken
        over from a pod it was), or, held again after a fail-over, waits for pods of another tenant."""
        mine = self.tenants.of(room.pod)
        return room.reclaimed or any(self.tenants.of(v.pod) != mine for v in room.victims)

    def _limit_left(self, pod: Pod) -> int | None:
        """What ``pod``'s tenant may still take under its limit (None: it has none), beside what it
        holds now: the pods this batch bound, its pods being deleted, and the rooms held for its
        pods (but ``pod``'s own)."""
        t = self.tenants.of(pod)
        limit = self.tenants.rule(t).limit
        if limit is None:
            return None
        usage = self.cache.tenant_usage(self.tenants, [pod.key], terminating=True, moving=self._consolidating)
        return limit - usage.get(t, 0)

    async def _preempt_for(
        self,
        pods: Sequence[tuple[Pod, Explanation | _Verdict]],
        gangs: list[dict[str, tuple[Pod, str]]],
        batch_id: int,
        batch: Snapshot | None,
        reclaim: list[tuple[Pod, Explanation]] | None = None,
        at_limit: bool = False,
        reclaim_gangs: list[dict[str, tuple[Pod, str]]] | None = None,
    ) -> bool:
        """One search for ``pods`` and ``gangs``, carried out; whether anything is evicted.
        ``reclaim``: search for reclaims instead (``plan_reclaims``), and leave the pods it finds
        nothing for there, untold, for the preemption search; the gangs, in ``reclaim_gangs``.
        ``at_limit``: the pods are held back by their tenant's limit (``plan_at_limit``)."""
        # A busy GPU that no pod on the books holds stays out of reach: no eviction makes it less
        # busy.  One that pods hold is seen as the books have it, and room on it is taken only
        # where every pod holding it is evicted (``_busy_room_ok``).  The GPUs kept free stay
        # out of reach while any of these pods is below the headroom's priority.
        freeing = [p.key for p, _ in pods] + [k for g in gangs for k in g]
        busy = self.busy_gpus() or {}
        holders = self.cache.holders_of([(n, g) for n, gpus in busy.items() for g in gpus])
        outside = {n: frozenset(g for g in gpus if not holders.get((n, g))) for n, gpus in busy.items()}
        keep = self._keep([p for p, _ in pods] + [p for g in gangs for p, _ in g.values()])
        sealed = self.mig.sealed()
        snap = self.cache.snapshot(free=freeing, busy=outside, sealed=sealed, **keep)
        running = self.cache.preemptible()  # as counted in ``snap``: taken together
        if sealed:  # a node being re-partitioned is offered to no preemption: no victim there
            names = snap.cluster.nodes
            running = [a for a in running if names[a.node].name not in sealed]
        usage = self.cache.tenant_usage(self.tenants, without=freeing) if reclaim is not None else {}
        # What each tenant with a limit may still take, its pods being deleted counted.
        allowance = (
            self.tenants.allowance(
                self.cache.tenant_usage(self.tenants, without=freeing, terminating=True),
                [self.tenants.of(p) for p, _ in pods] + [self.tenants.of(p) for g in gangs for p, _ in g.values()],
            )
            if self.tenants.active
            else None
        )
        looked: list[Pod] = []  # the pods a reclaim search looked for
        budgets: list[Budget] = []
        try:
            budgets = self._budgets(running)
            if at_limit:
                found = await asyncio.to_thread(
                    plan_at_limit,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    self.tenants,
                    budgets=budgets,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                )
            elif reclaim is not None:
                found = await asyncio.to_thread(
                    plan_reclaims,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    self.tenants,
                    usage,
                    budgets=budgets,
                    allowance=allowance,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                    searched=looked,
                )
            else:
                found = await asyncio.to_thread(
                    plan_preemptions,
                    [p for p, _ in pods],
                    snap.state,
                    running,
                    budgets=budgets,
                    gangs=[[p for p, _ in g.values()] for g in gangs],
                    scope=self._scope(),
                    allowance=allowance,
                )
        except Exception as exc:
            log.error("preemption search failed", batch_id=batch_id, error=repr(exc))
            found = []
        if not self.is_leader:
            found = []
        searched = len(found)
        # Not for pods bound or replaced during the search: the rest found room in theirs.
        live = [
            pre
            for pre in found
            if self.queue.current(pre.pod.key, pre.pod.uid) and not self.cache.holds(pre.pod.key, pre.pod.uid)
        ]

        def carried(taken: Sequence[Preemption]) -> list[Preemption]:
            """Of ``taken``, what can be carried out: room on a busy GPU only where all that hold
            it leave, and a MIG pod only on an instance there is."""
            return _on_instances(
                _busy_room_ok(list(taken), busy, holders, snap.cluster) if busy else list(taken), snap.state
            )

        found = carried(live)
        if len(found) < searched:  # some dropped: the others may have counted on their victims
            found = still_standing(found, snap.state)
            kept = {pre.pod.key for pre in found}
            refused = [pre for pre in live if pre.pod.key not in kept]  # ``elsewhere`` takes the single pods
            if refused and reclaim is None and not at_limit and not self.tenants.active:
                # The best answer could not be carried out: the next best, on another node.
                found += await asyncio.to_thread(
                    elsewhere,
                    refused,
                    found,
                    snap.state,
                    running,
                    lambda taken, answer: any(p is answer for p in carried([*taken, answer])),
                    budgets=budgets,
                )
                if not self.is_leader:
                    found = []
        chosen = {pre.pod.key: pre for pre in found}
        evicting = False
        evicted = 0  # victims of the preemptions carried out
        missed: list[tuple[Pod, Explanation | _Verdict]] = []  # pods the search found nothing for
        for p, e in pods:
            pre = chosen.get(p.key)
            if self.cache.holds(p.key, p.uid):  # bound by someone else during the search
                self.queue.done(p.key)
                continue
            if pre is None and self.queue.current(p.key, p.uid):
                missed.append((p, e))
                continue
            if pre is None or not self.queue.current(p.key, p.uid):
                self.tell_unschedulable(p, self._notes(p, e.message, batch), e.reason)
                continue
            why = self._reclaim_note(pre) if reclaim is not None else ""
            node = self._carry_out(pre, snap.cluster, why, reclaimed=reclaim is not None)
            evicting = evicting or bool(pre.victims)
            evicted += len(pre.victims)
            self._log_carried_out(pre, node, batch_id, reclaim is not None)
            if reclaim is not None:
                owners = sorted({self.tenants.of(v.pod) for v in pre.victims})
                message = (
                    f"{e.message} Reclaiming the GPUs of {len(pre.victims)} pod(s) on node {node} from "
                    f"tenant(s) {', '.join(owners)}, past their quota: tenant {self.tenants.of(p)} is within its own."
                )
            else:
                message = f"{e.message} Preempting {len(pre.victims)} pod(s) of lower priority on node {node}."
            self.tell_unschedulable(p, message, e.reason, nominated=node)
        for told in gangs:
            group = [chosen.get(k) for k in told]
            for k, (p, _) in told.items():
                if self.cache.holds(p.key, p.uid):  # bound by someone else during the search
                    self.queue.done(k)
            # Whole or not at all: a member gone or changed during the search leaves the gang
            # short, and then no pod is evicted for it.
            whole = all(pre is not None for pre in group) and all(
                self.queue.current(k, p.uid) and not self.cache.holds(k, p.uid) for k, (p, _) in told.items()
            )
            if not whole:
                current = all(
                    self.queue.current(k, p.uid) and not self.cache.holds(k, p.uid) for k, (p, _) in told.items()
                )
                if reclaim_gangs is not None and current:
                    reclaim_gangs.append(told)  # the preemption search looks next
                    continue
                for k, (p, message) in told.items():
                    if not self.cache.holds(k, p.uid):
                        self.tell_unschedulable(p, message, "Gang")
                continue
            chosen_group = [pre for pre in group if pre is not None]
            nodes = {
                pre.pod.key: self._carry_out(
                    pre,
                    snap.cluster,
                    self._reclaim_note(pre) if reclaim is not None else "",
                    reclaimed=reclaim is not None,
                )
                for pre in chosen_group
            }
            victims = [v for pre in chosen_group for v in pre.victims]
            evicting = evicting or bool(victims)
            evicted += len(victims)
            gang = chosen_group[0].pod.gang
            assert gang is not None
            log.info(
                "reclaim" if reclaim is not None else "preempt",
                batch_id=batch_id,
                gang=gang.name,
                pods=sorted(nodes),
                priority=min(pre.pod.priority for pre in chosen_group),
                nodes=sorted(set(nodes.values())),
                victims=[f"{v.pod.key}@{v.pod.priority}" for v in victims],
                violations=sum(pre.violations for pre in chosen_group),
            )
            where = ", ".join(sorted(set(nodes.values())))
            if reclaim is not None:
                lenders = ", ".join(sorted({self.tenants.of(v.pod) for v in victims}))
                doing = (
                    f"Reclaiming the GPUs of {len(victims)} pod(s) on node(s) {where} from tenant(s) {lenders}, past "
                    f"their quota, to make room for the whole gang: tenant {self.tenants.of(chosen_group[0].pod)} "
                    "is within its own."
                )
            else:
                doing = (
                    f"Preempting {len(victims)} pod(s) of lower priority on node(s) {where} "
                    "to make room for the whole gang."
                )
            for k, (p, message) in told.items():
                self.tell_unschedulable(p, f"{message} {doing}", "Gang", nominated=nodes[k])
        if missed and not at_limit:  # what rooms held for pods they outrank add (carried out above: no two share)
            missed, more = self._through_rooms(missed, freeing, batch_id, reclaim is not None)
            evicting = evicting or bool(more)
            evicted += more
        for p, e in missed:
            if reclaim is not None:
                assert isinstance(e, Explanation)
                reclaim.append((p, e))  # the preemption search looks next
            else:
                self.tell_unschedulable(p, self._notes(p, e.message, batch), e.reason)
        if reclaim is not None:  # counted: the pods (and gang members) within their tenant's quota that looked
            self.metrics.reclaim(len(looked), evicted)
        elif at_limit:
            self.metrics.preemption(len(at_limit_searched(p for p, _ in pods)) + sum(map(len, gangs)), evicted)
        else:
            self.metrics.preemption(len(pods) + sum(map(len, gangs)), evicted)
        return evicting

    def _carry_out(
        self,
        pre: Preemption,
        cluster: Cluster,
        why: str = "",
        *,
        reclaimed: bool = False,
        waits_for: Sequence[Pod] = (),
    ) -> str:
        """Hold the room ``pre`` makes for its pod and start evicting its victims; its node.
        ``why``: what the victims are told, when not priority; ``reclaimed``: the room is
        reclaimed (``Room.reclaimed``); ``waits_for``: pods leaving already that the room waits
        for too (those of a room it takes over)."""
        node = cluster.nodes[pre.node].name
        self.placed_here.add(pre.pod.key)
        victims = [v.pod for v in pre.victims]
        self.cache.nominate(pre.pod, node, pre.placement.gpus, [*victims, *waits_for], reclaimed=reclaimed)
        covered = [v.pod for v in pre.victims if any(b.covers(v.pod) for b in self.budgets.values())]
        self.evicted_uncounted.update((v.key, v) for v in covered)
        for v in pre.victims:
            self.spawn(self._evict(v.pod, pre.pod, node, why), f"preempt:{v.pod.key}")
        return node

    def _log_carried_out(self, pre: Preemption, node: str, batch_id: int, reclaim: bool, **more: str) -> None:
        """The one log line of a preemption (or reclaim) carried out."""
        log.info(
            "reclaim" if reclaim else "preempt",
            batch_id=batch_id,
            pod=pre.pod.key,
            priority=pre.pod.priority,
            node=node,
            victims=[f"{v.pod.key}@{v.pod.priority}" for v in pre.victims],
            violations=pre.violations,
            **more,
            **({"tenant": self.tenants.of(pre.pod)} if reclaim else {}),
        )

    def _budgets(self, running: Sequence[Assignment]) -> list[Budget]:
        """The disruption budgets as preemption counts them, beside ``running`` (the pods it may
        evict): less what was evicted here since their status was written, and a budget per
        running gang (``gang_budgets``)."""
        for k, v in list(self.evicted_uncounted.items()):
            if not self.cache.holds(k, v.uid):
                del self.evicted_uncounted[k]
        budgets = [  # what was evicted here since their status was written is not in it yet
            replace(b, allowed=b.allowed - sum(1 for v in self.evicted_uncounted.values() if b.covers(v)))
            for b in self.budgets.values()
        ]
        return budgets + gang_budgets(running)  # running gangs keep their minimum

    def _through_rooms(
        self, pods: list[tuple[Pod, _Why]], searched: Collection[str], batch_id: int, reclaim: bool
    ) -> tuple[list[tuple[Pod, _Why]], int]:
        """Of ``pods`` (pods alone a search found nothing for), those that find no room either by
        taking over the room held for another pod, evicting pods beside it on its node where
        that is needed, and how many pods the others evicted.  By priority, the room of a pod of
        lower priority of its tenant (kube-scheduler counts a nominated pod only against pods of
        no higher priority, and clears the nominations a preemption outranks); by ``reclaim``,
        that of a pod of a tenant past its quota, as much of it as that tenant borrowed.  The
        pod waits for the victims of the room and its own; the pod that held the room gives it
        up, is told, and looks again.  Not the rooms of the pods of the search (``searched``)."""
        took: set[str] = set()
        evicted = 0
        order = pods if reclaim else sorted(pods, key=lambda pe: -pe[0].priority)  # as each search takes them
        for p, e in order[:ROOM_SEEKERS]:  # the rest look with the next batch
            live = self.is_leader and self.queue.current(p.key, p.uid) and not self.cache.holds(p.key, p.uid)
            found = self._room_through(p, searched, reclaim) if live and p.preempts and p.gang is None else None
            if found is None:
                continue
            took.add(p.key)
            room, pre, cluster = found
            lower, node = room.pod, room.node
            self.cache.unnominate(lower.key)
            why = self._reclaim_note(pre) if reclaim else ""
            self._carry_out(
                pre,
                cluster,
                why,
                reclaimed=reclaim or self._reclaimed(room),
                waits_for=[v.pod for v in room.victims],
            )
            evicted += len(pre.victims)
            self._log_carried_out(pre, node, batch_id, reclaim, room_of=lower.key)
            if reclaim:
                mine, lender = self.tenants.of(p), self.tenants.of(lower)
                owners = ", ".join(sorted({self.tenants.of(v.pod) for v in pre.victims}))
                beside = f", and the GPUs of {len(pre.victims)} pod(s) there from tenant(s) {owners}" if owners else ""
                message = (
                    f"{e.message} Reclaiming the room held on node {node} for pod {lower.key} of tenant {lender}"
                    f"{beside}, past {'their' if owners else 'its'} quota: tenant {mine} is within its own."
                )
                said = (
                    f"The room held for it on node {node} was reclaimed for pod {p.key} of tenant {mine}, within its "
                    f"quota: tenant {lender} is past its own; it looks again."
                )
            else:
                leaving = f", whose {len(room.victims)} preempted pod(s) are leaving" if room.victims else ""
                taking = f"the room held there for pod {lower.key} of lower priority{leaving}."
                doing = (
                    f"Preempting {len(pre.victims)} pod(s) of lower priority on node {node}, and taking"
                    if pre.victims
                    else f"Taking, on node {node},"
                )
                message = f"{e.message} {doing} {taking}"
                said = (
                    f"The room held for it on node {node} was taken by pod {p.key}, of higher priority "
                    f"({p.priority} > {lower.priority}); it looks again."
                )
            if self.queue.current(lower.key, lower.uid):
                self._tell_room_lost(lower, said)
            self.tell_unschedulable(p, message, e.reason, nominated=node)
            if not pre.victims and not room.victims:  # its room is ready: bound there with the next batch
                self._wake_one(p.key)
        return [(p, e) for p, e in pods if p.key not in took], evicted

    def _room_through(
        self, pod: Pod, searched: Collection[str], reclaim: bool
    ) -> tuple[Room, Preemption, Cluster] | None:
        """``_through_rooms`` for ``pod``: the room it takes over, its preemption there (the least
        harmful of all such rooms'), and the cluster it is placed in; None: no room takes it.
        Not on a node with GPUs busy by utilisation, nor one being re-partitioned."""
        tenants = self.tenants
        mine = tenants.of(pod) if tenants.active else None
        busy = self.busy_gpus() or {}
        sealed = self.mig.sealed()
        rooms = [
            r
            for r in self.cache.rooms()
            if r.pod.gang is None and r.pod.key not in searched and not busy.get(r.node) and r.node not in sealed
        ]
        if not rooms:
            return None
        lent: dict[str, int] = {}
        may: Callable[[Room, int], bool] | None = None
        if reclaim:
            assert mine is not None
            usage = self.cache.tenant_usage(tenants, [pod.key])
            room_left = self._limit_left(pod)
            if usage.get(mine, 0) + demand_of(pod) > tenants.rule(mine).quota or (
                room_left is not None and demand_of(pod) > room_left
            ):
                return None
            lent = tenants.borrowed(usage)
            rooms = [
                r
                for r in rooms
                if (t := tenants.of(r.pod)) != mine
                and r.pod.priority < tenants.reclaim_below
                and 0 < demand_of(r.pod) <= lent.get(t, 0)
            ]
        else:
            rooms = [r for r in rooms if r.pod.priority < pod.priority and (mine is None or tenants.of(r.pod) == mine)]
            may = self._may_take(pod) if rooms and mine is not None else None
        if not rooms:
            return None
        running = self.cache.preemptible()  # as placed in the snapshots below: taken together
        budgets = self._budgets(running)
        if mine is not None and reclaim:  # what it may evict, were every room it may take over taken
            reach = reclaimable(running, tenants, lent, mine)
        else:
            reach = [
                a for a in running if a.pod.priority < pod.priority and (mine is None or tenants.of(a.pod) == mine)
            ]
        keep = self._keep([pod])
        # One look with all of them free, their victims and every pod it may evict gone (more
        # than any one way leaves), then the rooms whose node passes it one at a time.
        every = self.cache.snapshot(free=[r.pod.key for r in rooms] + [pod.key], sealed=sealed, **keep)
        index = every.cluster.index
        near: dict[int, list[Assignment]] = defaultdict(list)
        for a in reach:
            near[a.node].append(a)
        # Only the rooms' nodes are looked at: only their own pods need be gone.
        on_rooms = {i for r in rooms if (i := index.get(r.node)) is not None}
        most = every.state.release([v for r in rooms for v in r.victims])
        most = most.release([a for i in on_rooms for a in near.get(i, ())])
        possible = most.fit_mask(pod.shape) if pod.affinity or pod.spread else most.pod_mask(pod)
        best: tuple[tuple[int, int, int, int, float], Room, Preemption, Cluster] | None = None
        tried = [
            r
            for r in sorted(rooms, key=lambda r: (r.pod.priority, r.pod.key))
            if (i := index.get(r.node)) is not None and possible[i] and every.cluster.could_take(pod, r.node)
        ][:ROOMS_TRIED]
        for room in tried:
            i = index[room.node]
            snap = self.cache.snapshot(free=[room.pod.key, pod.key], sealed=sealed, **keep)
            state = snap.state.release(room.victims)
            there = near.get(i, [])
            if reclaim:
                left = dict(lent)
                left[tenants.of(room.pod)] -= demand_of(room.pod)
                pre = reclaim_through_room(pod, state, there, i, tenants, left, budgets)
            else:
                pre = through_room(pod, state, there, i, budgets)
                freed = sum(demand_of(v.pod) for v in pre.victims) if pre is not None else 0
                if pre is not None and may is not None and not may(room, freed):
                    pre = None
            if pre is None or not _on_instances([pre], state):
                continue
            rank = harm(pre)
            if best is None or rank < best[0]:
                best = (rank, room, pre, snap.cluster)
            if not pre.victims:  # no way harms less
                break
        return None if best is None else best[1:]

    def _reclaim_note(self, pre: Preemption) -> str:
        """What the victims of a reclaim are told."""
        mine = self.tenants.of(pre.pod)
        owners = sorted({self.tenants.of(v.pod) for v in pre.victims})
        quotas = ", ".join(f"{t} (quota {self.tenants.rule(t).quota / GPU_MILLI:g})" for t in owners)
        return (
            f"reclaiming GPUs for tenant {mine}, within its quota of {self.tenants.rule(mine).quota / GPU_MILLI:g} "
            f"GPUs, from tenants past their own quota: {quotas}"
        )

    async def _evict(self, victim: Pod, by: Pod, node: str, why: str = "") -> None:
        """Delete one victim of ``by``; should that fail, ``by`` waits for it no longer: the room
        held for it is given up, and it looks again when the cluster changes or its wait runs out
        (not at once: a deletion refused, by RBAC or a webhook, is likely to be refused again).
        For a gang member, the room of every member goes (a gang has room whole or not at all),
        and the pods parked outside the gang may take what was held."""
        deleted = await (self.binder.preempt(victim, by, node, why) if why else self.binder.preempt(victim, by, node))
        if deleted:
            return
        if (held := self.evicted_uncounted.get(victim.key)) is not None and held.uid == victim.uid:
            del self.evicted_uncounted[victim.key]  # it runs on: no budget spent
        said = (
            f"The deletion of pod {victim.key} on node {node}, which it preempted, failed: the room held "
            "for it there is given up; it looks again when the cluster changes."
        )
        # A pod that took the room over preempted no one: it is told what its room waited for.
        waited = (
            f"The deletion of pod {victim.key} on node {node}, that the room held for it there waited for, "
            "failed: the room is given up; it looks again when the cluster changes."
        )
        # Every room that waits for it (its room may have been taken over by a pod of higher
        # priority meanwhile), and a gang's whole: a gang has room whole or not at all.
        waiting = self.cache.waiting_on(victim)
        gangs = {g.name for k in waiting if (r := self.queue.record(k)) is not None and (g := r.pod.gang) is not None}
        waiting += [k for name in sorted(gangs) for k in self.cache.gang_nominations(name) if k not in waiting]
        for key in waiting:
            self.cache.unnominate(key)
            record = self.queue.record(key)
            if record is not None:  # its nominatedNodeName must not point there
                took = key != by.key and record.pod.gang is None  # (a gang's room is never taken over)
                self._tell_room_lost(record.pod, waited if took else said, wake=False)
        if gangs:  # what the gang held is free for the pods parked outside it
            self.queue.move_all(lambda r: r.pod.gang is None or r.pod.gang.name not in gangs)

    def give_up_room(self, key: str) -> None:
        """Give up the room held for ``key``, if any: what it held is free for the parked pods."""
        if self.cache.unnominate(key):
            self.queue.move_all()

    def tell_unschedulable(self, pod: Pod, message: str, reason: str, nominated: str | None = None) -> None:
        """Tell ``pod`` why it waits (``nominated``: the node where it preempted pods and room is
        held for it; without, any room held for it is given up)."""
        if nominated is None:
            self.give_up_room(pod.key)
        if not self.queue.current(pod.key, pod.uid):  # deleted, or created again, since it was drawn:
            if nominated is not None:  # no room for a pod that is gone
                self.give_up_room(pod.key)
            self.queue.park(pod.key)  # the queue drops it or queues the new pod; nothing to tell
            return
        if self.is_leader:  # its nominatedNodeName is written below: this instance's word now
            self.placed_here.add(pod.key)
        self.metrics.unschedulable(reason)
        if reason == DEFERRED:  # it fits now: the solve kept it back, so try again soon
            self.queue.backoff(pod.key)
        else:
            self.queue.park(pod.key)
        self._write_verdict(pod, message, nominated)
        log.info("unschedulable", pod=pod.key, reason=reason, message=message)

    def _write_verdict(self, pod: Pod, message: str, nominated: str | None) -> None:
        """The pod's ``FailedScheduling`` Event and its condition (with ``nominated``, or none)."""
        self._write(("event", pod.key), lambda: self._verdict_event(pod, message))
        self._write(("condition", pod.key), lambda: self._verdict_condition(pod, message, nominated))

    def _write(self, key: tuple[str, str], write: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A verdict's write, through the outbox: only the latest per pod waits to be sent."""
        for _ in range(self.outbox.put(key, write)):
            self.spawn(self.outbox.work(), "outbox").add_done_callback(self.outbox.worker_done)

    async def _verdict_event(self, pod: Pod, message: str) -> None:
        if not self.cache.holds(pod.key, pod.uid):  # else bound since: the verdict is out of date
            await self.binder.event(pod, "FailedScheduling", message, "Warning")

    async def _verdict_condition(self, pod: Pod, message: str, nominated: str | None) -> None:
        """The condition and nominated node, against what the pod shows when it is sent (not
        when the verdict was reached): not for a pod bound since, gone or replaced."""

        def stands() -> bool:
            record = self.queue.record(pod.key)
            return not self.cache.holds(pod.key, pod.uid) and (record is None or record.uid == pod.uid)

        if not stands():
            return
        record = self.queue.record(pod.key)
        current = record.unschedulable if record is not None else None
        was = record.nominated if record is not None else None
        await self.binder.unschedulable(pod, message, current, nominated, was, still=stands)

    async def _bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> None:
        start = time.perf_counter()
        unstarted = True
        try:
            async with self._bind_slots:
                self._binds_unstarted -= 1
                unstarted = False
                try:
                    if self.is_leader:
                        result, why = await self.binder.bind(pod, node, gpus)
                    else:  # stepped down while this bind waited: the new leader places the pod
                        result, why = BindResult.FAILED, "no longer the leader"
                except Exception as exc:  # not the API's answer (the binder turns those into results)
                    result, why = BindResult.FAILED, f"bind raised {exc!r}"
        finally:
            if unstarted:  # cancelled while waiting for a slot
                self._binds_unstarted -= 1
            self._binds_in_flight -= 1
            if self._binds_in_flight < self.max_binds_in_flight:
                self._bind_room.set()
            if not self._binds_in_flight:
                self.queue.nudge()
        ms = round((time.perf_counter() - start) * 1000, 1)
        self._bind_outcome(pod, node, gpus, result, why)
        log.info("bind", pod=pod.key, node=node, gpus=list(gpus), result=result.value, why=why or None, ms=ms)

    def _bind_outcome(self, pod: Pod, node: str, gpus: tuple[int, ...], result: BindResult, why: str) -> None:
        """Act on how a Binding ended: the books, the queue, the Events and the counters."""
        if result is BindResult.BOUND:
            self._refusals.pop(pod.key, None)
            if self.cache.confirm(pod.key):  # a relist missed it: it may be gone already
                self.spawn(self.read_back(pod), f"read-back:{pod.key}")
            self.queue.done(pod.key)
            self.queue.move_all(lambda r: waits_for(r.pod, pod))  # parked followers may go now
            self.metrics.scheduled()
            gpu_text = f" (GPUs {','.join(map(str, gpus))})" if gpus else ""
            self.spawn(
                self.binder.event(pod, "Scheduled", f"Successfully assigned {pod.key} to {node}{gpu_text}"),
                f"event:{pod.key}",
            )
        elif result is BindResult.UNKNOWN:
            # The Binding may have been written: its capacity stays taken, and the pod in
            # flight, until the pod is read back or the watch shows where it went.
            self.metrics.bind_error("unknown")
            self.spawn(self._resolve(pod, node, gpus, why), f"resolve:{pod.key}")
        elif result is BindResult.WITHDRAWN:  # its node went away before the Binding was sent
            self.cache.forget(pod.key)
            self.queue.requeue(pod.key)
        else:
            freed = self.cache.forget(pod.key)
            if result is BindResult.FAILED and self.queue.current(pod.key, pod.uid) and self._keeps_gang_room(pod):
                # Its peers run: the room it was placed in stays its own (no victims to wait
                # for), and it is bound there first when it is retried, rather than a parked
                # pod taking it and leaving the gang short for good.
                self.cache.nominate(pod, node, gpus, ())
                self.placed_here.add(pod.key)
            elif freed:  # its capacity is free again: the parked may fit
                self.queue.move_all()
            if result is BindResult.FAILED:
                self.metrics.bind_error("failed")
                self.queue.backoff(pod.key)
                if self.is_leader:  # a lead lost is not the pod's trouble: the new leader places it
                    self.spawn(
                        self.binder.event(pod, "FailedScheduling", f"Binding rejected: {why}", "Warning"),
                        f"event:{pod.key}",
                    )
            else:
                if result is BindResult.TAKEN:
                    self.metrics.bind_error("taken")
                self.queue.done(pod.key)

    def _keeps_gang_room(self, pod: Pod) -> bool:
        """Whether a gang member whose Binding was refused keeps the room it was placed in: while
        members of its gang are on the books, for its first ``GANG_ROOM_TRIES`` refusals in a
        row (a Binding refused for good must not keep a GPU idle for ever)."""
        if pod.gang is None or not self.is_leader:
            return False
        refused = self._refusals[pod.key] = self._refusals.get(pod.key, 0) + 1
        if refused >= GANG_ROOM_TRIES or len(self._refusals) > 10_000:
            del self._refusals[pod.key]
            return False
        name = pod.gang.name
        return self.cache.gang_held({name})[name][0] > 0

    async def _resolve(self, pod: Pod, node: str, gpus: tuple[int, ...], cause: str) -> None:
        """A Binding whose outcome is unknown: read the pod back (with a growing delay) until the
        API server or the watch tells whether it was bound, then act as if the bind had said so."""
        delay = READ_BACK_RETRY_S
        while True:
            await asyncio.sleep(delay)
            held = self.cache.holds(pod.key, pod.uid)
            if not (held and self.cache.is_assumed(pod.key)):
                # The watch settled it: bound (to our node or not) or deleted.
                where = self.cache.placement(pod.key) if held else None
                if where is None:
                    result, why = BindResult.GONE, "pod deleted"
                elif where[0] == node:
                    result, why = BindResult.BOUND, ""
                else:
                    result, why = BindResult.TAKEN, f"already bound to {where[0]}"
            else:
                try:
                    result, why = await self.binder.settle(pod, node, cause)
                except Exception as exc:  # not the API's answer: ask again later, as for no answer
                    log.warning("read-back of a bind failed", pod=pod.key, error=repr(exc))
                    result, why = BindResult.UNKNOWN, cause
                if result is BindResult.UNKNOWN:
                    delay = min(2 * delay, READ_BACK_RETRY_MAX_S)
                    continue
            self._bind_outcome(pod, node, gpus, result, why)
            log.info("bind resolved", pod=pod.key, node=node, result=result.value, why=why or None)
            return

    async def read_back(self, pod: Pod) -> None:
        """A pod bound while a relist was taken and absent from it: bound and deleted before the
        list, no watch event will free what it holds, so ask the API server, until it answers or
        the watch has settled the pod."""
        delay = READ_BACK_RETRY_S
        while (exists := await self.binder.exists(pod)) is None:
            await asyncio.sleep(delay)
            if not self.cache.holds(pod.key, pod.uid):
                return
            delay = min(2 * delay, READ_BACK_RETRY_MAX_S)
        if self.cache.read_back(pod.key, pod.uid, exists):
            log.info("bound pod was gone before the relist; books corrected", pod=pod.key)
            self.queue.move_all()

    def _scrape(self) -> None:
        state = self.cache.snapshot().state
        self._cluster_metrics(state, None)
        self._signal_metrics(state)
        self._tenant_metrics()
        if self.utilisation is not None:
            self._utilisation_metrics(state)

    def _tenant_metrics(self) -> None:
        """GPUs each tenant holds and is guaranteed (none while no tenant rule is set)."""
        if not self.tenants.active:
            self.metrics.set_tenants({}, {})
            return
        usage = self._tenant_usage()
        names = set(usage) | set(self.tenants.rules)
        self.metrics.set_tenants(
            {t: usage.get(t, 0) / GPU_MILLI for t in sorted(names)},
            {t: self.tenants.rule(t).quota / GPU_MILLI for t in sorted(names)},
        )

    def utilisation_view(self) -> UtilisationView | None:
        """The last answer about GPU utilisation, if there is one young enough to use."""
        if self.utilisation is None:
            return None
        return self.utilisation.current(self.config.utilisation.max_age_seconds)

    def busy_gpus(self) -> dict[str, frozenset[int]] | None:
        """GPUs (node name -> indices, as the books number them) a batch leaves out as busy;
        None when none are."""
        u = self.config.utilisation
        view = self.utilisation_view() if u.avoid_busy_gpus else None
        return None if view is None else self.cache.as_booked(view.at_least(u.busy_percent)) or None

    def _check_poll_age(self) -> None:
        """Warn when answers are polled less often than one may be used (checked at the start
        and whenever a configuration changes ``utilisation.maxAgeSeconds``)."""
        if self.utilisation is not None and self.utilisation.poll_s >= self.config.utilisation.max_age_seconds:
            log.warning(
                "GPU utilisation is polled less often than an answer may be used; between polls no GPU is busy",
                poll_s=self.utilisation.poll_s,
                max_age_s=self.config.utilisation.max_age_seconds,
                fix="a --utilisation-poll below utilisation.maxAgeSeconds",
            )

    async def follow_utilisation(self) -> None:
        """Poll for GPU utilisation until cancelled.  When a GPU is no longer busy (or the answer
        grew too old to use), the pods parked as unschedulable are drawn again: it may be room."""
        assert self.utilisation is not None
        self._check_poll_age()
        blocking = self.cache.blocking(self.busy_gpus() or {})  # GPUs a batch would not be offered
        told: tuple[frozenset[str], bool] = (frozenset(), False)
        while True:
            if await self.utilisation.poll_once():
                told = self._check_node_names(told)
            blocking = self.utilisation_changed(blocking)
            await asyncio.sleep(self.utilisation.poll_s)

    def utilisation_changed(self, blocking: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """After a poll: wake the pods parked as unschedulable if a GPU of ``blocking`` (those a
        batch was not offered as busy) is busy no more; the GPUs blocking now."""
        now = self.busy_gpus() or {}
        if any(g not in now.get(node, ()) for node, g in blocking):
            log.info("GPUs no longer busy; unschedulable pods drawn again")
            self.queue.move_all()
        return self.cache.blocking(now)

    def _check_node_names(self, told: tuple[frozenset[str], bool]) -> tuple[frozenset[str], bool]:
        """Warn (once, until they change) about the names of the answer that are no node of the
        cluster: when none is, the node label names something else and no GPU would ever count
        as busy or idle; when some are not, those exporters' GPUs go unmeasured.  What was
        warned about now: those names, and whether none was a node."""
        assert self.utilisation is not None
        assert self.utilisation.view is not None
        view, nodes = self.utilisation.view, self.cache.nodes
        clock = time.monotonic()
        for name, at in list(self.nodes_gone.items()):
            if clock - at > GONE_NODES_S or name in nodes:
                del self.nodes_gone[name]
        strangers = frozenset(n for n in view.strangers(nodes) if n not in self.nodes_gone) if nodes else frozenset()
        now = (strangers, view.names_none_of(nodes))
        if strangers and now != told:
            if now[1]:
                log.warning(
                    "no node of the utilisation answer is a node of the cluster; nothing counts as busy or idle",
                    label=self.utilisation.node_label,
                    answered=sorted(view.percent)[:3],
                    cluster=sorted(nodes)[:3],
                    fix="--utilisation-node-label must name the label that holds the Kubernetes node name",
                )
            else:
                log.warning(
                    "names in the utilisation answer are no node of the cluster; their GPUs count as neither "
                    "busy nor idle",
                    label=self.utilisation.node_label,
                    names=len(strangers),
                    answered=sorted(strangers)[:3],
                    fix="an exporter without NODE_NAME labels its GPUs with its pod's name: give it the node's",
                )
        return now

    def _below_headroom(self, pod: Pod) -> bool:
        """Whether ``pod`` may not take the GPUs the headroom keeps free."""
        return pod.priority < self.config.headroom.priority_at_least

    def _check_headroom_models(self, cluster: Cluster) -> None:
        """Warn, once per setting, when ``headroom.models`` names no GPU product of the cluster:
        the headroom then keeps no GPU, and pods of high priority must preempt."""
        models = tuple(self.config.headroom.models)
        if not models or not self.config.headroom.gpus or models == self._models_checked:
            return
        if len(cluster) and not cluster.named_mask(models).any():
            self._models_checked = models
            products = sorted({n.gpu_model for n in cluster.nodes if n.gpu_model})
            log.warning(
                "headroom models match no node",
                models=list(models),
                products=products[:8],
                fix="headroom.models takes the nodes' nvidia.com/gpu.product values (a leading NVIDIA- may go)",
            )
        elif len(cluster):
            self._models_checked = models

    def _keep(self, pods: Iterable[Pod] | None = None) -> dict[str, Any]:
        """What ``Cache.snapshot`` is to keep free from ``pods`` (None: from pods of low priority):
        the headroom's GPUs when any of them is below its priority; else none."""
        h = self.config.headroom
        if not h.gpus or (pods is not None and not any(self._below_headroom(p) for p in pods)):
            return {}
        return {
            "keep": h.gpus,
            "keep_models": frozenset(h.models),
            "kept_before": self._kept_last,
            "keep_tolerated": frozenset(h.tolerated_taints),
        }

    async def _place_on_kept(
        self,
        plan: Plan,
        after: ClusterState,
        frag: float,
        snap: Snapshot,
        policy: Policy,
        typical: TypicalPods,
        quick: bool,
        batch_id: int,
    ) -> tuple[Plan, ClusterState, float]:
        """Place the pods of high priority that ``plan`` left out with the GPUs kept free for
        them given back: the batch's plan with theirs added.  A gang goes there only whole."""
        below = {p.gang.name for p in plan.unplaced if p.gang is not None and self._below_headroom(p)}
        high = [
            p for p in plan.unplaced if not self._below_headroom(p) and (p.gang is None or p.gang.name not in below)
        ]
        if not high:
            return plan, after, frag
        state = after.with_gpus_at(snap.kept, 0)
        try:
            extra, after2, frag2 = await asyncio.to_thread(_solve, policy, high, state, typical, quick)
        except Exception as exc:
            log.error(
                "solve on the GPUs kept free failed; its pods are told as left out", batch_id=batch_id, error=repr(exc)
            )
            return plan, after, frag
        problems = plan_problems(extra, state, high)
        if problems:
            log.error("plan on the GPUs kept free rejected", batch_id=batch_id, problems=problems[:5])
            return plan, after, frag
        placed = {a.pod.key for a in extra.assignments}
        log.info("kept GPUs used", batch_id=batch_id, pods=len(placed), kept=len(snap.kept))
        merged = replace(
            plan,
            assignments=plan.assignments + extra.assignments,
            unplaced=tuple(p for p in plan.unplaced if p.key not in placed),
            partitions=plan.partitions + extra.partitions,
        )
        return merged, after2, frag2

    def _notes(
        self,
        pod: Pod,
        message: str,
        snap: Snapshot | None,
        state: ClusterState | None = None,
        below: bool | None = None,
    ) -> str:
        """``message``, saying also how many GPUs ``pod`` could have used the batch did not offer
        it, and why (busy; kept free for pods of higher priority), when it found no room.
        ``state``: what the pod was weighed against (default: the snapshot's); ``below``:
        whether the kept GPUs are not for it (default: by its own priority)."""
        gpus = pod.num_gpu or pod.gpu_milli or pod.mig_profile
        if snap is None or not (snap.busy_cells or snap.kept or snap.sealed) or not gpus:
            return message
        notes = []
        if snap.sealed:
            sealed = len(snap.sealed)
            notes.append(
                f"{sealed} node{'s' if sealed != 1 else ''} being re-partitioned into MIG instances "
                f"{'were' if sealed != 1 else 'was'} not offered"
            )
        if pod.mig_profile or not (snap.busy_cells or snap.kept):
            return "; ".join([message.rstrip("."), *notes]) + "."
        seen = snap.state if state is None else state
        host = seen.host_mask(pod.shape)
        need = pod.gpu_milli if pod.shape.is_fractional else GPU_MILLI
        busy = sum(1 for i, _, room in snap.busy_cells if host[i] and room >= need)
        if busy:
            pct = self.config.utilisation.busy_percent
            notes.append(
                f"{busy} GPU{'s' if busy != 1 else ''} with room for it {'were' if busy != 1 else 'was'} "
                f"not offered: busy, at {pct:g} % utilisation or more (DCGM)"
            )
        below = self._below_headroom(pod) if below is None else below
        kept = sum(1 for i, _ in snap.kept if host[i]) if below else 0
        if kept:
            notes.append(
                f"{kept} idle GPU{'s' if kept != 1 else ''} {'are' if kept != 1 else 'is'} kept free for pods of "
                f"priority {self.config.headroom.priority_at_least} or more (headroom)"
            )
        return "; ".join([message.rstrip("."), *notes]) + "." if notes else message

    def _utilisation_metrics(self, state: ClusterState) -> None:
        """The age of the utilisation answer, the GPUs it finds busy and those pods hold idle
        (NaN without an answer young enough to use: nothing is measured, which 0 would hide)."""
        assert self.utilisation is not None
        u = self.config.utilisation
        view = self.utilisation.view
        if view is None:
            self.metrics.set_utilisation(math.nan, math.nan, math.nan)
            return
        age = self.utilisation.age()
        if age > u.max_age_seconds:  # not used: no GPU is known busy or idle by it
            self.metrics.set_utilisation(age, math.nan, math.nan)
            return
        cl, used = state.cluster, state.gpu_used
        busy = len(self.cache.blocking(self.busy_gpus() or {}))
        low = self.cache.as_booked(view.below(u.idle_percent))  # on a time-sliced node, slices
        held = [
            (n, g)
            for n, gpus in low.items()
            if (i := cl.index.get(n)) is not None and not cl.mig_cap[i].any()  # as ``_busy_cells``
            for g in gpus
            if 0 <= g < cl.gpu_count[i] and used[i, g] > 0
        ]
        # A pod whose GPUs the books only guess makes its node's GPUs idle only all together.
        guessed = self.cache.guessed_gpus() if held else set()
        holders = self.cache.holders_of(held) if guessed else {}
        idle = sum(
            1
            for n, g in held
            if not (holders.get((n, g), set()) & guessed) or set(range(int(cl.gpu_count[cl.index[n]]))) <= low[n]
        )
        self.metrics.set_utilisation(age, busy, idle)

    def _cluster_metrics(self, state: ClusterState, frag: float | None) -> None:
        """Queue depths and cluster gauges (``frag`` None: as the last batch left it); after each
        batch, and from the books as they are at each scrape."""
        c = self.queue.counts()
        self.metrics.set_pending(c.active + c.in_flight, c.backoff, c.unschedulable)
        cl, open_ = state.cluster, ~state.cluster.cordoned  # a cordoned node is no capacity to place on
        # GPUs in MIG mode count as the cost report counts them, a slice held as its part of one
        # (held twice, at most the node's).
        mig, part = self._mig_shares(cl)
        mig_held = np.minimum(state.mig @ part, mig) if part.size else np.zeros(len(cl), dtype=np.float64)
        gpus = float(cl.gpu_count[open_].sum() + mig[open_].sum())
        held = float(state.gpu_used[open_].sum()) / GPU_MILLI + float(mig_held[open_].sum())
        alloc = held / gpus if gpus else 0.0
        in_use = (state.gpu_used.sum(axis=1) > 0) | (state.mig.sum(axis=1) > 0)
        active = int((in_use & ((cl.gpu_count > 0) | cl.mig_cap.any(axis=1)) & open_).sum())
        self.metrics.set_cluster(gpus, alloc, frag, active)

    def node_gone(self, name: str) -> None:
        """``name`` was deleted: its GPUs' series linger in the utilisation answer a while."""
        now = time.monotonic()
        for gone, at in list(self.nodes_gone.items()):
            if now - at > GONE_NODES_S:
                del self.nodes_gone[gone]
        self.nodes_gone[name] = now

    def _mig_shares(self, cl: Cluster) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per node its GPUs in MIG mode (as the cost report counts them), per MIG profile of
        ``cl`` its part of a GPU: once per node list, not per batch."""
        if self._mig_shares_of is None or self._mig_shares_of[0] is not cl:
            mig = np.array([mig_gpus(node) for node in cl.nodes], dtype=np.float64)
            part = np.array([gpu_fraction(p) for p in cl.mig_profiles], dtype=np.float64)
            self._mig_shares_of = (cl, mig, part)
        return self._mig_shares_of[1], self._mig_shares_of[2]

    def _signal_metrics(self, state: ClusterState) -> None:
        """The autoscaling gauges and the GPUs kept free: from the books, at each scrape only
        (nothing a batch learns changes them sooner)."""
        cl, open_ = state.cluster, ~state.cluster.cordoned
        in_use = (state.gpu_used.sum(axis=1) > 0) | (state.mig.sum(axis=1) > 0)
        gpu_nodes = (cl.gpu_count > 0) | cl.mig_cap.any(axis=1)
        kept = self._kept_now()
        keeping = np.zeros(len(cl), dtype=np.bool_)  # nodes holding GPUs kept free: not to be removed
        keeping[[i for n, _ in kept if (i := cl.index.get(n)) is not None]] = True
        # A node being re-partitioned holds no pod yet, but is about to: not to be removed; nor
        # one gang members waiting beside a layout are planned on.
        soon = self.mig.sealed() | {node for job in self.mig.jobs.values() for _, node in job.beside.values()}
        keeping[[i for n in soon if (i := cl.index.get(n)) is not None]] = True
        idle = int((~in_use & gpu_nodes & open_ & ~keeping).sum())
        # What more nodes would have to offer.
        parked = self.waiting(self.unschedulable_records())
        wanted = sum(p.gpu_demand_milli for p in parked) / GPU_MILLI
        self.metrics.set_signals(idle, wanted, len(kept))

    def unschedulable_records(self) -> list[PodRecord]:
        """The pending pods waiting as unschedulable: parked, or told so and drawn again since
        (any change in the cluster draws every parked pod; until a batch tells them again,
        they wait all the same)."""
        parked = self.queue.parked()
        seen = {r.key for r in parked}
        again = (self.queue.record(k) for k in self.queue.pending_keys() if k not in seen)
        return parked + [r for r in again if r is not None and r.unschedulable is not None]

    def waiting(self, records: Iterable[PodRecord]) -> list[Pod]:
        """The pods of ``records`` (in their order) that wait for room a node could give: not
        pods no node takes as written, nor pods being bound, nor pods waiting for their
        volumes, nor members of gangs short of their minimum (more room would not place
        them), nor pods holding room already (their victims are leaving), nor pods waiting for
        a MIG layout or beside one, nor, counted in order, pods their tenant's limit holds
        back (as a batch of them all would count them)."""
        aside = self.mig.set_aside()
        records = list(records)
        names = {g.name for r in records if (g := r.pod.gang) is not None}
        held = self.cache.gang_held(names) if names else {}
        blocked: set[str] = set()  # gangs a member of which no node takes as written, or that disagree
        if names:
            queued = [r for k in self.queue.pending_keys() if (r := self.queue.record(k)) is not None]
            members = [r for r in queued if (g := r.pod.gang) is not None and g.name in names]
            blocked = {g.name for r in members if r.error and (g := r.pod.gang) is not None}
            blocked |= set(gang_conflicts(r.pod for r in members))
        pods = [
            r.pod
            for r in records
            if not r.error
            and not self.cache.holds(r.key, r.uid)
            and self.cache.nomination(r.key) is None
            and (r.key, r.uid) not in aside
            and not (r.claims and self.claims.problem(r.key, r.uid, r.claims, r.ephemeral_claims))
            and (
                (g := r.pod.gang) is None
                or (g.name not in blocked and self.queue.gang_pending(g.name) + held[g.name][0] >= g.min_members)
            )
        ]
        if self.tenants.active and pods:
            usage = self.cache.tenant_usage(self.tenants, terminating=True)
            admitted, _ = self.tenants.admit(pods, usage)
            over = self.tenants.trim(admitted, usage)
            pods = [p for p in admitted if p.key not in over]
        return pods

    def _kept_now(self) -> tuple[tuple[str, int], ...]:
        """The GPUs (node name, index) the headroom would keep free from a batch now (busy ones
        left out)."""
        keep = self._keep()
        if not keep:
            return ()
        snap = self.cache.snapshot(busy=self.busy_gpus(), **keep)
        return tuple((snap.cluster.nodes[i].name, g) for i, g in snap.kept)


def _load_malloc_trim() -> Callable[[int], int] | None:
    with contextlib.suppress(OSError, AttributeError):
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    return None  # not glibc


_MALLOC_TRIM = _load_malloc_trim()


def _busy_room_ok(
    found: list[Preemption],
    busy: Mapping[str, frozenset[int]],
    holders: Mapping[tuple[str, int], set[str]],
    cluster: Cluster,
) -> list[Preemption]:
    """The preemptions of ``found`` that take room on a busy GPU only where every pod holding it
    is evicted (by the pod, or for a gang by its members together); a gang keeps all its
    members' or none."""
    victims: dict[str, set[str]] = defaultdict(set)  # pod, or gang, -> the keys of its victims
    for pre in found:
        victims[pre.pod.unit].update(v.pod.key for v in pre.victims)
    refused = set()
    for pre in found:
        name = cluster.nodes[pre.placement.node].name
        for g in pre.placement.gpus:
            if g in busy.get(name, ()) and not holders.get((name, g), set()) <= victims[pre.pod.unit]:
                refused.add(pre.pod.unit)
    return [pre for pre in found if pre.pod.unit not in refused]


def _on_instances(found: list[Preemption], state: ClusterState) -> list[Preemption]:
    """``found`` but the MIG pods that would need a GPU re-partitioned: room held for a pod is
    bound as it is once the victims leave, and a node takes a MIG pod only on an instance it
    advertises (a gang's members all go when one does)."""
    free = state.mig_free.copy()
    out: list[Preemption] = []
    dropped: set[str] = set()
    for pre in found:
        for v in pre.victims:
            for held, count in v.pod.mig_slices:  # all it holds: one another scheduler bound may hold several
                if (col := state.cluster.mig_id(held)) >= 0:
                    free[v.node, col] += count
        profile = pre.pod.mig_profile
        if profile:
            col = state.cluster.mig_index[profile]
            if free[pre.node, col] <= 0:
                dropped.add(pre.pod.unit)
                continue
            free[pre.node, col] -= 1
        out.append(pre)
    return [pre for pre in out if pre.pod.unit not in dropped]


def count_running_members(pods: list[Pod], books: Cache) -> list[Pod]:
    """Members of a gang already bound count toward its minimum, and hold it to their
    topology domain: a member recreated after its gang started is placed on its own, beside
    the rest."""
    names = {p.gang.name for p in pods if p.gang is not None}
    if not names:
        return pods
    held = books.gang_held(names)
    out = []
    for p in pods:
        g = p.gang
        if g is not None and held[g.name][0]:
            count, domain = held[g.name]
            left = max(1, g.min_members - count)
            out.append(replace(p, gang=replace(g, min_members=left, domain=domain, running=count)))
        else:
            out.append(p)
    return out


def _renumbered(plan: Plan, old: Cluster, new: Cluster) -> Plan | str:
    """``plan``, made against ``old``, with its nodes numbered as in ``new``; or what is wrong
    when a node of it is no longer there."""
    index = {n.name: i for i, n in enumerate(new.nodes)}
    at: dict[int, int] = {}
    for n in {a.node for a in plan.assignments} | {n for n, _, _ in plan.partitions}:
        name = old.nodes[n].name
        if name not in index:
            return f"node {name} is gone"
        at[n] = index[name]
    return replace(
        plan,
        assignments=tuple(replace(a, node=at[a.node]) for a in plan.assignments),
        partitions=tuple((at[n], g, layout) for n, g, layout in plan.partitions),
    )


def _same_offers(a: Cluster, b: Cluster) -> bool:
    """The same nodes in the same order, offering the same (a PreferNoSchedule taint added or
    removed only steers later solves): a plan made against ``a`` holds against ``b``."""
    return len(a.nodes) == len(b.nodes) and all(
        x.name == y.name and x.labels == y.labels and same_offer(x, y) for x, y in zip(a.nodes, b.nodes, strict=True)
    )


GONE_NODES_S = 600.0
"""How long a deleted node's name in the utilisation answer is taken for its series ageing out
(the default query averages two minutes) rather than for an exporter's wrong label."""

ROOM_SEEKERS = 8
"""Pods of one search (the most important first) that look at the rooms held for others: each
look takes a snapshot per room, on the event loop, so a preemption wave is looked at in turns."""

ROOMS_TRIED = 16
"""Rooms held for others one pod tries (those of the lowest priority first)."""

ISOLATED_UNITS = 4
"""Units of a batch whose handling raised that the next batch handles one by one; more are
handled in halves (which raise again, and are halved again, until the culprit is alone)."""

PRIORITY_PASSES = 3
"""The most priority levels of one batch placed each in a pass of its own; the lowest levels
beyond share the last pass."""


def _passes(pods: list[Pod], first: Collection[str] = ()) -> list[list[Pod]]:
    """The batch in the parts placed one after the other, each in what the earlier left: the
    pods within their tenant's quota (``first``), then the others; and within each, by
    priority, highest first (a gang at its highest member's, so that it is never split), as
    kube-scheduler's queue takes pods: a pod of low priority never takes the room a pod of
    higher priority in the same batch needs.  A part with a pod whose required pod affinity a
    pod of a lower level answers is placed in one pass."""
    top: dict[str, int] = {}
    for p in pods:
        if p.gang is not None:
            top[p.gang.name] = max(top.get(p.gang.name, p.priority), p.priority)

    def level(p: Pod) -> int:
        return top[p.gang.name] if p.gang is not None else p.priority

    out: list[list[Pod]] = []
    for part in ([p for p in pods if p.key in first], [p for p in pods if p.key not in first]):
        levels = sorted({level(p) for p in part}, reverse=True)
        rank = {lv: min(i, PRIORITY_PASSES - 1) for i, lv in enumerate(levels)}
        tiers: list[list[Pod]] = [[] for _ in range(min(len(levels), PRIORITY_PASSES))]
        for p in part:
            tiers[rank[level(p)]].append(p)
        followers = [(i, p) for i, tier in enumerate(tiers) for p in tier if p.affinity]
        if any(  # a pod that must run beside a peer placed in a later pass is solved with it
            q.matches_all(p.affinity) for i, p in followers for later in tiers[i + 1 :] for q in later
        ):
            tiers = [part] if part else []
        out += tiers
    return out


def _solve(
    policy: Policy,
    pods: list[Pod],
    state: ClusterState,
    typical: TypicalPods,
    quick: bool,
    first: Collection[str] = (),
) -> tuple[Plan, ClusterState, float]:
    """Runs in a worker thread: the plan, the state after it and its fragmentation ratio.
    The batch is placed in the parts ``_passes`` gives (``first``: keys of the pods within their
    tenant's quota), each against the state the earlier ones left.

    A solve's model and search are large and short-lived, and glibc keeps the freed
    pages of its worker threads' arenas; handing them back after each batch keeps the
    resident size near what the scheduler holds (about 50 MiB less at 5,000 nodes).
    """
    plan: Plan | None = None
    now = state
    parts = _passes(pods, first)
    limit = policy.time_limit_s if isinstance(policy, TimedPolicy) else None
    deadline = time.perf_counter() + limit if limit is not None and len(parts) > 1 else None
    left = len(pods)
    solved: list[SolveStats] = []  # the passes with an objective and a bound
    for part in parts:
        until = None
        if deadline is not None:  # each pass its share of what is left of the batch's one limit
            until = time.perf_counter() + max(deadline - time.perf_counter(), 0.0) * len(part) / max(left, 1)
        left -= len(part)
        step = _place(policy, part, now, quick, until)
        if not (math.isnan(step.stats.objective) or math.isnan(step.stats.bound)):
            solved.append(step.stats)
        if plan is None:
            plan = step
        else:
            stats = replace(
                step.stats,
                status=f"{plan.stats.status}+{step.stats.status}",
                objective=sum(x.objective for x in solved) if solved else math.nan,
                bound=sum(x.bound for x in solved) if solved else math.nan,
                wall_ms=plan.stats.wall_ms + step.stats.wall_ms,
                variables=plan.stats.variables + step.stats.variables,
            )
            plan = Plan(
                plan.assignments + step.assignments,
                plan.unplaced + step.unplaced,
                stats,
                plan.partitions + step.partitions,
            )
        now = (now.partition(step.partitions) if step.partitions else now).apply(step.assignments)
    if plan is None:
        plan = _place(policy, pods, state, quick)
    frag = cluster_frag_ratio(now, typical, ~now.cluster.cordoned) if len(typical) else 0.0
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return plan, now, frag


def _place(policy: Policy, pods: list[Pod], state: ClusterState, quick: bool, deadline: float | None = None) -> Plan:
    if isinstance(policy, TimedPolicy) and deadline is not None:
        return policy.place_until(pods, state, deadline, quick)
    return place_quick(policy, pods, state) if quick else policy.place(pods, state)


_Why = TypeVar("_Why", bound="Explanation | _Verdict")
"""Why a pod waits: a placement search's explanation, or a verdict reached without one."""


@dataclass(frozen=True)
class _Verdict:
    """Why a pod waits, when no placement search said it (``Explanation`` is that search's)."""

    message: str
    reason: str
