"""A real Prometheus scraping a DCGM-format exporter that the tests run.

``DcgmExporter`` serves ``/metrics`` in dcgm-exporter's text format (its metric names and
labels: ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, the pod labels of its
Kubernetes mode), with the utilisation each test sets per node and GPU.  ``start_prometheus``
runs Debian's ``prometheus`` binary (``GPUSCHED_PROMETHEUS``, else ``prometheus`` on PATH) with
a one-second scrape of it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class PrometheusMissing(RuntimeError):
    """No prometheus binary to run."""


def find_prometheus() -> str:
    explicit = os.environ.get("GPUSCHED_PROMETHEUS")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise PrometheusMissing(f"GPUSCHED_PROMETHEUS={explicit} is not an executable file")
        return explicit
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusMissing("no prometheus on PATH (bash hack/prometheus.sh installs Debian's package)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DcgmExporter:
    """GPU utilisation and frame-buffer use per (node, GPU index), served as dcgm-exporter does."""

    util: dict[tuple[str, int], float] = field(default_factory=dict)
    pods: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    """(namespace, pod) dcgm-exporter names on a GPU in its Kubernetes mode."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def set(self, node: str, gpu: int, percent: float, pod: tuple[str, str] = ("", "")) -> None:
        with self._lock:
            self.util[(node, gpu)] = percent
            self.pods[(node, gpu)] = pod

    def drop(self, node: str) -> None:
        with self._lock:
            for key in [k for k in self.util if k[0] == node]:
                del self.util[key]
                self.pods.pop(key, None)

    def render(self) -> str:
        with self._lock:
            items = sorted(self.util.items())
            pods = dict(self.pods)
        lines = [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        ]
        fb = [
            "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
            "# TYPE DCGM_FI_DEV_FB_USED gauge",
        ]
        for (node, gpu), value in items:
            ns, pod = pods.get((node, gpu), ("", ""))
            labels = (
                f'gpu="{gpu}",UUID="GPU-{abs(hash((node, gpu))) % 10**12:012d}",device="nvidia{gpu}",'
                f'modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15",'
                f'container="{"main" if pod else ""}",namespace="{ns}",pod="{pod}"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value:g}")
            fb.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {int(value * 800)}")
        return "\n".join([*lines, *fb]) + "\n"

    def start(self) -> int:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return int(self._server.server_address[1])

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=5) as r:
            answer = json.load(r)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_for(self, promql: str, want: float, timeout: float = 30.0) -> None:
        """Until ``promql`` answers ``want`` (its first sample): a value the exporter was just
        given has been scraped."""
        deadline = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            got = self.query(promql)
            if got and float(got[0]["value"][1]) == want:
                return
            time.sleep(0.2)
        raise AssertionError(f"{promql} did not answer {want} in {timeout}s: {got}\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_prometheus(workdir: Path, exporter_port: int, binary: str | None = None) -> Prometheus:
    binary = binary or find_prometheus()
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: dcgm\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--query.lookback-delta=10s",  # a series the exporter stopped serving is gone soon
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return prom
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            prom.stop()
            raise RuntimeError(f"prometheus did not become ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
