"""The ``gpusched`` command line: the demo simulation and its one-line input errors."""

from __future__ import annotations

import contextlib
import http.server
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpusched import __version__, cli, logs
from gpusched.cli import MAX_SEEDS, build_parser, main, parse_seeds
from tests.controlplane import _make_pki, _Pki

ROOT = Path(__file__).resolve().parents[1]
DEMO = Path(str(resources.files("gpusched.sim") / "demo"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REQUIRED_KEYS = {
    "policy",
    "batch",
    "seeds",
    "alloc_pct_100",
    "alloc_pct_130",
    "alloc_pct_130_std",
    "unallocated_gpus_130",
    "frag_ratio_pct_70",
    "frag_ratio_pct_90",
    "solve_ms_p50",
    "solve_ms_p99",
    "gap_pct_max",
    "failed_pods",
    "trace",
    "fgd_published_alloc_pct_130",
}
TINY_CONFIG = "solver:\n  timeLimitSeconds: 0.2\n  workers: 1\n"
FAST = ["--policy", "fgd,bestfit", "--seeds", "42", "--no-progress"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "solver.yaml"
    path.write_text(TINY_CONFIG, encoding="utf-8")
    return path


def summary(out: Path) -> list[dict[str, Any]]:
    data = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(data, list)
    return data


def rejected(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv``, expect exit code 2 and return the single stderr line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert code == 2, captured
    message = captured.err.strip()
    assert message
    assert "\n" not in message, message
    assert "Traceback" not in message
    return message


def test_demo_files_are_bundled() -> None:
    nodes = (DEMO / "nodes.csv").read_text(encoding="utf-8").splitlines()
    pods = (DEMO / "pods.csv").read_text(encoding="utf-8").splitlines()
    assert nodes[0] == "sn,cpu_milli,memory_mib,gpu,model"
    assert pods[0] == "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
    assert 100 <= len(nodes) - 1 <= 140
    assert 900 <= len(pods) - 1 <= 1100
    readme = (DEMO / "README.md").read_text(encoding="utf-8")
    assert "github.com/alibaba/clusterdata" in readme
    assert "USENIX ATC 2023" in readme


def test_demo_runs_and_writes_summary_and_plot(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["simulate", *FAST, "--config", str(config), "--out", str(out)]) == 0
    data = summary(out)
    assert [s["policy"] for s in data] == ["fgd", "bestfit"]
    for s in data:
        assert set(s) >= REQUIRED_KEYS, REQUIRED_KEYS - set(s)
        assert s["seeds"] == [42]
        assert s["batch"] == 16
        assert s["trace"] == "demo"
        assert isinstance(s["alloc_pct_130"], float)
        assert 50 < s["alloc_pct_130"] <= 100
        assert s["alloc_pct_100"] <= s["alloc_pct_130"]
    assert (out / "allocation.png").read_bytes().startswith(PNG_MAGIC)
    printed = capsys.readouterr().out
    assert "fgd" in printed
    assert "bestfit" in printed
    assert "summary.json" in printed


def test_cpsat_on_the_demo(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--policy", "cpsat", "--seeds", "42", "--batch", "16", "--no-progress"]
    assert main([*argv, "--config", str(config), "--out", str(out)]) == 0
    (s,) = summary(out)
    assert s["policy"] == "cpsat"
    assert s["batch"] == 16
    assert s["solve_ms_p99"] is not None
    assert s["gap_pct_max"] is not None


def test_cpsat_can_be_given_the_trace_typical_pods(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--policy", "cpsat,fgd", "--seeds", "42", "--batch", "16", "--no-progress"]
    assert main([*argv, "--typical", "trace", "--config", str(config), "--out", str(out)]) == 0
    cpsat, fgd = summary(out)
    assert cpsat["typical"] == "trace"
    assert "typical" not in fgd  # FGD is always given the trace's typical pods
    assert 50 < cpsat["alloc_pct_130"] <= 100


def test_parallel_runs_give_the_same_allocation(tmp_path: Path) -> None:
    argv = ["simulate", "--policy", "bestfit,fgd", "--seeds", "42", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "seq")]) == 0
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "par")]) == 0
    timing = {"solve_ms_p50", "solve_ms_p99"}
    seq = [{k: v for k, v in s.items() if k not in timing} for s in summary(tmp_path / "seq")]
    par = [{k: v for k, v in s.items() if k not in timing} for s in summary(tmp_path / "par")]
    assert seq == par


def test_published_numbers_are_attached_for_openb_traces(tmp_path: Path) -> None:
    nodes = shutil.copy(DEMO / "nodes.csv", tmp_path / "openb_node_list_gpu_node.csv")
    pods = shutil.copy(DEMO / "pods.csv", tmp_path / "openb_pod_list_sample.csv")
    published = tmp_path / "published.csv"
    published.write_text(
        "trace,policy,seeds,alloc_pct_at_arrival100,alloc_pct_at_arrival130\n"
        "sample,FGD,10,95.0,95.5\nsample,BestFit,10,92.5,92.75\nother,FGD,10,1,2\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), *FAST, "--published", str(published)]
    assert main([*argv, "--out", str(out)]) == 0
    by_policy = {s["policy"]: s for s in summary(out)}
    assert by_policy["fgd"]["trace"] == "sample"
    assert by_policy["fgd"]["fgd_published_alloc_pct_130"] == 95.5
    assert by_policy["bestfit"]["fgd_published_alloc_pct_130"] == 92.75


def test_parse_seeds() -> None:
    assert parse_seeds("42-45") == [42, 43, 44, 45]
    assert parse_seeds("42,43") == [42, 43]
    assert parse_seeds("7") == [7]
    assert parse_seeds("42-43, 50,42") == [42, 43, 50]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["simulate", "--policy", "fgd,nosuch"], "unknown policy 'nosuch'; choose from cpsat, fgd, bestfit"),
        (["simulate", "--policy", ","], "no policy given"),
        (["simulate", "--seeds", "51-42"], "runs backwards; write 42-51"),
        (["simulate", "--seeds", "forty"], "use a range like 42-51 or a list like 42,43"),
        (["simulate", "--seeds", "42,,43"], "empty item"),
        (["simulate", "--seeds", "2147483648"], "'2147483648': seeds run from 0 to 2147483647"),
        (["simulate", "--seeds", "42--43"], "'42--43': seeds run from 0 to 2147483647"),
        (["simulate", "--batch", "0"], "argument --batch: must be at least 1"),
        (["simulate", "--jobs", "x"], "argument --jobs: expected a whole number"),
        (["simulate", "--tune", "-1"], "argument --tune: must be a positive number"),
        (
            ["simulate", "--tune", "130"],
            "argument --tune: 130 times the cluster's GPUs is more than 10; it is a multiple",
        ),
        (["simulate", "--tune", "10.5"], "argument --tune: 10.5 times the cluster's GPUs is more than 10"),
        (
            ["simulate", "--tune", "130%"],
            "argument --tune: 130% is a percent; --tune is a multiple of the cluster's GPUs: write 1.3 for 130 %",
        ),
        (["run", "--metrics-port", "65536"], "argument --metrics-port: must be 0..65535"),
        (["run", "--lease-duration", "0"], "argument --lease-duration: must be a positive number, got '0'"),
        (["run", "--retry-period", "inf"], "argument --retry-period: must be a positive number, got 'inf'"),
        (["run", "--namespace", ""], "argument --namespace: must not be empty"),
        (["run", "--lease-name", " "], "argument --lease-name: must not be empty"),
        (["explain", "p", "--scheduler-name", ""], "argument --scheduler-name: must not be empty"),
        (
            ["run", "--scheduler-name", "GPU-Scheduler"],
            "argument --scheduler-name: 'GPU-Scheduler' is not a scheduler name: scheduler names are lower-case "
            "letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters "
            "(did you mean 'gpu-scheduler'?)",
        ),
        (["run", "--scheduler-name", "a,b=c"], "'a,b=c' is not a scheduler name"),
        (["simulate", "--typical", "history"], "argument --typical: invalid choice: 'history'"),
        (["simulate", "--pods", "pods.csv"], "pass both --nodes and --pods"),
        (["bogus"], "invalid choice: 'bogus'"),
    ],
)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert expected in rejected(capsys, argv)


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.csv"
    nodes = str(DEMO / "nodes.csv")
    message = rejected(capsys, ["simulate", "--nodes", str(missing), "--pods", str(DEMO / "pods.csv")])
    assert f"--nodes {missing}: no such file" in message
    message = rejected(capsys, ["simulate", "--nodes", nodes, "--pods", str(missing)])
    assert f"--pods {missing}: no such file" in message
    message = rejected(capsys, ["simulate", "--config", str(missing)])
    assert f"--config {missing}: no such file" in message
    message = rejected(capsys, ["simulate", "--published", str(missing)])
    assert f"--published {missing}: no such file" in message
    message = rejected(capsys, ["simulate", "--nodes", str(tmp_path), "--pods", nodes])
    assert "not a file" in message


