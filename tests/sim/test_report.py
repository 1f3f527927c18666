"""Summaries, the table and the allocation plot of simulation runs."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from gpusched.sim.engine import RunResult, allocation_curve
from gpusched.sim.report import (
    SUMMARY_KEYS,
    allocation_bands,
    group_by_policy,
    plot_allocation,
    render_table,
    summarize,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(policy: str, seed: int, level: float, *, top: int = 130, frag: bool = True) -> RunResult:
    """A run whose allocation follows arrivals up to ``level`` percent, then stays there."""
    curve = {x: float(min(x, level)) for x in range(top + 1)}
    return RunResult(
        policy=policy,
        seed=seed,
        batch=4,
        curve=curve,
        frag_ratio={70: 10.0 + seed % 3, 90: 40.0} if frag else {},
        placed=100 + seed,
        failed=seed % 5,
        solve_ms=[float(i) for i in range(1, 101)],
        gaps=[0.0, 0.5, float("inf")],
    )


def test_summary_has_every_key_and_the_means() -> None:
    runs = [run("fgd", 43, 94.0), run("fgd", 42, 96.0)]
    s = summarize(runs, total_gpus=600, trace="default", published_alloc_130=95.39)
    assert tuple(s) == SUMMARY_KEYS
    assert s["policy"] == "fgd"
    assert s["batch"] == 4
    assert s["seeds"] == [43, 42]
    assert s["alloc_pct_100"] == 95.0
    assert s["alloc_pct_130"] == 95.0
    assert s["alloc_pct_130_std"] == round(statistics.stdev([94.0, 96.0]), 2)
    assert s["unallocated_gpus_130"] == 30  # (1 - 0.95) * 600
    assert s["frag_ratio_pct_70"] == statistics.fmean([10.0 + 43 % 3, 10.0 + 42 % 3])
    assert s["frag_ratio_pct_90"] == 40.0
    assert s["solve_ms_p50"] == 50.5
    assert s["solve_ms_p99"] == pytest.approx(99.01)
    assert s["gap_pct_max"] == 0.5  # an infinite gap (no bound) is not a gap
    assert s["failed_pods"] == statistics.fmean([43 % 5, 42 % 5])
    assert s["trace"] == "default"
    assert s["fgd_published_alloc_pct_130"] == 95.39
    json.dumps(s)  # JSON-ready as it is


def test_single_seed_has_zero_std_and_unknowns_are_none() -> None:
    s = summarize([run("bestfit", 42, 92.5, frag=False)], total_gpus=616)
    assert s["alloc_pct_130_std"] == 0.0
    assert s["unallocated_gpus_130"] == round(0.075 * 616)
    assert s["frag_ratio_pct_70"] is None
    assert s["frag_ratio_pct_90"] is None
    assert s["trace"] is None
    assert s["fgd_published_alloc_pct_130"] is None


def test_allocation_at_130_falls_back_to_the_last_recorded_point() -> None:
    s = summarize([run("fgd", 1, 93.0, top=128)], total_gpus=100)
    assert s["alloc_pct_130"] == 93.0
    # Still rising where arrivals stop, and a pod of 4% of the GPUs arriving at 98% leaves no
    # record within one percent of 100: each falls back to the nearest point below.
    records = [(x, 0.75 * x) for x in (*range(99), *range(102, 129))]
    rising = dataclasses.replace(run("fgd", 1, 0.0), curve=allocation_curve(records, top=128))
    assert 100 not in rising.curve
    s = summarize([rising], total_gpus=100)
    assert s["alloc_pct_130"] == 96.0  # 0.75 * 128
    assert s["alloc_pct_100"] == 73.5  # 0.75 * 98, the records nearest 99


def test_summarize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no runs"):
        summarize([], total_gpus=10)
    with pytest.raises(ValueError, match="several policies"):
        summarize([run("fgd", 1, 90.0), run("cpsat", 1, 90.0)], total_gpus=10)
    with pytest.raises(ValueError, match="total_gpus"):
        summarize([run("fgd", 1, 90.0)], total_gpus=0)


def test_group_by_policy_keeps_first_seen_order_and_sorts_seeds() -> None:
    groups = group_by_policy([run("fgd", 43, 90.0), run("cpsat", 42, 90.0), run("fgd", 42, 91.0)])
    assert list(groups) == ["fgd", "cpsat"]
    assert [r.seed for r in groups["fgd"]] == [42, 43]


def test_bands_are_percentiles_over_seeds() -> None:
    runs = [run("fgd", s, level) for s, level in enumerate((90.0, 92.0, 94.0, 96.0, 98.0))]
    xs, q25, q50, q75 = allocation_bands(runs)
    assert xs == list(range(131))
    assert (q25[130], q50[130], q75[130]) == (92.0, 94.0, 96.0)
    assert q25[50] == q50[50] == q75[50] == 50.0


def test_bands_stop_where_the_runs_stop() -> None:
    xs, *_ = allocation_bands([run("fgd", 1, 90.0, top=110), run("fgd", 2, 90.0, top=120)])
    assert xs[-1] == 120


def test_table_lists_every_policy() -> None:
    summaries = [
        summarize([run("cpsat", 42, 96.0), run("cpsat", 43, 95.0)], total_gpus=616, trace="demo"),
        summarize([run("fgd", 42, 95.0)], total_gpus=616, trace="demo", published_alloc_130=95.39),
    ]
    console = Console(width=120, record=True)
    console.print(render_table(summaries))
    text = console.export_text()
    assert "demo: 616 GPUs, batch 4, 2 seeds" in text
    assert "cpsat" in text
    assert "fgd" in text
    assert "95.50 ± 0.71" in text
    assert "paper" in text
    assert "95.39" in text
    # Beside the paper's 10-seed, batch-1 figures, a 2-seed batch-4 run says it is not alike.
    assert "the paper's figures are means of 10 seeds at batch 1" in " ".join(text.split())
    assert "so it moves with --batch" in " ".join(text.split())


def test_a_table_made_as_the_paper_made_its_figures_carries_no_warning() -> None:
    runs = [run("fgd", seed, 95.0) for seed in range(42, 52)]
    s = summarize(runs, total_gpus=616, trace="demo", published_alloc_130=95.39)
    s["batch"] = 1
    console = Console(width=200, record=True)
    console.print(render_table([s]))
    text = " ".join(console.export_text().split())
    assert "the paper's figures are means" not in text
    assert "moves with --batch" not in text


def test_table_fits_a_narrow_terminal() -> None:
    s = summarize([run("gpuclustering", 42, 91.0), run("gpuclustering", 43, 92.0)], total_gpus=6212)
    console = Console(width=80, record=True)
    console.print(render_table([s]))
    lines = console.export_text().splitlines()
    assert any("gpuclustering" in line and "91.50 ± 0.71" in line for line in lines)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    runs = [run(p, s, lvl + s) for p, lvl in (("cpsat", 95.0), ("fgd", 94.0)) for s in (0, 1, 2)]
    out = plot_allocation(runs, tmp_path / "sub" / "allocation.png", title="test")
    assert out == tmp_path / "sub" / "allocation.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000


def test_plot_rejects_no_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no runs"):
        plot_allocation([], tmp_path / "x.png")


def test_a_run_with_no_record_by_100_percent_shows_no_allocation_there_rather_than_0() -> None:
    late = dataclasses.replace(run("fgd", 42, 93.0), curve={130: 93.0})  # one batch took the whole workload
    s = summarize([late], total_gpus=8, trace="tiny")
    assert s["alloc_pct_100"] is None
    assert s["alloc_pct_130"] == 93.0
    console = Console(width=200, record=True)
    console.print(render_table([s]))
    row = next(line for line in console.export_text().splitlines() if line.strip().startswith("fgd"))
    assert "0.00" not in row
    assert "93.00" in row


def test_allocation_at_100_is_given_only_when_every_seed_reached_it() -> None:
    early = dataclasses.replace(run("fgd", 42, 60.0), curve={100: 60.0, 130: 93.0})
    late = dataclasses.replace(run("fgd", 43, 95.0), curve={130: 95.0})
    s = summarize([early, late], total_gpus=8, trace="tiny")
    assert s["alloc_pct_100"] is None, "not one seed's figure passed off as the mean"
    assert s["alloc_pct_130"] == 94.0
