"""What the GPUs cost per hour: held by each namespace, held and idle, and left on nodes nobody uses.

Pure: the cluster, the pods placed on it, the prices and, when there is one, the utilisation
view go in; a ``CostReport`` comes out (``gpusched report`` prints it).  A pod's share of a GPU
costs that share of the GPU's hourly price; a GPU is idle when the view has it under the idle
percentage (a share on an idle GPU is idle in proportion); a MIG slice costs its compute
slices' part of its GPU (``3g.40gb``: three sevenths; ``2g.12gb`` of an A30: two fourths)
and is never counted idle; so does each ``nvidia.com/gpu`` of a node in single-strategy MIG
mode, where every one advertised is an instance (``model.node.whole_part``).  A pod is
charged every slice it holds (``Pod.mig_slices``: a pod another scheduler bound may hold
several, or slices beside whole GPUs), as its tenant counts them.  GPUs on a node where no
pod holds a GPU are the autoscaler's to take away; they are reported apart from the free GPUs
of nodes in use, which packing can still fill.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from rich.console import Console
from rich.table import Table

from gpusched.metrics.source import UtilisationView
from gpusched.model import GPU_MILLI, Assignment, Cluster, Node, Pod
from gpusched.model.mig import gpu_fraction, product_key
from gpusched.model.node import booked_gpus, label_number, whole_part

__all__ = [
    "CostReport",
    "NamespaceCost",
    "Prices",
    "cost_report",
    "parse_prices",
    "render_report",
    "report_json",
]


GPU_HOURS = "GPU-h"
"""The unit without a price list: every GPU-hour counts 1."""

MAX_PRICE = 1e9
"""The highest price per GPU-hour taken: any cluster's sum of them stays a finite number."""


@dataclass(frozen=True)
class Prices:
    """Price of one GPU for one hour, by GPU product (``nvidia.com/gpu.product``)."""

    per_model: Mapping[str, float] = field(default_factory=dict)
    default: float = 1.0
    """For a product not listed."""
    currency: str = GPU_HOURS
    """What the prices are in (``GPU_HOURS`` without a price list)."""

    def of(self, model: str) -> float:
        """The price of a GPU of product ``model``: its own entry, else the entry that names it
        as ``product_key`` reads names (``A100-SXM4-80GB`` prices ``NVIDIA-A100-SXM4-80GB``)."""
        price = self.per_model.get(model)
        return self._by_key.get(product_key(model), self.default) if price is None else price

    @cached_property
    def _by_key(self) -> dict[str, float]:
        return {product_key(name): price for name, price in self.per_model.items()}

    def unmatched(self, products: Iterable[str]) -> list[str]:
        """The products priced that no GPU of ``products`` is (a misspelt name prices nothing)."""
        keys = {product_key(p) for p in products if p}
        return sorted(name for name in self.per_model if product_key(name) not in keys)


def parse_prices(data: object, source: str = "prices") -> Prices:
    """``{currency: EUR, default: 2.0, gpuHour: {A100-SXM4-80GB: 3.1, ...}}``, ``currency``
    required; a bad document raises ``ValueError`` naming the key."""
    if data is None:  # an empty file: no prices is no --prices, not a price list
        raise ValueError(f"{source}: empty; name what the prices are in, such as currency: USD")
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping, got {type(data).__name__}")
    unknown = sorted((k for k in data if k not in {"currency", "default", "gpuHour"}), key=str)  # keys of any type
    if unknown:
        raise ValueError(f"{source}: {unknown[0]}: unknown key (known here: currency, default, gpuHour)")
    currency = data.get("currency")
    if currency is not None and (not isinstance(currency, str) or not currency.strip()):
        raise ValueError(f"{source}: currency: expected a name such as USD, got {currency!r}")
    default = _price(data.get("default", 1.0), f"{source}: default")
    table = data.get("gpuHour", {})
    if table is None:  # ``gpuHour:`` with nothing under it
        table = {}
    if not isinstance(table, dict):
        raise ValueError(f"{source}: gpuHour: expected a mapping of GPU product to price, got {type(table).__name__}")
    per_model = {str(k): _price(v, f"{source}: gpuHour.{k}") for k, v in table.items()}
    if currency is None:  # what would the report call its figures?
        raise ValueError(f"{source}: currency: missing; name what the prices are in, such as currency: USD")
    return Prices(per_model, default, currency)


