"""The scheduler's accounting of the cluster: inventory plus every pod that holds resources.

Pods enter the books two ways: observed bound (any scheduler's; from the
watch) or *assumed* (our own plan, before the API server has confirmed the
Binding).  The state machine per pod, after kube-scheduler's cache::

    (absent) --assume--> assumed --observed bound, same node--> bound
        assumed --forget--> (absent)          forget is idempotent
        bound   --deleted / finished--> (absent)

An assumed pod counts against its node at once, so the next batch cannot
hand its GPUs to someone else while the Binding is in flight.  ``snapshot``
freezes the books for one batch; the arrays are copies, so later events
never change a snapshot a solve is using.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
import structlog

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Pod
from gpusched.model.cluster import BoolArray, IntArray, Repartition
from gpusched.model.mig import MigLayout
from gpusched.model.node import booked_gpus, slices_of
from gpusched.model.placement import MigPartition
from gpusched.model.tenants import Tenants
from gpusched.state.records import NodeRecord, PodRecord

__all__ = ["Cache", "Snapshot"]

log = structlog.get_logger("gpusched.state")

Coming = tuple[tuple[tuple[int, MigLayout], ...], Mapping[str, int]]
"""MIG layouts asked for on a node (by GPU index) and the instances already promised, by profile."""


def same_offer(a: Node, b: Node) -> bool:
    """Whether two versions of a node offer the same to every pod: equal but for their
    PreferNoSchedule taints, which only steer."""
    return a == b or replace(a, soft_taints=()) == replace(b, soft_taints=())


@dataclass(frozen=True)
class Snapshot:
    """The cluster as one batch sees it; nothing in it changes."""

    generation: int
    cluster: Cluster
    """Every node, sorted by name (cordoned ones carry their taint)."""
    state: ClusterState
    """Usage by every bound and assumed pod on those nodes (and busy GPUs counted as full)."""
    busy_cells: tuple[tuple[int, int, int], ...] = ()
    """GPUs with room left that were counted as full because they are busy (``busy`` of
    ``Cache.snapshot``): node index, GPU index, the room they had."""
    kept: tuple[tuple[int, int], ...] = ()
    """Idle GPUs (node index, GPU index) counted as full because they are kept free for pods
    of high priority (``keep`` of ``Cache.snapshot``)."""
    sealed: tuple[int, ...] = ()
    """Nodes (indices) whose GPUs and MIG instances all counted as taken (``sealed`` of
    ``Cache.snapshot``: being re-partitioned)."""

    @property
    def busy(self) -> int:
        """How many GPUs with room were left out as busy."""
        return len(self.busy_cells)


def _busy_cells(cluster: Cluster, busy: Mapping[str, Collection[int]]) -> list[tuple[int, int]]:
    """The GPUs of ``busy`` (node name -> GPU indices as the books number them: ``Cache.as_booked``)
    a snapshot may count as full: on nodes of ``cluster`` with no MIG instances (their instances
    are not numbered as their GPUs, whether as ``nvidia.com/mig-*`` or, under the single strategy,
    as ``nvidia.com/gpu``), within each node's GPU count; as (node index, GPU index)."""
    return [
        (i, g)
        for node, gpus in busy.items()
        if (i := cluster.index.get(node)) is not None and not cluster.in_mig_mode[i]
        for g in gpus
        if 0 <= g < cluster.gpu_count[i]
    ]


def keepable(cluster: Cluster, models: Collection[str] = (), tolerated: frozenset[str] = frozenset()) -> BoolArray:
    """The nodes whose GPUs the headroom may keep: not cordoned, whose ``nvidia.com/gpu`` are
    whole GPUs (not MIG instances, of either strategy, nor time slices), no taint but of the
    keys in ``tolerated``, of ``models`` if any (``Cluster.named_mask``)."""
    whole = np.array([slices_of(n) == 1 for n in cluster.nodes], dtype=np.bool_)
    ok = (cluster.gpu_count > 0) & ~cluster.cordoned & ~cluster.in_mig_mode & whole
    if cluster.tainted:
        bare = [all(t.key in tolerated for t in taints) for taints in cluster.taint_sets]
        ok &= np.array(bare, dtype=np.bool_)[cluster.taint_id]
    if models:
        ok &= cluster.named_mask(tuple(models))
    return ok


def keep_free(
    cluster: Cluster,
    gpu_used: IntArray,
    count: int,
    models: frozenset[str] = frozenset(),
    spared: Collection[tuple[int, int]] = (),
    prefer: Collection[tuple[int, int]] = (),
    tolerated: frozenset[str] = frozenset(),
    cpu_used: IntArray | None = None,
    mem_used: IntArray | None = None,
) -> tuple[tuple[int, int], ...]:
    """The ``count`` idle GPUs (node index, GPU index) to keep free.

    Only on nodes not cordoned, with no MIG slices, no taint but of the keys in ``tolerated``,
    of ``models`` if any (``Cluster.named_mask``); never those of ``spared``.  ``prefer`` (the last ones kept) is kept
    again while all of it is idle, so that what is kept does not move from batch to batch.
    Else: on the node with the fewest idle GPUs that has enough, and the CPU and memory to go
    with them (as much of each as of its GPUs: with ``cpu_used`` and ``mem_used``), so that what
    is kept stays on one node for pods that need several and the largest idle blocks stay open
    to everyone; failing that, across the nodes with the most.  Fewer when fewer are idle."""
    if count <= 0:
        return ()
    ok = keepable(cluster, models, tolerated)
    idle = (gpu_used == 0) & (cluster.gpu_cap > 0) & ok[:, None]
    for i, g in spared:
        idle[i, g] = False

    def roomy(i: int, gpus: int) -> bool:  # CPU and memory for ``gpus`` of its GPUs
        share = gpus / int(cluster.gpu_count[i])
        cpu = cpu_used is None or cluster.cpu_cap[i] - cpu_used[i] >= share * cluster.cpu_cap[i]
        mem = mem_used is None or cluster.mem_cap[i] - mem_used[i] >= share * cluster.mem_cap[i]
        return bool(cpu and mem)

    inside = all(0 <= i < idle.shape[0] and 0 <= g < idle.shape[1] for i, g in prefer)
    if prefer and len(prefer) == count and inside and all(idle[i, g] for i, g in prefer):
        per_node = Counter(i for i, _ in prefer)
        if all(roomy(i, n) for i, n in per_node.items()):
            return tuple(prefer)
    counts = idle.sum(axis=1)
    nodes = [int(i) for i in np.flatnonzero(counts)]

    enough = [i for i in nodes if counts[i] >= count and roomy(i, count)]
    if enough:
        order = [min(enough, key=lambda i: (int(counts[i]), cluster.nodes[i].name))]
    else:
        order = sorted(nodes, key=lambda i: (not roomy(i, int(counts[i])), -int(counts[i]), cluster.nodes[i].name))
    out: list[tuple[int, int]] = []
    for node in order:
        for gpu in np.flatnonzero(idle[node]):
            if len(out) == count:
                return tuple(out)
            out.append((node, int(gpu)))
    return tuple(out)


