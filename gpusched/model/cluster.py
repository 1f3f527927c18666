"""The cluster and its usage, as dense arrays.

``Cluster`` is the static inventory; ``ClusterState`` is what is in use on it.
Both are immutable: ``ClusterState.apply`` returns a new state and shares the
static part (a pass that places pods one by one may hand a state it made itself
on to the next, ``apply(consume=True)``).  Dense numpy arrays make the per-pod
filters and scores that the greedy policies and the simulator run thousands of
times cheap.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from gpusched.model.affinity import NodeSelector, PodAffinityTerm, Preference, Spread, preference_score, selects
from gpusched.model.mig import MIG_CONFIG_PREFIX, MigGeometry, MigLayout, geometry_for, mig_config, product_key
from gpusched.model.node import GPU_MILLI, LABEL_GPU_COUNT, Node, Taint, label_number, single_mig_profile
from gpusched.model.placement import Assignment, MigPartition
from gpusched.model.pod import Pod, PodShape, Toleration, model_key, tolerated, untolerated
from gpusched.model.ports import ports_clash

__all__ = [
    "BoolArray",
    "Cluster",
    "ClusterState",
    "IntArray",
    "Repartition",
    "SpreadView",
    "live_mig_configs",
    "mig_config_name",
    "mig_plan",
]

IntArray = npt.NDArray[np.int64]
Repartition = Literal["idle-gpus", "idle-nodes", "off"]
BoolArray = npt.NDArray[np.bool_]


_A = TypeVar("_A", bound=npt.NDArray[Any])


_SELECTOR_CACHE = 256
"""Node selector masks a Cluster keeps; more distinct selectors start the cache afresh."""

_LABEL_VALUE_MAX = 63
"""The longest a Kubernetes label value may be."""

UNMETERED = 1 << 50
"""Ephemeral storage of a node that does not meter it (``storage_mib`` None), and pods of one that
sets no limit: more than any pod asks for."""


def _frozen(a: _A) -> _A:
    a.setflags(write=False)
    return a


def _headroom(cap: IntArray, used: IntArray) -> IntArray:
    """What is free of a resource: never below 0, so a node whose running pods request more than
    its allocatable (it shrank under them) takes no pod asking for any of it, and still takes one
    asking for none, as kube-scheduler checks only what a pod requests."""
    free: IntArray = np.maximum(cap - used, 0)
    return free


class Cluster:
    """Static inventory: nodes, capacities and GPU models, indexed 0..N-1."""

    def __init__(
        self, nodes: Sequence[Node], *, repartition: Repartition = "idle-gpus", mig_profiles: Iterable[str] = ()
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[:3]
            raise ValueError(f"duplicate node names: {', '.join(dup)}")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        self.models: tuple[str, ...] = tuple(sorted({n.gpu_model for n in nodes if n.gpu_count}))
        model_id = {m: i for i, m in enumerate(self.models)}
        self.max_gpus: int = max((n.gpu_count for n in nodes), default=0) or 1
        n = len(self.nodes)
        gpu_cap = np.zeros((n, self.max_gpus), dtype=np.int64)
        for i, node in enumerate(self.nodes):
            gpu_cap[i, : node.gpu_count] = GPU_MILLI
        self.cpu_cap: IntArray = _frozen(np.array([x.cpu_milli for x in nodes], dtype=np.int64))
        self.mem_cap: IntArray = _frozen(np.array([x.memory_mib for x in nodes], dtype=np.int64))
        self.storage_cap: IntArray = _frozen(
            np.array([UNMETERED if x.storage_mib is None else x.storage_mib for x in nodes], dtype=np.int64)
        )
        """Allocatable ephemeral storage per node, MiB (``UNMETERED`` where the node does not meter it)."""
        self.pods_cap: IntArray = _frozen(
            np.array([UNMETERED if x.max_pods is None else x.max_pods for x in nodes], dtype=np.int64)
        )
        """Pods each node takes (``UNMETERED`` where the node does not say)."""
        self.pods_metered: bool = any(x.max_pods is not None for x in nodes)
        self.gpu_cap: IntArray = _frozen(gpu_cap)
        self.gpu_count: IntArray = _frozen(np.array([x.gpu_count for x in nodes], dtype=np.int64))
        self.model_id: IntArray = _frozen(
            np.array([model_id[x.gpu_model] if x.gpu_count else -1 for x in nodes], dtype=np.int64)
        )
        self._model_masks: dict[frozenset[str], BoolArray] = {}
        taint_sets = sorted({x.taints for x in nodes}, key=repr)
        taint_index = {t: i for i, t in enumerate(taint_sets)}
        self.taint_sets: tuple[tuple[Taint, ...], ...] = tuple(taint_sets)
        self.taint_id: IntArray = _frozen(np.array([taint_index[x.taints] for x in nodes], dtype=np.int64))
        """Index into ``taint_sets`` per node (nodes with equal taints share one)."""
        self.tainted: bool = any(x.taints for x in nodes)
        self.cordoned: BoolArray = _frozen(np.array([x.unschedulable for x in nodes], dtype=np.bool_))
        """Nodes cordoned (``spec.unschedulable``); they carry the taint that says so."""
        soft_sets = sorted({x.soft_taints for x in nodes}, key=repr)
        soft_index = {t: i for i, t in enumerate(soft_sets)}
        self.soft_taint_sets: tuple[tuple[Taint, ...], ...] = tuple(soft_sets)
        self.soft_taint_id: IntArray = _frozen(np.array([soft_index[x.soft_taints] for x in nodes], dtype=np.int64))
        """Index into ``soft_taint_sets`` per node."""
        self.soft_tainted: bool = any(x.soft_taints for x in nodes)
        self._avoided: dict[tuple[Toleration, ...], IntArray | None] = {}
        self._toleration_masks: dict[tuple[Toleration, ...], BoolArray] = {}
        self._selector_masks: dict[NodeSelector, BoolArray] = {}
        self._domains: dict[str, tuple[IntArray, dict[str, int]]] = {}
        self._preference_scores: dict[Preference, IntArray] = {}
        islands = np.full((n, self.max_gpus), -1, dtype=np.int64)
        for i, node in enumerate(self.nodes):
            islands[i, : node.gpu_count] = node.islands
        self.islands: IntArray = _frozen(islands)
        """Island id per GPU (N x max_gpus), -1 where a node has no such GPU."""
        self.island_count: int = int(islands.max()) + 1 if n else 0
        if repartition not in ("idle-gpus", "idle-nodes", "off"):
            raise ValueError(f"repartition must be idle-gpus, idle-nodes or off, got {repartition!r}")
        self.repartition: Repartition = repartition
        """Which GPUs of the nodes that allow it may be re-partitioned: any idle GPU; the idle
        GPUs of a node only while all of its GPUs are idle (a live cluster, where this scheduler
        cannot know which physical GPU a running pod holds); or none."""
        self.geometry: tuple[MigGeometry | None, ...] = tuple(
            geometry_for(x.gpu_model) if x.mig_repartition and x.gpu_count and repartition != "off" else None
            for x in nodes
        )
        """MIG geometry of the nodes whose idle GPUs may be re-partitioned (None elsewhere)."""
        profiles = {p for x in nodes for p, _ in x.mig_slices}
        profiles |= {p for g in self.geometry if g is not None for p in g.profiles}
        profiles |= set(mig_profiles)  # asked for: MIG layouts still to come
        self.mig_profiles: tuple[str, ...] = tuple(sorted(profiles))
        self.mig_index: dict[str, int] = {p: i for i, p in enumerate(self.mig_profiles)}
        mig_cap = np.zeros((n, len(self.mig_profiles)), dtype=np.int64)
        mig_can = np.zeros((n, len(self.mig_profiles)), dtype=np.bool_)
        for i, node in enumerate(self.nodes):
            for p, c in node.mig_slices:
                mig_cap[i, self.mig_index[p]] = c
            geom = self.geometry[i]
            if geom is not None:
                mig_can[i, [self.mig_index[p] for p in geom.profiles]] = True
        self.mig_cap: IntArray = _frozen(mig_cap)
        """MIG instances each node advertises, per profile of ``mig_profiles``."""
        self.mig_can: BoolArray = _frozen(mig_can)
        """Profiles that a re-partitioned idle GPU of each node could offer."""
        self.in_mig_mode: BoolArray = _frozen(
            mig_cap.any(axis=1) | np.array([bool(single_mig_profile(x)) for x in nodes], dtype=np.bool_)
        )
        """Nodes whose GPUs are MIG instances, advertised as ``nvidia.com/mig-*`` or (single
        strategy) as ``nvidia.com/gpu``: DCGM numbers their physical GPUs, not their instances."""

    def layout_counts(self, layout: MigLayout) -> IntArray:
        """Instances per profile of ``mig_profiles`` that ``layout`` offers."""
        out = np.zeros(len(self.mig_profiles), dtype=np.int64)
        for p, c in layout.counts.items():
            out[self.mig_index[p]] += c
        return out

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def product_id(self) -> IntArray:
        """An id per GPU product named on the node, whole GPUs or not (``model_id`` is -1 for a
        node with every GPU in MIG mode, whose product still decides which pods it takes)."""
        ids = {m: i for i, m in enumerate(sorted({n.gpu_model for n in self.nodes}))}
        return _frozen(np.array([ids[n.gpu_model] for n in self.nodes], dtype=np.int64))

    @cached_property
    def total_gpus(self) -> int:
        """Number of GPUs in the cluster."""
        return int(self.gpu_count.sum())

    def product_mask(self, models: frozenset[str]) -> BoolArray:
        """Nodes whose GPU product is one of ``models``, with whole GPUs or only MIG slices on
        offer (a node with every GPU in MIG mode advertises no whole GPU)."""
        key = frozenset({"\0product", *models})
        mask = self._model_masks.get(key)
        if mask is None:
            keys = {model_key(m) for m in models}
            mask = self._model_masks[key] = _frozen(np.array([model_key(x.gpu_model) in keys for x in self.nodes]))
        return mask

    def named_mask(self, names: Iterable[str]) -> BoolArray:
        """Nodes whose GPU product is one of ``names`` as an operator writes them, compared as
        ``product_key`` reads them: ``A100-SXM4-80GB`` names ``NVIDIA-A100-SXM4-80GB`` too."""
        keys = {product_key(n) for n in names}
        key = frozenset({"\0named", *keys})
        mask = self._model_masks.get(key)
        if mask is None:
            named = [bool(x.gpu_model) and product_key(x.gpu_model) in keys for x in self.nodes]
            mask = self._model_masks[key] = _frozen(np.array(named, dtype=np.bool_))
        return mask

    def model_mask(self, models: frozenset[str]) -> BoolArray:
        """Nodes whose GPU model is accepted (all GPU nodes when ``models`` is empty), names
        compared as ``model_key`` reads them."""
        mask = self._model_masks.get(models)
        if mask is None:
            if models:
                keys = {model_key(m) for m in models}
                ids = [i for i, m in enumerate(self.models) if model_key(m) in keys]
                mask = np.isin(self.model_id, ids)
            else:
                mask = self.model_id >= 0
            mask = _frozen(mask)
            self._model_masks[models] = mask
        return mask

    def could_take(self, pod: Pod, node: str) -> bool:
        """Whether ``node`` is there and the pod's taints and node selector let it go there,
        whatever runs on it (kube-scheduler's "unresolvable" filters)."""
        i = self.index.get(node)
        if i is None:
            return False
        if self.tainted and not self.toleration_mask(pod.tolerations)[i]:
            return False
        if pod.volume_selector and not self.selector_mask(pod.volume_selector)[i]:
            return False
        if pod.provision_selector and not self.selector_mask(pod.provision_selector)[i]:
            return False
        if pod.attach_selector and not self.selector_mask(pod.attach_selector)[i]:
            return False
        return not pod.node_selector or bool(self.selector_mask(pod.node_selector)[i])

    def toleration_mask(self, tolerations: tuple[Toleration, ...]) -> BoolArray:
        """Nodes whose taints ``tolerations`` all tolerate (every node without taints)."""
        mask = self._toleration_masks.get(tolerations)
        if mask is None:
            ok = np.array([tolerated(tolerations, ts) for ts in self.taint_sets], dtype=np.bool_)
            mask = _frozen(ok[self.taint_id])
            self._toleration_masks[tolerations] = mask
        return mask

    def avoided(self, tolerations: tuple[Toleration, ...]) -> IntArray | None:
        """Per node, the PreferNoSchedule taints ``tolerations`` leave untolerated; None when there
        are none anywhere."""
        if not self.soft_tainted:
            return None
        if tolerations not in self._avoided:
            per_set = np.array([len(untolerated(tolerations, ts)) for ts in self.soft_taint_sets], dtype=np.int64)
            self._avoided[tolerations] = _frozen(per_set[self.soft_taint_id]) if per_set.any() else None
        return self._avoided[tolerations]

    def selector_mask(self, selector: NodeSelector) -> BoolArray:
        """Nodes that ``selector`` allows (every node for the empty selector)."""
        mask = self._selector_masks.get(selector)
        if mask is None:
            mask = _frozen(np.array([selects(selector, x) for x in self.nodes], dtype=np.bool_))
            if len(self._selector_masks) >= _SELECTOR_CACHE:  # pods pinned one node each: keep it bounded
                self._selector_masks.clear()
            self._selector_masks[selector] = mask
        return mask

    def preference_scores(self, preference: Preference) -> IntArray:
        """Per node, the weight of the preferred node affinity terms it meets (0 for ``()``)."""
        scores = self._preference_scores.get(preference)
        if scores is None:
            scores = _frozen(np.array([preference_score(preference, x) for x in self.nodes], dtype=np.int64))
            if len(self._preference_scores) >= _SELECTOR_CACHE:
                self._preference_scores.clear()
            self._preference_scores[preference] = scores
        return scores

    def keys_mask(self, keys: Iterable[str]) -> BoolArray:
        """Nodes with every label of ``keys``."""
        ok = np.ones(len(self.nodes), dtype=np.bool_)
        for key in keys:
            ok &= self.domains(key)[0] >= 0
        return ok

    def domains(self, key: str) -> tuple[IntArray, dict[str, int]]:
        """Per node, the id of its value of label ``key`` (-1 without the label), and the ids by value."""
        got = self._domains.get(key)
        if got is None:
            values = [x.labels.get(key) for x in self.nodes]
            ids = {v: i for i, v in enumerate(sorted({v for v in values if v is not None}))}
            column = _frozen(np.array([-1 if v is None else ids[v] for v in values], dtype=np.int64))
            got = self._domains[key] = (column, ids)
        return got

    def empty_state(self) -> ClusterState:
        """A state with nothing placed."""
        n = len(self.nodes)
        return ClusterState(
            self,
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros((n, self.max_gpus), dtype=np.int64),
        )

    def mig_id(self, profile: str) -> int:
        """Column of ``profile`` in the MIG arrays, -1 when no node offers it."""
        return self.mig_index.get(profile, -1)


_MAX_LOG = 4096
"""Steps one change log records before derived states start a new one (bounds its memory)."""


class _ChangeLog:
    """Rows touched by each step of a chain of states derived one from the other."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[npt.NDArray[np.intp]] = []


@dataclass(frozen=True, eq=False)
class ClusterState:
    """Resources in use on every node; GPU use is per GPU in thousandths."""

    cluster: Cluster
    cpu_used: IntArray
    mem_used: IntArray
    gpu_used: IntArray
    pod_kinds: IntArray | None = None
    """Pods per node by kind (N x max_gpus+1): column 0 fractional, column k k-GPU pods."""
    mig_used: IntArray | None = None
    """MIG instances in use per node and profile (N x len(cluster.mig_profiles))."""
    partitions: tuple[MigPartition, ...] = ()
    """Layouts chosen for re-partitionable GPUs; such a GPU counts as fully used for other pods."""
    storage_used: IntArray | None = None
    """Ephemeral storage requested per node, MiB (None: nothing requested)."""
    ports_used: Mapping[int, frozenset[str]] = field(default_factory=dict)
    """Host ports bound per node (only nodes that have any).  A set, not a count: should two pods
    hold one port on a node (another scheduler's doing), ``release`` of either frees it; the
    daemon's cache counts them and builds each snapshot afresh."""
    residents: Mapping[int, tuple[Pod, ...]] = field(default_factory=dict)
    """Pods per node that pod anti-affinity may concern (``Pod.has_affinity_identity``)."""
    term_holders: tuple[tuple[int, Pod], ...] | None = None
    """The residents with anti-affinity terms of their own, with their nodes (None: found from
    ``residents``; ``apply`` and ``release`` carry them over instead of searching again)."""
    pods_used: IntArray | None = None
    """Pods per node, whatever they ask for (None: none counted; only nodes with a pod limit
    read it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_log", _ChangeLog())
        object.__setattr__(self, "_version", 0)
        object.__setattr__(self, "_own", frozenset())  # arrays made for this state alone (``apply``)
        object.__setattr__(self, "_selected", {})
        object.__setattr__(self, "_selected_counts", {})
        object.__setattr__(self, "_forbidding", {})
        object.__setattr__(self, "_wished", {})
        object.__setattr__(self, "_wish_sig", {})
        object.__setattr__(self, "_spread", {})
        object.__setattr__(self, "_affinity", {})
        if self.pod_kinds is None:
            kinds = np.zeros((len(self.cluster), self.cluster.max_gpus + 1), dtype=np.int64)
            object.__setattr__(self, "pod_kinds", kinds)
        if self.mig_used is None:
            object.__setattr__(
                self, "mig_used", np.zeros((len(self.cluster), len(self.cluster.mig_profiles)), dtype=np.int64)
            )
        for a in (self.cpu_used, self.mem_used, self.gpu_used, self.pod_kinds, self.mig_used):
            assert a is not None
            a.setflags(write=False)
        if self.storage_used is not None:
            self.storage_used.setflags(write=False)
        if self.pods_used is not None:
            self.pods_used.setflags(write=False)
        if self.term_holders is None:
            holders = tuple((n, p) for n, pods in self.residents.items() for p in pods if p.anti_affinity)
            object.__setattr__(self, "term_holders", holders)

    @cached_property
    def wish_terms(self) -> dict[PodAffinityTerm, dict[str, int]]:
        """The preferred pod (anti-)affinity terms of the pods placed, each distinct term once with
        its summed weight (anti-affinity positive, affinity negative) per value of its topology key
        where its holders run: kube-scheduler scores a new pod those terms select by them too."""
        index: dict[PodAffinityTerm, dict[str, int]] = {}
        nodes = self.cluster.nodes
        for n, pods in self.residents.items():
            for p in pods:
                _index_wishes(index, nodes[n].labels, p)
        return index

    @cached_property
    def _wish_lookup(self) -> tuple[dict[tuple[str, str], list[PodAffinityTerm]], list[PodAffinityTerm]]:
        """``wish_terms`` that weigh something on a node of the cluster, by a (key, value) a pod
        must have for the term to select it (the value of its first one-value ``In``
        requirement), and those without such a requirement."""
        by_label: dict[tuple[str, str], list[PodAffinityTerm]] = defaultdict(list)
        rest: list[PodAffinityTerm] = []
        for term, per_value in self.wish_terms.items():
            if not _weighs(self, term, per_value):
                continue  # cancelled out, or only where no node of the cluster is
            need = next((r for r in term.selector if r.operator == "In" and len(r.values) == 1), None)
            if need is None:
                rest.append(term)
            else:
                by_label[need.key, need.values[0]].append(term)
        return by_label, rest

    def wish_signature(self, pod: Pod) -> tuple[PodAffinityTerm, ...]:
        """The placed pods' preferred terms (``wish_terms``) that select ``pod`` and weigh
        something here: pods with the same signature are told apart by none of them."""
        if not self.wish_terms:
            return ()
        cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[PodAffinityTerm, ...]] = self.__dict__["_wish_sig"]
        key = (pod.namespace, pod.labels)
        if key not in cache:
            by_label, rest = self._wish_lookup
            labels = dict(pod.labels)
            maybe = [t for kv in pod.labels for t in by_label.get(kv, ())] + rest
            found = {t for t in maybe if t.selects(pod.namespace, labels)}
            cache[key] = tuple(t for t in self.wish_terms if t in found) if found else ()
        return cache[key]

    def wished(self, pod: Pod) -> IntArray | None:
        """Per node, the weight of the placed pods' preferred terms that select ``pod``, in their
        domains: anti-affinity positive, affinity negative (None: none selects it)."""
        signature = self.wish_signature(pod)
        if not signature:
            return None
        cache: dict[tuple[PodAffinityTerm, ...], IntArray | None] = self.__dict__["_wished"]
        if signature not in cache:
            out: IntArray | None = None
            for term in signature:
                column, ids = self.cluster.domains(term.topology_key)
                for value, weight in self.wish_terms[term].items():
                    if weight and value in ids:
                        out = np.zeros(len(self.cluster), dtype=np.int64) if out is None else out
                        out += weight * (column == ids[value])
            cache[signature] = None if out is None else _frozen(out)
        return cache[signature]

    def wish_penalty(self, pod: Pod) -> IntArray | None:
        """``apart_penalty`` of the pod's own terms plus ``wished``: everything preferred pod
        (anti-)affinity holds against ``pod`` per node (None: nothing)."""
        own, theirs = self.apart_penalty(pod), self.wished(pod)
        if own is None or theirs is None:
            return own if theirs is None else theirs
        return own + theirs

    @property
    def holders(self) -> tuple[tuple[int, Pod], ...]:
        """The residents with anti-affinity terms of their own, with their nodes."""
        assert self.term_holders is not None
        return self.term_holders

    @property
    def kinds(self) -> IntArray:
        """``pod_kinds``, never None."""
        assert self.pod_kinds is not None
        return self.pod_kinds

    @property
    def mig(self) -> IntArray:
        """``mig_used``, never None."""
        assert self.mig_used is not None
        return self.mig_used

    @cached_property
    def mig_free(self) -> IntArray:
        """Free MIG instances per node and profile: advertised plus re-partitioned, less in use."""
        cap = self.cluster.mig_cap.copy()
        for n, _, layout in self.partitions:
            cap[n] += self.cluster.layout_counts(layout)
        return _frozen(cap - self.mig)

    @cached_property
    def island_idle(self) -> IntArray:
        """Completely idle GPUs per node and island (N x island_count)."""
        idle = self.gpu_free >= GPU_MILLI
        isl = self.cluster.islands
        cols = [((isl == i) & idle).sum(axis=1) for i in range(self.cluster.island_count)]
        return _frozen(np.column_stack(cols).astype(np.int64) if cols else np.zeros((len(isl), 0), np.int64))

    @cached_property
    def cpu_free(self) -> IntArray:
        """Unrequested CPU per node, millicores (0 where over-committed)."""
        return _frozen(_headroom(self.cluster.cpu_cap, self.cpu_used))

    @cached_property
    def mem_free(self) -> IntArray:
        """Unrequested memory per node, MiB (0 where over-committed)."""
        return _frozen(_headroom(self.cluster.mem_cap, self.mem_used))

    @cached_property
    def storage_free(self) -> IntArray:
        """Unrequested ephemeral storage per node, MiB (0 where over-committed)."""
        if self.storage_used is None:
            return self.cluster.storage_cap
        return _frozen(_headroom(self.cluster.storage_cap, self.storage_used))

    @cached_property
    def pods_free(self) -> IntArray:
        """Pods each node still takes (``UNMETERED`` and more where it sets no limit)."""
        if self.pods_used is None:
            return self.cluster.pods_cap
        return _frozen(self.cluster.pods_cap - self.pods_used)

    @cached_property
    def gpu_free(self) -> IntArray:
        """Free share per GPU (N x max_gpus); absent GPUs are 0."""
        return _frozen(self.cluster.gpu_cap - self.gpu_used)

    @cached_property
    def full_free_gpus(self) -> IntArray:
        """Number of completely idle GPUs per node."""
        return _frozen((self.gpu_free >= GPU_MILLI).sum(axis=1).astype(np.int64))

    @cached_property
    def partitionable_gpus(self) -> IntArray:
        """Idle GPUs per node that a plan may re-partition into MIG instances now: those of the
        nodes with a MIG geometry.  With ``repartition="idle-nodes"``, only on a node that
        advertises no MIG instance and none of whose GPUs is used but by this state's own
        partitions (so a plan may partition several GPUs of one idle node)."""
        cl = self.cluster
        able = np.array([g is not None for g in cl.geometry], dtype=np.bool_)
        free = self.full_free_gpus
        if cl.repartition == "idle-nodes" and able.any():
            used = self.gpu_used > 0
            if self.partitions:
                used = used.copy()
                for n, g, _ in self.partitions:
                    used[n, g] = False
            able &= ~used.any(axis=1)
            if cl.mig_cap.size:
                able &= ~cl.mig_cap.any(axis=1)
        return _frozen(np.where(able, free, 0).astype(np.int64))

    @cached_property
    def max_gpu_free(self) -> IntArray:
        """Largest free share on any one GPU of each node."""
        return _frozen(self.gpu_free.max(axis=1))

    def ports_free(self, ports: frozenset[str]) -> BoolArray:
        """Nodes where no binding of ``ports`` clashes with one already there (``model.ports``)."""
        ok = np.ones(len(self.cluster), dtype=np.bool_)
        for n, used in self.ports_used.items():
            if ports_clash(used, ports):
                ok[n] = False
        return ok

    def selected_domains(self, term: PodAffinityTerm) -> frozenset[str]:
        """Values of the term's topology key on nodes where a pod it selects runs.  Found once per
        term, then carried over by ``apply`` (a pod added can only add its node's value)."""
        cache: dict[PodAffinityTerm, frozenset[str]] = self.__dict__["_selected"]
        got = cache.get(term)
        if got is None:
            nodes, key = self.cluster.nodes, term.topology_key
            got = cache[term] = frozenset(
                value
                for n, pods in self.residents.items()
                if (value := nodes[n].labels.get(key)) is not None and any(p.selected_by(term) for p in pods)
            )
        return got

    def selected_counts(self, term: PodAffinityTerm) -> IntArray:
        """Per domain id of the term's topology key (``Cluster.domains``), the pods the term selects
        there.  Found once per term, then carried over by ``apply``."""
        cache: dict[PodAffinityTerm, IntArray] = self.__dict__["_selected_counts"]
        got = cache.get(term)
        if got is None:
            column, ids = self.cluster.domains(term.topology_key)
            counts = np.zeros(len(ids), dtype=np.int64)
            for n, pods in self.residents.items():
                if column[n] >= 0:
                    counts[column[n]] += sum(1 for p in pods if p.selected_by(term))
            got = cache[term] = _frozen(counts)
        return got

    def _forbidding_domains(self, namespace: str, labels: tuple[tuple[str, str], ...]) -> frozenset[tuple[str, str]]:
        """(Key, value) of the domains whose pods' own terms keep a pod of ``namespace`` and
        ``labels`` out.  Found once per such pod, then carried over by ``apply``."""
        cache: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[tuple[str, str]]] = self.__dict__["_forbidding"]
        got = cache.get((namespace, labels))
        if got is None:
            nodes = self.cluster.nodes
            holders = [(nodes[n].labels, p) for n, p in self.holders]
            got = cache[namespace, labels] = frozenset(_forbidden_by(holders, namespace, labels))
        return got

    def anti_conflicts(self, pod: Pod) -> list[tuple[str, str, bool]]:
        """Topology domains ``pod`` may not join, as (label key, value, whether it is an existing
        pod's term that forbids it rather than the pod's own)."""
        found: dict[tuple[str, str, bool], None] = {}
        for term in pod.anti_affinity:
            found.update(dict.fromkeys((term.topology_key, v, False) for v in sorted(self.selected_domains(term))))
        if self.holders:
            found.update(
                dict.fromkeys((k, v, True) for k, v in sorted(self._forbidding_domains(pod.namespace, pod.labels)))
            )
        return list(found)

    def apart_penalty(self, pod: Pod, wishes: Sequence[tuple[int, PodAffinityTerm]] | None = None) -> IntArray | None:
        """Per node, the pod's preferred pod (anti-)affinity weight against it there: each
        anti-affinity term's weight once per pod it selects in that node's domain, less each
        affinity term's weight likewise, as kube-scheduler scores them (None: it has no such
        terms).  ``wishes`` (signed weight, term) picks the terms; default all of the pod's."""
        wishes = pod.pod_wishes if wishes is None else wishes
        if not wishes:
            return None
        out = np.zeros(len(self.cluster), dtype=np.int64)
        for weight, term in wishes:
            column, _ = self.cluster.domains(term.topology_key)
            counts = self.selected_counts(term)
            if counts.any():
                out += weight * np.where(column >= 0, counts[np.maximum(column, 0)], 0)
        return out

    def anti_mask(self, pod: Pod, existing: bool | None = None) -> BoolArray | None:
        """Nodes that ``pod``'s required anti-affinity, and that of the pods already placed, let it
        join; None when none of it applies.  ``existing`` picks the existing pods' terms (True)
        or the pod's own (False) only."""
        if not pod.anti_affinity and not self.holders:
            return None
        values: dict[str, list[str]] = {}
        for key, value, theirs in self.anti_conflicts(pod):
            if existing is None or theirs == existing:
                values.setdefault(key, []).append(value)
        if not values:
            return None
        ok = np.ones(len(self.cluster), dtype=np.bool_)
        for key, out in values.items():
            column, ids = self.cluster.domains(key)
            ok &= ~np.isin(column, [ids[v] for v in out if v in ids])
        return ok

    def _spread_node_counts(self, spread: Spread) -> IntArray:
        """Per node, the pods ``spread`` counts there (terminating ones are not, as kube-scheduler
        leaves them out).  Found once per constraint, then carried over by ``apply``."""
        cache: dict[Spread, IntArray] = self.__dict__["_spread"]
        got = cache.get(spread)
        if got is None:
            counts = np.zeros(len(self.cluster), dtype=np.int64)
            if spread.selector is not None:
                for n, pods in self.residents.items():
                    counts[n] = _spread_count(spread, pods)
            got = cache[spread] = _frozen(counts)
        return got

    def spread_keys_mask(self, pod: Pod) -> BoolArray:
        """Nodes with every topology key of the pod's spread constraints."""
        return self.cluster.keys_mask(c.topology_key for c in pod.spread)

    def spread_view(self, pod: Pod, spread: Spread) -> SpreadView:
        """What ``spread`` sees for ``pod``, as kube-scheduler's PodTopologySpread counts it: the
        nodes that count (every topology key of the pod's constraints, the pod's node selector
        unless ``honor_affinity`` is off, tolerated taints when ``honor_taints``, so cordoned nodes
        unless it honours taints), the pods counted per domain over them, and the emptiest domain's count."""
        cl = self.cluster
        key = spread.topology_key
        column, ids = cl.domains(key)
        eligible = self.spread_keys_mask(pod)
        if spread.honor_affinity and pod.node_selector:
            eligible &= cl.selector_mask(pod.node_selector)
        if spread.honor_taints and cl.tainted:
            eligible &= cl.toleration_mask(pod.tolerations)
        nodes = np.flatnonzero(eligible)
        counts = np.bincount(column[nodes], weights=self._spread_node_counts(spread)[nodes], minlength=len(ids))
        counts = counts.astype(np.int64)
        present = np.zeros(len(ids), dtype=np.bool_)
        present[column[nodes]] = True
        domains = int(present.sum())
        low = 0
        if domains >= spread.min_domains:
            low = int(counts[present].min())
        return SpreadView(eligible, counts, present, domains, low)

    def spread_mask(self, pod: Pod, counted: bool = False) -> BoolArray | None:
        """Nodes where ``pod`` keeps every spread constraint it has (None: it has none): the
        node has all their topology keys, and its domain would hold at most ``max_skew`` more
        counted pods than the emptiest eligible one.  ``counted``: the pod is in the state already
        (a plan being checked), so it does not add itself."""
        if not pod.spread:
            return None
        ok = self.spread_keys_mask(pod)
        for c in pod.spread:
            column, _ = self.cluster.domains(c.topology_key)
            view = self.spread_view(pod, c)
            if not view.counts.size:  # no node has the key (and ``ok`` is all False already)
                continue
            own = 0 if counted else int(pod.selected_by(c))
            fine = view.counts + own - view.low <= c.max_skew
            ok &= (column >= 0) & fine[np.maximum(column, 0)]
        return ok

    def affinity_pairs(self, terms: tuple[PodAffinityTerm, ...]) -> frozenset[tuple[str, str]]:
        """(Key, value) of the domains, for each term's key, of the pods that all of ``terms``
        select, as kube-scheduler's InterPodAffinity counts them.  Found once per set of terms,
        then carried over by ``apply``."""
        cache: dict[tuple[PodAffinityTerm, ...], frozenset[tuple[str, str]]] = self.__dict__["_affinity"]
        got = cache.get(terms)
        if got is None:
            nodes = self.cluster.nodes
            placed = [(nodes[n], pods) for n, pods in self.residents.items()]
            got = cache[terms] = frozenset(pair for node, pods in placed for pair in _pairs(node, pods, terms))
        return got

    def affinity_first(self, pod: Pod) -> bool:
        """No pod that all its required affinity terms select runs anywhere, and they all select
        it: the first of a series, which kube-scheduler lets go to any node with every term's key."""
        return pod.matches_all(pod.affinity) and not self.affinity_pairs(pod.affinity)

    def affinity_mask(self, pod: Pod) -> BoolArray | None:
        """Nodes in a domain of every affinity term's key where a pod one of the pod's terms on that
        key selects runs (kube-scheduler pools the terms of a key), or, for the first of a series
        (``affinity_first``), any node with every key; None when the pod has no such terms."""
        if not pod.affinity:
            return None
        if self.affinity_first(pod):
            return self.affinity_keys_mask(pod)
        cl = self.cluster
        ok = np.ones(len(cl), dtype=np.bool_)
        pooled: dict[str, set[str]] = {t.topology_key: set() for t in pod.affinity}
        for key, value in self.affinity_pairs(pod.affinity):
            pooled[key].add(value)
        for key, values in pooled.items():
            column, ids = cl.domains(key)
            ok &= np.isin(column, [ids[v] for v in values if v in ids])
        return ok

    def affinity_keys_mask(self, pod: Pod) -> BoolArray:
        """Nodes with the topology key of every pod affinity term of ``pod``."""
        return self.cluster.keys_mask(t.topology_key for t in pod.affinity)

    def peer_mask(self, pod: Pod, follow_batch: bool = False) -> BoolArray | None:
        """Nodes that the pods already placed let ``pod`` join (None: every node): its pod
        affinity, its anti-affinity and theirs, and its topology spread constraints.
        ``follow_batch``: pods placed with it may give it the domains its affinity needs, so any
        node with the keys will do here (the batch model decides)."""
        affinity = self.affinity_keys_mask(pod) if follow_batch and pod.affinity else self.affinity_mask(pod)
        masks = [m for m in (affinity, self.anti_mask(pod), self.spread_mask(pod)) if m is not None]
        if not masks:
            return None
        ok = masks[0]
        for m in masks[1:]:
            ok = ok & m
        return ok

    def pod_mask(self, pod: Pod) -> BoolArray:
        """Nodes that can host ``pod`` now: ``fit_mask`` of its shape and ``peer_mask``."""
        ok = self.fit_mask(pod.shape)
        peers = self.peer_mask(pod)
        return ok if peers is None else ok & peers

    def _room_mask(self, shape: PodShape) -> BoolArray:
        """Nodes with room for ``shape`` apart from its GPUs: CPU, memory, storage, host ports,
        taints it tolerates and labels its selector allows."""
        ok = (self.cpu_free >= shape.cpu_milli) & (self.mem_free >= shape.memory_mib)
        if shape.storage_mib:
            ok &= self.storage_free >= shape.storage_mib
        if self.cluster.pods_metered:
            ok &= self.pods_free >= 1
        if shape.host_ports:
            ok &= self.ports_free(shape.host_ports)
        if self.cluster.tainted:
            ok &= self.cluster.toleration_mask(shape.tolerations)
        if shape.node_selector:
            ok &= self.cluster.selector_mask(shape.node_selector)
        if shape.volume_selector:
            ok &= self.cluster.selector_mask(shape.volume_selector)
        if shape.provision_selector:
            ok &= self.cluster.selector_mask(shape.provision_selector)
        if shape.attach_selector:
            ok &= self.cluster.selector_mask(shape.attach_selector)
        return ok

    def host_mask(self, shape: PodShape) -> BoolArray:
        """Nodes that could host ``shape`` if their GPUs had room: all it asks for but GPUs,
        and a GPU model it accepts."""
        ok = self._room_mask(shape)
        return ok & self.cluster.model_mask(shape.gpu_models) if shape.num_gpu else ok

    def fit_mask(self, shape: PodShape) -> BoolArray:
        """Nodes that can host one pod of ``shape`` now."""
        if shape.mig_profile:
            return self._mig_mask(shape)
        ok = self._room_mask(shape)
        if shape.num_gpu == 0:
            return ok
        ok &= self.cluster.model_mask(shape.gpu_models)
        if shape.is_fractional:
            return ok & (self.max_gpu_free >= shape.gpu_milli)
        if shape.island == "required":
            best: IntArray = self.island_idle.max(axis=1, initial=0)
            return ok & (best >= shape.num_gpu)
        return ok & (self.full_free_gpus >= shape.num_gpu)

    def mig_available(self, profile: str) -> BoolArray:
        """Nodes with a free instance of ``profile``, or an idle GPU they may partition for one."""
        col = self.cluster.mig_id(profile)
        if col < 0:
            return np.zeros(len(self.cluster), dtype=np.bool_)
        out: BoolArray = (self.mig_free[:, col] > 0) | (self.cluster.mig_can[:, col] & (self.partitionable_gpus > 0))
        return out

    def _mig_mask(self, shape: PodShape) -> BoolArray:
        ok = self._room_mask(shape)
        if shape.gpu_models:
            ok &= self.cluster.product_mask(shape.gpu_models)
        return ok & self.mig_available(shape.mig_profile)

    def apply(self, assignments: Iterable[Assignment], *, consume: bool = False) -> ClusterState:
        """A new state with ``assignments`` added (no checks: validate plans first).

        ``consume``: this state is never read again, and its caller made it (by ``apply`` or
        ``partition`` on another state) and shared it with no one.  The arrays this state made for
        itself are then updated in place and handed on instead of copied, and this state is spent:
        its arrays are gone and reading it fails.  A greedy pass that places a thousand pods one by
        one on 10,000 nodes copies about 3 GB less.  Anything that keeps this state's
        arrays to compare with later must ask ``changed_since`` first: the arrays are the same
        objects in the new state, with new values.
        """
        return self._add(assignments, 1, consume=consume)

    def release(self, assignments: Iterable[Assignment], *, consume: bool = False) -> ClusterState:
        """A new state with ``assignments`` removed (``consume`` as for ``apply``)."""
        return self._add(assignments, -1, consume=consume)

    def partition(self, partitions: Iterable[MigPartition]) -> ClusterState:
        """A new state with MIG layouts applied to idle re-partitionable GPUs (no checks: validate first)."""
        return self._add((), 1, tuple(partitions))

    def _add(
        self,
        assignments: Iterable[Assignment],
        sign: int,
        partitions: tuple[MigPartition, ...] = (),
        consume: bool = False,
    ) -> ClusterState:
        log: _ChangeLog = self.__dict__["_log"]
        version: int = self.__dict__["_version"]
        # In place only where the new state extends this one's change log: a cache that kept these
        # arrays learns from the log which rows changed under it (``changed_since``).
        extends = version == len(log.rows) < _MAX_LOG
        mine: frozenset[str] = self.__dict__["_own"] if consume and extends else frozenset()

        def take(name: str, arr: IntArray) -> IntArray:
            if name in mine:
                arr.setflags(write=True)
                return arr
            return arr.copy()

        cpu = take("cpu_used", self.cpu_used)
        mem = take("mem_used", self.mem_used)
        gpu = take("gpu_used", self.gpu_used)
        kinds = take("pod_kinds", self.kinds)
        mig = self.mig
        storage = self.storage_used
        pods = self.pods_used
        if self.cluster.pods_metered:
            pods = np.zeros(len(self.cluster), dtype=np.int64) if pods is None else take("pods_used", pods)
        ports: dict[int, frozenset[str]] | None = None  # copied on the first pod with host ports
        residents: dict[int, tuple[Pod, ...]] | None = None  # copied on the first pod it concerns
        holders = self.holders
        rows: set[int] = set()
        for n, g, _ in partitions:
            rows.add(n)
            gpu[n, g] = GPU_MILLI
        added = list(assignments)
        for a in added:
            p = a.pod
            rows.add(a.node)
            cpu[a.node] += sign * p.cpu_milli
            mem[a.node] += sign * p.memory_mib
            if pods is not None:
                pods[a.node] += sign
            if p.host_ports:
                if ports is None:
                    ports = dict(self.ports_used)
                held = ports.get(a.node, frozenset())
                now = held | p.host_ports if sign > 0 else held - p.host_ports
                if now:
                    ports[a.node] = now
                else:
                    ports.pop(a.node, None)
            if p.has_affinity_identity:
                if residents is None:
                    residents = dict(self.residents)
                here = residents.get(a.node, ())
                if sign > 0:
                    here = (*here, p)
                else:
                    gone = next((i for i, q in enumerate(here) if q.key == p.key), None)
                    here = here if gone is None else here[:gone] + here[gone + 1 :]
                if here:
                    residents[a.node] = here
                else:
                    residents.pop(a.node, None)
                if p.anti_affinity:
                    if sign > 0:
                        holders = (*holders, (a.node, p))
                    else:
                        holders = tuple(h for h in holders if not (h[0] == a.node and h[1].key == p.key))
            if p.storage_mib:
                if storage is None or storage is self.storage_used:
                    if storage is None:
                        storage = np.zeros(len(self.cluster), dtype=np.int64)
                    else:
                        storage = take("storage_used", storage)
                storage[a.node] += sign * p.storage_mib
            for g in a.gpus:
                gpu[a.node, g] += sign * p.gpu_milli
            if p.num_gpu:
                kinds[a.node, 0 if p.is_fractional else min(p.num_gpu, self.cluster.max_gpus)] += sign
            for profile, count in p.mig_slices:  # all it holds: a pod another scheduler bound may hold several
                if (col := self.cluster.mig_id(profile)) < 0:  # a profile no node advertises: none to take
                    continue
                if mig is self.mig_used:
                    mig = take("mig_used", mig)
                mig[a.node, col] += sign * count
        new = ClusterState(
            self.cluster,
            cpu,
            mem,
            gpu,
            kinds,
            mig,
            self.partitions + partitions,
            storage,
            self.ports_used if ports is None else ports,
            self.residents if residents is None else residents,
            holders,
            pods,
        )
        selected: dict[PodAffinityTerm, frozenset[str]] = self.__dict__["_selected"]
        if sign > 0 and selected:  # a pod added can only add its node's domain; one removed: find again
            nodes, carried = self.cluster.nodes, new.__dict__["_selected"]
            for term, values in selected.items():
                more = {
                    v
                    for a in added
                    if a.pod.has_affinity_identity
                    and a.pod.selected_by(term)
                    and (v := nodes[a.node].labels.get(term.topology_key)) is not None
                }
                carried[term] = values | more
        per_term: dict[PodAffinityTerm, IntArray] = self.__dict__["_selected_counts"]
        if sign > 0 and per_term:  # a pod added adds one to its domain's count; one removed: count again
            carried_terms = new.__dict__["_selected_counts"]
            for term, counts in per_term.items():
                hits = [a.node for a in added if a.pod.has_affinity_identity and a.pod.selected_by(term)]
                if not hits:
                    carried_terms[term] = counts
                    continue
                column, _ = self.cluster.domains(term.topology_key)
                grown = counts.copy()
                for n in hits:
                    if column[n] >= 0:
                        grown[column[n]] += 1
                carried_terms[term] = _frozen(grown)
        forbidding: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[tuple[str, str]]] = self.__dict__[
            "_forbidding"
        ]
        if sign > 0 and "wish_terms" in self.__dict__:  # found once, then carried: greedy applies pod by pod
            wishing = [a for a in added if a.pod.has_affinity_identity and _wishes(a.pod)]
            changed = {t for a in wishing for _, t in a.pod.held_wishes}
            index = self.wish_terms
            if wishing:  # a new outer dict; the inner ones of the terms it changes are copied
                index = dict(index)
                for t in changed:
                    if t in index:
                        index[t] = dict(index[t])
                for a in wishing:
                    _index_wishes(index, self.cluster.nodes[a.node].labels, a.pod)
            new.__dict__["wish_terms"] = index
            if not wishing:  # nothing changed: the caches are shared
                new.__dict__["_wish_sig"] = self.__dict__["_wish_sig"]
                new.__dict__["_wished"] = self.__dict__["_wished"]
                if "_wish_lookup" in self.__dict__:
                    new.__dict__["_wish_lookup"] = self.__dict__["_wish_lookup"]
            elif index.keys() == self.wish_terms.keys() and all(
                _weighs(self, t, self.wish_terms.get(t, {})) == _weighs(self, t, index.get(t, {})) for t in changed
            ):  # the same terms weigh something: every pod's signature holds
                new.__dict__["_wish_sig"] = self.__dict__["_wish_sig"]
                new.__dict__["_wished"].update(
                    (sig, v) for sig, v in self.__dict__["_wished"].items() if changed.isdisjoint(sig)
                )
        if sign > 0 and forbidding:
            joined = [(self.cluster.nodes[a.node].labels, a.pod) for a in added if a.pod.anti_affinity]
            carried = new.__dict__["_forbidding"]
            for (namespace, labels), domains in forbidding.items():
                carried[namespace, labels] = domains | _forbidden_by(joined, namespace, labels)
        following: dict[tuple[PodAffinityTerm, ...], frozenset[tuple[str, str]]] = self.__dict__["_affinity"]
        if sign > 0 and following:
            carried_pairs = new.__dict__["_affinity"]
            for terms, pairs in following.items():
                joined_pairs = {
                    pair
                    for a in added
                    if a.pod.has_affinity_identity
                    for pair in _pairs(self.cluster.nodes[a.node], (a.pod,), terms)
                }
                carried_pairs[terms] = pairs | joined_pairs
        counted: dict[Spread, IntArray] = self.__dict__["_spread"]
        if sign > 0 and counted:
            carried_counts = new.__dict__["_spread"]
            for spread, before in counted.items():
                gained = [a.node for a in added if a.pod.has_affinity_identity and _spread_count(spread, (a.pod,))]
                after = before
                if gained:
                    after = before.copy()
                    np.add.at(after, gained, 1)
                    after.setflags(write=False)
                carried_counts[spread] = after
        touched = np.fromiter(rows, dtype=np.intp, count=len(rows))
        if extends:  # the newest state of its log: extend it
            log.rows.append(touched)
            object.__setattr__(new, "_log", log)
            object.__setattr__(new, "_version", version + 1)
        # The new state owns every array made for it here, and those it took over from this one.
        parent = {
            "cpu_used": self.cpu_used,
            "mem_used": self.mem_used,
            "gpu_used": self.gpu_used,
            "pod_kinds": self.pod_kinds,
            "mig_used": self.mig_used,
            "storage_used": self.storage_used,
            "pods_used": self.pods_used,
        }
        made: dict[str, IntArray | None] = {"cpu_used": cpu, "mem_used": mem, "gpu_used": gpu, "pod_kinds": kinds}
        made |= {"mig_used": mig, "storage_used": storage, "pods_used": pods}
        own = frozenset(k for k, arr in made.items() if arr is not None and (arr is not parent[k] or k in mine))
        object.__setattr__(new, "_own", own)
        # Derived arrays already computed here are patched on the touched rows
        # instead of being recomputed over the whole cluster (in place when consuming: a
        # state's derived arrays are always its own).
        done = self.__dict__
        if touched.size * 8 < len(self.cluster):
            for name in ("cpu_free", "mem_free", "gpu_free", "full_free_gpus", "max_gpu_free"):
                if name in done:
                    arr = done[name]
                    if mine:
                        arr.setflags(write=True)
                    else:
                        arr = arr.copy()
                    new.__dict__[name] = arr
            d = new.__dict__
            if "cpu_free" in d:
                d["cpu_free"][touched] = _headroom(self.cluster.cpu_cap[touched], cpu[touched])
            if "mem_free" in d:
                d["mem_free"][touched] = _headroom(self.cluster.mem_cap[touched], mem[touched])
            if "gpu_free" in d:
                g_free = self.cluster.gpu_cap[touched] - gpu[touched]
                d["gpu_free"][touched] = g_free
                if "full_free_gpus" in d:
                    d["full_free_gpus"][touched] = (g_free >= GPU_MILLI).sum(axis=1)
                if "max_gpu_free" in d:
                    d["max_gpu_free"][touched] = g_free.max(axis=1)
            else:
                d.pop("full_free_gpus", None)
                d.pop("max_gpu_free", None)
            for name in ("cpu_free", "mem_free", "gpu_free", "full_free_gpus", "max_gpu_free"):
                if name in d:
                    d[name].setflags(write=False)
        if mine:  # spent: its arrays live on in ``new``; reading it now fails rather than lies
            for k in list(self.__dict__):
                if k in _STATE_FIELDS:
                    self.__dict__[k] = None
                elif k not in ("_log", "_version"):
                    del self.__dict__[k]
            self.__dict__["_own"] = frozenset()
        return new

    @property
    def stamp(self) -> tuple[object, int]:
        """An opaque marker of this state for ``changed_since``; it keeps no state alive."""
        return self.__dict__["_log"], self.__dict__["_version"]

    def changed_since(self, stamp: tuple[object, int]) -> npt.NDArray[np.intp] | None:
        """Nodes whose usage may differ from the state that gave ``stamp``, if this one derives from it.

        ``None`` when it does not (compare the arrays instead).
        """
        log: _ChangeLog = self.__dict__["_log"]
        version: int = self.__dict__["_version"]
        if stamp[0] is not log or stamp[1] > version:
            return None
        return _union(log.rows[stamp[1] : version])

    @staticmethod
    def changed_after(stamp: tuple[object, int]) -> npt.NDArray[np.intp]:
        """Nodes changed by every state derived since ``stamp`` in its chain, to the newest.

        The arrays of the state that gave ``stamp`` may have been updated in place since
        (``apply(consume=True)``) only on these rows: elsewhere they still hold what it held.
        """
        log = stamp[0]
        assert isinstance(log, _ChangeLog)
        return _union(log.rows[stamp[1] :])

    @property
    def gpu_allocated_milli(self) -> int:
        """GPU share in use across the cluster."""
        return int(self.gpu_used.sum())

    def with_gpus_at(self, cells: Iterable[tuple[int, int]], milli: int) -> ClusterState:
        """A new state with the GPUs at ``cells`` (node, GPU index) counted ``milli`` in use,
        capped at each GPU's capacity; pods, CPU and memory as they are.  For what no pod
        holds: GPUs kept from a batch (busy, or kept free for pods of high priority) and given
        back."""
        gpu = self.gpu_used.copy()
        for i, g in cells:
            gpu[i, g] = min(milli, int(self.cluster.gpu_cap[i, g]))
        return replace(self, gpu_used=gpu)

    def with_instances_taken(self) -> ClusterState:
        """A new state with every free MIG instance counted in use (those of its partitions
        too); GPUs, pods, CPU and memory as they are.  For a search that may use only what its
        victims leave."""
        if self.mig_used is None or not self.cluster.mig_profiles:
            return self
        return replace(self, mig_used=self.mig_used + np.maximum(self.mig_free, 0))


_STATE_FIELDS = frozenset(f.name for f in fields(ClusterState))


def _union(parts: list[npt.NDArray[np.intp]]) -> npt.NDArray[np.intp]:
    """The rows of a stretch of a change log, each once, in order."""
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.intp)


