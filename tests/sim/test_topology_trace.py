"""Traces with GPU islands, MIG and gangs: the optional columns, gang arrivals, partitions, counters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpusched.cli import main
from gpusched.model import GPU_MILLI, Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.pod import Gang
from gpusched.model.topology import default_islands
from gpusched.sim.engine import RunResult, batches, gang_outcomes, island_violations, replay
from gpusched.sim.protocol import prepare_workload
from gpusched.sim.report import EXTENDED_KEYS, SUMMARY_KEYS, render_extended_table, summarize
from gpusched.sim.trace import TraceError, read_nodes, read_pods
from gpusched.solver.fragmentation import typical_from
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import make_policy
from tests.sim.test_protocol import time_limit

DEMO = Path(str(resources.files("gpusched.sim") / "demo"))
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
NODE_EXTRA = NODE_HEADER + ",gpu_islands,mig_slices,mig_repartition,labels"
POD_EXTRA = POD_HEADER + ",mig_profile,gpu_island,gang,gang_min,gang_topology_key,gang_topology"
FAST_CPSAT = SolverParams(limits=Limits(time_limit_s=0.5, workers=1))


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def gang_of(pods: Sequence[Pod], name: str) -> list[Pod]:
    return [p for p in pods if p.gang is not None and p.gang.name == name]


# --- reading the optional columns ---------------------------------------------------------------


class TestNodeColumns:
    def test_each_column(self, tmp_path: Path) -> None:
        p = write(
            tmp_path,
            "nodes.csv",
            NODE_EXTRA,
            "pcie,96000,786432,8,A100-PCIE-40GB,0-3;4-7,,false,rack=r1;nvidia.com/gpu.clique=c3",
            "auto-pcie,96000,786432,8,A100-PCIE-40GB,auto,,,",
            "auto-sxm,96000,786432,8,A100-SXM4-80GB,AUTO,,TRUE,rack=r2",
            "mixed,96000,786432,2,A100-SXM4-80GB,0;1,3g.40gb=2;1g.10gb=7,,",
            "mig-only,64000,524288,0,A100-SXM4-80GB,,1g.10gb=7,,",
            "plain,32000,131072,2,T4,,,,",
        )
        nodes = {n.name: n for n in read_nodes(p)}
        assert list(nodes) == ["pcie", "auto-pcie", "auto-sxm", "mixed", "mig-only", "plain"]
        assert nodes["pcie"].gpu_islands == (0, 0, 0, 0, 1, 1, 1, 1)
        assert dict(nodes["pcie"].labels) == {"rack": "r1", "nvidia.com/gpu.clique": "c3"}
        assert nodes["pcie"].mig_repartition is False
        assert nodes["auto-pcie"].gpu_islands == default_islands("A100-PCIE-40GB", 8) == (0,) * 4 + (1,) * 4
        assert nodes["auto-sxm"].gpu_islands == (0,) * 8
        assert nodes["auto-sxm"].mig_repartition is True
        assert nodes["mixed"].gpu_islands == (0, 1)
        assert nodes["mixed"].mig_slices == (("1g.10gb", 7), ("3g.40gb", 2))
        # A node whose GPUs are all in MIG mode is a GPU node, not a CPU-only one.
        assert nodes["mig-only"].gpu_count == 0
        assert nodes["mig-only"].gpu_model == "A100-SXM4-80GB"
        assert nodes["mig-only"].mig_slices == (("1g.10gb", 7),)
        plain = nodes["plain"]
        assert (plain.gpu_islands, plain.mig_slices, plain.mig_repartition, dict(plain.labels)) == ((), (), False, {})

    def test_an_empty_island_cell_means_one_island_even_for_pcie(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_EXTRA, "n,1000,1024,8,A100-PCIE-40GB,,,,")
        (node,) = read_nodes(p)
        assert node.gpu_islands == ()
        assert Cluster([node]).islands[0].tolist() == [0] * 8


class TestPodColumns:
    def test_each_column(self, tmp_path: Path) -> None:
        p = write(
            tmp_path,
            "pods.csv",
            POD_EXTRA,
            "mig,2000,4096,0,0,,1g.10gb,,,,,",
            "isl,4000,8192,4,1000,,,required,,,,",
            "pref,4000,8192,2,1000,,,Preferred,,,,",
            "a0,8000,16384,2,1000,,,,ga,,rack,required",
            "b0,8000,16384,1,1000,,,,gb,2,,",
            "a1,8000,16384,2,1000,,,,ga,,,",
            "b1,8000,16384,1,1000,,,,gb,,,",
            "b2,8000,16384,1,1000,,,,gb,,,",
            "a2,8000,16384,2,1000,,,,ga,,rack,",
            "plain,1000,1024,1,500,,,,,,,",
        )
        pods = {x.name: x for x in read_pods(p)}
        assert pods["mig"].mig_profile == "1g.10gb"
        assert pods["mig"].num_gpu == 0
        assert pods["mig"].gpu_demand_milli == GPU_MILLI // 7  # a seventh, rounded down
        assert pods["isl"].island == "required"
        assert pods["pref"].island == "preferred"
        # gang_min defaults to the members in the file; topology given on one member holds for all.
        assert {pods[n].gang for n in ("a0", "a1", "a2")} == {Gang("ga", 3, "rack", "required")}
        assert {pods[n].gang for n in ("b0", "b1", "b2")} == {Gang("gb", 2)}
        assert pods["plain"] == Pod("plain", 1000, 1024, 1, 500)

    def test_the_demo_trace_reads_the_same_with_empty_optional_columns(self, tmp_path: Path) -> None:
        def padded(src: Path, extra: str) -> Path:
            lines = src.read_text(encoding="utf-8").splitlines()
            blanks = "," * extra.count(",")
            out = [lines[0] + extra] + [line + blanks for line in lines[1:] if line]
            return write(tmp_path, src.name, *out)

        nodes = padded(DEMO / "nodes.csv", ",gpu_islands,mig_slices,mig_repartition,labels")
        pods = padded(DEMO / "pods.csv", ",mig_profile,gpu_island,gang,gang_min,gang_topology_key,gang_topology")
        plain_nodes, plain_pods = read_nodes(DEMO / "nodes.csv"), read_pods(DEMO / "pods.csv")
        assert read_nodes(nodes) == plain_nodes
        assert [dict(n.labels) for n in read_nodes(nodes)] == [{}] * len(plain_nodes)
        assert read_pods(pods) == plain_pods
        assert all(x.gang is None and not x.mig_profile and not x.island for x in plain_pods)


@pytest.mark.parametrize(
    ("header", "row", "column", "reason"),
    [
        (NODE_EXTRA, "n,1,1,8,A100,0-3;3-7,,,", "gpu_islands", "GPU 3 is in two islands"),
        (NODE_EXTRA, "n,1,1,4,A100,0-7,,,", "gpu_islands", "GPU 4 does not exist"),
        (NODE_EXTRA, "n,1,1,4,A100,0-1;x,,,", "gpu_islands", "'x' is not a GPU index"),
        (NODE_EXTRA, "n,1,1,0,A100,,1g.10gb,,", "mig_slices", "expected key=value items"),
        (NODE_EXTRA, "n,1,1,0,A100,,1g.10gb=many,,", "mig_slices", "expected a count of instances"),
        (NODE_EXTRA, "n,1,1,2,A100,,1g.10gb=-1,,", "mig_slices", "expected a count of instances, got '-1'"),
        (NODE_EXTRA, "n,1,1,2,A100,,1g.10gb=\u00b2,,", "mig_slices", "expected a count of instances, got '\u00b2'"),
        (NODE_EXTRA, "n,1,1,0,A100,,big=1,,", "mig_slices", "expected a MIG profile"),
        (NODE_EXTRA, "n,1,1,0,A100,,1g.10gb=1;1g.10gb=2,,", "mig_slices", "'1g.10gb' is given twice"),
        (NODE_EXTRA, "n,1,1,0,,,1g.10gb=7,,", "model", "MIG slices but no model"),
        (NODE_EXTRA, "n,1,1,1,A100,,,maybe,", "mig_repartition", "expected 'true' or 'false', got 'maybe'"),
        (NODE_EXTRA, "n,1,1,1,A100,,,,rack", "labels", "expected key=value items"),
        (NODE_EXTRA, "n,1,1,1,A100,,,,=r1", "labels", "expected key=value items"),
        (POD_EXTRA, "p,1,1,0,0,,large,,,,,", "mig_profile", "expected a MIG profile"),
        (POD_EXTRA, "p,1,1,1,1000,,1g.10gb,,,,,", "mig_profile", "GPUs or one MIG slice, not both"),
        (POD_EXTRA, "p,1,1,2,1000,,,must,,,,", "gpu_island", "expected 'required' or 'preferred'"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,two,,", "gang_min", "expected an integer, got 'two'"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,2,,", "gang_min", "has 1 member(s) in the file, needs 1..1, got 2"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,0,,", "gang_min", "needs 1..1, got 0"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,,rack,always", "gang_topology", "expected 'required' or 'preferred'"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,,rack,", "gang_topology", "give both gang_topology_key and gang_topology"),
        (POD_EXTRA, "p,1,1,1,1000,,,,g,,,required", "gang_topology_key", "give both"),
        (POD_EXTRA, "p,1,1,1,1000,,,,,2,,", "gang_min", "given without a 'gang' name"),
    ],
)
def test_a_bad_cell_names_line_and_column(tmp_path: Path, header: str, row: str, column: str, reason: str) -> None:
    is_node = header.startswith("sn,")
    good = "ok,1,1,1,A100,,,," if is_node else "ok,1,1,0,0,,,,,,,"
    p = write(tmp_path, "nodes.csv" if is_node else "pods.csv", header, good, "", row)
    with pytest.raises(TraceError) as info:
        (read_nodes if is_node else read_pods)(p)
    err = info.value
    assert (err.path, err.line, err.column) == (p, 4, column)
    assert str(err).startswith(f"{p}:4: column {column!r}: ")
    assert reason in str(err)


def test_gang_members_that_disagree_are_an_error_on_the_later_line(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", POD_EXTRA, "a,1,1,1,1000,,,,g,2,,", "b,1,1,1,1000,,,,g,,,", "c,1,1,1,1000,,,,g,3,,")
    with pytest.raises(TraceError) as info:
        read_pods(p)
    assert (info.value.line, info.value.column) == (4, "gang_min")
    assert "'2' on line 2, here '3'" in str(info.value)


# --- gangs arrive together ----------------------------------------------------------------------


def _gang_workload() -> list[Pod]:
    g = Gang("g", 3)
    order = [("a", None), ("g1", g), ("b", None), ("c", None), ("g2", g), ("d", None), ("g3", g)]
    return [Pod(name, 1000, 1024, 1, GPU_MILLI, gang=gang) for name, gang in order]


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, [["a"], ["g1", "g2", "g3"], ["b"], ["c"], ["d"]]),
        (2, [["a", "g1", "g2", "g3"], ["b", "c"], ["d"]]),
        (3, [["a", "g1", "g2", "g3"], ["b", "c", "d"]]),
        (10, [["a", "g1", "g2", "g3", "b", "c", "d"]]),
    ],
)
def test_a_gang_is_never_split_across_solves(k: int, expected: list[list[str]]) -> None:
    assert [[p.name for p in chunk] for chunk in batches(_gang_workload(), k)] == expected


@pytest.mark.parametrize("k", [1, 3, 16])
def test_without_gangs_the_batches_are_the_plain_slices(k: int) -> None:
    pods = [Pod(f"p{i}", 1000, 1024, 1, 500) for i in range(37)]
    assert batches(pods, k) == [pods[i : i + k] for i in range(0, len(pods), k)]


class _Recorder:
    """A policy that records the batches it is given and places nothing."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def place(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        self.calls.append([p.name for p in pods])
        return Plan((), tuple(pods))


