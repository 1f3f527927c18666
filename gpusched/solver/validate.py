"""Independent checks of a plan, shared by tests and the binder.

Nothing here trusts the policy that made the plan: capacities are recomputed
from the state and the assignments alone, and pod affinity, anti-affinity and
topology spread are read from the rules over the nodes' labels and the pods on
them, not through the ``ClusterState`` masks the policies prune with.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from gpusched.model import GPU_MILLI, Assignment, ClusterState, Node, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Spread, selects
from gpusched.model.pod import Gang, gang_conflicts, tolerated
from gpusched.model.ports import ports_clash

__all__ = ["PlanError", "island_problems", "plan_problems", "validate_plan"]


class PlanError(ValueError):
    """A plan that must not be written to the cluster."""


def plan_problems(plan: Plan, state: ClusterState, pods: Sequence[Pod] | None = None) -> list[str]:
    """Every reason ``plan`` is invalid against ``state`` (empty when valid)."""
    problems: list[str] = []
    cluster = state.cluster
    seen: set[str] = set()
    for p in [a.pod for a in plan.assignments] + list(plan.unplaced):
        if p.key in seen:
            problems.append(f"pod {p.key} appears more than once in the plan")
        seen.add(p.key)
    if pods is not None:
        expected = {p.key for p in pods}
        for k in sorted(expected - seen):
            problems.append(f"pod {k} is missing from the plan")
        for k in sorted(seen - expected):
            problems.append(f"pod {k} is in the plan but not in the batch")
    cpu: dict[int, int] = defaultdict(int)
    mem: dict[int, int] = defaultdict(int)
    storage: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    ports: dict[int, list[frozenset[str]]] = defaultdict(list)
    gpu: dict[tuple[int, int], int] = defaultdict(int)
    whole: set[tuple[int, int]] = set()
    for a in plan.assignments:
        p = a.pod
        if not 0 <= a.node < len(cluster):
            problems.append(f"pod {p.key}: node index {a.node} is not in the cluster")
            continue
        node = cluster.nodes[a.node]
        cpu[a.node] += p.cpu_milli
        mem[a.node] += p.memory_mib
        storage[a.node] += p.storage_mib
        count[a.node] += 1
        if p.host_ports:
            ports[a.node].append(p.host_ports)
        if len(a.gpus) != p.num_gpu:
            problems.append(f"pod {p.key}: asked for {p.num_gpu} GPUs, got indices {list(a.gpus)}")
        if len(set(a.gpus)) != len(a.gpus):
            problems.append(f"pod {p.key}: GPU index repeated in {list(a.gpus)}")
        if (p.num_gpu or p.mig_profile) and not p.shape.accepts(node.gpu_model):
            problems.append(f"pod {p.key}: GPU model {node.gpu_model!r} on {node.name} is not accepted")
        if node.taints and not tolerated(p.tolerations, node.taints):
            problems.append(f"pod {p.key}: does not tolerate the taints of {node.name}")
        if p.node_selector and not selects(p.node_selector, node):
            problems.append(f"pod {p.key}: its node selector or affinity does not allow {node.name}")
        if p.volume_selector and not selects(p.volume_selector, node):
            problems.append(f"pod {p.key}: a volume it mounts cannot be used on {node.name}")
        if p.attach_selector and not selects(p.attach_selector, node):
            problems.append(f"pod {p.key}: its CSI volumes would pass an attach limit on {node.name}")
        if p.provision_selector and not selects(p.provision_selector, node):
            problems.append(f"pod {p.key}: a volume it mounts cannot be provisioned for {node.name}")
        for g in a.gpus:
            if not 0 <= g < node.gpu_count:
                problems.append(f"pod {p.key}: {node.name} has no GPU {g}")
                continue
            gpu[(a.node, g)] += p.gpu_milli
            if not p.is_fractional:
                if (a.node, g) in whole:
                    problems.append(f"pod {p.key}: GPU {g} on {node.name} is already taken whole")
                whole.add((a.node, g))
                if state.gpu_used[a.node, g] != 0:
                    problems.append(f"pod {p.key}: GPU {g} on {node.name} is not idle")
    problems.extend(_mig_problems(plan, state, {(a.node, g) for a in plan.assignments for g in a.gpus}))
    problems.extend(island_problems(plan.assignments, state))
    problems.extend(peer_problems(plan.assignments, state))
    problems.extend(_gang_problems(plan, state, pods))
    for n, c in cpu.items():
        if c > state.cpu_free[n]:
            problems.append(f"{cluster.nodes[n].name}: CPU over-committed ({c}m > {state.cpu_free[n]}m free)")
    for n, m in mem.items():
        if m > state.mem_free[n]:
            problems.append(f"{cluster.nodes[n].name}: memory over-committed ({m}Mi > {state.mem_free[n]}Mi)")
    for n, bound in ports.items():  # each pod's bindings against the node's and the other pods'
        taken = state.ports_used.get(n, frozenset())
        clash = sorted(
            {
                x
                for i, mine in enumerate(bound)
                for x in mine
                if ports_clash([*taken, *(k for j, theirs in enumerate(bound) if j != i for k in theirs)], (x,))
            }
        )
        if clash:
            problems.append(f"{cluster.nodes[n].name}: host port {', '.join(clash)} bound twice")
    for n, s in storage.items():
        if s and s > state.storage_free[n]:  # pods asking for none may go where others over-filled it
            problems.append(
                f"{cluster.nodes[n].name}: ephemeral storage over-committed ({s}Mi > {state.storage_free[n]}Mi)"
            )
    if cluster.pods_metered:
        for n, c in count.items():
            if c > state.pods_free[n]:
                problems.append(f"{cluster.nodes[n].name}: too many pods ({c} placed, room for {state.pods_free[n]})")
    for (n, g), used in gpu.items():
        if g < cluster.nodes[n].gpu_count and used > state.gpu_free[n, g]:
            problems.append(
                f"{cluster.nodes[n].name}: GPU {g} over-committed ({used} > {state.gpu_free[n, g]} of {GPU_MILLI} free)"
            )
    return problems


def _mig_problems(plan: Plan, state: ClusterState, used_gpus: set[tuple[int, int]]) -> list[str]:
    """Partitions only on idle re-partitionable GPUs, in valid layouts, never used otherwise, each
    for pods of the plan; MIG pods within the instances free plus those partitioned."""
    problems: list[str] = []
    cluster = state.cluster
    free: dict[tuple[int, str], int] = {}
    seen: set[tuple[int, int]] = set()
    for n, g, layout in plan.partitions:
        node = cluster.nodes[n] if 0 <= n < len(cluster) else None
        geom = cluster.geometry[n] if node is not None else None
        if node is None or geom is None:
            problems.append(f"MIG layout on node index {n}, which may not be re-partitioned")
            continue
        if not 0 <= g < node.gpu_count or state.gpu_used[n, g] != 0:
            problems.append(f"{node.name}: GPU {g} is not an idle GPU to partition")
        elif not state.partitionable_gpus[n]:
            problems.append(f"{node.name}: GPU {g} may not be partitioned while other GPUs of the node are in use")
        if (n, g) in seen or (n, g) in used_gpus:
            problems.append(f"{node.name}: GPU {g} is partitioned twice or also used whole/shared")
        seen.add((n, g))
        if not geom.valid(layout.placements):
            problems.append(f"{node.name}: GPU {g} layout {dict(layout.counts)} is not a valid {geom.model} layout")
        for p, c in layout.counts.items():
            free[n, p] = free.get((n, p), 0) + c
    used: dict[tuple[int, str], int] = defaultdict(int)
    for a in plan.assignments:
        if a.pod.mig_profile and 0 <= a.node < len(cluster):
            used[a.node, a.pod.mig_profile] += 1
    short: set[tuple[int, str]] = set()  # pods of the profile on the node beyond the instances free
    for (n, p), count in used.items():
        col = cluster.mig_id(p)
        spare = int(state.mig_free[n, col]) if col >= 0 else 0
        if count > spare:
            short.add((n, p))
        have = spare + free.get((n, p), 0)
        if count > have:
            problems.append(f"{cluster.nodes[n].name}: MIG {p} over-committed ({count} > {have} instances)")
    # Partitioning a GPU drains its node on a live cluster: only for pods that find no instance
    # free, of a profile its layout offers.  (Which instance a pod gets is the node's to choose.)
    for n, g, layout in plan.partitions:
        if 0 <= n < len(cluster) and not any(c and (n, p) in short for p, c in layout.counts.items()):
            problems.append(f"{cluster.nodes[n].name}: GPU {g} is partitioned for no pod of the plan")
    return problems


def peer_problems(assignments: Sequence[Assignment], state: ClusterState) -> list[str]:
    """Bound in the plan's order, each pod goes where kube-scheduler's checks against the pods
    placed before it let it: its required pod affinity, its anti-affinity and theirs, and its
    topology spread constraints (``peer_order`` finds such an order for a plan).

    Written from the rules themselves over the nodes' labels and the pods on them, not with
    ``ClusterState``'s masks, which the solver and the greedy policies use to prune."""
    cluster = state.cluster
    # Assignments the plan's other checks reject (no such node, GPU or MIG profile) cannot be
    # stepped through: they are reported there, and left out here.
    placed = [
        a
        for a in assignments
        if 0 <= a.node < len(cluster)
        and all(0 <= g < cluster.nodes[a.node].gpu_count for g in a.gpus)
        and (not a.pod.mig_profile or cluster.mig_id(a.pod.mig_profile) >= 0)
    ]
    held = [(n, p) for n, pods in state.residents.items() for p in pods]
    nodes = cluster.nodes
    if not any(_has_peer_rules(a.pod) for a in placed) and not any(p.anti_affinity for _, p in held):
        return []
    peers = _Peers(nodes, held)
    problems: list[str] = []
    for a in placed:
        name = nodes[a.node].name
        for fine, what in (
            (peers.affinity_ok, "required pod affinity forbids"),
            (peers.anti_ok, "required pod anti-affinity (its own or a pod's there) forbids"),
            (peers.spread_ok, "its topology spread constraints do not allow"),
        ):
            if not fine(a.pod, a.node):
                problems.append(f"pod {a.pod.key}: {what} {name}")
        peers.place(a.pod, a.node)
    return problems


