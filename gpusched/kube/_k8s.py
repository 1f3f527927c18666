"""kubernetes-asyncio's API client and config loaders, without its generated models.

``import kubernetes_asyncio`` runs package initialisers that import every
generated API and model class (about 60 MiB of resident memory and half a
second).  gpusched sends and decodes JSON itself and needs only ``ApiClient``,
``Configuration`` and the kubeconfig / in-cluster loaders.  So the two
initialisers (``kubernetes_asyncio`` and ``kubernetes_asyncio.client``, and the
``models`` package that ``api_client`` imports) are registered as *deferred*
packages: their submodules import as usual, and the first access to any other
name runs the real initialiser, so code that does use the full client (tests, a
plugin) still gets all of it.  If kubernetes-asyncio is already imported, it is
used as it is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any


def _deferred_package(name: str, path: Sequence[str] | None) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"package {name} is not installed", name=name)
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)
    locations = list(spec.submodule_search_locations)

    def rest_of_package(attr: str) -> Any:
        if not attr.startswith("__") and importlib.machinery.PathFinder.find_spec(f"{name}.{attr}", locations):
            return importlib.import_module(f"{name}.{attr}")
        # Anything else: the package's own initialiser, once.
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, attr)

    module.__dict__["__getattr__"] = rest_of_package
    sys.modules[name] = module
    parent, _, last = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], last, module)
    return module


def _load() -> None:
    root = _deferred_package("kubernetes_asyncio", None)
    client = _deferred_package("kubernetes_asyncio.client", root.__path__)
    _deferred_package("kubernetes_asyncio.client.models", client.__path__)
    if "ApiClient" not in client.__dict__:
        client.__dict__["Configuration"] = importlib.import_module(
            "kubernetes_asyncio.client.configuration"
        ).Configuration
        client.__dict__["ApiClient"] = importlib.import_module("kubernetes_asyncio.client.api_client").ApiClient


_load()

from kubernetes_asyncio.client.api_client import ApiClient  # noqa: E402
from kubernetes_asyncio.client.configuration import Configuration  # noqa: E402
from kubernetes_asyncio.config import load_incluster_config, load_kube_config  # noqa: E402
from kubernetes_asyncio.config.kube_config import refresh_token  # noqa: E402

__all__ = ["ApiClient", "Configuration", "load_incluster_config", "load_kube_config", "refresh_token"]
