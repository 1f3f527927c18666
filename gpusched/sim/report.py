"""Summaries, tables and plots of simulation runs.

``summarize`` reduces the ``RunResult``s of one policy (one per seed) to a
flat, JSON-ready dict; ``render_table`` turns a list of those into a ``rich``
table, and ``render_extended_table`` their MIG, island and gang counters into
a second one for traces that use them; ``plot_allocation`` draws GPU
allocation against arrived GPU demand per policy, median over seeds with the
25-75% band, as Figure 7 of the FGD paper does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table

from gpusched.sim.engine import RunResult

__all__ = [
    "EXTENDED_KEYS",
    "SUMMARY_KEYS",
    "group_by_policy",
    "plot_allocation",
    "render_extended_table",
    "render_table",
    "summarize",
]

SUMMARY_KEYS = (
    "policy",
    "batch",
    "seeds",
    "runs",
    "total_gpus",
    "alloc_pct_100",
    "alloc_pct_130",
    "alloc_pct_130_std",
    "unallocated_gpus_130",
    "frag_ratio_pct_70",
    "frag_ratio_pct_90",
    "solve_ms_p50",
    "solve_ms_p99",
    "gap_pct_max",
    "placed_pods",
    "failed_pods",
    "declined_pods",
    "trace",
    "fgd_published_alloc_pct_130",
    "arrived_pct_end",
    "batch_span_pct_max",
)
"""Keys of every summary, in output order; unknown values are ``None``."""

SPAN_WARN_PCT = 5.0
"""A batch spanning more arrived demand than this (% of capacity) is told under the table."""

EXTENDED_KEYS = (
    "mig_slice_util_pct",
    "island_violations",
    "gangs_placed",
    "gangs_rejected",
    "gangs_partial",
)
"""Keys added after ``SUMMARY_KEYS`` when the runs use MIG, GPU islands or gangs."""

PLOT_TOP = 130
"""Right end of the allocation plot, percent of GPU capacity arrived."""

ZOOM_FROM = 90
"""Left end of the zoomed panel, percent arrived."""


def group_by_policy(results: Iterable[RunResult]) -> dict[str, list[RunResult]]:
    """Results per policy, policies in first-seen order, each list sorted by seed."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.policy, []).append(r)
    return {k: sorted(v, key=lambda r: r.seed) for k, v in groups.items()}


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def summarize(
    runs: Sequence[RunResult],
    total_gpus: int,
    *,
    trace: str | None = None,
    published_alloc_130: float | None = None,
) -> dict[str, Any]:
    """One policy's runs (one per seed) as a flat summary with ``SUMMARY_KEYS``.

    Allocation and fragmentation figures are means over seeds; the standard
    deviation is the sample one (0 for a single seed); solve-time percentiles
    pool every batch of every seed.  When the runs use MIG, GPU islands or
    gangs, ``EXTENDED_KEYS`` follow: the MIG instance utilization (in use /
    offered at the end, %, mean over the seeds that offer any) and the island
    and gang counters, means over seeds.
    """
    if not runs:
        raise ValueError("no runs to summarize")
    policies = {r.policy for r in runs}
    if len(policies) != 1:
        raise ValueError(f"runs of several policies: {', '.join(sorted(policies))}")
    if total_gpus <= 0:
        raise ValueError(f"total_gpus must be positive, got {total_gpus}")
    a100 = [r.alloc_at(100) for r in runs] if all(r.reached(100) for r in runs) else []
    a130 = [r.alloc_at(130) for r in runs]
    mean130 = statistics.fmean(a130)
    solve = [ms for r in runs for ms in r.solve_ms]
    gaps = [g for r in runs for g in r.gaps if math.isfinite(g)]
    frag = {p: [r.frag_ratio[p] for r in runs if p in r.frag_ratio] for p in (70, 90)}
    summary: dict[str, Any] = {
        "policy": runs[0].policy,
        "batch": runs[0].batch,
        "seeds": [r.seed for r in runs],
        "runs": len(runs),
        "total_gpus": total_gpus,
        "alloc_pct_100": _mean(a100),
        "alloc_pct_130": round(mean130, 2),
        "alloc_pct_130_std": round(statistics.stdev(a130), 2) if len(a130) > 1 else 0.0,
        "unallocated_gpus_130": round((1 - mean130 / 100) * total_gpus),
        "frag_ratio_pct_70": _mean(frag[70]),
        "frag_ratio_pct_90": _mean(frag[90]),
        "solve_ms_p50": _percentile(solve, 50),
        "solve_ms_p99": _percentile(solve, 99),
        "gap_pct_max": round(max(gaps), 3) if gaps else None,
        "placed_pods": _mean([r.placed for r in runs]),
        "failed_pods": _mean([r.failed for r in runs]),
        "declined_pods": _mean([r.declined for r in runs]),
        "trace": trace,
        "fgd_published_alloc_pct_130": published_alloc_130,
        "arrived_pct_end": min(max(r.curve, default=0) for r in runs),
        "batch_span_pct_max": max(r.batch_span_pct for r in runs),
    }
    if any(r.extended for r in runs):
        summary["mig_slice_util_pct"] = _mean([u for r in runs if (u := r.mig_util_pct) is not None])
        summary["island_violations"] = _mean([r.island_violations for r in runs])
        summary["gangs_placed"] = _mean([r.gangs_placed for r in runs])
        summary["gangs_rejected"] = _mean([r.gangs_rejected for r in runs])
        summary["gangs_partial"] = _mean([r.gangs_partial for r in runs])
    return summary


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def render_table(summaries: Sequence[Mapping[str, Any]], title: str | None = None) -> Table:
    """The summaries as a ``rich`` table, one row per policy."""
    published = any(s.get("fgd_published_alloc_pct_130") is not None for s in summaries)
    spread = any(len(s.get("seeds") or ()) > 1 for s in summaries)
    if title is None and summaries:
        first = summaries[0]
        seeds = first.get("seeds") or []
        trace = first.get("trace")
        title = (
            f"{trace or 'trace'}: {first.get('total_gpus', '?')} GPUs, batch {first.get('batch')}, "
            f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
        )
    short = min((int(e) for s in summaries if (e := s.get("arrived_pct_end")) is not None), default=130)
    span = max((float(x) for s in summaries if (x := s.get("batch_span_pct_max")) is not None), default=0.0)
    table = Table(
        title=title,
        box=None,
        pad_edge=False,
        header_style="bold",
        caption=(
            f"the workload ends at {short}% arrived GPU demand (--tune): '@130' figures are at {short}%; "
            if short < 130
            else ""
        )
        + (
            f"a batch spans up to {span:.1f}% of arrived demand, in which its pods count as not placed yet, "
            "so the alloc figures read low: a smaller --batch compares packing; "
            if span > SPAN_WARN_PCT
            else ""
        )
        + "alloc: GPU allocation % at 100/130% arrived GPU demand"
        + (" (± std over seeds); " if spread else "; ")
        + ("paper: the FGD paper's published allocation at 130%; " if published else "")
        + (
            "the paper's figures are means of 10 seeds at batch 1 (--batch 1 --seeds 42-51 to compare); "
            if published and summaries and (summaries[0].get("batch") != 1 or len(summaries[0].get("seeds") or ()) < 10)
            else ""
        )
        + "idle: unallocated GPUs at 130%; frag: fragmented % of idle GPU at 70/90%"
        + (
            " (taken at the first batch to pass them, so it moves with --batch); "
            if summaries and (summaries[0].get("batch") or 1) > 1
            else "; "
        )
        + "p50/p99: solve time per batch",
    )
    table.add_column("policy", style="bold", no_wrap=True)

    def number(header: str) -> None:
        table.add_column(header, justify="right", no_wrap=True)

    number("alloc%\n@100")
    number("alloc%\n@130")
    if published:
        number("paper\n@130")
    number("idle\nGPUs")
    number("frag%\n@70")
    number("frag%\n@90")
    number("p50\nms")
    number("p99\nms")
    for s in summaries:
        a130 = _fmt(s.get("alloc_pct_130"))
        std = s.get("alloc_pct_130_std")
        if std is not None and len(s.get("seeds") or ()) > 1:
            a130 += f" ± {std:.2f}"
        row = [str(s.get("policy")), _fmt(s.get("alloc_pct_100")), a130]
        if published:
            row.append(_fmt(s.get("fgd_published_alloc_pct_130")))
        row += [
            _fmt(s.get("unallocated_gpus_130")),
            _fmt(s.get("frag_ratio_pct_70"), 1),
            _fmt(s.get("frag_ratio_pct_90"), 1),
            _fmt(s.get("solve_ms_p50"), 1),
            _fmt(s.get("solve_ms_p99"), 1),
        ]
        table.add_row(*row)
    return table


