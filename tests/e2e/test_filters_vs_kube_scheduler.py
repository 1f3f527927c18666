"""gpusched's node filters against the real kube-scheduler, pod by node.

kube-scheduler is the reference, asked as ``tests/e2e/reference.py`` asks it: for every case, a
pod, and every node, a copy of the pod pinned to that node; kube-scheduler binds it or marks it
unschedulable, and gpusched's books and ``pod_mask`` (its words ``explain``'s) judge the same copy.

The cases are drawn from a fixed seed over the node-level filters: node selector, required node
affinity, taints and tolerations, cordoned nodes, resource fit (cpu, memory, pods, ephemeral
storage, ``nvidia.com/gpu``, init containers, sidecars, pod-level requests, overhead) and host
ports against pods already bound (some of them terminating); hand-picked cases at the edges of
each filter follow.  The one difference docs/deploy.md names, memory counted in MiB, is asserted
as such.  The copies of one case are created together (each is pinned to its own node, so they
do not compete, and no filter here looks at other pods' labels) and force-deleted before the next
case.  The filters that depend on other pods are compared in test_pod_filters_vs_kube_scheduler.py.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Any

from gpusched.kube.client import Kube
from tests.e2e.reference import (
    KubeScheduler,
    Outcome,
    compare,
    container,
    make_node,
    make_pod,
    report,
)

SEED = 20261207
CASES = 50
RUNTIME_CLASS = "overhead-small"
"""A RuntimeClass with a pod overhead: the admission plugin copies it into ``spec.overhead``
(a pod may not set an overhead of its own)."""
OVERHEAD = {"cpu": "250m", "memory": "128Mi"}

# --------------------------------------------------------------------------- the seeded world

ZONES = ("a", "b", "c")
TAINT_POOL = (
    ("dedicated", "gpu", "NoSchedule"),
    ("dedicated", "infer", "NoExecute"),
    ("spot", "", "PreferNoSchedule"),
    ("maint", "true", "NoSchedule"),
    ("nvidia.com/gpu", "present", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "", "NoSchedule"),
)
TOLERATION_POOL: tuple[dict[str, Any], ...] = (
    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "infer"},
    {"key": "dedicated", "operator": "Exists"},
    {"key": "dedicated", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoExecute", "tolerationSeconds": 0},
    {"operator": "Exists"},
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": "maint", "operator": "Equal", "value": "true"},
    {"key": "maint", "operator": "Equal", "value": "false"},
    {"key": "maint", "operator": "Exists", "effect": "NoExecute"},
    {"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
    {"key": "spot", "operator": "Equal", "value": ""},
    {"key": "dedicated", "operator": "Equal", "effect": "NoSchedule"},
)
PORT_POOL: tuple[dict[str, Any], ...] = (
    {"containerPort": 8080, "hostPort": 8080},
    {"containerPort": 8080, "hostPort": 8080, "protocol": "UDP"},
    {"containerPort": 8080, "hostPort": 8080, "hostIP": "127.0.0.1"},
    {"containerPort": 8080, "hostPort": 8080, "hostIP": "10.0.0.1"},
    {"containerPort": 8080, "hostPort": 8080, "hostIP": "0.0.0.0"},
    {"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"},
    {"containerPort": 53, "hostPort": 53, "protocol": "UDP"},
    {"containerPort": 9090, "hostPort": 9090},
    {"containerPort": 9100, "hostPort": 9100, "protocol": "SCTP"},
)


def world(
    rng: random.Random, prefix: str, count: int = 12
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """``count`` nodes of various labels, taints, capacities and cordons, the pods already bound
    to them (another scheduler's: they hold resources, pod slots and host ports), and those of
    them to delete (with a grace period no kubelet ends: they stay, terminating, and still hold
    their room, as for kube-scheduler)."""
    nodes: list[dict[str, Any]] = []
    residents: list[dict[str, Any]] = []
    leaving: list[str] = []
    for i in range(count):
        name = f"{prefix}-n{i}"
        labels: dict[str, str] = {}
        if rng.random() < 0.8:
            labels["zone"] = rng.choice(ZONES)
        if rng.random() < 0.6:
            labels["tier"] = rng.choice(("gold", "silver"))
        if rng.random() < 0.7:
            labels["rank"] = rng.choice(("3", "12", "0", "07", "x9", "100"))
        gpus = rng.choice((0, 0, 1, 2, 4, 8))
        if i % 2:  # roomy and open, so that half the nodes refuse only what a pod asks of them
            node = make_node(
                name,
                cpu=rng.choice(("8", "16")),
                memory=rng.choice(("16Gi", "32Gi")),
                storage=rng.choice(("20Gi", "40Gi")),
                gpus=gpus,
                product=rng.choice(("NVIDIA-A100-SXM4-80GB", "NVIDIA-L4")),
                labels=labels,
                taints=[t for t in TAINT_POOL if t[2] == "PreferNoSchedule" and rng.random() < 0.3],
            )
        else:
            node = make_node(
                name,
                cpu=rng.choice(("2", "4", "8", "16", "3500m")),
                memory=rng.choice(("4Gi", "8Gi", "16Gi", "32Gi", "6000Mi")),
                pods=rng.choice(("2", "3", "5", "110", "110", "110", None)),
                storage=rng.choice(("10Gi", "20Gi", "20Gi", "40Gi", None)),
                gpus=gpus,
                product=rng.choice(("NVIDIA-A100-SXM4-80GB", "NVIDIA-L4")),
                labels=labels,
                taints=rng.sample(TAINT_POOL, k=rng.choice((0, 0, 0, 1, 1, 2))),
                unschedulable=rng.random() < 0.15,
            )
        if gpus and rng.random() < 0.2:  # GPUs advertised, no GPU feature discovery labels
            node["metadata"]["labels"].pop("nvidia.com/gpu.product")
        nodes.append(node)
        for j in range(rng.choice((0, 1, 1, 2))):
            reqs = {"cpu": rng.choice(("500m", "1", "2")), "memory": rng.choice(("512Mi", "2Gi", "4Gi"))}
            if gpus and rng.random() < 0.5:
                reqs["nvidia.com/gpu"] = str(rng.randint(1, gpus))
            if rng.random() < 0.3:
                reqs["ephemeral-storage"] = rng.choice(("2Gi", "8Gi"))
            ports = rng.sample(PORT_POOL, k=rng.choice((0, 1, 1, 2)))
            containers = [container("main", reqs, ports[:1])]
            init = [container("side", {"cpu": "100m"}, ports[1:], sidecar=True)] if len(ports) > 1 else []
            spec: dict[str, Any] = {"nodeName": name, "schedulerName": "elsewhere", "containers": containers}
            if init:
                spec["initContainers"] = init
            residents.append(make_pod(f"{name}-r{j}", spec))
            if rng.random() < 0.15:
                spec["terminationGracePeriodSeconds"] = 3600
                leaving.append(f"{name}-r{j}")
    return nodes, residents, leaving


def _expression(rng: random.Random) -> dict[str, Any]:
    key = rng.choice(("zone", "tier", "rank", "nvidia.com/gpu.product", "missing"))
    op = rng.choice(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
    if op in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": op}
    if op in ("Gt", "Lt"):
        return {"key": rng.choice(("rank", "rank", "zone")), "operator": op, "values": [rng.choice(("0", "5", "10"))]}
    values = {
        "zone": ZONES,
        "tier": ("gold", "silver", "bronze"),
        "rank": ("3", "7", "12", "x9"),
        "nvidia.com/gpu.product": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"),
        "missing": ("yes",),
    }[key]
    return {"key": key, "operator": op, "values": rng.sample(values, k=rng.randint(1, min(2, len(values))))}


def case(rng: random.Random, node_names: Sequence[str]) -> dict[str, Any]:
    """One pod spec over the node filters (without a name or schedulerName)."""
    spec: dict[str, Any] = {}
    main: dict[str, str] = {}
    if rng.random() < 0.8:
        main["cpu"] = rng.choice(("100m", "500m", "500m", "1", "1", "2", "3"))
    if rng.random() < 0.8:
        main["memory"] = rng.choice(("128Mi", "1Gi", "1Gi", "3Gi", "6Gi", "10Gi"))
    if rng.random() < 0.2:
        main["ephemeral-storage"] = rng.choice(("1Gi", "5Gi", "15Gi"))
    if rng.random() < 0.35:
        main["nvidia.com/gpu"] = rng.choice(("1", "1", "2", "4"))
    ports = rng.sample(PORT_POOL, k=1) if rng.random() < 0.2 else []
    if rng.random() < 0.06:  # every container port is a host port (the API server sets hostPort)
        spec["hostNetwork"] = True
        ports = [{"containerPort": 8080}]
    containers = [container("main", main, ports)]
    if rng.random() < 0.25:
        containers.append(container("helper", {"cpu": rng.choice(("200m", "1")), "memory": "256Mi"}))
    spec["containers"] = containers
    init: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        side_ports = rng.sample(PORT_POOL, k=1) if rng.random() < 0.3 else []
        init.append(container("side", {"cpu": rng.choice(("250m", "1")), "memory": "512Mi"}, side_ports, sidecar=True))
    if rng.random() < 0.3:
        big = {"cpu": rng.choice(("2", "4")), "memory": rng.choice(("2Gi", "8Gi"))}
        if rng.random() < 0.3:
            big["ephemeral-storage"] = "12Gi"
        init.insert(rng.randint(0, len(init)), container("setup", big))
    if rng.random() < 0.1:  # an init container's ports are free again once it is done
        init.append(container("fetch", {"cpu": "100m"}, rng.sample(PORT_POOL, k=1)))
    if init:
        spec["initContainers"] = init
    if rng.random() < 0.2:
        spec["runtimeClassName"] = RUNTIME_CLASS
    if rng.random() < 0.1:  # a pod-level request stands for its containers' (at least their sum)
        spec["resources"] = {"requests": {"cpu": rng.choice(("7", "12")), "memory": rng.choice(("12Gi", "24Gi"))}}
    if rng.random() < 0.2:
        spec["nodeSelector"] = rng.choice(
            ({"zone": rng.choice(ZONES)}, {"tier": "gold"}, {"zone": "a", "tier": "silver"})
        )
    if rng.random() < 0.35:
        terms = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            term: dict[str, Any] = {}
            exprs = [_expression(rng) for _ in range(rng.choice((0, 1, 1, 2)))]
            if exprs:
                term["matchExpressions"] = exprs
            if rng.random() < 0.2 or not exprs:
                term["matchFields"] = [
                    {
                        "key": "metadata.name",
                        "operator": rng.choice(("In", "NotIn")),
                        "values": [rng.choice(node_names)],
                    }
                ]
            terms.append(term)
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    if rng.random() < 0.7:
        spec["tolerations"] = [dict(t) for t in rng.sample(TOLERATION_POOL, k=rng.choice((1, 1, 2, 3)))]
    return spec


# --------------------------------------------------------------------------- verdicts


async def _runtime_class(kube: Kube) -> None:
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS},
        "handler": "runc",
        "overhead": {"podFixed": OVERHEAD},
    }
    r = await kube.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", body=body)
    assert r.status in (201, 409), r.body


# --------------------------------------------------------------------------- tests


async def test_seeded_cases_get_kube_schedulers_verdict_on_every_node(
    kube: Kube, namespace: str, kube_scheduler: KubeScheduler
) -> None:
    rng = random.Random(SEED)
    prefix = f"fd{uuid.uuid4().hex[:6]}"
    nodes, residents, leaving = world(rng, prefix)
    names = [n["metadata"]["name"] for n in nodes]
    cases = [(f"c{i:02d}", case(rng, names)) for i in range(CASES)]
    await _runtime_class(kube)
    outcome = await compare(kube, namespace, kube_scheduler, nodes, residents, cases, leaving)
    assert outcome.pairs == CASES * len(nodes)
    feasible = sum(k.fits for k, _ in outcome.verdicts.values())
    # Both answers occur often enough for the comparison to mean something.
    assert 0.15 * outcome.pairs < feasible < 0.85 * outcome.pairs, feasible
    assert not outcome.disagreements, report(outcome, kube_scheduler)


def edge_world(prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes at the edges of each filter, and the pods already bound to them."""
    e = f"{prefix}-e"
    nodes = [
        make_node(f"{e}-plain", cpu="4", memory="8Gi", labels={"zone": "a", "rank": "07"}),
        make_node(f"{e}-nopods", pods=None, labels={"zone": "a"}),
        make_node(f"{e}-ki", cpu="4", memory="4000001Ki", labels={"zone": "b", "rank": "99999999999999999999"}),
        make_node(f"{e}-full", cpu="2", memory="4Gi", pods="2", labels={"zone": "b"}),
        make_node(f"{e}-ports", cpu="4", memory="8Gi"),
        make_node(f"{e}-gpu", gpus=2, product="NVIDIA-L4", labels={"zone": "c"}),
        make_node(f"{e}-gpu0", gpus=0, labels={"nvidia.com/gpu.product": "NVIDIA-L4"}),
        make_node(f"{e}-cordon", unschedulable=True, taints=[("dedicated", "infer", "NoExecute")]),
        make_node(
            f"{e}-taint",
            taints=[
                ("maint", "true", "NoSchedule"),
                ("spot", "", "PreferNoSchedule"),
                ("dedicated", "gpu", "NoExecute"),
            ],
        ),
        make_node(f"{e}-nostorage", storage=None),
    ]
    capacity_only = make_node(f"{e}-capacity-only", cpu="2", labels={"zone": "a"})
    del capacity_only["status"]["allocatable"]  # the API server copies the capacity in
    nodes.append(capacity_only)
    at = {"schedulerName": "elsewhere"}
    residents = [
        make_pod(
            f"{e}-full-r",
            {**at, "nodeName": f"{e}-full", "containers": [container("m", {"cpu": "3", "memory": "6Gi"})]},
        ),
        make_pod(
            f"{e}-ports-r",
            {
                **at,
                "nodeName": f"{e}-ports",
                "containers": [container("m", {"cpu": "100m"}, [PORT_POOL[2]])],
                "initContainers": [
                    container("init", {"cpu": "100m"}, [PORT_POOL[7]]),
                    container("side", {"cpu": "100m"}, [PORT_POOL[5]], sidecar=True),
                ],
            },
        ),
        make_pod(
            f"{e}-ports-leaving",
            {
                **at,
                "nodeName": f"{e}-ports",
                "terminationGracePeriodSeconds": 3600,
                "containers": [container("m", {"cpu": "3"}, [{"containerPort": 7000, "hostPort": 7000}])],
            },
        ),
        make_pod(f"{e}-gpu-r", {**at, "nodeName": f"{e}-gpu", "containers": [container("m", {"nvidia.com/gpu": "1"})]}),
    ]
    return nodes, residents


def _terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def edge_cases(prefix: str) -> list[tuple[str, dict[str, Any]]]:
    zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    small = [container("m", {"cpu": "100m", "memory": "64Mi"})]
    cases: dict[str, dict[str, Any]] = {
        "zero": {"containers": [container("m")]},
        "gpu-only": {"containers": [container("m", {"nvidia.com/gpu": "1"})]},
        "gpu-zero": {"containers": [container("m", {"nvidia.com/gpu": "0", "cpu": "100m"})]},
        "storage": {"containers": [container("m", {"ephemeral-storage": "1Gi"})]},
        "gt-leading-zero": {
            "containers": small,
            "affinity": _terms({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["5"]}]}),
        },
        "gt-too-big": {
            "containers": small,
            "affinity": _terms({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["5"]}]}, zone_a),
        },
        "gt-not-a-number": {
            "containers": small,
            "affinity": _terms({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["x1"]}]}, zone_a),
        },
        "empty-term": {"containers": small, "affinity": _terms({}, zone_a)},
        "fields-not-in": {
            "containers": small,
            "affinity": _terms(
                {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [f"{prefix}-e-plain"]}]}
            ),
        },
        "port-any": {"containers": [container("m", {}, [PORT_POOL[0]])]},
        "port-other-ip": {"containers": [container("m", {}, [PORT_POOL[3]])]},
        "port-init-only": {"containers": [container("m", {}, [PORT_POOL[7]])]},
        "port-sidecar-held": {"containers": [container("m", {}, [PORT_POOL[6]])]},
        "port-as-sidecar": {"containers": small, "initContainers": [container("s", {}, [PORT_POOL[4]], sidecar=True)]},
        "port-leaving": {"containers": [container("m", {}, [{"containerPort": 7000, "hostPort": 7000}])]},
        "host-network": {
            "hostNetwork": True,
            "containers": [container("m", {}, [{"containerPort": 53, "protocol": "UDP"}])],
        },
        "init-max": {"containers": small, "initContainers": [container("i", {"cpu": "5"})]},
        "sidecar-then-init": {
            "containers": [container("m", {"cpu": "1"})],
            "initContainers": [container("s", {"cpu": "2"}, sidecar=True), container("i", {"cpu": "3"})],
        },
        "init-then-sidecar": {
            "containers": [container("m", {"cpu": "1"})],
            "initContainers": [container("i", {"cpu": "3"}), container("s", {"cpu": "2"}, sidecar=True)],
        },
        "pod-level": {"containers": small, "resources": {"requests": {"cpu": "5"}, "limits": {"cpu": "5"}}},
        "overhead": {"containers": [container("m", {"cpu": "3800m"})], "runtimeClassName": RUNTIME_CLASS},
        "ki": {"containers": [container("m", {"memory": "4000001Ki"})]},
        "tolerate-all": {"containers": small, "tolerations": [{"operator": "Exists"}]},
        "tolerate-noschedule-only": {
            "containers": small,
            "tolerations": [
                {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "maint", "operator": "Exists"},
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
            ],
        },
        "tolerate-any-effect": {
            "containers": small,
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "infer"},
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
            ],
        },
        "tolerate-for-a-while": {
            "containers": small,
            "tolerations": [
                {"key": "dedicated", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0},
                {"key": "maint", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            ],
        },
    }
    return list(cases.items())


async def test_edge_cases_get_kube_schedulers_verdict_or_a_documented_difference(
    kube: Kube, namespace: str, kube_scheduler: KubeScheduler
) -> None:
    prefix = f"fd{uuid.uuid4().hex[:6]}"
    nodes, residents = edge_world(prefix)
    await _runtime_class(kube)
    leaving = residents[2]["metadata"]["name"]
    outcome = await compare(kube, namespace, kube_scheduler, nodes, residents, edge_cases(prefix), [leaving])
    ki = f"{prefix}-e-ki"
    # Documented in docs/deploy.md: memory is counted in MiB (a node's allocatable rounded down, a
    # request up), so a pod asking for exactly a Ki-sized allocatable does not fit where
    # kube-scheduler binds it.
    k, g = outcome.verdicts["ki", ki]
    assert (k.fits, g.fits) == (True, False), (k, g)
    rest = {key: said for key, said in outcome.disagreements.items() if key != ("ki", ki)}
    assert outcome.pairs == len(outcome.specs) * len(nodes)
    assert not rest, report(Outcome(outcome.pairs, rest, specs=outcome.specs), kube_scheduler)
