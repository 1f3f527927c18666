"""The replay loop: what it records when pods arrive one at a time and in batches."""

from __future__ import annotations

import importlib.resources
import statistics
from typing import Any

from gpusched.model import Cluster
from gpusched.sim.engine import replay
from gpusched.sim.protocol import prepare_workload
from gpusched.sim.runner import _load
from gpusched.solver.baselines import BestFitPolicy, FgdPolicy
from gpusched.solver.fragmentation import TypicalPods, cluster_frag_ratio
from tests.factories import gpu_node, pod


def _run(batch: int) -> dict[int, float]:
    cluster = Cluster([gpu_node(f"n{i}", gpus=1) for i in range(10)])
    pods = [pod(f"p{i}", gpus=1) for i in range(10)]
    typical = TypicalPods.from_pods(pods)
    result = replay(cluster, pods, FgdPolicy(cluster, typical), batch=batch, typical=typical)
    assert (result.placed, result.failed) == (10, 0)
    return result.curve


def test_one_at_a_time_allocation_follows_arrivals() -> None:
    curve = _run(batch=1)
    assert curve[10] == 10.0
    assert curve[50] == 50.0
    assert curve[100] == 100.0


def test_a_batch_places_its_pods_only_when_it_closes() -> None:
    # All ten pods are one batch: until the last arrives nothing is placed yet.
    curve = _run(batch=10)
    assert curve[10] == 0.0
    assert curve[90] == 0.0
    assert curve[100] == 100.0


def test_every_pod_is_placed_or_failed_exactly_once() -> None:
    cluster = Cluster([gpu_node("n0", gpus=2)])
    pods = [pod(f"p{i}", gpus=1) for i in range(5)]
    typical = TypicalPods.from_pods(pods)
    for batch in (1, 2, 5):
        result = replay(cluster, pods, FgdPolicy(cluster, typical), batch=batch, typical=typical)
        assert (result.placed, result.failed) == (2, 3)


def test_a_figure_no_batch_reached_is_none_and_a_short_run_says_where_it_ended() -> None:
    from rich.console import Console

    from gpusched.sim.report import render_table, summarize

    cluster = Cluster([gpu_node(f"n{i}", gpus=1) for i in range(10)])
    pods = [pod(f"p{i}", gpus=1) for i in range(12)]  # 120 % of the GPUs
    typical = TypicalPods.from_pods(pods)
    one_batch = replay(cluster, pods, FgdPolicy(cluster, typical), batch=16, typical=typical)
    assert one_batch.first_end == 120
    s = summarize([one_batch], total_gpus=10)
    assert s["alloc_pct_100"] is None  # not the empty cluster's 0 % from before the batch
    assert s["arrived_pct_end"] == 120
    one_by_one = summarize([replay(cluster, pods, FgdPolicy(cluster, typical), batch=1, typical=typical)], 10)
    assert one_by_one["alloc_pct_100"] == 100.0
    # The one batch spans 110 % of arrived demand (from the first pod's 10 % to 120 %): its
    # pods count as not placed there, and the caption says the figures read low.
    assert (s["batch_span_pct_max"], one_by_one["batch_span_pct_max"]) == (110.0, 0.0)
    console = Console(width=400, record=True)
    console.print(render_table([s]))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "the workload ends at 120% arrived GPU demand" in text
    assert "a batch spans up to 110.0% of arrived demand" in text
    console = Console(width=400, record=True)
    console.print(render_table([one_by_one]))
    assert "a batch spans" not in console.export_text()


def test_pods_a_policy_turns_away_although_they_fit_are_counted_apart() -> None:
    from gpusched.model import Plan
    from gpusched.sim.report import summarize

    class TurnsHalfAway(FgdPolicy):
        def place(self, pods: Any, state: Any) -> Plan:
            plan = super().place(pods, state)
            kept = plan.assignments[: len(plan.assignments) // 2]
            return Plan(kept, (*plan.unplaced, *(a.pod for a in plan.assignments[len(kept) :])), plan.stats)

    cluster = Cluster([gpu_node(f"n{i}", gpus=1) for i in range(10)])
    pods = [pod(f"p{i}", gpus=1) for i in range(12)]  # 10 fit, 2 never do
    typical = TypicalPods.from_pods(pods)
    r = replay(cluster, pods, TurnsHalfAway(cluster, typical), batch=12, typical=typical)
    assert (r.placed, r.failed, r.declined) == (5, 7, 5)  # 5 turned away with room left; 2 without
    assert summarize([r], total_gpus=10)["declined_pods"] == 5
    fair = replay(cluster, pods, FgdPolicy(cluster, typical), batch=12, typical=typical)
    assert (fair.failed, fair.declined) == (2, 0)


def test_fragmentation_at_a_point_is_the_mean_of_that_percents_records_as_the_reference() -> None:
    """At batch 1, the ratio reported at 70 % and 90 % is the mean over every pod whose arrived
    share rounds to that percent, each read after its placement (the reference's reduction), not
    the state at the first pod that reaches it (a point off on a small trace such as the demo)."""
    demo = importlib.resources.files("gpusched.sim") / "demo"
    cluster, pods, typical = _load(str(demo / "nodes.csv"), str(demo / "pods.csv"))
    workload = prepare_workload(pods, cluster.total_gpus, seed=42, tune=1.3)
    result = replay(cluster, workload, BestFitPolicy(), batch=1, typical=typical)
    state, arrived, seen = cluster.empty_state(), 0, {70: [], 90: []}
    replayed = BestFitPolicy()
    for p in workload:
        state = state.apply(replayed.place([p], state).assignments)
        arrived += p.gpu_demand_milli
        pct = round(arrived / cluster.total_gpus / 10)
        if pct in seen:
            seen[pct].append(100 * cluster_frag_ratio(state, typical))
    for point, values in seen.items():
        assert len(values) > 1
        assert result.frag_ratio[point] == statistics.fmean(values)
