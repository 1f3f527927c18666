"""GPU utilisation read from Prometheus: the answer parsed, its age checked, failures told."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpusched.metrics.source import UtilisationSource, UtilisationView, default_query, parse_samples
from tests.controlplane import _make_pki, _Pki
from tests.promstack import DcgmExporter, Prometheus, free_port


def sample(value: object, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [1733500000.0, value]}


def test_samples_are_read_per_node_and_gpu() -> None:
    got, problems = parse_samples(
        [sample("97.5", Hostname="a", gpu="0"), sample("3", Hostname="a", gpu="1"), sample("0", Hostname="b", gpu="0")]
    )
    assert got == {"a": {0: 97.5, 1: 3.0}, "b": {0: 0.0}}
    assert problems == []


def test_a_gpu_given_twice_keeps_its_highest_value() -> None:
    got, _ = parse_samples([sample("20", Hostname="a", gpu="0", pod="x"), sample("80", Hostname="a", gpu="0", pod="y")])
    assert got == {"a": {0: 80.0}}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (sample("5", gpu="0"), "no 'Hostname' label"),
        (sample("5", Hostname="a", gpu="first"), "'gpu' label is not a GPU index: 'first'"),
        (sample("5", Hostname="a"), "'gpu' label is not a GPU index: None"),
        (sample("NaN", Hostname="a", gpu="0"), "nan is not a percentage"),
        (sample("140", Hostname="a", gpu="0"), "140.0 is not a percentage"),
        (sample("high", Hostname="a", gpu="0"), "value is not a number: 'high'"),
        ({"metric": {}}, "not a vector sample"),
    ],
)
def test_a_sample_that_cannot_be_used_is_left_out_with_the_reason(bad: dict[str, object], why: str) -> None:
    got, problems = parse_samples([sample("50", Hostname="ok", gpu="1"), bad])
    assert got == {"ok": {1: 50.0}}
    assert len(problems) == 1
    assert problems[0].startswith("sample 1")
    assert why in problems[0]


def test_labels_of_another_name_are_read_when_told() -> None:
    got, problems = parse_samples([sample("12", node="n1", gpu_index="3")], node_label="node", gpu_label="gpu_index")
    assert got == {"n1": {3: 12.0}}
    assert problems == []
    assert default_query("node", "gpu_index").startswith("avg by (node, gpu_index) (")


def test_a_matrix_answer_is_refused_whole() -> None:
    got, problems = parse_samples({"resultType": "matrix"})
    assert got == {}
    assert problems == ["expected a list of samples (an instant vector), got dict"]


def test_the_view_says_which_gpus_are_busy_and_which_idle_and_how_old_it_is() -> None:
    view = UtilisationView(100.0, {"a": {0: 95.0, 1: 90.0, 2: 89.9}, "b": {0: 4.0}})
    assert view.at_least(90) == {"a": frozenset({0, 1})}
    assert view.below(5) == {"b": frozenset({0})}
    assert view.gpus == 4
    assert view.age(130.0) == 30.0
    assert view.age(90.0) == 0.0  # a clock stepped back: never negative


def test_an_answer_too_old_is_not_used() -> None:
    now = [1000.0]
    src = UtilisationSource("http://127.0.0.1:1", clock=lambda: now[0])
    assert src.current(120) is None  # nothing read yet
    src.view = UtilisationView(1000.0, {"a": {0: 99.0}})
    now[0] = 1120.0
    assert src.current(120) is src.view
    now[0] = 1120.5
    assert src.current(120) is None


async def test_a_prometheus_that_does_not_answer_is_told_once_and_the_last_view_kept() -> None:
    polls: list[bool] = []
    src = UtilisationSource(f"http://127.0.0.1:{free_port()}", timeout_s=2, on_poll=polls.append)
    kept = UtilisationView(0.0, {"a": {0: 50.0}})
    src.view = kept
    with capture_logs() as logs:
        assert not await src.poll_once()
        assert not await src.poll_once()
    assert polls == [False, False]
    assert src.view is kept
    assert src.error.startswith(f"cannot read GPU utilisation from {src.url}: ConnectionError")
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert len(warnings) == 1, logs  # the same cause is not repeated every poll
    assert warnings[0]["cause"] == src.error


async def test_utilisation_is_read_from_a_real_prometheus(prometheus: Prometheus, dcgm: DcgmExporter) -> None:
    node = f"util-{uuid.uuid4().hex[:8]}"
    dcgm.set(node, 0, 97, pod=("team-a", "train-0"))
    dcgm.set(node, 1, 2)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}",gpu="1"}}', 2)
    polls: list[bool] = []
    src = UtilisationSource(prometheus.url, on_poll=polls.append)  # the shipped query: 2-minute averages
    # Its subquery looks at the series every 15 s on the clock: a series first scraped since
    # the last such step is answered from the next one.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # (other tests' nodes may be answered first)
        if await src.poll_once() and src.view is not None and node in src.view.percent:
            break
        await asyncio.sleep(1)
    assert src.view is not None, src.error
    assert polls[-1] is True
    assert src.view.percent[node] == {0: 97.0, 1: 2.0}
    assert src.view.at_least(90)[node] == frozenset({0})
    assert src.current(120) is src.view


async def test_a_query_prometheus_refuses_is_told_with_its_reason(prometheus: Prometheus) -> None:
    src = UtilisationSource(prometheus.url, query="avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL[2m]")
    assert not await src.poll_once()
    assert "Prometheus refused the query (bad_data):" in src.error
    assert "parse error" in src.error
    assert src.view is None


async def test_a_query_without_the_labels_is_told_what_it_must_return(prometheus: Prometheus) -> None:
    src = UtilisationSource(prometheus.url, query="vector(42)")
    assert not await src.poll_once()
    assert "no usable sample (1 left out; first: sample 0 {}: no 'Hostname' label" in src.error
    assert "with the labels 'Hostname' and 'gpu'" in src.error


async def test_an_answer_with_no_sample_is_a_failed_poll(prometheus: Prometheus) -> None:
    polls: list[bool] = []
    src = UtilisationSource(
        prometheus.url, query="avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTILL)", on_poll=polls.append
    )
    assert not await src.poll_once()
    assert polls == [False]
    assert src.error.startswith("the utilisation query answered no sample: is dcgm-exporter scraped")
    assert src.view is None


async def test_a_server_that_is_not_a_prometheus_is_told_so(dcgm: DcgmExporter) -> None:
    src = UtilisationSource(f"http://127.0.0.1:{dcgm.port}")  # answers 200 with text, not JSON
    assert not await src.poll_once()
    assert src.error.endswith("the answer is not JSON: is the URL a Prometheus (its /api/v1/query)?")


async def test_a_password_in_the_url_is_not_logged() -> None:
    src = UtilisationSource(f"http://gpusched:s3cret@127.0.0.1:{free_port()}", timeout_s=2)
    assert src.shown_url.startswith("http://gpusched:***@127.0.0.1:")
    with capture_logs() as logs:
        assert not await src.poll_once()
    assert logs
    assert "s3cret" not in repr(logs)
    assert "s3cret" not in src.error


ANSWER = json.dumps(
    {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"Hostname": "n0", "gpu": "0"}, "value": [0, "50"]}]},
    }
).encode()


class Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # a Prometheus that answers in 0.3 s
        time.sleep(0.3)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    do_POST = do_GET

    def log_message(self, *a: object) -> None:
        pass


async def test_a_prometheus_whose_connections_time_out_is_told_once_in_a_line() -> None:
    # A listener whose accept queue is full drops new connections, as a firewall would.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    queued = []
    for _ in range(5):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        queued.append(c)
    try:
        src = UtilisationSource(f"http://127.0.0.1:{port}", timeout_s=0.5)
        with capture_logs() as logs:
            for _ in range(3):
                assert not await src.poll_once()
    finally:
        for c in (*queued, srv):
            c.close()
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert len(warnings) == 1, [w["cause"] for w in warnings]  # not once a poll
    assert warnings[0]["cause"].endswith(
        "ConnectTimeout: no answer connecting within 0.5 s (a NetworkPolicy or firewall dropping packets, "
        "or Prometheus overloaded?)"
    )


async def test_a_short_poll_interval_does_not_make_a_slowish_prometheus_unreadable() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert await UtilisationSource(url, poll_s=15).poll_once()
        src = UtilisationSource(url, poll_s=0.2)  # --utilisation-poll 0.2
        assert await src.poll_once(), src.error
    finally:
        srv.shutdown()
        srv.server_close()


async def test_a_sample_dcgm_garbled_does_not_hide_a_busy_gpu_for_two_minutes(
    prometheus: Prometheus, dcgm: DcgmExporter
) -> None:
    # DCGM now and then reports a value far above 100 for one scrape; averaged in, the GPU's
    # two-minute figure would leave 0..100 and the GPU the answer.  The shipped query averages
    # the samples that are percentages.
    node = f"garbled-{uuid.uuid4().hex[:8]}"
    dcgm.set(node, 0, 200000)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}",gpu="0"}}', 200000)
    dcgm.set(node, 0, 95)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}",gpu="0"}}', 95)
    src = UtilisationSource(prometheus.url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if await src.poll_once() and src.view is not None and node in src.view.percent:
            break
        await asyncio.sleep(1)
    assert src.view is not None, src.error
    assert src.view.at_least(90).get(node) == frozenset({0}), src.view.percent.get(node)


class _AuthProxy:
    """What kube-rbac-proxy (or an OAuth proxy) does in front of a Prometheus: https with a
    certificate of its own CA, and a bearer token asked for (401 without one, 403 for another)."""

    def __init__(self, upstream: str, pki: Path, token: str) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                sent = self.headers.get("Authorization")
                if sent is None:
                    self._answer(401, b'{"error": "no token"}')
                elif sent != f"Bearer {proxy.token}":
                    self._answer(403, b'{"error": "forbidden"}')
                else:
                    with urllib.request.urlopen(f"{upstream}{self.path}", timeout=10) as r:
                        self._answer(200, r.read())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.token = token
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_prometheus_behind_a_proxy_is_read_with_the_token_file_and_its_ca(
    prometheus: Prometheus, dcgm: DcgmExporter, tmp_path: Path
) -> None:
    pki = _Pki.at(tmp_path / "pki")
    _make_pki(pki)
    node = f"auth-{uuid.uuid4().hex[:8]}"
    dcgm.set(node, 0, 55)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}",gpu="0"}}', 55)
    proxy = _AuthProxy(prometheus.url, pki.directory, "s3cret")
    token = tmp_path / "token"
    token.write_text("s3cret\n")  # as a projected service account token ends
    query = f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}"}}'
    try:
        src = UtilisationSource(proxy.url, query=query, token_file=token, ca_file=pki.ca_crt)
        assert await src.poll_once(), src.error
        assert src.view is not None
        assert src.view.percent == {node: {0: 55.0}}
        token.write_text("rotated-and-not-allowed")  # read again at the next poll
        assert not await src.poll_once()
        assert src.error.endswith(
            "HTTP 403 from Prometheus: the credentials sent are not allowed to query (the token's RBAC, or the "
            "proxy's policy)"
        )
        token.unlink()
        assert not await src.poll_once()
        assert src.error.endswith(f"cannot read the bearer token file {token}: No such file or directory")
        bare = UtilisationSource(proxy.url, query=query, ca_file=pki.ca_crt)
        assert not await bare.poll_once()
        assert "HTTP 401 from Prometheus: it asks for credentials (--prometheus-bearer-token-file" in bare.error
        untrusted = UtilisationSource(proxy.url, query=query, token_file=tmp_path / "none")
        (tmp_path / "none").write_text("s3cret")
        assert not await untrusted.poll_once()  # the system's CAs do not know the proxy's
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.error
    finally:
        proxy.stop()


async def test_a_token_file_that_holds_more_than_a_token_is_told_without_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("\ufeffsecret-abc\nsecond-line\n")  # a BOM, and a second line
    src = UtilisationSource(f"http://127.0.0.1:{free_port()}", token_file=token)
    assert not await src.poll_once()
    assert src.error.endswith(
        f"the bearer token file {token} holds characters no bearer token has (spaces, line breaks or control "
        "characters inside it): it must hold the token alone"
    )
    assert "secret" not in src.error