LONG_NAME = "a" * 300
"""A file name longer than any file system takes (255 bytes): looking it up fails with ENAMETOOLONG."""


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["simulate", *FAST, "--out", "{long}"], "--out"),
        (["simulate", "--nodes", "{long}", "--pods", str(DEMO / "pods.csv")], "--nodes"),
        (["simulate", "--nodes", str(DEMO / "nodes.csv"), "--pods", "{long}"], "--pods"),
        (["simulate", "--config", "{long}"], "--config"),
        (["simulate", "--published", "{long}"], "--published"),
        (["check-config", "{long}"], "file"),
        (["run", "--config", "{long}"], "--config"),
        (["explain", "p", "--kubeconfig", "{long}"], "--kubeconfig"),
        (["report", "--kubeconfig", "{long}"], "--kubeconfig"),
        (["report", "--prices", "{long}"], "--prices"),
        (
            ["report", "--prometheus-url", "http://p:9090", "--prometheus-bearer-token-file", "{long}"],
            "--prometheus-bearer-token-file",
        ),
        (["report", "--prometheus-url", "https://p:9090", "--prometheus-ca-file", "{long}"], "--prometheus-ca-file"),
    ],
)
def test_a_path_too_long_to_look_up_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    long = tmp_path / LONG_NAME
    said = rejected(capsys, [str(long) if a == "{long}" else a for a in argv])
    assert f"{flag} {long}: cannot use this path: File name too long; pass the path of " in said


def test_a_kubeconfig_path_that_cannot_be_looked_up_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    long = tmp_path / LONG_NAME
    monkeypatch.setenv("KUBECONFIG", str(long))
    said = rejected(capsys, ["explain", "p"])
    assert f"$KUBECONFIG entry {long}: cannot use this path: File name too long" in said
    assert "--kubeconfig PATH" in said
    monkeypatch.delenv("KUBECONFIG")
    out = tmp_path / "out"
    out.mkdir()
    unsearchable = {tmp_path / ".kube", out}  # as a directory chmod 000 is, but for root too
    real_stat = Path.stat

    def stat(self: Path, **kwargs: Any) -> os.stat_result:
        if self.parent in unsearchable:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    said = rejected(capsys, ["report"])
    assert f"kubeconfig {tmp_path / '.kube' / 'config'}: cannot use this path: Permission denied" in said
    said = rejected(capsys, ["simulate", *FAST, "--out", str(out)])
    assert f"--out {out / 'summary.json'}: cannot use this path: Permission denied" in said


def test_trace_errors_name_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,1000,1024,1,1500\n",
        encoding="utf-8",
    )
    message = rejected(capsys, ["simulate", "--nodes", str(DEMO / "nodes.csv"), "--pods", str(pods), *FAST])
    assert f"{pods}:3: column 'gpu_milli'" in message
    assert "1..1000" in message


def test_an_out_directory_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "results"
    taken.write_text("a file, not a directory\n", encoding="utf-8")
    message = rejected(capsys, ["simulate", *FAST, "--out", str(taken / "run1")])
    assert f"--out {taken / 'run1'}: cannot write there" in message
    assert "pass a writable directory" in message