@dataclass(frozen=True)
class SpreadView:
    """One spread constraint as one pod sees it (``ClusterState.spread_view``)."""

    eligible: BoolArray
    """The nodes whose pods count, and whose domains are compared."""
    counts: IntArray
    """Pods counted per domain (``Cluster.domains`` id of the key), over the eligible nodes."""
    present: BoolArray
    """Domains (ids) with an eligible node."""
    domains: int
    """Eligible domains."""
    low: int
    """The emptiest eligible domain's count (0 with fewer domains than ``min_domains``)."""


def _pairs(node: Node, pods: Iterable[Pod], terms: tuple[PodAffinityTerm, ...]) -> set[tuple[str, str]]:
    """The (key, value) pairs of ``node`` for ``terms``, if one of ``pods`` matches them all."""
    if not any(p.matches_all(terms) for p in pods):
        return set()
    return {(t.topology_key, v) for t in terms if (v := node.labels.get(t.topology_key)) is not None}


def _spread_count(spread: Spread, pods: Iterable[Pod]) -> int:
    return sum(1 for p in pods if not p.terminating and p.selected_by(spread))


def _wishes(pod: Pod) -> bool:
    """Whether ``pod`` has preferred pod (anti-)affinity terms that weigh pods placed after it."""
    return bool(pod.preferred_together) or any(t not in pod.soft_spread for _, t in pod.preferred_apart)


