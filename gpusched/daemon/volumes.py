"""Volume binding: a pod whose claims are to be provisioned for its node is bound once they are.

kube-scheduler's VolumeBinding plugin, for the claims it provisions: a claim of a storage class
with ``volumeBindingMode: WaitForFirstConsumer`` and a provisioner gets a volume only once a
scheduler has chosen its pod's node and written it in the claim's
``volume.kubernetes.io/selected-node`` annotation; the provisioner then makes a volume there and
the volume controller binds it to the claim.  The pod is placed as any other (the class's
``allowedTopologies`` held to: ``Claims.selector``), its room is held in the books while the
volume is made, and its Binding is sent once every such claim is bound to a volume the node can
use.  It is not bound if the provisioner gives up (it takes the annotation off, or names another
node), the claim is deleted, or ``VOLUME_BIND_TIMEOUT_S`` passes: the Binding is then refused
with the reason, and the pod tried again after a back-off (a claim still annotated holds it to
that node, as for kube-scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import structlog

from gpusched.kube.binder import LEAD_LOST
from gpusched.model import Pod
from gpusched.model.affinity import selects
from gpusched.state.volumes import Claims

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.volumes")

VOLUME_BIND_TIMEOUT_S = 600.0
"""How long a placed pod waits for its claims' volumes to be provisioned and bound before its
Binding is given up (kube-scheduler's ``bindTimeoutSeconds``, whose default this is)."""


@dataclass
class _Hold:
    """A claim being bound for a node, for the pods in flight that mount it."""

    node: str
    pods: set[str] = field(default_factory=set)
    volume: str = ""
    """The volume made beforehand it is being bound to, once chosen."""
    asked: bool = False
    """Its volume was asked for (a volume's ``claimRef`` written, or the claim annotated)."""
    error: str = ""
    """Why asking failed: every pod holding it is refused so (it is asked for again by the
    next pod placed once they have all let it go)."""


HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The node label that names the node: one topology domain per node."""


def gangs_sharing_new_claims(pods: Iterable[tuple[Pod, tuple[str, ...]]], claims: Claims) -> set[str]:
    """The gangs of ``pods`` (each with the claims it mounts) two members of which mount one
    claim still to be bound for a node not chosen yet: the claim will be had on one node only,
    so such a gang is placed on one node (``on_one_node``), whatever topology it names (one node
    is within any domain)."""
    seen: dict[tuple[str, str], int] = {}
    out: set[str] = set()
    for pod, names in pods:
        if pod.gang is None or not names:
            continue
        for name in claims.unchosen(pod.namespace, names):
            key = (pod.gang.name, f"{pod.namespace}/{name}")
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                out.add(pod.gang.name)
    return out


def on_one_node(pod: Pod, gangs: Collection[str]) -> Pod:
    """``pod``, its gang held to one node if it is one of ``gangs``."""
    g = pod.gang
    if g is None or g.name not in gangs or (g.topology_key, g.topology) == (HOSTNAME_LABEL, "required"):
        return pod
    return replace(pod, gang=replace(g, topology_key=HOSTNAME_LABEL, topology="required"))


ATTACH_FULL = "binding volumes: the pod's CSI volumes would pass an attach limit of node"
"""How the reason a pod is placed again starts when pods of its batch took a node's last
attach slots (it is placed again at once, not told: it fits elsewhere, or waits as usual)."""
TIMED_OUT = "binding volumes: claim(s) "
"""How the reason a wait ran out starts."""


def outcome(why: str) -> str:
    """The ``gpusched_volume_bindings_total`` result of a wait that ended with ``why``."""
    if not why:
        return "ready"
    if why == "pod deleted":
        return "gone"
    if why == LEAD_LOST:
        return "lead_lost"
    return "timeout" if why.startswith(TIMED_OUT) else "failed"


class VolumeBinding:
    """The claims being bound for pods placed and not bound yet."""

    def __init__(self, s: Scheduler, timeout: float = VOLUME_BIND_TIMEOUT_S) -> None:
        self.s = s
        self.timeout = timeout
        self._changed = asyncio.Event()
        self._holds: dict[str, _Hold] = {}  # by claim (namespace/name)
        self._waiting: set[str] = set()  # pods (by key) waiting for their claims

    def changed(self) -> None:
        """A claim or volume changed (or a waiting pod, or the lead): the waits look again."""
        seen, self._changed = self._changed, asyncio.Event()
        seen.set()

    def pod_changed(self, key: str) -> None:
        """The pending pod ``key`` changed or went: its wait, if any, looks again."""
        if key in self._waiting:
            self.changed()

    def needed(self, pod: Pod) -> tuple[str, ...]:
        """The claims (by name) of ``pod`` to be bound for its node before it is."""
        record = self.s.queue.record(pod.key)
        if record is None or record.uid != pod.uid or not record.claims:
            return ()
        return self.s.claims.to_bind(pod.namespace, record.claims)

    def hold(self, pod: Pod, node: str) -> tuple[tuple[str, ...], str]:
        """Before ``pod`` is bound to ``node``: its claims to be bound for the node first (held
        for it at once, so that the next batch sends a pod sharing one to the same node), and
        why it cannot be bound there ("" if it can), read from the claims and volumes as they
        are now, not as its batch saw them (a claim may have been bound, or held for another
        node, since)."""
        record = self.s.queue.record(pod.key)
        if record is None or record.uid != pod.uid or not record.claims:
            return (), ""
        claims, ns = self.s.claims, pod.namespace
        names = claims.to_bind(ns, record.claims)
        for name in names:
            key = f"{ns}/{name}"
            h = self._holds.get(key)
            claim = claims.claim(key)
            other = h.node if h is not None else (claim.selected_node if claim is not None else "")
            if other and other != node:
                return (), f'binding volumes: claim "{name}" is being bound for node {other}, not {node}'
        rec = self.s.cache.nodes.get(node)
        if rec is not None:
            here = claims.provision_selector(ns, record.claims, lambda: (rec.node,))
            for selector in (claims.selector(ns, record.claims), here):
                if not selects(selector, rec.node):
                    return (), f"binding volumes: a claim of the pod cannot be had on node {node} any more"
        if claims.limits.get(node) and (needs := claims.attachments(ns, record.claims)):
            # Pods bound there since the solve (of this batch too: the solve counts no slots).
            others = ((n, p) for n, p in self.s.cache.on_nodes() if n == node and p.key != pod.key)  # (it is assumed)
            if claims.over_limit(needs, claims.attached(others), only=(node,)):
                return (), f"{ATTACH_FULL} {node}"
        for name in names:
            key = f"{ns}/{name}"
            self._holds.setdefault(key, _Hold(node)).pods.add(pod.key)
            claims.selecting[key] = node
        return names, ""

    def release(self, pod: Pod, names: tuple[str, ...]) -> None:
        """``pod`` no longer waits for ``names``: a claim no pod holds any more is free."""
        for name in names:
            key = f"{pod.namespace}/{name}"
            h = self._holds.get(key)
            if h is None:
                continue
            h.pods.discard(pod.key)
            if not h.pods:
                del self._holds[key]
                self.s.claims.selecting.pop(key, None)
                if h.volume and self.s.claims.reserved.get(h.volume) == key:
                    del self.s.claims.reserved[h.volume]

    async def provide(self, pod: Pod, node: str, names: tuple[str, ...]) -> str:
        """Have ``names`` (claims of ``pod``, held by ``hold``) bound for ``node``, each to the
        smallest available volume made beforehand that ``node`` can use, else to one provisioned
        for it, and wait until each is bound to a volume ``node`` can use: "" then, else why
        not (the pod gone is "pod deleted").  A claim another pod in flight holds is asked for
        once."""
        claims = self.s.claims
        keys = [f"{pod.namespace}/{n}" for n in names]
        self._waiting.add(pod.key)
        self.s.metrics.set_waiting_for_volumes(len(self._waiting))
        try:
            rec = self.s.cache.nodes.get(node)
            # As placement weighed them (``Claims.by_size``): the smallest request first.
            by_size = sorted(
                zip(names, keys, strict=True), key=lambda nk: c.request if (c := claims.claim(nk[1])) else 0
            )
            for name, key in by_size:
                claim = claims.claim(key)
                h = self._holds.get(key)
                if claim is None or h is None:
                    return f'binding volumes: persistentvolumeclaim "{name}" not found'
                if h.asked or claim.selected_node == node:
                    continue  # asked for already (by this pod's peer, or a volume is being provisioned there)
                if claim.selected_node:
                    return f'binding volumes: claim "{name}" is annotated for node {claim.selected_node}, not {node}'
                h.asked = True
                volume = next(
                    (v for v in claims.candidates(claim) if rec is not None and selects(v.affinity, rec.node)), None
                )
                if volume is not None:
                    claims.reserved[volume.name] = key
                    h.volume = volume.name
                    error = await self.s.binder.claim_volume(
                        volume.name, volume.version, claim.namespace, name, claim.uid
                    )
                    what = f'cannot bind persistentvolume "{volume.name}" to claim "{name}"'
                elif claims.provisions(claim):
                    error = await self.s.binder.select_node(pod.namespace, name, node)
                    what = f'cannot ask for a volume for claim "{name}" on node {node}'
                else:
                    return f'binding volumes: no available persistent volume for claim "{name}" on node {node}'
                if error:  # every pod holding the claim is refused so, not left waiting for nothing
                    h.error = error if error == LEAD_LOST else f"binding volumes: {what}: {error}"
                    self.changed()
                    return h.error
            chosen = {n: h.volume for n, k in zip(names, keys, strict=True) if (h := self._holds.get(k)) and h.volume}
            log.info("waiting for volumes", pod=pod.key, node=node, claims=list(names), volumes=chosen or None)
            seen_ours: set[str] = set()  # claims the watch has shown annotated for ``node`` since
            deadline = time.monotonic() + self.timeout
            while True:
                if not self.s.queue.current(pod.key, pod.uid):
                    return "pod deleted"
                if not self.s.is_leader:
                    return LEAD_LOST
                failed = next((h.error for k in keys if (h := self._holds.get(k)) is not None and h.error), "")
                if failed:
                    return failed
                why, waiting = self._check(names, keys, node, seen_ours, chosen)
                if why or not waiting:
                    return why
                seen = self._changed
                left = deadline - time.monotonic()
                if left <= 0:
                    return (
                        f"{TIMED_OUT}{', '.join(waiting)} not bound to a volume for node {node} "
                        f"within {self.timeout:g} s; is the {'volume controller' if chosen else 'provisioner'} running?"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await seen.wait()
        finally:
            self._waiting.discard(pod.key)
            self.s.metrics.set_waiting_for_volumes(len(self._waiting))
            self.release(pod, names)

    def _check(
        self, names: tuple[str, ...], keys: list[str], node: str, seen: set[str], chosen: dict[str, str]
    ) -> tuple[str, list[str]]:
        """Why the claims cannot be had on ``node`` any more (""), and those still waiting.  A
        claim that no longer names ``node`` is given up only once the watch had shown it named
        (``seen``): until then the watch is behind the annotation's write.  A claim being bound
        to a volume made beforehand (``chosen``) is given up if the volume goes, or is bound to
        another claim."""
        waiting: list[str] = []
        for name, key in zip(names, keys, strict=True):
            claim = self.s.claims.claim(key)
            if claim is not None and claim.selected_node == node:
                seen.add(name)
            if claim is None:
                return f'binding volumes: persistentvolumeclaim "{name}" was deleted', []
            if claim.lost:
                return f'binding volumes: persistentvolumeclaim "{name}" lost its volume', []
            if not claim.bound:
                mine = self.s.claims.volume(chosen[name]) if name in chosen else None
                if name in chosen and mine is None:
                    return f'binding volumes: persistentvolume "{chosen[name]}" was deleted', []
                if mine is not None and mine.claim and mine.claim != key:
                    return f'binding volumes: persistentvolume "{mine.name}" was bound to claim {mine.claim}', []
                if claim.volume or name in chosen:  # being bound: the provisioner's volume, or ours
                    waiting.append(name)
                elif claim.selected_node != node and name in seen:
                    return (
                        f'binding volumes: provisioning failed for persistentvolumeclaim "{name}" on node {node} '
                        "(the provisioner let the node go; the claim's Events say why)"
                    ), []
                else:
                    waiting.append(name)
                continue
            volume = self.s.claims.volume(claim.volume)
            if volume is None:
                waiting.append(name)  # the volume's watch event is on its way
                continue
            rec = self.s.cache.nodes.get(node)
            if volume.error or (rec is not None and not selects(volume.affinity, rec.node)):
                return (
                    f'binding volumes: persistentvolume "{claim.volume}" of claim "{name}" cannot be used on '
                    f"node {node}{': ' + volume.error if volume.error else ''}"
                ), []
        return "", waiting