EXTENDED_COLUMNS = (
    ("mig_util_pct", "mig_slice_util_pct"),
    ("island_violations", "island_violations"),
    ("gangs_placed", "gangs_placed"),
    ("gangs_rejected", "gangs_rejected"),
    ("gangs_partial", "gangs_partial"),
)
"""Columns of the MIG, island and gang table: (header, summary key)."""


def _split(header: str) -> str:
    """``island_violations`` as ``island_`` over ``violations``: broken at the underscore nearest
    the middle, so a narrow terminal shows every header whole."""
    cuts = [i + 1 for i, c in enumerate(header[:-1]) if c == "_"]
    if not cuts:
        return header
    cut = min(cuts, key=lambda i: max(i, len(header) - i))
    return header[:cut] + "\n" + header[cut:]


class _ExtendedTable:
    """The counters table, with one-line headers where they fit and two-line ones where not."""

    def __init__(self, summaries: Sequence[Mapping[str, Any]]) -> None:
        self.rows = [[str(s.get("policy")), *(_fmt(s.get(key), 1) for _, key in EXTENDED_COLUMNS)] for s in summaries]

    def width(self) -> int:
        """Columns the table needs with one-line headers (cells are plain text)."""
        headers = ["policy", *(h for h, _ in EXTENDED_COLUMNS)]
        cols = [max([len(h), *(len(r[i]) for r in self.rows)]) for i, h in enumerate(headers)]
        return sum(cols) + 2 * (len(cols) - 1)

    def table(self, split: bool) -> Table:
        table = Table(
            box=None,
            pad_edge=False,
            header_style="bold",
            caption="mig_util_pct: MIG instances in use / offered at the end; island_violations, gangs_placed "
            "(at least their minimum), gangs_rejected, gangs_partial (below their minimum): per run, mean over "
            "seeds (violations and partial gangs must be 0)",
        )
        table.add_column("policy", style="bold", no_wrap=True)
        for header, _ in EXTENDED_COLUMNS:
            table.add_column(_split(header) if split else header, justify="right", no_wrap=True)
        for row in self.rows:
            table.add_row(*row)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(split=self.width() > options.max_width)


