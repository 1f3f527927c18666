"""Fuzzing the reading of API objects: whatever a user, a controller or a future version of an API
puts in an object, reading it gives a record, or a ``ConvertError`` that names the object and the
field, and does so quickly.

The objects have the shape the watches deliver, with hostile values where people and controllers
write what the API server does not check (annotations, the labels gpusched reads, extended
resource quantities, a PodGroup's spec, a budget's status) and, now and then, a value of any JSON
type where the API server does check it: a CRD without a schema, or a newer API, brings those.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.kube.convert import (
    ConvertError,
    budget_record,
    claim_record,
    namespace_labels,
    node_record,
    pod_group_record,
    pod_record,
    storage_class_record,
    volume_record,
)

FUZZ = settings(
    max_examples=150,
    derandomize=True,  # the same examples on every run: a failure is one to fix, not a flake
    deadline=None,  # timed below, generously: the machine running the tests may be busy
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_PODS = settings(FUZZ, max_examples=100)
"""Pods are the largest objects to draw."""
SLOW_S = 1.0
"""No object may take this long to read (a quantity such as ``1e999999`` must not be expanded)."""

T = TypeVar("T")

# -- values -----------------------------------------------------------------------------------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # JSON decoding gives inf for 1e400, and NaN and Infinity as Python reads them
    | st.text(max_size=8)
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
"""A value of any JSON type."""

TRICKY_QUANTITIES = [
    "0",
    "1",
    "8",
    "0.5",
    "1.5",
    "1e3",
    "1E3",
    "1e-3",
    "1Ei",
    "1Ki",
    "500m",
    "1n",
    "9e18",
    "9223372036854775807",
    "9223372036854775808",
    "1e999999",
    "1e-999999",
    "1e99999999999999999999",
    "0e999999999999",
    "1" * 5000,
    "0." + "0" * 5000 + "1",
    "-1",
    "+1",
    ".",
    "1.2.3",
    "",
    " ",
    "1 ",
    "1KiB",
    "1ki",
    "NaN",
    "Infinity",
    "0x10",
    "1_000",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: a digit to Python, not to Kubernetes
    "\u00b2",  # SUPERSCRIPT TWO: isdigit(), yet no int
]
QUANTITY_RE = r"[+-]?[0-9]{0,25}(\.[0-9]{0,25})?([eE][+-]?[0-9]{1,22})?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
TRICKY_NUMBERS = [math.inf, -math.inf, math.nan, 1e300, -0.0, 0.5, 2**63, 2**64, 10**400, True, False]
"""Numbers as JSON decodes them: 1e400 is infinity, NaN and Infinity are read, integers are unbounded."""
QUANTITIES = st.one_of(
    st.sampled_from(TRICKY_QUANTITIES),
    st.from_regex(QUANTITY_RE, fullmatch=True),
    st.sampled_from(TRICKY_NUMBERS),
    st.integers(min_value=-1, max_value=2**70),
    st.floats(),
)
"""Resource quantities as strings or numbers, well-formed or not, tiny, huge or not numbers."""

TRICKY_TEXT = [
    "",
    " ",
    ",",
    ";",
    "0",
    "1",
    "2",
    "-1",
    "1000",
    "1001",
    "500",
    "0.5",
    "1e3",
    "1e999999",
    " 3 ",
    "3_0",
    "\u0663",
    "\u00b2",
    "9" * 30,
    "9" * 5000,
    "0" * 5000 + "1",
    "true",
    "True",
    "required",
    "preferred",
    "rack",
    "0,1",
    "0,,1",
    "-1,2",
    "99999999999999999999",
    "0-3;4-7",
    "0-99999999999",
    "5-3",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "NVIDIA-A100-SXM4-40GB-MIG-\u00b2g.5gb",
    "all-disabled",
    "gpusched-1",
    "pending",
    "failed",
    "success",
    "1e3m",
    "\x00",
    "\u202e",
]
TEXT = st.one_of(st.sampled_from(TRICKY_TEXT), st.text(max_size=12))
"""Annotation values: any string, and ones near what the code compares and parses."""

TIMESTAMPS = st.one_of(
    st.sampled_from(
        [
            "2026-12-01T00:00:10Z",
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00",
            "0001-01-01T00:00:00+23:59",
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59-23:59",
            "9999-12-31T23:59:59",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "now",
            "",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat()),
    st.text(max_size=25),
)


@dataclass
class Draft:
    """Builds one object: a field gets its good value, or now and then one of any JSON type;
    the names of the fields that may be bad are noted, to find one of them in an error."""

    draw: Callable[[st.SearchStrategy[Any]], Any]
    suspects: set[str] = field(default_factory=set)

    def pick(self, name: str, good: st.SearchStrategy[T]) -> T | Any:
        if self.draw(st.integers(0, 9)) == 0:
            self.suspects.add(name)
            return self.draw(JSON)
        return self.draw(good)

    def mapping(self, name: str, keys: list[str], values: st.SearchStrategy[Any]) -> dict[str, Any] | Any:
        """Some of ``keys``, each with a value of ``values`` (or of any type)."""
        chosen = self.draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys)))
        out = {k: self.pick(k, values) for k in chosen}
        self.suspects.update(chosen)  # the values here are hostile by design
        return self.pick(name, st.just(out))

    def maybe(self, strategy: st.SearchStrategy[T]) -> T | None:
        return self.draw(st.none() | strategy)

    def some(self, fields: dict[str, Callable[[], Any]]) -> dict[str, Any]:
        """Some of ``fields``, each drawn (by its function) only when it is kept."""
        return {k: build() for k, build in fields.items() if self.draw(st.booleans())}


def _compact(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without the keys left absent (None), as the API server leaves them out."""
    return {k: v for k, v in obj.items() if v is not None}