class _Peers:
    """The pods on each node, as the plan is bound pod by pod, and what kube-scheduler's
    InterPodAffinity and PodTopologySpread filters read of them.  Each view (a term's domains,
    a constraint's counts) is found once from every pod placed, then kept up as pods are added."""

    def __init__(self, nodes: Sequence[Node], held: list[tuple[int, Pod]]) -> None:
        self.nodes = nodes
        self.held = held
        self.holders = [(n, p) for n, p in held if p.anti_affinity]
        self._followed: dict[tuple[PodAffinityTerm, ...], set[tuple[str, str]]] = {}
        self._kept_out: dict[PodAffinityTerm, set[str]] = {}
        self._spread: dict[tuple[object, ...], tuple[Spread, set[int], dict[str, int]]] = {}

    def place(self, pod: Pod, node: int) -> None:
        self.held.append((node, pod))
        if pod.anti_affinity:
            self.holders.append((node, pod))
        labels = self.nodes[node].labels
        for terms, pairs in self._followed.items():
            pairs.update(self._pairs(terms, node, pod))
        for term, values in self._kept_out.items():
            if term.topology_key in labels and pod.selected_by(term):
                values.add(labels[term.topology_key])
        for c, counting, counts in self._spread.values():
            if node in counting and not pod.terminating and pod.selected_by(c):
                counts[labels[c.topology_key]] += 1

    def _pairs(self, terms: tuple[PodAffinityTerm, ...], node: int, pod: Pod) -> set[tuple[str, str]]:
        """(key, value) of each term's domain of ``pod`` on ``node`` if all ``terms`` select it and
        the node has the key (kube-scheduler's affinity counts, pooled by key)."""
        labels = self.nodes[node].labels
        if not pod.matches_all(terms):
            return set()
        return {(t.topology_key, labels[t.topology_key]) for t in terms if t.topology_key in labels}

    def affinity_ok(self, pod: Pod, node: int) -> bool:
        """Every term's key on the node, and for each term a pod that all the terms select in
        the node's domain of its key; or no such pod in any domain and the terms select the pod
        itself (the first of a series)."""
        if not pod.affinity:
            return True
        labels = self.nodes[node].labels
        if not all(t.topology_key in labels for t in pod.affinity):
            return False
        followed = self._followed.get(pod.affinity)
        if followed is None:
            followed = self._followed[pod.affinity] = set()
            for n, q in self.held:
                followed |= self._pairs(pod.affinity, n, q)
        if not followed:
            return pod.matches_all(pod.affinity)
        return all((t.topology_key, labels[t.topology_key]) in followed for t in pod.affinity)

    def anti_ok(self, pod: Pod, node: int) -> bool:
        """No pod its anti-affinity terms select in the node's domain of their key, and no pod
        there whose own terms select it (nodes without a term's key are no domain of it)."""
        labels = self.nodes[node].labels
        for t in pod.anti_affinity:
            values = self._kept_out.get(t)
            if values is None:
                values = self._kept_out[t] = {
                    self.nodes[n].labels[t.topology_key]
                    for n, q in self.held
                    if t.topology_key in self.nodes[n].labels and q.selected_by(t)
                }
            if labels.get(t.topology_key) in values:
                return False
        for n, q in self.holders:
            for t in q.anti_affinity:
                value = self.nodes[n].labels.get(t.topology_key)
                if value is not None and labels.get(t.topology_key) == value and pod.selected_by(t):
                    return False
        return True

    def spread_ok(self, pod: Pod, node: int) -> bool:
        """Every constraint's key on the node, and its domain, with the pod, at most ``max_skew``
        above the emptiest domain of the nodes that count (every key of the pod's constraints,
        its node selector unless not honoured, tolerated taints when honoured; the emptiest
        counts as 0 with fewer than ``min_domains`` domains).  Terminating pods do not count."""
        if not pod.spread:
            return True
        keys = tuple(c.topology_key for c in pod.spread)
        labels = self.nodes[node].labels
        if not all(k in labels for k in keys):
            return False
        for c in pod.spread:
            selector = pod.node_selector if c.honor_affinity else ()
            tolerations = pod.tolerations if c.honor_taints else None
            view = self._spread.get((c, keys, selector, tolerations))
            if view is None:
                counting = {
                    i
                    for i, n in enumerate(self.nodes)
                    if all(k in n.labels for k in keys)
                    and (not selector or selects(selector, n))
                    and (tolerations is None or tolerated(tolerations, n.taints))
                }
                counts = dict.fromkeys((self.nodes[i].labels[c.topology_key] for i in counting), 0)
                for n, q in self.held:
                    if n in counting and not q.terminating and q.selected_by(c):
                        counts[self.nodes[n].labels[c.topology_key]] += 1
                view = self._spread[c, keys, selector, tolerations] = (c, counting, counts)
            counts = view[2]
            low = min(counts.values()) if len(counts) >= c.min_domains else 0
            if counts.get(labels[c.topology_key], 0) + int(pod.selected_by(c)) - low > c.max_skew:
                return False
        return True


