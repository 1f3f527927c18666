"""GPU utilisation measured by DCGM, read through Prometheus, kept as a cached, timestamped view.

The scheduler never asks Prometheus anything while it decides.  A task polls it
(``UtilisationSource.poll_once``) every ``poll_s`` seconds in a worker thread (the client,
prometheus-api-client, is blocking) and keeps the last good answer with the time it was read.
A batch takes that view with ``current(max_age)``: a view older than that (Prometheus down,
the exporter gone, a query that no longer answers) is not used, and placement goes on as
though no GPU were busy.  What went wrong is logged once per change, with the cause, and
counted in ``gpusched_utilisation_polls_total{result="error"}``.

The query must return one sample per GPU carrying the node's name and the GPU's index as
labels (``Hostname`` and ``gpu`` in dcgm-exporter's output; both names can be changed, for a
Prometheus that relabels them).  Its value is a percentage, 0 to 100.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog

__all__ = [
    "DEFAULT_GPU_LABEL",
    "DEFAULT_NODE_LABEL",
    "UtilisationSource",
    "UtilisationView",
    "default_query",
    "parse_samples",
]

log = structlog.get_logger("gpusched.utilisation")

DEFAULT_NODE_LABEL = "Hostname"
"""dcgm-exporter's label for the node it runs on."""
DEFAULT_GPU_LABEL = "gpu"
"""dcgm-exporter's label for the GPU's index on its node (as ``nvidia-smi`` numbers them)."""


def default_query(node_label: str = DEFAULT_NODE_LABEL, gpu_label: str = DEFAULT_GPU_LABEL) -> str:
    """Each GPU's utilisation averaged over the last two minutes (one series per GPU, whatever
    pods dcgm-exporter names on it), of the samples that are percentages: DCGM now and then
    reports a value far above 100, which would lift the average out of range (and the GPU
    out of the answer) for two minutes."""
    return f"avg by ({node_label}, {gpu_label}) (avg_over_time((DCGM_FI_DEV_GPU_UTIL <= 100)[2m:15s]))"


@dataclass(frozen=True)
class UtilisationView:
    """Utilisation per GPU as one query answered it."""

    taken_at: float
    """When the answer arrived (by the source's clock: ``time.monotonic`` unless told)."""
    percent: Mapping[str, Mapping[int, float]]
    """Node name -> GPU index -> utilisation, 0..100."""

    def age(self, now: float) -> float:
        """Seconds since the answer arrived."""
        return max(0.0, now - self.taken_at)

    @property
    def gpus(self) -> int:
        """GPUs the answer covers."""
        return sum(len(g) for g in self.percent.values())

    def names_none_of(self, nodes: Collection[str]) -> bool:
        """Whether the answer names GPUs, of nodes all outside ``nodes`` (and there are some): its
        node label holds something other than the Kubernetes node name."""
        return bool(self.percent) and bool(nodes) and not any(n in nodes for n in self.percent)

    def strangers(self, nodes: Collection[str]) -> list[str]:
        """The names the answer gives that are no node of ``nodes``, sorted: an exporter whose
        node label holds its own pod's name, or a node gone since it was measured."""
        return sorted(n for n in self.percent if n not in nodes)

    def at_least(self, limit: float) -> dict[str, frozenset[int]]:
        """GPUs at ``limit`` percent or above, by node."""
        out = {node: frozenset(i for i, v in gpus.items() if v >= limit) for node, gpus in self.percent.items()}
        return {node: gpus for node, gpus in out.items() if gpus}

    def below(self, limit: float) -> dict[str, frozenset[int]]:
        """GPUs under ``limit`` percent, by node."""
        out = {node: frozenset(i for i, v in gpus.items() if v < limit) for node, gpus in self.percent.items()}
        return {node: gpus for node, gpus in out.items() if gpus}


