"""A watch given up part-way over TLS: its connection is cut at once, not left waiting on the
server's goodbye (a socket still waiting when the event loop stops is never closed)."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from pathlib import Path

from gpusched.kube import client
from tests.controlplane import _make_pki, _Pki

CUT_WAIT_S = 20.0
"""How long the server may take to see the connection cut (its thread can be slow to run on a
busy machine).  A connection the client leaves open stays so until the test ends."""


def _serve_one_watch(listener: socket.socket, ctx: ssl.SSLContext, cut: threading.Event) -> None:
    """Answer one watch with one event, then never speak again; ``cut`` is set once the client's
    socket is gone (end of stream or reset), which a TLS goodbye alone does not do."""
    raw, _ = listener.accept()
    with ctx.wrap_socket(raw, server_side=True) as tls:
        head = b""
        while b"\r\n\r\n" not in head:
            head += tls.recv(4096)
        line = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a"}}}).encode() + b"\n"
        tls.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(line):x}\r\n".encode()
            + line
            + b"\r\n"
        )
        # From here on the bytes under TLS: a goodbye is data; only a closed socket ends the read.
        with socket.fromfd(tls.fileno(), socket.AF_INET, socket.SOCK_STREAM) as under:
            under.settimeout(CUT_WAIT_S + 10)
            try:
                while under.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            except TimeoutError:
                return
            cut.set()


async def test_a_watch_given_up_part_way_closes_its_connection_at_once(tmp_path: Path) -> None:
    pki = _Pki.at(tmp_path / "pki")
    _make_pki(pki)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.serving_crt, pki.serving_key)
    listener = socket.create_server(("127.0.0.1", 0))
    cut = threading.Event()
    server = threading.Thread(target=_serve_one_watch, args=(listener, ctx, cut), daemon=True)
    server.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:{listener.getsockname()[1]}', "
        f"certificate-authority: '{pki.ca_crt}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    kube = await client.connect(kubeconfig, None, 100, 100)
    try:
        stream = kube.stream("/api/v1/configmaps", {}, timeout=60)
        event = await anext(stream)
        assert event["object"]["metadata"]["name"] == "a"
        await stream.aclose()  # given up: the reflector was cancelled, say
        # Cut at once, the server thread sees it within milliseconds; left open, never.
        assert await asyncio.to_thread(cut.wait, CUT_WAIT_S), "the connection stayed open after the watch was given up"
    finally:
        await kube.close()
        listener.close()
        server.join(15)
