"""Objects the watches bring that cannot be read: each is left out of the books with a warning
naming the field, and the watch goes on (a handler that raised would relist in a loop)."""

from __future__ import annotations

from typing import Any

from gpusched.daemon.handlers import NodeHandler
from gpusched.daemon.scheduler import Scheduler
from tests.doubles import RecordingApi, member_pod, one_node_scheduler
from tests.e2e import kit


def test_a_node_whose_labels_are_no_labels_leaves_the_books_and_the_node_watch_goes_on() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    assert "n0" in s.cache.nodes
    broken = kit.node("n0", 2, "A100")
    broken["metadata"]["labels"] = ["nvidia.com/gpu.product=A100"]
    NodeHandler(s).apply("MODIFIED", broken)  # raised AttributeError before
    assert "n0" not in s.cache.nodes
    NodeHandler(s).apply("MODIFIED", kit.node("n0", 2, "A100"))
    assert "n0" in s.cache.nodes


def test_a_pod_whose_fields_have_the_wrong_type_is_queued_with_its_error_and_the_pod_watches_go_on() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    broken = member_pod("p")
    broken["spec"]["containers"] = {"name": "c"}  # no list
    broken["status"] = {"conditions": 1}
    s._pending.apply("ADDED", broken)  # raised AttributeError before
    assert "default/p" in s.queue
    bound = member_pod("q", node="n0")
    bound["metadata"]["labels"] = ["app=web"]
    s._bound.apply("ADDED", bound)  # raised AttributeError before
    assert s.cache.holds("default/q", "uid-q")


def _handler(s: Scheduler, name: str) -> Any:
    return next(r.handler for r in s.reflectors if r.name == name)


def test_a_claim_or_namespace_that_cannot_be_read_leaves_the_books_and_its_watch_goes_on() -> None:
    s = one_node_scheduler(RecordingApi(), gpus=2)
    claim = {"metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "pv"}}
    _handler(s, "claims").replace([claim])
    assert s.claims.problem("default/p", "uid-p", ("data",), (), {}) != 'persistentvolumeclaim "data" not found'
    _handler(s, "claims").apply("MODIFIED", {**claim, "status": ["Bound"]})  # raised AttributeError before
    assert s.claims.problem("default/p", "uid-p", ("data",), (), {}) == 'persistentvolumeclaim "data" not found'
    _handler(s, "claims").replace([{**claim, "spec": "pv"}])
    _handler(s, "namespaces").replace([{"metadata": {"name": "team-a", "labels": {"team": "a"}}}])
    assert s.namespaces == {"team-a": {"team": "a"}}
    _handler(s, "namespaces").apply("MODIFIED", {"metadata": {"name": "team-a", "labels": ["team=a"]}})
    assert s.namespaces == {}  # as if it were not there: no namespaceSelector picks it