def test_a_workload_without_gpu_demand_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,0,0\n", encoding="utf-8")
    message = rejected(capsys, ["simulate", "--nodes", str(DEMO / "nodes.csv"), "--pods", str(pods), *FAST])
    assert "no pod requests a GPU" in message


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("", ":1: no pods in file"),
        ("p0,1000,1024,1,500\np1,99999999999999999999999,1024,1,500\n", ":3: column 'cpu_milli': too large"),
        ("p0,1000,1024,1,500\np1,1000,1e300,1,500\n", ":3: column 'memory_mib': too large"),
    ],
    ids=["no-pods", "huge-cpu", "huge-memory"],
)
def test_a_pod_list_the_simulator_cannot_count_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, expected: str
) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + rows, encoding="utf-8")
    argv = ["simulate", "--nodes", str(DEMO / "nodes.csv"), "--pods", str(pods), *FAST, "--out", str(tmp_path)]
    assert f"{pods}{expected}" in rejected(capsys, argv)


def test_a_node_too_large_to_count_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,99999999999999999999999,1024,8,A100\n", encoding="utf-8")
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(DEMO / "pods.csv"), *FAST, "--out", str(tmp_path)]
    assert f"{nodes}:2: column 'cpu_milli': too large" in rejected(capsys, argv)


def test_config_errors_name_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("weights:\n  placedGpu: -1\n  colour: red\n", encoding="utf-8")
    message = rejected(capsys, ["simulate", *FAST, "--config", str(bad)])
    assert str(bad) in message
    assert "weights.colour: unknown key" in message
    assert "weights.placedGpu" in message


def test_bad_published_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "published.csv"
    bad.write_text("trace,policy\ndefault,FGD\n", encoding="utf-8")
    message = rejected(capsys, ["simulate", *FAST, "--published", str(bad), "--out", str(tmp_path)])
    assert "missing column(s) alloc_pct_at_arrival130" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"trace,policy,alloc_pct_at_arrival130\ndemo,FGD,95\xff\n", ":2: not UTF-8 text"),
        (b"alloc_pct_at_arrival130,trace,policy\n95\n", ":2: column 'trace': empty"),
        (b"trace,policy,alloc_pct_at_arrival130\ndemo,FGD,nan\n", ":2: column 'alloc_pct_at_arrival130'"),
    ],
    ids=["not-utf8", "short-row", "nan"],
)
def test_a_bad_published_row_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: bytes, expected: str
) -> None:
    bad = tmp_path / "published.csv"
    bad.write_bytes(text)
    message = rejected(capsys, ["simulate", *FAST, "--published", str(bad), "--out", str(tmp_path)])
    assert f"{bad}{expected}" in message


def test_a_published_file_is_read_as_the_traces_are(tmp_path: Path) -> None:
    # Saved by a spreadsheet: a byte-order mark, and spaces after the commas.
    published = tmp_path / "published.csv"
    published.write_text(
        "trace, policy, alloc_pct_at_arrival130\ndemo, FGD, 95.5\ndemo, BestFit, 92.75\n", encoding="utf-8-sig"
    )
    out = tmp_path / "out"
    assert main(["simulate", *FAST, "--published", str(published), "--out", str(out)]) == 0
    by_policy = {s["policy"]: s for s in summary(out)}
    assert by_policy["fgd"]["fgd_published_alloc_pct_130"] == 95.5
    assert by_policy["bestfit"]["fgd_published_alloc_pct_130"] == 92.75


def test_published_results_for_a_trace_without_a_name_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = tmp_path / "published.csv"
    published.write_text("trace,policy,alloc_pct_at_arrival130\ndefault,FGD,95.39\n", encoding="utf-8")
    pods = str(DEMO / "pods.csv")
    argv = ["simulate", "--nodes", str(DEMO / "nodes.csv"), "--pods", pods, *FAST, "--published", str(published)]
    message = rejected(capsys, [*argv, "--out", str(tmp_path / "out")])
    assert "openb_pod_list_<trace>.csv" in message
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "and not running in a pod (KUBERNETES_SERVICE_HOST is unset); pass --kubeconfig PATH"),
        (["run", "--kubeconfig", "/nonexistent"], "--kubeconfig /nonexistent: no such file"),
        (["run", "--config", "configmap/"], "name the ConfigMap"),
        (["run", "--config", "/nonexistent.yaml"], "or configmap/NAME"),
        (["run", "--lease-duration", "5", "--renew-deadline", "10"], "--lease-duration > --renew-deadline"),
        (["explain"], "required: [NAMESPACE/]POD"),
        (["explain", "p"], "pass --kubeconfig PATH"),
        (["run", "--metrics-port", "70000"], "argument --metrics-port: must be 0..65535 (0 picks a free port)"),
        (["run", "--namespace", "Sched"], "argument --namespace: 'Sched' is not a namespace name"),
        (["run", "--lease-name", "a/b"], "argument --lease-name: 'a/b' is not a Lease name"),
        (["run", "--config", "configmap/a?b"], "--config configmap/a?b: 'a?b' is not a ConfigMap name"),
    ],
)
def test_run_and_explain_reject_bad_input_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert message in rejected(capsys, argv)


