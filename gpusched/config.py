"""The solver document that the ConfigMap carries, validated.

Researchers tune weights here.  Unknown keys and bad values are rejected with
the field path and the reason; ``load_config`` never returns a half-valid
configuration.  Every key is optional; ``manifests/config.yaml`` carries each
one with its default (a test keeps it so), and the README's configuration
reference gives each one's bounds.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Hashable
from typing import Annotated, Any, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpusched.model.node import GPU_MILLI
from gpusched.model.tenants import TenantRule, Tenants
from gpusched.solver.params import Limits, SolverParams, Weights

__all__ = [
    "BatchingConfig",
    "ConfigError",
    "ConsolidationConfig",
    "GpuschedConfig",
    "HeadroomConfig",
    "MigConfig",
    "TenantsConfig",
    "UtilisationConfig",
    "load_config",
    "yaml_problem",
]


_W = Weights()
_L = Limits()


def _not_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


_Number = Annotated[float, BeforeValidator(_not_bool)]
"""A number, read leniently (YAML 1.1 reads ``1e-3`` as a string), but not a boolean."""

_TAINT_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _taint_key(value: str) -> str:
    """A taint's key; written as ``kubectl taint`` takes it (``key=value:Effect``, ``key:Effect``),
    its key (what older versions took as the key, matching no taint)."""
    key = value.split("=", 1)[0].split(":", 1)[0].strip()
    if not _TAINT_KEY.fullmatch(key):
        raise ValueError(f"{value!r} is not a taint key: write the key only (as nvidia.com/gpu)")
    return key


_TaintKey = Annotated[str, AfterValidator(_taint_key)]


def _label_key(value: str) -> str:
    """A label key (taints' keys and labels' keys follow one rule), or empty."""
    if value and not _TAINT_KEY.fullmatch(value):
        raise ValueError(f"{value!r} is not a label key: write the key only (as example.com/team)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class WeightsConfig(_Strict):
    """Objective weights (non-negative integers)."""

    placed_gpu: int = Field(default=_W.placed_gpu, ge=0, le=10**6, alias="placedGpu")
    placed_pods: int = Field(default=_W.placed_pods, ge=0, le=10**7, alias="placedPods")
    fragmentation: int = Field(default=_W.fragmentation, ge=0, le=10**6)
    active_nodes: int = Field(default=_W.active_nodes, ge=0, le=10**7, alias="activeNodes")
    packing: int = Field(default=_W.packing, ge=0, le=10**4)
    keep_hint: int = Field(default=_W.keep_hint, ge=0, le=10**7, alias="keepHint")
    mig_partition: int = Field(default=_W.mig_partition, ge=0, le=10**8, alias="migPartition")
    island_spill: int = Field(default=_W.island_spill, ge=0, le=10**8, alias="islandSpill")
    gang_domains: int = Field(default=_W.gang_domains, ge=0, le=10**8, alias="gangDomains")
    preferred_affinity: int = Field(default=_W.preferred_affinity, ge=0, le=10**6, alias="preferredAffinity")
    work_conserving: bool = Field(default=_W.work_conserving, alias="workConserving")


class SolverConfig(_Strict):
    """Limits on each batch solve."""

    time_limit_seconds: _Number = Field(strict=False, default=_L.time_limit_s, gt=0, le=60, alias="timeLimitSeconds")
    workers: int = Field(default=_L.workers, ge=1, le=64)
    candidates_per_pod: int = Field(default=_L.candidates_per_pod, ge=1, le=10_000, alias="candidatesPerPod")
    relative_gap: _Number = Field(strict=False, default=_L.relative_gap, ge=0, le=1, alias="relativeGap")


class BatchingConfig(_Strict):
    """When a batch of pending pods closes."""

    max_size: int = Field(default=64, ge=1, le=10_000, alias="maxSize")
    max_wait_seconds: _Number = Field(strict=False, default=0.5, gt=0, le=60, alias="maxWaitSeconds")
    quick_start: bool = Field(default=True, alias="quickStart")
    """While the bind client has more than half its burst unspent and more pods wait (or more
    than ``maxSize / 8`` arrived in the last second, or two in the last tenth: a burst is on), a
    batch of as many pods as the binder sends at once (drawn as soon as two pods wait) that the
    warm start (FGD) places whole is bound as FGD placed it, without the CP-SAT solve: at the
    start of a burst the solve would only leave the client idle."""


class UtilisationConfig(_Strict):
    """What GPU utilisation measured by DCGM changes (read only when ``gpusched run`` is given
    ``--prometheus-url``)."""

    avoid_busy_gpus: bool = Field(default=True, alias="avoidBusyGpus")
    """A GPU at ``busyPercent`` or above takes no new pod (a share, or the whole GPU when the
    books show it idle and no pod of its node the books put on an idle GPU may be the one using
    it: ``gpu_indices_honoured``)."""
    busy_percent: _Number = Field(strict=False, default=90, gt=0, le=100, alias="busyPercent")
    idle_percent: _Number = Field(strict=False, default=5, ge=0, le=100, alias="idlePercent")
    """A GPU that pods hold and that is used less than this is counted in
    ``gpusched_gpus_allocated_idle``."""
    max_age_seconds: _Number = Field(strict=False, default=120, gt=0, le=3600, alias="maxAgeSeconds")
    """An answer older than this is not used: placement goes on as though no GPU were busy."""
    gpu_indices_honoured: bool = Field(default=False, alias="gpuIndicesHonoured")
    """The nodes' device plugin gives each container the GPUs ``gpusched.io/gpu-indices`` names,
    so a busy GPU the books show free is used by something outside the cluster's pods.  Off
    (NVIDIA's device plugin chooses the GPUs itself), a node's busy GPUs the books show free are
    first taken for those of its pods the books put on GPUs measured idle."""

    @model_validator(mode="after")
    def _idle_below_busy(self) -> UtilisationConfig:
        if self.idle_percent >= self.busy_percent:
            raise ValueError(
                f"idlePercent ({self.idle_percent:g}) must be below busyPercent ({self.busy_percent:g}): "
                "a GPU cannot be counted idle and busy at once"
            )
        return self


class HeadroomConfig(_Strict):
    """Idle GPUs kept free for pods of high priority, so that they start at once."""

    gpus: int = Field(default=0, ge=0, le=1_000_000)
    """Whole GPUs a batch leaves idle for pods of ``priorityAtLeast`` or more (0: none)."""
    priority_at_least: int = Field(default=1_000_000, ge=-(2**31), le=2**31 - 1, alias="priorityAtLeast")
    models: list[str] = Field(default_factory=list)
    """Only GPUs of these products (``nvidia.com/gpu.product``) are kept (empty: any)."""
    tolerated_taints: list[_TaintKey] = Field(default_factory=lambda: ["nvidia.com/gpu"], alias="toleratedTaints")
    """Keys of the taints the pods it is for tolerate: GPUs are kept only on nodes with no other
    taint (the default is the taint many clusters put on every GPU node)."""


class ConsolidationConfig(_Strict):
    """Moving batch pods off GPU nodes whose pods fit on the other nodes in use (off by default)."""

    enabled: bool = False
    """Every ``intervalSeconds``, while no pod waits for a batch or a retry, empty the nodes whose pods
    all ask to be moved (``gpusched.io/consolidate: "true"`` and a controller) and fit on the
    free GPUs of other nodes in use."""
    interval_seconds: _Number = Field(strict=False, default=300, ge=1, le=86_400, alias="intervalSeconds")
    max_nodes_per_round: int = Field(default=1, ge=1, le=10_000, alias="maxNodesPerRound")


class MigConfig(_Strict):
    """Re-partitioning idle GPUs into MIG instances on a live cluster (off by default)."""

    repartition: bool = False
    """Let the solver choose MIG layouts for the GPUs of nodes labelled
    ``gpusched.io/mig-repartition: "true"`` while all their GPUs are idle; the layout is
    written to ``configMap`` and the node labelled ``nvidia.com/mig.config`` for NVIDIA's MIG
    manager, and the pods are bound once the node advertises the new instances."""
    config_map: str = Field(
        default="gpu-operator/gpusched-mig-parted-config",
        alias="configMap",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )
    """``namespace/name`` of the ConfigMap (key ``config.yaml``) that the MIG manager reads its
    configurations from (the ClusterPolicy's ``migManager.config.name``)."""
    timeout_seconds: _Number = Field(strict=False, default=600, ge=10, le=86_400, alias="timeoutSeconds")
    """How long a node may take, from its label, to advertise the new instances before the pods
    waiting for them are told so and the node is set back to ``all-disabled``: again from when
    the MIG manager stops reporting it at work, and for a leader that took over, from when it
    first saw the request; never beyond four times this from the label."""
    restore_idle_seconds: _Number = Field(strict=False, default=1800, ge=0, le=604_800, alias="restoreIdleSeconds")
    """A node gpusched re-partitioned whose MIG instances and GPUs no pod has used for this long
    is set back to whole GPUs (``all-disabled``), for whole-GPU pods or another layout; 0: never."""
    partition_for_queued: bool = Field(default=True, alias="partitionForQueued")
    """When a node is re-partitioned for a batch's MIG pods, also give layouts to its other idle
    GPUs for the MIG pods still queued beyond the batch that no free instance is left for: a node
    is re-partitioned only while all its GPUs are idle, so a burst larger than a batch would
    otherwise find its GPUs whole and busy nodes' GPUs out of reach."""
    restore_for_waiting_seconds: _Number = Field(
        strict=False, default=120, ge=0, le=604_800, alias="restoreForWaitingSeconds"
    )
    """Sooner than ``restoreIdleSeconds``: a node gpusched re-partitioned whose instances and
    GPUs no pod has used for this long is set back to whole GPUs when GPU pods wait as
    unschedulable that it could take once whole (whole GPUs, or a new layout for MIG profiles its
    layout lacks); only as many nodes as their GPU demand needs.  0: never."""
    config_delay_seconds: _Number = Field(strict=False, default=120, ge=0, le=3_600, alias="configDelaySeconds")
    """How long after a layout is first written to the ConfigMap the node is labelled (a layout
    written that long before is labelled at once).  The MIG manager reads a mounted copy, which
    the kubelet refreshes on its pod sync: every ``syncFrequency`` (60 s) plus up to half that
    again, 90 s at worst, and the change takes a moment more to reach the kubelet.  Labelled
    before its copy has the layout, the MIG manager fails the node, and gpusched takes the node
    out of re-partitioning: the default leaves 30 s over those 90 s."""


class TenantRuleConfig(_Strict):
    """What one tenant is guaranteed and may hold, in GPUs (a share counts its fraction)."""

    quota_gpus: _Number = Field(strict=False, default=0, ge=0, le=1_000_000, alias="quotaGpus")
    """GPUs the tenant is guaranteed: within them its pods are drawn first, and may reclaim
    GPUs that tenants past their own quota hold."""
    limit_gpus: _Number | None = Field(strict=False, default=None, ge=0, le=1_000_000, alias="limitGpus")
    """GPUs the tenant never holds more of (null: no limit); at least ``quotaGpus``."""
    weight: _Number = Field(strict=False, default=1, gt=0, le=1_000_000)
    """Its share of the GPUs beyond every quota, against the other tenants' weights."""

    def rule(self) -> TenantRule:
        """The rule in thousandths of a GPU."""
        limit = None if self.limit_gpus is None else round(self.limit_gpus * GPU_MILLI)
        return TenantRule(round(self.quota_gpus * GPU_MILLI), limit, self.weight)

    def model_post_init(self, context: Any, /) -> None:
        if self.limit_gpus is not None and self.limit_gpus < self.quota_gpus:
            raise ValueError(f"limitGpus ({self.limit_gpus:g}) is below quotaGpus ({self.quota_gpus:g})")


class TenantsConfig(_Strict):
    """Quotas, limits and fair shares of GPUs between tenants (off while nothing is set)."""

    label: Annotated[str, AfterValidator(_label_key)] = ""
    """The pod label that names a pod's tenant; empty, or absent on a pod: its namespace."""
    reclaim: bool = True
    """A pod within its tenant's quota may evict pods of tenants past theirs to get it."""
    reclaim_below_priority: int = Field(default=1_000_000, ge=-(2**31), le=2**31 - 1, alias="reclaimBelowPriority")
    """Pods of this priority or more are never reclaimed."""
    default: Annotated[TenantRuleConfig, BeforeValidator(lambda v: {} if v is None else v)] = TenantRuleConfig()
    """The rule of every tenant ``quotas`` does not name."""
    quotas: dict[str, TenantRuleConfig] = Field(default_factory=dict)
    """Rules by tenant name."""

    def tenants(self) -> Tenants:
        """The rules as placement reads them."""
        return Tenants(
            label=self.label,
            rules={name: r.rule() for name, r in self.quotas.items()},
            default=self.default.rule(),
            reclaim=self.reclaim,
            reclaim_below=self.reclaim_below_priority,
        )


def _empty_section(value: object) -> object:
    """A section whose keys are all left out (``weights:`` with every line below commented out)
    reads as null in YAML: it takes the defaults, as an empty document does."""
    return {} if value is None else value


class GpuschedConfig(_Strict):
    """The whole document."""

    weights: Annotated[WeightsConfig, BeforeValidator(_empty_section)] = WeightsConfig()
    solver: Annotated[SolverConfig, BeforeValidator(_empty_section)] = SolverConfig()
    batching: Annotated[BatchingConfig, BeforeValidator(_empty_section)] = BatchingConfig()
    utilisation: Annotated[UtilisationConfig, BeforeValidator(_empty_section)] = UtilisationConfig()
    headroom: Annotated[HeadroomConfig, BeforeValidator(_empty_section)] = HeadroomConfig()
    tenants: Annotated[TenantsConfig, BeforeValidator(_empty_section)] = TenantsConfig()
    consolidation: Annotated[ConsolidationConfig, BeforeValidator(_empty_section)] = ConsolidationConfig()
    mig: Annotated[MigConfig, BeforeValidator(_empty_section)] = MigConfig()

    def solver_params(self, seed: int = 0) -> SolverParams:
        """The frozen parameters the solver takes."""
        w, s = self.weights, self.solver
        return SolverParams(
            weights=Weights(
                placed_gpu=w.placed_gpu,
                placed_pods=w.placed_pods,
                fragmentation=w.fragmentation,
                active_nodes=w.active_nodes,
                packing=w.packing,
                keep_hint=w.keep_hint,
                mig_partition=w.mig_partition,
                island_spill=w.island_spill,
                gang_domains=w.gang_domains,
                preferred_affinity=w.preferred_affinity,
                work_conserving=w.work_conserving,
            ),
            limits=Limits(s.time_limit_seconds, s.workers, s.candidates_per_pod, s.relative_gap),
            seed=seed,
        )


class ConfigError(ValueError):
    """A configuration document that was rejected; the message names each bad field."""


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the document accepts at ``loc`` (a path of keys), as written in YAML."""
    model: type[BaseModel] = GpuschedConfig
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        kind = None if field is None else field.annotation
        if get_origin(kind) is dict and parts:  # a mapping of named sections: the next part is a name
            parts.pop(0)
            kind = get_args(kind)[1]
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            return []
        model = kind
    return [f.alias or name for name, f in model.model_fields.items()]


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        path = ".".join(_shown(x) if not isinstance(x, str) or len(x) > 80 else x for x in err["loc"]) or "(document)"
        if err["type"] == "extra_forbidden":
            known = _keys_at(tuple(err["loc"][:-1]))
            parts.append(f"{path}: unknown key" + (f" (known here: {', '.join(known)})" if known else ""))
        else:
            parts.append(f"{path}: {_problem(err)}")
    return "; ".join(parts)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict = 2, 80, 80, 4, 4


def _shown(value: object) -> str:
    """A value of the document as an error shows it: its ``repr``, cut short.  YAML's aliases can
    make a short document hold a list of a billion strings, whose full ``repr`` would not fit in
    memory; the message stays a line whatever was given."""
    return _SHOWN.repr(value)


_FORMS = {"configMap": "NAMESPACE/NAME of a ConfigMap, e.g. gpu-operator/gpusched-mig-parted-config"}
"""What a key with a pattern expects, said as a user writes it."""


def _problem(err: Any) -> str:
    """One validation error as a user can act on it: what is expected, what was given."""
    kind, given, msg = err["type"], err.get("input"), str(err["msg"])
    key = str(err["loc"][-1]) if err["loc"] else ""
    if kind == "string_pattern_mismatch" and key in _FORMS:
        return f"expected {_FORMS[key]} (got {_shown(given)})"
    if kind in {"model_type", "dict_type"}:
        return f"expected a mapping of keys under it (got {_shown(given)})"
    if kind == "value_error":  # a rule across keys: the message names them and their values
        return msg.removeprefix("Value error, ")
    if kind == "bool_type":
        if isinstance(given, str):
            return f"{msg} (got the string {_shown(given)}; write true or false, without quotes)"
        return f"{msg} (got {_shown(given)}; write true or false)"
    if isinstance(given, str) and kind in {"int_type", "float_type"}:
        plain = given.strip().lstrip("-")
        if plain.isdecimal() or (kind == "float_type" and _decimal(plain)):
            return f"{msg} (got the string {_shown(given)}; write it without quotes)"
        example = "a whole number, such as 1000" if kind == "int_type" else "a plain number, such as 1.5"
        return f"{msg} (got {_shown(given)}; write {example})"
    return f"{msg} (got {_shown(given)})"


def _decimal(text: str) -> bool:
    """Digits with one dot (``2.5``): a number YAML reads as one unless it is quoted."""
    whole, dot, frac = text.partition(".")
    return bool(dot) and (whole + frac).isdecimal()


def parse_config(data: Any, source: str = "config") -> GpuschedConfig:
    """Validate an already-decoded document (``None`` means all defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return GpuschedConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives a key twice (it would keep the last
    silently, dropping a whole ``solver:`` block written first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults``: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "in a mapping", node.start_mark, f"{key!r} is given twice", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A node as PyYAML builds it; one its constructors fail on (a date such as 2024-02-30,
        ``!!int four``, ``!!bool maybe``, a number of thousands of digits), which they report
        with ValueError, KeyError or the like rather than as YAML errors, is refused with where
        it is."""
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, _unbuildable(node, exc), node.start_mark) from None


_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "timestamp": "a date"}


def _unbuildable(node: yaml.Node, exc: Exception) -> str:
    """What a value PyYAML could not build is, said as a user can act on it."""
    tag = node.tag.rsplit(":", 1)[-1]
    kind = _KINDS.get(tag, f"!!{tag}")
    text = node.value if isinstance(node.value, str) else ""
    shown = text if len(text) <= 40 else f"{text[:37]}..."
    if "digits" in str(exc):  # Python's limit on the digits of an int
        why = f": it has {len(text)} digits"
    elif tag == "timestamp" and isinstance(exc, ValueError):  # the date's own fault: day out of range
        why = f": {exc}"
    else:
        why = ""
    return f"cannot read {shown!r} as {kind}{why}"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (the parser's own text runs over several lines and
    names the document ``<unicode string>``)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def read_yaml(text: str, source: str) -> Any:
    """One YAML document, a key given twice refused; ``ConfigError`` says what is wrong and where.
    A second document (a ``---`` line after the first, even with nothing after it) is refused."""
    try:
        return yaml.load(text, Loader=_UniqueKeys)
    except yaml.composer.ComposerError as exc:
        if exc.problem == "but found another document" and exc.problem_mark is not None:
            raise ConfigError(
                f"{source}: not one YAML document: another starts at line {exc.problem_mark.line + 1}; "
                "remove that '---' (a '---' may only open the document)"
            ) from None
        raise ConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(_too_deep(source)) from None


def _too_deep(source: str) -> str:
    return f"{source}: nested too deeply to read; a configuration is a few levels of keys"


def read_yaml_documents(text: str, source: str) -> list[Any]:
    """Every YAML document of ``text`` (as ``kubectl kustomize`` prints several), each as
    ``read_yaml`` reads one."""
    try:
        return list(yaml.load_all(text, Loader=_UniqueKeys))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(_too_deep(source)) from None


def load_config(text: str, source: str = "config") -> GpuschedConfig:
    """Parse and validate the text of a solver configuration: one YAML document.  How the
    scheduler reads its ConfigMap's ``config.yaml``, and how ``check-config``, ``run --config
    FILE`` and ``simulate --config`` read a solver document, so that all of them agree."""
    return parse_config(read_yaml(text, source), source)
