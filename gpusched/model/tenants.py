"""Tenants: who a pod's GPUs count against, what each tenant is guaranteed and may hold.

A tenant is the value of one pod label (``Tenants.label``) or, without it, the pod's namespace.
Each tenant has a *quota* (GPUs it is guaranteed: within it, its pods may reclaim GPUs that other
tenants borrowed), a *limit* (GPUs it may never exceed; None: no limit) and a *weight* (its share
of what is left when every tenant is past its quota).  A pod's *demand* is its GPU demand in
thousandths of a GPU: whole GPUs count 1000 each, a share its thousandths, a MIG slice its
compute sevenths (fourths on the A30).  Pods that ask for no GPU count nothing and are never
held back or reclaimed.

The rules, all pure and in this module so that the queue, the daemon and the preemption search
read them alike:

* ``admit``: pods a tenant's limit leaves out as things are (a gang by its minimum: all its
  members admitted or none);
* ``trim``: of the pods a batch placed, those that together would take a tenant past its limit
  (a gang's members beyond its minimum first);
* ``guaranteed``: of the pods admitted, those within their tenant's quota (counted in order; a
  gang by its minimum, its members beyond it after every other pod, each only if it fits);
* ``order_key``: which tenant's pod a batch draws next (below quota first, then the least used
  for its weight, and last a tenant whose next pod its limit holds back);
* ``borrowed``: how much of each tenant's usage is beyond its quota, and so may be reclaimed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpusched.model.node import GPU_MILLI
from gpusched.model.pod import Pod

__all__ = ["TenantRule", "Tenants", "demand_of"]


def demand_of(pod: Pod) -> int:
    """What ``pod`` counts against its tenant, in thousandths of a GPU: its GPU demand as the
    autoscaling gauge counts it (``Pod.gpu_demand_milli``: a MIG instance by its compute
    slices, rounded down, so that the seven sevenths of one GPU count no more than that GPU;
    every slice a pod another scheduler bound holds, beside any GPUs)."""
    return pod.gpu_demand_milli


@dataclass(frozen=True, slots=True)
class TenantRule:
    """One tenant's numbers, in thousandths of a GPU."""

    quota: int = 0
    limit: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.quota < 0:
            raise ValueError(f"a quota cannot be negative, got {self.quota}")
        if self.limit is not None and self.limit < self.quota:
            raise ValueError(f"a limit ({self.limit}) below the quota ({self.quota}) could never be reached")
        if not self.weight > 0:
            raise ValueError(f"a weight must be positive, got {self.weight}")