def test_a_kubeconfig_is_found_as_kubectl_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nowhere"))
    assert "$KUBECONFIG names no file that exists" in rejected(capsys, ["explain", "p"])
    (tmp_path / ".kube").mkdir()
    home = tmp_path / ".kube" / "config"
    home.write_text(KUBECONFIG.replace("contexts:", "current-context: ctx\ncontexts:"))
    monkeypatch.delenv("KUBECONFIG")
    seen: list[Path | None] = []

    async def explain_pod(kubeconfig: Path | None, *_: Any, **__: Any) -> tuple[str, int]:
        seen.append(kubeconfig)
        return "fits", 0

    monkeypatch.setattr("gpusched.daemon.explain_pod", explain_pod)
    assert main(["explain", "p"]) == 0
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod: its service account first
    monkeypatch.setenv("KUBECONFIG", "/etc/kubernetes/admin.conf")  # named in the image, not mounted
    assert main(["explain", "p"]) == 0
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    listed = tmp_path / "listed"
    listed.write_text(home.read_text())
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'nowhere'}:{listed}")
    assert main(["explain", "p"]) == 0
    assert seen == [home, None, listed]


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
"""


@pytest.mark.parametrize(
    ("current", "argv", "message"),
    [
        ("", [], "pass --context NAME, one of its contexts: ctx"),
        ("current-context: ctx\n", ["--context", "nope"], "check --context against its contexts: ctx"),
    ],
)
def test_run_and_explain_name_a_kubeconfig_they_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], current: str, argv: list[str], message: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG + current, encoding="utf-8")
    for command in (["run"], ["explain", "p"]):
        text = rejected(capsys, [*command, "--kubeconfig", str(path), *argv])
        assert f"kubeconfig {path}: " in text
        assert message in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ": not a kubeconfig the client can read; it lists no contexts: pass a kubeconfig"),
        ("apiVersion: v1\n", "; it lists no contexts: pass a kubeconfig"),
        ("[unclosed\n", "; check that the file is a readable kubeconfig"),
        ("contexts: 5\n", "; it lists no contexts: pass a kubeconfig"),
    ],
    ids=["empty", "no-contexts", "not-yaml", "contexts-not-a-list"],
)
def test_a_file_that_is_no_kubeconfig_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text, encoding="utf-8")
    for command in (["run"], ["explain", "p"]):
        out = rejected(capsys, [*command, "--kubeconfig", str(path)])
        assert f"kubeconfig {path}" in out
        assert message in out
        assert "--context" not in out


def test_explain_an_unreachable_api_server_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as closed:  # bound, not listening: refuses connections, and no one else takes it
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        path = tmp_path / "kubeconfig"
        path.write_text(KUBECONFIG.replace("127.0.0.1:1", f"127.0.0.1:{port}") + "current-context: ctx\n")
        text = rejected(capsys, ["explain", "default/p", "--kubeconfig", str(path)])
    assert "cannot read the cluster: cannot reach the API server" in text
    assert "check the server address of --kubeconfig" in text


def _tls_server(pki: _Pki, host: str) -> tuple[socket.socket, int]:
    """A TLS server on ``host`` with the test CA's serving certificate (issued for 127.0.0.1 and
    localhost); it answers nothing: the client gives up at the handshake."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.serving_crt, pki.serving_key)
    listener = socket.create_server((host, 0))

    def serve() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with contextlib.suppress(OSError), ctx.wrap_socket(raw, server_side=True) as tls:
                tls.recv(1)

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


@pytest.mark.parametrize(
    ("host", "ca", "said", "fix"),
    [
        (
            "127.0.0.1",
            False,
            "the API server's certificate is not trusted (unable to get local issuer certificate)",
            "must name the CA that signed the API server's certificate: certificate-authority (a file) or "
            "certificate-authority-data",
        ),
        (
            "127.0.0.2",
            True,
            "the API server's certificate is not issued for its address (IP address mismatch, certificate is not "
            "valid for '127.0.0.2')",
            "must be a name or address the certificate is issued for, or its tls-server-name must be one",
        ),
    ],
    ids=["unknown-ca", "other-address"],
)
def test_a_certificate_the_client_refuses_is_told_with_the_kubeconfig_setting_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, ca: bool, said: str, fix: str
) -> None:
    pki = _Pki.at(tmp_path / "pki")
    _make_pki(pki)
    listener, port = _tls_server(pki, host)
    with listener:
        path = tmp_path / "kubeconfig"
        authority = f", certificate-authority: '{pki.ca_crt}'" if ca else ""
        path.write_text(
            KUBECONFIG.replace('server: "https://127.0.0.1:1"', f"server: 'https://{host}:{port}'{authority}")
            + "current-context: ctx\n"
        )
        for argv in (["explain", "default/p"], ["report"]):
            text = rejected(capsys, [*argv, "--kubeconfig", str(path)])
            assert f"cannot read the cluster: {said}" in text
            assert f"the cluster of kubeconfig {path} (of --context, or its current context) {fix}" in text
            assert "check the server address" not in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ns/"], "'ns/' is not a pod; pass POD or NAMESPACE/POD"),
        (["/p"], "'/p' is not a pod; pass POD or NAMESPACE/POD"),
        (["a/b/c"], "'a/b/c' is not a pod; pass POD or NAMESPACE/POD"),
        (["a/p", "--namespace", "b"], "a/p is in namespace 'a', but --namespace says 'b'"),
        (["default/.."], "'default/..': '..' is not a pod name: pod names are lower-case letters, digits, '-' and '.'"),
        (["default/a?b"], "'a?b' is not a pod name"),
        (["Default/p"], "'Default' is not a namespace name: namespace names are lower-case letters, digits and '-'"),
        (["Default/p"], "(did you mean 'default'?); pass NAMESPACE/POD as `kubectl get pods -A` lists them"),
        (["p", "--namespace", "a.b"], "--namespace 'a.b' is not a namespace name"),
        (["My-Pod"], "(did you mean 'my-pod'?); pass POD or NAMESPACE/POD as `kubectl get pods` lists them"),
    ],
)
def test_explain_refuses_what_is_not_a_pod(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    asked: list[tuple[str, str]] = []

    async def explain_pod(kubeconfig: Path | None, context: str | None, ns: str, name: str, *_: Any) -> tuple[str, int]:
        asked.append((ns, name))
        return "fits", 0

    monkeypatch.setattr("gpusched.daemon.explain_pod", explain_pod)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # a cluster to ask, were the pod one
    assert message in rejected(capsys, ["explain", *argv])
    assert asked == []


@pytest.mark.parametrize(
    ("argv", "namespace"),
    [
        (["p"], "default"),
        (["team/p"], "team"),
        (["p", "--namespace", "team"], "team"),
        (["team/p", "--namespace", "team"], "team"),
    ],
)
def test_explain_looks_for_the_pod_in_its_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], namespace: str
) -> None:
    seen: list[tuple[str, str]] = []

    async def explain_pod(
        kubeconfig: Path | None, context: str | None, ns: str, name: str, scheduler: str
    ) -> tuple[str, int]:
        seen.append((ns, name))
        return "fits", 0

    monkeypatch.setattr("gpusched.daemon.explain_pod", explain_pod)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG + "current-context: ctx\n")
    assert main(["explain", *argv, "--kubeconfig", str(path)]) == 0
    assert seen == [(namespace, "p")]


def test_run_in_a_pod_without_its_service_account_token_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    text = rejected(capsys, ["run", "--no-leader-elect"])
    assert "the pod's service account cannot be read" in text
    assert "or pass --kubeconfig PATH" in text