@dataclass(slots=True)
class _Held:
    pod: Pod
    node: str
    gpus: tuple[int, ...]
    """The GPU indices it is counted on; until it is counted again (the books rebuilt), those it
    was counted on last: a pod whose GPUs are a guess is guessed there again while they have room."""
    assumed: bool
    wanted: tuple[int, ...] | None
    """GPU indices the pod's annotation names, if any (our plan's, for an assumed pod or a room)."""
    room: bool = False
    """Room held for a pending pod (``Cache.nominate``), not a pod on the books."""

    @property
    def named(self) -> bool:
        """Whether it holds no GPU, or ``wanted`` names as many as it holds: its GPUs are known,
        not guessed (but for indices the node does not have, ``Cache._pick_gpus``)."""
        return not self.pod.num_gpu or (self.wanted is not None and len(self.wanted) == self.pod.num_gpu)


@dataclass(slots=True)
class _Nomination:
    """Room held on a node for a pod that preempted pods there, until it is bound or gives up."""

    held: _Held
    victims: frozenset[tuple[str, str]]
    """Key and UID of each pod it preempted (a pod created again under the name is another)."""
    reclaimed: bool = False
    """The room was reclaimed for a tenant within its quota (``Room.reclaimed``)."""


@dataclass(frozen=True, slots=True)
class Room:
    """Room held for ``pod`` on ``node`` while the pods it preempted there (``victims``, those
    still on the books, as placed in the cluster of the last snapshot) terminate."""

    pod: Pod
    node: str
    victims: tuple[Assignment, ...]
    reclaimed: bool = False
    """Reclaimed from other tenants for ``pod``'s, within its quota (or taken over from a pod it
    was reclaimed for): GPUs the tenant is guaranteed, not more."""


def _another(held: _Held, uid: str) -> bool:
    """``held`` is an earlier (or later) pod of the same name than the one with ``uid``."""
    return bool(uid and held.pod.uid and held.pod.uid != uid)


def _request(p: Pod) -> tuple[object, ...]:
    """What a pod holds on its node, what (anti-)affinity and spread constraints see of it, its
    own terms that weigh others (which change when the namespaces they pick by label change), and
    its gang (whose minimum, read from its PodGroup, may change: what preemption leaves it)."""
    return (
        p.gang,
        p.cpu_milli,
        p.memory_mib,
        p.num_gpu,
        p.gpu_milli,
        p.mig_profile,
        p.mig_held,
        p.labels,
        p.anti_affinity,
        p.terminating,
        p.affinity,
        p.preferred_apart,
        p.preferred_together,
        p.soft_spread,
    )


def _same_wait(a: tuple[Pod, str], b: tuple[Pod, str] | None) -> bool:
    """Whether a pod waiting for a MIG layout is held for as before: the same pod (as it asks
    now: one resized in place holds what it asks now), on the same node."""
    return b is not None and a[1] == b[1] and a[0] == b[0]


def _standing(p: Pod) -> tuple[object, ...]:
    """What of a running pod may change without changing what it holds (``_request``)."""
    return (p.started, p.movable, p.owner, p.preempted)


