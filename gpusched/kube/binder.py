"""Writes decisions to the API server: Bindings, Events and the PodScheduled condition.

``bind`` is idempotent: the Binding carries the pod's UID as a precondition
and the GPU indices as an annotation (the API server copies a Binding's
annotations onto the pod in the same write, so the pod is never bound
without them).  A 409 means the pod already has a node: if it is the node we
chose the bind counts as done (a retry after a lost response, or an earlier
leader's bind; the cache takes the GPU indices from the pod's annotation when
the watch shows it), otherwise someone else placed it.  Transient failures (429, 5xx, a lost connection)
are retried here and nowhere else, never sooner than the server's ``Retry-After``.  When the
last attempt's answer was lost or a server error (the Binding may have been written all the
same), the pod is read back to learn what happened; if that read fails too, the outcome is
``UNKNOWN`` and the caller keeps the capacity until ``settle`` or its watch can tell.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
import yaml
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from gpusched.kube.client import MERGE_PATCH, STRATEGIC_PATCH, ApiError, Kube, segment
from gpusched.kube.convert import ANNOTATION_GPU_INDICES, BOUND_BY_CONTROLLER, MIG_CONFIG_PREFIX, SELECTED_NODE
from gpusched.model import Pod
from gpusched.state.records import REASON_UNSCHEDULABLE

__all__ = [
    "LEAD_LOST",
    "MIG_CONFIG_KEY",
    "BindResult",
    "Binder",
    "NotLeading",
    "condition_changes",
    "merge_mig_configs",
]

MIG_CONFIG_KEY = "config.yaml"
"""The key of the MIG manager's ConfigMap that holds the mig-parted document."""
MIG_WRITTEN_ANNOTATION = "gpusched.io/mig-configs-written"
"""On that ConfigMap: when each configuration of gpusched's was first written (JSON, Unix seconds)."""


log = structlog.get_logger("gpusched.bind")

COMPONENT = "gpu-scheduler"


class BindResult(enum.Enum):
    """How a bind ended."""

    BOUND = "bound"
    """Bound to the node we chose (now or by an earlier attempt)."""
    GONE = "gone"
    """The pod was deleted or replaced (UID changed)."""
    TAKEN = "taken"
    """Bound elsewhere by someone else."""
    FAILED = "failed"
    """Refused, or not written after retries; retry later."""
    WITHDRAWN = "withdrawn"
    """Not sent: its node went away first.  No fault of the pod's: placed again at once."""
    UNKNOWN = "unknown"
    """No answer, and the pod could not be read back: the Binding may have been written."""


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and (exc.status in (0, 429) or exc.status >= 500)


_BACKOFF = wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1)


def _wait(state: RetryCallState) -> float:
    """Exponential backoff with jitter, or the server's ``Retry-After`` when it asks for longer
    (API Priority and Fairness answers 429 with one when it sheds load)."""
    backoff = float(_BACKOFF(state))
    exc = state.outcome.exception() if state.outcome is not None else None
    asked = exc.retry_after if isinstance(exc, ApiError) else None
    return max(backoff, asked or 0.0)


def _replaced(exc: ApiError) -> bool:
    """The answer to a patch whose ``metadata.uid`` precondition failed: the pod of the name is
    another one (the API server says the UID is immutable; 409 from servers that check it as a
    precondition)."""
    return exc.status == 409 or (exc.status == 422 and "metadata.uid" in str(exc))


def merge_mig_configs(
    text: str | None, name: str, entries: list[dict[str, Any]], keep: Collection[str]
) -> dict[str, Any]:
    """The mig-parted document ``text`` with configuration ``name`` set to ``entries``; the other
    configurations of this scheduler's that are not in ``keep`` dropped, everyone else's kept,
    ``all-disabled`` added when missing.  ``ValueError`` when ``text`` is not such a document:
    it is not overwritten."""
    doc: Any = {"version": "v1", "mig-configs": {}} if not (text or "").strip() else None
    if doc is None:
        try:
            doc = yaml.safe_load(text or "")
        except yaml.YAMLError as exc:
            raise ValueError(f"{MIG_CONFIG_KEY} is not YAML ({exc}); fix or remove it") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("mig-configs", {}), dict):
            raise ValueError(f"{MIG_CONFIG_KEY} is not a mig-parted document (version, mig-configs); fix or remove it")
    configs = {
        k: v for k, v in (doc.get("mig-configs") or {}).items() if not str(k).startswith(MIG_CONFIG_PREFIX) or k in keep
    }
    configs.setdefault("all-disabled", [{"devices": "all", "mig-enabled": False}])
    configs[name] = entries
    return {**doc, "version": doc.get("version", "v1"), "mig-configs": configs}