def test_run_on_a_metrics_port_that_is_taken_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG + "current-context: ctx\n", encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", "--kubeconfig", str(path), "--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
        text = rejected(capsys, argv)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in text
    assert "pass a free --metrics-port (0 picks one)" in text


def test_run_rejects_a_bad_config_file_naming_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("weights:\n  packing: -1\n")
    assert "weights.packing" in rejected(capsys, ["run", "--config", str(bad), "--kubeconfig", str(bad)])


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "simulate" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpusched {__version__}"


def test_logs_are_json_lines_on_stderr_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info")
    structlog.get_logger("test").info("hello", answer=42)
    structlog.get_logger("test").debug("hidden")
    line = capsys.readouterr().err.strip()
    event = json.loads(line)
    assert event["event"] == "hello"
    assert event["answer"] == 42
    assert event["level"] == "info"
    with pytest.raises(ValueError, match="unknown log level"):
        logs.configure("loud")


def test_module_entry_point_exit_code() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "gpusched", "simulate", "--policy", "nosuch"],
        capture_output=True,
        text=True,
        env=_module_env(),
        check=False,
    )
    assert bad.returncode == 2
    assert "unknown policy 'nosuch'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


EXEC_FAILS = KUBECONFIG.replace(
    "user: {token: t}", "user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: /bin/false}}"
)


