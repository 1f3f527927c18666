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
from typing import TYPE_CHECKING

import structlog

from gpusched.kube.binder import LEAD_LOST
from gpusched.model import Pod
from gpusched.model.affinity import selects

if TYPE_CHECKING:
    from gpusched.daemon.scheduler import Scheduler

log = structlog.get_logger("gpusched.volumes")

VOLUME_BIND_TIMEOUT_S = 600.0
"""How long a placed pod waits for its claims' volumes to be provisioned and bound before its
Binding is given up (kube-scheduler's ``bindTimeoutSeconds``, whose default this is)."""


class VolumeBinding:
    """The claims being provisioned for pods placed and not bound yet."""

    def __init__(self, s: Scheduler, timeout: float = VOLUME_BIND_TIMEOUT_S) -> None:
        self.s = s
        self.timeout = timeout
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """A claim or volume changed: the pods waiting for theirs look again."""
        seen, self._changed = self._changed, asyncio.Event()
        seen.set()

    def needed(self, pod: Pod) -> tuple[str, ...]:
        """The claims (by name) of ``pod`` to be provisioned for its node before it is bound."""
        record = self.s.queue.record(pod.key)
        if record is None or record.uid != pod.uid or not record.claims:
            return ()
        return self.s.claims.to_provision(pod.namespace, record.claims)

    async def provide(self, pod: Pod, node: str, names: tuple[str, ...]) -> str:
        """Ask for ``names`` (claims of ``pod``) to be provisioned for ``node`` and wait until
        each is bound to a volume ``node`` can use: "" then, else why not (the pod gone is
        "pod deleted")."""
        keys = [f"{pod.namespace}/{n}" for n in names]
        for key in keys:
            self.s.claims.selecting[key] = node
        try:
            for name, key in zip(names, keys, strict=True):
                claim = self.s.claims.claim(key)
                if claim is None:
                    return f'binding volumes: persistentvolumeclaim "{name}" not found'
                if claim.selected_node == node:
                    continue
                error = await self.s.binder.select_node(pod.namespace, name, node)
                if error == LEAD_LOST:
                    return error
                if error:
                    return f'binding volumes: cannot ask for a volume for claim "{name}" on node {node}: {error}'
            log.info("waiting for volumes", pod=pod.key, node=node, claims=list(names))
            seen_ours: set[str] = set()  # claims the watch has shown annotated for ``node`` since
            deadline = time.monotonic() + self.timeout
            while True:
                if not self.s.queue.current(pod.key, pod.uid):
                    return "pod deleted"
                why, waiting = self._check(names, keys, node, seen_ours)
                if why or not waiting:
                    return why
                seen = self._changed
                left = deadline - time.monotonic()
                if left <= 0:
                    return (
                        f"binding volumes: claim(s) {', '.join(waiting)} not bound to a volume for node {node} "
                        f"within {self.timeout:g} s; is the provisioner running?"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await seen.wait()
        finally:
            for key in keys:
                if self.s.claims.selecting.get(key) == node:
                    del self.s.claims.selecting[key]

    def _check(self, names: tuple[str, ...], keys: list[str], node: str, seen: set[str]) -> tuple[str, list[str]]:
        """Why the claims cannot be had on ``node`` any more (""), and those still waiting.  A
        claim that no longer names ``node`` is given up only once the watch had shown it named
        (``seen``): until then the watch is behind the annotation's write."""
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
                if claim.volume:  # being bound: the provisioner's volume, or another
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