class Cache:
    """Inventory and usage; every change goes through the methods below."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}
        self._held: dict[str, _Held] = {}
        self._shadowed: dict[str, PodRecord] = {}
        """Bound pods seen under the name of an assumed one with another UID, until its bind ends."""
        self._unlisted: set[str] = set()
        """Assumed pods a relist did not show.  If the Binding then succeeds, the pod may have been
        bound and deleted before the list, with no watch event left to say so: read it back."""
        self._unseen: dict[str, str] = {}
        """Pods (key -> UID) whose Binding succeeded and that the bound-pods watch has not shown
        since: a list taken before the Binding landed does not show them, yet they hold their room."""
        self._cluster: Cluster | None = None
        self._cpu: IntArray = np.zeros(0, dtype=np.int64)
        self._mem: IntArray = np.zeros(0, dtype=np.int64)
        self._storage: IntArray = np.zeros(0, dtype=np.int64)
        self._pods: IntArray = np.zeros(0, dtype=np.int64)
        self._ports: dict[int, Counter[str]] = {}
        self._residents: dict[int, dict[str, Pod]] = {}
        self._resident_view: dict[int, tuple[Pod, ...]] = {}
        self._nominated: dict[str, _Nomination] = {}
        """Pods that preempted others, by key: what each will take is counted on its node, so
        that no other pod takes the room its victims leave."""
        self._waiting: dict[str, tuple[Pod, str]] = {}
        """Pods waiting for a MIG layout asked for, by key, with the node each waits on
        (``hold_for_layouts``): all they take there but GPUs and MIG instances is counted on it."""
        self._gpu: IntArray = np.zeros((0, 1), dtype=np.int64)
        self._told_overbooked: frozenset[tuple[str, int]] = frozenset()
        self._guessed: dict[str, dict[str, _Held]] = {}
        """Pods on the books counted on guessed GPUs (``_pick_gpus``), by node name and key."""
        self._kinds: IntArray = np.zeros((0, 2), dtype=np.int64)
        self._mig: IntArray = np.zeros((0, 0), dtype=np.int64)
        self.generation = 0
        """Bumped by every change; a snapshot carries the generation it was taken at."""
        self.repartition: Repartition = "off"
        """Which idle GPUs a plan may re-partition into MIG instances (``Cluster``)."""
        self._profiles: frozenset[str] = frozenset()
        self._claim_users: dict[str, tuple[str, str]] = {}
        self._claims_at = -1
        """The generation ``_claim_users`` was read at."""

    # -- inventory -------------------------------------------------------------------------
    def set_repartition(self, mode: Repartition, profiles: Iterable[str] = ()) -> None:
        """Which idle GPUs of the nodes that allow it the next snapshots may re-partition, and
        MIG profiles the cluster must know (those of layouts still to come) beyond its nodes'."""
        wanted = frozenset(profiles)
        known = self._cluster is None or wanted <= set(self._cluster.mig_profiles)
        if mode != self.repartition or not known:
            self._cluster = None
            self.generation += 1
        self.repartition = mode
        self._profiles = wanted

    def upsert_node(self, record: NodeRecord) -> bool:
        """Add or update a node; True when what it offers changed.  A change of its
        PreferNoSchedule taints alone is kept (later solves weigh it) but reported as no change:
        it makes no pod fit or stop fitting."""
        old = self._nodes.get(record.name)
        self._nodes[record.name] = record
        changed = (
            old is None
            or not same_offer(old.node, record.node)
            or old.node.labels != record.node.labels  # topology domains (rack, clique) the solver reads
        )
        if changed or old is None or old.node.soft_taints != record.node.soft_taints:
            self._cluster = None
            self.generation += 1
        return changed

    def delete_node(self, name: str) -> bool:
        """Forget a node; pods held on it stay on the books until they go."""
        if self._nodes.pop(name, None) is None:
            return False
        self._cluster = None
        self.generation += 1
        return True

    def replace_nodes(self, records: Iterable[NodeRecord]) -> None:
        """Set the whole inventory at once (after a list)."""
        self._nodes = {r.name: r for r in records}
        self._cluster = None
        self.generation += 1

    @property
    def nodes(self) -> Mapping[str, NodeRecord]:
        """Every known node by name."""
        return MappingProxyType(self._nodes)

    def as_booked(self, measured: Mapping[str, Collection[int]]) -> dict[str, frozenset[int]]:
        """``measured`` (node name -> GPU indices as the node numbers them: DCGM's) as the books
        number them (``booked_gpus``: on a time-sliced node, slices); a node not known is left
        as it is."""
        return {
            name: frozenset(gpus) if (rec := self._nodes.get(name)) is None else booked_gpus(rec.node, gpus)
            for name, gpus in measured.items()
        }

    # -- pods --------------------------------------------------------------------------------
    def observe_pod(self, record: PodRecord) -> bool:
        """Account a pod seen on the watch; True when it freed capacity (room held for it
        included: bound, by us or another, it holds its own room now)."""
        dropped = record.bound and self.unnominate(record.key)
        return self._observe(record) or dropped

    def _observe(self, record: PodRecord) -> bool:
        key = record.key
        held = self._held.get(key)
        if held is not None and not _another(held, record.uid):
            self._unlisted.discard(key)  # seen since the list: its deletion will be seen too
            self._unseen.pop(key, None)
        if not record.bound or record.terminal:
            if held is not None and not held.assumed:
                self._drop(key)
                return True
            return False
        if held is not None and held.assumed and _another(held, record.uid):
            # Another pod of the name while ours is being bound: most likely the one it
            # replaced, still on the watch (whose last events must not undo our assumption). The
            # bind's outcome decides: bound, it was the older one; gone, it is the current one.
            self._shadowed[key] = record
            return False
        if held is not None:
            if held.node == record.node_name and held.pod.uid in ("", record.uid):
                annotated = record.gpu_indices
                if _request(held.pod) == _request(record.pod) and annotated in (None, held.wanted):
                    held.assumed = False  # confirmed
                    # What may change on a running pod without changing what it holds: when the
                    # kubelet started it (for preemption's ties), whether it may be moved (an
                    # annotation added, its controller orphaning it) and whether it was preempted.
                    now = record.pod
                    if _standing(held.pod) != _standing(now):
                        held.pod = replace(
                            held.pod, started=now.started, movable=now.movable, owner=now.owner, preempted=now.preempted
                        )
                    return False
                # Same pod, new request (an in-place resize), or other GPUs than we assumed (an
                # earlier instance bound it first): count what it asks for now, on the GPUs its
                # annotation names, else the ones it holds (guessed ones stay a guess).
                gpus = held.gpus
                self._drop(key)
                self._add(key, _Held(record.pod, record.node_name, gpus, False, annotated or held.wanted))
                return True
            self._drop(key)
        self._add(key, _Held(record.pod, record.node_name, (), False, record.gpu_indices))
        return held is not None

    def delete_pod(self, key: str, uid: str = "") -> bool:
        """The pod is gone; True when it held resources.  With ``uid``, a pod of the same name
        but another UID (created again since) is left alone."""
        held = self._held.get(key)
        if held is None or _another(held, uid):
            shadow = self._shadowed.get(key)
            if shadow is not None and shadow.uid == uid:
                del self._shadowed[key]
            return False
        self._drop(key)
        return True

    def replace_pods(self, records: Iterable[PodRecord]) -> list[str]:
        """Set every bound pod at once (after a list).  Assumed pods not in the list stay
        assumed; so do pods bound by us that the watch has not shown yet (the list may predate
        their Binding): the keys of those the list does not show are returned, to be read back
        (bound and deleted before the list, no watch event would free their room)."""
        before = self._held
        kept = {k: h for k, h in before.items() if h.assumed or self._unseen.get(k) == h.pod.uid}
        self._held = {}
        self._shadowed = {}
        self._cluster = None
        self.generation += 1
        self._unlisted = {k for k, h in kept.items() if h.assumed}
        unseen = {k for k, h in kept.items() if not h.assumed}
        self._unseen = {k: self._unseen[k] for k in unseen}
        for r in records:
            if not r.bound or r.terminal:
                continue
            self._nominated.pop(r.key, None)  # bound: it holds its own room now (books rebuilt below)
            h = kept.get(r.key)
            if h is not None and _another(h, r.uid):
                self._shadowed[r.key] = r  # as ``observe_pod`` does: the bind (or the read back) decides
                continue
            self._unlisted.discard(r.key)
            unseen.discard(r.key)
            self._unseen.pop(r.key, None)
            # The same pod on the same node keeps the GPUs it was counted on, as the guess to
            # make again (a pod that names none): the list's order must not move it.
            was = before.get(r.key)
            gpus = was.gpus if was is not None and was.node == r.node_name and not _another(was, r.uid) else ()
            self._held[r.key] = _Held(r.pod, r.node_name, gpus, False, r.gpu_indices)
        for k, h in kept.items():
            self._held.setdefault(k, h)
        self._waiting = {k: w for k, w in self._waiting.items() if k not in self._held}  # (as ``_add`` does)
        return sorted(unseen)

    def assume(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> None:
        """Count ``pod`` on ``node`` before its Binding is confirmed (instead of any room held for
        it).  A bound pod of the name with another UID is set aside as ``observe_pod`` does: the
        bind decides which is current."""
        self.unnominate(pod.key)
        held = self._held.get(pod.key)
        if held is not None:
            if not held.assumed and _another(held, pod.uid):
                self._shadowed[pod.key] = PodRecord(
                    held.pod, held.pod.uid, "", held.node, held.wanted or held.gpus or None
                )
            self._drop(pod.key)
        self._add(pod.key, _Held(pod, node, (), True, gpus))

    def confirm(self, key: str) -> bool:
        """The Binding of an assumed pod succeeded: it is bound (a relist without it drops it).
        True when a relist taken meanwhile did not show it and the watch has not since: only the
        API server can tell whether it still exists (``read_back`` with its answer)."""
        held = self._held.get(key)
        if held is not None:
            held.assumed = False
            self._unseen[key] = held.pod.uid
        if key in self._unlisted and held is not None:
            self._unlisted.discard(key)
            return True  # a pod of the name the relist showed may be the current one: keep it aside
        self._shadowed.pop(key, None)  # an older pod of the name: ours is the current one
        return False

    def read_back(self, key: str, uid: str, exists: bool) -> bool:
        """What the API server said of a pod ``confirm`` asked about.  Gone, it leaves the books,
        and a pod of its name that the relist showed (bound after ours was deleted) is counted
        instead.  True when capacity was freed or changed hands."""
        shadow = self._shadowed.pop(key, None)
        if exists:
            return False
        freed = self.delete_pod(key, uid)
        if shadow is not None and key not in self._held:
            self.observe_pod(shadow)
            return True
        return freed

    def forget(self, key: str) -> bool:
        """Undo ``assume`` (a failed Binding); a no-op for confirmed or unknown pods.  True when
        capacity was freed or changed hands (wake the pods waiting for it)."""
        held = self._held.get(key)
        shadow = self._shadowed.pop(key, None)
        if held is None or not held.assumed:
            return False
        self._drop(key)
        if shadow is not None:  # the pod of the name seen meanwhile is the current one
            self.observe_pod(shadow)
        return True

    def holds(self, key: str, uid: str = "") -> bool:
        """Whether ``key`` is on the books, bound or assumed (with ``uid``: that pod, not an
        earlier one of the same name)."""
        held = self._held.get(key)
        return held is not None and not _another(held, uid)

    def held_pod(self, key: str) -> Pod | None:
        """The pod the books count under ``key``, if any."""
        held = self._held.get(key)
        return None if held is None else held.pod

    def is_assumed(self, key: str) -> bool:
        """Whether ``key`` is assumed and not yet confirmed."""
        held = self._held.get(key)
        return held is not None and held.assumed

    def claim_users(self) -> Mapping[str, tuple[str, str]]:
        """The PersistentVolumeClaims the pods on the books (bound, or being bound) mount: by
        claim (``namespace/name``), the key and UID of one of the pods that mount it."""
        if self._claims_at != self.generation:
            self._claims_at = self.generation
            self._claim_users = {
                f"{h.pod.namespace}/{c}": (key, h.pod.uid) for key, h in self._held.items() for c in h.pod.claims
            }
        return MappingProxyType(self._claim_users)

    def placement(self, key: str) -> tuple[str, tuple[int, ...]] | None:
        """Node and GPU indices the books hold for ``key``."""
        held = self._held.get(key)
        return None if held is None else (held.node, held.gpus)

    def gang_held(self, names: set[str]) -> dict[str, tuple[int, str]]:
        """Per named gang, members already on the books (bound or assumed) and the value of the
        gang's topology label on the node of one of them ("" when none or unlabelled).  Members
        being deleted do not count: a gang restarted while its old members terminate is placed
        whole again, wherever it fits."""
        count = dict.fromkeys(names, 0)
        domain = dict.fromkeys(names, "")
        for held in self._held.values():
            gang = held.pod.gang
            if gang is None or gang.name not in count or held.pod.terminating:
                continue
            count[gang.name] += 1
            node = self._nodes.get(held.node)
            if gang.topology_key and node is not None and not domain[gang.name]:
                domain[gang.name] = node.node.labels.get(gang.topology_key, "")
        return {n: (count[n], domain[n]) for n in names}

    # -- preemption ------------------------------------------------------------------------
    def _evictable(self) -> Iterable[_Held]:
        """Confirmed pods not being deleted, nor preempted already (the watch may not have shown
        their deletion yet)."""
        taken = {v for n in self._nominated.values() for v in n.victims}
        for held in self._held.values():
            if not held.assumed and not held.pod.terminating and (held.pod.key, held.pod.uid) not in taken:
                yield held

    def gang_members(self) -> list[Pod]:
        """Members of gangs on the books, bound or assumed (their Binding in flight), not being
        deleted nor preempted already: what a running gang counts toward its minimum."""
        taken = {v for n in self._nominated.values() for v in n.victims}
        return [
            h.pod
            for h in self._held.values()
            if h.pod.gang is not None and not h.pod.terminating and (h.pod.key, h.pod.uid) not in taken
        ]

    def preemptible(self) -> list[Assignment]:
        """Bound pods that preemption may evict, as placed in the cluster of the last
        ``snapshot`` (take both at once): confirmed, on a known node, not being deleted, not
        preempted already."""
        cluster = self._ensure_cluster()
        out = []
        for held in self._evictable():
            i = cluster.index.get(held.node)
            if i is not None:
                out.append(Assignment(held.pod, i, held.gpus))
        return out

    def blocking(self, busy: Mapping[str, Collection[int]]) -> set[tuple[str, int]]:
        """The GPUs of ``busy`` (node name -> GPU indices) that a snapshot would count as full:
        on a node of the cluster with no MIG slices, and with room left by the books."""
        cluster = self._ensure_cluster()
        return {
            (cluster.nodes[i].name, g) for i, g in _busy_cells(cluster, busy) if self._gpu[i, g] < cluster.gpu_cap[i, g]
        }

    def unexplained(self, busy: Mapping[str, Collection[int]]) -> dict[str, frozenset[int]]:
        """The GPUs of ``busy`` (as ``as_booked`` numbers them) that the pods on the books cannot
        account for when the device plugin chose their GPUs itself (NVIDIA's does: it ignores
        ``gpusched.io/gpu-indices``, so a pod booked on GPU 0 may run on GPU 1).  A busy GPU the
        books hold stays busy (no share is added to it); of the busy GPUs the books show free,
        as many as the node has GPUs booked and measured idle are taken for those pods'
        (a pod booked on an idle GPU is running on one of them), and only the rest are left."""
        cluster = self._ensure_cluster()
        out: dict[str, frozenset[int]] = {}
        for name, gpus in busy.items():
            i = cluster.index.get(name)
            if i is None:
                out[name] = frozenset(gpus)
                continue
            count = int(cluster.gpu_count[i])
            booked = {g for g in range(count) if self._gpu[i, g] > 0}
            measured = {g for g in gpus if 0 <= g < count}
            free = sorted(measured - booked)
            explained = len(booked - measured)
            out[name] = frozenset((measured & booked) | set(free[explained:]))
        return {n: g for n, g in out.items() if g}

    def holders_of(self, gpus: Collection[tuple[str, int]]) -> dict[tuple[str, int], set[str]]:
        """The keys of the pods on the books (bound or assumed) holding each of ``gpus`` (node
        name, GPU index); a GPU nobody holds is left out."""
        out: dict[tuple[str, int], set[str]] = {}
        if not gpus:
            return out
        wanted = set(gpus)
        for h in self._held.values():
            for g in h.gpus:
                if (h.node, g) in wanted:
                    out.setdefault((h.node, g), set()).add(h.pod.key)
        return out

    def placed(self) -> list[Assignment]:
        """Every pod on the books (bound or assumed) on a known node, as placed in the cluster
        of the last ``snapshot`` (take both at once)."""
        cluster = self._ensure_cluster()
        return [
            Assignment(h.pod, i, h.gpus) for h in self._held.values() if (i := cluster.index.get(h.node)) is not None
        ]

    def on_nodes(self) -> list[tuple[str, Pod]]:
        """Every pod on the books (bound or assumed), with its node's name."""
        return [(h.node, h.pod) for h in self._held.values()]

    def guessed_gpus(self) -> set[str]:
        """Keys of the pods on the books whose GPU indices are the books' guess: pods of other
        schedulers that do not name them (``gpusched.io/gpu-indices``)."""
        self._ensure_cluster()  # the books place pods on GPUs only once they know the nodes
        return {key for on_node in self._guessed.values() for key in on_node}

    def tenant_usage(
        self,
        tenants: Tenants,
        without: Collection[str] = (),
        *,
        terminating: bool = False,
        moving: Collection[tuple[str, str]] = (),
    ) -> dict[str, int]:
        """GPU demand per tenant (thousandths of a GPU) of the pods on the books that stay:
        bound or assumed, not being deleted nor preempted already, and of the pods room is held
        for (they will have it), but for the room of ``without`` (pod keys).  ``terminating``:
        count the pods being deleted too (but for the victims of held room, which the pods it
        is held for replace): they hold their GPUs until they are gone, as a limit must count.
        ``moving``: pods (key, UID) being moved elsewhere by their controller (consolidation),
        not counted: their replacements, which take their place, are."""
        taken = {v for n in self._nominated.values() for v in n.victims} | set(moving)
        staying = (
            h.pod
            for h in self._held.values()
            if (terminating or not h.pod.terminating) and (h.pod.key, h.pod.uid) not in taken
        )
        usage = tenants.usage(staying)
        skip = set(without)
        held_for = (n.held.pod for k, n in self._nominated.items() if k not in skip and k not in self._held)
        for tenant, d in tenants.usage(held_for).items():
            usage[tenant] = usage.get(tenant, 0) + d
        return usage

    def lowest_priority(self) -> int | None:
        """The lowest priority among the pods ``preemptible`` would list (None: there are none):
        only a pod of higher priority may preempt."""
        return min((h.pod.priority for h in self._evictable()), default=None)

    def adopt_nomination(self, pod: Pod, node: str) -> bool:
        """Hold room for ``pod`` on ``node``, where it preempted pods under another instance
        (its ``status.nominatedNodeName``), while pods of lower priority that a scheduler
        preempted are leaving there; on the GPUs they free.  True when room is now held."""
        if pod.key in self._nominated:
            return False
        leaving = [
            h
            for h in self._held.values()
            if h.node == node and h.pod.terminating and h.pod.preempted and h.pod.priority < pod.priority
        ]
        if not leaving:
            return False
        self._ensure_cluster()  # the GPUs of the rooms held there are picked as they are counted
        taken = {g for n in self._nominated.values() if n.held.node == node for g in n.held.gpus}
        freed = tuple(sorted({g for h in leaving for g in h.gpus} - taken))  # not another room's
        record = self._nodes.get(node)
        if pod.island and record is not None and pod.num_gpu > 1:  # within one island, where one has enough
            islands = record.node.islands
            within = [
                [g for g in freed if g < len(islands) and islands[g] == i]
                for i in sorted({islands[g] for g in freed if g < len(islands)})
            ]
            freed = next((tuple(gs) for gs in within if len(gs) >= pod.num_gpu), freed)
        self.nominate(pod, node, freed[: pod.num_gpu] if len(freed) >= pod.num_gpu else (), [h.pod for h in leaving])
        return True

    def nominate(
        self, pod: Pod, node: str, gpus: tuple[int, ...], victims: Iterable[Pod], reclaimed: bool = False
    ) -> None:
        """Hold room for ``pod`` on ``node`` (on ``gpus``) while the pods it preempted there
        (``victims``) terminate: other pods are placed as if it were there.  ``reclaimed``: the
        room is reclaimed for its tenant (``Room.reclaimed``)."""
        self.unnominate(pod.key)
        held = _Held(pod, node, (), True, gpus, room=True)
        self._nominated[pod.key] = _Nomination(held, frozenset((v.key, v.uid) for v in victims), reclaimed)
        self.generation += 1
        if self._cluster is not None:
            self._account(held, 1)

    def unnominate(self, key: str) -> bool:
        """Give up the room held for ``key``; True when there was some."""
        nomination = self._nominated.pop(key, None)
        if nomination is None:
            return False
        self.generation += 1
        if self._cluster is not None:
            self._account(nomination.held, -1)
        return True

    def gang_nominations(self, gang: str) -> list[str]:
        """Keys of the members of ``gang`` (its name) that room is held for."""
        return [k for k, n in self._nominated.items() if (g := n.held.pod.gang) is not None and g.name == gang]

    def nomination(self, key: str) -> tuple[str, tuple[int, ...], int] | None:
        """The node and GPUs room is held on for ``key``, and how many of the pods it preempted
        are still on the books (None: no room held)."""
        nomination = self._nominated.get(key)
        if nomination is None:
            return None
        self._ensure_cluster()  # the GPUs are picked as the room is counted
        held = nomination.held
        left = sum(1 for k, uid in nomination.victims if (h := self._held.get(k)) is not None and h.pod.uid == uid)
        return held.node, held.gpus, left

    def has_room(self, key: str) -> bool:
        """Whether room is held for ``key`` (cheaper than ``nomination``)."""
        return key in self._nominated

    def waiting_on(self, victim: Pod) -> list[str]:
        """Keys of the pods whose room waits for ``victim`` (this UID) to leave."""
        return [k for k, n in self._nominated.items() if (victim.key, victim.uid) in n.victims]

    def hold_for_layouts(self, waits: Mapping[str, tuple[Pod, str]]) -> bool:
        """Hold room for the pods waiting for MIG layouts asked for (key -> the pod, as it is
        pending now, and the node it waits on: the node re-partitioned for it, or for a gang's
        member beside it the node the plan put it on), instead of those it was held for so far:
        other pods are placed as if they were there.  Their CPU, memory, ephemeral storage, pod
        slot, host ports and pod (anti-)affinity count on that node, as for a pod on the books, so
        no pod placed meanwhile (a MIG pod that joins the layout, a CPU pod while the node is
        sealed) takes what they need there once the layout comes; not their GPUs nor MIG
        instances, which the layout brings (its instances are counted as promised: ``coming`` of
        ``snapshot``).  None is held for a pod of the name on the books (bound, or being bound),
        which holds its own; one that is bound gives its room up (``_add``).  True when what is
        held changed."""
        wanted = {k: w for k, w in waits.items() if k not in self._held}
        gone = [k for k, w in self._waiting.items() if not _same_wait(w, wanted.get(k))]
        new = [k for k, w in wanted.items() if not _same_wait(w, self._waiting.get(k))]
        if not gone and not new:
            return False
        for k in gone:
            wait = self._waiting.pop(k)
            if self._cluster is not None:
                self._count_wait(*wait, -1)
        for k in new:
            self._waiting[k] = wanted[k]
            if self._cluster is not None:
                self._count_wait(*wanted[k], 1)
        self.generation += 1
        return True

    def rooms(self) -> list[Room]:
        """Every room held, with the pods it waits for."""
        cluster = self._ensure_cluster()
        out = []
        for n in self._nominated.values():
            victims = tuple(
                Assignment(h.pod, i, h.gpus)
                for k, uid in sorted(n.victims)
                if (h := self._held.get(k)) is not None
                and h.pod.uid == uid
                and (i := cluster.index.get(h.node)) is not None
            )
            out.append(Room(n.held.pod, n.held.node, victims, n.reclaimed))
        return out

    @property
    def nominations(self) -> int:
        """Pods room is held for."""
        return len(self._nominated)

    def clear_nominations(self) -> bool:
        """Give up all held room (another instance schedules now, and holds its own); True
        when there was some."""
        keys = list(self._nominated)
        for key in keys:
            self.unnominate(key)
        return bool(keys)

    @property
    def held_count(self) -> int:
        """Pods on the books."""
        return len(self._held)

    def gpu_pods_on(self, node: str) -> list[str]:
        """Keys of the pods on the books on ``node`` that hold GPUs or a MIG instance (those
        being deleted too: they hold them until they are gone)."""
        return sorted(k for k, h in self._held.items() if h.node == node and (h.pod.num_gpu or h.pod.mig_profile))

    # -- snapshot ----------------------------------------------------------------------------
    def snapshot(
        self,
        free: Collection[str] = (),
        busy: Mapping[str, Collection[int]] | None = None,
        keep: int = 0,
        keep_models: Collection[str] = (),
        kept_before: Collection[tuple[str, int]] = (),
        keep_tolerated: Collection[str] = (),
        sealed: Collection[str] = (),
        coming: Mapping[str, Coming] | None = None,
    ) -> Snapshot:
        """Freeze the books for a batch; the room held for the pods of ``free`` (keys) is left
        free for them.  The GPUs of ``busy`` (node name -> GPU indices) count as full, so no
        pod is placed on them; room held for ``free`` is left free all the same (its victims
        are gone, and with them what kept the GPU busy), and nodes with MIG slices are left
        as they are (their slices are not numbered as their GPUs).  Then ``keep`` idle GPUs
        (of ``keep_models``, if any are named; those of ``kept_before`` again, by node name and
        GPU index, while all are idle; on nodes with no taint but of the keys of
        ``keep_tolerated``) count as full too (``keep_free``).  On the nodes of ``sealed`` (by
        name) every GPU and MIG instance counts as taken; but for those of ``coming`` (node name
        -> the MIG layouts asked for there by GPU index, and the instances already promised by
        profile), the instances of those layouts not promised yet are offered."""
        cluster = self._ensure_cluster()
        # Taken off the books themselves, not the snapshot: while its victims terminate, a
        # GPU may be counted twice, and the snapshot counts at most a whole GPU.
        held = [n.held for k in free if (n := self._nominated.get(k)) is not None]
        for h in held:
            self._account(h, -1)
        try:
            if not busy and not keep and not sealed:
                return self._freeze(cluster)
            rooms = {(h.node, g) for h in held for g in h.gpus}
            spared = {(cluster.index[n], g) for n, g in rooms if n in cluster.index}
            blocked = [c for c in _busy_cells(cluster, busy or {}) if c not in spared]
            prefer = [(cluster.index[n], g) for n, g in kept_before if n in cluster.index]
            shut = [i for n in sealed if (i := cluster.index.get(n)) is not None]
            to_come = {i: c for n, c in (coming or {}).items() if (i := cluster.index.get(n)) is not None and i in shut}
            return self._freeze(
                cluster, blocked, keep, frozenset(keep_models), spared, prefer, frozenset(keep_tolerated), shut, to_come
            )
        finally:
            for h in held:
                self._account(h, 1)

    def _freeze(
        self,
        cluster: Cluster,
        busy: Collection[tuple[int, int]] = (),
        keep: int = 0,
        keep_models: frozenset[str] = frozenset(),
        spared: Collection[tuple[int, int]] = (),
        prefer: Collection[tuple[int, int]] = (),
        tolerated: frozenset[str] = frozenset(),
        sealed: Sequence[int] = (),
        coming: Mapping[int, Coming] | None = None,
    ) -> Snapshot:
        gpu = np.minimum(self._gpu, cluster.gpu_cap)
        if (self._gpu > cluster.gpu_cap).any():
            self._spill(cluster, gpu)
        blocked = []
        for i, g in busy:
            room = int(cluster.gpu_cap[i, g] - gpu[i, g])
            if room > 0:
                blocked.append((i, g, room))
            gpu[i, g] = cluster.gpu_cap[i, g]
        mig = np.minimum(self._mig, cluster.mig_cap)  # slices counted on a node that no longer offers them
        if len(sealed):  # before the headroom is chosen: nothing kept there would be usable
            rows = list(sealed)
            gpu[rows] = cluster.gpu_cap[rows]
            mig[rows] = cluster.mig_cap[rows]
        kept = (
            keep_free(cluster, gpu, keep, keep_models, spared, prefer, tolerated, self._cpu, self._mem) if keep else ()
        )
        for i, g in kept:
            gpu[i, g] = cluster.gpu_cap[i, g]
        partitions: list[MigPartition] = []
        for i, (layouts, promised) in (coming or {}).items():
            profiles = {p for _, lay in layouts for p in lay.counts} | set(promised)
            if all(p in cluster.mig_index for p in profiles):
                partitions += [(i, g, lay) for g, lay in layouts]
                for p, c in promised.items():
                    mig[i, cluster.mig_index[p]] += c
        storage = self._storage.copy() if self._storage.any() else None
        ports = {n: frozenset(p for p, c in held.items() if c > 0) for n, held in self._ports.items()}
        state = ClusterState(
            cluster,
            self._cpu.copy(),
            self._mem.copy(),
            gpu,
            self._kinds.copy(),
            mig,
            tuple(partitions),
            storage,
            {n: p for n, p in ports.items() if p},
            dict(self._resident_view),
            pods_used=self._pods.copy() if cluster.pods_metered else None,
        )
        return Snapshot(self.generation, cluster, state, tuple(blocked), kept, tuple(sealed))

    def _spill(self, cluster: Cluster, gpu: IntArray) -> None:
        """Count in ``gpu`` (the books capped at each GPU's capacity) what the pods on the books
        fill GPUs past their capacity by (two pods that name one GPU, pods left on a node that
        lost GPUs) on the node's other GPUs, the emptiest first, as far as they have room: the
        node holds those pods all the same.  Told in the log when the GPUs change.  Room held for
        a pod is no excess: it takes the GPUs its victims leave."""
        over = self._gpu - cluster.gpu_cap
        for nomination in self._nominated.values():
            held = nomination.held
            if (i := cluster.index.get(held.node)) is not None:
                for g in held.gpus:
                    over[i, g] -= held.pod.gpu_milli
        cells = tuple((int(i), int(g), int(over[i, g])) for i, g in np.argwhere(over > 0))
        excess: Counter[int] = Counter()
        for i, _, extra in cells:
            excess[i] += extra
        for i, extra in excess.items():
            left = extra
            for g in sorted(range(int(cluster.gpu_count[i])), key=lambda g: (int(gpu[i, g]), g)):
                take = min(left, int(cluster.gpu_cap[i, g] - gpu[i, g]))
                if take > 0:
                    gpu[i, g] += take
                    left -= take
        named = frozenset((cluster.nodes[i].name, g) for i, g, _ in cells)
        if named != self._told_overbooked:
            self._told_overbooked = named
            if named:
                holders = self.holders_of(named)
                log.warning(
                    "GPUs booked past their capacity; the excess is counted on the node's other GPUs",
                    gpus=[f"{n}/{g}: {', '.join(sorted(holders.get((n, g), ())))}" for n, g in sorted(named)],
                )

    def _ensure_cluster(self) -> Cluster:
        if self._cluster is None:
            nodes: list[Node] = [r.node for _, r in sorted(self._nodes.items())]
            cluster = Cluster(nodes, repartition=self.repartition, mig_profiles=self._profiles)
            n = len(cluster)
            self._cpu = np.zeros(n, dtype=np.int64)
            self._mem = np.zeros(n, dtype=np.int64)
            self._storage = np.zeros(n, dtype=np.int64)
            self._pods = np.zeros(n, dtype=np.int64)
            self._ports = {}
            self._residents = {}
            self._resident_view = {}
            self._gpu = np.zeros((n, cluster.max_gpus), dtype=np.int64)
            self._kinds = np.zeros((n, cluster.max_gpus + 1), dtype=np.int64)
            self._mig = np.zeros((n, len(cluster.mig_profiles)), dtype=np.int64)
            self._guessed = {}
            self._cluster = cluster
            # Pods whose GPUs are known first, then those whose GPUs are a guess, each where it
            # was guessed before while that has room: a guess never takes a GPU a known pod holds
            # (whatever the order of the pods), nor moves without cause.  Rooms last: they take
            # the GPUs of the pods they wait for, which hold them until they are gone.
            guessed = []
            for held in self._held.values():
                if held.named:
                    self._account(held, 1)
                else:
                    guessed.append(held)
            for held in guessed:
                self._account(held, 1)
            for nomination in self._nominated.values():
                self._account(nomination.held, 1)
            for pod, node in self._waiting.values():
                self._count_wait(pod, node, 1)
        return self._cluster

    def _add(self, key: str, held: _Held) -> None:
        wait = self._waiting.pop(key, None)
        if wait is not None and self._cluster is not None:  # on the books: it holds its own room now
            self._count_wait(*wait, -1)
        self._held[key] = held
        self.generation += 1
        if self._cluster is not None:
            self._account(held, 1)

    def _drop(self, key: str) -> None:
        held = self._held.pop(key)
        self._unlisted.discard(key)
        self._unseen.pop(key, None)
        self.generation += 1
        if self._cluster is not None:
            self._account(held, -1)

    def _account(self, held: _Held, sign: int) -> None:
        assert self._cluster is not None
        i = self._cluster.index.get(held.node)
        if i is None:  # node unknown: nothing to count against
            held.gpus = ()
            return
        pod = held.pod
        if sign > 0:
            held.gpus = self._pick_gpus(i, pod, held.wanted, held.gpus)
        self._count_host_room(i, pod, sign)
        for g in held.gpus:
            self._gpu[i, g] += sign * pod.gpu_milli
        if held.gpus:
            if held.wanted != held.gpus:
                self._note_guess(held, sign)
            elif sign > 0 and self._guessed.get(held.node):  # (none yet as the books are rebuilt)
                self._make_way(i, held)
        if pod.num_gpu:
            col = 0 if pod.is_fractional else min(pod.num_gpu, self._cluster.max_gpus)
            self._kinds[i, col] += sign
        for profile, count in pod.mig_slices:  # all it holds: a pod another scheduler bound may hold several
            if (m := self._cluster.mig_id(profile)) >= 0:
                self._mig[i, m] += sign * count

    def _count_host_room(self, i: int, pod: Pod, sign: int) -> None:
        """Count (``sign`` 1) or take off what ``pod`` takes on node ``i`` but GPUs and MIG
        instances: CPU, memory, ephemeral storage, a pod slot, its host ports, and its place among
        the pods that pod (anti-)affinity and spread constraints weigh there."""
        self._cpu[i] += sign * pod.cpu_milli
        self._mem[i] += sign * pod.memory_mib
        self._storage[i] += sign * pod.storage_mib
        self._pods[i] += sign
        if pod.host_ports:
            held_ports = self._ports.setdefault(i, Counter())
            held_ports.update(dict.fromkeys(pod.host_ports, sign))
        if pod.has_affinity_identity:
            here = self._residents.setdefault(i, {})
            if sign > 0:
                here[pod.key] = pod
            else:
                here.pop(pod.key, None)
            if here:
                self._resident_view[i] = tuple(here.values())
            else:
                del self._residents[i]
                self._resident_view.pop(i, None)

    def _count_wait(self, pod: Pod, node: str, sign: int) -> None:
        """Count (``sign`` 1) or take off a pod waiting for a MIG layout on ``node``
        (``hold_for_layouts``)."""
        assert self._cluster is not None
        if (i := self._cluster.index.get(node)) is not None:  # node unknown: nothing to count against
            self._count_host_room(i, pod, sign)

    def _note_guess(self, held: _Held, sign: int) -> None:
        """Keep ``_guessed`` for ``held``, counted on guessed GPUs, just counted (``sign`` 1) or
        taken off (rooms held for pods are not kept: they take their victims' GPUs)."""
        if held.room:
            return
        key = held.pod.key
        if sign > 0:
            self._guessed.setdefault(held.node, {})[key] = held
        elif (here := self._guessed.get(held.node)) is not None and here.get(key) is held:
            del here[key]

    def _make_way(self, i: int, held: _Held) -> None:
        """``held``, on the books, was just counted on GPUs it names (node index ``i``): the pods
        guessed on those of them it filled past their capacity are elsewhere (it is there), and
        are guessed again, where they were while that has room, else on the emptiest."""
        assert self._cluster is not None
        if held.room:  # it takes its victims' GPUs
            return
        cap = self._cluster.gpu_cap[i]
        if not any(self._gpu[i, g] > cap[g] for g in held.gpus):
            return
        for other in list(self._guessed[held.node].values()):
            if any(self._gpu[i, g] > cap[g] for g in other.gpus):
                self._account(other, -1)
                self._account(other, 1)

    def _pick_gpus(
        self, i: int, pod: Pod, wanted: tuple[int, ...] | None, before: tuple[int, ...] = ()
    ) -> tuple[int, ...]:
        """GPU indices to count ``pod`` on: the annotated ones when valid (as many as it asks
        for, each on the node and none twice); else a guess: those it was counted on ``before``
        while they have room for it, else the emptiest."""
        assert self._cluster is not None
        count = int(self._cluster.gpu_count[i])
        if not pod.num_gpu or not count:
            return ()
        if (
            wanted is not None
            and len(set(wanted)) == len(wanted) == pod.num_gpu
            and all(0 <= g < count for g in wanted)
        ):
            return tuple(wanted)
        used = self._gpu[i, :count]
        if len(before) == pod.num_gpu and all(0 <= g < count and used[g] + pod.gpu_milli <= GPU_MILLI for g in before):
            return before
        if pod.is_fractional:
            fits = [g for g in range(count) if used[g] + pod.gpu_milli <= GPU_MILLI]
            if fits:  # the fullest GPU that still fits, as a device plugin packing shares would
                return (max(fits, key=lambda g: (int(used[g]), -g)),)
        order = sorted(range(count), key=lambda g: (int(used[g]), g))
        return tuple(sorted(order[: min(pod.num_gpu, count)]))
