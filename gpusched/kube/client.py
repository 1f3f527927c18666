"""One API connection with a bounded request rate, speaking JSON.

Requests go through kubernetes-asyncio's ``ApiClient`` (authentication, TLS,
token refresh) with ``_preload_content=False``: the JSON is decoded here and
handed on as plain dicts, without the generated model classes.  Every request
but a watch's stream waits on a token bucket of ``qps`` with ``burst``, the
same limits kube-scheduler's client takes (``--kube-api-qps``/``--kube-api-burst``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog

from gpusched.kube._k8s import ApiClient, Configuration, load_incluster_config, load_kube_config, refresh_token

__all__ = ["NOT_KUBERNETES", "ApiError", "Kube", "RateLimiter", "Response", "connect", "segment"]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


def segment(name: str) -> str:
    """``name`` as one segment of a request path, percent-encoded: a '?' or '#' in it would
    otherwise end the path, and the object asked for would be another.  What no encoding keeps
    one segment is refused (``ValueError``), as client-go refuses it: an empty name (the list
    instead of the object), '.' and '..' (folded into the path before they are sent), and names
    with '/' or '%' (the API server decodes them into the path)."""
    if name in ("", ".", "..") or "/" in name or "%" in name:
        raise ValueError(f"{name!r} cannot be the name of an object in a request path")
    return quote(name, safe="")


class ApiError(Exception):
    """A request the API server refused or that did not reach it."""

    def __init__(self, status: int, message: str, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        """Seconds the server asked us to wait before trying again (its ``Retry-After``), if any."""


@dataclass(frozen=True)
class Response:
    """Status and decoded body of one request."""

    status: int
    body: Any
    retry_after: float | None = None
    """The ``Retry-After`` of a 429 or 5xx answer, in seconds."""

    @property
    def ok(self) -> bool:
        """2xx."""
        return 200 <= self.status < 300

    def error(self) -> ApiError:
        """The API's own Status message as an exception."""
        body = self.body if isinstance(self.body, Mapping) else {}
        message = str(body.get("message") or self.body)
        return ApiError(self.status, message, str(body.get("reason") or ""), self.retry_after)


CERTIFICATE_UNTRUSTED = "CertificateUntrusted"
"""``ApiError.reason`` when the API server's certificate is signed by no CA the client trusts."""
CERTIFICATE_NAME_MISMATCH = "CertificateNameMismatch"
"""``ApiError.reason`` when the API server's certificate is not issued for the server's name."""
CERTIFICATE_OUT_OF_DATE = "CertificateOutOfDate"
"""``ApiError.reason`` when the API server's certificate has expired or is not valid yet."""

# OpenSSL's verify results (X509_V_ERR_*) that call for a fix other than the CA.
_NAME_MISMATCH = (62, 64)  # HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
_OUT_OF_DATE = (9, 10)  # CERT_NOT_YET_VALID, CERT_HAS_EXPIRED


def certificate_error(cause: BaseException) -> ApiError:
    """The API server's certificate was refused (status 0, as the server was not reached): why,
    with a reason that says which fix applies (``CERTIFICATE_*``)."""
    code = getattr(cause, "verify_code", None)
    why = str(getattr(cause, "verify_message", None) or cause).rstrip(".")
    if code in _NAME_MISMATCH:
        return ApiError(
            0, f"the API server's certificate is not issued for its address ({why})", CERTIFICATE_NAME_MISMATCH
        )
    if code in _OUT_OF_DATE:
        return ApiError(0, f"the API server's certificate is out of date ({why})", CERTIFICATE_OUT_OF_DATE)
    return ApiError(0, f"the API server's certificate is not trusted ({why})", CERTIFICATE_UNTRUSTED)


NOT_KUBERNETES = "NotKubernetes"
"""``ApiError.reason`` when a 2xx answer is not a Kubernetes object (a web page, a proxy's
banner): the server the client was given is not a Kubernetes API server."""


def _described(body: Any) -> str:
    """What an answer that is not a Kubernetes object is, in a few words."""
    if body is None:
        return "an empty answer"
    if isinstance(body, str):
        text = " ".join(body.split())
        return f"{'a web page' if text.startswith('<') else 'text'}: {text[:60]!r}"
    if isinstance(body, Mapping):
        return f"a JSON object without items: keys {', '.join(sorted(map(str, body))[:5]) or 'none'}"
    return f"a JSON {type(body).__name__}"


RETRY_AFTER_MAX_S = 30.0
"""Longest ``Retry-After`` honoured; a larger one waits this long (an HTTP date is not read: the
usual backoff applies)."""


