"""Live MIG re-partitioning: asking NVIDIA's MIG manager for the layouts a batch chose,
sealing the node while it works, and giving idle nodes back as whole GPUs.

A batch decides (``repartition``); this module carries it out over minutes: it writes the
layout into the MIG manager's ConfigMap, labels the node, follows the node's labels until the
instances are advertised (or the request failed or timed out), and tells the waiting pods.
Every leader rebuilds what is sealed from the nodes' labels (``node_seen``), and asks for no new
layout while one asked for before it led is awaited (``inherited``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from gpusched.kube.convert import (
    LABEL_MIG_CONFIG,
    LABEL_MIG_PREVIOUS,
    LABEL_MIG_REPARTITION,
    LABEL_MIG_REQUESTED,
    LABEL_MIG_RESTORE_FAILED,
    LABEL_MIG_SETTING_BACK,
    LABEL_MIG_STATE,
    MIG_BUSY_STATES,
)
from gpusched.model import GPU_MILLI, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.cluster import live_mig_configs
from gpusched.model.mig import MIG_CONFIG_PREFIX, MigLayout, geometry_for
from gpusched.model.node import LABEL_GPU_COUNT, MAX_GPUS, label_number
from gpusched.model.placement import MigPartition
from gpusched.model.topology import default_islands
from gpusched.solver.explain import explain
from gpusched.state.cache import Coming
from gpusched.state.records import PodRecord

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

HARD_CAP_FACTOR = 4
"""While the MIG manager reports it is at work (pending, rebooting), a request is waited for up to
this many times ``mig.timeoutSeconds`` from its label; ``mig.timeoutSeconds`` runs again from
when it stops reporting so (for a leader that took over, from when it first saw the request at the
earliest, since it may have missed the MIG manager at work)."""
RESTORE_BACKOFF_S = 86_400.0
"""How long a node a restore failed on is not set back to whole GPUs again."""
MIG_ALL_DISABLED = "all-disabled"
"""The MIG manager's configuration of whole GPUs (every GPU with MIG mode off)."""

WANTED_WHOLE_PODS = 128
WANTED_WHOLE_NODES = 64
"""Waiting pods (the highest priority first) and idle nodes (the longest idle first) weighed per
look for setting nodes back sooner: a bound on the work, each pod tried against each node alone."""

log = structlog.get_logger("gpusched.daemon")


@dataclass
class Repartition:
    """A node asked to take a MIG layout, and the pods waiting for its instances."""

    config: str
    """The ``nvidia.com/mig.config`` value asked for."""
    pods: dict[str, Pod]
    """The pods waiting for its instances, by key: their room on the node is held meanwhile
    (``Repartitioner.book``)."""
    layouts: tuple[tuple[int, MigLayout], ...] = ()
    """The layouts asked for, by GPU index (none: set back to whole GPUs): their instances not
    promised yet are offered to later batches, whose MIG pods then wait with these."""
    started: float = field(default_factory=time.monotonic)
    asked: float = field(default_factory=time.monotonic)
    """When the node was labelled (the timeout counts from then)."""
    message: str = ""
    """What the pods waiting are told."""
    labelled: bool = False
    """The node's label was set (the MIG manager was asked)."""
    seen: bool = False
    """The watch has shown the node with that label: any other label from then on is someone
    else's word (before, the old one may just be the watch running behind)."""
    beside: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Members of gangs with a member among ``pods``, waiting with them: key -> (UID, the node
    the plan put them on, where their room is held meanwhile)."""
    before: str = ""
    """The node's ``nvidia.com/mig.config`` before it was labelled."""
    serves: frozenset[str] = frozenset()
    """Set back to whole GPUs sooner for these waiting pods (keys): not counted again meanwhile."""
    busy: bool = False
    """The MIG manager was seen at work (pending, rebooting) on the label once it was written: a
    state ``success`` from then on is its answer, not the state of the last configuration."""
    found: str | None = None
    """The node's ``nvidia.com/mig.config`` when the layout was chosen (None: not known): another
    value by the time it is to be labelled is someone else's word, not overwritten."""

    @property
    def wanted(self) -> Counter[str]:
        """Instances per profile the node is to advertise once done."""
        out: Counter[str] = Counter()
        for _, layout in self.layouts:
            out.update(layout.counts)
        return out


@dataclass
class SetBack:
    """A node labelled back to the configuration it had before, after a layout of ours failed or
    did not come: sealed until the MIG manager has applied that (at most ``HARD_CAP_FACTOR`` times
    ``mig.timeoutSeconds``), since it may reset the GPUs meanwhile.  Labelled so
    (``LABEL_MIG_SETTING_BACK``) for every leader, after a restart too (``node_seen``)."""

    config: str
    """The ``nvidia.com/mig.config`` value labelled."""
    stale: str
    """The MIG manager's state when labelled: the last configuration's, not this one's (for one
    labelled by another leader, or before a restart: when first seen)."""
    stamp: int = field(default_factory=lambda: int(time.time()))
    """Its ``LABEL_MIG_SETTING_BACK`` (Unix seconds)."""
    since: float = field(default_factory=time.monotonic)
    seen: bool = False
    """The watch has shown the node with that label."""
    busy: bool = False
    """The MIG manager was seen at work on it."""