def _weighs(state: ClusterState, term: PodAffinityTerm, per_value: Mapping[str, int]) -> bool:
    """Whether a placed term (``wish_terms``) weighs something on a node of the cluster."""
    _, ids = state.cluster.domains(term.topology_key)
    return any(w and v in ids for v, w in per_value.items())


def _index_wishes(index: dict[PodAffinityTerm, dict[str, int]], labels: Mapping[str, str], pod: Pod) -> None:
    """Add ``pod``'s preferred terms, held on a node with ``labels``, to ``index`` (see ``wish_terms``)."""
    for weight, term in pod.held_wishes:
        value = labels.get(term.topology_key)
        if value is not None:
            per_value = index.setdefault(term, {})
            per_value[value] = per_value.get(value, 0) + weight


def _forbidden_by(
    holders: Iterable[tuple[Mapping[str, str], Pod]], namespace: str, labels: tuple[tuple[str, str], ...]
) -> set[tuple[str, str]]:
    """(Key, value) of the domains where one of ``holders`` (node labels, pod) runs whose own
    terms select a pod of ``namespace`` with ``labels``."""
    found: set[tuple[str, str]] = set()
    label_map = dict(labels)
    for node_labels, holder in holders:
        for term in holder.anti_affinity:
            value = node_labels.get(term.topology_key)
            if value is not None and term.selects(namespace, label_map):
                found.add((term.topology_key, value))
    return found


