"""Readers for the openb trace format (Alibaba GPU cluster trace v2023).

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``.  Pods:
``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`` where
``gpu_spec`` is a ``|``-separated list of accepted GPU models (empty: any).
Extra columns are ignored.  A bad row raises ``TraceError`` naming the file,
the line and the column, so the trace can be fixed at once.

Optional columns describe topology, MIG and gangs; an absent column or an
empty cell means what the Alibaba trace means (no islands, no MIG, no gang).
Nodes: ``gpu_islands`` (``0-3;4-7`` or ``auto``), ``mig_slices``
(``1g.10gb=7;3g.40gb=2``), ``mig_repartition`` (``true``/``false``),
``labels`` (``rack=r1;zone=z``).  Pods: ``mig_profile`` (``1g.10gb``),
``gpu_island`` (``required``/``preferred``), ``gang``, ``gang_min``,
``gang_topology_key``, ``gang_topology`` (``required``/``preferred``).
See ``docs/trace-format.md``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpusched.model import Node, Pod
from gpusched.model.mig import resource_name
from gpusched.model.pod import Gang
from gpusched.model.quantity import MAX_UNITS
from gpusched.model.topology import default_islands, parse_islands

__all__ = ["TraceError", "csv_rows", "read_nodes", "read_pods"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
NODE_OPTIONAL = ("gpu_islands", "mig_slices", "mig_repartition", "labels")
"""Optional node columns; an absent column or an empty cell keeps the plain openb meaning."""
POD_OPTIONAL = ("mig_profile", "gpu_island", "gang", "gang_min", "gang_topology_key", "gang_topology")
"""Optional pod columns; an absent column or an empty cell keeps the plain openb meaning."""
_MODES = ("required", "preferred")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names file, line and column."""

    def __init__(self, path: Path, line: int, column: str | None, message: str) -> None:
        where = f"{path}:{line}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = path, line, column


