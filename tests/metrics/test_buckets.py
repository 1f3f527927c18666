"""The histograms' buckets span every batch size and solve time the configuration allows."""

from __future__ import annotations

import annotated_types
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from gpusched.config import BatchingConfig, SolverConfig
from gpusched.metrics import SchedulerMetrics


def _most(model: type[BaseModel], field: str) -> float:
    """The largest value the configuration accepts for ``field``."""
    for bound in model.model_fields[field].metadata:
        if isinstance(bound, annotated_types.Le):
            return float(bound.le)  # type: ignore[arg-type]
    raise AssertionError(f"{field} has no upper bound")


def _finite_buckets(m: SchedulerMetrics, name: str) -> dict[float, float]:
    body, _ = m.render()
    return {
        float(s.labels["le"]): s.value
        for f in text_string_to_metric_families(body.decode())
        if f.name == name
        for s in f.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    }


def test_the_longest_solve_and_the_largest_batch_land_in_a_bucket() -> None:
    longest = _most(SolverConfig, "time_limit_seconds")
    largest = _most(BatchingConfig, "max_size")
    m = SchedulerMetrics()
    # A researcher's long solve (3/4 of the longest limit) and large batch (half the largest).
    m.observe_batch(size=int(largest // 2), solve_seconds=0.75 * longest, gap_ratio=0.0)
    solve = _finite_buckets(m, "gpusched_solve_seconds")
    size = _finite_buckets(m, "gpusched_batch_size")
    # Not only in +Inf, where histogram_quantile cannot place it.
    assert max(v for le, v in solve.items() if le <= longest) == 1
    assert max(v for le, v in size.items() if le <= largest) == 1
    assert max(solve) >= longest
    assert max(size) >= largest