def mig_gpus(node: Node) -> float:
    """GPUs of ``node`` in MIG mode: by its ``nvidia.com/gpu.count`` label (all its GPUs) less
    those it offers whole; without the label, the compute slices it offers, as parts of a GPU
    (sevenths; fourths on the A30)."""
    if not node.mig_slices:
        return 0.0
    counted = label_number(node.labels.get("nvidia.com/gpu.count", ""))
    if counted is not None and counted > node.gpu_count:
        return float(counted - node.gpu_count)
    return sum(gpu_fraction(p) * c for p, c in node.mig_slices)


def _mig_share(pod: Pod) -> float:
    """The part of a GPU the MIG slices ``pod`` holds are, by their compute slices: every slice
    of ``Pod.mig_slices`` (a pod another scheduler bound may hold several, or slices beside GPUs),
    as the tenant gauge counts them (``model.tenants.demand_of``), though not rounded down to
    thousandths: seven ``1g.10gb`` slices are the whole GPU and cost its whole price."""
    return sum(gpu_fraction(p) * n for p, n in pod.mig_slices)


def _price(value: object, where: str) -> float:
    if isinstance(value, str):  # "0.5", or 1e-1, which YAML reads as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_PRICE:
        raise ValueError(f"{where}: expected a price per GPU-hour, a number from 0 to {MAX_PRICE:g}, got {value!r}")
    return float(value)


@dataclass
class NamespaceCost:
    namespace: str
    pods: int = 0
    gpus: float = 0.0
    """GPUs held (a share counts as its fraction)."""
    idle_gpus: float = 0.0
    """Of those, on GPUs under the idle percentage (0 without a utilisation view)."""
    per_hour: float = 0.0
    idle_per_hour: float = 0.0


@dataclass(frozen=True)
class CostReport:
    namespaces: tuple[NamespaceCost, ...]
    """Those holding a GPU, dearest first."""
    gpus_total: float
    """Whole GPUs, and GPUs in MIG mode counted by their slices' compute share."""
    gpus_held: float
    free_gpus_in_use_nodes: float
    """Free GPU capacity on nodes where some GPU is held: packing can still fill it."""
    idle_nodes: int
    """GPU nodes where no GPU is held."""
    idle_node_gpus: float
    per_hour_total: float
    """Every GPU of the cluster, held or not."""
    per_hour_held: float
    per_hour_idle_held: float
    per_hour_idle_nodes: float
    per_hour_free_in_use_nodes: float
    currency: str
    measured: bool
    """Whether a utilisation view was read (without one nothing counts as idle)."""


def _share(pod: Pod, held: int) -> float:
    """The part of one GPU ``pod`` pays for, of a GPU holders hold ``held`` thousandths of."""
    return pod.gpu_milli / GPU_MILLI * min(1.0, GPU_MILLI / held)


def _idle_part(
    cluster: Cluster,
    placed: list[Assignment],
    held: Mapping[tuple[int, int], int],
    idle: Mapping[str, Collection[int]],
) -> dict[int, float]:
    """Per node of whole GPUs (not time-sliced, not in MIG mode), the part of what its pods
    hold that is idle when the device plugin chose their GPUs: as many GPUs as it has held
    beyond those measured in use (GPUs it has that the view does not name count as in use),
    over the GPUs its pods hold."""
    holding: dict[int, float] = defaultdict(float)
    for a in placed:
        node = cluster.nodes[a.node]
        if a.pod.num_gpu and whole_part(node) == 1 and not cluster.in_mig_mode[a.node]:
            holding[a.node] += sum(_share(a.pod, held[(a.node, g)]) for g in a.gpus if g < node.gpu_count)
    out: dict[int, float] = {}
    for i, pods_hold in holding.items():
        node = cluster.nodes[i]
        count = node.gpu_count
        low = {g for g in idle.get(node.name, ()) if 0 <= g < count}
        taken = {g for g in range(count) if held.get((i, g), 0) > 0}
        in_use = count - len(low)
        gpus_idle = min(len(taken & low), max(0, len(taken) - in_use))
        out[i] = min(1.0, gpus_idle / pods_hold) if pods_hold > 0 else 0.0
    return out