def shown(url: str) -> str:
    """``url`` as logs may show it: a password in it masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def parse_samples(
    result: Any, node_label: str = DEFAULT_NODE_LABEL, gpu_label: str = DEFAULT_GPU_LABEL
) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Read the ``result`` of an instant query (``resultType`` vector): utilisation per node and
    GPU, and one line per sample left out, saying why.  A GPU given twice keeps its highest
    value (a query that does not aggregate over pods may return one series per pod)."""
    if not isinstance(result, list):
        return {}, [f"expected a list of samples (an instant vector), got {type(result).__name__}"]
    out: dict[str, dict[int, float]] = {}
    problems: list[str] = []
    for i, sample in enumerate(result):
        metric = sample.get("metric") if isinstance(sample, dict) else None
        value = sample.get("value") if isinstance(sample, dict) else None
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            problems.append(f"sample {i}: not a vector sample ({{'metric': ..., 'value': [time, value]}})")
            continue
        node, index = metric.get(node_label), metric.get(gpu_label)
        if not node:
            problems.append(f"sample {i} {_labels(metric)}: no {node_label!r} label (the node's name)")
            continue
        try:
            gpu = int(str(index))
        except ValueError:
            problems.append(f"sample {i} {_labels(metric)}: {gpu_label!r} label is not a GPU index: {index!r}")
            continue
        try:
            pct = float(value[1])
        except (TypeError, ValueError):
            problems.append(f"sample {i} {_labels(metric)}: value is not a number: {value[1]!r}")
            continue
        if math.isnan(pct) or not 0 <= pct <= 100:
            problems.append(f"sample {i} {_labels(metric)}: {pct} is not a percentage (0..100)")
            continue
        gpus = out.setdefault(str(node), {})
        gpus[gpu] = max(pct, gpus.get(gpu, 0.0))
    return out, problems


def _labels(metric: Mapping[str, Any]) -> str:
    return "{" + ",".join(f"{k}={v!r}" for k, v in sorted(metric.items())) + "}"


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\"()]+")
_HTTP_ERROR = re.compile(r"HTTP Status Code (\d+) \((b'.*'|b\".*\")\)$", re.DOTALL)
_TIMED_OUT = re.compile(r"(?:connect|read) timeout=([\d.]+)")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
"""An object's address in a message (``<HTTPConnection(...) at 0x7f...>``): new at every poll."""


