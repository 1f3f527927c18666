"""Persistent volume claims: whether a pod's claims let it be bound anywhere.

gpusched binds a pod only when every claim it mounts is bound to a volume, and only to a node
every such volume may be used on: a volume's required node affinity (a local volume's node, a
zonal disk's zone), with its zone and region labels, is the pod's ``volume_selector``
(``Claims.selector``), which placement honours as kube-scheduler's VolumeBinding and VolumeZone
filters do.  It does not provision volumes: a claim still waiting for a volume (a
``WaitForFirstConsumer`` storage class waits for the scheduler to pick a node and write
``volume.kubernetes.io/selected-node``, which is kube-scheduler's volume binding) would leave the
pod bound to a node and stuck there.  Such pods are refused with the reason
instead, and retried when a claim or volume changes.

A claim with access mode ``ReadWriteOncePod`` is one pod's at a time, as kube-scheduler's
VolumeRestrictions plugin keeps it: a pod mounting it while another live pod uses it, on any
node, is refused with the claim and that pod named, and retried when that pod is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.model.affinity import NodeSelector, both

__all__ = ["RWOP_CONFLICT", "ClaimRecord", "Claims", "VolumeRecord"]

RWOP_CONFLICT = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod"
)
"""What kube-scheduler (1.34) says of a node for a pod whose ``ReadWriteOncePod`` claim another pod uses."""


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


class Claims:
    """The claims and volumes the watches report, and the verdict on a pod's claims."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimRecord] = {}
        self._volumes: dict[str, VolumeRecord] = {}

    def replace_claims(self, records: list[ClaimRecord]) -> None:
        """The complete set of claims (after a list)."""
        self._claims = {r.key: r for r in records}

    def upsert_claim(self, record: ClaimRecord) -> bool:
        """A claim added or changed; True when what placement sees of it changed."""
        old = self._claims.get(record.key)
        self._claims[record.key] = record
        return old != record

    def delete_claim(self, key: str) -> bool:
        """A claim is gone; True when it was known."""
        return self._claims.pop(key, None) is not None

    def replace_volumes(self, records: list[VolumeRecord]) -> None:
        """The complete set of volumes (after a list)."""
        self._volumes = {r.name: r for r in records}

    def upsert_volume(self, record: VolumeRecord) -> bool:
        """A volume added or changed; True when what placement sees of it changed."""
        old = self._volumes.get(record.name)
        self._volumes[record.name] = record
        return old != record

    def delete_volume(self, name: str) -> bool:
        """A volume is gone; True when it was known."""
        return self._volumes.pop(name, None) is not None

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
            if not claim.volume or not claim.bound:
                return (
                    f'persistentvolumeclaim "{name}" is not bound to a volume, and this scheduler does not '
                    "provision volumes; bind the claim first (a StorageClass with volumeBindingMode: "
                    "Immediate, or a pre-created volume) or schedule the pod with kube-scheduler"
                )
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
            volume = self._volumes.get(claim.volume) if claim is not None else None
            if volume is not None and volume.affinity:
                out = both(out, volume.affinity)
        return out

    def __len__(self) -> int:
        return len(self._claims)
