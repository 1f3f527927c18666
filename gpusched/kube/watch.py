"""List+watch that keeps a handler current, the way client-go's reflector does.

One ``Reflector`` per kind of object: it lists (in pages), hands the full set
to ``Handler.replace``, then watches from the list's resourceVersion with
bookmarks on, passing each change to ``Handler.apply``.  The resourceVersion
advances with every event and bookmark, so a dropped connection or a refused
watch request is retried (with backoff) from where it stopped, without a new
list; only a 410 Gone (the version fell out of etcd's window) relists, and so
does a handler that raises (a bug), after a backoff, so that the change it
failed on is not lost.  A watch the server (or a proxy) ends within a second
without a single event counts as failed and is retried with backoff, as
client-go's "very short watch": reopened at once, it would spend the client's
rate limit, which the Bindings share.  Each watch asks the server to end it
after 5 to 10 minutes, at random, so that the watches do not all reopen at once.
``synced`` is set after the first full list: until every reflector is synced
the scheduler does not place anything, because it cannot know what is already
in use.

``OptionalReflector`` follows a custom resource the API server may not serve (its
CustomResourceDefinition not installed): it is read when discovery finds it, and otherwise
counts as synced with nothing in it, told once, and looked for again now and then.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Protocol

import structlog

from gpusched.kube.client import (
    CERTIFICATE_NAME_MISMATCH,
    CERTIFICATE_OUT_OF_DATE,
    CERTIFICATE_UNTRUSTED,
    NOT_KUBERNETES,
    ApiError,
    Kube,
)

__all__ = ["Handler", "OptionalHandler", "OptionalReflector", "Reflector"]

log = structlog.get_logger("gpusched.watch")

GONE = 410
FORBIDDEN = 403
NOT_FOUND = 404


def _too_large(exc: ApiError) -> bool:
    """A watch from a version newer than the API server's cache holds (an etcd restored from
    a backup, or a server behind the one that listed): watched again from there it never
    recovers, so it is listed afresh, as client-go's reflector does."""
    return exc.status == 504 and "too large resource version" in str(exc).lower()


FAILING_UNREADY_S = 60.0
"""A watch failing this long (no list nor watch has worked since) makes the scheduler not ready:
its books fall behind the cluster."""


def fix_for(exc: ApiError) -> str:
    """What to check when a list or watch keeps failing so."""
    if exc.status == 401:
        return "the API server refused the credentials: check the kubeconfig's token or client certificate"
    if exc.status == 403:
        return "the RBAC does not grant this: apply manifests/ (docs/deploy.md, 'What the RBAC grants, and why')"
    if exc.reason == CERTIFICATE_UNTRUSTED:
        return "the kubeconfig's certificate-authority (in a pod, the service account's ca.crt) must be the CA"
    if exc.reason == CERTIFICATE_NAME_MISMATCH:
        return "the kubeconfig's server (or tls-server-name) must be a name the API server's certificate is issued for"
    if exc.reason == CERTIFICATE_OUT_OF_DATE:
        return "the API server's certificate must be renewed, or this machine's clock set right"
    if exc.reason == NOT_KUBERNETES:
        return "the kubeconfig's server (in a pod, KUBERNETES_SERVICE_HOST) must be a Kubernetes API server's address"
    if exc.reason == "Unreachable":
        return "check the API server address in the kubeconfig and that the API server is up"
    return "see the error; the watch retries with backoff"


SHORT_WATCH_S = 1.0
"""A watch that ends sooner than this without an event is retried with backoff, not at once."""