def cost_report(
    cluster: Cluster,
    placed: Iterable[Assignment],
    prices: Prices,
    view: UtilisationView | None = None,
    idle_percent: float = 5.0,
    guessed: Collection[str] = (),
    indices_honoured: bool = False,
) -> CostReport:
    """The report for ``placed`` (pods on nodes, by index into ``cluster``, on GPU indices).

    ``indices_honoured``: the device plugin gives each pod the GPUs the books name, so a pod is
    idle on the GPUs it is booked on that are measured idle.  Otherwise (NVIDIA's device plugin
    chooses a container's GPUs itself: a pod booked on GPU 0 may run on GPU 1) a node's GPUs
    held are idle as many as it has GPUs held beyond those measured in use, as the scheduler's
    ``gpusched_gpus_allocated_idle`` counts them, and they are split among the node's pods by
    what each holds (exact for a node one pod or one namespace uses).  ``guessed`` (with
    indices honoured): keys of pods whose GPU indices are a guess (another scheduler's pods that
    do not name them): such a pod is idle only when every GPU of its node is.  A GPU held beyond
    its capacity (two pods on one GPU where the books could not tell them apart, or a GPU the
    node no longer has) is shared among its holders, never charged twice."""
    idle = view.below(idle_percent) if view is not None else {}
    # GPU indices of nodes with MIG slices (or whose GPUs are MIG instances) are not those the
    # books number: nothing idle there.
    idle = {n: g for n, g in idle.items() if (i := cluster.index.get(n)) is None or not cluster.in_mig_mode[i]}
    placed = list(placed)
    held: dict[tuple[int, int], int] = defaultdict(int)  # (node, GPU) -> thousandths held
    mig_held: dict[int, float] = defaultdict(float)  # node -> GPUs held in MIG slices
    for a in placed:
        for g in a.gpus if a.pod.num_gpu else ():
            held[(a.node, g)] += a.pod.gpu_milli
        if mig := _mig_share(a.pod):
            mig_held[a.node] += mig
    idle_part = {} if indices_honoured else _idle_part(cluster, placed, held, idle)
    by_ns: dict[str, NamespaceCost] = {}
    for a in placed:
        pod = a.pod
        mig = _mig_share(pod)
        if not (pod.num_gpu or mig):
            continue
        node = cluster.nodes[a.node]
        price = prices.of(node.gpu_model)
        ns = by_ns.setdefault(pod.namespace, NamespaceCost(pod.namespace))
        ns.pods += 1
        if mig:  # a slice of g compute slices costs g sevenths of its GPU ...
            # ... of what the node still offers in MIG mode, shared as GPUs held twice are
            share = mig * min(1.0, mig_gpus(node) / mig_held[a.node])
            ns.gpus += share
            ns.per_hour += share * price
        if not pod.num_gpu:
            continue
        # On a time-sliced node an advertised GPU is 1/slices of one, and the indices the books
        # number are slices, not the GPUs the view names: idle only when all its GPUs are.  On a
        # single-strategy MIG node it is one instance, its compute slices' part of a GPU.
        part = whole_part(node)
        booked = booked_gpus(node, idle.get(node.name, ()))
        all_idle = node.gpu_count > 0 and set(range(node.gpu_count)) <= booked
        for g in a.gpus:
            if g >= node.gpu_count:  # a GPU the node no longer offers
                continue
            share = _share(pod, held[(a.node, g)]) * part
            ns.gpus += share
            ns.per_hour += share * price
            if a.node in idle_part:
                ns.idle_gpus += share * idle_part[a.node]
                ns.idle_per_hour += share * idle_part[a.node] * price
            elif all_idle if pod.key in guessed else g in booked:
                ns.idle_gpus += share
                ns.idle_per_hour += share * price
    in_use = {n for n, g in held if g < cluster.nodes[n].gpu_count} | {
        n for n in mig_held if mig_gpus(cluster.nodes[n])
    }
    idle_nodes = 0
    total = 0.0
    idle_node_gpus = per_hour_total = per_hour_idle_nodes = free_in_use = per_hour_free = 0.0
    for i, node in enumerate(cluster.nodes):
        mig = mig_gpus(node)
        part = whole_part(node)
        gpus = node.gpu_count * part + mig
        if not gpus:
            continue
        price = prices.of(node.gpu_model)
        total += gpus
        per_hour_total += gpus * price
        if i in in_use:
            free = sum(max(0, GPU_MILLI - held.get((i, g), 0)) for g in range(node.gpu_count)) / GPU_MILLI * part
            free += max(0.0, mig - mig_held.get(i, 0.0))
            free_in_use += free
            per_hour_free += free * price
        else:
            idle_nodes += 1
            idle_node_gpus += gpus
            per_hour_idle_nodes += gpus * price
    spaces = sorted(by_ns.values(), key=lambda c: (-c.per_hour, c.namespace))
    return CostReport(
        namespaces=tuple(spaces),
        gpus_total=total,
        gpus_held=sum(c.gpus for c in spaces),
        free_gpus_in_use_nodes=free_in_use,
        idle_nodes=idle_nodes,
        idle_node_gpus=idle_node_gpus,
        per_hour_total=per_hour_total,
        per_hour_held=sum(c.per_hour for c in spaces),
        per_hour_idle_held=sum(c.idle_per_hour for c in spaces),
        per_hour_idle_nodes=per_hour_idle_nodes,
        per_hour_free_in_use_nodes=per_hour_free,
        currency=prices.currency,
        measured=view is not None,
    )