def _has_peer_rules(pod: Pod) -> bool:
    return bool(pod.affinity or pod.anti_affinity or pod.spread)


def peer_order(
    assignments: Sequence[Assignment], state: ClusterState, deadline: float | None = None
) -> tuple[list[Assignment], list[Assignment]]:
    """``assignments`` in an order that ``peer_problems`` accepts, as far as a greedy search finds
    one, and those it could not fit in (each pod in turn must pass its checks against the pods
    before it).  Pods without affinity or spread constraints go first (others may follow them or
    count them) or, should that leave some stuck, last.  Should pods with affinity still be stuck,
    the pods that may start a series (``_series_orders``) are tried first, one after another.
    ``deadline`` (``time.perf_counter()`` time): once past it, the first order found is the
    answer, and no other is looked for."""
    ruled = [a for a in assignments if a.pod.spread or a.pod.affinity]
    if not ruled:
        return list(assignments), []
    plain = [a for a in assignments if not (a.pod.spread or a.pod.affinity)]
    best = _greedy_order(plain, _in_turns(ruled, state), state)
    if not best[1] or _past(deadline):
        return best
    last = _greedy_order([], ruled, state, plain)
    best = last if len(last[1]) < len(best[1]) else best
    if not any(a.pod.affinity for a in best[1]):  # none stuck, or none a series may let in
        return best
    for order in _series_orders(ruled, assignments, state):
        if not any(a.pod.affinity for a in best[1]) or _past(deadline):
            break
        for got in (_greedy_order(plain, order, state), _greedy_order([], order, state, plain)):
            if len(got[1]) < len(best[1]):
                best = got
    return best


