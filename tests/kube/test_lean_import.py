"""The client loads kubernetes-asyncio without its generated models, and the full client still works."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import sys
    import gpusched.kube.client
    print("models" if "kubernetes_asyncio.client.models.v1_pod" in sys.modules else "lean")
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client import V1Pod
    print(client.CoreV1Api.__name__, V1Pod(metadata=client.V1ObjectMeta(name="x")).metadata.name)
    import kubernetes_asyncio.watch
    print(type(kubernetes_asyncio.watch.Watch).__name__)
    """
)


def test_daemon_client_skips_the_generated_models_until_someone_asks_for_them() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["lean", "CoreV1Api", "x", "type"]


def test_an_already_imported_client_is_used_as_it_is() -> None:
    probe = "import kubernetes_asyncio.client as c\nimport gpusched.kube._k8s as k\nprint(k.ApiClient is c.ApiClient)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