@pytest.mark.parametrize("command", [["explain", "p"], ["report"]])
def test_a_failing_credential_plugin_is_told_once_in_gpuscheds_own_words(tmp_path: Path, command: list[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(EXEC_FAILS + "current-context: ctx\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpusched", *command, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        env=_module_env(),
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [  # not the client library's own "exec: process returned 1" first
        f"gpusched {command[0]}: error: kubeconfig {kubeconfig}: exec: process returned 1; check the cluster and "
        "user of the context against the file (contexts: ctx)"
    ]


def test_the_client_librarys_own_log_lines_are_shown_at_debug(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(EXEC_FAILS + "current-context: ctx\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpusched", "--log-level", "debug", "explain", "p", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        env=_module_env(),
        check=False,
    )
    events = [json.loads(line) for line in done.stderr.splitlines()[:-1]]
    said = [e for e in events if e["event"] == "exec: process returned 1"]
    assert said == [said[0]]
    assert (said[0]["logger"], said[0]["library_level"]) == ("kubernetes_asyncio.config.kube_config", "error")
    assert done.stderr.splitlines()[-1].startswith("gpusched explain: error: kubeconfig ")


def test_a_library_error_not_raised_after_still_shows_in_the_daemons_log() -> None:
    """At the daemon's level (info), an error the client library logs and then does not raise
    (an exec plugin's output without a token: only a 401 follows) is a warning in gpusched's log;
    at a command's level (warning) it stays at debug, the command's own error saying it."""
    import logging

    from structlog.testing import capture_logs

    from gpusched.logs import configure

    for level, expected in (("info", ["warning"]), ("warning", [])):
        configure(level, json=True)
        with capture_logs() as logs:
            logging.getLogger("kubernetes_asyncio.config.kube_config").error("exec: missing token in plugin output")
        said = [e["log_level"] for e in logs if e["event"] == "exec: missing token in plugin output"]
        assert [x for x in said if x != "debug"] == expected, level


def _module_env() -> dict[str, str]:
    """The environment for ``python -m gpusched`` to run this checkout."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _gone(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


AS_IN_A_TERMINAL = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # a shell without job control starts a
    "from gpusched.cli import main\n"  # background job (this test run, say) ignoring SIGINT; a terminal does not
    "raise SystemExit(main(sys.argv[1:]))\n"
)
"""``gpusched ARGS`` with SIGINT as Python takes it over in a terminal."""


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() and os.environ.get("CI", "").lower() != "true",
    reason="finds the worker processes in /proc (under CI=true it runs, and fails without /proc)",
)
def test_ctrl_c_ends_a_parallel_simulation_with_one_line_and_its_workers(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", AS_IN_A_TERMINAL, "--log-level", "info", "simulate", "--jobs", "2", "--policy", "fgd"]
    argv += ["--seeds", "42-61", "--no-progress", "--out", str(tmp_path)]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_module_env(),
        start_new_session=True,  # a process group of its own, as a shell gives a command
    )
    try:
        assert proc.stderr is not None
        said: list[str] = []
        for line in proc.stderr:  # ends at the first finished run, or when the process does
            said.append(line)
            if '"run.done"' in line:
                break
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(said) + rest
    assert any('"run.done"' in line for line in said), err  # the workers were at work
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "gpusched simulate: interrupted"
    assert not (tmp_path / "summary.json").exists()
    assert len(workers) >= 2
    deadline = time.monotonic() + 10
    while not all(_gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(w) for w in workers), "a worker process outlived the interrupted run"


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def interrupted(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("gpusched.daemon.explain_pod", interrupted)
    monkeypatch.setattr("gpusched.daemon.report_costs", interrupted)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG + "current-context: ctx\n")
    for argv in (["explain", "p"], ["report"]):
        assert main([*argv, "--kubeconfig", str(path)]) == 130
        captured = capsys.readouterr()
        assert captured.err == f"gpusched {argv[0]}: interrupted\n"
        assert captured.out == ""


CTRL_C_WHILE_LOADING = (
    "import importlib.abc, os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "class CtrlC(importlib.abc.MetaPathFinder):\n"  # the terminal's Ctrl-C, as the config's library loads
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'pydantic':\n"
    "            os.kill(os.getpid(), signal.SIGINT)\n"
    "        return None\n"
    "sys.meta_path.insert(0, CtrlC())\n"
    "sys.argv[0] = 'gpusched'\n"
    "import runpy\n"
    "runpy.run_module('gpusched', run_name='__main__')\n"
)


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_LOADING, "simulate"],
        capture_output=True,
        text=True,
        env=_module_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 130, done
    assert done.stderr == "gpusched: interrupted\n"
    assert done.stdout == ""


def test_the_gpusched_command_is_the_entry_that_survives_ctrl_c_while_loading() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts", name="gpusched")
    assert [s.value for s in scripts] == ["gpusched.entry:main"]


def test_seeds_count_up_to_the_limit_inclusive() -> None:
    assert len(parse_seeds(f"1-{MAX_SEEDS}")) == MAX_SEEDS
    with pytest.raises(ValueError, match=f"more than {MAX_SEEDS} seeds"):
        parse_seeds(f"0-{MAX_SEEDS}")
    # Seeds named twice count once.
    assert len(parse_seeds(f"1-600,500-{MAX_SEEDS}")) == MAX_SEEDS
    with pytest.raises(ValueError, match=f"more than {MAX_SEEDS} seeds"):
        parse_seeds(f"1-600,500-{MAX_SEEDS + 1}")
    assert parse_seeds("2147483647") == [2147483647]  # the largest the solver takes


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["simulate", "--tune", "10"], "tune", 10.0),  # the largest multiple there is
        (["run", "--metrics-port", "65535"], "metrics_port", 65535),
        (["run", "--metrics-port", "0"], "metrics_port", 0),
        (["run", "--lease-duration", "0.5"], "lease_duration", 0.5),
    ],
)
def test_arguments_at_their_limits_are_taken(argv: list[str], dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value


def _run_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> Any:
    """The settings ``gpusched run`` with ``flags`` hands the daemon."""
    import gpusched.daemon

    seen: list[Any] = []

    async def run_daemon(settings: Any) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(gpusched.daemon, "run_daemon", run_daemon)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG + "current-context: ctx\n", encoding="utf-8")
    assert main(["run", "--kubeconfig", str(path), *flags]) == 0
    (settings,) = seen
    return settings


@pytest.mark.parametrize(("flags", "leader_elect"), [([], True), (["--no-leader-elect"], False)])
def test_run_holds_the_lease_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], leader_elect: bool
) -> None:
    settings = _run_settings(tmp_path, monkeypatch, ["--lease-name", "l", *flags])
    assert settings.leader_elect is leader_elect
    assert (settings.lease_name, settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s) == (
        "l",
        15.0,
        10.0,
        2.0,
    )


def test_run_hands_the_daemon_the_prometheus_token_and_ca_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = _Pki.at(tmp_path / "pki")
    _make_pki(pki)
    token, ca = tmp_path / "token", pki.ca_crt
    token.write_text("t")
    flags = ["--prometheus-url", "https://thanos:9091", "--prometheus-bearer-token-file", str(token)]
    settings = _run_settings(tmp_path, monkeypatch, [*flags, "--prometheus-ca-file", str(ca)])
    assert (settings.prometheus_token_file, settings.prometheus_ca_file) == (token, ca)


@pytest.mark.parametrize(
    ("flags", "told"),
    [
        (
            ["--prometheus-bearer-token-file", "{tmp}/token"],
            "--prometheus-bearer-token-file needs --prometheus-url: it is how that Prometheus is read",
        ),
        (
            ["--prometheus-url", "https://p:9091", "--prometheus-bearer-token-file", "{tmp}/missing"],
            "--prometheus-bearer-token-file {tmp}/missing: no such file; pass the path of a file holding the "
            "bearer token",
        ),
        (
            ["--prometheus-url", "http://p:9090", "--prometheus-ca-file", "{tmp}/token"],
            "--prometheus-ca-file is for an https Prometheus; --prometheus-url is not https://",
        ),
        (
            ["--prometheus-url", "https://p:9091", "--prometheus-ca-file", "{tmp}/ca.crt"],
            "--prometheus-ca-file {tmp}/ca.crt: not a PEM file of CA certificates (NO_CERTIFICATE_OR_CRL_FOUND); "
            "pass a PEM file of the CA certificates to trust (-----BEGIN CERTIFICATE----- blocks)",
        ),
        (
            ["--prometheus-url", "https://u:pw@p:9091", "--prometheus-bearer-token-file", "{tmp}/token"],
            "--prometheus-bearer-token-file and a user and password in --prometheus-url: only one of them is "
            "sent (the password would replace the token); give one",
        ),
    ],
)
def test_prometheus_credential_files_are_checked_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], told: str
) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("<html>saved from the browser, not the certificate</html>\n")
    message = rejected(capsys, ["report", *(f.format(tmp=tmp_path) for f in flags)])
    assert message.endswith(told.format(tmp=tmp_path))


@pytest.mark.parametrize(
    "url",
    [
        "http://admin:s3cr/t@prometheus:9090",  # a '/' in the password: read as the port
        "http://admin:p#ss@prometheus:9090",  # a '#': read as a fragment
    ],
)
def test_a_rejected_prometheus_url_does_not_print_its_password(capsys: pytest.CaptureFixture[str], url: str) -> None:
    message = rejected(capsys, ["report", "--prometheus-url", url])
    assert "s3cr" not in message
    assert "p#ss" not in message
    assert "'http://admin:***@prometheus:9090'" in message
    assert "percent-encode" in message


def test_simulate_out_naming_a_file_says_it_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "results"
    taken.write_text("")
    assert "is a file, not a directory" in rejected(capsys, ["simulate", "--out", str(taken)])


@pytest.mark.parametrize("name", ["summary.json", "allocation.png"])
def test_simulate_refuses_before_the_run_an_out_whose_result_file_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    (tmp_path / name).mkdir()
    said = rejected(capsys, ["simulate", *FAST, "--out", str(tmp_path)])
    assert f"--out {tmp_path}: {name} there is a directory; remove it or pass another directory" in said


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{currency: EUR, default: 1.0, gpuHour: {A100-SXM4-80GB: 3.0}", "--prices"),
        ("currency: EUR\ncurrency: USD\n", "'currency' is given twice"),
    ],
)
def test_report_refuses_a_broken_or_ambiguous_price_list_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(text)
    said = rejected(capsys, ["report", "--prices", str(prices), "--kubeconfig", str(prices)])
    assert message in said
    assert "not valid YAML" in said
    assert "<unicode string>" not in said


def test_report_refuses_an_empty_price_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty file is a mistake, not "no --prices" (which would count every GPU-hour as 1)."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("# to be filled in\n")
    said = rejected(capsys, ["report", "--prices", str(prices), "--kubeconfig", str(prices)])
    assert f"--prices {prices}: empty; name what the prices are in, such as currency: USD" in said


@contextlib.contextmanager
def _http(status: int, body: dict[str, Any] | str) -> Iterator[str]:
    """An HTTP server on loopback answering every GET with ``status`` and ``body`` (JSON, or a
    string as an HTML page); its URL."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_report_with_a_prometheus_url_it_cannot_read_fails_without_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    fmt = ["--json"] if json_out else []
    with (
        _http(200, {"kind": "List", "items": [], "metadata": {"resourceVersion": "1"}}) as api,
        _http(404, {"message": "404 page not found"}) as not_prometheus,
        socket.socket() as closed,
    ):
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", api) + "current-context: ctx\n")
        argv = ["report", "--kubeconfig", str(kubeconfig), *fmt]
        assert main(argv) == 0  # no --prometheus-url: the report, idle GPUs not measured
        assert capsys.readouterr().out
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refuses connections
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}"
        for url, why in ((refused, "Connection refused"), (not_prometheus, "HTTP 404 from Prometheus")):
            code = main([*argv, "--prometheus-url", url])
            out, err = capsys.readouterr()
            assert (code, out) == (2, ""), err  # no report that looks whole
            assert err.startswith(f"gpusched report: error: --prometheus-url: cannot read GPU utilisation from {url}: ")
            assert why in err
            assert "check the address (the one Prometheus answers /api/v1/query under" in err
            assert len(err.splitlines()) == 1


WEB_PAGE = "<!DOCTYPE html><html><head><title>Sign in</title></head><body>Sign in</body></html>"


@pytest.mark.parametrize("argv", [["explain", "default/p"], ["report"]], ids=["explain", "report"])
def test_a_server_answering_a_web_page_is_named_as_no_api_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with _http(200, WEB_PAGE) as portal:  # a sign-in page where the API server was meant to be
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", portal) + "current-context: ctx\n")
        said = rejected(capsys, [*argv, "--kubeconfig", str(kubeconfig)])
    assert f"cannot read the cluster: the answer from {portal} to GET /api/v1/" in said
    assert "is not a Kubernetes object (a web page: '<!DOCTYPE html><html><head><title>Sign in" in said
    assert f"is the server of the cluster of kubeconfig {kubeconfig} (of --context, or its current context) a " in said
    assert "Kubernetes API server?" in said


@pytest.mark.parametrize(
    ("answer", "what"),
    [
        ({"kind": "Status", "apiVersion": "v1"}, "a JSON object without items: keys apiVersion, kind"),
        ({"kind": "PodList", "items": ["p0"]}, "a list whose items are not all JSON objects"),
    ],
    ids=["no-items", "items-not-objects"],
)
def test_report_refuses_a_list_that_is_no_kubernetes_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: dict[str, Any], what: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with _http(200, answer) as server:
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", server) + "current-context: ctx\n")
        said = rejected(capsys, ["report", "--kubeconfig", str(kubeconfig)])
    assert f"the answer from {server} to GET /api/v1/nodes is not a Kubernetes object ({what})" in said
    assert "a Kubernetes API server?" in said


def test_explain_refuses_an_answer_that_is_no_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with _http(200, {"status": "ok"}) as server:  # a health endpoint's JSON, not a pod
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", server) + "current-context: ctx\n")
        said = rejected(capsys, ["explain", "default/p", "--kubeconfig", str(kubeconfig)])
    assert f"the answer from {server} to GET /api/v1/namespaces/default/pods/p is not a Kubernetes object" in said
    assert "(object without metadata.name)" in said
    assert "a Kubernetes API server?" in said


def test_report_leaves_out_an_object_without_a_name_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    nameless = {"kind": "List", "items": [{"spec": {}}], "metadata": {"resourceVersion": "1"}}
    with _http(200, nameless) as api:  # every list, of nodes as of pods, holds an object without metadata
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", api) + "current-context: ctx\n")
        code = main(["report", "--kubeconfig", str(kubeconfig), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)
    assert "note: node ignored: object without metadata.name" in err
    assert "note: bound pod ignored: object without metadata.name" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (400, "bad_data", "1:37: parse error: unclosed left parenthesis"),
        (422, "execution", 'found duplicate series for the match group {Hostname="n0"} on the right hand-side'),
    ],
    ids=["parse", "execution"],
)
def test_report_whose_query_prometheus_refuses_blames_the_query_not_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], status: int, kind: str, error: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    refusal = {"status": "error", "errorType": kind, "error": error}
    with (
        _http(200, {"kind": "List", "items": [], "metadata": {"resourceVersion": "1"}}) as api,
        _http(status, refusal) as prometheus,
    ):
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", api) + "current-context: ctx\n")
        argv = ["report", "--kubeconfig", str(kubeconfig), "--prometheus-url", prometheus]
        code = main([*argv, "--utilisation-query", "avg by (Hostname, gpu) (x * on(Hostname) y)"])
        out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    said = f"gpusched report: error: --utilisation-query: cannot read GPU utilisation from {prometheus}: "
    assert err.startswith(said), err
    assert f"Prometheus refused the query ({kind}): {error}" in err
    assert "fix the query" in err
    assert "--prometheus-url" not in err


def test_report_names_an_answer_that_is_not_prometheuss_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with (
        _http(200, {"kind": "List", "items": [], "metadata": {"resourceVersion": "1"}}) as api,
        _http(200, {"status": "ok", "version": "2.1"}) as health,  # JSON, but another service's
    ):
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", api) + "current-context: ctx\n")
        said = rejected(capsys, ["report", "--kubeconfig", str(kubeconfig), "--prometheus-url", health])
    assert (
        f"--prometheus-url: cannot read GPU utilisation from {health}: the answer is JSON without data.result" in said
    )
    assert "is the URL a Prometheus (its /api/v1/query)?" in said
    assert "KeyError" not in said
    assert "check the address (the one Prometheus answers /api/v1/query under" in said
    assert "Prometheus is up" not in said  # it answered: something else did


@pytest.mark.parametrize(
    ("text", "cause"),
    [("", "is empty"), ("eyJhbGciOi JSUzI1NiJ9\n", "holds characters no bearer token has")],
    ids=["empty", "two-words"],
)
def test_report_blames_a_bearer_token_file_without_a_token_not_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, cause: str
) -> None:
    kubeconfig, token = tmp_path / "kubeconfig", tmp_path / "token"
    token.write_text(text)
    with (
        _http(200, {"kind": "List", "items": [], "metadata": {"resourceVersion": "1"}}) as api,
        _http(200, {"status": "success", "data": {"resultType": "vector", "result": []}}) as prometheus,
    ):
        kubeconfig.write_text(KUBECONFIG.replace("https://127.0.0.1:1", api) + "current-context: ctx\n")
        argv = ["report", "--kubeconfig", str(kubeconfig), "--prometheus-url", prometheus]
        said = rejected(capsys, [*argv, "--prometheus-bearer-token-file", str(token)])
    assert said.startswith("gpusched report: error: --prometheus-bearer-token-file: cannot read GPU utilisation")
    assert f"the bearer token file {token} {cause}" in said
    assert "put the token alone in the file" in said
    assert "check the address" not in said


