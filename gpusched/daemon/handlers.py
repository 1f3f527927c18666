"""The watches' handlers: each turns a reflector's lists and events into changes of the
scheduler's books (cache, queue, claims, budgets, namespaces, MIG bookkeeping)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from gpusched.kube.convert import (
    ANNOTATION_GANG_MIN,
    ConvertError,
    budget_record,
    claim_record,
    csi_node_limits,
    namespace_labels,
    node_record,
    pod_group_record,
    storage_class_record,
    volume_record,
)
from gpusched.model import Pod
from gpusched.model.affinity import Requirement, label_selector_selects
from gpusched.solver.preempt import Budget
from gpusched.state.records import PodRecord
from gpusched.state.volumes import ClaimRecord, StorageClassRecord

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.daemon")


class NodeHandler:
    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _record(self, obj: dict[str, Any]) -> Any:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels")  # of any type here: ``node_record`` refuses a node whose labels are no labels
        self.s.mig.note_configs(str(meta.get("name", "")), labels if isinstance(labels, Mapping) else {})
        try:
            rec = node_record(obj)
        except ConvertError as exc:
            log.warning("node ignored", error=str(exc))
            return None
        old = self.s.cache.nodes.get(rec.name)
        if rec.warning and (old is None or old.warning != rec.warning):
            log.warning("node read with a fallback", node=rec.name, warning=rec.warning)
        if rec.mig_warning and self.s.config.mig.repartition and (old is None or old.mig_warning != rec.mig_warning):
            log.warning("node not re-partitioned", node=rec.name, warning=rec.mig_warning)
        return rec

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.mig.configs.clear()
        records = [r for r in map(self._record, objects) if r is not None]
        self.s.cache.replace_nodes(records)
        self.s.mig.relisted([r.node for r in records])
        self.s.queue.move_all()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            changed = self.s.cache.delete_node(name)
            self.s.mig.node_gone(name, deleted=True)
            self.s.gauges.node_gone(name)
        else:
            rec = self._record(obj)
            changed = self.s.cache.delete_node(name) if rec is None else self.s.cache.upsert_node(rec)
            if rec is None:
                self.s.mig.node_gone(name)
            else:
                self.s.mig.node_seen(rec.node)
        if changed:
            self.s.queue.move_all()


class BoundHandler:
    """Pods with a node (any scheduler's): what is in use."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.selecting_bound.clear()
        self.s.grouped_bound.clear()
        records = [self.s.read_pod(o, self.s.selecting_bound) for o in objects]
        for r, o in zip(records, objects, strict=True):
            self._group(r, o)
        unseen = self.s.cache.replace_pods(records)
        for key in unseen:  # bound by us, not in the list: it may predate the Binding, or the pod is gone
            if (pod := self.s.cache.held_pod(key)) is not None:
                self.s.spawn(self.s.read_back(pod), f"read-back:{key}")
        self.s.queue.move_all()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        rec = self.s.read_pod(obj, self.s.selecting_bound, kind == "DELETED")
        self._group(rec, obj, kind == "DELETED")
        arrived = kind != "DELETED" and rec.bound and not rec.terminal and not self.s.cache.holds(rec.key, rec.uid)
        gpuless = self._gpuless(rec.key)
        freed = self.s.cache.delete_pod(rec.key, rec.uid) if kind == "DELETED" else self.s.cache.observe_pod(rec)
        if rec.node_name:  # a node a pod ran on, however briefly, is not idle since then
            self.s.mig.idle_since.pop(rec.node_name, None)
        if freed and gpuless is not None:  # the pods it may let in (rooms that waited for it too)
            rooms = set(self.s.cache.waiting_on(gpuless))
            self.s.queue.move_all(lambda r: r.key in rooms or frees_for(r.pod, gpuless))
        elif freed:
            self.s.queue.move_all()
        elif arrived:  # one to follow, one that evens a spread, or a peer its gang waited for
            self.s.queue.move_all(lambda r: waits_for(r.pod, rec.pod))

    def _group(self, rec: PodRecord, obj: dict[str, Any], gone: bool = False) -> None:
        """Remember a running member whose gang's minimum is its PodGroup's (read again when the
        PodGroup changes: ``Scheduler.reread_groups``); forget it once it is gone or done."""
        if rec.pod_group and rec.bound and not rec.terminal and not gone:
            self.s.grouped_bound[rec.key] = (obj, rec.pod_group)
        else:
            self.s.grouped_bound.pop(rec.key, None)

    def _gpuless(self, key: str) -> Pod | None:
        """The pod the books hold under ``key``, if it holds no GPU (nor share, nor MIG slice), nor
        room held for it, on a node that has none: freed, it frees nothing a pod asking for a GPU
        could use there (``frees_for``).  Otherwise, None: what it frees (a GPU, or its node's
        CPU, memory and pod slots, which a GPU pod may have lacked there) may let any pod in."""
        cache = self.s.cache
        held = cache.held_pod(key)
        where = cache.placement(key)
        if held is None or where is None or held.num_gpu or held.mig_slices or cache.has_room(key):
            return None
        node = cache.nodes.get(where[0])
        if node is not None and (node.node.gpu_count or node.node.mig_slices):
            return None
        return held


def waits_for(waiting: Pod, arrived: Pod) -> bool:
    """Whether ``arrived`` may let ``waiting`` in: all its pod affinity terms select it, one of
    its spread constraints counts it, or it is a member of its gang (which may have its minimum
    now: a member bound by the last leader, by another scheduler, or pinned to its node)."""
    if waiting.gang is not None and arrived.gang is not None and waiting.gang.name == arrived.gang.name:
        return True
    if waiting.affinity and arrived.matches_all(waiting.affinity):
        return True
    return any(arrived.selected_by(c) for c in waiting.spread)


def frees_for(waiting: Pod, left: Pod) -> bool:
    """Whether ``left`` leaving, a pod that held no GPU on a node that has none, may let
    ``waiting`` in: it asks for no GPU (the CPU, memory, pod slot or host ports freed may be
    what it lacked); or it asks for one, and what ``left`` frees is not on a node it could use but
    in a topology domain: ``left`` was kept apart from it by required anti-affinity (its own terms
    or ``left``'s), counted in one of its spread constraints, selected by one of its pod affinity
    terms (with no pod left to follow, the first of a series may go anywhere), or a member of its
    gang (whose members' domain it may have set).  Or, wherever it was, ``left`` mounted a claim
    ``waiting`` mounts: a ``ReadWriteOncePod`` claim is free for it now."""
    if not waiting.num_gpu and not waiting.mig_profile:
        return True
    if waiting.namespace == left.namespace and not set(waiting.claims).isdisjoint(left.claims):
        return True
    if waiting.gang is not None and left.gang is not None and waiting.gang.name == left.gang.name:
        return True
    if any(left.selected_by(t) for t in (*waiting.anti_affinity, *waiting.affinity)):
        return True
    return any(left.selected_by(c) for c in waiting.spread) or any(waiting.selected_by(t) for t in left.anti_affinity)


def _mounts_claims(r: PodRecord) -> bool:
    return bool(r.claims)


def _named(obj: dict[str, Any]) -> tuple[str, str]:
    """The namespace and name of an object, however the rest of it reads."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name", ""))


class ClaimHandler:
    """PersistentVolumeClaims: a pod refused for a claim is retried when that claim changes.  A
    claim that cannot be read is left out of the books, with a warning: its pods wait as for a
    claim not found."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> ClaimRecord | None:
        try:
            return claim_record(obj)
        except ConvertError as exc:
            log.warning("claim ignored", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.claims.replace_claims([r for r in map(self._read, objects) if r is not None])
        self.s.queue.move_all(_mounts_claims)
        self.s.volume_binding.changed()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        namespace, name = _named(obj)
        rec = None if kind == "DELETED" else self._read(obj)
        if self.s.claims.delete_claim(f"{namespace}/{name}") if rec is None else self.s.claims.upsert_claim(rec):
            self.s.queue.move_all(lambda r: r.pod.namespace == namespace and name in r.claims)
            self.s.volume_binding.changed()


class VolumeHandler:
    """PersistentVolumes: a pod refused for its claims' volumes is retried when a volume changes."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.claims.replace_volumes([volume_record(o) for o in objects])
        self.s.queue.move_all(_mounts_claims)
        self.s.volume_binding.changed()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        rec = volume_record(obj)
        if self.s.claims.delete_volume(rec.name) if kind == "DELETED" else self.s.claims.upsert_volume(rec):
            self.s.queue.move_all(_mounts_claims)
            self.s.volume_binding.changed()


class StorageClassHandler:
    """StorageClasses: whether a claim not bound yet is provisioned for its pod's node, and where
    it may be; a pod refused for its claims is retried when a class changes.  A class that cannot
    be read is left out, with a warning: its claims wait as for a class not found."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> StorageClassRecord | None:
        try:
            return storage_class_record(obj)
        except ConvertError as exc:
            log.warning("storage class ignored", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.claims.replace_classes([r for r in map(self._read, objects) if r is not None])
        self.s.queue.move_all(_mounts_claims)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        _, name = _named(obj)
        rec = None if kind == "DELETED" else self._read(obj)
        if self.s.claims.delete_class(name) if rec is None else self.s.claims.upsert_class(rec):
            self.s.queue.move_all(_mounts_claims)


class CsiNodeHandler:
    """CSINodes: how many volumes each CSI driver may attach on each node; pods refused for a
    limit are retried when one grows.  One that cannot be read is left out, with a warning: its
    node is taken to have no limit."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> tuple[str, dict[str, int]] | None:
        try:
            return csi_node_limits(obj)
        except ConvertError as exc:
            log.warning("CSI node ignored", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        read = [r for r in map(self._read, objects) if r is not None]
        for node in set(self.s.claims.limits) - {n for n, _ in read}:
            self.s.claims.set_limits(node, None)
        for node, limits in read:
            self.s.claims.set_limits(node, limits)
        self.s.queue.move_all(_mounts_claims)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        _, name = _named(obj)
        rec = None if kind == "DELETED" else self._read(obj)
        if self.s.claims.set_limits(name, None if rec is None else rec[1]):
            self.s.queue.move_all(_mounts_claims)


class BudgetHandler:
    """PodDisruptionBudgets: preemption evicts the pods they protect last."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> tuple[str, Budget] | None:
        try:
            return budget_record(obj)
        except ConvertError as exc:
            log.warning("disruption budget protects no pod", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.budgets = dict(r for r in map(self._read, objects) if r is not None)
        self.s.evicted_uncounted.clear()  # every status as written now

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        read = None if kind == "DELETED" else self._read(obj)
        if read is None:
            self.s.budgets.pop(key, None)
        else:
            self.s.budgets[read[0]] = read[1]
            # Its status written after the deletions sent so far: it counts the victims it covers.
            counted = [k for k, v in self.s.evicted_uncounted.items() if read[1].covers(v)]
            for k in counted:
                del self.s.evicted_uncounted[k]


class PendingHandler:
    """Unbound pods that name this scheduler: what to place."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.selecting_pending.clear()
        self.s.grouped_pending.clear()
        records = [self.s.read_pod(o, self.s.selecting_pending) for o in objects]
        live = {r.key for r in records}
        for r, o in zip(records, objects, strict=True):
            self._take(r, o)
        for key in [k for k in self.s.queue.pending_keys() if k not in live]:
            self._drop(key, gone=True)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        rec = self.s.read_pod(obj, self.s.selecting_pending, kind == "DELETED")
        if kind == "DELETED":
            self._drop(rec.key, gone=True)
        else:
            self._take(rec, obj)

    def _take(self, rec: PodRecord, obj: dict[str, Any]) -> None:
        if rec.bound or rec.terminal or rec.deleting or rec.gated:  # gated: queued once the gates are gone
            self._drop(rec.key, gone=rec.deleting and not rec.bound)
        else:
            old = self.s.queue.record(rec.key)
            if old is not None and old.uid != rec.uid:  # deleted and created again, the deletion unseen (a relist)
                self._replaced(old, rec)
            self.s.queue.add(rec)
            self.s.volume_binding.pod_changed(rec.key)  # (a new pod of the name, maybe)
            self.s.rooms.follow_nomination(rec.pod, rec.nominated)
            if rec.pod_group:  # read again when its PodGroup changes
                self.s.grouped_pending[rec.key] = obj
            else:
                self.s.grouped_pending.pop(rec.key, None)

    def _replaced(self, old: PodRecord, new: PodRecord) -> None:
        """``old`` was deleted and ``new`` created under its name, as the watch's DELETED would
        have told: the room held for the old pod, and its word on it, are not the new pod's (but
        a gang member's, which a member created again under its name takes, as after the
        watch's ``keep_for_namesake``)."""
        same_gang = old.pod.gang is not None and new.pod.gang is not None and old.pod.gang.name == new.pod.gang.name
        if not same_gang:
            self.s.placed_here.discard(old.key)
            self.s.give_up_room(old.key)

    def _drop(self, key: str, gone: bool = False) -> None:
        """No longer pending.  ``gone``: deleted; a gang member's room may then be kept for a pod
        created again under its name (``Preemptor.keep_for_namesake``)."""
        self.s.placed_here.discard(key)
        kept = gone and self.s.rooms.keep_for_namesake(key)
        self.s.queue.delete(key)
        self.s.volume_binding.pod_changed(key)
        if not kept:
            self.s.give_up_room(key)
            if self.s.rooms.kept:  # the rest of its gang may hold room no longer
                self.s.rooms.expire_kept(members=False)
        if self.s.mig.book():  # it waited for a MIG layout: the room held for it is free
            self.s.queue.move_all()
        self.s.grouped_pending.pop(key, None)
        self.s.forget_ungrouped(key)


class PodGroupHandler:
    """Coscheduling PodGroups: a gang's minimum when its members carry no
    ``gpusched.io/gang-min-members``.  When one changes (created, its ``minMember`` changed,
    deleted), its pending members are read again, and woken if their minimum changed."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> tuple[str, int] | None:
        try:
            return pod_group_record(obj)
        except ConvertError as exc:
            log.warning("pod group ignored", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.s.set_pod_groups(dict(r for r in map(self._read, objects) if r is not None))

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        read = None if kind == "DELETED" else self._read(obj)
        self.s.set_pod_group(key, None if read is None else read[1])

    def unread(self, why: str) -> None:
        self.s.set_pod_groups(None, why)


def no_pod_group(gang: str, why: str = "") -> str:
    """What a member of ``gang`` is told when nothing gives the gang a minimum (``why``: why
    PodGroups are not read, if they are not)."""
    return (
        f"pod group {gang} has no PodGroup object{f' ({why})' if why else ''} and no {ANNOTATION_GANG_MIN} "
        "annotation: members are placed one by one"
    )


Labels = dict[str, str]
Selector = tuple[Requirement, ...]
Selecting = dict[str, tuple[dict[str, Any], tuple[Selector, ...]]]
"""Pods whose terms pick namespaces by label: their latest object and those selectors, by key."""


class NamespaceHandler:
    """Namespaces' labels, which pod (anti-)affinity terms' ``namespaceSelector`` picks from: when
    they change, the pods whose selectors now pick differently are read again."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def _read(self, obj: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
        try:
            return namespace_labels(obj)
        except ConvertError as exc:  # as if it were not there: no namespaceSelector picks it
            log.warning("namespace ignored", error=str(exc))
            return None

    def replace(self, objects: list[dict[str, Any]]) -> None:
        table = dict(r for r in map(self._read, objects) if r is not None)
        old = self.s.namespaces
        changes = [(old.get(n), table.get(n)) for n in old.keys() | table.keys() if old.get(n) != table.get(n)]
        self.s.namespaces = table
        if changes:
            self.s.reread_selecting(changes)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = _named(obj)[1]
        read = None if kind == "DELETED" else self._read(obj)
        before = self.s.namespaces.get(name)
        if read is None:
            self.s.namespaces.pop(name, None)
            after = None
        else:
            self.s.namespaces[name] = after = read[1]
        if before != after:
            self.s.reread_selecting([(before, after)])


def moved_selectors(selectors: Iterable[Selector], changes: list[tuple[Labels | None, Labels | None]]) -> set[Selector]:
    """Those of ``selectors`` that pick differently after ``changes``, each a namespace's labels
    before and after (None: no such namespace)."""

    def picks(sel: Selector, labels: Labels | None) -> bool:
        return labels is not None and label_selector_selects(sel, labels)

    return {sel for sel in set(selectors) if any(picks(sel, b) != picks(sel, a) for b, a in changes)}
