"""A real kube-apiserver + etcd on loopback, for tests and benchmarks.

No pytest in here: ``tests/e2e/conftest.py`` wraps it in a session fixture, and benchmarks
can use :func:`control_plane` directly::

    with control_plane(Path("/tmp/bench")) as cp:
        cp.kubectl("get", "nodes")

Binaries come from ``hack/testbin.sh`` (see ``docs/control-plane.md``). The cluster has no
controller-manager and no kubelet: see the pitfalls in ``docs/control-plane.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex

import yaml

__all__ = [
    "BINARIES",
    "REPO_ROOT",
    "SCHEDULER_GROUPS",
    "SCHEDULER_NAMESPACE",
    "SCHEDULER_SA",
    "SCHEDULER_USER",
    "AssetsMissing",
    "ControlPlane",
    "ControlPlaneError",
    "KubectlError",
    "control_plane",
    "find_assets",
    "start_control_plane",
]

SCHEDULER_NAMESPACE = "gpusched-system"
SCHEDULER_SA = "gpu-scheduler"
SCHEDULER_USER = f"system:serviceaccount:{SCHEDULER_NAMESPACE}:{SCHEDULER_SA}"
SCHEDULER_GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{SCHEDULER_NAMESPACE}")

BINARIES = ("kube-apiserver", "etcd", "kubectl", "kube-scheduler")
REPO_ROOT = Path(__file__).resolve().parent.parent
TESTBIN_SCRIPT = REPO_ROOT / "hack" / "testbin.sh"

CLUSTER_NAME = "gpusched-test"
ADMIN_CONTEXT = "admin"
SCHEDULER_CONTEXT = "scheduler"

_SHM = Path("/dev/shm")
_ETCD_DIR_PREFIX = "gpusched-etcd-"
_LOG_TAIL_CHARS = 4000
_STOP_TIMEOUT_S = 15.0


class AssetsMissing(RuntimeError):
    """The control-plane binaries could not be found or built."""


class ControlPlaneError(RuntimeError):
    """etcd or kube-apiserver did not come up."""

    def __init__(self, message: str, *, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.port_conflict = port_conflict


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; unlike CalledProcessError its message includes stderr."""

    def __str__(self) -> str:
        err = (self.stderr or "").strip() if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}\n{err}" if err else super().__str__()


# --------------------------------------------------------------------------- binaries


def _has_all_binaries(directory: Path) -> bool:
    return all((directory / name).is_file() and os.access(directory / name, os.X_OK) for name in BINARIES)


