"""Pods as resource requests: CPU, memory, whole GPUs or one fractional GPU share."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpusched.model.affinity import NodeSelector, PodAffinityTerm, Preference, Spread, int64
from gpusched.model.mig import gpu_fraction
from gpusched.model.node import GPU_MILLI, Taint

__all__ = [
    "ISLAND_MODES",
    "TOLERATION_OPERATORS",
    "Gang",
    "Pod",
    "PodShape",
    "Toleration",
    "gang_conflicts",
    "mig_milli",
]

ISLAND_MODES = ("", "required", "preferred")
"""How a multi-GPU pod asks for its GPUs within one island: not at all, as a must, as a wish."""


def model_key(name: str) -> str:
    """A GPU model name as accepted models are compared: upper case, without the maker's prefix
    (``NVIDIA-``, ``Tesla-``): ``A100-SXM4-80GB`` names ``NVIDIA-A100-SXM4-80GB``.  Unlike
    ``product_key`` it keeps a ``-MIG-<profile>`` suffix: a GPU in single-strategy MIG mode is
    not the whole GPU a pod accepting its product asks for."""
    return name.strip().upper().removeprefix("NVIDIA-").removeprefix("TESLA-")


def mig_milli(profile: str) -> int:
    """GPU demand of one MIG instance in thousandths of a GPU: its part of its GPU's compute
    slices (``gpu_fraction``: sevenths, fourths on the A30), rounded down, so that the slices
    of one GPU never count more than that GPU; as tenants and the cost report count it."""
    head = profile.split("g.", 1)[0]
    if not head.isdecimal() or "g." not in profile:
        raise ValueError(f"MIG profile {profile!r} is not of the form <compute>g.<memory>gb, e.g. 1g.10gb")
    return int(GPU_MILLI * gpu_fraction(profile))


@dataclass(frozen=True, slots=True)
class Gang:
    """A pod group placed at least ``min_members`` together, or not at all.

    ``min_members`` is how many members must be present, and placed together, before any is
    placed; members beyond it are placed with them as they fit, and those left over later,
    one by one, beside the members running;
    ``topology_key`` names a node label (rack, zone, ``nvidia.com/gpu.clique``)
    whose values are domains, and ``topology`` says whether all members must
    share one domain (``required``) or should use as few as possible
    (``preferred``).
    """

    name: str
    min_members: int = 1
    topology_key: str = ""
    topology: str = ""
    domain: str = ""
    """The domain the gang is held to (where members already run); empty: any."""
    running: int = 0
    """Members already running, which ``min_members`` counts in (it is what is left to place)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a gang needs a name")
        if self.min_members < 1:
            raise ValueError(f"gang {self.name}: min_members must be at least 1, got {self.min_members}")
        if self.topology not in ("", "required", "preferred"):
            raise ValueError(f"gang {self.name}: topology must be 'required' or 'preferred', got {self.topology!r}")
        if bool(self.topology) != bool(self.topology_key):
            raise ValueError(f"gang {self.name}: give both a topology key and a topology mode, or neither")

    def beside(self, count: int, domain: str = "") -> Gang:
        """The gang as left to place once ``count`` more of its members run: its minimum less
        those (at least 1: a member is placed on its own beside them), held to ``domain`` (the
        value of its topology label where one of them runs) unless held to one already."""
        if count <= 0:
            return self
        return replace(
            self,
            min_members=max(1, self.min_members - count),
            domain=self.domain or domain,
            running=self.running + count,
        )

    @property
    def rules(self) -> tuple[int, str, str]:
        """What every member must give alike: the minimum, the topology key and its mode."""
        return (self.min_members, self.topology_key, self.topology)

    def describe(self) -> str:
        """The rules in words: ``at least 3 members, required one rack``."""
        where = f", {self.topology} one {self.topology_key}" if self.topology_key else ", no topology"
        return f"at least {self.min_members} members{where}"


TOLERATION_OPERATORS = ("Equal", "Exists", "Lt", "Gt")
"""The operators a toleration may use; one with another tolerates no taint."""


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration, matched as the API defines it: ``Exists`` with an empty key tolerates
    every taint; an empty effect matches every effect; ``Gt`` and ``Lt`` compare the taint's value
    with the toleration's as integers; any other operator tolerates nothing."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration lets a pod onto a node with ``taint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        if self.key != taint.key:
            return False
        if self.operator == "Equal":
            return self.value == taint.value
        if self.operator in ("Gt", "Lt"):  # taint value > (or <) the toleration's; both whole numbers
            mine, theirs = int64(self.value), int64(taint.value)
            if mine is None or theirs is None:
                return False
            return theirs > mine if self.operator == "Gt" else theirs < mine
        return False


def untolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> list[Taint]:
    """The taints none of ``tolerations`` tolerates, in the node's order."""
    return [taint for taint in taints if not any(t.tolerates(taint) for t in tolerations)]


def tolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> bool:
    """Whether every taint is tolerated by one of ``tolerations``."""
    return not untolerated(tolerations, taints)


class _Wishes:
    """What a pod and its shape read the same way: GPU demand and preferred node and pod affinity."""

    __slots__ = ()
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str]
    mig_profile: str
    preferred_nodes: Preference
    preferred_apart: tuple[tuple[int, PodAffinityTerm], ...]
    preferred_together: tuple[tuple[int, PodAffinityTerm], ...]

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU demand in thousandths of a GPU (a MIG slice counts its compute share)."""
        if self.mig_profile:
            return mig_milli(self.mig_profile)
        return self.num_gpu * self.gpu_milli

    @property
    def is_fractional(self) -> bool:
        """True when the pod takes a share of exactly one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    def accepts(self, gpu_model: str) -> bool:
        """Whether a node with GPUs of ``gpu_model`` satisfies the model constraint."""
        if not self.gpu_models or gpu_model in self.gpu_models:
            return True
        key = model_key(gpu_model)
        return any(model_key(m) == key for m in self.gpu_models)

    @property
    def pod_wishes(self) -> tuple[tuple[int, PodAffinityTerm], ...]:
        """(Weight, term) per preferred pod term: positive keeps apart, negative draws together."""
        return (*self.preferred_apart, *((-w, t) for w, t in self.preferred_together))

    @property
    def has_preferences(self) -> bool:
        """Whether it has preferred node or pod affinity of any kind."""
        return bool(self.preferred_nodes or self.preferred_apart or self.preferred_together)


