"""Ctrl-C after a CP-SAT solve is still Python's: a ``KeyboardInterrupt`` (or the daemon's
orderly stop), not the process killed outright."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SOLVE_THEN_CTRL_C = textwrap.dedent(
    """
    import os, signal, time
    # As a terminal's command has it (a shell without job control starts a background job, this
    # test run perhaps, with SIGINT ignored): Python's.  The solve below must leave it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from gpusched.model import Cluster
    from gpusched.solver.fragmentation import TypicalPods
    from gpusched.solver.params import Limits, SolverParams
    from gpusched.solver.solve import CpSatPolicy
    from tests.factories import gpu_node, pod

    cluster = Cluster([gpu_node("n0", gpus=4), gpu_node("n1", gpus=4)])
    pods = [pod("a", gpus=3), pod("b", gpus=2), pod("c", gpus=2), pod("d", milli=500, gpus=1)]
    policy = CpSatPolicy(cluster, SolverParams(limits=Limits(time_limit_s=1.0, workers=1)), TypicalPods.from_pods(pods))
    plan = policy.place(pods, cluster.empty_state())
    print(plan.stats.status, flush=True)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise SystemExit(3)
    """
)


def test_ctrl_c_after_a_solve_raises_keyboard_interrupt() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SOLVE_THEN_CTRL_C],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    status = done.stdout.split("\n", 1)[0]
    assert "FALLBACK" not in status, done  # CP-SAT did solve
    assert status != "QUICK", done
    assert done.returncode == 3, done  # killed by SIGINT would be -2
    assert done.stdout.endswith("interrupted\n")