def _tail(text: str, limit: int = _LOG_TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def find_assets(*, timeout: float | None = None) -> Path:
    """Return a directory holding kube-apiserver, etcd, kubectl and kube-scheduler.

    ``$KUBEBUILDER_ASSETS`` wins if it holds all four; otherwise ``hack/testbin.sh`` finds or
    builds them (a cold build takes minutes). Raises :class:`AssetsMissing` on failure.
    """
    env_dir = os.environ.get("KUBEBUILDER_ASSETS")
    if env_dir and _has_all_binaries(Path(env_dir)):
        return Path(env_dir)
    if not TESTBIN_SCRIPT.is_file():
        raise AssetsMissing(f"{TESTBIN_SCRIPT} not found")
    try:
        proc = subprocess.run(
            ["bash", str(TESTBIN_SCRIPT)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise AssetsMissing(f"hack/testbin.sh timed out after {timeout}s:\n{_tail(stderr)}") from exc
    except OSError as exc:
        raise AssetsMissing(f"cannot run hack/testbin.sh: {exc}") from exc
    if proc.returncode != 0:
        raise AssetsMissing(f"hack/testbin.sh exited with {proc.returncode}:\n{_tail(proc.stderr)}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise AssetsMissing(f"hack/testbin.sh printed no directory:\n{_tail(proc.stderr)}")
    assets = Path(lines[-1])
    if not _has_all_binaries(assets):
        missing = [name for name in BINARIES if not (assets / name).is_file()]
        raise AssetsMissing(f"hack/testbin.sh printed {assets}, which lacks {missing}:\n{_tail(proc.stderr)}")
    return assets


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        _prctl = None


def _child_setup(parent_pid: int, death_signal: bool) -> Callable[[], None]:
    """preexec_fn: have the kernel SIGKILL the child when the thread that started it dies."""
    prctl = _prctl

    def setup() -> None:
        if death_signal and prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

    return setup


def _spawn(argv: list[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    # PR_SET_PDEATHSIG fires when the *thread* that forked dies, not the process. From a
    # short-lived worker thread it would kill the cluster early, so only use it from the main
    # thread; other callers rely on stop() / atexit.
    death_signal = threading.current_thread() is threading.main_thread()
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # a terminal Ctrl-C reaches pytest only; teardown stops us in order
            preexec_fn=_child_setup(os.getpid(), death_signal),  # noqa: PLW1509
        )


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _free_ports(count: int) -> list[int]:
    """Pick distinct free loopback ports (keeps all sockets open until all are chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_CHARS))
            return _tail(f.read().decode(errors="replace"))
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _etcd_data_dir(workdir: Path) -> Path:
    """A fresh etcd data dir on /dev/shm (tmpfs), else under workdir.

    The name carries our pid, so dirs left by a killed session (whose etcd died with it via
    PDEATHSIG) are removed here.
    """
    if _SHM.is_dir() and os.access(_SHM, os.W_OK):
        for stale in _SHM.glob(f"{_ETCD_DIR_PREFIX}*"):
            pid_part = stale.name.removeprefix(_ETCD_DIR_PREFIX).split("-", 1)[0]
            if pid_part.isdigit() and not _pid_alive(int(pid_part)):
                shutil.rmtree(stale, ignore_errors=True)
        with contextlib.suppress(OSError):
            return Path(tempfile.mkdtemp(prefix=f"{_ETCD_DIR_PREFIX}{os.getpid()}-", dir=_SHM))
    return Path(tempfile.mkdtemp(prefix="etcd-data-", dir=workdir))


# --------------------------------------------------------------------------- PKI and credentials


def _openssl(args: str, *, cwd: Path) -> None:
    """Run ``openssl`` with whitespace-separated ``args`` (no argument contains a space)."""
    proc = subprocess.run(["openssl", *args.split()], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {args} failed:\n{_tail(proc.stderr)}")


@dataclass(frozen=True)
class _Pki:
    directory: Path
    ca_crt: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path

    @classmethod
    def at(cls, directory: Path) -> _Pki:
        names = ("ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub")
        return cls(directory, *(directory / name for name in names))


def _make_pki(paths: _Pki) -> None:
    """CA, serving cert (SAN IP:127.0.0.1, DNS:localhost, SKI/AKI) and an RSA service-account key pair."""
    pki = paths.directory
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "ca.ext").write_text(
        "basicConstraints=critical,CA:TRUE\n"
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature\n"
        "subjectKeyIdentifier=hash\n"
    )
    (pki / "apiserver.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    # ECDSA P-256 for the CA and the serving cert (key generation is instant); RSA for the
    # service-account signing key, as kube-apiserver's defaults (RS256) expect.
    ec = "-algorithm EC -pkeyopt ec_paramgen_curve:P-256"
    rsa = "-algorithm RSA -pkeyopt rsa_keygen_bits:2048"
    sign = f"-days 3650 -sha256 -set_serial 0x{token_hex(8)}"
    _openssl(f"genpkey {ec} -out ca.key", cwd=pki)
    _openssl("req -new -key ca.key -subj /CN=gpusched-test-ca -out ca.csr", cwd=pki)
    _openssl(f"x509 -req -in ca.csr -signkey ca.key {sign} -extfile ca.ext -out ca.crt", cwd=pki)
    _openssl(f"genpkey {ec} -out apiserver.key", cwd=pki)
    _openssl("req -new -key apiserver.key -subj /CN=kube-apiserver -out apiserver.csr", cwd=pki)
    sign = f"-days 3650 -sha256 -set_serial 0x{token_hex(8)}"
    ca = "-CA ca.crt -CAkey ca.key"
    _openssl(f"x509 -req -in apiserver.csr {ca} {sign} -extfile apiserver.ext -out apiserver.crt", cwd=pki)
    _openssl(f"genpkey {rsa} -out sa.key", cwd=pki)
    _openssl("pkey -in sa.key -pubout -out sa.pub", cwd=pki)
    for key in ("ca.key", "apiserver.key", "sa.key"):
        (pki / key).chmod(0o600)


def _write_tokens(path: Path, admin_token: str, scheduler_token: str) -> None:
    """Static token file: ``token,user,uid,"group1,group2"``."""
    groups = ",".join(SCHEDULER_GROUPS)
    path.write_text(
        f'{admin_token},admin,gpusched-test-admin,"system:masters"\n'
        f'{scheduler_token},{SCHEDULER_USER},gpusched-test-scheduler,"{groups}"\n'
    )
    path.chmod(0o600)


def _write_kubeconfig(path: Path, *, server: str, ca_file: Path, user: str, context: str, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": context,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


# --------------------------------------------------------------------------- the control plane


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver. Stop it with :meth:`stop`."""

    server: str
    ca_file: Path
    admin_token: str
    scheduler_token: str
    admin_kubeconfig: Path
    scheduler_kubeconfig: Path
    assets: Path
    workdir: Path
    etcd_url: str = ""
    etcd_data_dir: Path | None = None
    apiserver_log: Path | None = None
    etcd_log: Path | None = None
    _apiserver: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _etcd: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl`` (admin kubeconfig unless given another); raises KubectlError if check fails."""
        argv = [
            str(self.assets / "kubectl"),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *args,
        ]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def logs(self) -> str:
        """Tails of the apiserver and etcd logs, for error messages."""
        parts = []
        for name, path in (("kube-apiserver", self.apiserver_log), ("etcd", self.etcd_log)):
            if path is not None:
                parts.append(f"--- {name} log ({path}) ---\n{_read_tail(path)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Terminate kube-apiserver, then etcd; wait for both; remove the etcd data dir. Idempotent."""
        _terminate(self._apiserver)
        _terminate(self._etcd)
        if self.etcd_data_dir is not None:
            shutil.rmtree(self.etcd_data_dir, ignore_errors=True)
            self.etcd_data_dir = None
        _LIVE.pop(id(self), None)


# Control planes not stopped yet; stopped at interpreter exit as a backstop (PDEATHSIG covers hard kills).
_LIVE: dict[int, ControlPlane] = {}


@atexit.register
def _stop_all() -> None:
    for cp in list(_LIVE.values()):
        cp.stop()


def _etcd_argv(assets: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(assets / "etcd"),
        "--name=test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=test={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def _apiserver_argv(assets: Path, pki: _Pki, tokens: Path, etcd_url: str, port: int) -> list[str]:
    return [
        str(assets / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={pki.directory}",
        f"--tls-cert-file={pki.serving_crt}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_crt}",
        f"--token-auth-file={tokens}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        "--profiling=false",
        # No controller-manager: nothing would remove the not-ready taint or create `default` SAs.
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # Tests and benchmarks create many objects quickly.
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        # Watches of ConfigMaps bypass the watch cache and go to etcd, so a test can compact etcd
        # and get a real 410 Gone for an old resourceVersion (the cache would replay instead).
        "--watch-cache-sizes=configmaps#0",
    ]


def _wait_ready(cp: ControlPlane, pki: _Pki, timeout: float) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    request = urllib.request.Request(f"{cp.server}/readyz", headers={"Authorization": f"Bearer {cp.admin_token}"})
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        for name, proc in (("etcd", cp._etcd), ("kube-apiserver", cp._apiserver)):
            if proc is not None and (rc := proc.poll()) is not None:
                logs = cp.logs()
                raise ControlPlaneError(
                    f"{name} exited with {rc} before the apiserver was ready\n{logs}",
                    port_conflict="address already in use" in logs,
                )
        try:
            with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
                body = resp.read().decode(errors="replace").strip()
                if resp.status == 200 and body == "ok":
                    return
                last = f"HTTP {resp.status}: {body[:500]}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}"
        except (OSError, ssl.SSLError) as exc:
            last = repr(exc)
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{cp.server}/readyz not ok after {timeout:.0f}s (last: {last})\n{cp.logs()}")
        time.sleep(0.1)


def start_control_plane(workdir: Path, assets: Path, *, timeout: float = 60.0, attempts: int = 3) -> ControlPlane:
    """Start etcd and kube-apiserver on free loopback ports; return once ``/readyz`` says ``ok``.

    PKI, tokens, kubeconfigs and logs go under ``workdir``; the etcd data dir goes on
    /dev/shm when possible. Ports are picked free just before start; a lost race for a
    port is retried (``attempts``). Raises :class:`ControlPlaneError` with log tails.
    """
    workdir = workdir.resolve()
    assets = assets.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    missing = [name for name in ("kube-apiserver", "etcd", "kubectl") if not (assets / name).is_file()]
    if missing:
        raise AssetsMissing(f"{assets} lacks {missing}")
    pki = _Pki.at(workdir / "pki")
    tokens = pki.directory / "tokens.csv"
    admin_token, scheduler_token = token_hex(24), token_hex(24)
    admin_kc, sched_kc = workdir / "admin.kubeconfig", workdir / "scheduler.kubeconfig"
    etcd_log, apiserver_log = workdir / "etcd.log", workdir / "kube-apiserver.log"

    for attempt in range(1, attempts + 1):
        etcd_client, etcd_peer, port = _free_ports(3)
        server = f"https://127.0.0.1:{port}"
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        data_dir = _etcd_data_dir(workdir)
        cp = ControlPlane(
            server=server,
            ca_file=pki.ca_crt,
            admin_token=admin_token,
            scheduler_token=scheduler_token,
            admin_kubeconfig=admin_kc,
            scheduler_kubeconfig=sched_kc,
            assets=assets,
            workdir=workdir,
            etcd_url=etcd_url,
            etcd_data_dir=data_dir,
            apiserver_log=apiserver_log,
            etcd_log=etcd_log,
        )
        _LIVE[id(cp)] = cp
        try:
            # etcd first: it comes up while the PKI is made, and the apiserver finds it listening.
            cp._etcd = _spawn(_etcd_argv(assets, data_dir, etcd_client, etcd_peer), etcd_log, workdir)
            if attempt == 1:
                _make_pki(pki)
                _write_tokens(tokens, admin_token, scheduler_token)
            for path, user, context, token in (
                (admin_kc, "admin", ADMIN_CONTEXT, admin_token),
                (sched_kc, SCHEDULER_SA, SCHEDULER_CONTEXT, scheduler_token),
            ):
                _write_kubeconfig(path, server=server, ca_file=pki.ca_crt, user=user, context=context, token=token)
            cp._apiserver = _spawn(_apiserver_argv(assets, pki, tokens, etcd_url, port), apiserver_log, workdir)
            _wait_ready(cp, pki, timeout)
        except ControlPlaneError as exc:
            cp.stop()
            if exc.port_conflict and attempt < attempts:
                continue
            raise
        except BaseException:
            cp.stop()
            raise
        return cp
    raise AssertionError("unreachable")  # pragma: no cover


@contextmanager
def control_plane(workdir: Path, assets: Path | None = None, *, timeout: float = 60.0) -> Iterator[ControlPlane]:
    """Start a control plane (finding the binaries if ``assets`` is None); stop it on exit."""
    cp = start_control_plane(workdir, assets if assets is not None else find_assets(), timeout=timeout)
    try:
        yield cp
    finally:
        cp.stop()