# -- objects ----------------------------------------------------------------------------------

NODE_LABELS = [
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.replicas",
    "nvidia.com/mig.config",
    "nvidia.com/mig.config.state",
    "nvidia.com/gfd.timestamp",
    "gpusched.io/mig-repartition",
    "gpusched.io/mig-requested-at",
    "gpusched.io/mig-previous",
    "gpusched.io/mig-restore-failed-at",
    "gpusched.io/mig-setting-back-at",
    "nvidia.com/gpu.clique",
    "topology.kubernetes.io/zone",
    "rack",
]
RESOURCES = [
    "cpu",
    "memory",
    "pods",
    "ephemeral-storage",
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-3g.40gb",
    "nvidia.com/mig-1g.10gb.me",
    "nvidia.com/mig-lots",
    "nvidia.com/mig-0g.0gb",
    "nvidia.com/mig-\u00b2g.10gb",
    "gpusched.io/gpu-milli",
    "hugepages-2Mi",
    "example.com/fpga",
]


@st.composite
def nodes(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    alloc = d.mapping("allocatable", RESOURCES, QUANTITIES)
    taint = st.fixed_dictionaries(
        {},
        optional={
            "key": TEXT,
            "value": TEXT,
            "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", "Sometimes"]),
        },
    )
    obj = {
        "metadata": _compact(
            {
                "name": "n1",
                "labels": d.mapping("labels", NODE_LABELS, TEXT),
                "annotations": d.mapping("annotations", ["gpusched.io/gpu-islands"], TEXT),
            }
        ),
        "spec": d.pick(
            "spec",
            st.just(
                _compact(
                    {
                        "taints": d.maybe(st.just(d.pick("taints", st.lists(taint, max_size=3)))),
                        "unschedulable": d.maybe(st.just(d.pick("unschedulable", st.booleans()))),
                    }
                )
            ),
        ),
        "status": d.pick("status", st.fixed_dictionaries({"allocatable": st.just(alloc)})),
    }
    return obj, d.suspects


POD_ANNOTATIONS = [
    "gpusched.io/gpu-milli",
    "gpusched.io/gpu-models",
    "gpusched.io/gpu-island",
    "gpusched.io/gpu-indices",
    "gpusched.io/gang-min-members",
    "gpusched.io/gang-topology-key",
    "gpusched.io/gang-topology",
    "gpusched.io/consolidate",
    "kubernetes.io/config.mirror",
]
POD_LABELS = ["scheduling.x-k8s.io/pod-group", "app", "team"]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Near"]


def _requirements(d: Draft) -> Any:
    expression = st.fixed_dictionaries(
        {"key": st.sampled_from(["rack", "app", "nvidia.com/gpu.product", "", "metadata.name"])},
        optional={
            "operator": st.sampled_from(OPERATORS),
            "values": st.lists(TEXT, max_size=2),
        },
    )
    return d.pick("matchExpressions", st.lists(expression, max_size=2))


def _label_selector(d: Draft) -> Any:
    selector = d.some(
        {
            "matchLabels": lambda: d.draw(st.dictionaries(st.sampled_from(POD_LABELS), TEXT, max_size=2)),
            "matchExpressions": lambda: _requirements(d),
        }
    )
    return d.pick("labelSelector", st.just(selector))