class Handler(Protocol):
    """Receives a kind's objects as decoded JSON."""

    def replace(self, objects: list[dict[str, Any]]) -> None:
        """The complete current set (after a list)."""

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One change: ``ADDED``, ``MODIFIED`` or ``DELETED``."""


async def _back_off(delay: float, at_least: float = 0.0) -> float:
    """Wait ``delay`` with up to half again of jitter (or ``at_least``); the next delay."""
    await asyncio.sleep(max(delay * (1 + random.random() / 2), at_least))
    return min(delay * 2, 10.0)


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def trim(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what no handler reads and what makes up most of a real object's size:
    ``metadata.managedFields``, kubectl's last-applied annotation (a copy of the object) and a
    node's image list (as kube-scheduler's informers drop managed fields).  A list of 20,000
    pods of a Deployment holds about half the memory so."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        notes = meta.get("annotations")
        if isinstance(notes, dict):
            notes.pop(LAST_APPLIED, None)
    status = obj.get("status")
    if isinstance(status, dict):
        status.pop("images", None)  # a node's
    return obj


class _ApplyFailed(Exception):
    """``Handler.apply`` raised on one change (the cause is chained)."""

    def __init__(self, kind: str, obj: str) -> None:
        super().__init__(f"{kind} {obj} not applied")
        self.kind = kind
        self.object = obj


class OptionalHandler(Handler, Protocol):
    """Receives a kind that may not be read at all."""

    def unread(self, why: str) -> None:
        """The kind is not read now (``why``: not served, or not granted): none of it is known."""


class Reflector:
    """Keeps ``handler`` in step with the objects at ``path`` matching the selectors."""

    optional = False
    """A 403 or 404 ends ``run`` (the kind is not served, or not granted: ``OptionalReflector``)
    rather than being retried."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        path: str,
        handler: Handler,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_s: int = 300,
    ) -> None:
        """``watch_timeout_s``: the least a watch asks the server to last (at random up to twice it)."""
        self.kube = kube
        self.name = name
        self.path = path
        self.handler = handler
        self.selectors: dict[str, Any] = {"fieldSelector": field_selector, "labelSelector": label_selector}
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.failing_since: float | None = None
        """``time.monotonic`` of the first failure since a list or watch last worked; None while they work."""
        self.last_error = ""
        self.unread_by: ApiError | None = None
        """What ended ``run`` of an optional kind (a 403 or 404)."""

    def failing_for(self) -> float:
        """Seconds the lists and watches have failed in a row (0 while they work)."""
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    async def run(self) -> None:
        """List, then watch, forever; reconnects with backoff, relists only when the version expired."""
        delay = relist_delay = 0.2
        listed = False
        while True:
            started = watching = time.monotonic()
            try:
                if not listed:
                    await self._list()
                    listed, delay = True, 0.2
                    watching = time.monotonic()
                await self._watch()
            except ApiError as exc:
                watched = time.monotonic() - watching
                if watched > 30:  # the watch had been running: not a streak of relists
                    relist_delay = 0.2
                if self.optional and exc.status in (FORBIDDEN, NOT_FOUND):
                    self.unread_by, self.failing_since = exc, None
                    return
                if exc.status == GONE or _too_large(exc):
                    log.info("watch expired, relisting", watch=self.name, rv=self.resource_version)
                    listed = False
                    if watched < 1.0:  # expired again right after a list
                        relist_delay = await _back_off(relist_delay)
                    continue
                if time.monotonic() - started > 30:  # it had been running: not a failure streak
                    delay = 0.2
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self.last_error = str(exc)
                log.warning(
                    "watch failed, retrying",
                    then="watch from rv" if listed else "list",
                    watch=self.name,
                    error=str(exc),
                    rv=self.resource_version,
                    retry_in_s=round(max(delay, exc.retry_after or 0.0), 2),
                    failing_s=round(self.failing_for(), 1),
                    fix=fix_for(exc),
                )
                delay = await _back_off(delay, exc.retry_after or 0.0)
            except Exception as exc:  # the handler failed (a bug): list again to rebuild what it holds
                if time.monotonic() - watching > 30:
                    relist_delay = 0.2
                change = {"kind": exc.kind, "object": exc.object} if isinstance(exc, _ApplyFailed) else {}
                log.exception("handler failed, relisting", watch=self.name, retry_in_s=round(relist_delay, 2), **change)
                listed = False
                relist_delay = await _back_off(relist_delay)

    async def _list(self) -> None:
        items, self.resource_version = await self.kube.list(self.path, self.selectors, self.page_size, trim)
        self.handler.replace(items)
        self.synced.set()
        self.failing_since = None
        log.debug("listed", watch=self.name, count=len(items), rv=self.resource_version)

    async def _watch(self) -> None:
        """Watch until an error; a stream the server closes normally is reopened from the last version."""
        while True:
            lasts = int(self.watch_timeout_s * (1 + random.random()))
            query = {
                **self.selectors,
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": lasts,
            }
            opened = time.monotonic()
            events = 0
            async for event in self.kube.stream(self.path, query, timeout=lasts + 30):
                events += 1
                self.failing_since = None
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 0), str(obj.get("message")), str(obj.get("reason") or ""))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    try:
                        self.handler.apply(kind, trim(obj))
                    except Exception as exc:
                        meta = obj.get("metadata") or {}
                        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")
                        raise _ApplyFailed(kind, name) from exc
            if not events and time.monotonic() - opened < SHORT_WATCH_S:
                raise ApiError(0, f"very short watch: the server ended it within {SHORT_WATCH_S:g} s without an event")
            self.failing_since = None  # it lasted, and ended as asked


