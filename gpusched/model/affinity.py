"""Which nodes a pod's ``nodeSelector`` and required node affinity allow, and which pods its required
pod affinity, anti-affinity and topology spread relate it to, as the API defines them.

A ``NodeSelector`` is a tuple of terms, any of which may match (the affinity's
``nodeSelectorTerms``); a term is a tuple of requirements, all of which must
match (its ``matchExpressions`` and ``matchFields``, with the pod's
``nodeSelector`` labels added to every term).  The empty selector allows every
node.  Operators: ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` and
``Lt`` on labels; ``In`` and ``NotIn`` on the field ``metadata.name``.

A ``PodAffinityTerm`` is one required pod anti-affinity term (no pod it selects,
by label selector and namespace, may share a value of its topology key, a node
label, with the pod that carries it) or affinity term (its pod must share one
with a pod it selects).  A ``Spread`` is one topology spread constraint with
``whenUnsatisfiable: DoNotSchedule``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.model.node import Node

__all__ = [
    "LABEL_OPERATORS",
    "OPERATORS",
    "NodeSelector",
    "PodAffinityTerm",
    "Preference",
    "Requirement",
    "Spread",
    "both",
    "check_label_selector",
    "int64",
    "is_int64",
    "label_selector_selects",
    "preference_score",
    "selects",
]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
"""The operators of a pod label selector's ``matchExpressions``."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label (or ``metadata.name`` field) requirement of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False
    """A ``matchFields`` requirement: ``key`` is ``metadata.name``, matched against the node's name."""

    def __post_init__(self) -> None:
        where = f"requirement on {self.key!r}"
        if not self.key:
            raise ValueError("a requirement without a key")
        if self.operator not in OPERATORS:
            raise ValueError(f"{where}: operator {self.operator!r} is not one of {', '.join(OPERATORS)}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{where}: {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{where}: {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not is_int64(self.values[0])):
            raise ValueError(f"{where}: {self.operator} needs exactly one integer value")
        if self.field and (self.key != "metadata.name" or self.operator not in ("In", "NotIn")):
            raise ValueError(f"{where}: matchFields supports only metadata.name with In or NotIn")

    def matches(self, node: Node) -> bool:
        """Whether ``node`` meets this requirement."""
        return self.holds(node.name if self.field else node.labels.get(self.key))

    def holds(self, value: str | None) -> bool:
        """Whether a label with ``value`` (None: no such label) meets this requirement."""
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        have, bound = int64(value) if value is not None else None, int64(self.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound


NodeSelector = tuple[tuple[Requirement, ...], ...]
"""Terms ORed, requirements within a term ANDed; ``()`` allows every node."""


def selects(selector: NodeSelector, node: Node) -> bool:
    """Whether ``selector`` allows ``node``."""
    return not selector or any(all(r.matches(node) for r in term) for term in selector)


def both(a: NodeSelector, b: NodeSelector) -> NodeSelector:
    """The nodes both ``a`` and ``b`` allow, as one selector: each term of one ANDed with each of
    the other (``()`` allows every node)."""
    if not a:
        return b
    if not b:
        return a
    return tuple(dict.fromkeys(x + tuple(r for r in y if r not in x) for x in a for y in b))


Preference = tuple[tuple[int, tuple[Requirement, ...]], ...]
"""Preferred node affinity: (weight 1..100, a term's requirements, all of which must hold) per term."""


def preference_score(preference: Preference, node: Node) -> int:
    """The sum of the weights of the preferred terms ``node`` meets, as kube-scheduler scores it."""
    return sum(weight for weight, term in preference if all(r.matches(node) for r in term))


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """A required pod (anti-)affinity term: the pods ``selector`` picks in ``namespaces`` (every
    namespace when None), by domain of ``topology_key``.  An anti-affinity term keeps its pod out
    of the domains they run in, an affinity term keeps it in them.  Nodes without the label are no
    domain: an anti-affinity term does not apply to them, an affinity term rules them out."""

    selector: tuple[Requirement, ...]
    """Requirements on the pod's labels, all of which must hold (``()`` selects every pod)."""
    namespaces: frozenset[str] | None
    topology_key: str

    def __post_init__(self) -> None:
        if not self.topology_key:
            raise ValueError("a pod (anti-)affinity term needs a topologyKey")
        _check_label_selector(self.selector)

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod in ``namespace`` with ``labels`` is one this term keeps away."""
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return _label_selects(self.selector, labels)


@dataclass(frozen=True, slots=True)
class Spread:
    """A hard topology spread constraint: the pods ``selector`` picks in ``namespace`` (the pod's
    own) may number at most ``max_skew`` more in a domain of ``topology_key`` than in the
    emptiest one, counted over the nodes the pod could go to (its node selector unless
    ``honor_affinity`` is off; taints too when ``honor_taints``).  With fewer than
    ``min_domains`` such domains the emptiest counts as 0."""

    max_skew: int
    topology_key: str
    selector: tuple[Requirement, ...] | None
    """Requirements on the pods' labels, all of which must hold; None selects no pod."""
    namespace: str
    min_domains: int = 1
    honor_affinity: bool = True
    honor_taints: bool = False

    def __post_init__(self) -> None:
        if self.max_skew < 1:
            raise ValueError(f"maxSkew must be at least 1, got {self.max_skew}")
        if self.min_domains < 1:
            raise ValueError(f"minDomains must be at least 1, got {self.min_domains}")
        if not self.topology_key:
            raise ValueError("a topology spread constraint needs a topologyKey")
        _check_label_selector(self.selector or ())

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod in ``namespace`` with ``labels`` counts toward this constraint."""
        return self.selector is not None and namespace == self.namespace and _label_selects(self.selector, labels)


def _check_label_selector(selector: tuple[Requirement, ...]) -> None:
    for r in selector:
        if r.operator not in LABEL_OPERATORS or r.field:
            raise ValueError(
                f"label selector requirement on {r.key!r}: operator {r.operator!r} "
                f"is not one of {', '.join(LABEL_OPERATORS)}"
            )


def _label_selects(selector: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    return all(r.holds(labels.get(r.key)) for r in selector)


def check_label_selector(selector: tuple[Requirement, ...]) -> None:
    """Raises ``ValueError`` for an operator a label selector does not have."""
    _check_label_selector(selector)


def label_selector_selects(selector: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` and ``matchExpressions`` as requirements, all of
    which must hold) picks an object with ``labels``.  Raises ``ValueError`` for an operator a
    label selector does not have."""
    _check_label_selector(selector)
    return _label_selects(selector, labels)


_INT64 = re.compile(r"[+-]?[0-9]+")


def int64(text: str) -> int | None:
    """``text`` as a base-10 64-bit integer, as kube-scheduler parses ``Gt`` and ``Lt`` values and
    the labels they compare (Go's ``strconv.ParseInt``, which takes any number of leading zeros);
    None when it is not one.  Never ``int()`` of all of it: beyond 4300 digits Python raises
    ``ValueError`` (the API server admits 63 characters, a watch of another source any number)."""
    if _INT64.fullmatch(text) is None:
        return None
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:  # 2^63 has 19 digits
        return None
    value = -int(digits) if text.startswith("-") else int(digits)
    return value if -(2**63) <= value < 2**63 else None


def is_int64(text: str) -> bool:
    """A base-10 64-bit integer, as the API server parses ``Gt`` and ``Lt`` values and labels."""
    return int64(text) is not None