def _pod_term(d: Draft) -> Any:
    term = {
        "topologyKey": d.draw(st.sampled_from(["rack", "kubernetes.io/hostname", ""])),
        **d.some(
            {
                "labelSelector": lambda: _label_selector(d),
                "namespaces": lambda: d.draw(st.lists(st.sampled_from(["ns", "other"]), max_size=2)),
                "namespaceSelector": lambda: _label_selector(d),
                "matchLabelKeys": lambda: d.draw(st.lists(st.sampled_from(POD_LABELS), max_size=2)),
            }
        ),
    }
    return d.pick("podAffinityTerm", st.just(term))


def _affinity(d: Draft) -> Any:
    weight = st.one_of(st.integers(-1, 101), st.just(50))

    def node_affinity() -> Any:
        section = d.some(
            {
                "requiredDuringSchedulingIgnoredDuringExecution": lambda: {
                    "nodeSelectorTerms": [{"matchExpressions": _requirements(d)}]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": lambda: [
                    {"weight": d.draw(weight), "preference": {"matchExpressions": _requirements(d)}}
                ],
            }
        )
        return d.pick("nodeAffinity", st.just(section))

    def pod_affinity(kind: str) -> Any:
        section = d.some(
            {
                "requiredDuringSchedulingIgnoredDuringExecution": lambda: [_pod_term(d)],
                "preferredDuringSchedulingIgnoredDuringExecution": lambda: [
                    {"weight": d.draw(weight), "podAffinityTerm": _pod_term(d)}
                ],
            }
        )
        return d.pick(kind, st.just(section))

    affinity = d.some(
        {
            "nodeAffinity": node_affinity,
            "podAffinity": lambda: pod_affinity("podAffinity"),
            "podAntiAffinity": lambda: pod_affinity("podAntiAffinity"),
        }
    )
    return d.pick("affinity", st.just(affinity))


def _container(d: Draft, name: str) -> Any:
    port = st.fixed_dictionaries(
        {"containerPort": st.integers(1, 65535)},
        optional={
            "hostPort": st.one_of(st.integers(-1, 70000), st.integers()),
            "protocol": st.sampled_from(["TCP", "UDP", "SCTP", ""]),
            "hostIP": st.sampled_from(["", "0.0.0.0", "10.0.0.1"]),
        },
    )
    resources = {
        "limits": d.mapping("limits", RESOURCES, QUANTITIES),
        "requests": d.mapping("requests", RESOURCES, QUANTITIES),
    }
    container = {
        "name": name,
        "resources": d.pick("resources", st.just(resources)),
        **d.some(
            {
                "ports": lambda: d.pick("ports", st.lists(port, max_size=2)),
                "restartPolicy": lambda: d.draw(st.sampled_from(["Always", "Never"])),
            }
        ),
    }
    return d.pick("containers", st.just(container))


def _spread(d: Draft) -> Any:
    constraint = {
        "topologyKey": d.draw(st.sampled_from(["rack", ""])),
        **d.some(
            {
                "maxSkew": lambda: d.draw(st.one_of(st.integers(-1, 3), JSON)),
                "minDomains": lambda: d.draw(st.one_of(st.integers(-1, 3), JSON)),
                "whenUnsatisfiable": lambda: d.draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway", "Never"])),
                "labelSelector": lambda: _label_selector(d),
                "nodeAffinityPolicy": lambda: d.draw(st.sampled_from(["Honor", "Ignore", "Maybe"])),
                "matchLabelKeys": lambda: d.draw(st.lists(st.sampled_from(POD_LABELS), max_size=2)),
            }
        ),
    }
    return constraint


def _container_status(d: Draft) -> Any:
    return {
        "name": d.draw(st.sampled_from(["c", "s"])),
        **d.some(
            {
                "resources": lambda: {"requests": d.mapping("requests", RESOURCES, QUANTITIES)},
                "allocatedResources": lambda: d.mapping("allocatedResources", RESOURCES, QUANTITIES),
            }
        ),
    }


