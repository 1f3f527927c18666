"""Readers for the openb trace format (Alibaba GPU cluster trace v2023).

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``.  Pods:
``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`` where
``gpu_spec`` is a ``|``-separated list of accepted GPU models (empty: any).
Extra columns are ignored.  A bad row raises ``TraceError`` naming the file,
the line and the column, so the trace can be fixed at once.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpusched.model import Node, Pod

__all__ = ["TraceError", "read_nodes", "read_pods"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names file, line and column."""

    def __init__(self, path: Path, line: int, column: str | None, message: str) -> None:
        where = f"{path}:{line}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = path, line, column


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, None, f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(path, 1, None, "file is empty; expected a header row")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(path, 1, missing[0], f"missing column(s) {', '.join(missing)}; header is {header}")
        for raw in reader:
            line = reader.line_num
            if not raw or all(not c.strip() for c in raw):
                continue
            row = raw + [""] * (len(header) - len(raw))
            yield line, {h: v.strip() for h, v in zip(header, row, strict=False)}


def _int(path: Path, line: int, row: dict[str, str], column: str, default: int | None = None) -> int:
    text = row.get(column, "")
    if text == "" and default is not None:
        return default
    try:
        if text.lstrip("-").isdigit():
            value = int(text)
        else:  # "1000.0" as some CSV writers emit it; "1.5", "inf" and "nan" are rejected
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            value = int(number)
    except ValueError:
        raise TraceError(path, line, column, f"expected an integer, got {text!r}") from None
    if value < 0:
        raise TraceError(path, line, column, f"must not be negative, got {value}")
    return value


def read_nodes(path: str | Path, *, gpu_only: bool = True) -> list[Node]:
    """Read a node list; CPU-only rows are skipped unless ``gpu_only`` is False."""
    p = Path(path)
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in _rows(p, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceError(p, line, "sn", "node name is empty")
        if name in seen:
            raise TraceError(p, line, "sn", f"duplicate node name {name!r}")
        seen.add(name)
        gpus = _int(p, line, row, "gpu", 0)
        model = row.get("model", "")
        if gpus and not model:
            raise TraceError(p, line, "model", f"node has {gpus} GPUs but no model")
        if gpu_only and gpus == 0:
            continue
        nodes.append(
            Node(
                name=name,
                cpu_milli=_int(p, line, row, "cpu_milli"),
                memory_mib=_int(p, line, row, "memory_mib"),
                gpu_count=gpus,
                gpu_model=model if gpus else "",
            )
        )
    if not nodes:
        raise TraceError(p, 1, None, "no GPU nodes in file")
    return nodes


def read_pods(path: str | Path) -> list[Pod]:
    """Read a pod list, in file order."""
    p = Path(path)
    pods: list[Pod] = []
    seen: set[str] = set()
    for line, row in _rows(p, POD_COLUMNS):
        name = row["name"]
        if not name:
            raise TraceError(p, line, "name", "pod name is empty")
        if name in seen:
            raise TraceError(p, line, "name", f"duplicate pod name {name!r}")
        seen.add(name)
        num_gpu = _int(p, line, row, "num_gpu", 0)
        gpu_milli = _int(p, line, row, "gpu_milli", 0)
        if num_gpu == 0:
            gpu_milli = 0
        elif not 0 < gpu_milli <= 1000:
            raise TraceError(p, line, "gpu_milli", f"must be in 1..1000 per GPU, got {gpu_milli}")
        elif num_gpu > 1 and gpu_milli != 1000:
            raise TraceError(
                p, line, "gpu_milli", f"a pod with {num_gpu} GPUs must have gpu_milli 1000, got {gpu_milli}"
            )
        spec = row.get("gpu_spec", "")
        models = frozenset(m.strip() for m in spec.split("|") if m.strip())
        pods.append(
            Pod(
                name=name,
                cpu_milli=_int(p, line, row, "cpu_milli"),
                memory_mib=_int(p, line, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_models=models,
            )
        )
    return pods
