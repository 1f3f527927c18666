"""A shutdown asks the CP-SAT searches in progress to stop: none holds the exit up for its limit."""

from __future__ import annotations

import threading
import time

from ortools.sat.python import cp_model

from gpusched.solver.solve import cp_solver, stop_solves


class _Count(cp_model.CpSolverSolutionCallback):
    def __init__(self) -> None:
        super().__init__()
        self.found = 0

    def on_solution_callback(self) -> None:
        self.found += 1


def test_a_search_in_progress_stops_when_asked() -> None:
    model = cp_model.CpModel()
    for i in range(40):  # 2**40 solutions to go through: the 60 s limit would end it, not the search
        model.new_bool_var(f"b{i}")
    solver = cp_solver()
    solver.parameters.max_time_in_seconds = 60.0
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    counted = _Count()
    done: list[float] = []

    def search() -> None:
        solver.solve(model, counted)
        done.append(time.monotonic())

    thread = threading.Thread(target=search, daemon=True)
    thread.start()
    while not counted.found and thread.is_alive():
        time.sleep(0.01)  # under way
    asked = time.monotonic()
    stop_solves()
    thread.join(10)
    assert done, "the search did not stop within 10 s of being asked"
    assert done[0] - asked < 5.0


def test_a_search_that_begins_after_the_stop_takes_no_time() -> None:
    """A batch placed in several passes builds a new solver per pass: once the daemon stops,
    those take no time, and the warm start's plan stands."""
    from gpusched.model import Cluster, Node, Pod
    from gpusched.solver.params import Limits, SolverParams
    from gpusched.solver.solve import CpSatPolicy

    cluster = Cluster([Node(f"n{i}", 64_000, 256_000, gpu_count=8, gpu_model="A100") for i in range(40)])
    pods = [Pod(f"p{i}", 1000, 1024, num_gpu=1 + i % 3, gpu_milli=1000) for i in range(60)]
    policy = CpSatPolicy(cluster, SolverParams(limits=Limits(time_limit_s=30.0)))
    stop_solves()
    plan = policy.place(pods, cluster.empty_state())
    assert plan.stats.status.endswith("FALLBACK") or plan.stats.status.startswith("HEURISTIC"), plan.stats.status
    assert plan.stats.wall_ms < 5_000