class Repartitioner:
    """The MIG layouts one scheduler instance asked for, and what it knows of every node's."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.jobs: dict[str, Repartition] = {}
        """Nodes this instance asked the MIG manager to re-partition, until it is done or failed."""
        self.at_work: set[str] = set()
        """Nodes the MIG manager says it is re-partitioning (``nvidia.com/mig.config.state``)."""
        self.busy_since: dict[str, float] = {}
        """Nodes of ``at_work``: since when (monotonic) they have been seen so without a break.
        Sealed for ``HARD_CAP_FACTOR`` times ``mig.timeoutSeconds`` from then at most: a MIG
        manager that died at work leaves its state label behind."""
        self._stuck: set[str] = set()
        """Nodes of ``at_work`` offered again past that cap, told once (``expire_asks``)."""
        self.off_until = 0.0
        """Monotonic time before which no GPU is re-partitioned (a layout could not be written)."""
        self.off_why = ""
        """Why, for the MIG pods told meanwhile (``paused``)."""
        self._writes = asyncio.Lock()
        """One write of the MIG manager's ConfigMap at a time."""
        self.idle: set[asyncio.Task[Any]] = set()
        """Tasks that are only waiting (for the kubelet's copy of the ConfigMap, or for the MIG
        manager, minutes at most): the shutdown drain does not wait for them."""
        self.asked: dict[str, int] = {}
        """Nodes a layout was asked for (by any leader) that advertise no instance yet: when (epoch s)."""
        self.asked_seen: dict[str, tuple[int, float]] = {}
        """Nodes of ``asked``: the request (its epoch s) and when this instance first saw it
        (monotonic).  One that started since may have missed the MIG manager at work on it."""
        self._giving_up: set[str] = set()
        self._clearing: set[str] = set()  # nodes whose request label is being removed
        """Nodes being set back after a layout did not come in time."""
        self.restoring: set[str] = set()
        """Nodes labelled back to whole GPUs that still advertise instances."""
        self._restore_after: dict[str, float] = {}
        """Nodes a restore failed on: not set back again before then (monotonic)."""
        self.configs: dict[str, frozenset[str]] = {}
        """Our MIG configuration each node is labelled with, read or not (a node the converter
        refuses still runs it): kept in the ConfigMap."""
        self.idle_since: dict[str, float] = {}
        """Nodes re-partitioned by gpusched whose instances no pod uses: since when (monotonic)."""
        self.left_busy: dict[str, float] = {}
        """When the MIG manager last stopped reporting it was at work on a node (monotonic)."""
        self.setting_back: dict[str, SetBack] = {}
        """Nodes labelled back after a layout failed or did not come, until the MIG manager applied it."""
        self._back_done: dict[str, int] = {}
        """Nodes whose set-back is over here (``_set_back_over``), by the stamp of its label: not
        sealed again by that label while its removal is on its way."""
        self._unmarking: set[str] = set()
        """Nodes whose ``LABEL_MIG_SETTING_BACK`` is being removed."""
        self.hidden: dict[str, float] = {}
        """Nodes whose layout of ours timed out while pods run on MIG instances there that the node
        does not advertise (a device plugin restart?): not labelled back, which would take the
        instances from under them.  Since when (monotonic); sealed until it advertises instances
        again or is labelled otherwise, for ``HARD_CAP_FACTOR`` times ``mig.timeoutSeconds`` at
        most."""

    def sealed(self) -> set[str]:
        """Nodes being re-partitioned into MIG instances: none of their GPUs or instances is
        offered to a pod until it is over.  Those this instance asked a layout for; with
        ``mig.repartition``, also those the MIG manager says it is at work on, and those any
        leader asked a layout for (``LABEL_MIG_REQUESTED``) that advertise no instance yet, until
        the request is due (``_due``), those labelled back after a layout failed or did not come
        (``setting_back``), and those whose layout timed out while pods run on instances the node
        does not advertise (``hidden``)."""
        out = set(self.jobs)
        if self.s.config.mig.repartition:
            now = time.monotonic()
            cap = HARD_CAP_FACTOR * float(self.s.config.mig.timeout_seconds)
            out |= {n for n in self.at_work if now - self.busy_since.get(n, now) < cap} | self.restoring
            out |= {n for n, at in self.asked.items() if now < self._due(n, _monotonic(at))}
            out |= {n for n, back in self.setting_back.items() if now - back.since < cap}
            out |= {n for n, since in self.hidden.items() if now - since < cap}
        return out

    def inherited(self) -> list[str]:
        """Nodes another leader (or this instance before a restart) asked a layout of gpusched's
        for that is still waited for (``_due``), and that no job of this instance follows.  The
        MIG pods it was asked for are not known here, and neither are its instances: while any
        is awaited, no new layout is asked for, and MIG pods wait for its instances rather than
        have another node re-partitioned for them."""
        if not self.s.config.mig.repartition:
            return []
        now = time.monotonic()
        out = []
        for node, at in self.asked.items():
            rec = self.s.cache.nodes.get(node)
            if (
                node not in self.jobs
                and rec is not None
                and rec.node.labels.get(LABEL_MIG_CONFIG, "").startswith(MIG_CONFIG_PREFIX)
                and now < self._due(node, _monotonic(at))
            ):
                out.append(node)
        return sorted(out)

    def _due(self, node: str, since: float) -> float:
        """When a request labelled at ``since`` (monotonic) is given up: ``mig.timeoutSeconds``
        after it, or after the MIG manager last stopped reporting it was at work on the node;
        never while it reports so, but at ``HARD_CAP_FACTOR`` times that after it anyway.  For a
        request of another leader's (or from before a restart), not before ``mig.timeoutSeconds``
        after this instance first saw it either: the MIG manager may have been at work on it
        until a moment before, rebooting the node for most of the timeout."""
        timeout = float(self.s.config.mig.timeout_seconds)
        cap = since + HARD_CAP_FACTOR * timeout
        if node in self.at_work:
            return cap
        start = max(since, self.left_busy.get(node, since))
        seen = self.asked_seen.get(node)
        if seen is not None and node not in self.jobs:
            start = max(start, seen[1])
        return min(cap, start + timeout)

    def _forget_ask(self, node: str) -> None:
        """``node`` awaits no layout any more (``asked`` and ``asked_seen`` go together)."""
        self.asked.pop(node, None)
        self.asked_seen.pop(node, None)

    async def _wait_for_manager(self, node: str, job: Repartition) -> bool:
        """Wait until ``job`` is over or due (``_due``); whether it is still ours, and due."""
        while self.jobs.get(node) is job:
            wait = self._due(node, job.asked) - time.monotonic()
            if wait <= 0:
                return True
            await self._idle(wait)  # the due time only moves later: looked at again then
        return False

    async def _idle(self, seconds: float) -> None:
        """Sleep, counted among the waits the shutdown drain does not wait for (``idle``)."""
        task = asyncio.current_task()
        if task is not None:
            self.idle.add(task)
        try:
            await asyncio.sleep(seconds)
        finally:
            if task is not None:
                self.idle.discard(task)

    # -- MIG re-partitioning ------------------------------------------------------------------
    def set_aside(self) -> dict[tuple[str, str], str]:
        """The pods (key, UID) waiting for a layout asked for, with the node it is asked for:
        on its instances, or beside them (a gang's members planned on other nodes)."""
        out = {(k, uid): node for node, job in self.jobs.items() for k, (uid, _) in job.beside.items()}
        out.update({(k, p.uid): node for node, job in self.jobs.items() for k, p in job.pods.items()})
        return out

    def book(self) -> bool:
        """Hold room on the books (``Cache.hold_for_layouts``) for the pods waiting for a layout
        asked for, each on the node it is asked for, and for the gang members waiting beside
        them, each on the node the plan put it on; as they are pending now.  A node being
        re-partitioned is sealed to GPU pods only: with no room held, a CPU pod bound there
        meanwhile, or a MIG pod that joins the layout (``coming``), could take the CPU, memory,
        pod slot or host port a waiting pod needs there, or keep it out by anti-affinity, and the
        layout would come for a pod that no longer fits.  Called whenever the jobs or their pods
        change: the room lasts as long as the job (done, its pods are placed as any other;
        failed or withdrawn, the room is free again), and none is held for a pod on the books.
        Whether what is held changed."""
        waits: dict[str, tuple[Pod, str]] = {}
        for node, job in self.jobs.items():
            wanted = [(k, uid, planned) for k, (uid, planned) in job.beside.items()]
            wanted += [(k, p.uid, node) for k, p in job.pods.items()]
            for key, uid, where in wanted:
                rec = self.s.queue.record(key)
                if rec is not None and self.s.queue.current(key, uid):
                    waits[key] = (rec.pod, where)
        return self.s.cache.hold_for_layouts(waits)

    def repartition(
        self,
        plan: Plan,
        cluster: Cluster,
        pods: Mapping[int, list[Pod]],
        batch_id: int,
        after: ClusterState | None = None,
        batch: Collection[str] = (),
    ) -> None:
        """Ask the MIG manager for the layouts ``plan`` gives the nodes of ``pods`` (node index ->
        the MIG pods placed on instances of those layouts), and have the pods wait for them.
        With ``after`` (the state after the plan) and ``mig.partitionForQueued``, the other idle
        GPUs of those nodes get layouts too for the MIG pods queued beyond the batch (keys in
        ``batch``): ``for_queued``."""
        parts = [part for part in plan.partitions if part[0] in pods]
        if after is not None and self.s.config.mig.partition_for_queued:
            parts += self.for_queued(parts, after, sorted(pods), batch)
        try:
            configs = live_mig_configs(cluster, parts)
        except ValueError as exc:  # the converter offers no such node: a defect, told as one
            log.error("MIG layout not written; pods drawn again", batch_id=batch_id, error=str(exc))
            for group in pods.values():
                for p in group:
                    self.s.queue.backoff(p.key)
            return
        for n, group in pods.items():
            node = cluster.nodes[n]
            config, entries = configs[node.name]
            layouts = tuple((g, layout) for m, g, layout in parts if m == n)
            job = Repartition(config, {p.key: p for p in group}, layouts, found=node.labels.get(LABEL_MIG_CONFIG, ""))
            self.jobs[node.name] = job
            self.s.metrics.mig_repartition("requested")  # (each request ends in one outcome: ``_end``)
            instances = _counts(job.wanted.items())
            log.info(
                "mig repartition",
                batch_id=batch_id,
                node=node.name,
                config=config,
                instances=instances,
                pods=sorted(job.pods),
            )
            message = (
                f"Waiting for node {node.name} to be re-partitioned into MIG instances ({instances}): "
                f"{LABEL_MIG_CONFIG}={config}; the pod is placed once the node advertises them."
            )
            job.message = message
            for p in group:
                self.s.tell_unschedulable(p, message, "MigRepartition", layout=True)
            self.s.spawn(self._ask_for_layout(node.name, job, entries), f"mig:{node.name}")

    def for_queued(
        self, parts: list[MigPartition], after: ClusterState, nodes: list[int], batch: Collection[str]
    ) -> list[MigPartition]:
        """Layouts for the GPUs of ``nodes`` that ``parts`` leaves whole and idle in ``after``, for
        the MIG pods queued beyond ``batch`` that no free instance (advertised, or of a layout
        asked for) is left for: a node is given a layout only while all its GPUs are idle, so what
        is not partitioned now stays whole until the node is idle again.  Queued pods count in
        queue order, on a node only where its taints, selector, CPU and memory let them, and as
        far as they go; each GPU gets the valid layout that holds most of their compute."""
        cluster = after.cluster
        free: Counter[str] = Counter({p: int(after.mig_free[:, col].sum()) for p, col in cluster.mig_index.items()})
        records = (self.s.queue.record(k) for k in self.s.queue.pending_keys() if k not in batch)
        queued: list[Pod] = []
        for p in self._demand(r for r in records if r is not None and r.pod.mig_profile):
            if free[p.mig_profile] > 0:  # a free instance is there for it
                free[p.mig_profile] -= 1
                continue
            queued.append(p)
        out: list[MigPartition] = []
        taken = {(n, g) for n, g, _ in parts}
        for n in nodes:
            node = cluster.nodes[n]
            geometry = geometry_for(node.gpu_model)
            idle = [g for g in range(node.gpu_count) if (n, g) not in taken and not after.gpu_used[n, g]]
            if geometry is None or not idle or not queued:
                continue
            cpu, mem = int(after.cpu_free[n]), int(after.mem_free[n])
            need: Counter[str] = Counter()
            fits: list[Pod] = []
            for p in queued:
                if (
                    p.mig_profile in geometry.profiles
                    and p.accepts(node.gpu_model)
                    and p.cpu_milli <= cpu
                    and p.memory_mib <= mem
                    and cluster.could_take(p, node.name)
                ):
                    need[p.mig_profile] += 1
                    fits.append(p)
                    cpu, mem = cpu - p.cpu_milli, mem - p.memory_mib
            for g in idle:
                if not need:
                    break
                best = max(
                    geometry.layouts(),
                    key=lambda lay: (
                        sum(min(c, need[p]) * geometry.profiles[p].compute for p, c in lay.counts.items()),
                        sum(c for p, c in lay.counts.items() if p in need),
                    ),
                )
                held = {p: min(c, need[p]) for p, c in best.counts.items() if need[p]}
                if not held:
                    break
                out.append((n, g, best))
                need -= Counter(held)
                for p in list(fits):  # those it holds are no demand for the next nodes
                    if held.get(p.mig_profile, 0) > 0:
                        held[p.mig_profile] -= 1
                        queued.remove(p)
                        fits.remove(p)
        return out

    def coming(self) -> dict[str, Coming]:
        """The MIG instances of the layouts asked for and not promised yet, by node: a batch may
        place MIG pods on them, to wait with the others (``join``) where they fit beside those
        (whose room is held: ``book``)."""
        return {
            node: (job.layouts, Counter(p.mig_profile for k, p in job.pods.items() if self.s.queue.current(k, p.uid)))
            for node, job in self.jobs.items()
        }

    def join(self, node: str, pod: Pod) -> None:
        """``pod`` waits for an instance of the layout asked for on ``node``, with its pods."""
        job = self.jobs[node]
        job.pods[pod.key] = pod
        log.info("mig repartition joined", node=node, config=job.config, pod=pod.key)
        self.s.tell_unschedulable(pod, job.message, "MigRepartition", layout=True)

    async def _ask_for_layout(self, node: str, job: Repartition, entries: list[Any]) -> None:
        """Write the layout, give the kubelet time to project it into the MIG manager's volume
        (``mig.configDelaySeconds`` after it was first written), label the node (unless it was
        withdrawn meanwhile, ``_withdrawn``, or none of its pods waits any more, ``_waited_for``);
        then wait for the MIG manager, at most ``mig.timeoutSeconds``.  One ConfigMap write at a
        time: each keeps the configurations in use as they are when it is made (a node's label,
        or a layout asked for and not yet seen there)."""
        mig = self.s.config.mig
        async with self._writes:
            keep = {c for configs in self.configs.values() for c in configs}
            keep |= {r.config for r in self.jobs.values()} | {r.before for r in self.jobs.values()}
            error, written = await self.s.binder.write_mig_config(job.config, entries, mig.config_map, keep)
        if not error:
            wait = written + float(mig.config_delay_seconds) - time.time()
            if wait > 0:
                log.info(
                    "mig layout written; the node is labelled once the MIG manager can read it",
                    node=node,
                    seconds=round(wait, 1),
                )
                await self._idle(wait)
            if self.jobs.get(node) is not job:  # over meanwhile (the node went away)
                return
            withdrawn = (
                self._withdrawn(node, found=job.found)
                if self._waited_for(job)
                else "none of its pods is pending any more (deleted, or bound elsewhere)"
            )
            if withdrawn:
                self._end(node, job, "failed", withdrawn)
                return
            rec = self.s.cache.nodes.get(node)
            job.before = rec.node.labels.get(LABEL_MIG_CONFIG, "") if rec is not None else ""
            job.asked = time.monotonic()
            labels: dict[str, str | None] = {LABEL_MIG_CONFIG: job.config, LABEL_MIG_REQUESTED: str(int(time.time()))}
            error = await self.s.binder.label_node(node, labels)
            if not error:
                job.labelled = True
        if error:
            if not self.s.is_leader:  # the new leader decides anew
                self._end(node, job, "", "")
                return
            off = float(mig.timeout_seconds)
            self.off_until = time.monotonic() + off
            self.off_why = f"a layout could not be written ({error})"
            fix = f"let gpusched get, create and update ConfigMap {mig.config_map} and patch nodes (docs/deploy.md)"
            log.error(
                "MIG layout not written; no GPU is re-partitioned for a while",
                node=node,
                config=job.config,
                error=error,
                seconds=off,
                fix=fix,
            )
            self._end(node, job, "error", f"its layout could not be written: {error}")
            await self.s.binder.object_event(
                {"kind": "Node", "name": node, "apiVersion": "v1"},
                "MigRepartitionPaused",
                f"Its MIG layout {LABEL_MIG_CONFIG}={job.config} could not be written: {error}. No node is "
                f"re-partitioned into MIG instances until {_utc(self.off_until)} ({off:g} s): {fix}.",
                "Warning",
                fenced=True,
            )
            return
        await self.s.binder.object_event(
            {"kind": "Node", "name": node, "apiVersion": "v1"},
            "MigRepartition",
            f"Asked the MIG manager for {LABEL_MIG_CONFIG}={job.config} (in ConfigMap {mig.config_map}) "
            f"for {len(job.pods)} pod(s).",
            fenced=True,
        )
        rec = self.s.cache.nodes.get(node)
        if rec is not None:  # the MIG manager may have answered before the write returned
            self.node_seen(rec.node)
        if await self._wait_for_manager(node, job):
            why = self._timed_out(job.config, node, job)
            self._end(node, job, "timeout", why)
            self._give_up_layout(node, job.config, job.before, why)

    def paused(self) -> str:
        """Why no GPU is re-partitioned for now, for the MIG pods that find no room meanwhile ("":
        GPUs may be): a layout could not be written, ``off_until``."""
        if not self.s.config.mig.repartition or time.monotonic() >= self.off_until:
            return ""
        return f"re-partitioning into MIG instances is paused until {_utc(self.off_until)}: {self.off_why}"

    def _withdrawn(self, node: str, whole: bool = False, found: str | None = None) -> str:
        """Why ``node`` may no longer be labelled for the layout asked for ("" when it may): what
        changed while the MIG manager's copy of the ConfigMap was given time.  ``whole``: set
        back to whole GPUs, which no pod on its instances may be using either.  ``found``: its
        ``nvidia.com/mig.config`` when the layout was chosen; someone else's since is kept."""
        if not self.s.config.mig.repartition:
            return "mig.repartition was turned off"
        rec = self.s.cache.nodes.get(node)
        if rec is None:
            return "the node is gone"
        if rec.node.labels.get(LABEL_MIG_REPARTITION, "").lower() != "true":
            return f"its label {LABEL_MIG_REPARTITION} is no longer true"
        now = rec.node.labels.get(LABEL_MIG_CONFIG, "")
        if found is not None and now != found:
            return f"its label {LABEL_MIG_CONFIG} was set to {now or '(none)'} meanwhile, by someone else"
        if node in self.at_work:
            return f"the MIG manager is at work on it ({LABEL_MIG_STATE}={rec.node.labels.get(LABEL_MIG_STATE, '')})"
        if rec.node.unschedulable:
            return "the node was cordoned"
        state = self.s.cache.snapshot().state
        i = state.cluster.index.get(node)
        if i is None or state.gpu_used[i].any():
            return "a pod took one of its GPUs meanwhile"
        if whole and state.mig_used is not None and state.mig_used[i].any():
            return "a pod took one of its MIG instances meanwhile"
        return ""

    def _waited_for(self, job: Repartition) -> bool:
        """Forget the pods of ``job`` (and the gang members beside them) no longer pending here:
        deleted, bound elsewhere, or replaced by a new pod of the name; whether any is left.  A
        layout none is left for is not labelled: the MIG manager would drain and re-partition
        the node for nobody."""
        job.pods = {k: p for k, p in job.pods.items() if self.s.queue.current(k, p.uid)}
        job.beside = {k: v for k, v in job.beside.items() if self.s.queue.current(k, v[0])}
        self.book()
        return bool(job.pods or job.beside)

    def _clear(self, node: str, previous: bool = False) -> None:
        """The layout came, or someone else's label replaced it: the request is over, for every
        leader (a MIG manager that applies the layout again later, after a reboot, is no new
        request).  ``previous``: whole GPUs came back, the layout they replace is forgotten too.
        Once at a time per node."""
        if node not in self._clearing:
            self._clearing.add(node)
            self.s.spawn(self._clear_request(node, previous), f"mig-done:{node}")

    async def _clear_request(self, node: str, previous: bool = False) -> None:
        labels: dict[str, str | None] = {LABEL_MIG_REQUESTED: None}
        if previous:
            labels[LABEL_MIG_PREVIOUS] = None
        try:
            error = await self.s.binder.label_node(node, labels)
        finally:
            self._clearing.discard(node)
        if error:  # the next update of the node tries again (``node_seen``)
            log.warning("request label not removed after a MIG layout came", node=node, error=error)

    def _timed_out(self, config: str, node: str = "", job: Repartition | None = None) -> str:
        if node in self.at_work:
            cap = HARD_CAP_FACTOR * float(self.s.config.mig.timeout_seconds)
            return (
                f"the MIG manager was still at work on {LABEL_MIG_CONFIG}={config} "
                f"{cap:g} s after it was asked (is the node stuck rebooting? see its log)"
            )
        rec = self.s.cache.nodes.get(node) if node else None
        if rec is not None and job is not None and rec.node.labels.get(LABEL_MIG_STATE) == "success":
            offered = _counts(rec.node.mig_slices) or "none"
            wanted = _counts(job.wanted.items())
            return (
                f"the MIG manager reported {LABEL_MIG_CONFIG}={config} applied, but within "
                f"{self.s.config.mig.timeout_seconds} s the node advertised {offered} where {wanted} was asked "
                "(is the device plugin running there, with the mixed MIG strategy?)"
            )
        return (
            f"it did not advertise the instances of {LABEL_MIG_CONFIG}={config} within "
            f"{self.s.config.mig.timeout_seconds} s (is the MIG manager running there? see its log)"
        )

    def _give_up_layout(self, node: str, config: str, before: str = "", why: str = "", failed: bool = False) -> bool:
        """A layout asked for that did not come in time, or that the MIG manager failed to apply
        (``failed``): the node is labelled back with the configuration it had ``before``
        (``all-disabled`` when unknown) and no longer offered for re-partitioning (its label
        ``gpusched.io/mig-repartition`` set to false), once; and sealed until the MIG manager has
        applied that (``setting_back``, for every leader by ``LABEL_MIG_SETTING_BACK``), since it
        may reset the GPUs meanwhile.  Not when its
        label names another configuration by now, or (timed out) the instances came after all
        or pods run on its instances, which the node does not advertise for now (``hidden``): a
        pod on a whole GPU is no reason, since labelling the node back changes no GPU that is
        whole, while a layout left there is applied whenever the MIG manager comes back, to GPUs
        pods may use by then.  Whether it is set back."""
        if node in self._giving_up or not self.s.is_leader:
            return False
        rec = self.s.cache.nodes.get(node)
        if (
            config == MIG_ALL_DISABLED
            and rec is not None
            and not rec.node.mig_slices
            and LABEL_MIG_PREVIOUS not in rec.node.labels
        ):
            # No restore of gpusched's (each names the layout it replaces) and no instance left:
            # a request left over from a layout someone else's label replaced.
            self._forget_ask(node)
            self._clear(node)
            return False
        if config == MIG_ALL_DISABLED:  # a restore another leader asked for: not a layout to give up
            return self._set_back_failed(node, None, "the MIG manager did not apply it in time", "timeout")
        if rec is not None and (
            rec.node.labels.get(LABEL_MIG_CONFIG, "") != config or (not failed and rec.node.mig_slices)
        ):
            log.info("mig layout not set back: the node was relabelled, or its instances came", node=node)
            return False
        held = (self.s.cache.held_pod(k) for k in self.s.cache.gpu_pods_on(node))
        on_instances = [p.key for p in held if p is not None and p.mig_profile]
        if on_instances and not failed:  # never: setting it back would take the instances from under them
            self._forget_ask(node)
            if node not in self.hidden:
                self.hidden[node] = time.monotonic()
                self._tell_hidden(node, config, on_instances)
            return False
        # A failed layout is never left on the node: the MIG manager applies its label again
        # whenever its pod restarts, to GPUs that pods may use by then.
        target = before if before and not before.startswith(MIG_CONFIG_PREFIX) else MIG_ALL_DISABLED
        why = why or (
            f"the MIG manager failed to apply {LABEL_MIG_CONFIG}={config}" if failed else self._timed_out(config)
        )
        self._giving_up.add(node)
        stale = rec.node.labels.get(LABEL_MIG_STATE, "") if rec is not None else ""
        back = self.setting_back[node] = SetBack(target, stale)

        async def reset() -> None:
            try:
                labels: dict[str, str | None] = {
                    LABEL_MIG_CONFIG: target,
                    LABEL_MIG_REQUESTED: None,
                    LABEL_MIG_REPARTITION: "false",
                    LABEL_MIG_SETTING_BACK: str(back.stamp),
                }
                error = await self.s.binder.label_node(node, labels)
                if error:  # the next update of the node, or look, tries again
                    log.warning("node not set back after a MIG layout did not come", node=node, error=error)
                    self.setting_back.pop(node, None)
                    return
                log.warning("mig repartition given up", node=node, config=config, why=why, set_to=target)
                await self.s.binder.object_event(
                    {"kind": "Node", "name": node, "apiVersion": "v1"},
                    "MigRepartitionFailed" if failed else "MigRepartitionTimeout",
                    f"Node {node}: {why}. Labelled {LABEL_MIG_CONFIG}={target} again and "
                    f"{LABEL_MIG_REPARTITION}=false; no pod is placed there until the MIG manager reports "
                    f"{LABEL_MIG_CONFIG}={target} applied. Set {LABEL_MIG_REPARTITION}=true to offer it for "
                    "re-partitioning again.",
                    "Warning",
                    fenced=True,
                )
            finally:
                self._giving_up.discard(node)

        self.s.spawn(reset(), f"mig-reset:{node}")
        return True

    async def restore_forever(self) -> None:
        """Now and then, ``expire_asks`` (batches may be rare) and ``restore_idle``."""
        while True:
            mig = self.s.config.mig
            every = [float(s) / 4 for s in (mig.restore_idle_seconds, mig.restore_for_waiting_seconds) if s]
            await asyncio.sleep(max(1.0, min([30.0, *every])))
            try:
                self.expire_asks()
                self.restore_idle(time.monotonic())
            except Exception as exc:
                log.error("MIG restore check failed", error=repr(exc))

    def restore_idle(self, now: float) -> list[str]:
        """Set back to whole GPUs (``all-disabled``) the nodes gpusched re-partitioned whose MIG
        instances and GPUs no pod has used for ``mig.restoreIdleSeconds``, or for
        ``mig.restoreForWaitingSeconds`` when pods wait that they could take once whole
        (``_wanted_whole``); the nodes set back.  While the MIG manager works, the node is sealed
        as for a layout."""
        mig = self.s.config.mig
        if (
            not mig.repartition
            or not (mig.restore_idle_seconds or mig.restore_for_waiting_seconds)
            or not self.s.is_leader
        ):
            self.idle_since.clear()
            return []
        snap = self.s.cache.snapshot()
        state, cluster = snap.state, snap.cluster
        sealed = self.sealed()
        idle: dict[str, float] = {}
        due: dict[str, str] = {}  # node -> why it is set back
        serves: dict[str, frozenset[str]] = {}
        for name, rec in self.s.cache.nodes.items():
            labels = rec.node.labels
            if not (
                labels.get(LABEL_MIG_CONFIG, "").startswith(MIG_CONFIG_PREFIX)
                and labels.get(LABEL_MIG_REPARTITION, "").lower() == "true"
                and labels.get(LABEL_MIG_STATE) == "success"
                and self._restore_after.get(name, 0.0) <= time.monotonic()
                and not _within(labels.get(LABEL_MIG_RESTORE_FAILED, ""), RESTORE_BACKOFF_S)
                and rec.node.mig_slices
                and name not in sealed
                and not rec.node.unschedulable  # cordoned: it would be withdrawn before it is labelled
            ):
                continue
            i = cluster.index.get(name)
            if i is None or state.gpu_used[i].any() or (state.mig_used is not None and state.mig_used[i].any()):
                continue
            since = idle[name] = self.idle_since.get(name, now)
            if mig.restore_idle_seconds and now - since >= float(mig.restore_idle_seconds):
                due[name] = f"No pod used its MIG instances for {mig.restore_idle_seconds} s"
        if mig.restore_for_waiting_seconds:
            spare = sorted(
                (since, name)
                for name, since in idle.items()
                if name not in due and now - since >= float(mig.restore_for_waiting_seconds)
            )
            spare_names = [n for _, n in spare][:WANTED_WHOLE_NODES]
            for name, keys in self._wanted_whole(spare_names, self._coming_whole(due), state).items():
                serves[name] = keys
                due[name] = (
                    f"No pod used its MIG instances for {mig.restore_for_waiting_seconds} s, and {len(keys)} waiting "
                    "pod(s) could use its GPUs once whole (as whole GPUs or in another layout)"
                )
        restored: list[str] = []
        for name, why in due.items():
            since = idle.pop(name)
            job = Repartition(MIG_ALL_DISABLED, {}, message=why, serves=serves.get(name, frozenset()))
            self.jobs[name] = job
            config = self.s.cache.nodes[name].node.labels.get(LABEL_MIG_CONFIG)
            log.info("mig restore", node=name, idle_s=round(now - since, 1), config=config, why=why)
            self.s.spawn(self._ask_for_whole(name, job), f"mig:{name}")
            restored.append(name)
        self.idle_since = idle
        return restored

    def _demand(self, records: Iterable[PodRecord]) -> list[Pod]:
        """The pods of ``records`` (in their order) that GPUs could be re-partitioned or set back
        for: waiting for room (``Scheduler.waiting``), asking for GPUs, not promised a node
        being set back, and no gang member (a gang is placed whole, by a batch)."""
        promised = {k for job in self.jobs.values() for k in job.serves}
        return self.s.waiting(
            r for r in records if r.pod.gpu_demand_milli and r.pod.gang is None and r.key not in promised
        )

    def _coming_whole(self, due: Iterable[str]) -> list[str]:
        """Nodes on their way back to whole GPUs: set back in this look (``due``), or by any
        leader and not whole yet, or whole by the MIG manager's word but not advertising all
        their GPUs yet (the device plugin registers them a little later)."""
        out = list(due)
        for name, rec in self.s.cache.nodes.items():
            labels = rec.node.labels
            job = self.jobs.get(name)
            if name in out:
                continue
            if job is not None and job.config == MIG_ALL_DISABLED:  # (labelled in a moment, or already)
                out.append(name)
                continue
            if labels.get(LABEL_MIG_CONFIG) != MIG_ALL_DISABLED:
                continue
            count = labels.get(LABEL_GPU_COUNT, "")
            ours = LABEL_MIG_PREVIOUS in labels or LABEL_MIG_REQUESTED in labels
            short = ours and rec.node.gpu_count < (label_number(count) or 0)
            if name in self.restoring or name in self.asked or short:
                out.append(name)
        return out

    def _wanted_whole(self, spare: list[str], coming: list[str], state: ClusterState) -> dict[str, frozenset[str]]:
        """Of the idle nodes ``spare`` (the longest idle first), those that the GPU pods waiting
        as unschedulable (``_demand``) could use once set back to whole GPUs, with the pods each
        serves (keys), once the nodes ``coming`` back to whole GPUs anyway have served theirs:
        a node serves the waiting pods that would fit it alone, whole and empty of GPU pods
        (a MIG pod through a new layout), as far as its GPUs go."""
        parked = sorted(self.s.unschedulable_records(), key=lambda r: (-r.pod.priority, -r.pod.gpu_demand_milli, r.key))
        waiting = self._demand(parked)[:WANTED_WHOLE_PODS]
        out: dict[str, frozenset[str]] = {}
        for name in [*coming, *spare]:
            if not waiting:
                break
            served = self._serves(name, waiting, state)
            waiting = [p for p in waiting if p.key not in served]
            if served and name not in coming:
                out[name] = served
        return out

    def _serves(self, name: str, waiting: list[Pod], state: ClusterState) -> frozenset[str]:
        """The pods of ``waiting`` (in order) that node ``name``, set back to whole GPUs, could
        take together as far as its GPUs, CPU and memory go (each tried against the node alone,
        whole and empty of GPU pods)."""
        whole = self._as_whole(name, state)
        if whole is None:
            return frozenset()
        node = whole.cluster.nodes[0]
        room, cpu, mem = node.gpu_count * GPU_MILLI, node.cpu_milli, node.memory_mib
        served: list[str] = []
        for p in waiting:
            if (
                p.gpu_demand_milli <= room
                and p.cpu_milli <= cpu
                and p.memory_mib <= mem
                and p.accepts(node.gpu_model)
                and whole.cluster.could_take(p, name)
                and explain(p, whole).fits
            ):
                served.append(p.key)
                room, cpu, mem = room - p.gpu_demand_milli, cpu - p.cpu_milli, mem - p.memory_mib
        return frozenset(served)

    def _as_whole(self, name: str, state: ClusterState) -> ClusterState | None:
        """Node ``name`` alone as it would be set back to whole GPUs: every GPU that GPU feature
        discovery counts, whole and free, its free CPU, memory and pod slots as now (None when
        the count is not known).  The pods there (running, or room held for them) still hold
        their host ports, and their pod (anti-)affinity is weighed as theirs, so a pod they keep
        off the node is not served by it: set back for such a pod, the node would be
        re-partitioned by the next MIG job, and set back for it again, round after round.  Pods
        on other nodes are not weighed (a term whose topology is wider than the node)."""
        rec = self.s.cache.nodes.get(name)
        i = state.cluster.index.get(name)
        if rec is None or i is None:
            return None
        node = rec.node
        gpus = label_number(node.labels.get(LABEL_GPU_COUNT, "")) or 0
        if not 0 < gpus <= MAX_GPUS:
            return None
        whole = replace(
            node,
            cpu_milli=int(state.cpu_free[i]),
            memory_mib=int(state.mem_free[i]),
            gpu_count=gpus,
            gpu_islands=default_islands(node.gpu_model, gpus),
            mig_slices=(),
            mig_repartition=True,
            max_pods=None if node.max_pods is None else max(0, int(state.pods_free[i])),
        )
        ports, residents = state.ports_used.get(i), state.residents.get(i)
        return replace(  # (their holders of anti-affinity terms found again from the residents)
            Cluster([whole], repartition="idle-nodes").empty_state(),
            ports_used={0: ports} if ports else {},
            residents={0: residents} if residents else {},
            term_holders=None,
        )

    async def _ask_for_whole(self, node: str, job: Repartition) -> None:
        """Label ``node`` back to ``all-disabled``; then wait for the MIG manager, as for a layout."""
        rec = self.s.cache.nodes.get(node)
        job.before = rec.node.labels.get(LABEL_MIG_CONFIG, "") if rec is not None else ""
        withdrawn = self._withdrawn(node, whole=True)
        if withdrawn:
            log.info("mig restore dropped", node=node, why=withdrawn)
            self._end(node, job, "", "")
            return
        labels: dict[str, str | None] = {
            LABEL_MIG_CONFIG: MIG_ALL_DISABLED,
            LABEL_MIG_REQUESTED: str(int(time.time())),
            LABEL_MIG_PREVIOUS: job.before,
        }
        self.s.metrics.mig_repartition("requested")
        error = await self.s.binder.label_node(node, labels)
        if error:
            log.warning("node not set back to whole GPUs", node=node, error=error)
            self._end(node, job, "error" if self.s.is_leader else "", error)
            return
        job.labelled = True
        await self.s.binder.object_event(
            {"kind": "Node", "name": node, "apiVersion": "v1"},
            "MigRestore",
            f"{job.message}: asked the MIG manager for {LABEL_MIG_CONFIG}={MIG_ALL_DISABLED}, its GPUs whole again.",
            fenced=True,
        )
        job.asked = time.monotonic()
        rec = self.s.cache.nodes.get(node)
        if rec is not None:
            self.node_seen(rec.node)
        if await self._wait_for_manager(node, job):
            await self._restore_failed(
                node, job, f"the MIG manager did not apply it within {self.s.config.mig.timeout_seconds} s"
            )

    def _set_back_failed(self, node: str, job: Repartition | None, why: str, result: str) -> bool:
        """``_restore_failed`` for ``node``, once at a time (and, for no job, not again once it
        relabelled the node: the watch may show the node as it was a moment longer); whether it
        was started."""
        if node in self._giving_up or (job is None and self._restore_after.get(node, 0.0) > time.monotonic()):
            return False
        self._giving_up.add(node)

        async def back() -> None:
            try:
                await self._restore_failed(node, job, why, result)
            finally:
                self._giving_up.discard(node)

        self.s.spawn(back(), f"mig-reset:{node}")
        return True

    async def _restore_failed(self, node: str, job: Repartition | None, why: str, result: str = "timeout") -> None:
        """A restore that did not come: the node, sealed until then, is labelled with its layout
        again when it still advertises its instances (they are in use from now on), and is not
        set back again for a day."""
        rec = self.s.cache.nodes.get(node)
        previous = (job.before if job is not None else "") or (
            rec.node.labels.get(LABEL_MIG_PREVIOUS, "") if rec else ""
        )
        back: dict[str, str | None] = {
            LABEL_MIG_REQUESTED: None,
            LABEL_MIG_PREVIOUS: None,
            LABEL_MIG_RESTORE_FAILED: str(int(time.time())),  # for every leader, after a restart too
        }
        if rec is not None and rec.node.mig_slices and previous.startswith(MIG_CONFIG_PREFIX):
            back[LABEL_MIG_CONFIG] = previous
            # The restore may have partly succeeded: until the MIG manager has applied the layout
            # again, some GPUs may be whole that it is about to re-partition.
            again = self.setting_back[node] = SetBack(previous, rec.node.labels.get(LABEL_MIG_STATE, ""))
            back[LABEL_MIG_SETTING_BACK] = str(again.stamp)
        error = await self.s.binder.label_node(node, back) if self.s.is_leader else "no longer the leader"
        if error:  # still sealed (the request stands): the next leader, or the next look, relabels it
            log.warning("node not relabelled after a MIG restore failed", node=node, error=error)
            self.setting_back.pop(node, None)
            if job is not None:
                self._end(node, job, "", "")
            return
        self._restore_after[node] = time.monotonic() + RESTORE_BACKOFF_S
        self._forget_ask(node)
        self.restoring.discard(node)
        if job is not None:
            self._end(node, job, result, why)
        log.warning("mig restore failed", node=node, why=why, config=back.get(LABEL_MIG_CONFIG, MIG_ALL_DISABLED))
        await self.s.binder.object_event(
            {"kind": "Node", "name": node, "apiVersion": "v1"},
            "MigRestoreFailed",
            f"Not set back to whole GPUs: {why}. "
            + (
                f"Labelled {LABEL_MIG_CONFIG}={back[LABEL_MIG_CONFIG]} again; its instances are offered as they are."
                if LABEL_MIG_CONFIG in back
                else "It is offered as it is."
            )
            + " Not tried again for a day.",
            "Warning",
            fenced=True,
        )

    def expire_asks(self) -> None:
        """Set back the nodes another leader asked a layout for that did not come in time
        (``_due``); label the nodes a restore failed on with their layout again (any leader's
        restore, and again when the last try could not); unseal the nodes set back after a
        layout that the MIG manager has not applied after all."""
        if not self.s.is_leader or not self.s.config.mig.repartition:
            return
        now = time.monotonic()
        for node, at in list(self.asked.items()):
            if now >= self._due(node, _monotonic(at)) and node not in self.jobs:
                rec = self.s.cache.nodes.get(node)
                if self._give_up_layout(node, rec.node.labels.get(LABEL_MIG_CONFIG, "") if rec else ""):
                    self.s.metrics.mig_repartition("timeout")
        for node in list(self.restoring):
            rec = self.s.cache.nodes.get(node)
            if node not in self.jobs and rec is not None and rec.node.labels.get(LABEL_MIG_STATE) == "failed":
                self._set_back_failed(
                    node, None, f"the MIG manager failed to apply {LABEL_MIG_CONFIG}={MIG_ALL_DISABLED}", "failed"
                )
        cap = HARD_CAP_FACTOR * float(self.s.config.mig.timeout_seconds)
        for node in self.at_work - self._stuck:
            if now - self.busy_since.get(node, now) >= cap:
                self._stuck.add(node)
                self._tell_stuck(node, cap)
        for node, back in list(self.setting_back.items()):
            if now - back.since >= cap:
                self._set_back_over(node, back)
                log.warning(
                    "node offered again, though the MIG manager has not reported its configuration applied",
                    node=node,
                    config=back.config,
                    seconds=cap,
                )
        for node, since in list(self.hidden.items()):
            if now - since >= cap:  # offered again (``sealed``); a later timeout there is told anew
                del self.hidden[node]

    def _tell_hidden(self, node: str, config: str, pods: list[str]) -> None:
        """Log, and write a Warning Event on ``node``: its layout timed out but is not set back,
        since ``pods`` run on its instances, which it does not advertise (``hidden``)."""
        cap = HARD_CAP_FACTOR * float(self.s.config.mig.timeout_seconds)
        names = ", ".join(pods[:3]) + (", ..." if len(pods) > 3 else "")
        log.warning(
            "mig layout not set back: pods run on its MIG instances, which the node does not advertise",
            node=node,
            config=config,
            pods=pods[:3],
            why="is the device plugin running there? (a device plugin or kubelet restart)",
        )
        self.s.spawn(
            self.s.binder.object_event(
                {"kind": "Node", "name": node, "apiVersion": "v1"},
                "MigRepartitionTimeout",
                f"Pods run on its MIG instances ({names}), yet the node advertises none: is the device plugin "
                f"running there? Not labelled back from {LABEL_MIG_CONFIG}={config}, which would take the "
                f"instances from under those pods; no pod is placed there until it advertises them again "
                f"({cap:g} s at most).",
                "Warning",
                fenced=True,
            ),
            f"mig-hidden:{node}",
        )

    def _tell_stuck(self, node: str, cap: float) -> None:
        """Log, and write a Warning Event on ``node``: it is offered again although the MIG
        manager's state label still says it is at work (``busy_since``)."""
        rec = self.s.cache.nodes.get(node)
        state = rec.node.labels.get(LABEL_MIG_STATE, "") if rec is not None else ""
        log.warning(
            "node offered again, though the MIG manager still reports it at work",
            node=node,
            label=f"{LABEL_MIG_STATE}={state}",
            seconds=cap,
            why="is the MIG manager running there? see its log",
        )
        self.s.spawn(
            self.s.binder.object_event(
                {"kind": "Node", "name": node, "apiVersion": "v1"},
                "MigManagerStuck",
                f"The node has shown {LABEL_MIG_STATE}={state} for {cap:g} s: offered to pods again as it is. "
                "Is the MIG manager running there? See its log.",
                "Warning",
                fenced=True,
            ),
            f"mig-stuck:{node}",
        )

    def lead(self) -> None:
        """This instance has just started leading: every node in the cache is looked at as the
        watch shows it (``node_seen``), so what went wrong under the last leader (a layout the
        MIG manager failed on, a restore it failed) is set back now, not at the node's next
        update."""
        for rec in list(self.s.cache.nodes.values()):
            self.node_seen(rec.node)

    def node_seen(self, node: Node) -> None:
        """A node as the watch shows it: the MIG manager's state, a layout asked for and not
        there yet, and the end of a re-partition this instance asked for (its label, the state
        ``success`` and the instances advertised; or ``failed``).  A layout of ours the MIG
        manager failed on, and a restore it failed on, are set back by any leader, once."""
        labels = node.labels
        state = labels.get(LABEL_MIG_STATE, "")
        if state in MIG_BUSY_STATES:
            self.at_work.add(node.name)
            self.busy_since.setdefault(node.name, time.monotonic())
        else:
            self.busy_since.pop(node.name, None)
            self._stuck.discard(node.name)
            if node.name in self.at_work:
                self.at_work.discard(node.name)
                self.left_busy[node.name] = time.monotonic()
        config = labels.get(LABEL_MIG_CONFIG, "")
        requested = labels.get(LABEL_MIG_REQUESTED, "")
        ours = config.startswith(MIG_CONFIG_PREFIX)
        acting = self.s.is_leader and self.s.config.mig.repartition
        # There: instances of a layout of ours (also while a MIG manager applies it again after a
        # reboot), or none once set back to whole GPUs.
        arrived = bool(node.mig_slices) if ours else state == "success" and not node.mig_slices
        stamp = label_number(requested)
        if (ours or config == MIG_ALL_DISABLED) and stamp is not None and state != "failed" and not arrived:
            self.asked[node.name] = stamp
            seen = self.asked_seen.get(node.name)
            if seen is None or seen[0] != stamp:  # a new request: timed from now at the earliest
                self.asked_seen[node.name] = (stamp, time.monotonic())
        else:
            self._forget_ask(node.name)
            if (
                (ours or config == MIG_ALL_DISABLED)
                and requested
                and arrived
                and state == "success"
                and node.name not in self.jobs
                and self.s.is_leader
            ):
                # Its layout (or its whole GPUs) came under another leader, or the label's removal
                # failed: a request left standing would read as one not answered the next time the
                # node advertises no instance for a moment (a device plugin restart), or the MIG
                # manager applies the configuration again (a reboot: a restore "failed").
                self._clear(node.name, previous=config == MIG_ALL_DISABLED)
        # Instances the MIG manager is told to remove stay sealed, however long it takes, until a
        # leader labels the node with its layout again.
        if config == MIG_ALL_DISABLED and stamp is not None and node.mig_slices:
            self.restoring.add(node.name)
        else:
            self.restoring.discard(node.name)
        self._marked(node, config, state)
        self._settled(node.name, config, state)
        if node.name in self.hidden and (node.mig_slices or not ours):  # advertised again, or someone else's word
            del self.hidden[node.name]
            self.s.queue.move_all()
        job = self.jobs.get(node.name)
        if job is None:
            if acting and state == "failed" and requested and node.name not in self.setting_back:
                if ours:  # asked for under another leader, or before a restart: its end is counted here
                    if self._give_up_layout(node.name, config, failed=True):
                        self.s.metrics.mig_repartition("failed")
                elif node.name in self.restoring:
                    why = f"the MIG manager failed to apply {LABEL_MIG_CONFIG}={MIG_ALL_DISABLED}"
                    self._set_back_failed(node.name, None, why, "failed")
            return
        if job.labelled and config != job.config and (job.seen or config != job.before):  # someone else's word
            self._end(node.name, job, "failed", f"the node was relabelled {LABEL_MIG_CONFIG}={config}")
            if self.s.is_leader:  # the request is over: no leader is to wait for it, nor set it back
                self._clear(node.name)
            return
        if config != job.config:
            return
        job.seen = job.seen or job.labelled
        job.busy = job.busy or (job.labelled and state in MIG_BUSY_STATES)
        if state == "failed":
            why = f"the MIG manager failed to apply {LABEL_MIG_CONFIG}={job.config}"
            if job.config == MIG_ALL_DISABLED:
                self._set_back_failed(node.name, job, why, "failed")
                return
            self._end(node.name, job, "failed", why)
            self._give_up_layout(node.name, job.config, job.before, why, failed=True)
            return
        offered = dict(node.mig_slices)
        if job.config == MIG_ALL_DISABLED:
            # Right after the label the state is still the last layout's "success", and a device
            # plugin restart shows no instance for a moment: done once the MIG manager was seen at
            # work on it, or every GPU is advertised whole again.
            count = labels.get(LABEL_GPU_COUNT, "")
            back = 0 < (label_number(count) or 0) <= node.gpu_count
            if state == "success" and not offered and (job.busy or back):
                self._end(node.name, job, "success", "")
            return
        if state == "success" and all(offered.get(p, 0) >= c for p, c in job.wanted.items()):
            self._end(node.name, job, "success", "")

    def _settled(self, name: str, config: str, state: str) -> None:
        """Whether the MIG manager has applied the configuration a node was labelled back with
        (``setting_back``): then it is offered again."""
        back = self.setting_back.get(name)
        if back is None:
            return
        if config != back.config:
            if back.seen:  # someone else's word since: theirs to look after
                self._set_back_over(name, back)
            return
        back.seen = True
        back.busy = back.busy or state in MIG_BUSY_STATES
        if state == "success" and (back.busy or back.stale != "success"):
            self._set_back_over(name, back)
            log.info("node set back", node=name, config=config)
            self.s.queue.move_all()
        elif state == "failed" and back.busy:
            self._set_back_over(name, back)
            log.warning("the MIG manager failed to set the node back; offered as it is", node=name, config=config)
            self.s.queue.move_all()

    def _marked(self, node: Node, config: str, state: str) -> None:
        """A node labelled back by another leader, or before a restart, whose set-back is not over
        (``LABEL_MIG_SETTING_BACK``): sealed as by the instance that labelled it, from its label's
        time, the state seen now counted as the last configuration's (a ``success`` seen first may
        be the MIG manager's answer already: the node then waits for it to be seen at work, or for
        ``HARD_CAP_FACTOR`` times ``mig.timeoutSeconds`` from the label).  One whose set-back is
        over here has the label removed (again, should that have failed)."""
        stamp = label_number(node.labels.get(LABEL_MIG_SETTING_BACK, ""))
        if stamp is None:
            self._back_done.pop(node.name, None)
        elif node.name not in self.setting_back:
            if self._back_done.get(node.name) != stamp:
                self.setting_back[node.name] = SetBack(config, state, stamp, _monotonic(stamp))
            elif self.s.is_leader:
                self._unmark(node.name)

    def _set_back_over(self, node: str, back: SetBack) -> None:
        """The set-back of ``node`` is over: unsealed, and its label removed for every leader."""
        if self.setting_back.get(node) is back:
            del self.setting_back[node]
        self._back_done[node] = back.stamp
        if self.s.is_leader:
            self._unmark(node)

    def _unmark(self, node: str) -> None:
        """Remove ``LABEL_MIG_SETTING_BACK`` from ``node``, once at a time (a failure is tried
        again at the node's next update: ``_marked``)."""
        if node in self._unmarking:
            return
        self._unmarking.add(node)

        async def unmark() -> None:
            try:
                error = await self.s.binder.label_node(node, {LABEL_MIG_SETTING_BACK: None})
            finally:
                self._unmarking.discard(node)
            if error:
                log.warning("set-back label not removed", node=node, label=LABEL_MIG_SETTING_BACK, error=error)

        self.s.spawn(unmark(), f"mig-set-back:{node}")

    def note_configs(self, name: str, labels: Mapping[str, Any]) -> None:
        """A node's labels as the watch shows them, read or not: its configuration of ours (or the
        one it is to get back) stays written in the ConfigMap."""
        ours = {str(labels.get(k) or "") for k in (LABEL_MIG_CONFIG, LABEL_MIG_PREVIOUS)}
        ours = {c for c in ours if c.startswith(MIG_CONFIG_PREFIX)}
        if ours:
            self.configs[name] = frozenset(ours)
        else:
            self.configs.pop(name, None)

    def relisted(self, nodes: Iterable[Node]) -> None:
        """The nodes were listed afresh: what the MIG manager is at work on is read again."""
        was = set(self.at_work)
        self.at_work.clear()
        self.restoring.clear()
        listed = set()
        for node in nodes:
            listed.add(node.name)
            self.node_seen(node)
        for name in was - self.at_work:
            self.left_busy[name] = time.monotonic()
        for name in set(self.busy_since) - self.at_work:
            self.busy_since.pop(name, None)
            self._stuck.discard(name)
        for name in (set(self.asked) | set(self.jobs) | set(self.hidden)) - listed:  # deleted while the watch was down
            self.node_gone(name, deleted=True)

    def node_gone(self, name: str, deleted: bool = False) -> None:
        """``name`` left the books (``deleted``: from the cluster, its configurations with it)."""
        if deleted:
            self.configs.pop(name, None)
        self.at_work.discard(name)
        self.busy_since.pop(name, None)
        self._stuck.discard(name)
        self.restoring.discard(name)
        self._forget_ask(name)
        self.left_busy.pop(name, None)
        self.setting_back.pop(name, None)
        self._back_done.pop(name, None)
        self.hidden.pop(name, None)
        job = self.jobs.get(name)
        if job is not None:
            self._end(name, job, "failed", "the node is gone")

    def _end(self, node: str, job: Repartition, result: str, why: str) -> None:
        """The re-partition of ``node`` is over: its pods are drawn again (told ``why`` it failed).
        ``result`` "": dropped untold, as when this instance no longer leads."""
        if self.jobs.get(node) is not job:
            return
        del self.jobs[node]
        self.book()  # the room held for its pods is given up: drawn again, they take what a batch gives them
        if not result or not self.s.is_leader:
            log.info("mig repartition left to the next leader", node=node, config=job.config)
            return
        self.s.metrics.mig_repartition(result)
        seconds = round(time.monotonic() - job.started, 1)
        if result == "success":
            log.info("mig repartition done", node=node, config=job.config, seconds=seconds)
            self._clear(node, previous=job.config == MIG_ALL_DISABLED)
            self.s.queue.move_all()
            return
        log.warning("mig repartition failed", node=node, config=job.config, result=result, why=why, seconds=seconds)
        for key, p in job.pods.items():
            if self.s.cache.holds(key, p.uid) or not self.s.queue.current(key, p.uid):
                continue
            self.s.tell_unschedulable(
                p, f"Node {node} was not re-partitioned into MIG instances for this pod: {why}.", "MigRepartition"
            )
        self.s.queue.move_all()


def _monotonic(stamp: float) -> float:
    """The Unix time ``stamp`` on the monotonic clock."""
    return stamp - time.time() + time.monotonic()


def _utc(at: float) -> str:
    """The monotonic time ``at`` as a UTC time stamp: ``2026-12-08T09:30:00Z``."""
    return datetime.fromtimestamp(at - time.monotonic() + time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _within(stamp: str, seconds: float) -> bool:
    """Whether the Unix time ``stamp`` (a label's value) is less than ``seconds`` ago."""
    number = label_number(stamp)
    return number is not None and time.time() - number < seconds


def _counts(counts: Iterable[tuple[str, int]]) -> str:
    """MIG instances by profile in words: ``3 x 1g.10gb, 1 x 3g.40gb``."""
    return ", ".join(f"{c} x {p}" for p, c in sorted(counts))