@pytest.mark.parametrize(
    "argv",
    [["check-config", "{file}"], ["simulate", "--config", "{file}"], ["report", "--prices", "{file}"]],
    ids=["check-config", "simulate", "report"],
)
def test_a_file_that_is_not_utf8_is_told_where_and_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    path = tmp_path / "saved-as-latin-1.yaml"
    path.write_bytes("# prices\ncurrency: EUR  # caf\u00e9\n".encode("latin-1"))  # the \u00e9 is byte 30
    said = rejected(capsys, [a.format(file=path) for a in argv])
    assert said.endswith(f"{path}: not UTF-8 text (byte 30, on line 2); save it as UTF-8")


def _manifest(tmp_path: Path, workers: int) -> Path:
    """A ConfigMap manifest, as ``kubectl get configmap -o yaml`` prints it, with ``solver.workers``."""
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu-scheduler-config}\n"
        f"data:\n  config.yaml: |\n    solver:\n      workers: {workers}\n",
        encoding="utf-8",
    )
    return manifest


def test_check_config_finds_the_one_configmap_among_several_objects_or_says_what_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cm = _manifest(tmp_path, workers=3).read_text(encoding="utf-8")
    namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: gpusched}\n"
    stream = tmp_path / "all.yaml"  # as kubectl kustomize prints it
    stream.write_text(f"---\n{namespace}---\n{cm}---\n", encoding="utf-8")
    assert main(["check-config", str(stream), "--log-level", "debug"]) == 0
    assert "solver.workers: 3" in capsys.readouterr().out
    listed = tmp_path / "list.yaml"  # as kubectl get configmap -o yaml prints several
    items = "\n".join("  " + line for line in cm.splitlines())
    listed.write_text(f"apiVersion: v1\nkind: List\nitems:\n- {items.lstrip()}\n", encoding="utf-8")
    assert main(["check-config", str(listed)]) == 0
    assert "solver.workers: 3" in capsys.readouterr().out
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"{cm}---\n{cm}", encoding="utf-8")
    said = rejected(capsys, ["check-config", str(twice)])
    assert f"{twice}: 2 ConfigMaps with data.config.yaml among its objects; pass a file with one" in said
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n", encoding="utf-8")
    said = rejected(capsys, ["check-config", str(deployment)])
    assert f"{deployment}: a Deployment, not a solver configuration or a ConfigMap manifest" in said
    broken = tmp_path / "broken.yaml"  # items that are no list: a TypeError and a traceback before
    broken.write_text("apiVersion: v1\nkind: List\nitems: 3\n", encoding="utf-8")
    assert f"{broken}: a List whose items are not a list of objects" in rejected(capsys, ["check-config", str(broken)])