def test_the_replay_hands_each_gang_to_one_solve() -> None:
    cluster = Cluster([Node("n0", 8000, 32768, gpu_count=2, gpu_model="A100")])
    pods = _gang_workload()
    policy = _Recorder()
    result = replay(cluster, pods, policy, batch=2, typical=typical_from(pods))
    assert policy.calls == [["a", "g1", "g2", "g3"], ["b", "c"], ["d"]]
    assert (result.gangs_placed, result.gangs_rejected, result.gangs_partial) == (0, 1, 0)
    assert result.failed == len(pods)


# --- partitions and counters --------------------------------------------------------------------


class _FixedPlan:
    """Places every MIG pod on node 0 after partitioning GPU 0 there once (a layout of 7 x 1g.10gb)."""

    name = "fixed"

    def __init__(self) -> None:
        self.done = False

    def place(self, pods: Sequence[Pod], state: ClusterState) -> Plan:
        geom = state.cluster.geometry[0]
        assert geom is not None
        layout = geom.pack({"1g.10gb": 7})
        assert layout is not None
        parts = () if self.done else ((0, 0, layout),)
        self.done = True
        migs = tuple(Assignment(p, 0) for p in pods if p.mig_profile)
        return Plan(migs, tuple(p for p in pods if not p.mig_profile), partitions=parts)