def report_json(report: CostReport) -> dict[str, Any]:
    """The report as one JSON object (amounts per hour, rounded to cents; GPUs to thousandths)."""
    out = asdict(report)
    out["namespaces"] = [{k: _rounded(k, v) for k, v in n.items()} for n in out["namespaces"]]
    return {k: _rounded(k, v) for k, v in out.items()}


def _rounded(key: str, value: Any) -> Any:
    """``value`` of ``key`` in the JSON report: GPUs (every key that names them) to thousandths,
    as shares are given, other amounts to cents."""
    if not isinstance(value, float):
        return value
    return round(value, 3) if "gpus" in key else round(value, 2)


def _count(gpus: float) -> str:
    """A number of GPUs as people write it: ``8``, ``14.86``, ``10,400`` (never ``1.04e+04``)."""
    return f"{gpus:,.2f}".rstrip("0").rstrip(".")


def render_report(report: CostReport, console: Console, unmeasured: str = "pass --prometheus-url") -> None:
    """The report as a table per namespace and a summary of where the rest goes (``unmeasured``:
    what to say when nothing was measured idle)."""
    c = report.currency
    unpriced = " (no --prices: every GPU-hour counts 1)" if c == GPU_HOURS else ""
    table = Table(title=f"GPU cost per hour ({c}){unpriced}")
    for col in ("namespace", "pods", "GPUs held", "idle", f"{c}/h", f"idle {c}/h"):
        table.add_column(col, justify="left" if col == "namespace" else "right")
    for n in report.namespaces:
        idle = f"{n.idle_gpus:.2f}" if report.measured else "-"
        idle_cost = f"{n.idle_per_hour:.2f}" if report.measured else "-"
        table.add_row(n.namespace, str(n.pods), f"{n.gpus:.2f}", idle, f"{n.per_hour:.2f}", idle_cost)
    console.print(table)
    share = report.per_hour_held / report.per_hour_total if report.per_hour_total else 0.0
    console.print(
        f"{_count(report.gpus_total)} GPUs cost {report.per_hour_total:.2f} {c}/h; held {report.gpus_held:.2f} GPUs, "
        f"{report.per_hour_held:.2f} {c}/h ({share:.1%})"
    )
    if report.measured:
        console.print(f"held but idle: {report.per_hour_idle_held:.2f} {c}/h")
    else:
        console.print(f"held but idle: not measured ({unmeasured})")
    console.print(
        f"free on nodes in use: {report.free_gpus_in_use_nodes:.2f} GPUs, {report.per_hour_free_in_use_nodes:.2f} {c}/h"
    )
    console.print(
        f"nodes with no GPU held: {report.idle_nodes} ({_count(report.idle_node_gpus)} GPUs), "
        f"{report.per_hour_idle_nodes:.2f} {c}/h"
    )