def _in_turns(ruled: list[Assignment], state: ClusterState) -> list[Assignment]:
    """``ruled`` with the pods of one kind (spread constraints, namespace, labels) taken in turns
    across the domains they go to: the first of each domain, then the second of each, and so on
    (pods without spread constraints first, as given).  A plan within every skew binds so,
    whatever order it lists its pods in, mostly without a pod tried twice."""
    nodes = state.cluster.nodes
    seen: dict[tuple[object, ...], int] = defaultdict(int)
    turn: list[int] = []
    for a in ruled:
        p = a.pod
        if not p.spread:
            turn.append(0)
            continue
        key = (p.spread, p.namespace, p.labels, tuple(nodes[a.node].labels.get(c.topology_key) for c in p.spread))
        turn.append(seen[key])
        seen[key] += 1
    return [a for _, a in sorted(zip(turn, ruled, strict=True), key=lambda ta: ta[0])]


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


_STARTS_TRIED = 8
"""At most this many pods (of different rules or domains) are tried as the start of a series."""


def _series_orders(
    ruled: list[Assignment], assignments: Sequence[Assignment], state: ClusterState
) -> Iterator[list[Assignment]]:
    """``ruled`` with each pod that may start a series ahead of the rest in turn: pods whose
    required affinity selects themselves while no pod it selects runs, so that the first of them
    bound goes anywhere and the pods their terms select must then join it.  Those whose affinity
    no other pod of the plan satisfies where they go come first (they must start), then those in
    whose domains the most pods of the plan with affinity would find them."""
    may_start = [a for a in ruled if a.pod.affinity and state.affinity_first(a.pod)]
    if not may_start:
        return
    nodes = state.cluster.nodes
    followers = [a for a in ruled if a.pod.affinity]

    def lets_in(b: Assignment, a: Assignment, key: str) -> bool:
        """``b``, bound before ``a``, gives ``a``'s affinity its domain of ``key``."""
        there = nodes[b.node].labels.get(key)
        return there is not None and there == nodes[a.node].labels.get(key) and b.pod.matches_all(a.pod.affinity)

    def rank(a: Assignment) -> tuple[bool, int]:
        keys = {t.topology_key for t in a.pod.affinity}
        alone = not all(any(b is not a and lets_in(b, a, k) for b in assignments) for k in keys)
        led = sum(1 for b in followers if b is not a and all(lets_in(a, b, t.topology_key) for t in b.pod.affinity))
        return not alone, -led

    keys = sorted({t.topology_key for a in may_start for t in a.pod.affinity})
    ranked = sorted(may_start, key=rank)
    others = [a for a in ruled if all(a is not b for b in may_start)]
    seen: set[tuple[object, ...]] = set()
    for a in ranked:
        alike = (a.pod.affinity, a.pod.namespace, a.pod.labels, tuple(nodes[a.node].labels.get(k) for k in keys))
        if alike in seen:
            continue
        seen.add(alike)
        if len(seen) > _STARTS_TRIED:
            return
        yield [a] + [b for b in ranked if b is not a] + others


