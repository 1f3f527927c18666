"""Names go into request paths as one segment each: a '?' in a name does not cut the path short,
and a '..' does not climb to another object."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from gpusched.daemon.run import explain_pod
from gpusched.kube.client import segment
from tests.kube.conftest import serving


async def test_explain_asks_for_the_pod_it_was_named_and_no_other(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, request.query_string))
        return web.json_response({"kind": "Status", "reason": "NotFound", "message": "not found"}, status=404)

    async with serving(answer, tmp_path) as kubeconfig:
        text, code = await explain_pod(kubeconfig, None, "default", "a?b#c")
        assert (text.split(";")[0], code) == ("pod default/a?b#c not found", 2)
        assert seen == [("/api/v1/namespaces/default/pods/a?b#c", "")]  # not pod 'a', with a query
        for name in ("..", ".", ""):  # the namespace itself, or the list of its pods
            with pytest.raises(ValueError, match="cannot be the name of an object"):
                await explain_pod(kubeconfig, None, "default", name)
        assert len(seen) == 1  # nothing asked


@pytest.mark.parametrize(("name", "sent"), [("train-2gpu", "train-2gpu"), ("a?b", "a%3Fb"), ("a b", "a%20b")])
def test_a_name_is_one_path_segment(name: str, sent: str) -> None:
    assert segment(name) == sent


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a%2Fb"])
def test_what_cannot_be_one_segment_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot be the name of an object in a request path"):
        segment(name)