@st.composite
def pods(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    toleration = st.fixed_dictionaries(
        {},
        optional={
            "key": TEXT,
            "operator": st.sampled_from(["Equal", "Exists", "Gt", "Lt", "Maybe", ""]),
            "value": TEXT,
            "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", ""]),
        },
    )
    volume = st.one_of(
        st.fixed_dictionaries(
            {"name": st.just("data"), "persistentVolumeClaim": st.fixed_dictionaries({"claimName": TEXT})}
        ),
        st.fixed_dictionaries({"name": TEXT, "ephemeral": st.just({})}),
    )
    condition = st.fixed_dictionaries(
        {"type": st.sampled_from(["PodScheduled", "DisruptionTarget", "PodResizePending"])},
        optional={
            "status": st.sampled_from(["True", "False"]),
            "reason": st.sampled_from(["Unschedulable", "PreemptionByScheduler", "Infeasible", "SchedulerError"]),
            "message": TEXT,
        },
    )
    owner = st.fixed_dictionaries(
        {"kind": st.sampled_from(["ReplicaSet", "DaemonSet", "Job"]), "uid": TEXT},
        optional={"controller": st.one_of(st.booleans(), JSON)},
    )
    spec = {
        "schedulerName": "gpu-scheduler",
        "containers": d.pick("containers", st.just([_container(d, "c")])),
        "priority": d.pick("priority", st.integers(-(2**31), 2**31 - 1)),
        **d.some(
            {
                "initContainers": lambda: d.pick("initContainers", st.just([_container(d, "s"), _container(d, "i")])),
                "nodeName": lambda: d.draw(st.sampled_from(["n1", ""])),
                "nodeSelector": lambda: d.mapping("nodeSelector", ["nvidia.com/gpu.product", "rack"], TEXT),
                "affinity": lambda: _affinity(d),
                "topologySpreadConstraints": lambda: d.pick("topologySpreadConstraints", st.just([_spread(d)])),
                "tolerations": lambda: d.pick("tolerations", st.lists(toleration, max_size=2)),
                "volumes": lambda: d.pick("volumes", st.lists(volume, max_size=2)),
                "overhead": lambda: d.mapping("overhead", RESOURCES, QUANTITIES),
                "resources": lambda: d.pick(
                    "resources", st.just({"requests": d.mapping("requests", RESOURCES, QUANTITIES)})
                ),
                "preemptionPolicy": lambda: d.draw(st.sampled_from(["Never", "PreemptLowerPriority"])),
                "schedulingGates": lambda: d.pick("schedulingGates", st.just([{"name": "g"}])),
                "resourceClaims": lambda: d.pick("resourceClaims", st.just([{"name": "gpu"}])),
            }
        ),
    }
    meta = {
        "name": "p",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "7",
        "labels": d.mapping("labels", POD_LABELS, TEXT),
        "annotations": d.mapping("annotations", POD_ANNOTATIONS, TEXT),
        "creationTimestamp": d.pick("creationTimestamp", TIMESTAMPS),
        **d.some(
            {
                "deletionTimestamp": lambda: d.draw(TIMESTAMPS),
                "ownerReferences": lambda: d.pick("ownerReferences", st.lists(owner, max_size=2)),
            }
        ),
    }
    status = d.some(
        {
            "phase": lambda: d.draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
            "startTime": lambda: d.pick("startTime", TIMESTAMPS),
            "nominatedNodeName": lambda: d.draw(st.sampled_from(["n7", ""])),
            "conditions": lambda: d.pick("conditions", st.lists(condition, max_size=2)),
            "containerStatuses": lambda: d.pick("containerStatuses", st.just([_container_status(d)])),
        }
    )
    obj = {"metadata": meta, "spec": d.pick("spec", st.just(spec)), "status": d.pick("status", st.just(status))}
    return obj, d.suspects


@st.composite
def budgets(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    spec = _compact(
        {
            "selector": d.maybe(st.just(d.pick("selector", st.just(_label_selector(d))))),
            "minAvailable": d.maybe(st.one_of(st.integers(), st.sampled_from(["50%", "0%", "100%", "150%", "x%"]))),
            "maxUnavailable": d.maybe(st.one_of(st.integers(), st.sampled_from(["50%", "1", "%"]))),
        }
    )
    status = _compact(
        {
            "disruptionsAllowed": d.maybe(st.just(d.pick("disruptionsAllowed", st.integers(0, 2**31 - 1)))),
            "disruptedPods": d.maybe(st.just(d.pick("disruptedPods", st.dictionaries(TEXT, TIMESTAMPS, max_size=2)))),
        }
    )
    return _object_of(d, {"name": "b", "namespace": "ns"}, spec, status)


def _object_of(
    d: Draft, meta: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]
) -> tuple[dict[str, Any], set[str]]:
    """An API object of ``meta``, with ``spec`` and ``status`` as ``d`` picks them (hostile or
    not), and the fields ``d`` suspects."""
    return {
        "metadata": meta,
        "spec": d.pick("spec", st.just(spec)),
        "status": d.pick("status", st.just(status)),
    }, d.suspects