def _greedy_order(
    head: list[Assignment], rest: list[Assignment], state: ClusterState, tail: Sequence[Assignment] = ()
) -> tuple[list[Assignment], list[Assignment]]:
    """``head`` as given, then the pods of ``rest`` each in turn that passes its checks against
    the pods before it: the scan goes on from the pod last placed, round and round, until a whole
    round places none (any such order will do, and starting over at the first pod each time
    checked the pods stuck there again for every pod placed).  Then the first pod of ``tail`` that
    fits, if any, and round again.  Returns the order and the pods left out."""
    ordered = list(head)
    # The checks ``peer_problems`` makes of the order, kept up pod by pod as it grows.
    peers = _Peers(state.cluster.nodes, [(n, p) for n, pods in state.residents.items() for p in pods])
    for a in head:
        peers.place(a.pod, a.node)

    def fits(a: Assignment) -> bool:
        return peers.affinity_ok(a.pod, a.node) and peers.anti_ok(a.pod, a.node) and peers.spread_ok(a.pod, a.node)

    left = list(rest)
    later = list(tail)
    i = misses = 0
    while left or later:
        if misses < len(left):
            i %= len(left)
            a = left[i]
            if not fits(a):
                i, misses = i + 1, misses + 1
                continue
            left.pop(i)
        else:
            j = next((j for j, b in enumerate(later) if fits(b)), None)
            if j is None:
                break
            a = later.pop(j)
        ordered.append(a)
        peers.place(a.pod, a.node)
        misses = 0
    return ordered, left + later