def test_check_config_lists_what_differs_from_the_defaults_or_names_the_bad_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "config.yaml"
    plain.write_text("weights:\n  fragmentation: 20\nbatching:\n  quickStart: false\n", encoding="utf-8")
    assert main(["check-config", str(plain)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out
    assert "weights.fragmentation: 20" in out
    assert "batching.quickStart: false" in out
    assert "solver." not in out  # untouched sections are not listed
    manifest = _manifest(tmp_path, workers=0)
    assert main(["check-config", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "data.config.yaml" in err
    assert "solver.workers" in err
    assert "Traceback" not in err
    shipped = Path(__file__).resolve().parents[1] / "manifests" / "config.yaml"
    assert main(["check-config", str(shipped)]) == 0
    assert "every key at its default" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text",
    ["---\nweights: {packing: 2}\n---\n", "weights: {packing: 2}\n---\nsolver: {workers: 1}\n"],
    ids=["trailing-separator", "two-documents"],
)
def test_check_config_and_run_refuse_what_the_configmap_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    from gpusched.kube.configmap import ConfigMapHandler

    handler = ConfigMapHandler("gpusched-system", "gpu-scheduler-config", on_config=lambda _: None)
    handler.apply("ADDED", {"metadata": {"resourceVersion": "1"}, "data": {"config.yaml": text}})
    assert handler.rejected  # the scheduler keeps what it had
    reason = handler.rejected.split(": ", 1)[1]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert rejected(capsys, ["check-config", str(path)]) == f"gpusched check-config: error: {path}: {reason}"
    assert rejected(capsys, ["run", "--config", str(path)]) == f"gpusched run: error: {path}: {reason}"
    assert rejected(capsys, ["simulate", "--config", str(path)]) == f"gpusched simulate: error: {path}: {reason}"
    manifest = tmp_path / "cm.yaml"  # inside a manifest, the same text is refused the same way
    indented = "".join(f"    {line}\n" for line in text.splitlines())
    manifest.write_text(f"apiVersion: v1\nkind: ConfigMap\ndata:\n  config.yaml: |\n{indented}---\n")
    said = rejected(capsys, ["check-config", str(manifest)])
    assert said == f"gpusched check-config: error: {manifest} (data.config.yaml): {reason}"
    assert "another starts at line" in reason
    assert "remove that '---'" in reason  # the fix


def test_a_configmap_manifest_check_config_accepts_is_read_by_simulate_as_well(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _manifest(tmp_path, workers=3)
    assert main(["check-config", str(manifest)]) == 0
    params = cli._params(manifest)
    assert params is not None
    assert params.limits.workers == 3
    name, config = cli._daemon_config(str(manifest))
    assert (name, config.solver.workers) == (None, 3)


def test_an_empty_pod_namespace_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "")
    assert build_parser().parse_args(["run"]).namespace == "gpusched-system"
    monkeypatch.setenv("POD_NAMESPACE", "sched")
    assert build_parser().parse_args(["run"]).namespace == "sched"