REDISCOVER_S = 60.0
"""How often a custom resource that is not read is looked for again."""


class OptionalReflector(Reflector):
    """A ``Reflector`` of a custom resource the API server may not serve (its
    CustomResourceDefinition not installed).

    Discovery (``GET /apis/GROUP/VERSION``) says whether ``resource`` is served: if so, it is
    listed and watched as any other kind.  If not, or if the RBAC does not grant reading it, the
    handler is told (``OptionalHandler.unread``) and the reflector counts as synced (the scheduler
    does not wait for what it cannot read); the resource is looked for again every
    ``rediscover_s``, so a definition installed later is read from then on, and one deleted (its
    list or watch answered 404) goes back to being looked for.  That it is not read is logged once
    per cause, not on every look: at info when it is not served, as a warning with the fix when
    it is not granted.  Discovery failing otherwise (the API server unreachable) is retried with
    backoff and logged, as a failing watch is.
    """

    optional = True

    def __init__(
        self,
        kube: Kube,
        name: str,
        group_version: str,
        resource: str,
        handler: OptionalHandler,
        *,
        rediscover_s: float = REDISCOVER_S,
        watch_timeout_s: int = 300,
    ) -> None:
        super().__init__(kube, name, f"/apis/{group_version}/{resource}", handler, watch_timeout_s=watch_timeout_s)
        self.group_version = group_version
        self.resource = resource
        self.optional_handler = handler
        self.rediscover_s = rediscover_s
        self.served = False
        """Whether the resource is listed and watched now."""
        self._told = ""
        """Why it is not read, as last logged ("" once it is read)."""

    @property
    def full_name(self) -> str:
        """``podgroups.scheduling.x-k8s.io/v1alpha1``."""
        group, _, version = self.group_version.rpartition("/")
        return f"{self.resource}.{group}/{version}"

    async def _discover(self) -> str:
        """Why the resource cannot be read ("" when it is served); raises ``ApiError`` when
        discovery itself fails."""
        r = await self.kube.request("GET", f"/apis/{self.group_version}")
        if r.status == NOT_FOUND:
            return f"the API server does not serve {self.full_name}"
        if not r.ok:
            raise r.error()
        found = (r.body or {}).get("resources") if isinstance(r.body, dict) else None
        if not any(isinstance(x, dict) and x.get("name") == self.resource for x in found or ()):
            return f"the API server does not serve {self.full_name}"
        return ""

    async def _list(self) -> None:
        await super()._list()
        if not self.served:
            self.served, self._told = True, ""
            log.info("reading a custom resource", watch=self.name, resource=self.full_name)

    async def run(self) -> None:
        """Look for the resource, read it while it is served, and look again when it is not."""
        delay = 0.2
        while True:
            try:
                why = await self._discover()
            except ApiError as exc:
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self.last_error = str(exc)
                log.warning(
                    "discovery failed, retrying",
                    watch=self.name,
                    resource=self.full_name,
                    error=str(exc),
                    retry_in_s=round(max(delay, exc.retry_after or 0.0), 2),
                    failing_s=round(self.failing_for(), 1),
                    fix=fix_for(exc),
                )
                delay = await _back_off(delay, exc.retry_after or 0.0)
                continue
            delay, self.failing_since = 0.2, None
            fix = ""
            if not why:
                self.unread_by = None
                try:
                    await super().run()  # returns on a 403 or 404
                finally:
                    self.served = False
                ended = self.unread_by
                assert ended is not None
                if ended.status == FORBIDDEN:
                    why = f"the RBAC does not grant reading {self.full_name}"
                    fix = fix_for(ended)
                else:  # its definition deleted since
                    why = f"the API server does not serve {self.full_name}"
            self.optional_handler.unread(why)
            self.synced.set()
            if why != self._told:
                self._told = why
                if fix:
                    log.warning("custom resource not read", watch=self.name, why=why, fix=fix)
                else:
                    log.info("custom resource not read", watch=self.name, why=why, looked_for_every_s=self.rediscover_s)
            await asyncio.sleep(self.rediscover_s)
