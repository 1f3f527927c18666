"""Persistent volume claims: whether a pod's claims let it be bound anywhere, and where.

gpusched binds a pod only when every claim it mounts is bound to a volume, or will be provisioned
for the node chosen, and only to a node every such volume may be used on: a volume's required node
affinity (a local volume's node, a zonal disk's zone), with its zone and region labels, is the
pod's ``volume_selector`` (``Claims.selector``), which placement honours as kube-scheduler's
VolumeBinding and VolumeZone filters do.

A claim still waiting for a volume whose storage class has ``volumeBindingMode:
WaitForFirstConsumer`` and a provisioner is provisioned for the pod, as kube-scheduler's volume
binding does it: the pod is placed within the class's ``allowedTopologies`` (or on the node the
claim's ``volume.kubernetes.io/selected-node`` annotation names already), the claim is annotated
with the chosen node, and the pod is bound once the provisioner's volume is bound to the claim
(the daemon's ``VolumeBinding``).  A claim of such a class may also be bound to an available volume
made beforehand (a local disk) that matches it: the pod is placed where each of its claims gets
one of its own, and the claim is written into the volume's ``claimRef`` (``Claims.by_size``).  A
claim of an ``Immediate`` class, or of no class, is waited for as kube-scheduler waits for it.

A claim with access mode ``ReadWriteOncePod`` is one pod's at a time, as kube-scheduler's
VolumeRestrictions plugin keeps it: a pod mounting it while another live pod uses it, on any
node, is refused with the claim and that pod named, and retried when that pod is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from gpusched.model import Node, Pod
from gpusched.model.affinity import NodeSelector, Requirement, both, label_selector_selects, selects

__all__ = [
    "NO_PROVISIONER",
    "RWOP_CONFLICT",
    "UNBOUND_IMMEDIATE",
    "ClaimRecord",
    "Claims",
    "StorageClassRecord",
    "VolumeRecord",
]

RWOP_CONFLICT = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod"
)
"""What kube-scheduler (1.34) says of a node for a pod whose ``ReadWriteOncePod`` claim another pod uses."""
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
"""What kube-scheduler (1.34) says of a pod with a claim not bound yet that it does not bind
(of an ``Immediate`` storage class, or of none): the volume controller binds it."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
IN_TREE_DRIVERS = {
    "kubernetes.io/aws-ebs": "ebs.csi.aws.com",
    "kubernetes.io/gce-pd": "pd.csi.storage.gke.io",
    "kubernetes.io/azure-disk": "disk.csi.azure.com",
    "kubernetes.io/cinder": "cinder.csi.openstack.org",
}
"""The CSI drivers in-tree provisioners (and the volumes they made) are migrated to, as
kube-scheduler's NodeVolumeLimits translates them."""
"""The provisioner of a storage class whose volumes are made by hand (local volumes)."""


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A PersistentVolumeClaim, as far as placement cares."""

    namespace: str
    name: str
    volume: str = ""
    """``spec.volumeName``: the volume it is bound to, empty while unbound."""
    bound: bool = False
    """The volume controller has completed its binding: it names its volume and carries the
    ``pv.kubernetes.io/bind-completed`` annotation, as kube-scheduler reads it (the phase is
    written after them), and it is not ``lost``."""
    lost: bool = False
    """``status.phase`` is ``Lost``: its volume is gone."""
    deleting: bool = False
    owner: str = ""
    """UID of its controlling owner (the pod, for a generic ephemeral volume's claim)."""
    one_pod: bool = False
    """``spec.accessModes`` holds ``ReadWriteOncePod``: only one pod at a time may use it."""
    storage_class: str = ""
    """Its storage class (the beta annotation, else ``spec.storageClassName``); "": none."""
    selected_node: str = ""
    """The node a volume is being provisioned for (``volume.kubernetes.io/selected-node``)."""
    uid: str = ""
    request: int = 0
    """``spec.resources.requests.storage``, in bytes."""
    modes: frozenset[str] = frozenset()
    """``spec.accessModes``."""
    block: bool = False
    """``spec.volumeMode`` is ``Block``."""
    selector: tuple[Requirement, ...] | None = None
    """``spec.selector``: the labels of the volumes it may be bound to (None: any)."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class VolumeRecord:
    """A PersistentVolume, as far as placement cares."""

    name: str
    affinity: NodeSelector = ()
    """The nodes that can use it (``spec.nodeAffinity.required``, and its zone and region
    labels as kube-scheduler's VolumeZone reads them); ``()``: every node."""
    error: str = ""
    """Why its node affinity cannot be read (no node can be chosen for it then)."""
    storage_class: str = ""
    capacity: int = 0
    """``spec.capacity.storage``, in bytes."""
    modes: frozenset[str] = frozenset()
    block: bool = False
    claim: str = ""
    """``spec.claimRef`` as ``namespace/name``: the claim it is bound, or being bound, to."""
    claim_uid: str = ""
    available: bool = False
    """``status.phase`` is ``Available`` and it is not being deleted: it may be bound to a claim."""
    deleting: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    version: str = ""
    """``metadata.resourceVersion``: a claim is written into it only as it was read."""
    driver: str = ""
    """``spec.csi.driver``: the CSI driver that attaches it ("" for a volume of no CSI driver)."""
    handle: str = ""
    """``spec.csi.volumeHandle``: one attachment per handle per node."""


@dataclass(frozen=True, slots=True)
class StorageClassRecord:
    """A StorageClass, as far as placement cares."""

    name: str
    provisioner: str = ""
    wait_for_consumer: bool = False
    """``volumeBindingMode: WaitForFirstConsumer``: a claim is bound (provisioned) only for a
    pod's node, which the scheduler chooses."""
    topology: NodeSelector = ()
    """``allowedTopologies``: the nodes it can provision a volume for (``()``: every node)."""
    error: str = ""
    """Why it can provision for no node (``allowedTopologies`` unreadable, or selecting none)."""

    @property
    def provisions(self) -> bool:
        """It makes volumes for the node a pod goes to."""
        return self.wait_for_consumer and self.provisioner not in ("", NO_PROVISIONER)


def _selected_names(selectors: Iterable[NodeSelector], nodes: list[Node]) -> set[str]:
    """The names of the ``nodes`` any of ``selectors`` allows, found through an index of the
    nodes' labels (a local volume's affinity names one host: a few look-ups, not a pass over
    every node per volume)."""
    index: dict[tuple[str, str], list[Node]] | None = None
    by_name = {n.name: n for n in nodes}
    out: set[str] = set()
    for selector in selectors:
        if not selector:
            return set(by_name)
        for term in selector:
            first = next((r for r in term if r.operator == "In"), None)
            if first is None:
                pool: Iterable[Node] = nodes
            elif first.field:
                pool = [n for v in first.values if (n := by_name.get(v)) is not None]
            else:
                if index is None:
                    index = {}
                    for n in nodes:
                        for kv in n.labels.items():
                            index.setdefault(kv, []).append(n)
                pool = [n for v in first.values for n in index.get((first.key, v), ())]
            out.update(n.name for n in pool if all(r.matches(n) for r in term))
    return out


class Claims:
    """The claims and volumes the watches report, and the verdict on a pod's claims."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimRecord] = {}
        self._volumes: dict[str, VolumeRecord] = {}
        self._classes: dict[str, StorageClassRecord] = {}
        self.selecting: dict[str, str] = {}
        """Claims (``namespace/name``) being provisioned, or bound to a volume made beforehand,
        for a pod in flight, with its node: a pod sharing one goes there too (kube-scheduler's
        assumed claim)."""
        self.changes = 0
        """Bumped by every change to the claims, volumes, classes or limits."""
        self.limits: dict[str, dict[str, int]] = {}
        """Per node, how many volumes each CSI driver may attach there (its CSINode's
        ``allocatable.count``; a driver not named has no limit)."""
        self.reserved: dict[str, str] = {}
        """Volumes (by name) being bound to a claim (``namespace/name``) for a pod in flight: no
        other claim is offered them meanwhile."""

    def replace_claims(self, records: list[ClaimRecord]) -> None:
        """The complete set of claims (after a list)."""
        self._claims = {r.key: r for r in records}
        self.changes += 1

    def upsert_claim(self, record: ClaimRecord) -> bool:
        """A claim added or changed; True when what placement sees of it changed."""
        old = self._claims.get(record.key)
        self._claims[record.key] = record
        self.changes += old != record
        return old != record

    def delete_claim(self, key: str) -> bool:
        """A claim is gone; True when it was known."""
        self.changes += 1
        return self._claims.pop(key, None) is not None

    def replace_volumes(self, records: list[VolumeRecord]) -> None:
        """The complete set of volumes (after a list)."""
        self._volumes = {r.name: r for r in records}
        self.changes += 1

    def upsert_volume(self, record: VolumeRecord) -> bool:
        """A volume added or changed; True when what placement sees of it changed."""
        old = self._volumes.get(record.name)
        self._volumes[record.name] = record
        self.changes += old != record
        return old != record

    def delete_volume(self, name: str) -> bool:
        """A volume is gone; True when it was known."""
        self.changes += 1
        return self._volumes.pop(name, None) is not None

    def replace_classes(self, records: list[StorageClassRecord]) -> None:
        """The complete set of storage classes (after a list)."""
        self._classes = {r.name: r for r in records}
        self.changes += 1

    def upsert_class(self, record: StorageClassRecord) -> bool:
        """A storage class added or changed; True when what placement sees of it changed."""
        old = self._classes.get(record.name)
        self._classes[record.name] = record
        self.changes += old != record
        return old != record

    def delete_class(self, name: str) -> bool:
        """A storage class is gone; True when it was known."""
        self.changes += 1
        return self._classes.pop(name, None) is not None

    def claim(self, key: str) -> ClaimRecord | None:
        """The claim ``namespace/name``, if known."""
        return self._claims.get(key)

    def volume(self, name: str) -> VolumeRecord | None:
        """The volume ``name``, if known."""
        return self._volumes.get(name)

    def _delayed(self, claim: ClaimRecord) -> StorageClassRecord | None:
        """The class of ``claim`` if it is bound only for its pod's node (not bound yet nor being
        bound to a volume, and its class waits for the first consumer): to a volume made
        beforehand that the node can use, or to one provisioned for the node."""
        if claim.volume or not claim.storage_class:
            return None
        cls = self._classes.get(claim.storage_class)
        return cls if cls is not None and cls.wait_for_consumer else None

    def candidates(self, claim: ClaimRecord) -> list[VolumeRecord]:
        """The volumes made beforehand that ``claim`` may be bound to, smallest first, as
        kube-scheduler's volume binding matches them: one bound to it already (pre-bound) alone;
        else those available, of its class, with its access modes and volume mode, its
        selector's labels and room for its request, that no claim in flight has reserved.  None
        for a claim annotated with a node: a volume is being provisioned for it."""
        if claim.selected_node:
            return []
        mine = [
            v
            for v in self._volumes.values()
            if v.claim == claim.key
            and (not v.claim_uid or not claim.uid or v.claim_uid == claim.uid)
            and v.storage_class == claim.storage_class
            and v.block == claim.block
            and not v.deleting
            and not v.error
            and v.capacity >= claim.request
        ]
        if mine:  # (one too small, or of another mode, is passed over, as kube-scheduler does)
            return mine[:1]
        out = [
            v
            for v in self._volumes.values()
            if v.available
            and not v.error
            and not v.claim
            and v.storage_class == claim.storage_class
            and claim.modes <= v.modes
            and v.block == claim.block
            and v.capacity >= claim.request
            and (claim.selector is None or label_selector_selects(claim.selector, dict(v.labels)))
            and self.reserved.get(v.name, claim.key) == claim.key
        ]
        return sorted(out, key=lambda v: (v.capacity, v.name))

    def provisions(self, claim: ClaimRecord) -> bool:
        """Whether ``claim``'s class may provision a volume for it, for the node chosen."""
        cls = self._delayed(claim)
        return cls is not None and cls.provisions and not cls.error

    def to_bind(self, namespace: str, claims: tuple[str, ...]) -> tuple[str, ...]:
        """Those of ``claims`` (in ``namespace``) to be bound for the pod's node before it is
        (by name): to a volume made beforehand, or to one provisioned for it."""
        return tuple(
            name
            for name in claims
            if (claim := self._claims.get(f"{namespace}/{name}")) is not None and self._delayed(claim) is not None
        )

    def set_limits(self, node: str, limits: Mapping[str, int] | None) -> bool:
        """A node's CSI attach limits (None: its CSINode is gone); True when they changed."""
        old = self.limits.get(node)
        new = dict(limits) if limits else None
        if old == new:
            return False
        if new is None:
            del self.limits[node]
        else:
            self.limits[node] = new
        self.changes += 1
        return True

    def attachments(self, namespace: str, claims: Iterable[str]) -> set[tuple[str, str]]:
        """The CSI attachments (driver, volume handle) ``claims`` make on the node of a pod
        that mounts them: a claim bound to a CSI volume makes its volume's; one a CSI
        provisioner will provision for the node makes a new one (its handle the claim's key)."""
        out: set[tuple[str, str]] = set()
        for name in claims:
            key = f"{namespace}/{name}"
            claim = self._claims.get(key)
            if claim is None:
                continue
            volume = self._volumes.get(claim.volume) if claim.volume else None
            if volume is not None and volume.driver:
                out.add((volume.driver, volume.handle or volume.name))
            elif (cls := self._delayed(claim)) is not None and cls.provisioner not in ("", NO_PROVISIONER):
                out.add((IN_TREE_DRIVERS.get(cls.provisioner, cls.provisioner), key))  # a volume not made yet
        return out

    def attached(self, pods: Iterable[tuple[str, Pod]]) -> dict[str, set[tuple[str, str]]]:
        """Per node, the CSI attachments of ``pods`` (each with its node's name)."""
        out: dict[str, set[tuple[str, str]]] = {}
        for node, pod in pods:
            if pod.claims:
                out.setdefault(node, set()).update(self.attachments(pod.namespace, pod.claims))
        return out

    def attach_selector(
        self, namespace: str, claims: tuple[str, ...], attached: Callable[[], Mapping[str, set[tuple[str, str]]]]
    ) -> NodeSelector:
        """The nodes where the CSI volumes of ``claims`` may be attached beside those already
        ``attached`` there (read only when needed: no limit, or no CSI volume, needs none), as
        one selector (``()``: every node)."""
        needs = self.attachments(namespace, claims) if self.limits else set()
        full = self.over_limit(needs, attached()) if needs else []
        return ((Requirement("metadata.name", "NotIn", tuple(full), field=True),),) if full else ()

    def over_limit(
        self,
        needs: set[tuple[str, str]],
        attached: Mapping[str, set[tuple[str, str]]],
        only: Collection[str] | None = None,
    ) -> list[str]:
        """The nodes (of ``only``, if given) where attaching ``needs`` beside what is ``attached``
        there (by node) would pass a CSI driver's limit (kube-scheduler's NodeVolumeLimits)."""
        by_driver: dict[str, set[str]] = {}
        for d, handle in needs:
            by_driver.setdefault(d, set()).add(handle)
        out = []
        empty: set[tuple[str, str]] = set()
        nodes = self.limits.items() if only is None else [(n, self.limits[n]) for n in only if n in self.limits]
        for node, limits in nodes:
            there = attached.get(node, empty)
            for driver, handles in by_driver.items():
                limit = limits.get(driver)
                if limit is None:
                    continue
                new = sum(1 for h in handles if (driver, h) not in there)
                # Only a driver the pod attaches a new volume of can be passed (one already over
                # its limit, with the pod's volumes attached there already, takes the pod).
                if new and sum(1 for d, _ in there if d == driver) + new > limit:
                    out.append(node)
                    break
        return sorted(out)

    def unchosen(self, namespace: str, claims: tuple[str, ...]) -> tuple[str, ...]:
        """Those of ``claims`` to be bound for a node not chosen yet (by name): two pods sharing
        one must not be placed apart in one solve."""
        return tuple(
            name
            for name in self.to_bind(namespace, claims)
            if not self._claims[f"{namespace}/{name}"].selected_node and f"{namespace}/{name}" not in self.selecting
        )

    def problem(
        self,
        pod: str,
        pod_uid: str,
        claims: tuple[str, ...],
        ephemeral: tuple[str, ...] = (),
        users: Mapping[str, tuple[str, str]] | None = None,
    ) -> str:
        """Why pod ``pod`` (``namespace/name``) mounting ``claims`` cannot be bound now; "" when it can.

        The claims named in ``ephemeral`` belong to its generic ephemeral volumes and must be
        the pod's own (a claim of that name left from another pod is not).  ``users`` names, by
        claim (``namespace/name``), a live pod that uses it (key and UID: an earlier pod of
        the same name, still terminating, is another pod): a ``ReadWriteOncePod`` claim that
        another pod uses is refused, once every claim is bound (as kube-scheduler, whose
        volume binding refuses first).
        """
        namespace = pod.split("/", 1)[0]
        for name in claims:
            claim = self._claims.get(f"{namespace}/{name}")
            if claim is None:
                return f'persistentvolumeclaim "{name}" not found'
            if name in ephemeral and claim.owner != pod_uid:
                return f'persistentvolumeclaim "{name}" was not created for pod {pod} (the pod is not its owner)'
            if claim.lost:
                return f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{claim.volume}"'
            if claim.deleting:
                return f'persistentvolumeclaim "{name}" is being deleted'
            if not claim.bound:
                if claim.volume:  # pre-bound, or the volume controller is binding it
                    return (
                        f'persistentvolumeclaim "{name}" is being bound to persistentvolume "{claim.volume}"; '
                        "the pod is retried once the binding completes"
                    )
                if (delayed := self._delayed(claim)) is not None:
                    if delayed.provisions and delayed.error and not self.candidates(claim):
                        return f'storage class "{delayed.name}" of claim "{name}": {delayed.error}'
                    if delayed.provisions or self.candidates(claim):
                        continue  # bound for the node chosen
                    if claim.selected_node:
                        return (
                            f'persistentvolumeclaim "{name}" is annotated for node {claim.selected_node}, and its '
                            f'storage class "{delayed.name}" has no provisioner to make a volume there'
                        )
                    return (
                        f'persistentvolumeclaim "{name}" waits for a volume made beforehand (storage class '
                        f'"{delayed.name}" has no provisioner), and no available persistent volume matches it '
                        "(its storage class, size, access modes, volume mode and selector); the pod is retried "
                        "when a volume changes"
                    )
                cls = self._classes.get(claim.storage_class) if claim.storage_class else None
                if claim.storage_class and cls is None:
                    return f'storageclass.storage.k8s.io "{claim.storage_class}" not found'
                return f'{UNBOUND_IMMEDIATE} ("{name}"); the pod is retried once the claim is bound'
            volume = self._volumes.get(claim.volume)
            if volume is None:
                return f'persistentvolume "{claim.volume}" of claim "{name}" not found'
            if volume.error:
                return f'persistentvolume "{claim.volume}" of claim "{name}": {volume.error}'
        for name in claims:
            key = f"{namespace}/{name}"
            holder, holder_uid = (users or {}).get(key, (pod, pod_uid))
            another = holder_uid != pod_uid if holder_uid and pod_uid else holder != pod
            if another and self._claims[key].one_pod:
                who = f"pod {holder}" if holder != pod else f"an earlier pod {holder} (UID {holder_uid})"
                return (
                    f'persistentvolumeclaim "{name}" has access mode ReadWriteOncePod and {who} uses it '
                    f"({RWOP_CONFLICT}); the pod is retried when that pod is gone"
                )
        return ""

    def selector(self, namespace: str, claims: tuple[str, ...]) -> NodeSelector:
        """The nodes every volume that ``claims`` (in ``namespace``) are bound to may be used on,
        as one selector (``()``: every node).  For a pod ``problem`` finds none with."""
        out: NodeSelector = ()
        for name in claims:
            claim = self._claims.get(f"{namespace}/{name}")
            if claim is None or self._delayed(claim) is not None:
                continue
            volume = self._volumes.get(claim.volume)
            if volume is not None and volume.affinity:
                out = both(out, volume.affinity)
        return out

    def provision_selector(
        self, namespace: str, claims: tuple[str, ...], nodes: Callable[[], Iterable[Node]] | None = None
    ) -> NodeSelector:
        """The nodes every claim of ``claims`` still to be bound for its pod's node may be had
        on: the node it is annotated for, or being bound for, already; else those a volume made
        beforehand that it matches may be used on, and those its class may provision for.

        Two claims that could take one and the same volume need two there: with ``nodes`` (the
        nodes to weigh), those of them where each claim gets a volume of its own, as
        ``by_size`` hands them out, are named (without, each claim is weighed alone)."""
        out: NodeSelector = ()
        choosing: list[ClaimRecord] = []  # the claims a volume is chosen for on the pod's node
        for name in claims:
            key = f"{namespace}/{name}"
            claim = self._claims.get(key)
            cls = self._delayed(claim) if claim is not None else None
            if claim is None or cls is None:
                continue
            node = claim.selected_node or self.selecting.get(key, "")
            if node:
                out = both(out, ((Requirement("metadata.name", "In", (node,), field=True),),))
                continue
            choosing.append(claim)
            ways = [v.affinity for v in self.candidates(claim) if not v.error]
            if cls.provisions and not cls.error:
                ways.append(cls.topology)
            if ways and all(ways):  # () in any way: every node
                out = both(out, tuple(dict.fromkeys(term for way in ways for term in way)))
        if nodes is not None and self._contended(choosing):
            # Only a node some candidate volume may be used on can lack one for a claim: on the
            # others every claim is provisioned, within its class's topology, as ``out`` says.
            cands = {c.key: [v for v in self.candidates(c) if not v.error] for c in choosing}
            listed = list(nodes())
            near = _selected_names([v.affinity for vs in cands.values() for v in vs], listed)
            nearby = [n for n in listed if n.name in near]
            allowed = _selected_names([out], nearby)
            refused = tuple(n.name for n in nearby if n.name in allowed and self.by_size(choosing, n, cands) is None)
            if refused:
                out = both(out, ((Requirement("metadata.name", "NotIn", refused, field=True),),))
        return out

    def _contended(self, claims: list[ClaimRecord]) -> bool:
        """Whether a volume made beforehand is a candidate of two of ``claims``."""
        seen: set[str] = set()
        for claim in claims if len(claims) > 1 else ():
            names = {v.name for v in self.candidates(claim)}
            if seen & names:
                return True
            seen |= names
        return False

    def by_size(
        self,
        claims: Iterable[ClaimRecord],
        node: Node,
        cands: Mapping[str, list[VolumeRecord]] | None = None,
    ) -> dict[str, str] | None:
        """The volumes made beforehand that ``claims`` (of one pod, each to be bound for its
        node) get on ``node``, as kube-scheduler's volume binding hands them out: the claims
        smallest request first, each the smallest volume it matches there that no claim before
        it took (claim key -> volume name; a claim absent is provisioned for the node).  None
        when one gets no volume and its class cannot provision one there.  ``cands``: each
        claim's ``candidates``, when the caller has them already."""
        taken: dict[str, str] = {}
        for claim in sorted(claims, key=lambda c: c.request):
            chosen = set(taken.values())
            mine = cands[claim.key] if cands is not None else self.candidates(claim)
            volume = next((v for v in mine if v.name not in chosen and selects(v.affinity, node)), None)
            if volume is not None:
                taken[claim.key] = volume.name
                continue
            cls = self._delayed(claim)
            if cls is None or not cls.provisions or cls.error or not selects(cls.topology, node):
                return None
        return taken

    def __len__(self) -> int:
        return len(self._claims)
