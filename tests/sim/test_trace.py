"""Reading openb node and pod traces, and the errors a bad trace gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.model import Node, Pod
from gpusched.sim.trace import TraceError, read_nodes, read_pods

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def expect_error(path: Path, line: int, column: str | None, reason: str) -> None:
    """Check a TraceError: it must name the file, the line and the column, and say why."""
    reader = read_nodes if path.name.startswith("node") else read_pods
    with pytest.raises(TraceError) as info:
        reader(path)
    err = info.value
    assert (err.path, err.line, err.column) == (path, line, column)
    message = str(err)
    assert message.startswith(f"{path}:{line}")
    if column is not None:
        assert f"column {column!r}" in message
    assert reason in message


class TestGoodFiles:
    def test_nodes(self, tmp_path: Path) -> None:
        p = write(
            tmp_path,
            "nodes.csv",
            NODE_HEADER + ",extra",
            "n1,96000,786432,8,G2,x",
            "",
            " n2 , 32000 , 131072 , 2 , T4 ,y",
            "cpu1,64000,262144,0,,z",
        )
        assert read_nodes(p) == [
            Node("n1", 96000, 786432, gpu_count=8, gpu_model="G2"),
            Node("n2", 32000, 131072, gpu_count=2, gpu_model="T4"),
        ]

    def test_cpu_only_nodes_on_request(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "g,1000,1024,1,A100", "c,2000,2048,0,ignored")
        nodes = read_nodes(p, gpu_only=False)
        assert [n.name for n in nodes] == ["g", "c"]
        assert nodes[1].gpu_count == 0
        assert nodes[1].gpu_model == ""

    def test_columns_in_any_order_and_str_path(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", "model,gpu,memory_mib,cpu_milli,sn", "V100,4,2048,1000,n1")
        assert read_nodes(str(p)) == [Node("n1", 1000, 2048, 4, "V100")]

    def test_pods(self, tmp_path: Path) -> None:
        p = write(
            tmp_path,
            "pods.csv",
            POD_HEADER + ",qos",
            "p-b,4000,8192,1,500,A10|T4,LS",
            "p-a,88000,327680,8,1000,,BE",
            "p-c,1000,2048,0,0,,BE",
            "p-d,1000,2048,0,1000,,BE",
            "p-e,6000,12288,1,1000, V100 | ,LS",
        )
        pods = read_pods(p)
        assert [x.name for x in pods] == ["p-b", "p-a", "p-c", "p-d", "p-e"]  # file order
        assert pods[0] == Pod("p-b", 4000, 8192, 1, 500, frozenset({"A10", "T4"}))
        assert pods[1] == Pod("p-a", 88000, 327680, 8, 1000)
        assert pods[2].gpu_demand_milli == 0
        assert pods[3].gpu_milli == 0  # a CPU-only pod carries no GPU share
        assert pods[4].gpu_models == frozenset({"V100"})

    def test_gpu_spec_column_is_optional_and_short_rows_are_padded(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p,1,2,1,300")
        assert read_pods(p) == [Pod("p", 1, 2, 1, 300)]

    @pytest.mark.parametrize(
        ("row", "column"), [("p,1,2,,", "num_gpu"), ("p,4000,15258,,220,", "num_gpu"), ("p,1,2,1,,", "gpu_milli")]
    )
    def test_an_empty_required_cell_is_refused_not_read_as_zero(self, tmp_path: Path, row: str, column: str) -> None:
        q = write(tmp_path, "pods2.csv", POD_HEADER, row)
        with pytest.raises(TraceError, match=f"column '{column}': empty cell; the column is required"):
            read_pods(q)

    def test_an_empty_gpu_cell_does_not_drop_the_node(self, tmp_path: Path) -> None:
        q = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model", "a,1,2,1,P100", "b,1,2,,P100")
        with pytest.raises(TraceError, match=r"nodes\.csv:3: column 'gpu': empty cell"):
            read_nodes(q)

    def test_integral_floats_are_accepted(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1000.0,2048,1.0,500.0,")
        assert read_pods(p) == [Pod("p", 1000, 2048, 1, 500)]


class TestBadRows:
    @pytest.mark.parametrize("value", ["abc", "1.5", "1e400", "inf", "nan", "--1", "1_000", "+5", "1.5e0"])
    def test_non_integer(self, tmp_path: Path, value: str) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "ok,1,1,0,0,", f"bad,{value},1,0,0,")
        expect_error(p, 3, "cpu_milli", "expected an integer")

    def test_non_integer_node_field(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,lots,1,1,A100")
        expect_error(p, 2, "cpu_milli", "expected an integer, got 'lots'")

    def test_negative(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,1000,-5,1,A100")
        expect_error(p, 2, "memory_mib", "must not be negative, got -5")

    def test_a_share_no_gpu_holds_on_a_cpu_pod(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,0,5000,")
        expect_error(p, 2, "gpu_milli", "must be in 0..1000 (ignored with num_gpu 0), got 5000")

    def test_negative_gpu_count(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,-1,1000,")
        expect_error(p, 2, "num_gpu", "must not be negative")

    def test_missing_column(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu", "p,1,1,0")
        expect_error(p, 1, "gpu_milli", "missing column(s) gpu_milli")

    def test_missing_node_columns_are_all_listed(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", "sn,cpu_milli", "n1,1")
        expect_error(p, 1, "memory_mib", "missing column(s) memory_mib, gpu, model")

    def test_a_pod_list_given_as_the_node_list_says_the_flags_may_be_swapped(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,0,0,")
        with pytest.raises(
            TraceError, match=r"looks like a pod list: pass it as --pods; are --nodes and --pods swapped"
        ):
            read_nodes(p)

    def test_duplicate_pod_name(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,0,0,", "q,1,1,0,0,", "p,2,2,0,0,")
        expect_error(p, 4, "name", "duplicate pod name 'p'")

    def test_duplicate_node_name(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,1,1,1,A100", "n1,1,1,1,A100")
        expect_error(p, 3, "sn", "duplicate node name 'n1'")

    def test_empty_names(self, tmp_path: Path) -> None:
        expect_error(write(tmp_path, "pods.csv", POD_HEADER, ",1,1,0,0,"), 2, "name", "pod name is empty")
        expect_error(write(tmp_path, "nodes.csv", NODE_HEADER, ",1,1,1,A"), 2, "sn", "node name is empty")

    @pytest.mark.parametrize("milli", ["0", "1001"])
    def test_gpu_milli_out_of_range(self, tmp_path: Path, milli: str) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, f"p,1,1,1,{milli},")
        expect_error(p, 2, "gpu_milli", "must be in 1..1000 per GPU")

    def test_multi_gpu_pod_with_a_share(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,1,1000,", "q,1,1,2,500,")
        expect_error(p, 3, "gpu_milli", "a pod with 2 GPUs must have gpu_milli 1000, got 500")

    def test_node_with_gpus_but_no_model(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,1,1,1,A100", "n2,1,1,4,")
        expect_error(p, 3, "model", "node has 4 GPUs but no model")

    @pytest.mark.parametrize("value", ["99999999999999999999999", "1e300", str(2**50 + 1)])
    @pytest.mark.parametrize(
        ("name", "header", "row", "column"),
        [
            ("nodes.csv", NODE_HEADER, "n1,{},1,1,A100", "cpu_milli"),
            ("nodes.csv", NODE_HEADER, "n1,1,{},1,A100", "memory_mib"),
            ("pods.csv", POD_HEADER, "p,{},1,0,0,", "cpu_milli"),
            ("pods.csv", POD_HEADER, "p,1,{},0,0,", "memory_mib"),
            ("pods.csv", POD_HEADER, "p,1,1,{},1000,", "num_gpu"),
        ],
        ids=["node-cpu", "node-memory", "pod-cpu", "pod-memory", "pod-gpus"],
    )
    def test_a_number_too_large_to_count_is_refused(
        self, tmp_path: Path, value: str, name: str, header: str, row: str, column: str
    ) -> None:
        p = write(tmp_path, name, header, row.format(value))
        expect_error(p, 2, column, "too large: at most 2^50")

    def test_the_largest_number_is_read(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, f"p,{2**50},{2**50},0,0,")
        assert read_pods(p) == [Pod("p", 2**50, 2**50)]

    @pytest.mark.parametrize(
        ("row", "column", "reason"),
        [
            ("cpu1,abc,-5,0,", "cpu_milli", "expected an integer, got 'abc'"),
            ("cpu1,1000,-5,0,", "memory_mib", "must not be negative, got -5"),
            ("cpu1,1000,1024,0,,rack", "labels", "expected key=value items such as rack=r1;zone=z1, got 'rack'"),
        ],
        ids=["cpu", "memory", "labels"],
    )
    def test_a_cpu_only_row_with_a_bad_cell_stops_the_run_too(
        self, tmp_path: Path, row: str, column: str, reason: str
    ) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER + ",labels", "n1,1000,1024,1,A100,", row)
        expect_error(p, 3, column, reason)

    def test_a_cpu_only_row_with_bad_gpu_islands_stops_the_run_too(self, tmp_path: Path) -> None:
        p = write(
            tmp_path, "nodes.csv", NODE_HEADER + ",gpu_islands", "n1,1000,1024,1,A100,", "cpu1,1000,1024,0,,garbage"
        )
        with pytest.raises(TraceError) as info:
            read_nodes(p)
        assert (info.value.line, info.value.column) == (3, "gpu_islands")

    @pytest.mark.parametrize(
        ("value", "reason"),
        [
            ("9" * 5000, "too large: at most 2^50 (1125899906842624), got a number of 5000 digits"),
            ("9" * 5000 + ".0", "too large: at most 2^50 (1125899906842624), got a number of 5000 digits"),
            ("-" + "9" * 5000, "must not be negative, got '-999999999"),
            ("x" * 5000, "expected an integer, got 'xxxxxxxxx"),
        ],
        ids=["digits", "digits-point-zero", "negative", "text"],
    )
    def test_a_cell_of_thousands_of_characters_is_told_without_echoing_it_all(
        self, tmp_path: Path, value: str, reason: str
    ) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, f"p,{value},1,0,0,")
        expect_error(p, 2, "cpu_milli", reason)
        with pytest.raises(TraceError) as info:
            read_pods(p)
        assert len(str(info.value)) < len(str(p)) + 200

    def test_a_mig_count_of_thousands_of_digits_is_refused(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER + ",mig_slices", f"n1,1,1,0,A100,1g.10gb={'7' * 5000}")
        expect_error(p, 2, "mig_slices", "too large: at most 2^50 (1125899906842624), got a number of 5000 digits")

    @pytest.mark.parametrize(
        ("name", "header", "row", "column"),
        [
            ("nodes.csv", "sn,sn,cpu_milli,memory_mib,gpu,model", "n1,n2,1,1,1,A100", "sn"),
            ("pods.csv", POD_HEADER + ", num_gpu", "p,1,1,0,0,,1", "num_gpu"),
            ("pods.csv", POD_HEADER + ",note,note", "p,1,1,0,0,,a,b", "note"),
        ],
        ids=["nodes", "pods-spaced", "unknown-column"],
    )
    def test_a_column_named_twice_in_the_header_is_refused(
        self, tmp_path: Path, name: str, header: str, row: str, column: str
    ) -> None:
        p = write(tmp_path, name, header, row)
        expect_error(p, 1, column, "the header names this column twice; keep one of them")

    def test_line_number_counts_blank_lines(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "", "a,1,1,0,0,", "", "", "b,x,1,0,0,")
        expect_error(p, 6, "cpu_milli", "expected an integer")


class TestBadFiles:
    def test_empty_file(self, tmp_path: Path) -> None:
        p = tmp_path / "pods.csv"
        p.write_text("", encoding="utf-8")
        expect_error(p, 1, None, "file is empty")

    def test_no_gpu_nodes(self, tmp_path: Path) -> None:
        p = write(tmp_path, "nodes.csv", NODE_HEADER, "c1,1,1,0,")
        expect_error(p, 1, None, "no GPU nodes")

    def test_no_pods(self, tmp_path: Path) -> None:
        expect_error(write(tmp_path, "pods.csv", POD_HEADER, "", ""), 1, None, "no pods in file")

    def test_missing_file(self, tmp_path: Path) -> None:
        expect_error(tmp_path / "nodes-missing.csv", 0, None, "cannot open")

    def test_trace_error_is_a_value_error(self, tmp_path: Path) -> None:
        p = write(tmp_path, "pods.csv", POD_HEADER, "p,1,1,2,1,")
        with pytest.raises(ValueError, match=r"pods\.csv:2: column 'gpu_milli'"):
            read_pods(p)


def test_a_header_behind_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    p = tmp_path / "nodes.csv"
    p.write_text(NODE_HEADER + "\nn0,1000,1024,1,A100\n", encoding="utf-8-sig")
    assert [n.name for n in read_nodes(p)] == ["n0"]


def test_a_file_that_is_not_utf8_text_is_refused_with_where_it_goes_wrong(tmp_path: Path) -> None:
    p = tmp_path / "nodes.csv"
    p.write_bytes((NODE_HEADER + "\nn0,1000,1024,1,A100\nn\xe91,1000,1024,1,A100\n").encode("latin-1"))
    expect_error(p, 3, None, "not UTF-8 text")  # the line of the byte, not of the block it came in
    assert "save the file as UTF-8" in _message(p)


def test_a_quote_left_open_is_refused_with_its_line(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,1024,1,1000,", 'p1,1000,1024,1,1000,"A100' + "x" * 140_000)
    expect_error(p, 3, None, "not a CSV row: field larger than field limit")
    # Left open with rows after it: the rest of the file is no cell of that row.
    p = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,1024,1,1000,", 'p1,1000,1024,1,1000,"A100', "p2,1,1,0,0,")
    expect_error(p, 3, None, "not a CSV row: unexpected end of data (a quote left open?)")
    p = write(tmp_path, "pods.csv", POD_HEADER, 'p1,1000,1024,1,1000,"A100', 'p2",1,1,0,0,', "p3,1,1,0,0,")
    expect_error(p, 2, None, "a quoted cell runs on to line 3; close its quote")
    p = write(tmp_path, "pods.csv", POD_HEADER, 'p1,1000,1024,1,1000,"A100"x')
    expect_error(p, 2, None, "not a CSV row: ',' expected after '\"'")


def _message(path: Path) -> str:
    with pytest.raises(TraceError) as info:
        read_nodes(path)
    return str(info.value)


def test_a_simulation_whose_pods_accept_only_models_no_node_has_warns_with_the_names(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from gpusched.sim.runner import run_simulation

    nodes = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,8000,32768,2,V100M32")
    # Names match in any case (v100m32 is V100M32); V100M16 is another model.
    pods = write(
        tmp_path,
        "pods.csv",
        POD_HEADER,
        "p1,1000,1024,1,1000,V100M16",
        "p2,1000,1024,1,1000,",
        "p3,1000,1024,1,1000,v100m32",
    )
    with capture_logs() as logs:
        run_simulation(nodes, pods, ["bestfit"], 1, [42], 1.0, tmp_path / "out", progress=False)
    (warned,) = [e for e in logs if e["event"].startswith("pods accept only GPU models no node has")]
    assert warned["pods"] == 1
    assert warned["models"] == ["V100M16"]
    assert warned["nodes_have"] == ["V100M32"]


def test_results_that_cannot_be_written_end_the_run_with_a_simulation_error(tmp_path: Path) -> None:
    from gpusched.sim.runner import SimulationError, run_simulation

    nodes = write(tmp_path, "nodes.csv", NODE_HEADER, "n1,8000,32768,2,V100M32")
    pods = write(tmp_path, "pods.csv", POD_HEADER, "p1,1000,1024,1,1000,")
    (tmp_path / "out" / "allocation.png").mkdir(parents=True)
    with pytest.raises(SimulationError, match=f"cannot write the results to {tmp_path / 'out'}: "):
        run_simulation(nodes, pods, ["bestfit"], 1, [42], 1.0, tmp_path / "out", progress=False)


def test_a_row_with_more_cells_than_the_header_is_refused_with_its_line(tmp_path: Path) -> None:
    """An unquoted comma in a model list would otherwise shorten it without a word."""
    p = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,1024,1,1000,A100", "p1,1000,1024,1,1000,A100,V100")
    expect_error(p, 3, None, "7 cells, but the header has 6 (an unquoted comma in a cell?)")
    p = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,1024,1,1000,A100,,")  # empty ones are no harm
    assert [q.name for q in read_pods(p)] == ["p0"]
