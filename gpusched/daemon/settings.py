"""What ``gpusched run`` is told on its command line, and the names it uses by default."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.config import GpuschedConfig
from gpusched.metrics.source import DEFAULT_GPU_LABEL, DEFAULT_NODE_LABEL

SCHEDULER_NAME = "gpu-scheduler"
BOUND_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Pods that hold resources on a node, whoever bound them."""


@dataclass(frozen=True)
class DaemonSettings:
    """Everything ``gpusched run`` is told on its command line."""

    kubeconfig: Path | None = None
    """None: the pod's service account (in-cluster)."""
    context: str | None = None
    namespace: str = "gpusched-system"
    """Where the Lease and the ConfigMap live."""
    config_map: str | None = None
    """Name of the ConfigMap to follow (None: ``config`` is used and never reloaded)."""
    config: GpuschedConfig = field(default_factory=GpuschedConfig)
    scheduler_name: str = SCHEDULER_NAME
    identity: str = ""
    leader_elect: bool = True
    lease_name: str = "gpu-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    metrics_host: str = ""
    """"": every interface, of both address families (a probe may come over IPv6)."""
    metrics_port: int = 8080
    kube_qps: float = 50.0
    kube_burst: int = 100
    policy: str = "cpsat"
    seed: int = 0
    prometheus_url: str | None = None
    """Where GPU utilisation measured by DCGM is read (None: it is not)."""
    utilisation_query: str | None = None
    """The instant query that answers it (None: ``metrics.source.default_query``)."""
    utilisation_node_label: str = DEFAULT_NODE_LABEL
    utilisation_gpu_label: str = DEFAULT_GPU_LABEL
    utilisation_poll_s: float = 15.0
    prometheus_token_file: Path | None = None
    """A file holding the bearer token sent with each query (read again at each poll)."""
    prometheus_ca_file: Path | None = None
    """The CA bundle an https Prometheus is verified by (None: the system's)."""


def default_identity() -> str:
    """The pod name when running in a pod (else the host name), and a random suffix, as
    kube-scheduler names itself (host name, '_', a UUID): a container restarted in the same pod
    (killed for memory, or by its liveness probe) is another instance, so it waits for the Lease
    its predecessor held to run out rather than renew it at once while that one's Bindings may
    still land."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
