"""The CP-SAT batch policy: greedy warm start, pruned model, time-limited solve, checked plan.

Every solve has a time limit and a worker count and reports status,
objective, bound and gap; the limit counts from the call, warm start included,
and once it is spent, putting the solution in an order that binds
(``peer_order``) keeps the first order found.  The FGD greedy answer for the
batch is both the hint and the fallback: CP-SAT's plan replaces it only when
the solver found a feasible solution, which the hint makes immediate.  The
returned plan always passes ``validate_plan``.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from ortools.sat.python import cp_model

from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Plan, Pod, SolveStats
from gpusched.model.placement import MigPartition
from gpusched.solver.baselines.fgd import WarmStart
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.instance import Instance, beside_placed, build_instance
from gpusched.solver.model import build_model, hint_from_plan
from gpusched.solver.objectives.priority import gang_priorities
from gpusched.solver.params import SolverParams
from gpusched.solver.partitions import needed_partitions
from gpusched.solver.typical import TypicalTracker
from gpusched.solver.validate import peer_order, plan_problems
from gpusched.solver.vars import Vars

__all__ = ["CpSatPolicy", "cp_solver", "resume_solves", "stop_solves"]

_STATUS = {
    cp_model.OPTIMAL: "OPTIMAL",
    cp_model.FEASIBLE: "FEASIBLE",
    cp_model.INFEASIBLE: "INFEASIBLE",
    cp_model.MODEL_INVALID: "MODEL_INVALID",
    cp_model.UNKNOWN: "UNKNOWN",
}


def cp_solver() -> cp_model.CpSolver:
    """A CP-SAT solver that leaves Ctrl-C to Python.

    By default CP-SAT takes SIGINT over for the length of a solve (to end the search early)
    and leaves it at the system's default action afterwards: from the first solve on, Ctrl-C
    would kill the process outright (the daemon would not drain its binds or hand back its
    Lease), and during a solve it would only cut that solve short.  With the setting off,
    SIGINT stays Python's: ``KeyboardInterrupt``, or the daemon's orderly stop.
    """
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False
    with _LIVE_LOCK:
        _LIVE.add(solver)
    return solver


_LIVE: weakref.WeakSet[cp_model.CpSolver] = weakref.WeakSet()
"""The solvers made (``cp_solver``) and not yet collected: those solving, among them."""
_LIVE_LOCK = threading.Lock()
"""Solvers are made in worker threads while ``stop_solves`` may go through them."""
_STOPPING = threading.Event()
"""Set by ``stop_solves``: a search not begun yet gets no time (the greedy plan stands)."""


def stop_solves() -> None:
    """Ask every search in progress to end now, with the best it has, and those still to begin
    (a batch placed in several passes) to take no time (the process is stopping: a solve in a
    worker thread would hold the exit up for as long as its time limit, up to a minute, past
    the pod's grace period).  ``resume_solves`` undoes it."""
    _STOPPING.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for solver in live:
        solver.stop_search()


def resume_solves() -> None:
    """Searches take their time again (a daemon starting in a process where one stopped)."""
    _STOPPING.clear()


SHORT_SOLVE_S = 0.25
PRESOLVE_S_PER_VAR = 2e-4
"""Presolve is skipped when less time is left than the larger of these (presolve alone takes
about 0.1 s on 2,000 variables and grows faster than linearly): search starts from the hint."""


class CpSatPolicy:
    """Places a whole batch jointly with one CP-SAT model per batch."""

    name = "cpsat"

    def __init__(
        self, cluster: Cluster, params: SolverParams | None = None, typical: TypicalPods | None = None
    ) -> None:
        self.params = params or SolverParams()
        self.tracker = TypicalTracker(cluster, typical)
        # The warm start's scorer is replaced by the tracker's before every batch.
        self.greedy = WarmStart(cluster, TypicalPods((), ()), seed=self.params.seed)
        self.greedy.preferences = self.params.weights.preferred_affinity > 0  # weight 0: ignored throughout

    def place(self, pods: Sequence[Pod], state: ClusterState, *, deadline: float | None = None) -> Plan:
        """Solve the batch; fall back to the greedy plan if CP-SAT finds nothing better.
        ``deadline`` (``time.perf_counter()`` time): the search stops then, if before the time
        limit (a batch placed in several passes shares one limit)."""
        start = time.perf_counter()
        return self._solve(pods, state, self._greedy(pods, state), start, deadline)

    def place_quick(self, pods: Sequence[Pod], state: ClusterState, *, deadline: float | None = None) -> Plan:
        """The warm start alone when it places every pod, else the full solve.

        When FGD places the whole batch, CP-SAT could only improve the secondary terms
        (fragmentation, nodes activated, packing), and at 1,000 nodes it takes about
        three times as long.  The daemon asks for this while its bind client would
        otherwise sit idle (see ``batching.quickStart``).  Status ``QUICK``.
        """
        start = time.perf_counter()
        hint = self._greedy(pods, state)
        if not hint.unplaced:
            return self._stats(hint, "QUICK", math.nan, math.nan, start, 0)
        return self._solve(pods, state, hint, start, deadline)

    @property
    def time_limit_s(self) -> float:
        """Seconds a batch may take (``solver.timeLimitSeconds``)."""
        return self.params.limits.time_limit_s

    def place_until(self, pods: Sequence[Pod], state: ClusterState, deadline: float, quick: bool) -> Plan:
        """``place`` (``place_quick`` when ``quick``) that stops at ``deadline`` if before the limit."""
        return self.place_quick(pods, state, deadline=deadline) if quick else self.place(pods, state, deadline=deadline)

    def _greedy(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        self.tracker.observe(pods)
        self.greedy.scorer = self.tracker.scorer
        return self.greedy.place(pods, state)

    def _solve(
        self, pods: Sequence[Pod], state: ClusterState, hint: Plan, start: float, deadline: float | None = None
    ) -> Plan:
        inst = build_instance(
            pods,
            state,
            self.greedy.scorer,
            hint,
            self.params.limits.candidates_per_pod,
            preferences=self.params.weights.preferred_affinity > 0,
        )
        if not inst.candidates:
            return self._stats(hint, "NO_CANDIDATES", 0.0, 0.0, start, 0)  # nothing fits: optimal
        model, v = build_model(inst, self.params.weights)
        hint_from_plan(inst, model, v)
        solver = cp_solver()
        lim = self.params.limits
        end = start + lim.time_limit_s if deadline is None else min(start + lim.time_limit_s, deadline)
        remaining = max(end - time.perf_counter(), 0.01)
        solver.parameters.max_time_in_seconds = remaining
        solver.parameters.num_workers = lim.workers
        solver.parameters.relative_gap_limit = lim.relative_gap
        solver.parameters.random_seed = self.params.seed
        # Presolve dominates small batch models; symmetry detection and probing
        # cost more than they save when the warm start is already complete.
        solver.parameters.symmetry_level = 0
        solver.parameters.cp_model_probing_level = 0
        nvars = len(v.x) + len(v.y) + len(v.whole) + len(v.active) + len(v.layout) + len(v.island)
        nvars += 3 * len(v.cross_pairs)
        if remaining < max(SHORT_SOLVE_S, PRESOLVE_S_PER_VAR * nvars):
            # Too little time for presolve to pay off: search from the hint at once.
            solver.parameters.cp_model_presolve = False
        if _STOPPING.is_set():  # shutting down: no search, the warm start stands
            solver.parameters.max_time_in_seconds = 0.0
        code = solver.solve(model)
        status = _STATUS.get(code, str(code))
        if code == cp_model.OPTIMAL and solver.objective_value != solver.best_objective_bound:
            status = "FEASIBLE"  # stopped at relativeGap: good enough, not proven the best
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return self._stats(hint, f"{status}_FALLBACK", math.nan, math.nan, start, nvars)
        plan = _extract(inst, v, solver, pods, end)
        if sum(int(solver.value(x)) for x in v.x.values()) > len(plan.assignments):
            status = "FEASIBLE"  # pods left for the next batch (``_extract``): not the model's optimum
        if status == "OPTIMAL" and inst.pruned:
            status = "OPTIMAL_PRUNED"  # the best over the candidates kept, not proven for the whole cluster
        problems = plan_problems(plan, state, pods)
        if problems:  # never bind an unchecked plan; the greedy one is valid by construction
            return self._stats(hint, "INVALID_FALLBACK", math.nan, math.nan, start, nvars)
        if self.params.weights.work_conserving and _worse(plan, hint):
            # The model reads spread constraints and affinity over the batch's end state, which
            # can refuse what checks pod by pod allow (the warm start did): keep the better plan.
            return self._stats(hint, "HINT_KEPT", math.nan, math.nan, start, nvars)
        if self.params.weights.work_conserving and plan.unplaced:
            filled = self._fill(plan, state, pods)
            if filled is not plan:
                plan, status = filled, f"{status}+FILLED"
        return self._stats(plan, status, solver.objective_value, solver.best_objective_bound, start, nvars)

    def _fill(self, plan: Plan, state: ClusterState, pods: Sequence[Pod]) -> Plan:
        """``plan`` with the warm start's placements of the pods it left out that fit in what it
        left: the model sees only each pod's best-ranked candidates, and pods of several groups
        may all have been offered the nodes one of them took.  A gang's members left out are
        offered those that fit: beside its members the plan placed, member by member
        (``beside_placed``); of a gang it left out, as many as its minimum together or none.
        Should the gangs' placements still fail the checks, the pods without a gang are placed
        again alone.  ``plan`` itself when none fits."""
        after = (state.partition(plan.partitions) if plan.partitions else state).apply(plan.assignments)
        left = [p for p in plan.unplaced if after.pod_mask(p).any()]
        alone = [p for p in left if p.gang is None]
        original = {p.key: p for p in plan.unplaced}
        for offered in (left, alone) if len(alone) < len(left) else (left,):
            if not offered:
                continue
            more = self.greedy.place(beside_placed(offered, plan.assignments, state), after)
            if not more.assignments:
                continue
            added = tuple(replace(a, pod=original[a.pod.key]) for a in more.assignments)  # as the batch gave them
            placed = {a.pod.key for a in added}
            filled = Plan(
                plan.assignments + added,
                tuple(p for p in plan.unplaced if p.key not in placed),
                plan.stats,
                plan.partitions + more.partitions,
            )
            if not plan_problems(filled, state, pods):
                return filled
        return plan

    def _stats(self, plan: Plan, status: str, obj: float, bound: float, start: float, nvars: int) -> Plan:
        ms = (time.perf_counter() - start) * 1000
        stats = SolveStats(self.name, status, obj, bound, ms, nvars)
        return Plan(plan.assignments, plan.unplaced, stats, plan.partitions)


def _worse(plan: Plan, other: Plan) -> bool:
    """``plan`` places fewer pods and no more GPU demand than ``other``, or less GPU demand and
    no more pods: it loses on both of the objective's leading terms.  First, as the objective
    weighs them (``objectives.priority``), the pods placed of each priority level above the
    batch's lowest, highest first: the first level where the counts differ decides, so a plan
    that places one more pod of higher priority is not worse for what it leaves below, nor
    better for more below.  (A batch of one level: the leading terms alone, as ever.)"""
    level = _levels(plan)
    lowest = min(level.values(), default=0)
    mine = Counter(level[a.pod.key] for a in plan.assignments)
    theirs = Counter(level.get(a.pod.key, a.pod.priority) for a in other.assignments)
    for lv in sorted(mine.keys() | theirs.keys(), reverse=True):
        if lv > lowest and mine[lv] != theirs[lv]:
            return mine[lv] < theirs[lv]
    pods, gpu = len(plan.assignments), plan.placed_gpu_milli
    others, other_gpu = len(other.assignments), other.placed_gpu_milli
    return (pods < others and gpu <= other_gpu) or (gpu < other_gpu and pods <= others)


def _levels(plan: Plan) -> dict[str, int]:
    """The priority each pod of the batch is placed at, by key: its own, a gang's lowest member's."""
    pods = [*(a.pod for a in plan.assignments), *plan.unplaced]
    least = gang_priorities(pods)
    return {p.key: least[p.gang.name] if p.gang is not None else p.priority for p in pods}


def _extract(inst: Instance, v: Vars, solver: cp_model.CpSolver, pods: Sequence[Pod], deadline: float) -> Plan:
    """The solution as a plan, in an order that binds (``peer_order``, which looks for no other
    order than the first it finds once past ``deadline``)."""
    queue = {gi: list(g.pods) for gi, g in enumerate(inst.groups)}
    assignments: list[Assignment] = []
    partitions: list[MigPartition] = []
    whole: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for ci, c in enumerate(inst.candidates):
        count = int(solver.value(v.x[ci]))
        if not count:
            continue
        shape = inst.groups[c.group].shape
        members = queue[c.group]
        if shape.is_fractional:
            for g, _, _ in c.gpus:
                for _ in range(int(solver.value(v.y[ci, g]))):
                    assignments.append(Assignment(members.pop(0), c.node, (g,)))
        elif shape.num_gpu == 0:
            assignments.extend(Assignment(members.pop(0), c.node) for _ in range(count))
        else:
            whole[c.node].append((ci, count))
    for n in sorted(set(whole) | {n for n, lays in v.layouts.items() if lays}):
        pools = _taken_gpus(inst, v, solver, n)
        rest: list[tuple[int, int]] = []
        for ci, count in whole.get(n, []):
            k = inst.groups[inst.candidates[ci].group].shape.num_gpu
            members = queue[inst.candidates[ci].group]
            inside = 0
            for i in pools:
                var = v.island.get((ci, i))
                for _ in range(int(solver.value(var)) if var is not None else 0):
                    gpus, pools[i] = tuple(pools[i][:k]), pools[i][k:]
                    assignments.append(Assignment(members.pop(0), n, gpus))
                    inside += 1
            rest.append((ci, count - inside))
        left = sorted(g for pool in pools.values() for g in pool)
        for ci, count in rest:
            k = inst.groups[inst.candidates[ci].group].shape.num_gpu
            members = queue[inst.candidates[ci].group]
            for _ in range(count):
                gpus, left = tuple(left[:k]), left[k:]
                assignments.append(Assignment(members.pop(0), n, gpus))
        for li, lay in enumerate(v.layouts.get(n, ())):
            for _ in range(int(solver.value(v.layout[n, li]))):
                partitions.append((n, left.pop(0), lay))
    ordered, stuck = peer_order(assignments, inst.state, deadline)
    # The model's end state is within every skew, but with several spread constraints a pod may
    # find no turn in which each check passes: it waits for the next batch.  A gang's member
    # cannot wait alone, so it stays, and the validator refuses the plan.
    assignments = ordered + [a for a in stuck if a.pod.gang is not None]
    placed = {a.pod.key for a in assignments}
    unplaced = tuple(p for p in pods if p.key not in placed)
    return Plan(tuple(assignments), unplaced, partitions=needed_partitions(partitions, assignments, inst.state))


def _taken_gpus(inst: Instance, v: Vars, solver: cp_model.CpSolver, n: int) -> dict[int, list[int]]:
    """The idle GPUs of node ``n`` that the solution takes whole, per island, lowest index first."""
    state = inst.state
    islands = state.cluster.islands[n]
    idle = [int(g) for g in np.flatnonzero(state.gpu_free[n] >= GPU_MILLI)]
    pools: dict[int, list[int]] = defaultdict(list)
    if any((n, g) in v.whole for g in idle):
        for g in idle:
            if solver.boolean_value(v.whole[n, g]):
                pools[int(islands[g])].append(g)
        return pools
    for g in idle:
        pools[int(islands[g])].append(g)
    for i, pool in pools.items():
        t = v.island_taken.get((n, i))
        if t is not None:
            pools[i] = pool[: int(solver.value(t))]
    return pools
