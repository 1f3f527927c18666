"""What ``/readyz`` says of a scheduler whose watches stopped working after they had listed."""

from __future__ import annotations

import time
from typing import cast

from gpusched.daemon import DaemonSettings, Scheduler
from gpusched.kube.client import Kube
from gpusched.kube.watch import FAILING_UNREADY_S
from tests.doubles import IdleClient


def _listed() -> Scheduler:
    s = Scheduler(DaemonSettings(scheduler_name="s", leader_elect=False, policy="bestfit"), cast(Kube, IdleClient()))
    for r in s.reflectors:
        r.synced.set()
    s._solver_loaded = True
    return s


def test_a_watch_failing_for_over_a_minute_makes_the_scheduler_not_ready() -> None:
    s = _listed()
    assert s.ready() == (True, "")
    pods = next(r for r in s.reflectors if r.name == "pending-pods")
    pods.last_error = '403 Forbidden: pods is forbidden: User "system:serviceaccount:x:y" cannot watch'
    pods.failing_since = time.monotonic() - 5  # a blip: retried with backoff, still ready
    assert s.ready() == (True, "")
    pods.failing_since = time.monotonic() - FAILING_UNREADY_S - 1
    ok, why = s.ready()
    assert not ok
    assert why.startswith("the pending-pods watch has failed for 6")
    assert "403 Forbidden" in why
    pods.failing_since = None  # a list or watch worked again
    assert s.ready() == (True, "")