@dataclass(frozen=True, slots=True)
class PodShape(_Wishes):
    """The part of a pod that placement depends on; pods of one shape are interchangeable."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str]
    mig_profile: str = ""
    island: str = ""
    tolerations: tuple[Toleration, ...] = ()
    node_selector: NodeSelector = ()
    storage_mib: int = 0
    host_ports: frozenset[str] = frozenset()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[Spread, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_nodes: Preference = ()
    preferred_apart: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_together: tuple[tuple[int, PodAffinityTerm], ...] = ()
    volume_selector: NodeSelector = ()
    provision_selector: NodeSelector = ()
    attach_selector: NodeSelector = ()


@dataclass(frozen=True, slots=True)
class Pod(_Wishes):
    """A pod to place.

    ``gpu_milli`` is per GPU: a fractional pod (``num_gpu == 1`` and
    ``gpu_milli < 1000``) shares one GPU with others and never spans GPUs; a
    multi-GPU pod always takes whole GPUs.  ``gpu_models`` empty means any model.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()
    priority: int = 0
    namespace: str = "default"
    uid: str = ""
    mig_profile: str = ""
    """One MIG instance of this profile (``1g.10gb``) instead of GPUs."""
    island: str = ""
    """``required`` or ``preferred``: all GPUs of the pod within one island of its node."""
    gang: Gang | None = None
    tolerations: tuple[Toleration, ...] = ()
    """Taints of nodes it may go to (a node's taints must all be tolerated)."""
    node_selector: NodeSelector = ()
    """Nodes it may go to by their labels (``nodeSelector`` and required node affinity)."""
    storage_mib: int = 0
    """Ephemeral storage request, MiB."""
    host_ports: frozenset[str] = frozenset()
    """Host ports it binds, as ``PROTOCOL/port`` on every address (``TCP/29500``) or
    ``PROTOCOL/port@hostIP`` on one: no two pods on a node may hold clashing ones (``model.ports``)."""
    labels: tuple[tuple[str, str], ...] = ()
    """The pod's labels, sorted by key (what pod anti-affinity terms select on)."""
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    """Required pod anti-affinity: pods it must not share a topology domain with."""
    spread: tuple[Spread, ...] = ()
    """Topology spread constraints it must not break (``whenUnsatisfiable: DoNotSchedule``)."""
    affinity: tuple[PodAffinityTerm, ...] = ()
    """Required pod affinity: for each term, a pod it selects must run in the domain it goes to."""
    terminating: bool = False
    """Being deleted: it still holds what it asked for, but spread constraints no longer count it."""
    preferred_nodes: Preference = ()
    """Preferred node affinity: weighed by the solver, never required."""
    preferred_apart: tuple[tuple[int, PodAffinityTerm], ...] = ()
    """Preferred pod anti-affinity, (weight 1..100, term): weighed, never required."""
    preferred_together: tuple[tuple[int, PodAffinityTerm], ...] = ()
    """Preferred pod affinity, (weight 1..100, term): weighed, never required."""
    soft_spread: tuple[PodAffinityTerm, ...] = ()
    """Terms of ``preferred_apart`` that stand for ``ScheduleAnyway`` spread constraints: they
    weigh this pod's own placement only (kube-scheduler's PodTopologySpread scores the incoming
    pod's constraints, not those of the pods running)."""
    preempts: bool = True
    """It may evict running pods of lower priority to make room (``preemptionPolicy`` is not
    ``Never``)."""
    preempted: bool = False
    """A scheduler preempted it (its ``DisruptionTarget`` condition says
    ``PreemptionByScheduler``): once it is being deleted, its room is some pending pod's."""
    movable: bool = False
    """It may be evicted to consolidate GPU work onto fewer nodes: it asks to be (annotation
    ``gpusched.io/consolidate: "true"``), a controller creates it again (an owner reference
    with ``controller: true``), this scheduler places it, and it has no soft preferences (they
    might draw its replacement back to where it was)."""
    owner: str = ""
    """The UID of the controller that owns it (empty: none)."""
    daemon: bool = False
    """It runs on its node whatever runs beside it: a DaemonSet's pod or a static pod.  It does
    not keep consolidation from emptying the node of GPU work, and is never moved."""
    started: float = math.inf
    """When it started running (``status.startTime``, seconds since the epoch); not yet: ``inf``.
    Among victims of equal priority, preemption evicts the ones that started last, as
    kube-scheduler does (the least work lost)."""
    mig_held: tuple[tuple[str, int], ...] = ()
    """Every MIG slice it holds, (profile, count) by profile, when that is more than the one
    ``mig_profile`` names: several slices, or slices beside GPUs.  This scheduler places no such
    pod, but one another scheduler bound holds them all.  Empty: ``mig_profile``'s slice, if any."""
    claims: tuple[str, ...] = ()
    """Names of the PersistentVolumeClaims it mounts, in its namespace: one whose access mode is
    ``ReadWriteOncePod`` no other pod may use while this one is on the books (``state.volumes``)."""
    volume_selector: NodeSelector = ()
    """Nodes the PersistentVolumes its claims are bound to may be used on (their required node
    affinity: a local volume's node, a zonal disk's zone), as ``node_selector`` reads terms;
    ``()``: every node.  Set from the volumes when a batch is solved (``Claims.selector``): the
    pod as read from the API server has none."""
    provision_selector: NodeSelector = ()
    """Nodes the claims it mounts that are still to be provisioned may be provisioned for (their
    storage class's ``allowedTopologies``, or the node one is being provisioned for already),
    likewise; set when a batch is solved (``Claims.provision_selector``)."""
    attach_selector: NodeSelector = ()
    """Nodes where its CSI volumes can still be attached (the others would pass a driver's
    limit, kube-scheduler's NodeVolumeLimits); set when a batch is solved."""

    def __post_init__(self) -> None:
        where = f"pod {self.key}"
        if any(not term for term in self.node_selector):
            raise ValueError(f"{where}: a node selector term without requirements matches no node; leave it out")
        if any(not term for term in self.volume_selector + self.provision_selector + self.attach_selector):
            raise ValueError(f"{where}: a volume's node selector term without requirements matches no node")
        if self.island not in ISLAND_MODES:
            raise ValueError(f"{where}: island must be 'required' or 'preferred', got {self.island!r}")
        if self.mig_profile:
            mig_milli(self.mig_profile)
            if self.num_gpu:
                raise ValueError(f"{where}: a pod takes whole GPUs, a GPU share or one MIG slice, not GPUs and a slice")
        if self.mig_held:
            for profile, count in self.mig_held:
                mig_milli(profile)
                if count < 1:
                    raise ValueError(f"{where}: holds {count} MIG {profile} slices; leave out profiles it lacks")
            if self.mig_profile and self.mig_profile not in dict(self.mig_held):
                raise ValueError(f"{where}: holds no MIG {self.mig_profile} slice, yet asks for one")
            object.__setattr__(self, "mig_held", tuple(sorted(dict(self.mig_held).items())))
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.storage_mib < 0:
            raise ValueError(f"{where}: CPU, memory and storage requests must not be negative")
        if self.num_gpu < 0:
            raise ValueError(f"{where}: num_gpu must not be negative, got {self.num_gpu}")
        if self.num_gpu == 0:
            if self.gpu_milli not in (0, GPU_MILLI):
                raise ValueError(f"{where}: gpu_milli={self.gpu_milli} without a GPU (num_gpu=0)")
            object.__setattr__(self, "gpu_milli", 0)
        else:
            if not 0 < self.gpu_milli <= GPU_MILLI:
                raise ValueError(f"{where}: gpu_milli must be in 1..{GPU_MILLI} per GPU, got {self.gpu_milli}")
            if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
                raise ValueError(
                    f"{where}: a pod with {self.num_gpu} GPUs must take whole GPUs "
                    f"(gpu_milli={GPU_MILLI}), got {self.gpu_milli}"
                )
        if not isinstance(self.gpu_models, frozenset):
            object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))
        if not isinstance(self.host_ports, frozenset):
            object.__setattr__(self, "host_ports", frozenset(self.host_ports))
        if list(self.labels) != sorted(dict(self.labels).items()):
            object.__setattr__(self, "labels", tuple(sorted(dict(self.labels).items())))

    @property
    def mig_slices(self) -> tuple[tuple[str, int], ...]:
        """Every MIG slice it holds, (profile, count) by profile: what a node's books charge."""
        if self.mig_held:
            return self.mig_held
        return ((self.mig_profile, 1),) if self.mig_profile else ()

    @property
    def gpu_demand_milli(self) -> int:
        """Total GPU demand in thousandths of a GPU (a MIG slice counts its compute share)."""
        if not self.mig_held:  # every pod this scheduler places: as its shape counts it
            return mig_milli(self.mig_profile) if self.mig_profile else self.num_gpu * self.gpu_milli
        return self.num_gpu * self.gpu_milli + sum(mig_milli(p) * n for p, n in self.mig_held)

    @property
    def held_wishes(self) -> tuple[tuple[int, PodAffinityTerm], ...]:
        """``pod_wishes`` that weigh the pods placed after it too: all but ``soft_spread``."""
        if not self.soft_spread:
            return self.pod_wishes
        return tuple((w, t) for w, t in self.pod_wishes if w < 0 or t not in self.soft_spread)

    @property
    def key(self) -> str:
        """``namespace/name``, unique in a cluster."""
        return f"{self.namespace}/{self.name}"

    @property
    def shape(self) -> PodShape:
        """The resource shape that placement depends on."""
        island = self.island if self.num_gpu > 1 else ""
        return PodShape(
            self.cpu_milli,
            self.memory_mib,
            self.num_gpu,
            self.gpu_milli,
            self.gpu_models,
            self.mig_profile,
            island,
            self.tolerations,
            self.node_selector,
            self.storage_mib,
            self.host_ports,
            self.anti_affinity,
            self.spread,
            self.affinity,
            self.preferred_nodes,
            self.preferred_apart,
            self.preferred_together,
            self.volume_selector,
            self.provision_selector,
            self.attach_selector,
        )

    @property
    def unit(self) -> str:
        """What is placed, and preempted for, as one: the pod's key, or its gang's name."""
        return self.key if self.gang is None else f"gang:{self.gang.name}"

    @property
    def has_affinity_identity(self) -> bool:
        """Whether pod anti-affinity may concern it: it has labels or terms, or it is a pod of the
        API (it has a UID), which a selector with only ``NotIn`` or ``DoesNotExist``, or none at all,
        selects without labels; or it has preferred pod terms that may concern others.  Trace pods
        of the simulator have none of these."""
        return bool(self.labels or self.anti_affinity or self.uid or self.preferred_apart or self.preferred_together)

    def selected_by(self, term: PodAffinityTerm | Spread) -> bool:
        """Whether ``term`` keeps this pod away, or counts it."""
        return term.selects(self.namespace, dict(self.labels))

    def matches_all(self, terms: tuple[PodAffinityTerm, ...]) -> bool:
        """Whether every one of ``terms`` selects this pod (what pod affinity asks of a pod to follow)."""
        labels = dict(self.labels)
        return all(t.selects(self.namespace, labels) for t in terms)


def gang_conflicts(pods: Iterable[Pod]) -> dict[str, tuple[Pod, Pod]]:
    """Gangs whose members give different rules (minimum, topology key or mode), by name, with
    the first member and the first that disagrees with it: a gang has one set of rules."""
    first: dict[str, Pod] = {}
    found: dict[str, tuple[Pod, Pod]] = {}
    for p in pods:
        g = p.gang
        if g is None or g.name in found:
            continue
        f = first.setdefault(g.name, p)
        if f.gang is not None and f.gang.rules != g.rules:
            found[g.name] = (f, p)
    return found