def retry_after(status: int, value: str | None) -> float | None:
    """Seconds to wait from a 429 or 5xx answer's ``Retry-After`` header, as client-go reads it:
    only whole seconds count, and only on those statuses."""
    if value is None or not (status == 429 or status >= 500):
        return None
    try:
        seconds = int(value.strip())
    except ValueError:
        return None
    return float(min(max(seconds, 0), RETRY_AFTER_MAX_S))


class RateLimiter:
    """Token bucket: ``qps`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"client rate needs qps > 0 and burst >= 1, got qps={qps} burst={burst}")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._clock = clock
        self._stamp = clock()

    def available(self) -> float:
        """Tokens that could be spent now without waiting (negative while callers wait)."""
        return min(float(self.burst), self._tokens + (self._clock() - self._stamp) * self.qps)

    async def acquire(self) -> None:
        """Wait for a token.

        Each caller reserves its token at once (the balance may go negative) and then
        sleeps until the token exists, so the long-run rate is exactly ``qps`` and no
        lock is held while waiting.
        """
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now
        self._tokens -= 1
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.qps)


class Kube:
    """Requests against one API server."""

    def __init__(self, api: ApiClient, qps: float = 50.0, burst: int = 100) -> None:
        self.api = api
        self.limiter = RateLimiter(qps, burst)
        self.refresher: asyncio.Task[None] | None = None
        """Keeps a kubeconfig's exec-plugin (or gcp) token fresh, when it has one."""

    def sibling(self) -> Kube:
        """The same connection with a rate limiter of its own (same qps and burst).

        kube-scheduler sends Events through a client of their own; so do we, so that
        Events never wait for Bindings' rate limit, nor Bindings for theirs, and the two
        schedulers compare at equal client limits.  They share the connection pool: the daemon
        sends at most ``OUTBOX_WORKERS`` verdicts' writes at once, so that Events never hold
        the connections Bindings need.
        """
        return Kube(self.api, self.limiter.qps, self.limiter.burst)

    def apart(self) -> Kube:
        """A client with a connection pool and rate limiter of its own, on the same credentials
        (a token refreshed for this client is seen by both).  For the Lease: a renewal must
        not queue behind Bindings, conditions and Events for a connection.  Close it too."""
        return Kube(ApiClient(configuration=self.api.configuration), self.limiter.qps, self.limiter.burst)

    async def close(self) -> None:
        """Close the connection pool (and stop refreshing the token)."""
        if self.refresher is not None:
            self.refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.refresher
        await self.api.close()

    async def _raw(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = 30.0,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": JSON, "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            resp: aiohttp.ClientResponse = await self.api.call_api(
                path,
                method,
                query_params=params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            raise certificate_error(exc.certificate_error) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiError(0, f"cannot reach the API server: {exc}", "Unreachable") from exc
        return resp

    async def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = 30.0,
        before_send: Callable[[], None] | None = None,
        deadline: Callable[[], float] | None = None,
    ) -> Response:
        """One rate-limited request; the body is decoded JSON (or text when it is not JSON).
        ``before_send`` runs once the rate limiter lets the request go, and may raise to stop
        it: what held when the request was queued may not hold seconds later.  ``deadline``,
        read at the same moment, is how many seconds the request may still take: it shortens
        ``timeout`` and goes to the API server as the request's own ``timeout``, so that one
        still queued there is dropped (one already being written may still land: a caller for
        whom that matters reads the object back)."""
        await self.limiter.acquire()
        if before_send is not None:
            before_send()
        left = deadline() if deadline is not None else math.inf
        if left < (timeout or math.inf):
            timeout = max(left, 0.001)
            query = {**(query or {}), "timeout": f"{timeout:.3f}s"}
        resp = await self._raw(method, path, query, body, content_type, timeout)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"connection lost reading {path}: {exc}", "Unreachable") from exc
        finally:
            _let_go(resp)
        try:
            decoded: Any = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode("utf-8", "replace")
        return Response(resp.status, decoded, retry_after(resp.status, resp.headers.get("Retry-After")))

    async def warm(self, connections: int) -> None:
        """Hold ``connections`` open to the API server, ready for a burst of requests.

        Each sends one ``GET /version`` at once, so the pool opens (or reuses) that many
        connections; an idle pooled connection closes after 15 seconds, so a caller repeats
        this more often while idle.  Outside the rate limit: keeping connections open is not
        load on the API server any more than the watches' own connections are.
        """

        async def one() -> None:
            with contextlib.suppress(ApiError, aiohttp.ClientError, OSError, TimeoutError):
                resp = await self._raw("GET", "/version", timeout=5.0)
                try:
                    await resp.read()
                finally:
                    _let_go(resp)

        await asyncio.gather(*(one() for _ in range(connections)))

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> Any:
        """GET and raise ``ApiError`` unless 2xx with a Kubernetes object (a JSON object): a web
        page answering 200 is a server that is not an API server, and is told so
        (``NOT_KUBERNETES``)."""
        r = await self.request("GET", path, query)
        if not r.ok:
            raise r.error()
        if not isinstance(r.body, Mapping):
            raise self.not_kubernetes(path, r)
        return r.body

    def not_kubernetes(self, path: str, r: Response, what: str = "") -> ApiError:
        """The error for an answer ``r`` to ``GET path`` that is not what a Kubernetes API server
        sends (``what`` it is instead; by default, from its body)."""
        host = getattr(getattr(self.api, "configuration", None), "host", None) or "the API server"
        return ApiError(
            r.status,
            f"the answer from {host} to GET {path} is not a Kubernetes object ({what or _described(r.body)})",
            NOT_KUBERNETES,
        )

    async def list(
        self,
        path: str,
        query: Mapping[str, Any] | None = None,
        page: int = 500,
        each: Callable[[Any], Any] | None = None,
    ) -> tuple[list[Any], str]:
        """Every item of a list, fetched in pages; with the list's resourceVersion.  ``each``,
        when given, is applied to every item as its page arrives (so that what is not kept is
        let go page by page, not after the whole list)."""
        items: list[Any] = []
        cont: str | None = None
        while True:
            body = await self.get(path, {**(query or {}), "limit": page, "continue": cont})
            found = body.get("items")
            if not isinstance(found, list) and not (found is None and "items" in body):
                what = "a JSON object whose items is not a list" if "items" in body else ""
                raise self.not_kubernetes(path, Response(200, body), what)
            if not all(isinstance(item, Mapping) for item in found or ()):
                raise self.not_kubernetes(path, Response(200, body), "a list whose items are not all JSON objects")
            found = found or ()
            items.extend(found if each is None else map(each, found))
            meta: Mapping[str, Any] = body.get("metadata") or {}
            cont = meta.get("continue") or None
            if cont is None:
                return items, str(meta.get("resourceVersion", ""))

    async def stream(self, path: str, query: Mapping[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        """A watch: decoded events until the server ends the stream.

        Raises ``ApiError`` when the watch is refused (e.g. 410 Gone for an expired
        resourceVersion), the connection breaks, or nothing arrives for ``WATCH_IDLE_S``
        (the server sends a bookmark about once a minute: a longer silence is a connection
        that died without a word).
        """
        await self.limiter.acquire()
        resp = await self._raw("GET", path, {**query, "watch": "true"}, timeout=timeout)
        try:
            if resp.status != 200:
                try:
                    data = await resp.read()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise ApiError(0, f"watch {path} refused ({resp.status}), answer unreadable: {exc}") from exc
                try:
                    body = json.loads(data)
                except ValueError:
                    body = {"message": data.decode("utf-8", "replace")}
                raise Response(resp.status, body, retry_after(resp.status, resp.headers.get("Retry-After"))).error()
            while True:
                try:
                    # Not wait_for: on Python 3.11 it returns the line when the line and a
                    # cancellation (the shutdown's) come in the same turn, and the watch goes on.
                    async with asyncio.timeout(WATCH_IDLE_S):
                        line = await resp.content.readline()
                except TimeoutError:
                    # A quiet resource (a watch by name gets no bookmarks) or a connection gone
                    # half-open: either way the watch ends as at its timeout and is opened again
                    # from the last version; a dead connection fails then, and is told.
                    log.debug("watch silent; opened again", path=path, silent_s=WATCH_IDLE_S)
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    raise ApiError(0, f"watch {path} broke: {exc}", "Unreachable") from exc
                if not line:
                    return
                if line.strip():
                    try:
                        event = json.loads(line)
                    except ValueError as exc:  # cut off mid-line: resumed from the last version, as a break is
                        raise ApiError(
                            0, f"watch {path} sent a line that is not JSON: {line[:80]!r}", "Unreachable"
                        ) from exc
                    yield event
        finally:
            _let_go(resp)


def _let_go(resp: aiohttp.ClientResponse) -> None:
    """Hand a response's connection back; one given up before its end is cut at once.

    A connection closed part-way has nothing more to say to the server: a TLS goodbye would
    keep its socket open until the server answers (up to 30 s), and one still waiting when
    the event loop stops is never closed at all.
    """
    if not resp.content.is_eof() and resp.connection is not None and resp.connection.transport is not None:
        resp.connection.transport.abort()
    resp.release()


log = structlog.get_logger("gpusched.kube")

WATCH_IDLE_S = 150.0
"""Longest silence on a watch before it is opened again, quietly (bookmarks come every minute,
but not to a watch by name)."""


def connection_limit(qps: float) -> int:
    """Connections to keep: as many for Events as for binds (``bind_concurrency``), plus 8 for
    watches; at most 128.

    Each TLS connection holds a 256 KiB read buffer; the client library's default of
    100 costs 25 MiB that a 50-qps scheduler never needs.  The cap keeps a raised client
    limit from paying 100 MiB for a pool it cannot fill: 120 connections carry 1,000 requests
    a second at 0.12 s each.
    """
    return 8 + min(2 * bind_concurrency(qps), 120)


def bind_concurrency(qps: float) -> int:
    """Binds sent at once: half a second of the client's rate, at least 8, at most 100.

    That carries ``qps`` binds a second at up to 0.5 s each, which is what a Binding takes
    while the API server is flooded with the creates of a burst; with fewer, the client's
    tokens pile up past its burst and are lost.  Each needs a connection of its own (HTTP/1.1),
    which the scheduler keeps open while idle (``Kube.warm``), so that a burst does not
    wait for as many TLS handshakes.
    """
    return max(8, min(math.ceil(qps / 2), 100))


class CredentialsError(Exception):
    """No usable client configuration; the message says where it came from and what to pass."""


async def connect(kubeconfig: Path | None, context: str | None, qps: float, burst: int) -> Kube:
    """A client from ``kubeconfig`` (and ``context``), else from the pod's service account.
    Raises ``CredentialsError`` when neither can be read."""
    cfg = type.__call__(Configuration)  # a fresh one, not a copy of the library's global default
    try:
        if kubeconfig is None:
            load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            loader = await load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
    except Exception as exc:  # the loader's ConfigException, YAML errors, unreadable files
        if kubeconfig is None:
            raise CredentialsError(
                f"the pod's service account cannot be read: {exc}; mount its token "
                "(automountServiceAccountToken) or pass --kubeconfig PATH"
            ) from None
        raise CredentialsError(
            f"kubeconfig {kubeconfig}: {_reason(exc)}; {_kubeconfig_fix(kubeconfig, context)}"
        ) from None
    cfg.connection_pool_maxsize = connection_limit(qps)
    kube = Kube(ApiClient(configuration=cfg), qps, burst)
    if kubeconfig is not None and (loader.provider == "gcp" or "exec" in (loader._user or {})):
        # A credential plugin's token expires (EKS, GKE: minutes to an hour): run the plugin
        # again before it does, or every request would be refused from then on.
        kube.refresher = asyncio.create_task(_keep_token(loader, cfg), name="token-refresh")
    return kube


def _reason(exc: Exception) -> str:
    """The loader's complaint; a file it could not make sense of (an empty one) raises a bare
    ``TypeError`` or ``AttributeError`` whose text says nothing to the user."""
    import yaml

    from gpusched.config import yaml_problem  # only on this error path: it brings in pydantic

    if isinstance(exc, (TypeError, AttributeError, KeyError)):
        return "not a kubeconfig the client can read"
    if isinstance(exc, yaml.YAMLError):
        return f"not valid YAML: {yaml_problem(exc)}"
    return str(exc)


def _kubeconfig_fix(path: Path, context: str | None) -> str:
    """What to do about a kubeconfig the client could not load, from what the file holds."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "check that the file is a readable kubeconfig (YAML, as `kubectl config view --raw` prints)"
    listed = doc.get("contexts") if isinstance(doc, dict) else None
    contexts = (
        [str(c["name"]) for c in listed if isinstance(c, dict) and c.get("name")] if isinstance(listed, list) else []
    )
    if not contexts:
        return "it lists no contexts: pass a kubeconfig (as `kubectl config view --raw` prints)"
    names = ", ".join(contexts)
    if context is not None and context not in contexts:
        return f"check --context against its contexts: {names}"
    if context is None and not doc.get("current-context"):
        return f"pass --context NAME, one of its contexts: {names}"
    return f"check the cluster and user of the context against the file (contexts: {names})"


async def _keep_token(loader: Any, cfg: Configuration) -> None:
    """``refresh_token`` forever; a plugin that fails is logged and run again at the next check."""
    while True:
        try:
            await refresh_token(loader, cfg, TOKEN_CHECK_S)
        except Exception as exc:  # the plugin's own failure: requests will say 401 meanwhile
            log.warning("token refresh failed", error=repr(exc))


TOKEN_CHECK_S = 30.0
"""How often a kubeconfig's plugin token is checked (and fetched again when near its expiry)."""