def csv_rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows of a CSV file with at least the columns ``required``, by line number, cells
    stripped and short rows padded, blank rows skipped; ``TraceError`` names the file and line
    of what cannot be read (not UTF-8, an unclosed quote, a missing column)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, 0, None, f"cannot open: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is no column name
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(path, line, None, f"not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)

    def row() -> tuple[int, list[str]] | None:
        """The next row and the line it starts on; a row must not span lines."""
        first = reader.line_num + 1
        try:
            raw = next(reader, None)
        except csv.Error as exc:
            raise TraceError(path, first, None, f"not a CSV row: {exc} (a quote left open?)") from None
        if raw is not None and reader.line_num != first:
            raise TraceError(path, first, None, f"a quoted cell runs on to line {reader.line_num}; close its quote")
        return None if raw is None else (first, raw)

    head = row()
    if head is None:
        raise TraceError(path, 1, None, "file is empty; expected a header row")
    header = [h.strip() for h in head[1]]
    twice = next((h for i, h in enumerate(header) if h and h in header[:i]), None)
    if twice is not None:  # which of the two cells would be read is anybody's guess
        raise TraceError(path, 1, twice, "the header names this column twice; keep one of them")
    missing = [c for c in required if c not in header]
    if missing:
        swapped = ""
        for other, what, flag in (
            (POD_COLUMNS, "a pod list", "--pods"),
            (NODE_COLUMNS, "a node list", "--nodes"),
        ):
            if tuple(required) != other and all(c in header for c in other):
                swapped = f" (it looks like {what}: pass it as {flag}; are --nodes and --pods swapped?)"
        raise TraceError(path, 1, missing[0], f"missing column(s) {', '.join(missing)}; header is {header}{swapped}")
    while (got := row()) is not None:
        line, raw = got
        if not raw or all(not c.strip() for c in raw):
            continue
        if any(c.strip() for c in raw[len(header) :]):  # a comma in a cell, unquoted, shifts the rest
            raise TraceError(
                path, line, None, f"{len(raw)} cells, but the header has {len(header)} (an unquoted comma in a cell?)"
            )
        cells = raw + [""] * (len(header) - len(raw))
        yield line, {h: v.strip() for h, v in zip(header, cells, strict=False)}


SHOWN_CHARS = 40
"""The most of a cell an error echoes."""


def _shown(text: str) -> str:
    """``text`` quoted as an error shows it: a cell of thousands of characters cut short."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text)} characters)"


_DIGITS = len(str(MAX_UNITS))


def _too_long(path: Path, line: int, column: str, text: str) -> None:
    """Refuse a run of digits too long for any count here, before ``int()`` reads it (past
    4,300 digits it refuses to, with an error that echoes them all)."""
    digits = text.lstrip("-").partition(".")[0].lstrip("0")
    if digits.isdecimal() and len(digits) > _DIGITS:
        if text.startswith("-"):
            raise TraceError(path, line, column, f"must not be negative, got {_shown(text)}")
        raise TraceError(
            path, line, column, f"too large: at most 2^50 ({MAX_UNITS}), got a number of {len(digits)} digits"
        )


_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
"""A number as CSV writers emit one (no ``_`` between digits, no ``inf`` nor ``nan``)."""


def _int(path: Path, line: int, row: dict[str, str], column: str, default: int | None = None) -> int:
    text = row.get(column, "")
    if text == "" and default is not None:
        return default
    _too_long(path, line, column, text)
    try:
        if text.lstrip("-").isdecimal():
            value = int(text)
        else:  # "1000.0" or "1e3" as some CSV writers emit them; "1.5", "1_000", "inf" and "nan" are not
            if _NUMBER.fullmatch(text) is None:
                raise ValueError(text)
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            value = int(number)
    except ValueError:
        if text == "":
            raise TraceError(path, line, column, "empty cell; the column is required (0 for none)") from None
        raise TraceError(path, line, column, f"expected an integer, got {_shown(text)}") from None
    if value < 0:
        raise TraceError(path, line, column, f"must not be negative, got {value}")
    if value > MAX_UNITS:  # as for the daemon: sums over a cluster stay inside 64-bit integers
        raise TraceError(path, line, column, f"too large: at most 2^50 ({MAX_UNITS}), got {text}")
    return value


def _profile(path: Path, line: int, column: str, text: str) -> str:
    try:
        resource_name(text)
    except ValueError:
        raise TraceError(path, line, column, f"expected a MIG profile such as 1g.10gb, got {_shown(text)}") from None
    return text


def _mode(path: Path, line: int, row: dict[str, str], column: str) -> str:
    text = row.get(column, "").lower()
    if text and text not in _MODES:
        raise TraceError(path, line, column, f"expected 'required' or 'preferred', got {_shown(row[column])}")
    return text


def _islands(path: Path, line: int, row: dict[str, str], gpus: int, model: str) -> tuple[int, ...]:
    text = row.get("gpu_islands", "")
    if not text:
        return ()
    if text.lower() == "auto":
        return default_islands(model, gpus)
    try:
        return parse_islands(text, gpus)
    except ValueError as exc:
        raise TraceError(path, line, "gpu_islands", str(exc)) from None


def _pairs(path: Path, line: int, row: dict[str, str], column: str, example: str) -> list[tuple[str, str]]:
    """``key=value;key=value`` as pairs in order; a key given twice is an error."""
    out: list[tuple[str, str]] = []
    for item in row.get(column, "").split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise TraceError(
                path, line, column, f"expected key=value items such as {example}, got {_shown(item.strip())}"
            )
        if any(k == key for k, _ in out):
            raise TraceError(path, line, column, f"{key!r} is given twice")
        out.append((key, value))
    return out


def _mig_slices(path: Path, line: int, row: dict[str, str]) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for profile, count in _pairs(path, line, row, "mig_slices", "1g.10gb=7;3g.40gb=2"):
        _profile(path, line, "mig_slices", profile)
        if not count.isdecimal():
            raise TraceError(path, line, "mig_slices", f"{profile}: expected a count of instances, got {_shown(count)}")
        _too_long(path, line, "mig_slices", count)
        out.append((profile, int(count)))
    return tuple(out)


def _flag(path: Path, line: int, row: dict[str, str], column: str) -> bool:
    text = row.get(column, "").lower()
    if text in ("", "false"):
        return False
    if text == "true":
        return True
    raise TraceError(path, line, column, f"expected 'true' or 'false', got {_shown(row[column])}")


def read_nodes(path: str | Path, *, gpu_only: bool = True) -> list[Node]:
    """Read a node list; CPU-only rows are skipped unless ``gpu_only`` is False.

    A node whose GPUs are all in MIG mode (``gpu`` 0 and ``mig_slices``) is a GPU node.
    """
    p = Path(path)
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in csv_rows(p, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceError(p, line, "sn", "node name is empty")
        if name in seen:
            raise TraceError(p, line, "sn", f"duplicate node name {name!r}")
        seen.add(name)
        gpus = _int(p, line, row, "gpu")
        model = row.get("model", "")
        if gpus and not model:
            raise TraceError(p, line, "model", f"node has {gpus} GPUs but no model")
        slices = _mig_slices(p, line, row)
        if any(c for _, c in slices) and not model:
            raise TraceError(p, line, "model", "node has MIG slices but no model")
        cpu_milli = _int(p, line, row, "cpu_milli")  # each cell is read, of a row then skipped too
        memory_mib = _int(p, line, row, "memory_mib")
        labels = dict(_pairs(p, line, row, "labels", "rack=r1;zone=z1"))
        repartition = _flag(p, line, row, "mig_repartition")
        has_gpu = gpus > 0 or any(c for _, c in slices)
        islands = _islands(p, line, row, gpus, model)  # read before a CPU row is skipped, as its other cells
        if gpu_only and not has_gpu:
            continue
        try:
            node = Node(
                name=name,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                gpu_count=gpus,
                gpu_model=model if has_gpu else "",
                labels=labels,
                gpu_islands=islands,
                mig_slices=slices,
                mig_repartition=repartition,
            )
        except ValueError as exc:  # the row's cells are each well-formed, but do not fit together
            raise TraceError(p, line, None, str(exc)) from None
        nodes.append(node)
    if not nodes:
        raise TraceError(p, 1, None, "no GPU nodes in file")
    return nodes


def read_pods(path: str | Path) -> list[Pod]:
    """Read a pod list, in file order; a file without pods is an error.

    The members of a gang are the rows with the same ``gang`` name; its
    ``gang_min``, ``gang_topology_key`` and ``gang_topology`` may be given on
    any of them (members that give one must agree), and ``gang_min``
    defaults to the number of members in the file.
    """
    p = Path(path)
    pods: list[Pod] = []
    seen: set[str] = set()
    rows = list(csv_rows(p, POD_COLUMNS))
    gangs = _gangs(p, rows)
    for line, row in rows:
        name = row["name"]
        if not name:
            raise TraceError(p, line, "name", "pod name is empty")
        if name in seen:
            raise TraceError(p, line, "name", f"duplicate pod name {name!r}")
        seen.add(name)
        num_gpu = _int(p, line, row, "num_gpu")
        gpu_milli = _int(p, line, row, "gpu_milli")
        if num_gpu == 0:
            if gpu_milli > 1000:  # ignored, but a share no GPU holds is a wrong row
                raise TraceError(p, line, "gpu_milli", f"must be in 0..1000 (ignored with num_gpu 0), got {gpu_milli}")
            gpu_milli = 0
        elif not 0 < gpu_milli <= 1000:
            raise TraceError(p, line, "gpu_milli", f"must be in 1..1000 per GPU, got {gpu_milli}")
        elif num_gpu > 1 and gpu_milli != 1000:
            raise TraceError(
                p, line, "gpu_milli", f"a pod with {num_gpu} GPUs must have gpu_milli 1000, got {gpu_milli}"
            )
        spec = row.get("gpu_spec", "")
        models = frozenset(m.strip() for m in spec.split("|") if m.strip())
        profile = row.get("mig_profile", "")
        if profile:
            _profile(p, line, "mig_profile", profile)
            if num_gpu:
                raise TraceError(
                    p, line, "mig_profile", f"a pod takes GPUs or one MIG slice, not both (num_gpu={num_gpu})"
                )
        cpu_milli = _int(p, line, row, "cpu_milli")
        memory_mib = _int(p, line, row, "memory_mib")
        island = _mode(p, line, row, "gpu_island")
        try:
            pod = Pod(
                name=name,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_models=models,
                mig_profile=profile,
                island=island,
                gang=gangs.get(row.get("gang", "")),
            )
        except ValueError as exc:  # the row's cells are each well-formed, but do not fit together
            raise TraceError(p, line, None, str(exc)) from None
        pods.append(pod)
    if not pods:
        raise TraceError(p, 1, None, "no pods in file; add a row for each pod below the header")
    return pods


_GANG_FIELDS = ("gang_min", "gang_topology_key", "gang_topology")


def _gangs(path: Path, rows: Sequence[tuple[int, dict[str, str]]]) -> dict[str, Gang]:
    """Every gang of a pod list by name, from the cells its members give."""
    members: dict[str, int] = {}
    given: dict[str, dict[str, tuple[int, str]]] = {}
    for line, row in rows:
        name = row.get("gang", "")
        if not name:
            for column in _GANG_FIELDS:
                if row.get(column, ""):
                    raise TraceError(path, line, column, "given without a 'gang' name")
            continue
        members[name] = members.get(name, 0) + 1
        cells = given.setdefault(name, {})
        for column in _GANG_FIELDS:
            text = row.get(column, "")
            if column == "gang_min" and text:
                text = str(_int(path, line, row, column))
            elif column == "gang_topology":
                text = _mode(path, line, row, column)
            if not text:
                continue
            first = cells.setdefault(column, (line, text))
            if first[1] != text:
                raise TraceError(
                    path, line, column, f"gang {name!r} has {first[1]!r} on line {first[0]}, here {text!r}"
                )
    gangs: dict[str, Gang] = {}
    for name, count in members.items():
        cells = given[name]
        line, text = cells.get("gang_min", (0, ""))
        minimum = int(text) if text else count
        if text and not 1 <= minimum <= count:
            raise TraceError(
                path, line, "gang_min", f"gang {name!r} has {count} member(s) in the file, needs 1..{count}, got {text}"
            )
        key_line, key = cells.get("gang_topology_key", (0, ""))
        mode_line, mode = cells.get("gang_topology", (0, ""))
        if bool(key) != bool(mode):
            column, at = ("gang_topology", key_line) if key else ("gang_topology_key", mode_line)
            raise TraceError(path, at, column, f"gang {name!r}: give both gang_topology_key and gang_topology")
        gangs[name] = Gang(name, minimum, key, mode)
    return gangs
