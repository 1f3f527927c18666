"""The scheduler: batches drawn from the queue, solved in a worker thread, bound, and every pod
told where it stands.  Only the leader schedules.  Its collaborators: ``preemption`` (victims,
reclaim and held rooms), ``consolidation`` (emptying nodes), ``gauges`` (what /metrics reads)
and ``mig`` (live MIG re-partitioning)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from dataclasses import replace
from typing import Any

import structlog

from gpusched.config import GpuschedConfig
from gpusched.daemon import preemption
from gpusched.daemon.consolidation import Consolidator
from gpusched.daemon.gauges import Gauges
from gpusched.daemon.handlers import (
    BoundHandler,
    BudgetHandler,
    ClaimHandler,
    CsiNodeHandler,
    Labels,
    NamespaceHandler,
    NodeHandler,
    PendingHandler,
    PodGroupHandler,
    Selecting,
    StorageClassHandler,
    VolumeHandler,
    moved_selectors,
    no_pod_group,
    waits_for,
)
from gpusched.daemon.mig import Repartitioner
from gpusched.daemon.outbox import Outbox
from gpusched.daemon.preemption import Preemptor, Verdict
from gpusched.daemon.settings import BOUND_SELECTOR, DaemonSettings, default_identity
from gpusched.daemon.volumes import ATTACH_FULL, VolumeBinding, gangs_sharing_new_claims, on_one_node, outcome
from gpusched.kube.binder import LEAD_LOST, Binder, BindResult
from gpusched.kube.client import Kube, bind_concurrency, segment
from gpusched.kube.configmap import ConfigMapHandler
from gpusched.kube.convert import (
    PODGROUP_GROUP_VERSION,
    gang_disagreements,
    pod_record,
)
from gpusched.kube.leader import LeaderElector
from gpusched.kube.watch import FAILING_UNREADY_S, OptionalReflector, Reflector
from gpusched.metrics.exporter import SchedulerMetrics
from gpusched.metrics.source import UtilisationSource, UtilisationView
from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.pod import gang_conflicts
from gpusched.model.tenants import demand_of
from gpusched.queue.batcher import SchedulingQueue
from gpusched.solver.explain import DEFERRED, Explanation, explain, explain_gang, gang_fits, together
from gpusched.solver.fragmentation import TypicalPods, TypicalShape, cluster_frag_ratio
from gpusched.solver.instance import beside_placed
from gpusched.solver.params import SolverParams
from gpusched.solver.partitions import needed_partitions
from gpusched.solver.policy import Policy, TimedPolicy, place_quick
from gpusched.solver.preempt import (
    Budget,
)
from gpusched.solver.registry import make_policy
from gpusched.solver.validate import plan_problems
from gpusched.state.cache import Cache, Snapshot, keepable, same_offer
from gpusched.state.records import REASON_MIG_REPARTITION, REASON_TENANT_LIMIT, REASON_UNSCHEDULABLE, PodRecord
from gpusched.state.volumes import Claims

log = structlog.get_logger("gpusched.daemon")

GANG_ROOM_TRIES = 3
"""Refused Bindings in a row after which a gang member whose peers run gives its room up."""

READ_BACK_RETRY_S = 1.0
READ_BACK_RETRY_MAX_S = 60.0
"""How often a pod a relist missed is asked for again while the API server cannot answer."""
PASSING = "node.kubernetes.io/"
"""The prefix of the taints the node lifecycle puts on a node for a while (not-ready,
unreachable, unschedulable...): no setting should be changed for them."""
_READ_BACKS = ("resolve:", "read-back:", "volumes:")
"""Names of the tasks that read a pod back until it is settled, or wait for its volumes to be
provisioned (``drain`` does not wait for them: the next leader finds the claims annotated)."""
OUTBOX_TASK = "outbox"
"""The name of the tasks that send the verdicts waiting in the outbox."""
CONFIG_READ_WAIT_S = 30.0
"""How long the lead waits for the ConfigMap's first list before it says why it does not try."""
NO_POD_GROUP = "PodGroupMissing"
"""The reason of the Warning Event on a gang member that nothing gives a minimum."""
LOGGED_GANGS = 10_000
"""Gangs without a minimum remembered as logged: beyond, the oldest may be logged again."""
OUTBOX_WORKERS = 16
"""Verdicts' Events and conditions sent at once at most: the connections they may hold (the
pool has more: Bindings and watches keep theirs)."""


