"""The binder's requests against a scripted server: how long it waits after a 429 (Retry-After),
that a lost Lease stops a queued Binding, that verdicts never hold a Binding up, and what a
Binding answered with a server error is taken to mean."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gpusched.kube import client
from gpusched.kube.binder import Binder, BindResult
from tests.factories import pod
from tests.kube.conftest import serving


def _status(code: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": reason.lower()}
    return web.json_response(body, status=code, headers=headers)


async def test_a_binding_refused_with_retry_after_is_retried_no_sooner(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    kubeconfig, script, seen = server
    script += [
        _status(429, "TooManyRequests", {"Retry-After": "3"}),
        _status(503, "ServiceUnavailable", {"Retry-After": "1"}),
        _status(500, "InternalError"),  # no header: the usual short backoff
        web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201),
    ]
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        binder = Binder(kube, "me", attempts=5, sleep=record)
        result = await binder.bind(pod("p", gpus=1), "n1", (0,))
    finally:
        await kube.close()
    assert result == (BindResult.BOUND, "")
    assert seen == ["POST /api/v1/namespaces/default/pods/p/binding"] * 4
    assert waits[0] == 3.0
    assert waits[1] == 1.0
    assert waits[2] < 1.0


def test_retry_after_is_read_as_client_go_reads_it() -> None:
    assert client.retry_after(429, "2") == 2.0
    assert client.retry_after(503, " 7 ") == 7.0
    assert client.retry_after(500, "2") == 2.0  # every 5xx, from 500 on
    assert client.retry_after(429, "3600") == client.RETRY_AFTER_MAX_S
    assert client.retry_after(429, "Wed, 21 Oct 2026 07:28:00 GMT") is None  # dates are not honoured
    assert client.retry_after(409, "2") is None  # only on 429 and 5xx
    assert client.retry_after(429, None) is None
    assert client.retry_after(429, "-4") == 0.0


async def test_a_binding_queued_behind_the_rate_limit_is_not_sent_once_leadership_is_lost(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    kubeconfig, script, seen = server
    script += [web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)]
    kube = await client.connect(kubeconfig, None, 2, 1)  # one token, then one every half second
    leading = True
    try:
        binder = Binder(kube, "me", leading=lambda: leading)
        await kube.limiter.acquire()  # spent: the Binding waits for the next token
        bind = asyncio.create_task(binder.bind(pod("p", gpus=1), "n1", (0,)))
        await asyncio.sleep(0.1)  # it passed the check and waits in the limiter
        leading = False  # stepped down meanwhile
        result = await bind
    finally:
        await kube.close()
    assert result == (BindResult.FAILED, "no longer the leader")
    assert seen == []


async def test_a_binding_queued_behind_the_rate_limit_is_not_sent_to_a_node_deleted_meanwhile(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    """The API server would accept it, and the pod be deleted with the node it never reached."""
    kubeconfig, script, seen = server
    script += [web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)]
    kube = await client.connect(kubeconfig, None, 2, 1)
    nodes = {"n1"}
    try:
        binder = Binder(kube, "me", node_known=lambda name: name in nodes)
        await kube.limiter.acquire()
        bind = asyncio.create_task(binder.bind(pod("p", gpus=1), "n1", (0,)))
        await asyncio.sleep(0.1)  # it passed the check and waits in the limiter
        nodes.clear()  # the node is deleted meanwhile
        result = await bind
    finally:
        await kube.close()
    assert result == (BindResult.WITHDRAWN, "node n1 is gone")
    assert seen == []


async def test_a_condition_retried_after_the_pod_was_bound_is_not_sent_again(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    """The first attempt meets a 503; while the retry waits, the pod is bound: Unschedulable
    must not land on a bound pod."""
    kubeconfig, script, seen = server
    script += [_status(503, "ServiceUnavailable", {"Retry-After": "1"}), web.json_response({"kind": "Status"})]
    stands = True

    async def bound_meanwhile(seconds: float) -> None:
        nonlocal stands
        stands = False

    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        binder = Binder(kube, "me", sleep=bound_meanwhile)
        with capture_logs() as logs:
            await binder.unschedulable(replace(pod("p", gpus=1), uid="u"), "no GPU free", still=lambda: stands)
    finally:
        await kube.close()
    assert seen == ["PATCH /api/v1/namespaces/default/pods/p/status"]
    assert [e["event"] for e in logs] == ["condition not written: the pod was bound or replaced since"]


async def test_unschedulable_verdicts_do_not_make_a_binding_wait_its_turn(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    kubeconfig, script, seen = server
    script += [web.json_response({"kind": "Status", "code": 200}) for _ in range(4)]
    # One request now, then one every half second: the Binding, sent at once, reaches the server
    # well before the second verdict's token comes, however slowly a busy machine runs the loop.
    kube = await client.connect(kubeconfig, None, 2, 1)
    try:
        binder = Binder(kube, "me", events=kube.sibling())
        verdicts = [
            asyncio.create_task(binder.unschedulable(replace(pod(f"v{i}", gpus=1), uid=f"u{i}"), "no GPU free"))
            for i in range(3)
        ]
        await asyncio.sleep(0)  # they are queued first
        assert await binder.bind(pod("p", gpus=1), "n1", (0,)) == (BindResult.BOUND, "")
        await asyncio.gather(*verdicts)
    finally:
        await kube.close()
    binding = "POST /api/v1/namespaces/default/pods/p/binding"
    assert sorted(seen) == [f"PATCH /api/v1/namespaces/default/pods/v{i}/status" for i in range(3)] + [binding]
    assert seen.index(binding) <= 1  # not behind the three verdicts queued before it


def _pod_object(uid: str, node: str) -> web.Response:
    return web.json_response({"kind": "Pod", "metadata": {"name": "p", "uid": uid}, "spec": {"nodeName": node}})


@pytest.mark.parametrize(
    ("read_back", "expected"),
    [
        (_status(503, "ServiceUnavailable"), BindResult.UNKNOWN),  # cannot tell: keep the GPUs
        (_status(403, "Forbidden"), BindResult.FAILED),  # will not tell: retried as a refusal
        (_pod_object("u1", "n1"), BindResult.BOUND),  # the server wrote it before it failed
        (_pod_object("u1", "n2"), BindResult.TAKEN),
        (_pod_object("u1", ""), BindResult.UNKNOWN),  # not written yet: read again before its room is given up
        (_pod_object("u2", "n1"), BindResult.GONE),
        (_status(404, "NotFound"), BindResult.GONE),  # deleted meanwhile
    ],
)
async def test_a_binding_answered_with_a_server_error_is_read_back_before_it_counts_as_failed(
    server: tuple[Path, list[web.Response], list[str]], read_back: web.Response, expected: BindResult
) -> None:
    kubeconfig, script, seen = server
    script += [_status(500, "InternalError"), read_back]  # e.g. etcd timed out after the write
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        result, why = await Binder(kube, "me", attempts=1).bind(replace(pod("p", gpus=1), uid="u1"), "n1", (0,))
    finally:
        await kube.close()
    assert seen == ["POST /api/v1/namespaces/default/pods/p/binding", "GET /api/v1/namespaces/default/pods/p"]
    assert result is expected
    if expected in (BindResult.UNKNOWN, BindResult.FAILED):
        assert "internalerror" in why  # the Binding's own answer is what the pod's Event shows


async def test_a_binding_with_no_answer_read_back_unbound_is_read_again_before_it_counts_as_failed(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    """An API server that timed out on a Binding may complete the write after the pod is read
    back: the pod's GPUs are not given up on the first unbound read (a share given to another
    pod meanwhile would be one GPU twice over), only on the next, made when the outcome is
    resolved (``Scheduler._resolve``)."""
    kubeconfig, script, seen = server
    script += [_status(504, "Timeout"), _pod_object("u1", ""), _pod_object("u1", "")]
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    p = replace(pod("p", gpus=1), uid="u1")
    try:
        binder = Binder(kube, "me", attempts=1)
        first, why = await binder.bind(p, "n1", (0,))
        later = await binder.settle(p, "n1", why)
    finally:
        await kube.close()
    assert first is BindResult.UNKNOWN
    assert later == (BindResult.FAILED, why)
    assert "timeout" in why
    assert seen == [
        "POST /api/v1/namespaces/default/pods/p/binding",
        "GET /api/v1/namespaces/default/pods/p",
        "GET /api/v1/namespaces/default/pods/p",
    ]


async def test_a_binding_is_given_up_when_the_lead_runs_out_and_asks_the_server_to_give_up_too(
    tmp_path: Path,
) -> None:
    """An API server that holds the Binding (queued behind others) must not write it after the
    lead is over, when another instance may be binding: the request carries what is left of the
    lead as its timeout, and the client stops waiting then."""
    asked: list[str] = []
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.Response:
        if request.method == "POST":
            asked.append(request.query.get("timeout", ""))
            await release.wait()  # held until the test ends
            return web.json_response({"kind": "Status", "code": 201}, status=201)
        return _pod_object("u1", "")  # read back: not bound

    async with serving(answer, tmp_path) as kubeconfig:
        kube = await client.connect(kubeconfig, None, 1000, 1000)
        loop = asyncio.get_running_loop()
        until = loop.time() + 0.5  # the lead holds half a second more
        try:
            binder = Binder(kube, "me", attempts=1, lead_left=lambda: until - loop.time())
            result = await asyncio.wait_for(binder.bind(replace(pod("p", gpus=1), uid="u1"), "n1", (0,)), 10)
            gave_up = loop.time()
        finally:
            release.set()
            await kube.close()
    assert result[0] is BindResult.UNKNOWN  # read back unbound after the timeout: read again later
    assert gave_up < until + 2.0  # not the client's usual 30 s
    (timeout,) = asked
    assert timeout.endswith("s")
    assert 0 < float(timeout.removesuffix("s")) <= 0.5


async def test_a_binding_cut_off_when_the_lead_ran_out_is_read_back_before_it_counts_as_failed(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    """The first attempt got no answer (a server error), and the lead was gone before the retry:
    the Binding may have been written, so the pod is read back (no lead needed for that)."""
    kubeconfig, script, seen = server
    script += [_status(503, "ServiceUnavailable"), _pod_object("u1", "n1")]
    attempts = 0

    def leading() -> bool:  # holds for the first attempt's checks only
        nonlocal attempts
        attempts += 1
        return attempts <= 2

    async def no_wait(_: float) -> None:
        pass

    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        binder = Binder(kube, "me", attempts=4, leading=leading, sleep=no_wait)
        result = await binder.bind(replace(pod("p", gpus=1), uid="u1"), "n1", (0,))
    finally:
        await kube.close()
    assert seen == ["POST /api/v1/namespaces/default/pods/p/binding", "GET /api/v1/namespaces/default/pods/p"]
    assert result == (BindResult.BOUND, "")  # it had been written


async def test_a_read_back_answered_with_something_other_than_a_pod_is_no_answer(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    kubeconfig, script, _ = server
    script += [web.Response(text="<html>sign in</html>", content_type="text/html")]  # a proxy's page
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        result, why = await Binder(kube, "me").settle(replace(pod("p", gpus=1), uid="u1"), "n1", "no answer")
    finally:
        await kube.close()
    assert result is BindResult.UNKNOWN
    assert "the answer is not a pod" in why


async def test_a_binding_names_the_pod_its_uid_the_node_and_the_gpus(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    async with serving(answer, tmp_path) as kubeconfig:
        kube = await client.connect(kubeconfig, None, 1000, 1000)
        try:
            result = await Binder(kube, "me").bind(replace(pod("p", gpus=2), uid="u1"), "n1", (0, 3))
        finally:
            await kube.close()
    assert result == (BindResult.BOUND, "")
    assert bodies == [
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": "p",
                "namespace": "default",
                "uid": "u1",  # a later pod of the same name is not bound in its place
                "annotations": {"gpusched.io/gpu-indices": "0,3"},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        }
    ]


@pytest.mark.parametrize(
    ("answers", "expected", "requests"),
    [
        ([_status(404, "NotFound")], BindResult.GONE, ["POST"]),  # the pod is gone: nothing to read
        ([_status(409, "Conflict"), _pod_object("u1", "n2")], BindResult.TAKEN, ["POST", "GET"]),
        ([_status(409, "Conflict"), _pod_object("u1", "n1")], BindResult.BOUND, ["POST", "GET"]),  # our own
        ([_status(422, "Invalid")], BindResult.FAILED, ["POST"]),  # refused: nothing was written
    ],
)
async def test_what_a_refused_binding_means(
    server: tuple[Path, list[web.Response], list[str]],
    answers: list[web.Response],
    expected: BindResult,
    requests: list[str],
) -> None:
    kubeconfig, script, seen = server
    script += answers
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        result, _ = await Binder(kube, "me", attempts=3).bind(replace(pod("p", gpus=1), uid="u1"), "n1", (0,))
    finally:
        await kube.close()
    assert result is expected
    assert [s.split()[0] for s in seen] == requests


def _invalid(message: str) -> web.Response:
    body = {"kind": "Status", "status": "Failure", "code": 422, "reason": "Invalid", "message": message}
    return web.json_response(body, status=422)


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        # The UID precondition failed: the name is another pod's now (API servers say it thus).
        (_invalid('Pod "v" is invalid: metadata.uid: Invalid value: "u9": field is immutable'), "pod replaced"),
        (_status(409, "Conflict"), "pod replaced"),  # servers that check it as a precondition
        (_invalid('Pod "v" is invalid: status.conditions[0].reason: Required value'), "refused"),
        (_status(404, "NotFound"), None),  # deleted meanwhile: nothing to say
    ],
)
async def test_a_condition_the_server_refuses_is_told_apart_from_a_pod_replaced_under_its_name(
    server: tuple[Path, list[web.Response], list[str]], answer: web.Response, logged: str | None
) -> None:
    kubeconfig, script, seen = server
    script.append(answer)
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        with capture_logs() as logs:
            await Binder(kube, "me").unschedulable(replace(pod("v", gpus=1), uid="u9"), "no GPU free")
    finally:
        await kube.close()
    assert seen == ["PATCH /api/v1/namespaces/default/pods/v/status"]  # not retried
    events = [(e["event"], e["log_level"]) for e in logs]
    if logged is None:
        assert events == []
    elif logged == "pod replaced":
        assert events == [("condition not written: pod replaced", "info")]
    else:
        assert events == [("condition not written", "warning")]


async def test_the_same_message_is_written_again_only_when_the_nominated_node_changed(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    kubeconfig, script, seen = server
    script += [_status(200, "OK"), _status(200, "OK")]
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    v = replace(pod("v", gpus=1), uid="u9")
    try:
        b = Binder(kube, "me")
        await b.unschedulable(v, "waiting", "waiting", "n1", "n1")  # nothing new: nothing sent
        await b.unschedulable(v, "waiting", "waiting", "n2", "n1")  # a member moved to another node
        await b.unschedulable(v, "waiting", "waiting", None, "n2")  # its room given up
    finally:
        await kube.close()
    assert seen == ["PATCH /api/v1/namespaces/default/pods/v/status"] * 2


async def test_the_same_message_is_written_again_when_its_reason_changed(
    server: tuple[Path, list[web.Response], list[str]],
) -> None:
    """A pod told ``Unschedulable`` (by an older version, or before its tenant's limit was what
    held it back) is told ``TenantLimit`` even when the message reads the same."""
    kubeconfig, script, seen = server
    script += [_status(200, "OK")]
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    v = replace(pod("v", gpus=1), uid="u9")
    try:
        b = Binder(kube, "me")
        await b.unschedulable(v, "at its limit", "at its limit", reason="TenantLimit", current_reason="TenantLimit")
        await b.unschedulable(v, "at its limit", "at its limit", reason="TenantLimit", current_reason="Unschedulable")
    finally:
        await kube.close()
    assert seen == ["PATCH /api/v1/namespaces/default/pods/v/status"]


async def test_an_event_posted_again_after_a_lost_answer_is_not_written_twice(tmp_path: Path) -> None:
    names: list[str] = []
    written: set[str] = set()

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        name = body["metadata"]["name"]
        names.append(name)
        if name in written:
            return _status(409, "AlreadyExists")
        written.add(name)
        return _status(503, "ServiceUnavailable")  # written, but the answer says otherwise

    async with serving(answer, tmp_path) as kubeconfig:
        kube = await client.connect(kubeconfig, None, 1000, 1000)
        try:
            with capture_logs() as logs:
                await Binder(kube, "me").event(replace(pod("p"), uid="u1"), "Scheduled", "bound to n1")
        finally:
            await kube.close()
    assert len(names) == 2
    assert names[0] == names[1]
    assert names[0].startswith("p.")
    assert [e for e in logs if e["event"] == "event not written"] == []


async def test_a_repeat_the_role_may_not_patch_is_written_as_a_new_event_with_its_count(tmp_path: Path) -> None:
    """A ClusterRole from before Events were counted grants ``create`` only: a repeat's PATCH is
    refused (403), and the repeat is written as an Event of its own, its count carried on."""
    seen: list[tuple[str, int]] = []

    async def answer(request: web.Request) -> web.Response:
        if request.method == "PATCH":
            seen.append(("PATCH", 0))
            return _status(403, "Forbidden")
        seen.append(("POST", (await request.json())["count"]))
        return web.json_response({}, status=201)

    async with serving(answer, tmp_path) as kubeconfig:
        kube = await client.connect(kubeconfig, None, 1000, 1000)
        try:
            with capture_logs() as logs:
                b = Binder(kube, "me", event_repeat_s=0)
                for _ in range(2):
                    await b.event(replace(pod("p"), uid="u1"), "FailedScheduling", "0/1 nodes are available", "Warning")
        finally:
            await kube.close()
    assert seen == [("POST", 1), ("PATCH", 0), ("POST", 2)]
    assert [e for e in logs if e["event"] == "event not written"] == []


class TimedApi:
    """Answers every request at once, recording the time limit each one was sent with, as
    ``Kube.request`` sets it (the client's 30 s, or what the ``deadline`` leaves, when less)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []
        """(method, path, timeout) of every request."""

    async def request(
        self,
        method: str,
        path: str,
        query: Any = None,
        body: Any = None,
        content_type: str = client.JSON,
        timeout: float | None = 30.0,
        before_send: Callable[[], None] | None = None,
        deadline: Callable[[], float] | None = None,
    ) -> client.Response:
        if before_send is not None:
            before_send()
        limit = min(timeout or math.inf, deadline() if deadline is not None else math.inf)
        self.sent.append((method, path, limit))
        if method == "GET":
            return client.Response(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        return client.Response(201 if method == "POST" else 200, {})


async def test_every_write_made_for_the_leader_is_over_by_the_end_of_the_lead() -> None:
    """Not only Bindings: a victim's deletion, an eviction, a node's labels, a MIG layout or a
    pod's condition sent just before the lead ends must not land after another instance took
    over, so each carries what is left of the lead as its time limit."""
    api = TimedApi()
    binder = Binder(
        cast(client.Kube, api), "me", leading=lambda: True, lead_left=lambda: 0.5, events=cast(client.Kube, api)
    )
    victim, by = replace(pod("v", gpus=1), uid="uv"), replace(pod("p", gpus=1), uid="up")
    assert await binder.bind(by, "n1", (0,)) == (BindResult.BOUND, "")
    assert await binder.preempt(victim, by, "n1")
    assert await binder.evict(victim, "n1", "emptying the node")
    assert await binder.label_node("n1", {"nvidia.com/mig.config": "gpusched-x"}) == ""
    assert (await binder.write_mig_config("gpusched-x", [], "gpu-operator/mig"))[0] == ""
    await binder.unschedulable(by, "0/1 nodes are available", nominated="n1")
    writes = [(m, p, t) for m, p, t in api.sent if m != "GET" and not p.endswith("/events")]
    assert {(m, p.rsplit("/", 1)[-1]) for m, p, _ in writes} == {
        ("POST", "binding"),
        ("PATCH", "status"),
        ("DELETE", "v"),
        ("POST", "eviction"),
        ("PATCH", "n1"),
        ("POST", "configmaps"),
    }
    assert [(m, p) for m, p, t in writes if t > 0.5] == []


@pytest.mark.parametrize(
    ("message", "gone"),
    [
        (
            'Operation cannot be fulfilled on pods "v": the UID in the precondition (uv) does not match the UID in '
            "record (other). The object might have been deleted and then recreated",
            True,
        ),
        (
            'Operation cannot be fulfilled on poddisruptionbudgets.policy "web": the object has been modified; please '
            "apply your changes to the latest version and try again",
            False,
        ),
    ],
)
async def test_an_eviction_answered_409_is_gone_only_when_the_pod_of_the_name_is_another(
    server: tuple[Path, list[web.Response], list[str]], message: str, gone: bool
) -> None:
    kubeconfig, script, _ = server
    body = {"kind": "Status", "status": "Failure", "code": 409, "reason": "Conflict", "message": message}
    script += [web.json_response(body, status=409)]
    kube = await client.connect(kubeconfig, None, 1000, 1000)
    try:
        evicted = await Binder(kube, "me", attempts=1).evict(replace(pod("v", gpus=1), uid="uv"), "n1", "emptying it")
    finally:
        await kube.close()
    assert evicted is gone  # a budget's conflict left the pod running: not evicted, the node not emptied