def test_partitions_are_applied_before_the_assignments() -> None:
    cluster = Cluster([Node("n0", 64000, 262144, gpu_count=1, gpu_model="A100-SXM4-80GB", mig_repartition=True)])
    pods = [Pod(f"m{i}", 1000, 1024, mig_profile="1g.10gb") for i in range(3)]
    result = replay(cluster, pods, _FixedPlan(), batch=1, typical=typical_from(pods))
    # The second and third pods only validate against the instances the first solve partitioned.
    assert (result.placed, result.failed) == (3, 0)
    assert (result.mig_in_use, result.mig_offered) == (3, 7)
    assert result.mig_util_pct == pytest.approx(300 / 7)
    assert result.extended


def test_island_violations_counts_required_pods_across_islands() -> None:
    node = Node("n0", 8000, 32768, gpu_count=4, gpu_model="A100-PCIE-40GB", gpu_islands=(0, 0, 1, 1))
    state = Cluster([node]).empty_state()
    required = Pod("r", 1000, 1024, 2, GPU_MILLI, island="required")
    preferred = Pod("p", 1000, 1024, 2, GPU_MILLI, island="preferred")
    assert island_violations([Assignment(required, 0, (1, 2))], state) == 1
    assert island_violations([Assignment(required, 0, (2, 3))], state) == 0
    assert island_violations([Assignment(preferred, 0, (1, 2))], state) == 0