def _written(text: str | None) -> dict[str, float]:
    """``MIG_WRITTEN_ANNOTATION`` read leniently: what cannot be read counts as never written."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _path(pod: Pod) -> str:
    return f"/api/v1/namespaces/{segment(pod.namespace)}/pods/{segment(pod.name)}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


LEAD_LOST = "no longer the leader"
"""What a bind, a write or an eviction not made because the lead ended says (at the start of
its reason): no fault of the pod's, nor of the API server's."""


class NotLeading(Exception):
    """This instance stopped leading before the request (or its next attempt) went out;
    ``sent`` says whether an earlier attempt had gone out, whose outcome is then unknown."""

    def __init__(self, sent: bool = False) -> None:
        super().__init__(LEAD_LOST)
        self.sent = sent


def condition_changes(
    message: str,
    nominated: str | None,
    current: str | None,
    current_nominated: str | None,
    reason: str = REASON_UNSCHEDULABLE,
    current_reason: str | None = None,
) -> bool:
    """Whether telling a pod ``message`` (and ``nominated``, with the condition's ``reason``)
    changes what it already carries (the condition's ``current`` message, ``current_nominated``
    and ``current_reason``, None: not known, taken for ``reason``): only then is anything written."""
    if current_reason is not None and current is not None and current_reason != reason:
        return True
    return (current, current_nominated or None) != (message, nominated or None)


@dataclass(slots=True)
class _Said:
    """The last Event written on an object for one reason: a repeat counts in it."""

    message: str
    when: float
    """``time.monotonic()`` when it was last sent."""
    name: str
    count: int
    first: str
    """Its ``firstTimestamp``."""


class Binder:
    """Bindings, Events and conditions for one scheduler instance."""

    def __init__(
        self,
        kube: Kube,
        identity: str,
        attempts: int = 4,
        event_repeat_s: float = 60.0,
        events: Kube | None = None,
        leading: Callable[[], bool] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        lead_left: Callable[[], float] | None = None,
        node_known: Callable[[str], bool] | None = None,
    ) -> None:
        self.kube = kube
        self.node_known = node_known
        """Whether a node is still there (by the watch): a Binding to a node deleted since the
        plan is not sent, since the API server would accept it and the pod be lost with the node."""
        self.sleep = sleep
        """How retries wait (tests record the waits instead)."""
        self.leading = leading
        """Whether this instance may still bind: checked before every Binding attempt, so that
        retries never reach the API server after another instance may have taken over."""
        self.lead_left = lead_left
        """Seconds the lead still holds: every write made for the leader (a Binding, a victim's
        deletion, a MIG layout, a condition) must be over by then (its timeout, and the API
        server's), since another instance may be writing after that."""
        self.events = events or kube
        """Client for Events and Unschedulable conditions (a sibling with its own rate limit, as
        kube-scheduler's event client): a burst of verdicts never makes a Binding wait."""
        self.identity = identity
        self.attempts = attempts
        self.event_repeat_s = event_repeat_s
        self._last_event: dict[tuple[str, str], _Said] = {}
        self.sending: set[str] = set()
        """Pods, by key, whose Binding has gone out (one attempt at least) and whose outcome is
        not known yet: cut off now, it may still land.  Not those still waiting for a token."""

    async def _retrying(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str = "application/json",
        kube: Kube | None = None,
        leading: Callable[[], bool] | None = None,
        deadline: Callable[[], float] | None = None,
        on_send: Callable[[], None] | None = None,
    ) -> Any:
        """The request, retried while it fails in passing; with ``leading``, each attempt is made
        only while it holds (else ``NotLeading``) and must be over by the end of the lead
        (``lead_left``, unless ``deadline`` says otherwise): another instance may be writing
        after that."""
        client = kube or self.kube
        if leading is not None and deadline is None:
            deadline = self.lead_left
        sent = False

        def check() -> None:
            if leading is not None and not leading():
                raise NotLeading(sent)

        def send() -> None:
            nonlocal sent
            check()  # again once the rate limiter lets it go, which can take seconds
            sent = True
            if on_send is not None:
                on_send()

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=_wait,
            sleep=self.sleep,
            retry=retry_if_exception(_transient),
            reraise=True,
        ):
            with attempt:
                check()
                r = await client.request(
                    method, path, body=body, content_type=content_type, before_send=send, deadline=deadline
                )
                if not r.ok:
                    raise r.error()
                return r.body
        raise AssertionError("unreachable")  # pragma: no cover

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        """Bind ``pod`` to ``node``; the second item says why when it is not BOUND."""
        path = f"{_path(pod)}/binding"
        meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
        if pod.uid:
            meta["uid"] = pod.uid
        if gpus:
            meta["annotations"] = {ANNOTATION_GPU_INDICES: ",".join(str(g) for g in gpus)}
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        gone = False

        def may() -> bool:  # before every attempt, and again once the rate limiter lets it go
            nonlocal gone
            gone = self.node_known is not None and not self.node_known(node)
            return not gone and (self.leading is None or self.leading())

        try:
            await self._retrying(
                "POST", path, body, leading=may, deadline=self.lead_left, on_send=lambda: self.sending.add(pod.key)
            )
            return BindResult.BOUND, ""
        except NotLeading as exc:
            why = f"node {node} is gone" if gone else LEAD_LOST
            if exc.sent:  # an earlier attempt went out and got no answer: it may have been written
                return await self.settle(pod, node, f"{why} after a Binding with no answer", final=False)
            return (BindResult.WITHDRAWN if gone else BindResult.FAILED), why
        except ApiError as exc:
            if exc.status == 404:
                return BindResult.GONE, exc.message
            if exc.status in (0, 409) or exc.status >= 500:  # it may have been written
                return await self.settle(pod, node, str(exc), final=exc.status == 409)
            return BindResult.FAILED, str(exc)
        finally:
            self.sending.discard(pod.key)

    async def exists(self, pod: Pod) -> bool | None:
        """Whether ``pod`` (this UID, not a later pod of its name) is still there and not
        finished; None when the API server could not say."""
        try:
            obj = await self._retrying("GET", _path(pod), None)
        except ApiError as exc:
            if exc.status == 404:
                return False
            log.warning("pod not read back", pod=pod.key, error=str(exc))
            return None
        meta = obj.get("metadata") or {}
        phase = (obj.get("status") or {}).get("phase")
        return (not pod.uid or meta.get("uid") == pod.uid) and phase not in ("Succeeded", "Failed")

    async def settle(self, pod: Pod, node: str, cause: str, final: bool = True) -> tuple[BindResult, str]:
        """After a conflict or a lost answer (``cause``): read the pod once to learn whether the
        Binding to ``node`` was written.  ``UNKNOWN`` when the read fails in passing, and, unless
        ``final``, when the pod is not bound yet: an API server that gave up waiting on a write
        (a timeout, a 5xx) may still complete it, so the pod is read again a moment later
        before its room is given to another."""
        try:
            r = await self.kube.request("GET", _path(pod))
        except ApiError as exc:
            err = exc
        else:
            if r.status == 404:
                return BindResult.GONE, "pod deleted"
            if r.ok and isinstance(r.body, dict):
                result, why = self._outcome(pod, node, r.body, cause)
                return (BindResult.UNKNOWN, why) if result is BindResult.FAILED and not final else (result, why)
            err = r.error() if not r.ok else ApiError(0, f"the answer is not a pod: {str(r.body)[:80]!r}")
        result = BindResult.UNKNOWN if _transient(err) else BindResult.FAILED
        return result, f"{cause}; and reading the pod failed: {err}"

    @staticmethod
    def _outcome(pod: Pod, node: str, obj: dict[str, Any], cause: str) -> tuple[BindResult, str]:
        meta = obj.get("metadata") or {}
        if pod.uid and meta.get("uid") != pod.uid:
            return BindResult.GONE, "pod replaced (new UID)"
        bound_to = (obj.get("spec") or {}).get("nodeName") or ""
        if bound_to == node:
            return BindResult.BOUND, ""
        if bound_to:
            return BindResult.TAKEN, f"already bound to {bound_to}"
        return BindResult.FAILED, cause

    async def event(self, pod: Pod, reason: str, message: str, kind: str = "Normal", fenced: bool = False) -> None:
        """An Event on the pod (repeats of one reason and message are sent at most every ``event_repeat_s``)."""
        await self.object_event(
            {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "apiVersion": "v1"},
            reason,
            message,
            kind,
            fenced,
        )

    async def object_event(
        self, involved: dict[str, str], reason: str, message: str, kind: str = "Normal", fenced: bool = False
    ) -> None:
        """An Event on any object; failures are logged, never raised (Events are best effort).
        ``fenced``: the leader's word (a verdict, a MIG layout asked for), sent only while this
        instance leads, as its other writes are (the next leader may be saying otherwise); an
        Event that reports what was done (``Scheduled``, ``Preempted``) is sent in any case."""
        ns = involved.get("namespace") or "default"
        # By UID too: a pod created again under the name (a StatefulSet's) gets its own Events.
        key = (f"{involved.get('kind')}/{ns}/{involved.get('name')}/{involved.get('uid') or ''}", reason)
        said = self._last_event.get(key)
        now = time.monotonic()
        if said is not None and said.message == message and now - said.when < self.event_repeat_s:
            return
        stamp = _now()
        events = f"/api/v1/namespaces/{segment(ns)}/events"
        leading = self.leading if fenced else None
        try:
            if said is not None and said.message == message:
                # A repeat is counted in the Event written, as client-go's recorder counts it
                # (``kubectl describe`` shows "x12 over 11m"), rather than written anew each time.
                said.when, said.count = now, said.count + 1
                patch = {"count": said.count, "lastTimestamp": stamp}
                try:
                    await self._retrying(
                        "PATCH", f"{events}/{segment(said.name)}", patch, MERGE_PATCH, kube=self.events, leading=leading
                    )
                    return
                except ApiError as exc:
                    if exc.status not in (403, 404):
                        raise
                    # Gone (an Event lives an hour), or a role from before Events were patched:
                    # written again below, its count carried on.
            else:
                said = self._last_event[key] = _Said(message, now, "", 1, stamp)
                if len(self._last_event) > 50_000:
                    self._last_event.clear()
            # Named as client-go's recorder names Events (the object's name and the time in
            # nanoseconds, hex): a POST retried after a lost answer finds it there (409), where a
            # generated name would write it twice.
            said.name = f"{involved.get('name')}.{time.time_ns():x}"
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": said.name, "namespace": ns},
                "involvedObject": {k: v for k, v in involved.items() if v},
                "reason": reason,
                "message": message[:1024],
                "type": kind,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "reportingInstance": self.identity,
                "firstTimestamp": said.first,
                "lastTimestamp": stamp,
                "count": said.count,
            }
            await self._retrying("POST", events, body, kube=self.events, leading=leading)
        except NotLeading:
            self._last_event.pop(key, None)  # not said: said again when this instance leads again
            log.info("event not written: no longer the leader", object=key[0], reason=reason)
        except ApiError as exc:
            if exc.status != 409:  # 409: written by an attempt whose answer was lost
                log.warning("event not written", object=key[0], reason=reason, error=str(exc))

    async def preempt(self, victim: Pod, by: Pod, node: str, why: str = "") -> bool:
        """Delete ``victim`` (this UID, not a later pod of its name) to make room for ``by`` on
        ``node``, with the victim's own grace period, as kube-scheduler does: first the
        ``DisruptionTarget`` condition (best effort, as for kube-scheduler: a Job's pod failure
        policy reads it), then the deletion, then a ``Preempted`` Event.  False, logged, when it
        was not deleted (it was gone already: True).  ``why``: the reason in words, when it is
        not priority (a reclaim)."""
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": f"{COMPONENT}: {why or 'preempting to accommodate a higher priority pod'}",
            "lastTransitionTime": _now(),
        }
        patch: dict[str, Any] = {"status": {"conditions": [condition]}}
        if victim.uid:
            patch["metadata"] = {"uid": victim.uid}
        try:
            await self._retrying(
                "PATCH", f"{_path(victim)}/status", patch, STRATEGIC_PATCH, kube=self.events, leading=self.leading
            )
        except NotLeading:
            log.info("victim not marked nor deleted: no longer the leader", pod=victim.key, preemptor=by.key)
            return False
        except ApiError as exc:
            log.info("disruption condition not written", pod=victim.key, error=str(exc))
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if victim.uid:
            body["preconditions"] = {"uid": victim.uid}
        try:
            await self._retrying("DELETE", _path(victim), body, leading=self.leading)
        except NotLeading:
            log.info("victim not deleted: no longer the leader", pod=victim.key, preemptor=by.key)
            return False
        except ApiError as exc:
            if exc.status == 404 or _replaced(exc):
                log.info("victim gone already", pod=victim.key, uid=victim.uid)
                return True
            log.warning("victim not deleted", pod=victim.key, preemptor=by.key, node=node, error=str(exc))
            return False
        said = f"Preempted by pod {by.key} on node {node}"
        await self.event(victim, "Preempted", f"{said}: {why}" if why else said)
        return True

    async def evict(self, victim: Pod, node: str, why: str) -> bool:
        """Evict ``victim`` (this UID) from ``node`` through the Eviction API, which checks its
        disruption budgets and sets its ``DisruptionTarget`` condition, then write a
        ``Consolidating`` Event saying ``why``.  False, logged, when it was not evicted (a budget
        refused it, say); True when it was gone already.  ``NotLeading`` when the lead ended
        before it went out: nothing refused it."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": victim.name, "namespace": victim.namespace},
        }
        if victim.uid:
            body["deleteOptions"] = {"preconditions": {"uid": victim.uid}}
        try:
            await self._retrying("POST", f"{_path(victim)}/eviction", body, leading=self.leading)
        except ApiError as exc:
            # A 409 is a pod of the name that is another (its UID precondition failed), or a
            # disruption budget another eviction changed meanwhile, which left the pod running.
            if exc.status == 404 or (_replaced(exc) and (exc.status != 409 or "precondition" in str(exc).lower())):
                log.info("pod to evict gone already", pod=victim.key, uid=victim.uid)
                return True
            log.warning("pod not evicted", pod=victim.key, node=node, error=str(exc))
            return False
        await self.event(victim, "Consolidating", f"Evicted from node {node}: {why}")
        return True

    async def write_mig_config(
        self, name: str, entries: list[dict[str, Any]], config_map: str, keep: Collection[str] = ()
    ) -> tuple[str, float]:
        """Add the MIG layout ``entries`` (mig-parted's list of device groups) under ``name`` to
        the configurations in ConfigMap ``config_map`` (``namespace/name``, key ``config.yaml``;
        created when missing), for NVIDIA's MIG manager.  Configurations of this scheduler's
        (``gpusched-``) that are not named in ``keep`` are dropped; the others are left as they
        are, and ``all-disabled`` is added when missing (the label the GPU operator starts nodes
        with).  When each of ours was first written (Unix seconds) is kept in the ConfigMap's
        annotation ``MIG_WRITTEN_ANNOTATION``, so that any instance knows how long the MIG
        manager's copy has had it.  The error ("" once written), and when ``name`` was first
        written (now, if it was not there under this scheduler's hand)."""
        namespace, cm = config_map.split("/", 1)
        path = f"/api/v1/namespaces/{segment(namespace)}/configmaps"
        try:
            for _ in range(self.attempts):  # another writer in between: read it again
                created = False
                try:
                    current = await self._retrying("GET", f"{path}/{segment(cm)}", None)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    current, created = {"metadata": {"name": cm, "namespace": namespace}, "data": {}}, True
                data = dict(current.get("data") or {})
                try:
                    doc = merge_mig_configs(data.get(MIG_CONFIG_KEY), name, entries, keep)
                except ValueError as exc:
                    return f"ConfigMap {config_map}: {exc}", 0.0
                meta = dict(current["metadata"])
                annotations = dict(meta.get("annotations") or {})
                written = _written(annotations.get(MIG_WRITTEN_ANNOTATION))
                written = {k: v for k, v in written.items() if k in doc["mig-configs"]}
                written.setdefault(name, time.time())
                annotations[MIG_WRITTEN_ANNOTATION] = json.dumps(written, sort_keys=True)
                meta["annotations"] = annotations
                data[MIG_CONFIG_KEY] = yaml.safe_dump(doc, sort_keys=True)
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
                try:
                    if created:
                        await self._retrying("POST", path, body, leading=self.leading)
                    else:
                        await self._retrying("PUT", f"{path}/{segment(cm)}", body, leading=self.leading)
                    return "", written[name]
                except ApiError as exc:
                    if exc.status != 409:
                        raise
            return f"ConfigMap {config_map}: changed by another writer {self.attempts} times in a row", 0.0
        except NotLeading:
            return LEAD_LOST, 0.0
        except ApiError as exc:
            return str(exc), 0.0

    async def select_node(self, namespace: str, claim: str, node: str) -> str:
        """Annotate claim ``namespace/claim`` with the node its volume is to be provisioned for
        (``volume.kubernetes.io/selected-node``, which the provisioner waits for), as the leader;
        the error, or "" once done."""
        patch = {"metadata": {"annotations": {SELECTED_NODE: node}}}
        path = f"/api/v1/namespaces/{segment(namespace)}/persistentvolumeclaims/{segment(claim)}"
        try:
            await self._retrying("PATCH", path, patch, MERGE_PATCH, leading=self.leading)
        except NotLeading:
            return LEAD_LOST
        except ApiError as exc:
            return str(exc)
        return ""

    async def claim_volume(self, volume: str, version: str, namespace: str, claim: str, uid: str) -> str:
        """Bind volume ``volume`` (as of ``version``: if it changed since, nothing is written) to
        claim ``namespace/claim`` as kube-scheduler's volume binding does, by naming the claim in
        its ``claimRef`` (the volume controller then completes the binding), as the leader; the
        error, or "" once done."""
        ref = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim}
        if uid:
            ref["uid"] = uid
        meta: dict[str, Any] = {"annotations": {BOUND_BY_CONTROLLER: "yes"}}
        if version:
            meta["resourceVersion"] = version
        patch = {"metadata": meta, "spec": {"claimRef": ref}}
        try:
            await self._retrying(
                "PATCH", f"/api/v1/persistentvolumes/{segment(volume)}", patch, MERGE_PATCH, leading=self.leading
            )
        except NotLeading:
            return LEAD_LOST
        except ApiError as exc:
            return str(exc)
        return ""

    async def label_node(self, node: str, labels: dict[str, str | None]) -> str:
        """Set (a value) or remove (None) ``labels`` on ``node``; the error, or "" once done."""
        patch = {"metadata": {"labels": labels}}
        try:
            await self._retrying("PATCH", f"/api/v1/nodes/{segment(node)}", patch, MERGE_PATCH, leading=self.leading)
        except NotLeading:
            return LEAD_LOST
        except ApiError as exc:
            return str(exc)
        return ""

    async def unschedulable(
        self,
        pod: Pod,
        message: str,
        current: str | None = None,
        nominated: str | None = None,
        current_nominated: str | None = None,
        still: Callable[[], bool] | None = None,
        *,
        reason: str = REASON_UNSCHEDULABLE,
        current_reason: str | None = None,
        urgent: bool = False,
    ) -> None:
        """``PodScheduled=False`` with ``reason`` (``Unschedulable``, as kube-scheduler sets it;
        ``TenantLimit`` for a pod only its tenant's limit holds back, which the cluster
        autoscaler must not add a node for), and ``status.nominatedNodeName``: the node where
        the pod preempted others, or none.
        ``still``: whether the verdict still stands, asked before every attempt (a retry waits
        seconds, and the pod may have been bound meanwhile).  ``urgent``: sent on the Bindings'
        client rather than the Events' (a preemptor's new nomination, which its victims'
        deletions wait for, must not wait behind a backlog of verdicts).

        ``current`` is the message of the condition the pod already has, if any, ``current_reason``
        its reason and ``current_nominated`` its ``nominatedNodeName``: the same message, reason
        and node are not written again, and a new one keeps the condition's transition time.
        """
        if not condition_changes(message, nominated, current, current_nominated, reason, current_reason):
            return
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        if current is None:
            condition["lastTransitionTime"] = _now()
        body: dict[str, Any] = {"status": {"conditions": [condition], "nominatedNodeName": nominated or None}}
        if pod.uid:  # a precondition: a pod created again under the name has not been tried yet
            body["metadata"] = {"uid": pod.uid}
        try:
            await self._retrying(
                "PATCH",
                f"{_path(pod)}/status",
                body,
                STRATEGIC_PATCH,
                # A thousand pods found unschedulable must not make a Binding wait.
                kube=self.kube if urgent else self.events,
                # The next leader's word on the pod is not to be overwritten, nor a pod bound since.
                leading=lambda: (self.leading is None or self.leading()) and (still is None or still()),
            )
        except NotLeading:
            if still is not None and not still():
                log.info("condition not written: the pod was bound or replaced since", pod=pod.key)
            else:
                log.info("condition not written: no longer the leader", pod=pod.key)
        except ApiError as exc:
            if _replaced(exc):
                log.info("condition not written: pod replaced", pod=pod.key, uid=pod.uid)
            elif exc.status != 404:
                log.warning("condition not written", pod=pod.key, error=str(exc))