@dataclass(frozen=True)
class Tenants:
    """The tenants' rules; ``active`` is False when nothing is configured (then no rule applies)."""

    label: str = ""
    """The pod label naming a pod's tenant; empty (or absent on a pod): its namespace."""
    rules: Mapping[str, TenantRule] = field(default_factory=dict)
    default: TenantRule = TenantRule()
    """The rule of every tenant ``rules`` does not name."""
    reclaim: bool = True
    reclaim_below: int = 1_000_000
    """Pods of this priority or more are never reclaimed."""

    @property
    def active(self) -> bool:
        """Whether any rule is configured."""
        return bool(self.rules) or self.default != TenantRule() or bool(self.label)

    def of(self, pod: Pod) -> str:
        """The tenant ``pod`` counts against."""
        if self.label:
            value = dict(pod.labels).get(self.label)
            if value:
                return value
        return pod.namespace

    def rule(self, tenant: str) -> TenantRule:
        """``tenant``'s rule."""
        return self.rules.get(tenant, self.default)

    def usage(self, pods: Iterable[Pod]) -> dict[str, int]:
        """GPU demand held per tenant by ``pods``."""
        out: dict[str, int] = defaultdict(int)
        for p in pods:
            d = demand_of(p)
            if d:
                out[self.of(p)] += d
        return dict(out)

    def admit(self, pods: Sequence[Pod], usage: Mapping[str, int]) -> tuple[list[Pod], dict[str, str]]:
        """The pods of ``pods`` that their tenant's limit lets in beside what ``usage`` says each
        tenant holds, each on its own (pods of one batch that together pass a limit are ``trim``'s
        to find, among those a solve places); and, by pod key, why each other pod is held back.
        A gang is judged by its minimum (``Gang.min_members``, less its members running when
        ``pods`` count them: ``Gang.beside``), its cheapest members: when they pass no limit,
        all its members here are admitted (those beyond its minimum are ``trim``'s to keep
        within the limit), else none."""
        admitted: list[Pod] = []
        held: dict[str, str] = {}
        for members in _units(pods):
            core, _ = _minimum(members)
            over = self._over(core, usage)
            if over is None:
                admitted.extend(members)
                continue
            t, d, limit = over
            unit = _unit_words(members, len(core))
            if d > limit:  # no GPU its tenant frees would let it in: only a higher limit would
                why = (
                    f"{unit} asks for {_gpus(d)} GPUs, more than tenant {t}'s GPU limit of {_gpus(limit)}:"
                    " it cannot be placed while that limit stands."
                )
            else:
                why = (
                    f"tenant {t} is at its GPU limit: it holds {_gpus(usage.get(t, 0))} of {_gpus(limit)} GPUs"
                    f" and {unit} asks for {_gpus(d)} more."
                )
            for m in members:
                held[m.key] = why
        return admitted, held

    def trim(self, pods: Sequence[Pod], usage: Mapping[str, int]) -> set[str]:
        """Keys of the pods of ``pods`` (placed by one batch, in queue order) that, counted in
        order beside ``usage``, would take their tenant past its limit.  A gang counts by its
        minimum, its cheapest members (as ``admit`` judges it): when those pass the limit, all
        its members here are left out; else the rest, the members beyond its minimum, are
        counted after every pod and minimum of ``pods``, cheapest first, and each left out
        that would pass the limit then."""
        taken = dict(usage)
        out: set[str] = set()
        extras: list[Pod] = []
        for members in _units(pods):
            core, rest = _minimum(members)
            if self._over(core, taken) is not None:
                out.update(m.key for m in members)
                continue
            self._take(core, taken)
            extras.extend(rest)
        for m in extras:
            if self._over([m], taken) is not None:
                out.add(m.key)
            else:
                self._take([m], taken)
        return out

    def _take(self, pods: Iterable[Pod], taken: dict[str, int]) -> None:
        """Count ``pods`` in ``taken``, what each tenant holds."""
        for m in pods:
            taken[self.of(m)] = taken.get(self.of(m), 0) + demand_of(m)

    def allowance(self, usage: Mapping[str, int], tenants: Iterable[str]) -> dict[str, int]:
        """What each of ``tenants`` that has a limit may still take beside ``usage``."""
        return {t: limit - usage.get(t, 0) for t in set(tenants) if (limit := self.rule(t).limit) is not None}

    def _over(self, members: Sequence[Pod], usage: Mapping[str, int]) -> tuple[str, int, int] | None:
        """The first tenant whose limit ``members`` together pass beside ``usage``: (tenant,
        their demand, its limit); None when they pass none."""
        for t, d in self.usage(members).items():
            limit = self.rule(t).limit
            if limit is not None and usage.get(t, 0) + d > limit:
                return t, d, limit
        return None

    def guaranteed(self, pods: Sequence[Pod], usage: Mapping[str, int]) -> set[str]:
        """Keys of the pods of ``pods`` (in order) that fit within their tenant's quota beside
        ``usage``, each counted as taken once found within it.  A gang counts by its minimum,
        its cheapest members (as ``admit`` judges it): those are within it together or not at
        all; its members beyond its minimum are counted after every pod and minimum of
        ``pods``, cheapest first, and each is within the quota only if it fits then."""
        taken = dict(usage)
        out: set[str] = set()
        extras: list[Pod] = []
        for members in _units(pods):
            core, rest = _minimum(members)
            # A gang's minimum that asks for no GPU (a launcher) takes none of the quota: within it.
            if self._within(core, taken) or (members[0].gang is not None and not any(map(demand_of, core))):
                self._take(core, taken)
                out.update(m.key for m in core)
                extras.extend(rest)
        for m in extras:
            if self._within([m], taken):
                self._take([m], taken)
                out.add(m.key)
        return out

    def _within(self, pods: Sequence[Pod], usage: Mapping[str, int]) -> bool:
        """Whether ``pods`` together ask for a GPU and stay within their tenants' quotas beside
        ``usage``."""
        by_tenant = self.usage(pods)
        return bool(by_tenant) and all(usage.get(t, 0) + d <= self.rule(t).quota for t, d in by_tenant.items())

    def order_key(self, tenant: str, used: int, next_demand: int = 0) -> tuple[int, float]:
        """How soon ``tenant``'s next pod (of ``next_demand``) is drawn, holding ``used``: tenants
        below their quota first (the least used for their quota first), then the least used for
        their weight, and last a tenant whose limit holds that pod back."""
        rule = self.rule(tenant)
        if rule.limit is not None and next_demand and used + next_demand > rule.limit:
            return (2, used / (rule.weight * GPU_MILLI))
        if used < rule.quota:
            return (0, used / rule.quota)
        return (1, used / (rule.weight * GPU_MILLI))

    def slots(self, tenant: str) -> int:
        """Pods (or gangs) ``tenant`` draws in each round of a batch: one, or its weight's
        whole part for a weight of 2 or more."""
        return max(1, int(self.rule(tenant).weight))

    def borrowed(self, usage: Mapping[str, int]) -> dict[str, int]:
        """Per tenant, how much of its usage is beyond its quota (only tenants with some)."""
        return {t: u - self.rule(t).quota for t, u in usage.items() if u > self.rule(t).quota}


def _units(pods: Iterable[Pod]) -> list[list[Pod]]:
    """``pods`` in placement units, in order: a pod alone, or every member of its gang."""
    units: dict[str, list[Pod]] = {}
    for p in pods:
        units.setdefault(p.unit, []).append(p)
    return list(units.values())


def _minimum(members: Sequence[Pod]) -> tuple[list[Pod], list[Pod]]:
    """A placement unit (``_units``) split into what must be placed for any of it to be, and
    the rest: a pod alone and nothing; or the cheapest ``min_members`` of a gang's members
    (its minimum, least GPU demand first, in order among equals) and its other members, in the
    same order."""
    gang = members[0].gang
    if gang is None or len(members) <= gang.min_members:
        return list(members), []
    ranked = sorted(members, key=demand_of)
    return ranked[: gang.min_members], ranked[gang.min_members :]


def _unit_words(members: Sequence[Pod], minimum: int) -> str:
    """How a message names a unit held back: ``this pod``, ``this gang``, or its minimum."""
    gang = members[0].gang
    if gang is None:
        return "this pod"
    pending = "pending members" if gang.running else "members"
    if minimum < len(members):
        return f"this gang's minimum ({minimum} of its {len(members)} {pending})"
    if gang.running:
        return f"this gang's {len(members)} pending members" if len(members) > 1 else "this gang's pending member"
    return "this gang"


def _gpus(milli: int) -> str:
    """``milli`` thousandths of a GPU in words: ``4``, ``2.5``."""
    return f"{milli / GPU_MILLI:g}"
