"""Tenants: who a pod's GPUs count against, what each tenant is guaranteed and may hold.

A tenant is the value of one pod label (``Tenants.label``) or, without it, the pod's namespace.
Each tenant has a *quota* (GPUs it is guaranteed: within it, its pods may reclaim GPUs that other
tenants borrowed), a *limit* (GPUs it may never exceed; None: no limit) and a *weight* (its share
of what is left when every tenant is past its quota).  A pod's *demand* is its GPU demand in
thousandths of a GPU: whole GPUs count 1000 each, a share its thousandths, a MIG slice its
compute sevenths.  Pods that ask for no GPU count nothing and are never held back or reclaimed.

The rules, all pure and in this module so that the queue, the daemon and the preemption search
read them alike:

* ``admit``: pods a tenant's limit leaves out (a gang whole or not at all), in queue order;
* ``guaranteed``: of the pods admitted, those within their tenant's quota (counted in order);
* ``order_key``: which tenant's pod a batch draws next (below quota first, then the least used
  for its weight);
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
    """What ``pod`` counts against its tenant, in thousandths of a GPU."""
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
        """The pods of ``pods`` (in the order given: the queue's) that their tenant's limit lets
        in, beside what ``usage`` says each tenant holds; and, by pod key, why each other pod is
        held back.  A gang counts whole: all its members here are admitted or none."""
        taken = dict(usage)
        units: dict[str, list[Pod]] = {}
        for p in pods:
            units.setdefault(f"gang:{p.gang.name}" if p.gang is not None else f"pod:{p.key}", []).append(p)
        admitted: list[Pod] = []
        held: dict[str, str] = {}
        for members in units.values():
            by_tenant: dict[str, int] = defaultdict(int)
            for m in members:
                by_tenant[self.of(m)] += demand_of(m)
            over = [
                (t, d, limit)
                for t, d in by_tenant.items()
                if d and (limit := self.rule(t).limit) is not None and taken.get(t, 0) + d > limit
            ]
            if not over:
                for t, d in by_tenant.items():
                    taken[t] = taken.get(t, 0) + d
                admitted.extend(members)
                continue
            t, d, limit = over[0]
            why = (
                f"tenant {t} is at its GPU limit: it holds {_gpus(taken.get(t, 0))} of {_gpus(limit)} GPUs"
                f" and this {'gang' if members[0].gang is not None else 'pod'} asks for {_gpus(d)} more."
            )
            for m in members:
                held[m.key] = why
        return admitted, held

    def guaranteed(self, pods: Sequence[Pod], usage: Mapping[str, int]) -> set[str]:
        """Keys of the pods of ``pods`` (in order) that fit within their tenant's quota beside
        ``usage``, each counted as taken once found within it; a gang counts whole."""
        taken = dict(usage)
        units: dict[str, list[Pod]] = {}
        for p in pods:
            units.setdefault(f"gang:{p.gang.name}" if p.gang is not None else f"pod:{p.key}", []).append(p)
        out: set[str] = set()
        for members in units.values():
            by_tenant: dict[str, int] = defaultdict(int)
            for m in members:
                by_tenant[self.of(m)] += demand_of(m)
            if not any(by_tenant.values()):
                continue
            if all(taken.get(t, 0) + d <= self.rule(t).quota for t, d in by_tenant.items()):
                for t, d in by_tenant.items():
                    taken[t] = taken.get(t, 0) + d
                out.update(m.key for m in members)
        return out

    def order_key(self, tenant: str, used: int) -> tuple[int, float]:
        """How soon ``tenant``'s next pod is drawn, holding ``used``: tenants below their quota
        first (the least used for their quota first), then the least used for their weight."""
        rule = self.rule(tenant)
        if used < rule.quota:
            return (0, used / rule.quota)
        return (1, used / (rule.weight * GPU_MILLI))

    def borrowed(self, usage: Mapping[str, int]) -> dict[str, int]:
        """Per tenant, how much of its usage is beyond its quota (only tenants with some)."""
        return {t: u - self.rule(t).quota for t, u in usage.items() if u > self.rule(t).quota}


def _gpus(milli: int) -> str:
    """``milli`` thousandths of a GPU in words: ``4``, ``2.5``."""
    return f"{milli / GPU_MILLI:g}"