def _lead_lost(result: BindResult, why: str) -> bool:
    """Whether a bind ended so because the lead did (not sent, or sent and not written)."""
    return result is BindResult.FAILED and why.startswith(LEAD_LOST)


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
        self.volume_binding = VolumeBinding(self)
        self._attached: dict[str, set[tuple[str, str]]] = {}
        """Per node, the CSI attachments of the pods on the books (``_attached_now``), as of
        ``_attached_at`` (the books' generation, the claims' changes)."""
        self._attached_at: tuple[int, int] = (-1, -1)
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
        self._crashed: set[str] = set()
        """Pods, by key, whose batch's handling raised: handled alone (or in halves) next time."""
        self.retrying: set[str] = set()
        """Pending pods, by key, last told they wait though they fit (deferred by the solve, or an
        internal error): retried after a backoff, and no call for a new node."""
        self.outbox = Outbox(workers=OUTBOX_WORKERS)
        """Verdicts' Events and conditions waiting for the Events client: one per pod and kind."""
        self._nominating: dict[str, asyncio.Task[None]] = {}
        """A preemptor's status write naming a node it did not name before, by pod: sent at once,
        not through the outbox, and its victims are deleted only after it (``nomination_sent``)."""
        self._policy: Policy | None = None
        self._policy_cluster: Cluster | None = None
        self._policy_params: SolverParams | None = None
        self._shapes: Counter[TypicalShape] = Counter()
        self._kept_last: tuple[tuple[str, int], ...] = ()
        """The GPUs the last batch kept free (node name, index): kept first again, so that what
        is kept does not wander from node to node as pods come and go."""
        self._headroom_checked: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        """The ``headroom.models`` setting last checked against the cluster's GPU products."""
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
                token_file=settings.prometheus_token_file,
                ca_file=settings.prometheus_ca_file,
            )
        self.gauges = Gauges(self)
        self.consolidator = Consolidator(self)
        self.rooms = Preemptor(self)
        self.set_config(self.config)
        self.metrics.on_scrape(self.gauges.refresh)
        self.namespaces: dict[str, dict[str, str]] = {}
        """Labels per namespace (``namespaceSelector`` picks from them)."""
        self.selecting_bound: Selecting = {}
        self.selecting_pending: Selecting = {}
        """The pods, bound and pending, whose pod (anti-)affinity picks namespaces by label: their
        latest objects, read again when namespaces' labels change."""
        self.budgets: dict[str, Budget] = {}
        """PodDisruptionBudgets by ``namespace/name``."""
        self.pod_groups: dict[str, int] | None = None
        """The coscheduling PodGroups' ``minMember`` by ``namespace/name``; None while they are
        not read (not served, or not granted: ``pod_groups_unread`` says why)."""
        self.pod_groups_unread = ""
        self.grouped_pending: dict[str, dict[str, Any]] = {}
        """The pending pods whose gang's minimum is their PodGroup's: their latest objects, read
        again when it changes."""
        self.grouped_bound: dict[str, tuple[dict[str, Any], str]] = {}
        """The bound pods whose gang's minimum is their PodGroup's: their latest objects and
        PodGroups, read again when it changes (what preemption leaves a running gang is its
        minimum: ``gang_budgets``)."""
        self._told_ungrouped: dict[str, str] = {}
        """Pending pods told that nothing gives their gang a minimum: their UIDs by key."""
        self._logged_ungrouped: dict[str, None] = {}
        """Their gangs, which the log has named (once each; the oldest forgotten past
        ``LOGGED_GANGS``)."""
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
            Reflector(kube, "storage-classes", "/apis/storage.k8s.io/v1/storageclasses", StorageClassHandler(self)),
            Reflector(kube, "csi-nodes", "/apis/storage.k8s.io/v1/csinodes", CsiNodeHandler(self)),
            Reflector(kube, "disruption-budgets", "/apis/policy/v1/poddisruptionbudgets", BudgetHandler(self)),
            OptionalReflector(kube, "podgroups", PODGROUP_GROUP_VERSION, "podgroups", PodGroupHandler(self)),
        ]
        self.config_handler: ConfigMapHandler | None = None
        self.configured = asyncio.Event()
        """Set once the configuration in force is the one asked for: at once for a file (or
        none), for a ConfigMap once a document of it was accepted.  Until then no batch is
        placed and the Lease is not tried for: not the built-in defaults in its place."""
        if not settings.config_map:
            self.configured.set()
        else:  # no weights in force until the ConfigMap's document is accepted
            self.metrics.clear_weights()
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
                    f"/api/v1/namespaces/{segment(settings.namespace)}/configmaps",
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
        are drawn again when what kept GPUs from them (busy GPUs, headroom, tenants' rules, MIG
        re-partitioning) changed."""
        if (cfg.utilisation, cfg.headroom, cfg.tenants, cfg.mig) != (
            self.config.utilisation,
            self.config.headroom,
            self.config.tenants,
            self.config.mig,
        ):
            self.queue.move_all()
        if cfg.consolidation.interval_seconds != self.config.consolidation.interval_seconds:
            self.consolidator.interval_changed.set()
        age_changed = cfg.utilisation.max_age_seconds != self.config.utilisation.max_age_seconds
        self.config = cfg
        if age_changed:
            self._check_poll_age()
        self.tenants = cfg.tenants.tenants()
        self.queue.set_tenants(self.tenants, self.tenant_usage, self.cache.has_room)
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
        why = h.rejected or (
            "the ConfigMap was not found"
            if h.read.is_set()
            else "it could not be read yet: see the warnings of the 'config' watch for the cause"
        )
        return (
            f"no valid configuration from ConfigMap {h.namespace}/{h.name} yet ({why}); "
            "fix it, and pods are placed once a valid document is in it"
        )

    async def lead(self) -> None:
        """Try for the Lease (``elector.run``) once configured and once every watch has listed,
        as kube-scheduler waits for its caches: a replica whose ConfigMap was never valid, or
        that cannot list what placement reads (a resource its role lacks, say), does not take
        the lead from one that can place pods, nor hold it placing none."""
        assert self.elector is not None
        if self.config_handler is not None and not self.configured.is_set():
            # The ConfigMap's first list may be on its way: what is wrong is known only after it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CONFIG_READ_WAIT_S):  # not wait_for: it can lose a cancellation
                    await self.config_handler.read.wait()
        if not self.configured.is_set():
            log.error("not trying for the lead", why=self._not_configured())
            await self.configured.wait()
        try:
            async with asyncio.timeout(CONFIG_READ_WAIT_S):
                await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        except TimeoutError:
            log.error("not trying for the lead", why=self._unlisted())
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        await self.elector.run()

    def _unlisted(self) -> str:
        """Which watches have not listed yet, and why (the last error of those failing)."""
        waiting = [r for r in self.reflectors if not r.synced.is_set()]
        said = [f"{r.name} ({r.last_error})" if r.failing_since is not None else r.name for r in waiting]
        return f"waiting for the first list of {', '.join(said)}"

    def _limit_usage(self, todo: list[PodRecord]) -> dict[str, int]:
        """What each tenant holds, as its limit counts it against the pods of ``todo``: pods being
        deleted count until they are gone, but not those being moved (their replacements count
        instead), and room still held for a pod of ``todo`` counts with its pod."""
        return self.cache.tenant_usage(
            self.tenants, [r.key for r in todo], terminating=True, moving=self.consolidator.moving
        )

    def tenant_usage(self) -> dict[str, int]:
        return self.cache.tenant_usage(self.tenants)

    def _wait_in_rooms(self, todo: list[PodRecord]) -> list[PodRecord]:
        """``todo`` but for the pods of tenants with a limit that room is held for while their
        victims are still leaving (a gang: all its members here, while any member's are): they
        wait for it (told so, the room kept), since taking free room elsewhere while their
        victims leave would take their tenant past its limit (its victims count until they are
        gone).  Once the victims are gone, a pod whose room ``_bind_nominated`` could not bind
        it to goes on to the solve, which gives the room up where it no longer fits.  So does
        one whose room's node (a member's, for a gang) could not take it anyway (gone, tainted
        against it, no longer selected by it: a victim there may never leave), its room (every
        member's) given up."""
        leaving: dict[str, tuple[str, int]] = {}  # pod, or gang -> a node its victims leave, how many
        held: dict[str, list[tuple[Pod, str]]] = defaultdict(list)  # pod, or gang -> its pods with room, where
        for r in todo:
            room = self.cache.nomination(r.key)
            if room is None or self.tenants.rule(self.tenants.of(r.pod)).limit is None:
                continue
            held[r.pod.unit].append((r.pod, room[0]))
            if not room[2]:
                continue
            node, count = leaving.get(r.pod.unit, (room[0], 0))
            leaving[r.pod.unit] = (node, count + room[2])
        if not leaving:
            return todo
        cluster = self.cache.snapshot().cluster
        for unit in list(leaving):
            if all(cluster.could_take(p, node) for p, node in held[unit]):
                continue
            log.info(
                "held room on a node that could not take its pod; given up",
                pods=[p.key for p, _ in held[unit]],
                nodes=sorted({node for _, node in held[unit]}),
            )
            for p, _ in held[unit]:
                self.give_up_room(p.key)
            del leaving[unit]
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

    def scope(self) -> Callable[[Pod], str] | None:
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
        # What the last term's batches measured is no longer this instance's to export: a
        # replica that lost the lead shows NaN, not a gap or fragmentation that no longer holds.
        self.metrics.new_term()
        if leader:
            self._leading.set()
            self.mig.lead()  # what failed under the last leader is set back now
            self.consolidator.lead()
        else:
            self._leading.clear()
            self.volume_binding.changed()  # the waits for volumes end: the next leader binds
            self.placed_here.clear()
            self.rooms.kept.clear()
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
        """For ``/readyz``: every watch has listed and none has failed for a minute, and the
        solver is loaded, so a pod that arrives now is placed at once."""
        if not all(r.synced.is_set() for r in self.reflectors):
            return False, self._unlisted()
        failing = [r for r in self.reflectors if r.failing_for() > FAILING_UNREADY_S]
        if failing:  # the books fall behind the cluster: pods may be placed on what is gone
            r = failing[0]
            return False, f"the {r.name} watch has failed for {r.failing_for():.0f} s: {r.last_error}"
        if not self.configured.is_set():
            return False, self._not_configured()
        if self.elector is not None and self.elector.refused:
            return False, f"cannot take the Lease: {self.elector.refused}"
        if not self._solver_loaded:
            return False, "loading the solver"
        return True, ""

    def read_pod(self, obj: dict[str, Any], selecting: Selecting, gone: bool = False) -> PodRecord:
        """``pod_record`` against the namespaces' labels, remembering in ``selecting`` the pods
        whose terms pick namespaces by label, with their selectors (and forgetting them once
        ``gone``)."""
        rec = pod_record(obj, self.namespaces, self.pod_groups)
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

    def set_pod_groups(self, table: dict[str, int] | None, why: str = "") -> None:
        """The PodGroups as listed (None: not read, ``why``); the pending members of those that
        changed are read again."""
        old, new = self.pod_groups or {}, table or {}
        self.pod_groups, self.pod_groups_unread = table, why
        self.reread_groups({k for k in old.keys() | new.keys() if old.get(k) != new.get(k)})

    def set_pod_group(self, key: str, minimum: int | None) -> None:
        """One PodGroup's minimum changed (None: deleted, or unreadable)."""
        if self.pod_groups is None:
            self.pod_groups = {}
        if self.pod_groups.get(key) == minimum:
            return
        if minimum is None:
            del self.pod_groups[key]
        else:
            self.pod_groups[key] = minimum
        self.reread_groups({key})

    def reread_groups(self, gangs: set[str]) -> None:
        """The PodGroups of ``gangs`` changed: their members that take their minimum from them are
        read again.  Pending ones are woken if their minimum changed; bound ones are held on the
        books with it, so that preemption leaves a running gang its minimum however late its
        PodGroup was read (the watches list concurrently), and the parked pods look again when
        it changed (members beyond a lower minimum may be evicted)."""
        if not gangs:
            return
        again = 0
        for key, obj in list(self.grouped_pending.items()):
            record = self.queue.record(key)
            if record is not None and record.pod_group in gangs:
                self._pending.apply("MODIFIED", obj)
                again += 1
        bound = 0
        changed = False
        for obj, group in list(self.grouped_bound.values()):
            if group not in gangs:
                continue
            rec = self.read_pod(obj, self.selecting_bound)
            if self.cache.holds(rec.key, rec.uid):  # (as the watch last showed it)
                changed = self.cache.observe_pod(rec) or changed
                bound += 1
        if changed:
            self.queue.move_all()
        if again or bound:
            log.info(
                "pod groups changed; members read again", pod_groups=sorted(gangs)[:10], pending=again, bound=bound
            )

    def _tell_ungrouped(self, batch: list[PodRecord]) -> None:
        """Warn, once per pod, the members of a gang that nothing gives a minimum (no annotation,
        no PodGroup): they are placed one by one, which their author likely did not mean."""
        groups = self.pod_groups
        for r in batch:
            if not r.pod_group or (groups is not None and r.pod_group in groups):
                continue
            if self._told_ungrouped.get(r.key) == r.uid:
                continue
            self._told_ungrouped[r.key] = r.uid
            message = no_pod_group(r.pod_group, self.pod_groups_unread)
            if r.pod_group not in self._logged_ungrouped:
                log.warning("gang without a minimum", pod_group=r.pod_group, message=message)
                self._logged_ungrouped[r.pod_group] = None
                if len(self._logged_ungrouped) > LOGGED_GANGS:
                    del self._logged_ungrouped[next(iter(self._logged_ungrouped))]
            event = functools.partial(self.binder.event, r.pod, NO_POD_GROUP, message, "Warning")
            self._write(("pod-group", r.key), event)

    def forget_ungrouped(self, key: str) -> None:
        """The pod is no longer pending: told again should it (or a pod of its name) be again."""
        self._told_ungrouped.pop(key, None)

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
        wait between tries are not waited for: the next leader reads the pods afresh; nor are
        MIG layouts waiting for the kubelet or the MIG manager (``Repartitioner.idle``): the next
        leader waits for them as it finds them."""
        deadline = time.monotonic() + timeout
        while (busy := self._draining()) and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(busy, timeout=left)

    def unfinished_binds(self) -> int:
        """Bindings sent and not answered (or of unknown outcome, being read back): cut off now,
        each may still land on the API server.  Not those still waiting for a slot or a token:
        never sent, they cannot land, and need not keep the Lease from the next leader."""
        resolving = sum(1 for t in self._tasks if t.get_name().startswith("resolve:") and not t.done())
        return len(self.binder.sending) + resolving

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
        """The tasks ``drain`` waits for: not the read-backs, the MIG waits, nor the verdicts
        waiting in the outbox (the leader's word, which the next leader says again: waiting to
        send a backlog of them would hold the lead, and the hand-over, for up to the drain's cap)."""
        return {
            t
            for t in self._tasks
            if not t.get_name().startswith(_READ_BACKS) and t.get_name() != OUTBOX_TASK and t not in self.mig.idle
        }

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
                    self.retrying.add(r.key)  # the scheduler's trouble, no call for a new node
                    held = self.cache.nomination(r.key)  # room held for it stays, and says so
                    self.write_verdict(r.pod, message, held[0] if held is not None else None)
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
        self._tell_ungrouped(batch)
        todo: list[PodRecord] = []
        waiting = 0  # pods held back by their volumes
        held_back: dict[str, str] = {}  # gang -> why one of its members cannot be bound yet
        mounted: dict[str, tuple[str, str]] = {}  # claim -> the first pod of this batch (key, UID) to mount it
        units: dict[str, str] = {}  # the pods of ``mounted``: what each is placed as (itself, or its gang)
        pinned = gangs_sharing_new_claims(((r.pod, r.claims) for r in batch if not r.error), self.claims)
        mig = self.config.mig
        # A layout asked for before this instance led is awaited: the pods it was asked for wait
        # for its instances, rather than have another node re-partitioned for them.
        self.cache.set_repartition(
            "idle-nodes"
            if mig.repartition and time.monotonic() >= self.mig.off_until and not self.mig.inherited()
            else "off",
            {p for job in self.mig.jobs.values() for _, layout in job.layouts for p in layout.counts},
        )
        self.mig.expire_asks()
        if self.rooms.kept:
            self.rooms.expire_kept()
        self.mig.book()  # as the pods waiting for a layout are now (deleted, resized): held room for this batch
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
            volumes = (
                self.claims.problem(r.key, r.uid, r.claims, r.ephemeral_claims, self.cache.claim_users())
                if r.claims
                else ""
            )
            soon = False  # refused for a claim an earlier pod of this batch mounts: retried soon (it may not be bound)
            if not volumes and r.claims and mounted:
                volumes = self.claims.problem(r.key, r.uid, r.claims, r.ephemeral_claims, mounted)
                if not volumes:  # a volume not made yet goes where the first pod to mount it goes
                    ns = r.pod.namespace
                    # (Not the members of a gang placed on one node for it: held back, they would
                    # hold the gang back for good.)
                    shared = [
                        c
                        for c in self.claims.unchosen(ns, r.claims)
                        if (earlier := mounted.get(f"{ns}/{c}")) is not None
                        and not (units.get(earlier[0]) == r.pod.unit and (g := r.pod.gang) and g.name in pinned)
                    ]
                    if shared:
                        volumes = (
                            f'persistentvolumeclaim "{shared[0]}" is to be bound for the node of pod '
                            f"{mounted[f'{ns}/{shared[0]}'][0]}, placed first; the pod is retried once it is chosen"
                        )
                soon = bool(volumes)
            if volumes:
                self.tell_unschedulable(r.pod, volumes, "Volumes", retry=soon)
                waiting += 1
                if r.pod.gang is not None:
                    held_back.setdefault(r.pod.gang.name, f"member {r.key}: {volumes}")
                continue
            units[r.key] = r.pod.unit
            for c in r.claims:  # one pod at a time, for a ReadWriteOncePod claim: the first in queue order
                mounted.setdefault(f"{r.pod.namespace}/{c}", (r.key, r.uid))
            todo.append(replace(r, pod=self.with_volumes(r)) if r.claims else r)
        if pinned:  # a gang sharing a claim to be bound for a node goes to one node, as the claim will
            todo = [replace(r, pod=on_one_node(r.pod, pinned)) for r in todo]
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
            # A gang is judged by its minimum, less its members running.
            admitted, over = self.tenants.admit(self._count_running_members([r.pod for r in todo]), limit_usage)
            at_limit: list[tuple[Pod, Explanation | Verdict]] = []
            gangs_at_limit: dict[str, dict[str, tuple[Pod, str]]] = defaultdict(dict)
            lowest = self._lowest_by_tenant() if over else {}
            alone: list[tuple[Pod, Verdict]] = []
            for r in todo:
                if r.key not in over:
                    continue
                if r.pod.gang is not None:
                    gangs_at_limit[r.pod.gang.name][r.key] = (r.pod, over[r.key])
                else:
                    alone.append((r.pod, Verdict(over[r.key], "TenantLimit")))
            # A pod may take over the room held for a lower one of its tenant, within the limit,
            # before it looks for pods to preempt.
            # Within the limit beside the pods of this batch it admitted, which the solve places.
            admitted_demand: Counter[str] = Counter()
            for p in admitted:
                admitted_demand[self.tenants.of(p)] += demand_of(p)
            taking = self.rooms.take_over(alone, None, admitted_demand)
            if len(taking) < len(alone):  # rooms taken over count toward the limit from now on
                limit_usage = self._limit_usage([r for r in todo if r.key not in over])
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
                await self.rooms.preempt_for(at_limit, list(gangs_at_limit.values()), batch_id, None, at_limit=True)
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
            free=freed,
            busy=self.busy_gpus(),
            sealed=self.sealed(),
            coming=self.mig.coming(),
            **self.keep_free(pods),
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
        high = self._for_kept(pods) if snap.kept else None
        try:
            plan, after, frag = await asyncio.to_thread(
                _solve, policy, pods, snap.state, typical, quick, first, snap.kept, high
            )
        except Exception as exc:
            log.error("solve failed; batch requeued with backoff", batch_id=batch_id, error=repr(exc))
            for r in todo:
                self.queue.backoff(r.key)
            return
        if snap.kept:  # the pods of the headroom's priority may have taken kept GPUs: those are no longer kept
            taken = {(a.node, g) for a in plan.assignments for g in a.gpus}
            problems = plan_problems(plan, snap.state.with_gpus_at(snap.kept, 0), pods)
            snap = replace(snap, kept=tuple(c for c in snap.kept if c not in taken))
        else:
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
        # So is one whose member changed (its request, its labels): it was placed as it was.
        broken = {
            a.pod.gang.name
            for a in plan.assignments
            if a.pod.gang is not None
            and (not self.queue.current(a.pod.key, a.pod.uid) or self.queue.changed(a.pod.key))
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
            if unsealed_since(a) or self.queue.changed(a.pod.key):  # (changed: placed again as it is now)
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
                rule = together(p.gang, self.queue.gang_pending(p.gang.name) + p.gang.running)
                self.tell_unschedulable(p, f"{waits}; {rule}", "Gang", layout=True)
            else:  # the layout could not be asked for: solved again
                self.queue.backoff(p.key)
        self.mig.book()  # the pods now waiting for a layout, or beside one, hold their room from now on
        members = Counter(p.gang.name for p in pods if p.gang is not None)
        preempting: list[tuple[Pod, Explanation]] = []
        never: list[tuple[Pod, Explanation, ClusterState]] = []  # pods left out that may not preempt
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
            seen = after_low if self.below_headroom(p) else after
            e = explain(p, seen)
            if e.fits:
                self.tell_unschedulable(p, self.with_notes(p, e.message, snap, seen), e.reason)
            elif not self.rooms.waits_for_victims(p, e, seen, freed):
                if p.preempts:
                    preempting.append((p, e))
                else:
                    never.append((p, e, seen))
        if never:
            # A pod that may not preempt may still take over the room held for a pod of lower
            # priority (doing so evicts no one), as may those that preempt: one look for all of
            # them, highest priority first.
            seen_by = {p.key: seen for p, _, seen in never}
            left = self.rooms.take_over([(p, e) for p, e, _ in never] + preempting, snap)
            kept = {p.key for p, _ in left}
            preempting = [(p, e) for p, e in preempting if p.key in kept]
            for p, e in left:
                if p.key in seen_by:
                    self.tell_unschedulable(p, self.with_notes(p, e.message, snap, seen_by[p.key]), e.reason)
        gangs: list[dict[str, tuple[Pod, str]]] = []  # gangs that may preempt: key -> member, why it waits
        started = Counter(
            a.pod.gang.name for a in plan.assignments if a.pod.gang is not None and a.pod.gang.name not in broken
        )
        for name, group in rejected.items():
            gang = group[0].gang
            assert gang is not None
            if started[name]:  # at least its minimum placed: the members beyond it wait on their own
                beside = f" beside the {gang.running} running" if gang.running else ""
                runs = f"gang {name}: {started[name]} of its members placed{beside}, at least its minimum"
                for p in group:
                    seen = after_low if self.below_headroom(p) else after
                    e = explain(p, seen)
                    if e.fits:
                        retry = (
                            "this member fits now, but the batch solve left it out; it is retried with the next batch"
                        )
                        self.tell_unschedulable(p, f"{runs}; {retry}.", DEFERRED)
                    else:
                        waits = f"{runs}; this member is placed beside them once it fits: {e.message}"
                        self.tell_unschedulable(p, self.with_notes(p, waits, snap, seen), e.reason)
                continue
            # A member left out is what the gang waits for only if the rest fall short of its
            # minimum (already bound members counted in); otherwise capacity is.
            why = held_back.get(name) if members[name] < gang.min_members else None
            low_gang = any(self.below_headroom(p) for p in group)  # the kept GPUs are for all its members or none
            told = {
                p.key: (
                    p,
                    f"gang {name}: {why}; {together(gang, self.queue.gang_pending(name) + gang.running)}"
                    if why
                    else self.with_notes(p, explain_gang(p, members[name], after_low), snap, after_low, low_gang),
                )
                for p in group
            }
            recreated = self.rooms.kept_for(name) if why is None and members[name] < gang.min_members else []
            held_at = {p.key: held[0] for p in group if (held := self.cache.nomination(p.key)) is not None}
            fit = gang_fits(group, after_low) if why is None and members[name] >= gang.min_members else 0
            if recreated and members[name] + len(recreated) >= gang.min_members and len(held_at) == len(group):
                # Members deleted while it waited for its victims: room is kept for pods created
                # again under their names, and the rest keep theirs meanwhile.
                said = (
                    f"gang {name}: member(s) {', '.join(sorted(recreated))} were deleted while the gang waited for "
                    "its victims; the room held for the gang is kept for pods created again under their names, "
                    f"for up to {preemption.GANG_MEMBER_GRACE_S:g} s."
                )
                for p in group:
                    self.tell_unschedulable(p, said, "Gang", nominated=held_at[p.key])
            elif fit:
                which = f"its {fit}" if fit == len(group) else f"{fit} of its {len(group)}"
                deferred = (
                    f"gang {name}: {which} members fit together now, but the batch solve left them out "
                    "to keep capacity for the rest of the batch; they are retried with the next batch."
                )
                for p in group:  # as a pod that fits: backed off, not parked
                    self.tell_unschedulable(p, deferred, DEFERRED)
            elif members[name] < gang.min_members or not all(p.preempts for p in group):
                for p, message in told.values():  # preempting would not help: room held is given up
                    self.tell_unschedulable(p, message, "Gang")
            elif not self.rooms.gang_waits_for_victims(told, after_low, freed):
                gangs.append(told)
        if preempting and (emptying := self.consolidator.sealed()):
            preempting = self._wait_for_emptied(preempting, emptying, snap)
        if preempting or gangs:
            # In the batch's (the queue's) order, not the solve's (by priority): reclaim follows
            # it, as between tenants quota decides, not priority; preemption orders by priority
            # itself.
            preempting.sort(key=lambda pe: order[pe[0].key])
            gangs.sort(key=lambda told: min(order[k] for k in told))
            await self.rooms.preempt(preempting, gangs, batch_id, snap, taken_over=bool(never))
        stats = plan.stats
        gap = stats.gap_pct
        solve_s = stats.wall_ms / 1000
        self.metrics.observe_batch(len(batch), solve_s, gap / 100 if not math.isnan(gap) else math.nan)
        if not self.is_leader:  # lost during the preemption's awaits: NaN, not this batch's gap
            self.metrics.new_term()
        if snap.busy or snap.kept:  # they count as full in ``after``: the gauges say what pods hold
            books = self.cache.snapshot().state
            if len(typical):
                frag = await asyncio.to_thread(cluster_frag_ratio, books, typical, ~books.cluster.cordoned)
            after = books
        if self.is_leader:  # lost meanwhile: NaN (``new_term``), not this batch's fragmentation
            self.gauges.cluster(after, frag)
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
            sealed=self.sealed(),
            coming=self.mig.coming(),
        )
        if fresh.cluster is not snap.cluster and not _same_offers(snap.cluster, fresh.cluster):
            # Nodes came, went or changed: the plan, node by node name, against them as they are
            # now (a label no pod reads changing, or a node added, leaves it as good as it was).
            moved = _renumbered(plan, snap.cluster, fresh.cluster)
            problems = plan_problems(moved, fresh.state) if isinstance(moved, Plan) else [moved]
        else:
            # A MIG instance freed during the solve: the plan's pods take it, not a GPU partitioned.
            partitions = needed_partitions(plan.partitions, plan.assignments, fresh.state)
            if len(partitions) < len(plan.partitions):
                plan = replace(plan, partitions=partitions)
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
        freed only together, once every one's victims are gone and no room is kept for a member
        to be created again (``Preemptor.keep_for_namesake``): until then the gang cannot be
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
                if held[2] or self.rooms.kept_for(p.gang.name):  # (or for a member to be created again)
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
        claims, why = self.volume_binding.hold(pod, node)
        if why:  # its claims changed since its batch was solved
            self.spawn(self._bind_with_volumes(pod, node, gpus, (), why), f"volumes:{pod.key}")
        elif claims:  # its room held meanwhile, outside the Bindings in flight
            self.spawn(self._bind_with_volumes(pod, node, gpus, claims), f"volumes:{pod.key}")
        else:
            self._send_bind(pod, node, gpus)

    async def _bind_with_volumes(
        self, pod: Pod, node: str, gpus: tuple[int, ...], claims: tuple[str, ...], why: str = ""
    ) -> None:
        """Bind ``pod`` once ``claims`` are bound for ``node`` (``VolumeBinding``); refuse the
        Binding with ``why`` if given."""
        start = time.perf_counter()
        if not why:
            try:
                why = await self.volume_binding.provide(pod, node, claims)
            except Exception as exc:  # not the API's answer: the pod must not stay in flight
                self.volume_binding.release(pod, claims)
                why = f"binding volumes raised {exc!r}"
            self.metrics.volume_binding(outcome(why))
        if not why and self.is_leader:
            self._send_bind(pod, node, gpus)
            return
        result = BindResult.GONE if why == "pod deleted" else BindResult.FAILED
        if why.startswith(ATTACH_FULL):
            result = BindResult.WITHDRAWN  # placed again at once: the next batch counts the slots taken
        why = why or LEAD_LOST
        # No Binding was sent: counted in gpusched_volume_bindings_total, not as a bind error.
        self._bind_outcome(pod, node, gpus, result, why, sent=False)
        told = "lead_lost" if _lead_lost(result, why) else result.value
        ms = round((time.perf_counter() - start) * 1000, 1)
        log.info("bind", pod=pod.key, node=node, gpus=list(gpus), result=told, why=why, ms=ms)

    def _send_bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> None:
        self._binds_in_flight += 1
        self._binds_unstarted += 1
        self.spawn(self._bind(pod, node, gpus), f"bind:{pod.key}")
        if self._binds_in_flight >= self.max_binds_in_flight:
            self._bind_room.clear()

    def _bind_nominated(self, todo: list[PodRecord]) -> list[PodRecord]:
        """Bind each pod whose victims are gone to the room held for it, as kube-scheduler tries
        a pod's nominated node first: no pod of the batch of its priority or lower may take that
        room.  A gang's members are bound so only all together, at the least important member's
        priority.  Not while the rest of the batch holds a pod of higher priority (of its tenant,
        with tenants) that the room would take and that holds no room of its own:
        kube-scheduler counts a nominated pod only against pods of no higher priority, so the
        room is left to the solve, freed, which places by priority (and the pod, left out, gives
        the room up and looks again).  A pod that holds room of its own waits for it: were it to
        take another's, the room it leaves would cost that pod another preemption.  A MIG pod
        fits the room only on an instance there (``_fits_as_it_is``).  The rest of ``todo``
        (and such pods when their room no longer fits them; a gang's members that hold no room
        when the others, at least its minimum, are bound) is solved as usual."""
        units: dict[str, list[PodRecord]] = defaultdict(list)  # a pod, or a gang's members
        for r in todo:
            units[r.pod.unit].append(r)
        held = {r.key for r in todo if self.cache.nomination(r.key) is not None}
        rivals = [r.pod for r in todo if r.key not in held]
        bound: set[str] = set()
        for group in units.values():
            if any(r.key in held for r in group):
                bound |= self._bind_rooms(group, rivals)
        return [r for r in todo if r.key not in bound]  # in their order: it matters to greedy policies

    def _bind_rooms(self, records: list[PodRecord], rivals: Collection[Pod] = ()) -> set[str]:
        """Bind ``records`` (one pod, or the members of one gang in the batch) to the rooms held
        for them, if each holds one whose victims are gone (of a gang, the members that hold
        one, when they are at least its minimum beside its members running and no member's
        victims are still leaving), they all fit there together, and none of ``rivals`` (the
        pods of the batch that hold no room, but of its own gang) outranks them and fits in one
        of those rooms; the keys of those bound."""
        rooms = {r.key: self.cache.nomination(r.key) for r in records}
        if any(h is not None and h[2] for h in rooms.values()):
            return set()
        if any(h is None for h in rooms.values()):  # a gang may go ahead with those that hold room
            records = [r for r in records if rooms[r.key] is not None]
            gang = self._count_running_members([r.pod for r in records])[0].gang if records else None
            if gang is None or len(records) < gang.min_members:
                return set()
            rivals = [q for q in rivals if q.unit != records[0].pod.unit]
        held = [h for r in records if (h := rooms[r.key]) is not None]
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
            return set()
        floor = min(r.pod.priority for r in records)
        tenant = self.tenants.of(records[0].pod) if self.tenants.active else None
        nodes = {a.node for a in placed}
        outranked = [
            q.key
            for q in rivals
            if q.priority > floor
            and (tenant is None or self.tenants.of(q) == tenant)
            and any(_fits_as_it_is(q, snap.state, i) for i in nodes)
        ]
        if outranked:
            log.info(
                "held room left to the batch's solve: pods of higher priority may take it",
                pods=[r.key for r in records],
                nodes=sorted({h[0] for h in held}),
                higher=outranked[:3],
            )
            return set()
        for p, (node, gpus, _) in zip(pods, held, strict=True):
            self._start_bind(p, node, gpus)
        return {r.key for r in records}

    def give_up_room(self, key: str) -> None:
        """Give up the room held for ``key``, if any: what it held is free for the parked pods."""
        if self.cache.unnominate(key):
            self.queue.move_all()

    def tell_unschedulable(
        self,
        pod: Pod,
        message: str,
        reason: str,
        nominated: str | None = None,
        retry: bool = False,
        after: str | None = None,
        layout: bool = False,
    ) -> None:
        """Tell ``pod`` why it waits (``nominated``: the node where it preempted pods and room is
        held for it; without, any room held for it is given up).  ``retry``: it is backed off,
        to be drawn again soon, rather than parked until the cluster changes.  ``after``: a pod
        whose cleared nomination must be written first (``write_verdict``).  ``layout``: it
        waits for a MIG layout asked for it (condition reason ``MigRepartition``)."""
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
        if reason == DEFERRED or retry:  # it fits now (the solve kept it back), or may soon: try again soon
            self.queue.backoff(pod.key)
            self.retrying.add(pod.key)  # no call for a new node (``unschedulable_records``)
        else:
            self.queue.park(pod.key)
            self.retrying.discard(pod.key)
        # Held back by its tenant's limit alone, the pod is no call for a new node (the cluster
        # autoscaler adds one for reason Unschedulable); a pod waiting for its victims to leave
        # is Unschedulable and nominated, as kube-scheduler writes it.
        # So is a pod waiting for the MIG layout asked for it: it is as good as placed.
        condition = REASON_TENANT_LIMIT if reason == "TenantLimit" and nominated is None else REASON_UNSCHEDULABLE
        if layout and nominated is None:
            condition = REASON_MIG_REPARTITION
        self.write_verdict(pod, message, nominated, condition, after=after)
        log.info("unschedulable", pod=pod.key, reason=reason, message=message)

    def write_verdict(
        self,
        pod: Pod,
        message: str,
        nominated: str | None,
        reason: str = REASON_UNSCHEDULABLE,
        *,
        urgent: bool = False,
        after: str | None = None,
    ) -> None:
        """The pod's ``FailedScheduling`` Event and its condition (with ``nominated``, or none,
        and the condition's ``reason``).

        A node nominated anew is written at once, on the Bindings' client, not behind the Events
        waiting in the outbox: the pod's victims are deleted only after it (``nomination_sent``),
        so that a lead lost meanwhile never leaves victims deleted and no ``nominatedNodeName``
        for the next leader to hold their room by (the pod would preempt again).  So is the
        condition with ``urgent`` (the nomination of a pod whose room another took over,
        cleared).  ``after``: the key of a pod whose urgent write lands first (the room's last
        holder, cleared before its new holder is named: a leader that takes over in between
        does not see two pods hold one room)."""
        self._write(("event", pod.key), lambda: self._verdict_event(pod, message))
        record = self.queue.record(pod.key)
        anew = nominated is not None and (record is None or record.nominated != nominated)
        if not anew and not urgent:

            async def condition() -> None:
                await self.nomination_sent(pod.key)  # a later word must land after it, not before
                if after is not None:
                    await self.nomination_sent(after)
                await self._verdict_condition(pod, message, nominated, reason)

            self._write(("condition", pod.key), condition)
            return
        self.outbox.discard(("condition", pod.key))  # an older word waiting there must not come after
        # Its own earlier word, and the room's last holder's cleared one, land first.
        first = {t for k in (pod.key, after) if k is not None and (t := self._nominating.get(k)) is not None}

        async def nominate() -> None:
            if first:
                await asyncio.wait(first)  # written or not; not cancelled with the caller
            await self._verdict_condition(pod, message, nominated, reason, urgent=True)

        task = self.spawn(nominate(), f"nominate:{pod.key}")
        self._nominating[pod.key] = task

        def sent(t: asyncio.Task[None]) -> None:
            if self._nominating.get(pod.key) is t:  # (not a later one's)
                del self._nominating[pod.key]

        task.add_done_callback(sent)

    async def nomination_sent(self, key: str) -> None:
        """Until the status write naming the node where ``key`` preempts, if one is on its way,
        is over (written or not)."""
        task = self._nominating.get(key)
        if task is not None:
            await asyncio.wait({task})  # not cancelled with the caller

    def _write(self, key: tuple[str, str], write: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A verdict's write, through the outbox: only the latest per pod waits to be sent."""
        for _ in range(self.outbox.put(key, write)):
            self.spawn(self.outbox.work(), OUTBOX_TASK).add_done_callback(self.outbox.worker_done)

    async def _verdict_event(self, pod: Pod, message: str) -> None:
        if not self.cache.holds(pod.key, pod.uid):  # else bound since: the verdict is out of date
            await self.binder.event(pod, "FailedScheduling", message, "Warning", fenced=True)

    async def _verdict_condition(
        self, pod: Pod, message: str, nominated: str | None, reason: str = REASON_UNSCHEDULABLE, urgent: bool = False
    ) -> None:
        """The condition and nominated node, against what the pod shows when it is sent (not
        when the verdict was reached): not for a pod bound since, gone or replaced.  ``urgent``:
        on the Bindings' client (``Binder.unschedulable``)."""

        def stands() -> bool:
            record = self.queue.record(pod.key)
            return not self.cache.holds(pod.key, pod.uid) and (record is None or record.uid == pod.uid)

        if not stands():
            return
        record = self.queue.record(pod.key)
        current = record.unschedulable if record is not None else None
        was = record.nominated if record is not None else None
        current_reason = record.unschedulable_reason if record is not None and current is not None else None
        more: dict[str, Any] = {"urgent": True} if urgent else {}
        await self.binder.unschedulable(
            pod, message, current, nominated, was, still=stands, reason=reason, current_reason=current_reason, **more
        )

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
                        result, why = BindResult.FAILED, LEAD_LOST
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
        told = "lead_lost" if _lead_lost(result, why) else result.value
        log.info("bind", pod=pod.key, node=node, gpus=list(gpus), result=told, why=why or None, ms=ms)

    def _bind_outcome(
        self, pod: Pod, node: str, gpus: tuple[int, ...], result: BindResult, why: str, sent: bool = True
    ) -> None:
        """Act on how a Binding ended: the books, the queue, the Events and the counters (a bind
        error only for a Binding ``sent``: not one refused before, for its volumes)."""
        if result is BindResult.BOUND:
            self._refusals.pop(pod.key, None)
            for kind in ("event", "condition"):  # a verdict still waiting to be sent is out of date
                self.outbox.discard((kind, pod.key))
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
            if result is BindResult.FAILED:  # a lead lost is told apart: nothing failed
                if _lead_lost(result, why):
                    self.metrics.bind_error("lead_lost")
                elif sent:
                    self.metrics.bind_error("failed")
                self.queue.backoff(pod.key)
                if self.is_leader:  # a lead lost is not the pod's trouble: the new leader places it
                    self.spawn(
                        self.binder.event(pod, "FailedScheduling", f"Binding rejected: {why}", "Warning", fenced=True),
                        f"event:{pod.key}",
                    )
            else:
                if result is BindResult.TAKEN:
                    self.metrics.bind_error("taken")
                self.queue.done(pod.key)

    def _wait_for_emptied(
        self, pods: list[tuple[Pod, Explanation]], emptying: set[str], snap: Snapshot
    ) -> list[tuple[Pod, Explanation]]:
        """Of ``pods`` (left out, about to look for victims), those that would not fit on a node
        a consolidation round is emptying were it open now: the others wait for it (its evicted
        pods terminate for their grace period), rather than evict running work for room that is
        about to be free.  Told so, and retried soon."""
        open_ = self.cache.snapshot(busy=self.busy_gpus(), sealed=self.mig.sealed())
        rows = [i for n in sorted(emptying) if (i := open_.cluster.index.get(n)) is not None]
        out = []
        for p, e in pods:
            mask = open_.state.pod_mask(p)
            node = next((open_.cluster.nodes[i].name for i in rows if mask[i]), None)
            if node is None:
                out.append((p, e))
                continue
            message = (
                f"{self.with_notes(p, e.message, snap).rstrip('.')}; node {node} is being emptied by consolidation "
                "and will have room once the pods evicted there are gone: the pod waits for it rather than preempt."
            )
            self.tell_unschedulable(p, message, e.reason, retry=True)
        return out

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
        if view is None:
            return None
        busy = self.cache.as_booked(view.at_least(u.busy_percent))
        return (busy if u.gpu_indices_honoured else self.cache.unexplained(busy)) or None

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
                told = self.gauges.check_node_names(told)
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

    def _for_kept(self, pods: Iterable[Pod]) -> Callable[[Pod], bool]:
        """Whether a pod of ``pods`` may take the GPUs the headroom keeps free: of its priority
        or more, and, for a gang's member, every member of the batch too (a gang with one member
        below the priority is below it as a whole)."""
        low = {p.gang.name for p in pods if p.gang is not None and self.below_headroom(p)}
        return lambda p: not self.below_headroom(p) and (p.gang is None or p.gang.name not in low)

    def below_headroom(self, pod: Pod) -> bool:
        """Whether ``pod`` may not take the GPUs the headroom keeps free."""
        return pod.priority < self.config.headroom.priority_at_least

    def _check_headroom_models(self, cluster: Cluster) -> None:
        """Warn, once per setting, when the headroom can keep no GPU of the cluster (pods of high
        priority must then preempt): ``headroom.models`` names no GPU product of it, or every node
        of those products carries a taint that ``headroom.toleratedTaints`` leaves out."""
        h = self.config.headroom
        setting = (tuple(h.models), tuple(h.tolerated_taints))
        if not h.gpus or setting == self._headroom_checked or not len(cluster) or not cluster.gpu_count.any():
            return
        models = setting[0]
        if models and not cluster.named_mask(models).any():
            self._headroom_checked = setting
            products = sorted({n.gpu_model for n in cluster.nodes if n.gpu_model})
            log.warning(
                "headroom models match no node",
                models=list(models),
                products=products[:8],
                fix="headroom.models takes the nodes' nvidia.com/gpu.product values (a leading NVIDIA- may go)",
            )
            return
        if keepable(cluster, models, frozenset(h.tolerated_taints)).any():
            self._headroom_checked = setting
            return
        mine = [
            i
            for i, n in enumerate(cluster.nodes)
            if n.gpu_count and (not models or cluster.named_mask(models)[i]) and not cluster.cordoned[i]
        ]
        taints = sorted(
            {t.key for i in mine for t in cluster.taint_sets[cluster.taint_id[i]]}
            - set(h.tolerated_taints)
            - {k for i in mine for t in cluster.taint_sets[cluster.taint_id[i]] if (k := t.key).startswith(PASSING)}
        )
        if taints:  # (taints that pass, such as not-ready while a node joins, are looked at again later)
            self._headroom_checked = setting
            log.warning(
                "headroom keeps no GPU: every GPU node it may use has a taint it does not tolerate",
                taints=taints[:8],
                tolerated=list(h.tolerated_taints),
                fix="add the keys the critical pods tolerate to headroom.toleratedTaints",
            )

    def keep_free(self, pods: Iterable[Pod] | None = None) -> dict[str, Any]:
        """What ``Cache.snapshot`` is to keep free from ``pods`` (None: from pods of low priority):
        the headroom's GPUs when any of them is below its priority; else none."""
        h = self.config.headroom
        if not h.gpus or (pods is not None and not any(self.below_headroom(p) for p in pods)):
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
        them given back: the batch's plan with theirs added.  A gang goes there only as a whole
        of high priority; the members of one the plan placed its minimum of, each as it fits."""
        # A gang with one member below the priority is below it as a whole, its placed ones too.
        every = [*plan.unplaced, *(a.pod for a in plan.assignments)]
        below = {p.gang.name for p in every if p.gang is not None and self.below_headroom(p)}
        high = [p for p in plan.unplaced if not self.below_headroom(p) and (p.gang is None or p.gang.name not in below)]
        if not high:
            return plan, after, frag
        original = {p.key: p for p in high}
        high = beside_placed(high, plan.assignments, after)
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
            assignments=plan.assignments + tuple(replace(a, pod=original[a.pod.key]) for a in extra.assignments),
            unplaced=tuple(p for p in plan.unplaced if p.key not in placed),
            partitions=plan.partitions + extra.partitions,
        )
        return merged, after2, frag2

    def with_notes(
        self,
        pod: Pod,
        message: str,
        snap: Snapshot | None,
        state: ClusterState | None = None,
        below: bool | None = None,
    ) -> str:
        """``message``, saying also how many GPUs ``pod`` could have used the batch did not offer
        it, and why (busy; kept free for pods of higher priority), when it found no room; for a
        MIG pod, also why no node is re-partitioned for it (``Repartitioner.paused``).
        ``state``: what the pod was weighed against (default: the snapshot's); ``below``:
        whether the kept GPUs are not for it (default: by its own priority)."""
        gpus = pod.num_gpu or pod.gpu_milli or pod.mig_profile
        paused = self.mig.paused() if pod.mig_profile else ""
        if snap is None or not (snap.busy_cells or snap.kept or snap.sealed or paused) or not gpus:
            return message
        notes = []
        if snap.sealed:
            sealed = len(snap.sealed)
            notes.append(
                f"{sealed} node{'s' if sealed != 1 else ''} being re-partitioned into MIG instances "
                f"{'were' if sealed != 1 else 'was'} not offered"
            )
        if pod.mig_profile and (inherited := self.mig.inherited()):
            many = len(inherited) != 1
            names = ", ".join(inherited[:3]) + (", ..." if len(inherited) > 3 else "")
            notes.append(
                f"no node is given a new MIG layout until node{'s' if many else ''} {names}, asked for one "
                f"before this instance led, {'advertise' if many else 'advertises'} it or "
                f"{'are' if many else 'is'} given up"
            )
        if paused:
            notes.append(paused)
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
        below = self.below_headroom(pod) if below is None else below
        kept = sum(1 for i, _ in snap.kept if host[i]) if below else 0
        if kept:
            notes.append(
                f"{kept} idle GPU{'s' if kept != 1 else ''} {'are' if kept != 1 else 'is'} kept free for pods of "
                f"priority {self.config.headroom.priority_at_least} or more (headroom)"
            )
        return "; ".join([message.rstrip("."), *notes]) + "." if notes else message

    def unschedulable_records(self) -> list[PodRecord]:
        """The pending pods waiting as unschedulable: parked, or told so and drawn again since
        (any change in the cluster draws every parked pod; until a batch tells them again,
        they wait all the same)."""
        parked = self.queue.parked()
        seen = {r.key for r in parked}
        pending = self.queue.pending_keys()
        self.retrying.intersection_update(pending)  # (those bound or gone are forgotten)
        # Not those last told they fit but were kept back (deferred), or hit an internal error:
        # they are retried, and more nodes would not place them sooner.
        again = (self.queue.record(k) for k in pending if k not in seen and k not in self.retrying)
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
            self.with_volumes(r)
            for r in records
            if not r.error
            and not self.cache.holds(r.key, r.uid)
            and self.cache.nomination(r.key) is None
            and (r.key, r.uid) not in aside
            and not (
                r.claims and self.claims.problem(r.key, r.uid, r.claims, r.ephemeral_claims, self.cache.claim_users())
            )
            and (
                (g := r.pod.gang) is None
                or (g.name not in blocked and self.queue.gang_pending(g.name) + held[g.name][0] >= g.min_members)
            )
        ]
        if self.tenants.active and pods:
            usage = self.cache.tenant_usage(self.tenants, terminating=True)
            admitted, _ = self.tenants.admit(count_running_members(pods, self.cache), usage)
            over = self.tenants.trim(admitted, usage)
            kept = {p.key for p in admitted} - over
            pods = [p for p in pods if p.key in kept]
        return pods

    def sealed(self) -> set[str]:
        """Nodes no batch puts GPU work on now: those being re-partitioned into MIG instances, and
        those a consolidation round is emptying while the pods it evicted there terminate."""
        return self.mig.sealed() | self.consolidator.sealed()

    def with_volumes(self, r: PodRecord) -> Pod:
        """``r``'s pod, held to the nodes the volumes its claims are bound to may be used on."""
        if not r.claims:
            return r.pod
        bound = self.claims.selector(r.pod.namespace, r.claims)
        provisioned = self.claims.provision_selector(
            r.pod.namespace, r.claims, lambda: (n.node for n in self.cache.nodes.values())
        )
        attach = self.claims.attach_selector(r.pod.namespace, r.claims, self._attached_now)
        if not bound and not provisioned and not attach:
            return r.pod
        return replace(r.pod, volume_selector=bound, provision_selector=provisioned, attach_selector=attach)

    def _attached_now(self) -> dict[str, set[tuple[str, str]]]:
        """Per node, the CSI attachments of the pods on the books (kube-scheduler's
        NodeVolumeLimits counts them), read again only when the books or the claims changed."""
        at = (self.cache.generation, self.claims.changes)
        if self._attached_at != at:
            self._attached_at = at
            self._attached = self.claims.attached(self.cache.on_nodes())
        return self._attached

    def kept_now(self) -> tuple[tuple[str, int], ...]:
        """The GPUs (node name, index) the headroom would keep free from a batch now (busy ones
        left out)."""
        keep = self.keep_free()
        if not keep:
            return ()
        snap = self.cache.snapshot(busy=self.busy_gpus(), sealed=self.sealed(), **keep)
        return tuple((snap.cluster.nodes[i].name, g) for i, g in snap.kept)


def _load_malloc_trim() -> Callable[[int], int] | None:
    with contextlib.suppress(OSError, AttributeError):
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    return None  # not glibc


_MALLOC_TRIM = _load_malloc_trim()


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
            out.append(replace(p, gang=g.beside(*held[g.name])))
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


ISOLATED_UNITS = 4
"""Units of a batch whose handling raised that the next batch handles one by one; more are
handled in halves (which raise again, and are halved again, until the culprit is alone)."""

PRIORITY_PASSES = 3
"""The most priority levels of one batch placed each in a pass of its own; the lowest levels
beyond share the last pass."""


def _fits_as_it_is(pod: Pod, state: ClusterState, node: int) -> bool:
    """Whether ``pod`` fits on ``node`` of ``state`` as it is: a MIG pod on a free instance of its
    profile there, not on a GPU that would have to be re-partitioned for it."""
    if not state.pod_mask(pod)[node]:
        return False
    if not pod.mig_profile:
        return True
    col = state.cluster.mig_id(pod.mig_profile)
    return col >= 0 and bool(state.mig_free[node, col] > 0)


def _passes(pods: list[Pod], first: Collection[str] = ()) -> list[list[Pod]]:
    """The batch in the parts placed one after the other, each in what the earlier left: the
    pods within their tenant's quota (``first``), then the others; and within each, by
    priority, highest first (a gang, placed in one pass, at its lowest member's: the priority it
    preempts at and the headroom weighs it at, so that no pod it went ahead of may preempt one
    of its members right after), as kube-scheduler's queue takes pods: a pod of low priority
    never takes the room a pod of higher priority in the same batch needs.  A part with a pod
    whose required pod affinity a pod of a lower level answers is placed in one pass."""
    least: dict[str, int] = {}
    for p in pods:
        if p.gang is not None:
            least[p.gang.name] = min(least.get(p.gang.name, p.priority), p.priority)

    def level(p: Pod) -> int:
        return least[p.gang.name] if p.gang is not None else p.priority

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
    kept: Sequence[tuple[int, int]] = (),
    for_kept: Callable[[Pod], bool] | None = None,
) -> tuple[Plan, ClusterState, float]:
    """Runs in a worker thread: the plan, the state after it and its fragmentation ratio.
    The batch is placed in the parts ``_passes`` gives (``first``: keys of the pods within their
    tenant's quota), each against the state the earlier ones left (and a gang's members left to
    a later part beside those an earlier one placed: ``beside_placed``).  ``kept``: the GPUs the
    headroom keeps free (counted full in ``state``), given back to a part whose pods all may
    take them (``for_kept``), and the ones it leaves counted full again for the parts after.

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
    for i, given in enumerate(parts):
        # A gang's members placed in an earlier pass: the rest go beside them.
        part = beside_placed(given, plan.assignments, now) if i and plan is not None else given
        until = None
        if deadline is not None:  # each pass its share of what is left of the batch's one limit
            until = time.perf_counter() + max(deadline - time.perf_counter(), 0.0) * len(part) / max(left, 1)
        left -= len(part)
        opened = bool(kept) and for_kept is not None and all(map(for_kept, part))
        if opened:  # pods of the headroom's priority: the GPUs kept free are theirs too
            now = now.with_gpus_at(kept, 0)
        step = _place(policy, part, now, quick, until)
        if opened:
            taken = {(a.node, g) for a in step.assignments for g in a.gpus}
            kept = [c for c in kept if c not in taken]
            now = now.with_gpus_at(kept, GPU_MILLI)  # (applied below: these stay untouched by the step)
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
    elif len(parts) > 1:  # the pods as given, not as counted beside the members placed earlier
        by_key = {p.key: p for p in pods}
        plan = replace(
            plan,
            assignments=tuple(replace(a, pod=by_key.get(a.pod.key, a.pod)) for a in plan.assignments),
            unplaced=tuple(by_key.get(p.key, p) for p in plan.unplaced),
        )
    frag = cluster_frag_ratio(now, typical, ~now.cluster.cordoned) if len(typical) else 0.0
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return plan, now, frag


def _place(policy: Policy, pods: list[Pod], state: ClusterState, quick: bool, deadline: float | None = None) -> Plan:
    if isinstance(policy, TimedPolicy) and deadline is not None:
        return policy.place_until(pods, state, deadline, quick)
    return place_quick(policy, pods, state) if quick else policy.place(pods, state)