def render_extended_table(summaries: Sequence[Mapping[str, Any]]) -> RenderableType | None:
    """The MIG, island and gang counters as a ``rich`` table, one row per policy; None when no
    summary has them (a trace without MIG pods, GPU islands or gangs)."""
    if not any(key in s for s in summaries for _, key in EXTENDED_COLUMNS):
        return None
    return _ExtendedTable(summaries)


def allocation_bands(
    runs: Sequence[RunResult], top: int = PLOT_TOP
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Arrived percents and the 25th, 50th and 75th percentile of allocation over seeds.

    The x axis stops at the highest arrived percent any run recorded (at most ``top``).
    """
    reach = min(top, max((max(r.curve, default=0) for r in runs), default=0))
    xs = list(range(reach + 1))
    grid = np.array([[r.alloc_at(x) for x in xs] for r in runs], dtype=float)
    q25, q50, q75 = np.percentile(grid, [25, 50, 75], axis=0)
    return xs, q25.tolist(), q50.tolist(), q75.tolist()


def plot_allocation(results: Iterable[RunResult], path: str | Path, title: str | None = None) -> Path:
    """Write a PNG of GPU allocation % vs arrived GPU demand % (0..130) per policy.

    Each policy is drawn as the median over its seeds with a shaded 25-75%
    band; the right panel zooms into the saturated region.  Returns the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_by_policy(results)
    if not groups:
        raise ValueError("no runs to plot")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    try:
        lo = 100.0
        for i, (policy, runs) in enumerate(groups.items()):
            xs, q25, q50, q75 = allocation_bands(runs)
            color = f"C{i % 10}"
            for ax in (full, zoom):
                ax.plot(xs, q50, color=color, linewidth=1.6, label=f"{policy} (n={len(runs)})")
                ax.fill_between(xs, q25, q75, color=color, alpha=0.25, linewidth=0)
            tail = [v for x, v in zip(xs, q25, strict=True) if x >= ZOOM_FROM]
            lo = min([lo, *tail])
        for ax in (full, zoom):
            ax.plot([0, 100], [0, 100], color="0.6", linestyle=":", linewidth=1, label="_demand")
            ax.axvline(100, color="0.8", linewidth=0.8)
            ax.grid(visible=True, alpha=0.3)
            ax.set_xlabel("arrived GPU demand (% of capacity)")
        full.set_xlim(0, PLOT_TOP)
        full.set_ylim(0, 100)
        full.set_ylabel("GPU allocation (% of capacity)")
        full.legend(loc="upper left", fontsize="small")
        zoom.set_xlim(ZOOM_FROM, PLOT_TOP)
        zoom.set_ylim(max(0.0, math.floor(lo) - 1), 100)
        zoom.set_title("saturated region", fontsize="medium")
        fig.suptitle(title or "GPU allocation vs arrived demand (median, 25-75% band)")
        fig.tight_layout()
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