def test_gang_outcomes_tell_placed_rejected_and_partial_gangs() -> None:
    pods = _gang_workload() + [Pod(f"h{i}", 1000, 1024, gang=Gang("h", 2)) for i in range(2)]
    by_name = {p.name: p for p in pods}
    assert gang_outcomes(pods, []) == (0, 2, 0)
    placed = [Assignment(by_name[n], 0) for n in ("a", "g1", "g2", "g3", "h0")]
    assert gang_outcomes(pods, placed) == (1, 0, 1)
    assert gang_outcomes(pods, [*placed, Assignment(by_name["h1"], 0)]) == (2, 0, 0)


def test_a_gang_placed_at_its_minimum_is_placed_not_partial() -> None:
    """At least 2 of 3: two placed is the gang running, one is below its minimum."""
    pods = [Pod(f"m{i}", 1000, 1024, gang=Gang("m", 2)) for i in range(3)]
    assert gang_outcomes(pods, [Assignment(pods[0], 0), Assignment(pods[1], 0)]) == (1, 0, 0)
    assert gang_outcomes(pods, [Assignment(pods[0], 0)]) == (0, 0, 1)


TINY_NODES = (
    NODE_EXTRA,
    "pcie-a,96000,786432,8,A100-PCIE-40GB,0-3;4-7,,,rack=r1",
    "pcie-b,96000,786432,8,A100-PCIE-40GB,auto,,,rack=r2",
    "mig-a,64000,524288,2,A100-SXM4-80GB,,1g.10gb=7,true,rack=r3",
)
TINY_PODS = (
    POD_EXTRA,
    "a,4000,8192,2,1000,A100-PCIE-40GB,,,,,,",
    "big-0,8000,16384,8,1000,A100-PCIE-40GB,,,big,,,",
    "b,4000,8192,4,1000,A100-PCIE-40GB,,required,,,,",
    "ok-0,8000,16384,2,1000,A100-PCIE-40GB,,required,ok,,rack,required",
    "c,4000,8192,4,1000,A100-PCIE-40GB,,required,,,,",
    "big-1,8000,16384,8,1000,A100-PCIE-40GB,,,big,,,",
    "m0,2000,4096,0,0,,1g.10gb,,,,,",
    "ok-1,8000,16384,2,1000,A100-PCIE-40GB,,required,ok,,,",
    "m1,2000,4096,0,0,,1g.10gb,,,,,",
    "big-2,8000,16384,8,1000,A100-PCIE-40GB,,,big,,,",
    "m2,2000,4096,0,0,,1g.10gb,,,,,",
    "m3,2000,4096,0,0,,3g.40gb,,,,,",
)


