"""Follows the solver configuration in one ConfigMap and hot-reloads it.

The document lives under the key ``config.yaml``.  A document that fails
validation is rejected with the field and the reason (a log line and a
Warning Event on the ConfigMap); the last good configuration stays in force.
A deleted ConfigMap also leaves the last good configuration in force.  Before
the first document is accepted there is none: the scheduler waits for one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from gpusched.config import ConfigError, GpuschedConfig, load_config

__all__ = ["CONFIG_KEY", "ConfigMapHandler"]

log = structlog.get_logger("gpusched.config")

CONFIG_KEY = "config.yaml"


class ConfigMapHandler:
    """A watch handler for one ConfigMap; ``on_config`` gets each accepted document."""

    def __init__(
        self,
        namespace: str,
        name: str,
        on_config: Callable[[GpuschedConfig], None],
        on_rejected: Callable[[dict[str, str], str], Coroutine[Any, Any, None]] | None = None,
        spawn: Callable[[Coroutine[Any, Any, None], str], object] | None = None,
        on_result: Callable[[bool], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.on_config = on_config
        self.on_rejected = on_rejected
        self.spawn = spawn
        self.on_result = on_result
        self.last_rv = ""
        self.rejected = ""
        """The latest rejection message ("" once a document has been accepted since)."""
        self.accepted = False
        """Whether a document was accepted since the start."""
        self.read = asyncio.Event()
        """Set once the ConfigMap has been read (listed, found or not, or watched): until then,
        nothing is known of it."""

    def kept(self) -> str:
        """What stays in force when a document is rejected (or the ConfigMap is gone)."""
        return "the last good configuration stays" if self.accepted else "no pod is placed until a valid one is in it"

    def replace(self, objects: list[dict[str, Any]]) -> None:
        """After a list: the ConfigMap or nothing."""
        self.read.set()
        if not objects:
            (log.warning if self.accepted else log.error)(
                f"configuration ConfigMap not found; {self.kept()}",
                configmap=f"{self.namespace}/{self.name}",
            )
            return
        self.apply("ADDED", objects[0])

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """Validate and take a new version of the document."""
        self.read.set()
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            log.warning(f"configuration ConfigMap deleted; {self.kept()}", configmap=f"{self.namespace}/{self.name}")
            return
        rv = str(meta.get("resourceVersion", ""))
        if rv and rv == self.last_rv:
            return
        text = (obj.get("data") or {}).get(CONFIG_KEY)
        source = f"ConfigMap {self.namespace}/{self.name} key {CONFIG_KEY}"
        try:
            if text is None:
                raise ConfigError(f"{source}: key missing; put the solver document under {CONFIG_KEY}")
            cfg = load_config(text, source)
        except ConfigError as exc:
            self.last_rv = rv
            self.rejected = str(exc)
            log.error(f"configuration rejected; {self.kept()}", error=str(exc), rv=rv)
            if self.on_result is not None:
                self.on_result(False)
            if self.on_rejected is not None and self.spawn is not None:
                involved = {
                    "kind": "ConfigMap",
                    "apiVersion": "v1",
                    "namespace": self.namespace,
                    "name": self.name,
                    "uid": str(meta.get("uid", "")),
                }
                self.spawn(self.on_rejected(involved, str(exc)), "config-event")
            return
        self.on_config(cfg)  # should it raise, the relist that follows offers the document again
        self.last_rv = rv
        self.rejected = ""
        self.accepted = True
        log.info("configuration applied", configmap=f"{self.namespace}/{self.name}", rv=rv)
        if self.on_result is not None:
            self.on_result(True)