def island_problems(assignments: Iterable[Assignment], state: ClusterState) -> list[str]:
    """Pods that require one island and got GPUs of several, one line each."""
    islands = state.cluster.islands
    return [
        f"pod {a.pod.key}: GPUs {list(a.gpus)} on {state.cluster.nodes[a.node].name} span islands"
        for a in assignments
        if a.pod.island == "required"
        and 0 <= a.node < len(state.cluster)
        and len({int(islands[a.node, g]) for g in a.gpus if 0 <= g < islands.shape[1]}) > 1
    ]


def _gang_problems(plan: Plan, state: ClusterState, pods: Sequence[Pod] | None) -> list[str]:
    """Gangs placed at least their minimum (beside their members running) or not at all, and
    only while their members agree on its rules; one domain when required."""
    problems: list[str] = []
    members: dict[str, list[Pod]] = defaultdict(list)
    for p in pods if pods is not None else [a.pod for a in plan.assignments] + list(plan.unplaced):
        if p.gang is not None:
            members[p.gang.name].append(p)
    where: dict[str, list[int]] = defaultdict(list)
    rules: dict[str, Gang] = {}
    for a in plan.assignments:
        if a.pod.gang is not None:
            where[a.pod.gang.name].append(a.node)
            rules.setdefault(a.pod.gang.name, a.pod.gang)
    disagree = gang_conflicts(p for ps in members.values() for p in ps)
    for name, nodes in where.items():
        gang = members[name][0].gang if members.get(name) else rules[name]
        assert gang is not None
        if name in disagree:
            problems.append(f"gang {name}: placed although its members disagree on its minimum or topology")
        if len(nodes) < gang.min_members:  # (the minimum as left beside the members running)
            beside = f" beside {gang.running} running" if gang.running else ""
            placed = f"{len(nodes)} member{'s' if len(nodes) != 1 else ''} placed{beside}"
            problems.append(f"gang {name}: {placed}, fewer than its minimum {gang.min_members + gang.running}")
        if gang.topology == "required":
            doms = {state.cluster.nodes[n].labels.get(gang.topology_key) for n in nodes if 0 <= n < len(state.cluster)}
            if len(doms) > 1 or not all(doms) or (gang.domain and doms != {gang.domain}):
                problems.append(f"gang {name}: members span {gang.topology_key} domains {sorted(map(str, doms))}")
    return problems


def validate_plan(plan: Plan, state: ClusterState, pods: Sequence[Pod] | None = None) -> None:
    """Raise ``PlanError`` listing every problem when ``plan`` is invalid."""
    problems = plan_problems(plan, state, pods)
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PlanError(f"invalid plan from {plan.stats.policy}: {shown}{more}")
