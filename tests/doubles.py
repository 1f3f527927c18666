"""Stand-ins for the API server where a test drives a real ``Scheduler`` in process: the client
it reads before any request, and an API server that answers every Binding and records what the
scheduler writes."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.daemon.handlers import NodeHandler
from gpusched.kube.binder import Binder, BindResult
from gpusched.kube.client import Kube, RateLimiter
from gpusched.model import Pod
from tests.e2e import kit


class IdleClient:
    """What the scheduler reads of its client before any request: the rate limiter."""

    def __init__(self) -> None:
        self.limiter = RateLimiter(50, 100)

    def sibling(self) -> IdleClient:
        return self

    def apart(self) -> IdleClient:
        return self


class RecordingApi:
    """Every Binding succeeds; Bindings and Events are recorded, conditions dropped."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        """(pod key, reason, message) of every Event written."""

    async def bind(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> tuple[BindResult, str]:
        self.bound.append(pod.key)
        return BindResult.BOUND, ""

    async def event(self, pod: Pod, reason: str, message: str, kind: str = "Normal", fenced: bool = False) -> None:
        self.events.append((pod.key, reason, message))

    async def unschedulable(self, *_: Any, **__: Any) -> None:
        pass

    async def exists(self, pod: Pod) -> bool | None:
        return True

    def reasons(self, key: str) -> list[str]:
        """The reasons of the Events written on the pod ``key``."""
        return [reason for k, reason, _ in self.events if k == key]

    def failed(self, key: str) -> list[str]:
        """The messages of the FailedScheduling Events written on the pod ``key``."""
        return [message for k, reason, message in self.events if k == key and reason == "FailedScheduling"]


def member_pod(name: str, gang: str = "", models: tuple[str, ...] = (), node: str = "") -> dict[str, Any]:
    """A one-GPU pod for scheduler ``s`` in ``default`` as the API server sends it; with ``gang``,
    a member of that pod group of at least 2."""
    obj = kit.pod(name, "s", gpus=1, models=models, node_name=node)
    obj["metadata"].update({"namespace": "default", "uid": f"uid-{name}", "labels": {}})
    if gang:
        obj["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = gang
        obj["metadata"]["annotations"]["gpusched.io/gang-min-members"] = "2"
    return obj


async def settle(s: Scheduler) -> None:
    """Until the scheduler's binds, Events and conditions have all run."""
    await asyncio.sleep(0)
    while s.pending_tasks():
        await asyncio.wait(s.pending_tasks())


def one_node_scheduler(api: object, gpus: int) -> Scheduler:
    """A scheduler of pods for ``s`` (best fit) talking to ``api``, over one node ``n0`` with
    ``gpus`` A100s."""
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit"), cast(Kube, IdleClient()))
    s.binder = cast(Binder, api)
    NodeHandler(s).apply("ADDED", kit.node("n0", gpus, "A100"))
    return s


def web_budget(s: Scheduler, namespace: str = "default", allowed: int = 1) -> dict[str, Any]:
    """The PodDisruptionBudget ``web`` (the pods labelled ``app=web`` in ``namespace``, ``allowed``
    disruptions) as ``s``'s watch lists it; the object, to be sent again changed."""
    budget = {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": allowed},
    }
    next(r.handler for r in s.reflectors if r.name == "disruption-budgets").replace([budget])
    return budget