def mig_plan(cluster: Cluster, partitions: Iterable[MigPartition]) -> dict[str, Any]:
    """The MIG layouts of ``partitions`` as one mig-parted (NVIDIA MIG manager) v1 document: one
    named configuration per node (its ``nvidia.com/mig.config`` label value, ``mig_config_name``),
    listing the partitioned GPUs with their instances and the node's other GPUs with MIG off.

    mig-parted reads ``devices`` as the host's GPU indices, so a node is refused (``ValueError``)
    when its whole GPUs may not be all of its GPUs: it advertises MIG slices already, or GPU
    feature discovery counts more GPUs than it advertises (some in MIG mode or unhealthy); a
    plan with no partition is refused too (mig-parted refuses an empty document).
    """
    per_node: dict[int, dict[int, MigLayout]] = {}
    for n, g, layout in partitions:
        per_node.setdefault(n, {})[g] = layout
    if not per_node:
        raise ValueError("no GPU is partitioned: there is no MIG layout to write")
    configs: dict[str, Any] = {}
    for n in sorted(per_node):
        node = cluster.nodes[n]
        counted = node.labels.get(LABEL_GPU_COUNT, "")
        if node.mig_slices or label_number(counted) not in (None, node.gpu_count):
            raise ValueError(
                f"node {node.name}: its GPU indices are not known (it advertises {node.gpu_count} whole GPUs "
                f"{'and MIG slices' if node.mig_slices else f'of the {counted} that {LABEL_GPU_COUNT} counts'}); "
                "a layout for it could re-partition the wrong GPU"
            )
        gpus = {g: (dict(per_node[n][g].counts) if g in per_node[n] else None) for g in range(node.gpu_count)}
        configs.update(mig_config(mig_config_name(node.name), gpus)["mig-configs"])
    return {"version": "v1", "mig-configs": configs}


