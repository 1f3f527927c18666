"""Host ports as kube-scheduler's NodePorts filter reads them.

A pod binds ``PROTOCOL/port`` on every address of the node (``hostIP`` empty or
``0.0.0.0``) or ``PROTOCOL/port@hostIP`` on one.  Two bindings of one protocol
and port clash when either is on every address or both are on the same one;
``TCP/80@10.0.0.1`` and ``TCP/80@10.0.0.2`` share a node.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ANY_ADDRESS", "host_port", "port_cliques", "ports_clash"]

ANY_ADDRESS = "0.0.0.0"


def host_port(protocol: str, port: int, host_ip: str = "") -> str:
    """The key of one binding: ``TCP/80`` on every address, ``TCP/80@10.0.0.1`` on one."""
    base = f"{protocol or 'TCP'}/{port}"
    return base if host_ip in ("", ANY_ADDRESS) else f"{base}@{host_ip}"


def _holds(key: str) -> tuple[str, str]:
    """Tokens a binding occupies: its port, and its address (``*`` for every address)."""
    base, _, ip = key.partition("@")
    return base, f"{base}@{ip or '*'}"


def _probes(key: str) -> tuple[str, ...]:
    """Tokens a new binding must find unoccupied: on every address, any binding of the port; on
    one, a binding on every address or on the same one."""
    base, _, ip = key.partition("@")
    return (f"{base}@*", key) if ip else (base,)


def ports_clash(held: Iterable[str], asked: Iterable[str]) -> bool:
    """Whether a binding of ``asked`` clashes with one of ``held`` (bindings on one node)."""
    occupied = {t for key in held for t in _holds(key)}
    return not occupied.isdisjoint(t for key in asked for t in _probes(key))


def port_cliques(keys: Iterable[str]) -> dict[str, set[str]]:
    """Sets of bindings of which at most one may be on a node, covering every clashing pair: per
    protocol and port, those on every address with those on each one address (and alone)."""
    out: dict[str, set[str]] = {}
    keys = set(keys)
    wide = {k for k in keys if "@" not in k}
    for k in wide:
        out[k] = {k}
    for k in keys - wide:
        base = k.partition("@")[0]
        out[k] = {k, *({base} & wide)}
    return out