@pytest.mark.parametrize("policy", ["fgd", "cpsat"])
@pytest.mark.parametrize("batch", [1, 4])
def test_counters_on_a_tiny_trace(tmp_path: Path, policy: str, batch: int) -> None:
    cluster = Cluster(read_nodes(write(tmp_path, "nodes.csv", *TINY_NODES)))
    pods = read_pods(write(tmp_path, "pods.csv", *TINY_PODS))
    typical = typical_from(pods)
    result = replay(cluster, pods, make_policy(policy, cluster, typical, 0, FAST_CPSAT), batch=batch, typical=typical)
    # "big" (three 8-GPU members, two 8-GPU nodes) can never fit; everything else does.
    assert (result.gangs_placed, result.gangs_rejected, result.gangs_partial) == (1, 1, 0)
    assert (result.placed, result.failed) == (len(pods) - 3, 3)
    assert result.island_violations == 0
    # Four MIG pods in use; the 3g.40gb one needed a partitioned GPU on top of the seven advertised.
    assert result.mig_in_use == 4
    assert result.mig_offered > 7
    assert result.mig_util_pct == pytest.approx(100 * 4 / result.mig_offered)
    assert result.extended


def test_the_required_island_pods_really_were_placed_inside_an_island(tmp_path: Path) -> None:
    cluster = Cluster(read_nodes(write(tmp_path, "nodes.csv", *TINY_NODES)))
    pods = read_pods(write(tmp_path, "pods.csv", *TINY_PODS))
    typical = typical_from(pods)
    policy = make_policy("fgd", cluster, typical, 0)
    state = cluster.empty_state()
    seen: list[Assignment] = []
    for chunk in batches(pods, 1):
        plan = policy.place(chunk, state)
        state = state.partition(plan.partitions).apply(plan.assignments)
        seen.extend(plan.assignments)
    required = [a for a in seen if a.pod.island == "required"]
    assert {a.pod.name for a in required} == {"b", "c", "ok-0", "ok-1"}
    assert island_violations(seen, state) == 0


# --- the summary and the table ------------------------------------------------------------------


def _run(**counters: Any) -> RunResult:
    return RunResult("fgd", 1, 1, {130: 90.0}, {}, 10, 2, [1.0], [0.0], **counters)


def test_summary_adds_the_counters_only_for_extended_runs() -> None:
    plain = summarize([_run()], total_gpus=8)
    assert tuple(plain) == SUMMARY_KEYS
    assert render_extended_table([plain]) is None
    runs = [
        _run(extended=True, mig_in_use=3, mig_offered=6, gangs_placed=2, gangs_rejected=1),
        _run(extended=True, mig_in_use=6, mig_offered=6, gangs_placed=4, gangs_rejected=0),
    ]
    s = summarize(runs, total_gpus=8)
    assert tuple(s) == SUMMARY_KEYS + EXTENDED_KEYS
    assert s["mig_slice_util_pct"] == 75.0
    assert (s["island_violations"], s["gangs_placed"], s["gangs_rejected"], s["gangs_partial"]) == (0, 3, 0.5, 0)
    no_mig = summarize([_run(extended=True, gangs_placed=1)], total_gpus=8)
    assert no_mig["mig_slice_util_pct"] is None


@pytest.mark.parametrize("width", [80, 120])
def test_the_counters_table_shows_every_column(width: int) -> None:
    s = summarize([_run(extended=True, mig_in_use=1, mig_offered=4, gangs_placed=5)], total_gpus=8)
    table = render_extended_table([{**s, "policy": "gpuclustering"}])
    assert table is not None
    console = Console(width=width, record=True)
    console.print(table)
    text = console.export_text()
    headers = ["mig_util_pct", "island_violations", "gangs_placed", "gangs_rejected", "gangs_partial"]
    if width >= 120:
        assert all(h in text for h in headers)
    row = next(line for line in text.splitlines() if line.startswith("gpuclustering"))
    assert row.split() == ["gpuclustering", "25.0", "0.0", "5.0", "0.0", "0.0"]
    assert all(len(line) <= width for line in text.splitlines())
    assert "…" not in text