_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""A bearer token (RFC 6750's b64token: a JWT is one)."""


class TokenFileError(Exception):
    """The bearer token to send Prometheus cannot be read."""


_AUTH_HINTS = {
    "401": ": it asks for credentials (--prometheus-bearer-token-file, or a user and password in the URL)",
    "403": ": the credentials sent are not allowed to query (the token's RBAC, or the proxy's policy)",
}


_NOT_PROMETHEUS = ": is the URL a Prometheus (its /api/v1/query)?"
"""The end of the cause of a 200 answer that is not Prometheus's."""


def _query_error(exc: Exception) -> str:
    """What went wrong with one query, in a line: Prometheus's own error text where it gave one."""
    text = str(exc)
    if isinstance(exc, TokenFileError):
        return text
    m = _HTTP_ERROR.match(text)  # prometheus-api-client: "HTTP Status Code 400 (b'<the body>')"
    if m is not None and m.group(1) in _AUTH_HINTS:  # a proxy in front of Prometheus (kube-rbac-proxy, oauth)
        return f"HTTP {m.group(1)} from Prometheus{_AUTH_HINTS[m.group(1)]}"
    if m is not None:
        try:
            answer = json.loads(ast.literal_eval(m.group(2)))
        except (ValueError, SyntaxError):
            return f"HTTP {m.group(1)} from Prometheus"
        if isinstance(answer, dict) and "error" in answer:
            return f"Prometheus refused the query ({answer.get('errorType', 'error')}): {answer['error']}"
        return f"HTTP {m.group(1)} from Prometheus"
    if isinstance(exc, ValueError) and "Expecting value" in text:  # a 200 answer that is no JSON
        return f"the answer is not JSON{_NOT_PROMETHEUS}"
    if isinstance(exc, (KeyError, IndexError, TypeError)):  # a 200 JSON answer without data.result
        return f"the answer is JSON without data.result, not a query's answer{_NOT_PROMETHEUS}"
    errno = _ERRNO.search(text)
    if isinstance(exc, OSError) and errno is not None:  # requests' ConnectionError: the cause, not the retry story
        return f"{type(exc).__name__}: {errno.group(0).strip()}"
    timeout = _TIMED_OUT.search(text)
    if isinstance(exc, OSError) and timeout is not None:  # the same each poll, not an object's address
        what = "connecting" if "connect" in type(exc).__name__.lower() or "Connection to" in text else "reading"
        return (
            f"{type(exc).__name__}: no answer {what} within {timeout.group(1)} s "
            "(a NetworkPolicy or firewall dropping packets, or Prometheus overloaded?)"
        )
    return f"{type(exc).__name__}: {_ADDRESS.sub('', text)}"


async def _detached(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a daemon thread of its own: unlike ``asyncio.to_thread`` (the loop's default
    executor, which ``asyncio.run`` joins on exit), a call still blocked when the loop ends
    holds nothing up.  One call at a time per source, so threads do not pile up."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)

    def run() -> None:
        try:
            out: tuple[bool, Any] = (True, fn())
        except Exception as exc:
            out = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *out)

    threading.Thread(target=run, name="gpusched-utilisation", daemon=True).start()
    return await done


class UtilisationSource:
    """Polls Prometheus for GPU utilisation and keeps the last good answer.

    ``query`` runs as an instant query; see the module's docstring for what it must return.
    ``on_poll(ok)`` is called after each poll (for the scheduler's own metrics).
    """

    def __init__(
        self,
        url: str,
        *,
        query: str | None = None,
        node_label: str = DEFAULT_NODE_LABEL,
        gpu_label: str = DEFAULT_GPU_LABEL,
        poll_s: float = 15.0,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_poll: Callable[[bool], None] | None = None,
        tell: bool = True,
        token_file: Path | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.url = url
        self.token_file = token_file
        """A file holding a bearer token sent with each query (read again at each poll: a
        service account's projected token is rotated in place)."""
        self.ca_file = ca_file
        """The CA bundle an https Prometheus's certificate is verified by (None: the system's)."""
        self._tell = tell
        """Log each change of outcome (a one-shot reader tells its user itself)."""
        self.shown_url = shown(url)
        """``url`` with any password in it masked: what logs and messages show."""
        self.query = query or default_query(node_label, gpu_label)
        self.node_label = node_label
        self.gpu_label = gpu_label
        self.poll_s = poll_s
        self.timeout_s = max(10.0, poll_s) if timeout_s is None else timeout_s
        """Per request (default: 10 s, or the poll interval when longer).  The request runs in a
        thread of its own that the process does not wait for, so a server that takes the
        connection and never answers delays no shutdown."""
        self._clock = clock
        self._on_poll = on_poll
        self._client: Any = None
        self.view: UtilisationView | None = None
        """The last good answer (None until the first)."""
        self.error = ""
        """Why the last poll failed ("" after a good one)."""
        self.refused = False
        """Whether Prometheus refused the query itself (bad syntax, an unknown function, or an
        error running it, such as many-to-many matching): no retry will do, the query must be
        fixed."""
        self.token_unreadable = False
        """Whether the last poll failed before it was sent: the bearer token file is unreadable,
        empty or holds no token; the file is to fix, not the address."""
        self.not_prometheus = False
        """Whether the last poll was answered, but not as Prometheus answers (not JSON, or no
        ``data.result``): the address is another server's."""
        self.answered = False
        """Whether the last poll got Prometheus's answer to its query (False: no connection, an
        HTTP error, an answer that is not Prometheus's, or the query refused); the answer may
        still hold no usable sample."""
        self._told: str | None = None  # the outcome last logged: each is logged once, until it changes

    def age(self) -> float:
        """Seconds since the last good answer (NaN before the first)."""
        return math.nan if self.view is None else self.view.age(self._clock())

    def current(self, max_age_s: float) -> UtilisationView | None:
        """The last good answer if it is at most ``max_age_s`` old, else None."""
        return self.view if self.age() <= max_age_s else None  # NaN (no answer) compares false

    def _ask(self) -> Any:
        """One instant query (blocking: runs in a worker thread)."""
        if self._client is None:
            from prometheus_api_client import PrometheusConnect  # only a scheduler told of Prometheus loads it
            from urllib3.util.retry import Retry

            # No retries inside the client: the next poll is the retry, and a poll must not
            # outlast its interval waiting on a server that is down.
            self._client = PrometheusConnect(self.url, retry=Retry(total=0), timeout=self.timeout_s)
            if self.ca_file is not None:
                self._client._session.verify = str(self.ca_file)  # the library's session: used for every query
        if self.token_file is not None:
            try:
                token = self.token_file.read_text(encoding="utf-8-sig").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenFileError(
                    f"cannot read the bearer token file {self.token_file}: {getattr(exc, 'strerror', None) or exc}"
                ) from None
            if not token:
                raise TokenFileError(f"the bearer token file {self.token_file} is empty")
            if not _TOKEN.fullmatch(token):  # told without the token: it is a credential
                raise TokenFileError(
                    f"the bearer token file {self.token_file} holds characters no bearer token has (spaces, line "
                    "breaks or control characters inside it): it must hold the token alone"
                )
            self._client.headers = {"Authorization": f"Bearer {token}"}
        return self._client.custom_query(self.query)

    async def poll_once(self) -> bool:
        """Ask once; on success replace the view.  Never raises for a failed query."""
        try:
            result = await _detached(self._ask)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = _query_error(exc)
            self.answered = False
            self._failed(f"cannot read GPU utilisation from {self.shown_url}: {why}")
            # Prometheus's own error on the query (HTTP 400 bad_data: it does not parse; 422
            # execution: it fails when run, such as many-to-many matching): the query's to fix.
            self.refused = why.startswith("Prometheus refused the query (")
            self.token_unreadable = isinstance(exc, TokenFileError)
            self.not_prometheus = why.endswith(_NOT_PROMETHEUS)
            return False
        self.refused = self.token_unreadable = self.not_prometheus = False
        self.answered = True
        percent, problems = parse_samples(result, self.node_label, self.gpu_label)
        if not percent and not problems:
            self._failed(
                "the utilisation query answered no sample: is dcgm-exporter scraped by this Prometheus, "
                f"and does the query name its metric? ({self.query})"
            )
            return False
        if problems and not percent:
            self._failed(
                f"the utilisation query answered no usable sample ({len(problems)} left out; first: {problems[0]}); "
                f"it must return one sample per GPU with the labels {self.node_label!r} and {self.gpu_label!r}"
            )
            return False
        self.view = UtilisationView(self._clock(), percent)
        self.error = ""
        told = f"read, {len(problems)} samples left out"
        if told != self._told and self._tell:
            log.info(
                "GPU utilisation read",
                url=self.shown_url,
                nodes=len(percent),
                gpus=self.view.gpus,
                left_out=len(problems),
                first_left_out=problems[0] if problems else None,
            )
            self._told = told
        if self._on_poll is not None:
            self._on_poll(True)
        return True

    def _failed(self, why: str) -> None:
        self.error = why
        if why != self._told and self._tell:
            log.warning("GPU utilisation not read; the last answer is used until it is too old", cause=why)
            self._told = why
        if self._on_poll is not None:
            self._on_poll(False)