@st.composite
def pod_groups(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    minimum = st.one_of(st.sampled_from([*TRICKY_NUMBERS, 0, 1, 3, 2.0, "3"]), st.integers(), st.floats())
    spec = _compact(
        {
            "minMember": d.maybe(st.just(d.pick("minMember", minimum))),
            "scheduleTimeoutSeconds": d.maybe(JSON),
            "minResources": d.maybe(st.just(d.mapping("minResources", RESOURCES, QUANTITIES))),
        }
    )
    d.suspects.add("minMember")  # every value drawn for it is hostile
    return {"metadata": {"name": "g", "namespace": "ns"}, "spec": d.pick("spec", st.just(spec))}, d.suspects


@st.composite
def claims(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    owner = st.fixed_dictionaries({"uid": TEXT}, optional={"controller": st.one_of(st.booleans(), JSON)})
    meta = _compact(
        {
            "name": "c",
            "namespace": "ns",
            "ownerReferences": d.maybe(st.just(d.pick("ownerReferences", st.lists(owner, max_size=2)))),
            "deletionTimestamp": d.maybe(TIMESTAMPS),
            "annotations": d.mapping(
                "annotations",
                [
                    "pv.kubernetes.io/bind-completed",
                    "volume.kubernetes.io/selected-node",
                    "volume.beta.kubernetes.io/storage-class",
                ],
                TEXT,
            ),
        }
    )
    spec = _compact(
        {
            "volumeName": d.maybe(st.just(d.pick("volumeName", TEXT))),
            "storageClassName": d.maybe(st.just(d.pick("storageClassName", TEXT))),
            "resources": d.maybe(st.just(d.pick("resources", st.just({"requests": {"storage": "1Gi"}})))),
            "selector": d.maybe(st.just(d.pick("selector", st.just({"matchLabels": {"tier": "fast"}})))),
            "volumeMode": d.maybe(st.just(d.pick("volumeMode", st.sampled_from(["Block", "Filesystem"])))),
            "accessModes": d.maybe(
                st.just(d.pick("accessModes", st.lists(st.sampled_from(["ReadWriteOnce", "ReadWriteOncePod"]))))
            ),
        }
    )
    status = {"phase": d.pick("phase", st.sampled_from(["Bound", "Pending", "Lost"]))}
    return _object_of(d, meta, spec, status)


@st.composite
def volumes(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    affinity = d.pick("nodeAffinity", st.just({"required": {"nodeSelectorTerms": []}}))
    fields = {
        "nodeAffinity": d.maybe(st.just(affinity)),
        "capacity": d.maybe(st.just(d.pick("capacity", st.just({"storage": d.pick("storage", TEXT)})))),
        "claimRef": d.maybe(st.just(d.pick("claimRef", st.just({"namespace": "ns", "name": "c"})))),
        "storageClassName": d.maybe(st.just(d.pick("storageClassName", TEXT))),
        "accessModes": d.maybe(st.just(d.pick("accessModes", st.lists(TEXT, max_size=2)))),
    }
    spec = d.pick("spec", st.just(_compact(fields)))
    status = d.pick("status", st.just({"phase": d.pick("phase", st.sampled_from(["Available", "Bound", "Released"]))}))
    return {"metadata": {"name": "v"}, "spec": spec, "status": status}, d.suspects


@st.composite
def storage_classes(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    expression = st.fixed_dictionaries(
        {"key": st.one_of(TEXT, JSON)}, optional={"values": st.one_of(st.lists(TEXT, max_size=2), JSON)}
    )
    term = st.fixed_dictionaries({}, optional={"matchLabelExpressions": st.one_of(st.lists(expression), JSON)})
    obj = _compact(
        {
            "metadata": {"name": "fast"},
            "provisioner": d.maybe(st.just(d.pick("provisioner", TEXT))),
            "volumeBindingMode": d.maybe(
                st.just(d.pick("volumeBindingMode", st.sampled_from(["Immediate", "WaitForFirstConsumer"])))
            ),
            "allowedTopologies": d.maybe(st.just(d.pick("allowedTopologies", st.lists(term, max_size=2)))),
        }
    )
    d.suspects.add("allowedTopologies")  # its expressions are hostile by design
    return obj, d.suspects


@st.composite
def namespaces(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[dict[str, Any], set[str]]:
    d = Draft(draw)
    return {"metadata": {"name": "ns", "labels": d.mapping("labels", ["team", "env"], TEXT)}}, d.suspects


# -- the oracle -------------------------------------------------------------------------------


def read(fn: Callable[[dict[str, Any]], T], obj: dict[str, Any]) -> T | ConvertError:
    """``fn(obj)``, or the ``ConvertError`` it raised; any other exception fails the test, as does
    taking ``SLOW_S`` or more."""
    start = time.perf_counter()
    try:
        result: T | ConvertError = fn(obj)
    except ConvertError as exc:
        result = exc
    elapsed = time.perf_counter() - start
    assert elapsed < SLOW_S, f"reading took {elapsed:.1f} s"
    return result


def assert_names(message: str, where: str, suspects: set[str]) -> None:
    """``message`` names the object and one of the fields that may be bad."""
    assert where in message, f"{message!r} does not name {where}"
    assert any(s in message for s in suspects), f"{message!r} names none of the fields {sorted(suspects)}"


def all_strings(pairs: Iterator[tuple[Any, Any]]) -> bool:
    return all(isinstance(k, str) and isinstance(v, str) for k, v in pairs)


# -- the properties ---------------------------------------------------------------------------


@FUZZ
@given(nodes())
def test_a_node_is_read_or_refused_naming_the_field(case: tuple[dict[str, Any], set[str]]) -> None:
    obj, suspects = case
    rec = read(node_record, obj)
    if isinstance(rec, ConvertError):
        assert_names(str(rec), "node n1", suspects)
    else:
        assert all_strings(iter(rec.node.labels.items())), "a node's labels are read as strings"
        assert isinstance(rec.warning, str)


@FUZZ_PODS
@given(pods())
def test_a_pod_is_always_read_with_what_is_wrong_as_its_error(case: tuple[dict[str, Any], set[str]]) -> None:
    obj, _ = case
    rec = read(lambda o: pod_record(o, {"ns": {"team": "a"}}, {"ns/g": 2}), obj)
    assert not isinstance(rec, ConvertError), f"a pod with a name is always read: {rec}"
    if rec.error:
        assert "pod ns/p" in rec.error
    assert all_strings(iter(rec.pod.labels))
    assert rec.gpu_indices is None or all(isinstance(i, int) for i in rec.gpu_indices)


@FUZZ
@given(budgets())
def test_a_disruption_budget_is_read_or_refused_naming_the_field(case: tuple[dict[str, Any], set[str]]) -> None:
    obj, suspects = case
    rec = read(budget_record, obj)
    if isinstance(rec, ConvertError):
        assert_names(str(rec), "PodDisruptionBudget ns/b", suspects | {"selector"})


@FUZZ
@given(pod_groups())
def test_a_pod_group_is_read_or_refused_naming_the_field(case: tuple[dict[str, Any], set[str]]) -> None:
    obj, suspects = case
    rec = read(pod_group_record, obj)
    if isinstance(rec, ConvertError):
        assert_names(str(rec), "PodGroup ns/g", suspects)
    else:
        assert rec[0] == "ns/g"
        assert rec[1] >= 1


@pytest.mark.parametrize(
    ("reader", "objects", "named"),
    [
        (claim_record, claims, "PersistentVolumeClaim ns/c"),
        (volume_record, volumes, "PersistentVolume v"),
        (storage_class_record, storage_classes, "StorageClass fast"),
    ],
)
@FUZZ
@given(data=st.data())
def test_a_claim_or_volume_is_read_or_refused_naming_the_field(
    reader: Callable[[dict[str, Any]], object],
    objects: Callable[[], st.SearchStrategy[tuple[dict[str, Any], set[str]]]],
    named: str,
    data: st.DataObject,
) -> None:
    obj, suspects = data.draw(objects())
    rec = read(reader, obj)
    if isinstance(rec, ConvertError):
        assert_names(str(rec), named, suspects)


@FUZZ
@given(namespaces())
def test_a_namespace_is_read_or_refused_naming_the_field(case: tuple[dict[str, Any], set[str]]) -> None:
    obj, suspects = case
    rec = read(namespace_labels, obj)
    if isinstance(rec, ConvertError):
        assert_names(str(rec), "namespace ns", suspects)
    else:
        assert all_strings(iter(rec[1].items()))
