"""Prometheus metrics of the scheduler and the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``.

``SchedulerMetrics`` keeps its metrics in a private ``CollectorRegistry`` rather than the process-wide
default one, so that several instances (one per test, one per simulated scheduler) never collide.
``HealthServer`` serves that registry in the Prometheus text format together with the two probes a
Deployment points its liveness and readiness checks at.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Mapping

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpusched.model.mig import GEOMETRIES

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "BIND_ERROR_REASONS",
    "MIG_REPARTITION_RESULTS",
    "PENDING_QUEUES",
    "POLL_RESULTS",
    "RELOAD_RESULTS",
    "SOLVE_SECONDS_BUCKETS",
    "VOLUME_BINDING_RESULTS",
    "HealthServer",
    "ReadyCheck",
    "SchedulerMetrics",
]

log = structlog.get_logger("gpusched.metrics")

NAMESPACE = "gpusched"

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 10_000)
"""Up to the largest ``batching.maxSize`` the configuration accepts."""
SOLVE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
"""Up to the largest ``solver.timeLimitSeconds`` the configuration accepts."""

PENDING_QUEUES: tuple[str, ...] = ("active", "backoff", "unschedulable")
"""Values of the ``queue`` label of ``gpusched_pending_pods``."""

RELOAD_RESULTS: tuple[str, ...] = ("ok", "rejected")
"""Values of the ``result`` label of ``gpusched_config_reloads_total``."""

POLL_RESULTS: tuple[str, ...] = ("ok", "error")
"""Values of the ``result`` label of ``gpusched_utilisation_polls_total``."""

BIND_ERROR_REASONS: tuple[str, ...] = ("failed", "unknown", "taken", "lead_lost")
"""Values of the ``reason`` label of ``gpusched_bind_errors_total``."""

MIG_REPARTITION_RESULTS: tuple[str, ...] = ("requested", "success", "failed", "timeout", "error")
"""Values of the ``result`` label of ``gpusched_mig_repartitions_total``."""

VOLUME_BINDING_RESULTS: tuple[str, ...] = ("ready", "failed", "timeout", "gone", "lead_lost")
"""Values of the ``result`` label of ``gpusched_volume_bindings_total``."""

ReadyCheck = Callable[[], tuple[bool, str]]
"""Readiness callback of ``HealthServer``: ``(ready, reason)``; ``reason`` explains a ``False``."""

_TEXT = "text/plain"


_MIG_PROFILES = frozenset(p for g in GEOMETRIES.values() for p in g.profiles)
_INSUFFICIENT_MIG = "Insufficient nvidia.com/mig-"


def reason_label(reason: str) -> str:
    """``reason`` as the ``reason`` label: a taint's value (a timestamp, in the autoscaler's
    ``ToBeDeletedByClusterAutoscaler``) and a MIG profile no GPU has are left out, so that the
    series stay few."""
    if reason.startswith("node(s) had untolerated taint"):
        return "node(s) had untolerated taint"
    if reason.startswith(_INSUFFICIENT_MIG) and reason.removeprefix(_INSUFFICIENT_MIG) not in _MIG_PROFILES:
        return _INSUFFICIENT_MIG.rstrip("-")
    return reason


class SchedulerMetrics:
    """Every metric the scheduler exports, in a registry owned by this instance.

    Label children whose values are known in advance (the pending queues, the results of
    reloads, polls and MIG re-partitions, the reasons of bind errors) exist from construction,
    so their series show ``0`` before the first update: ``increase()`` over a series that
    appears at 1 misses that first event.
    Gauges that follow live state (queue depths, the cluster's GPUs) are set by the callbacks
    given to ``on_scrape``, which ``render`` calls first, so a scrape never reads them stale.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self._batch_size = Histogram(
            "batch_size",
            "Pods in each batch handed to the solver.",
            namespace=NAMESPACE,
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        self._solve_seconds = Histogram(
            "solve_seconds",
            "Wall-clock seconds spent placing one batch (model build and solve).",
            namespace=NAMESPACE,
            buckets=SOLVE_SECONDS_BUCKETS,
            registry=reg,
        )
        self._solve_gap_ratio = Gauge(
            "solve_gap_ratio",
            "Relative optimality gap of the last solve, 0..1; NaN when the greedy fallback was used, or before "
            "the first solve of this term as leader.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._solve_gap_ratio.set(math.nan)
        self._pods_scheduled = Counter(
            "pods_scheduled",
            "Pods bound to a node by this scheduler.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._pods_unschedulable = Counter(
            "pods_unschedulable",
            "Pods a batch could not place, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._preemption_victims = Counter(
            "preemption_victims",
            "Running pods of lower priority deleted to make room for pending ones.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._preemption_attempts = Counter(
            "preemption_attempts",
            "Pending pods that found no room and looked for pods of lower priority to preempt.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._reclaim_attempts = Counter(
            "reclaim_attempts",
            "Pending pods within their tenant's quota that found no room and looked for GPUs other tenants borrowed.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._reclaim_victims = Counter(
            "reclaim_victims",
            "Running pods of tenants past their quota deleted to give GPUs back to a tenant within its own.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._consolidated_nodes = Counter(
            "consolidation_nodes",
            "GPU nodes emptied by moving their pods onto other nodes in use.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._consolidation_evictions = Counter(
            "consolidation_evictions",
            "Pods evicted to consolidate GPU work onto fewer nodes.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._consolidation_refused = Counter(
            "consolidation_evictions_refused",
            "Pods consolidation asked to evict that the Eviction API refused (a disruption budget, a webhook).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._mig_repartitions = Counter(
            "mig_repartitions",
            "Nodes given new MIG layouts, by outcome: requested, success, failed, timeout, error.",
            ["result"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._volume_bindings = Counter(
            "volume_bindings",
            "Pods placed whose claims were bound for their node before their Binding (a volume made beforehand, "
            "or one provisioned), by outcome: ready, failed, timeout, gone (the pod deleted), lead_lost.",
            ["result"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._waiting_for_volumes = Gauge(
            "pods_waiting_for_volumes",
            "Pods placed, their room held, whose claims are being bound for their node (by the volume controller "
            "or a provisioner) before they are bound.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._tenant_gpus = Gauge(
            "tenant_gpus",
            "GPUs each tenant holds (a share counts its fraction), with room held for its preempting pods.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._tenant_quota = Gauge(
            "tenant_quota_gpus",
            "GPUs each tenant is guaranteed (tenants that hold GPUs or are named in the configuration).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._bind_errors = Counter(
            "bind_errors",
            "Binding requests that failed, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._batches_failed = Counter(
            "batches_failed",
            "Batches whose handling raised an error (a defect: the log line 'batch failed' has the traceback); "
            "their pods were backed off and tried again.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._pending_pods = Gauge(
            "pending_pods",
            "Pods waiting in the scheduling queue, by sub-queue (active, backoff, unschedulable).",
            ["queue"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpu_allocation_ratio = Gauge(
            "gpu_allocation_ratio",
            "Allocated GPU share (a MIG slice as its compute slices' part of its GPU) divided by gpusched_gpus, 0..1.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpu_fragmentation_ratio = Gauge(
            "gpu_fragmentation_ratio",
            "Share of the cluster's free GPU capacity that typical pods cannot use, 0..1, after the last batch "
            "(NaN before the first batch of this term as leader).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpu_fragmentation_ratio.set(math.nan)
        self._gpus = Gauge(
            "gpus",
            "GPUs on the nodes this scheduler manages that are not cordoned, whole and in MIG mode.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpu_nodes_active = Gauge(
            "gpu_nodes_active",
            "GPU nodes with at least one GPU in use.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpu_nodes_idle = Gauge(
            "gpu_nodes_idle",
            "GPU nodes, not cordoned, with no GPU in use: what a cluster autoscaler could remove.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._unschedulable_gpu_demand = Gauge(
            "unschedulable_gpu_demand",
            "GPUs asked for by the pods waiting as unschedulable (a share as its fraction): what more nodes "
            "would have to offer.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpus_kept_free = Gauge(
            "gpus_kept_free",
            "Idle GPUs kept free for pods of headroom.priorityAtLeast or more (at most headroom.gpus).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._is_leader = Gauge(
            "is_leader",
            "1 while this replica holds the leader lease, else 0.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._config_reloads = Counter(
            "config_reloads",
            "Configuration reloads, by result (ok, rejected).",
            ["result"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._weights = Gauge(
            "solver_weight",
            "Objective weights of the configuration in force, by term.",
            ["term"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._utilisation_polls = Counter(
            "utilisation_polls",
            "Queries to Prometheus for GPU utilisation (DCGM), by result (ok, error).",
            ["result"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self._utilisation_age = Gauge(
            "utilisation_age_seconds",
            "Age of the last GPU utilisation answer; NaN before the first.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpus_busy = Gauge(
            "gpus_busy",
            "GPUs at utilisation.busyPercent or above by the last answer young enough to use (NaN: none).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self._gpus_allocated_idle = Gauge(
            "gpus_allocated_idle",
            "GPUs that pods hold and that are used less than utilisation.idlePercent, by the last answer "
            "young enough to use (NaN: none).",
            namespace=NAMESPACE,
            registry=reg,
        )
        for queue in PENDING_QUEUES:
            self._pending_pods.labels(queue=queue).set(0)
        for result in RELOAD_RESULTS:
            self._config_reloads.labels(result=result)
        for result in POLL_RESULTS:
            self._utilisation_polls.labels(result=result)
        for reason in BIND_ERROR_REASONS:
            self._bind_errors.labels(reason=reason)
        for result in MIG_REPARTITION_RESULTS:
            self._mig_repartitions.labels(result=result)
        for result in VOLUME_BINDING_RESULTS:
            self._volume_bindings.labels(result=result)
        for unknown in (self._utilisation_age, self._gpus_busy, self._gpus_allocated_idle):
            unknown.set(math.nan)  # until an answer is read
        self._on_scrape: list[Callable[[], None]] = []

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        """Call ``refresh`` at the start of every ``render`` (it sets gauges from live state)."""
        self._on_scrape.append(refresh)

    def observe_batch(self, size: int, solve_seconds: float, gap_ratio: float) -> None:
        """Record one solved batch: its pod count, its solve time and the relative gap (NaN allowed)."""
        self._batch_size.observe(size)
        self._solve_seconds.observe(solve_seconds)
        self._solve_gap_ratio.set(gap_ratio)

    def scheduled(self, n: int = 1) -> None:
        """Count ``n`` pods bound."""
        self._pods_scheduled.inc(n)

    def unschedulable(self, reason: str, n: int = 1) -> None:
        """Count ``n`` pods left unplaced for ``reason`` (``reason_label``: one series per kind
        of reason, never per taint value or pod-chosen name)."""
        self._pods_unschedulable.labels(reason=reason_label(reason)).inc(n)

    def new_term(self) -> None:
        """This instance leads again, or no longer leads: what its last term's batches measured
        (the solve gap, the fragmentation) is not to be exported as this term's (NaN until a
        batch measures them again)."""
        self._solve_gap_ratio.set(math.nan)
        self._gpu_fragmentation_ratio.set(math.nan)

    def preemption(self, attempts: int, victims: int) -> None:
        """Count ``attempts`` pods that looked for room by preemption and the ``victims`` evicted."""
        self._preemption_attempts.inc(attempts)
        self._preemption_victims.inc(victims)

    def reclaim(self, attempts: int, victims: int) -> None:
        """Count ``attempts`` pods that looked for borrowed GPUs to reclaim and the ``victims`` evicted."""
        self._reclaim_attempts.inc(attempts)
        self._reclaim_victims.inc(victims)

    def consolidation(self, nodes: int, evicted: int, refused: int = 0) -> None:
        """Count ``nodes`` emptied, the pods ``evicted`` from them and those whose eviction was ``refused``."""
        self._consolidated_nodes.inc(nodes)
        self._consolidation_evictions.inc(evicted)
        self._consolidation_refused.inc(refused)

    def mig_repartition(self, result: str) -> None:
        """Count one MIG re-partition of a node ending (or starting: ``requested``) so."""
        self._mig_repartitions.labels(result).inc()

    def set_tenants(self, held: Mapping[str, float], quota: Mapping[str, float]) -> None:
        """Set the tenants' gauges (GPUs held and guaranteed, by tenant); tenants no longer given are dropped."""
        for gauge, values in ((self._tenant_gpus, held), (self._tenant_quota, quota)):
            gauge.clear()
            for tenant, value in values.items():
                gauge.labels(tenant=tenant).set(value)

    def volume_binding(self, result: str) -> None:
        """Count one pod's wait for its claims ending so."""
        self._volume_bindings.labels(result).inc()

    def set_waiting_for_volumes(self, pods: int) -> None:
        self._waiting_for_volumes.set(pods)

    def bind_error(self, reason: str) -> None:
        """Count one failed binding for ``reason``."""
        self._bind_errors.labels(reason=reason).inc()

    def batch_failed(self) -> None:
        """Count one batch whose handling raised an error."""
        self._batches_failed.inc()

    def set_pending(self, active: int, backoff: int, unschedulable: int) -> None:
        """Set the depth of each scheduling sub-queue."""
        for queue, depth in zip(PENDING_QUEUES, (active, backoff, unschedulable), strict=True):
            self._pending_pods.labels(queue=queue).set(depth)

    def set_cluster(
        self,
        gpus: float,
        allocation_ratio: float,
        fragmentation_ratio: float | None,
        active_gpu_nodes: int,
    ) -> None:
        """Set the cluster gauges: the GPUs, allocated share, fragmentation (``None``: left as it
        is) and active GPU nodes."""
        self._gpus.set(gpus)
        self._gpu_allocation_ratio.set(allocation_ratio)
        if fragmentation_ratio is not None:
            self._gpu_fragmentation_ratio.set(fragmentation_ratio)
        self._gpu_nodes_active.set(active_gpu_nodes)

    def set_signals(self, idle_gpu_nodes: int, unschedulable_gpu_demand: float, kept_free: int) -> None:
        """Set the autoscaling gauges (idle GPU nodes, the GPUs the unschedulable pods ask for)
        and how many idle GPUs the headroom keeps free now."""
        self._gpu_nodes_idle.set(idle_gpu_nodes)
        self._unschedulable_gpu_demand.set(unschedulable_gpu_demand)
        self._gpus_kept_free.set(kept_free)

    def utilisation_poll(self, ok: bool) -> None:
        """Count one query for GPU utilisation, answered (``ok``) or not."""
        self._utilisation_polls.labels(result="ok" if ok else "error").inc()

    def set_utilisation(self, age_seconds: float, busy: float, allocated_idle: float) -> None:
        """Set the utilisation gauges: the answer's age (NaN: none yet), busy GPUs, GPUs held idle
        (NaN: no answer young enough to use)."""
        self._utilisation_age.set(age_seconds)
        self._gpus_busy.set(busy)
        self._gpus_allocated_idle.set(allocated_idle)

    def set_leader(self, leader: bool) -> None:
        """Set ``gpusched_is_leader`` to 1 or 0."""
        self._is_leader.set(1 if leader else 0)

    def config_reload(self, ok: bool) -> None:
        """Count one configuration reload, accepted (``ok``) or rejected."""
        self._config_reloads.labels(result="ok" if ok else "rejected").inc()

    def clear_weights(self) -> None:
        """No ``gpusched_solver_weight`` series: no weights are in force (the ConfigMap's
        document is not read or not valid yet), not the built-in defaults."""
        self._weights.clear()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Publish the objective weights in force (``gpusched_solver_weight{term}``)."""
        for term, value in weights.items():
            self._weights.labels(term=term).set(value)

    def render(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format, and its ``Content-Type``.

        The ``on_scrape`` callbacks run first; one that fails leaves its gauges at their last
        values (and is logged) rather than failing the scrape."""
        for refresh in self._on_scrape:
            try:
                refresh()
            except Exception as exc:
                log.warning("metrics refresh failed; its gauges keep their last values", error=repr(exc))
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class HealthServer:
    """HTTP endpoints of the daemon, on ``host``:``port``.

    - ``GET /metrics``: ``metrics.render()``.
    - ``GET /healthz``: 200 ``ok`` whenever the event loop answers (liveness).
    - ``GET /readyz``: calls ``ready`` (a ``ReadyCheck``: ``() -> (ready, reason)``); 200 ``ok`` when
      ``ready`` is true, else 503 with ``not ready: <reason>``.  A callback that raises counts as not
      ready, with the exception as the reason.  Without a callback the server is ready once started.

    ``port=0`` binds an ephemeral port; after ``start()``, ``port`` is the bound one.  Access logs
    are off.  ``stop()`` may be called any number of times, also before ``start()``.
    """

    def __init__(
        self,
        metrics: SchedulerMetrics,
        *,
        host: str = "",  # every interface, IPv4 and IPv6: a pod serves its probes on all
        port: int = 8080,
        ready: ReadyCheck | None = None,
        shutdown_timeout: float = 5.0,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self._port = port
        self._ready = ready
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The configured port before ``start()``; the bound port while running."""
        return self._port

    @property
    def running(self) -> bool:
        """True between ``start()`` and ``stop()``."""
        return self._runner is not None

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_get("/healthz", self._handle_healthz)
        app.router.add_get("/readyz", self._handle_readyz)
        return app

    async def start(self) -> None:
        """Bind and begin serving; raises ``RuntimeError`` if already running, ``OSError`` if the bind fails."""
        if self._runner is not None:
            raise RuntimeError("HealthServer is already running")
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=self._shutdown_timeout)
        await runner.setup()
        try:
            if self._port == 0 and not self.host:
                await self._start_on_a_free_port(runner)
            else:
                await web.TCPSite(runner, self.host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        addresses = runner.addresses
        if addresses:
            self._port = int(addresses[0][1])
        self._runner = runner

    async def _start_on_a_free_port(self, runner: web.AppRunner) -> None:
        """Every interface on one free port: left to the system, each address family would get
        a port of its own, and only one could be told."""
        for attempt in range(5):
            with socket.socket() as probe:
                probe.bind(("", 0))
                port = int(probe.getsockname()[1])
            try:
                await web.TCPSite(runner, self.host, port).start()
                return
            except OSError:  # taken meanwhile, in one of the families
                if attempt == 4:
                    raise

    async def stop(self) -> None:
        """Stop serving and release the socket; a no-op when not running."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def readiness(self) -> tuple[bool, str]:
        """The current ``(ready, reason)`` as ``/readyz`` reports it."""
        if self._ready is None:
            return True, ""
        try:
            ready, reason = self._ready()
        except Exception as exc:  # a broken check must not take the probe endpoint down
            return False, f"readiness check failed: {exc!r}"
        return bool(ready), reason

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _handle_healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", content_type=_TEXT)

    async def _handle_readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.readiness()
        if ready:
            return web.Response(text="ok", content_type=_TEXT)
        text = f"not ready: {reason}" if reason else "not ready"
        return web.Response(status=503, text=text, content_type=_TEXT)
