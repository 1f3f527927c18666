"""The scheduler's gauges read from the books: queue depths, GPUs and their allocation, the
autoscaling signals, tenants' GPUs, and what the utilisation answer finds busy or idle.  Each
scrape sets them anew (``refresh``); a batch sets the cluster gauges as it leaves them."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import structlog

from gpusched.metrics.cost import mig_gpus
from gpusched.model import GPU_MILLI, Cluster, ClusterState
from gpusched.model.mig import gpu_fraction
from gpusched.model.node import single_mig_profile
from gpusched.state.cache import Cache

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.daemon")

GONE_NODES_S = 600.0
"""How long a deleted node's name in the utilisation answer is taken for its series ageing out
(the default query averages two minutes) rather than for an exporter's wrong label."""


def unmeasured(percent: Mapping[str, object], cache: Cache) -> list[str]:
    """The GPU nodes of ``cache`` (whole GPUs, not MIG instances) the utilisation answer
    ``percent`` (node name -> GPUs) says nothing of, sorted."""
    return sorted(
        n for n, rec in cache.nodes.items() if rec.node.gpu_count and not rec.node.mig_slices and n not in percent
    )


class Gauges:
    """The gauges of one scheduler instance, and what the utilisation answer names."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.nodes_gone: dict[str, float] = {}
        """Nodes deleted lately, by name, and when (``time.monotonic``): the utilisation answer
        may name them for minutes after, which is no misconfiguration."""
        self._unmeasured_told: tuple[str, ...] = ()
        """The GPU nodes last warned about as missing from the utilisation answer."""
        self._mig_shares_of: (
            tuple[Cluster, npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]] | None
        ) = None

    def refresh(self) -> None:
        """Every gauge from the books as they are now (at each scrape)."""
        state = self.s.cache.snapshot().state
        self.cluster(state, None)
        self._signals(state)
        self._tenants()
        if self.s.utilisation is not None:
            self._utilisation(state)

    def _tenants(self) -> None:
        """GPUs each tenant holds and is guaranteed (none while no tenant rule is set)."""
        if not self.s.tenants.active:
            self.s.metrics.set_tenants({}, {})
            return
        usage = self.s.tenant_usage()
        names = set(usage) | set(self.s.tenants.rules)
        self.s.metrics.set_tenants(
            {t: usage.get(t, 0) / GPU_MILLI for t in sorted(names)},
            {t: self.s.tenants.rule(t).quota / GPU_MILLI for t in sorted(names)},
        )

    def check_node_names(self, told: tuple[frozenset[str], bool]) -> tuple[frozenset[str], bool]:
        """Warn (once, until they change) about the names of the answer that are no node of the
        cluster: when none is, the node label names something else and no GPU would ever count
        as busy or idle; when some are not, those exporters' GPUs go unmeasured.  What was
        warned about now: those names, and whether none was a node."""
        assert self.s.utilisation is not None
        assert self.s.utilisation.view is not None
        view, nodes = self.s.utilisation.view, self.s.cache.nodes
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
                    label=self.s.utilisation.node_label,
                    answered=sorted(view.percent)[:3],
                    cluster=sorted(nodes)[:3],
                    fix="--utilisation-node-label must name the label that holds the Kubernetes node name",
                )
            else:
                log.warning(
                    "names in the utilisation answer are no node of the cluster; their GPUs count as neither "
                    "busy nor idle",
                    label=self.s.utilisation.node_label,
                    names=len(strangers),
                    answered=sorted(strangers)[:3],
                    fix="an exporter without NODE_NAME labels its GPUs with its pod's name: give it the node's",
                )
        # Nodes missing while the answer names strangers: most likely those exporters' nodes (told above).
        missing = () if strangers else tuple(unmeasured(view.percent, self.s.cache))
        if missing and missing != self._unmeasured_told:
            log.warning(
                "GPU nodes are not in the utilisation answer; their GPUs count as neither busy nor idle",
                nodes=len(missing),
                first=list(missing[:3]),
                fix="run dcgm-exporter on them (its DaemonSet may lack a toleration of their taints)",
            )
        self._unmeasured_told = missing
        return now

    def _utilisation(self, state: ClusterState) -> None:
        """The age of the utilisation answer, the GPUs it finds busy and those pods hold idle
        (NaN without an answer young enough to use: nothing is measured, which 0 would hide)."""
        assert self.s.utilisation is not None
        u = self.s.config.utilisation
        view = self.s.utilisation.view
        if view is None:
            self.s.metrics.set_utilisation(math.nan, math.nan, math.nan)
            return
        age = self.s.utilisation.age()
        # Not used, or naming no node of the cluster (a node label holding the exporter's pod
        # name): no GPU is known busy or idle by it.
        if age > u.max_age_seconds or view.names_none_of(self.s.cache.nodes):
            self.s.metrics.set_utilisation(age, math.nan, math.nan)
            return
        cl, used = state.cluster, state.gpu_used
        busy = len(self.s.cache.blocking(self.s.busy_gpus() or {}))
        low = self.s.cache.as_booked(view.below(u.idle_percent))  # on a time-sliced node, slices
        held = [
            (n, g)
            for n, gpus in low.items()
            if (i := cl.index.get(n)) is not None and not cl.in_mig_mode[i]  # as ``_busy_cells``
            for g in gpus
            if 0 <= g < cl.gpu_count[i] and used[i, g] > 0
        ]
        if not u.gpu_indices_honoured:
            # The device plugin chose the pods' GPUs: of a node's GPUs held, as many are idle as
            # the node has GPUs held beyond those measured in use (its pods are on some GPUs).
            on: dict[str, int] = {}
            for n, _ in held:
                on[n] = on.get(n, 0) + 1
            idle = 0
            for n, low_held in on.items():
                i = cl.index[n]
                count = int(cl.gpu_count[i])
                in_use = count - len({g for g in low[n] if 0 <= g < count})
                idle += min(low_held, max(0, int((used[i, :count] > 0).sum()) - in_use))
            self.s.metrics.set_utilisation(age, busy, idle)
            return
        # A pod whose GPUs the books only guess makes its node's GPUs idle only all together.
        guessed = self.s.cache.guessed_gpus() if held else set()
        holders = self.s.cache.holders_of(held) if guessed else {}
        idle = sum(
            1
            for n, g in held
            if not (holders.get((n, g), set()) & guessed) or set(range(int(cl.gpu_count[cl.index[n]]))) <= low[n]
        )
        self.s.metrics.set_utilisation(age, busy, idle)

    def cluster(self, state: ClusterState, frag: float | None) -> None:
        """Queue depths and cluster gauges (``frag`` None: as the last batch left it); after each
        batch, and from the books as they are at each scrape."""
        c = self.s.queue.counts()
        self.s.metrics.set_pending(c.active + c.in_flight, c.backoff, c.unschedulable)
        cl, open_ = state.cluster, ~state.cluster.cordoned  # a cordoned node is no capacity to place on
        # GPUs in MIG mode count as the cost report counts them, a slice held as its part of one
        # (held twice, at most the node's), and so do the instances a single-strategy MIG node
        # advertises as nvidia.com/gpu.
        mig, part, whole = self._mig_shares(cl)
        mig_held = np.minimum(state.mig @ part, mig) if part.size else np.zeros(len(cl), dtype=np.float64)
        gpus = float((cl.gpu_count * whole)[open_].sum() + mig[open_].sum())
        used = state.gpu_used.sum(axis=1) * whole
        held = float(used[open_].sum()) / GPU_MILLI + float(mig_held[open_].sum())
        alloc = held / gpus if gpus else 0.0
        in_use = (state.gpu_used.sum(axis=1) > 0) | (state.mig.sum(axis=1) > 0)
        active = int((in_use & ((cl.gpu_count > 0) | cl.mig_cap.any(axis=1)) & open_).sum())
        self.s.metrics.set_cluster(gpus, alloc, frag, active)

    def node_gone(self, name: str) -> None:
        """``name`` was deleted: its GPUs' series linger in the utilisation answer a while."""
        now = time.monotonic()
        for gone, at in list(self.nodes_gone.items()):
            if now - at > GONE_NODES_S:
                del self.nodes_gone[gone]
        self.nodes_gone[name] = now

    def _mig_shares(
        self, cl: Cluster
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per node its GPUs in MIG mode (as the cost report counts them), per MIG profile of
        ``cl`` its part of a GPU, and per node the part of a GPU each nvidia.com/gpu it
        advertises is (an instance's on a single-strategy MIG node, else 1: time-sliced GPUs
        count as slices here): once per node list, not per batch."""
        if self._mig_shares_of is None or self._mig_shares_of[0] is not cl:
            mig = np.array([mig_gpus(node) for node in cl.nodes], dtype=np.float64)
            part = np.array([gpu_fraction(p) for p in cl.mig_profiles], dtype=np.float64)
            whole = np.array(
                [gpu_fraction(p) if (p := single_mig_profile(node)) else 1.0 for node in cl.nodes], dtype=np.float64
            )
            self._mig_shares_of = (cl, mig, part, whole)
        return self._mig_shares_of[1], self._mig_shares_of[2], self._mig_shares_of[3]

    def _signals(self, state: ClusterState) -> None:
        """The autoscaling gauges and the GPUs kept free: from the books, at each scrape only
        (nothing a batch learns changes them sooner)."""
        cl, open_ = state.cluster, ~state.cluster.cordoned
        in_use = (state.gpu_used.sum(axis=1) > 0) | (state.mig.sum(axis=1) > 0)
        gpu_nodes = (cl.gpu_count > 0) | cl.mig_cap.any(axis=1)
        kept = self.s.kept_now()
        keeping = np.zeros(len(cl), dtype=np.bool_)  # nodes holding GPUs kept free: not to be removed
        keeping[[i for n, _ in kept if (i := cl.index.get(n)) is not None]] = True
        # A node being re-partitioned holds no pod yet, but is about to: not to be removed; nor
        # one gang members waiting beside a layout are planned on.
        soon = self.s.mig.sealed() | {node for job in self.s.mig.jobs.values() for _, node in job.beside.values()}
        keeping[[i for n in soon if (i := cl.index.get(n)) is not None]] = True
        # Nor one with a GPU DCGM finds busy: work outside the books runs there (whether or not
        # batches avoid busy GPUs, and on a time-sliced node too).  Without a recent answer,
        # any node may be running such work: none is said to be idle; nor with one that names
        # no node of the cluster (its node label holds the exporter's pod name): it measured none.
        measured = True
        if self.s.utilisation is not None:
            view = self.s.utilisation_view()
            measured = view is not None and not view.names_none_of(self.s.cache.nodes)
            busy = view.at_least(self.s.config.utilisation.busy_percent) if view is not None else {}
            keeping[[i for n, gpus in busy.items() if gpus and (i := cl.index.get(n)) is not None]] = True
        idle = int((~in_use & gpu_nodes & open_ & ~keeping).sum()) if measured else 0
        # What more nodes would have to offer.
        parked = self.s.waiting(self.s.unschedulable_records())
        wanted = sum(p.gpu_demand_milli for p in parked) / GPU_MILLI
        self.s.metrics.set_signals(idle, wanted, len(kept))