def live_mig_configs(cluster: Cluster, partitions: Iterable[MigPartition]) -> dict[str, tuple[str, list[Any]]]:
    """Per node name, the MIG manager configuration that gives it the layouts of ``partitions``:
    a name its content determines (``gpusched-`` and a hash, so a MIG manager that reads an older
    copy of the configurations finds no such name rather than another layout under it) and
    mig-parted's device groups (``mig_plan``; ``ValueError`` as there)."""
    parts = tuple(partitions)
    if not parts:
        return {}
    by_config = {mig_config_name(cluster.nodes[n].name): cluster.nodes[n].name for n, _, _ in parts}
    out: dict[str, tuple[str, list[Any]]] = {}
    for config, entries in mig_plan(cluster, parts)["mig-configs"].items():
        digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:12]
        out[by_config[config]] = (f"{MIG_CONFIG_PREFIX}{digest}", entries)
    return out


def mig_config_name(node: str) -> str:
    """The name of ``node``'s configuration: a valid label value (at most 63 characters), the node
    name itself when it is one, else its first characters and a hash of the whole."""
    if len(node) <= _LABEL_VALUE_MAX:
        return node
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    head = node[: _LABEL_VALUE_MAX - len(digest) - 1].rstrip("-._")
    return f"{head}-{digest}"