def test_the_cli_prints_and_writes_the_counters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = write(tmp_path, "nodes.csv", *TINY_NODES)
    pods = write(tmp_path, "pods.csv", *TINY_PODS)
    out = tmp_path / "out"
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "1-2"]
    # Tuned up (the trace is below 2.5 x capacity), so both gangs stay in the workload.
    assert main([*argv, "--tune", "2.5", "--batch", "2", "--no-progress", "--out", str(out)]) == 0
    (s,) = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(EXTENDED_KEYS) <= set(s)
    assert s["island_violations"] == 0
    assert s["gangs_partial"] == 0
    assert s["gangs_rejected"] >= 1  # "big" never fits
    assert s["gangs_placed"] + s["gangs_rejected"] >= 2
    assert 0 < s["mig_slice_util_pct"] <= 100
    printed = capsys.readouterr().out
    assert "gangs_partial" in printed


# --- tuning keeps gangs whole -------------------------------------------------------------------


def _gang_trace() -> list[Pod]:
    pods = [Pod(f"s{i:02d}", 1000, 1024, 1, 500) for i in range(20)]
    for g in range(3):
        gang = Gang(f"g{g}", 4)
        pods += [Pod(f"g{g}-{m}", 1000, 1024, 1, GPU_MILLI, gang=gang) for m in range(4)]
    return pods


def _gangs_whole(pods: Sequence[Pod]) -> None:
    names = {p.gang.name for p in pods if p.gang is not None}
    for name in names:
        members = gang_of(pods, name)
        assert len(members) == 4, name
        assert {p.gang for p in members} == {members[0].gang}


@pytest.mark.parametrize("seed", range(6))
def test_tuning_down_removes_whole_gangs(seed: int) -> None:
    out = prepare_workload(_gang_trace(), 8, seed=seed, tune=1.0)
    assert sum(p.gpu_demand_milli for p in out) <= 8 * GPU_MILLI
    _gangs_whole(out)


@pytest.mark.parametrize("seed", range(6))
def test_tuning_up_copies_whole_gangs_under_new_names(seed: int) -> None:
    trace = _gang_trace()
    out = prepare_workload(trace, 40, seed=seed, tune=1.3)
    assert len({p.name for p in out}) == len(out)
    _gangs_whole(out)
    copies = {p.gang.name for p in out[len(trace) :] if p.gang is not None}
    assert all("-tuned-" in name for name in copies)
    assert sum(p.gpu_demand_milli for p in out) <= 1.3 * 40 * GPU_MILLI


def test_tuning_up_copies_gangs_in_some_seed() -> None:
    copied = [
        p for s in range(6) for p in prepare_workload(_gang_trace(), 40, seed=s, tune=1.3)[32:] if p.gang is not None
    ]
    assert copied


def test_a_mig_only_trace_tunes_to_its_target() -> None:
    pods = [Pod(f"m{i}", 1000, 1024, mig_profile="1g.10gb") for i in range(7)]
    with time_limit(5):
        out = prepare_workload(pods, 2, seed=0, tune=1.3)
    share = GPU_MILLI // 7
    assert 1.3 * 2 * GPU_MILLI - share < sum(p.gpu_demand_milli for p in out) <= 1.3 * 2 * GPU_MILLI


def test_a_cluster_of_only_mig_gpus_is_rejected_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write(tmp_path, "nodes.csv", NODE_EXTRA, "mig-only,64000,524288,0,A100-SXM4-80GB,,1g.10gb=7,,")
    pods = write(tmp_path, "pods.csv", POD_EXTRA, "m,1000,1024,0,0,,1g.10gb,,,,,")
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--no-progress"]
    assert main([*argv, "--seeds", "1", "--out", str(tmp_path / "out")]) == 2
    assert "no node has GPUs outside MIG mode" in capsys.readouterr().err


def test_tuning_up_stops_at_the_first_draw_that_would_pass_the_target_even_a_gang() -> None:
    """As for single pods, the first pick that does not fit ends the tuning: a drawn gang of 4 GPUs
    that would pass the target is not skipped for smaller pods that would still fit."""
    out = prepare_workload(_gang_trace(), 40, seed=1, tune=1.3)
    total = sum(p.gpu_demand_milli for p in out)
    assert total == 48_500
    assert 52_000 - total >= 500, "a half-GPU pod would still fit: the loop stopped at a gang"
    assert [p.name for p in out[-5:]] == [f"g0-{m}-tuned-16" for m in range(4)] + ["s14-tuned-17"]
