"""A batch solve's input, fully prepared before any CP-SAT variable exists.

Three reductions keep the model small:

* pods of one shape are one *group* with a count (they are interchangeable);
* nodes with the same free vector (CPU, memory, GPU model, sorted per-GPU free
  share) are one *class*; a class contributes at most as many nodes as the
  group has pods, so a thousand empty nodes of one type cost what a few do;
* per group only the ``candidates_per_pod`` best classes, ranked by the
  fragmentation a placement adds and then by fullness, are kept, plus the
  nodes the greedy warm start used, plus the class with the most room for the
  group's shape (an escape: the best-ranked nodes are what every group wants,
  and the emptiest ones, ranked last, may be the only way to place the batch).

The model size therefore grows with distinct shapes times candidates, not with
nodes times pods.  A model that was offered only part of the nodes some group
fits on (``Instance.pruned``) proves its optimum over those nodes alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpusched.model import GPU_MILLI, Assignment, ClusterState, Plan, Pod, PodShape
from gpusched.model.affinity import PodAffinityTerm, Spread
from gpusched.model.cluster import BoolArray, IntArray
from gpusched.model.pod import Gang, gang_conflicts
from gpusched.solver.fragmentation import FragScorer

__all__ = [
    "Candidate",
    "Group",
    "Instance",
    "beside_placed",
    "build_instance",
    "domain_of",
    "followed",
    "node_classes",
    "pod_terms",
]

Identity = tuple[()] | tuple[tuple[PodAffinityTerm, ...], tuple[int, ...]]
"""Which preferred pod terms select a group's pods: placed pods' and the batch's (see ``Group.identity``)."""
GroupKey = tuple[PodShape, str, tuple[int, ...], tuple[int, ...], tuple[int, ...], Identity, int]


@dataclass(frozen=True, slots=True)
class Group:
    """Interchangeable pods of one shape (and one gang), highest priority first, then arrival order."""

    shape: PodShape
    pods: tuple[Pod, ...]
    gang: Gang | None = None
    selected_by: tuple[int, ...] = ()
    """The anti-affinity terms of ``Instance.terms`` that keep its pods away."""
    counted_by: tuple[int, ...] = ()
    """The spread constraints of ``Instance.spreads`` that count its pods."""
    apart_self: tuple[int, ...] = ()
    """Its preferred anti-affinity terms (indices into ``shape.preferred_apart``) that select its own pods."""
    identity: Identity = ()
    """The preferred pod terms that select its pods, when preferences are weighed (else empty):
    placed pods' (``ClusterState.wish_signature``) and the batch's (indices into ``Instance.wishes``)."""
    priority: int = 0
    """Its pods' priority; 0 for a gang's group (a gang is placed at its lowest member's priority,
    ``objectives.priority``, whatever the shapes of its members)."""

    @property
    def wished_by(self) -> tuple[int, ...]:
        """The batch's preferred terms (indices into ``Instance.wishes``) that select its pods."""
        return self.identity[1] if self.identity else ()

    @property
    def key(self) -> GroupKey:
        """What makes pods interchangeable: shape, gang name, the terms that select them, priority."""
        gang = self.gang.name if self.gang is not None else ""
        return self.shape, gang, self.selected_by, self.counted_by, self.apart_self, self.identity, self.priority


@dataclass(frozen=True, slots=True)
class Candidate:
    """Pods of group ``group`` may go to node ``node``, at most ``ub`` of them."""

    group: int
    node: int
    ub: int
    frag: int
    """Fragmentation one pod adds here (thousandths of a GPU), whole-GPU and CPU pods."""
    pack: int
    """How full the node is already: 0..100 for CPU plus 0..100 for GPU."""
    gpus: tuple[tuple[int, int, int], ...] = ()
    """Fractional pods: (GPU index, pods that fit on it alone, fragmentation one adds there)."""


@dataclass(frozen=True)
class Instance:
    """Everything the CP-SAT model is built from."""

    state: ClusterState
    groups: tuple[Group, ...]
    candidates: tuple[Candidate, ...]
    nodes: tuple[int, ...]
    hint: Plan
    terms: tuple[PodAffinityTerm, ...] = ()
    """Every required pod (anti-)affinity term in play: the batch's and those of pods placed."""
    spreads: tuple[Spread, ...] = ()
    """Every topology spread constraint of the batch's pods."""
    identities: bool = False
    """Preferences are weighed and placed pods or the batch's have preferred pod terms: pods are
    grouped by which of those terms select them too."""
    wishes: tuple[PodAffinityTerm, ...] = ()
    """The batch's own preferred pod (anti-)affinity terms (none when preferences are off)."""
    member_of: Mapping[int, int] = field(default_factory=dict)
    """Group index by the identity of each pod the groups hold (they keep the pods alive)."""
    pruned: bool = False
    """Some group's candidates leave out nodes it fits on: the model's optimum is the best
    over the candidates, not proven for the whole cluster."""

    def group_of(self) -> dict[GroupKey, int]:
        """Group index by ``Group.key``."""
        return {g.key: gi for gi, g in enumerate(self.groups)}

    def key_of(self, pod: Pod) -> GroupKey:
        """The ``Group.key`` of the group ``pod`` belongs to."""
        return _group_key(pod, self.terms, self.spreads, self.state if self.identities else None, self.wishes)

    def group_index(self, pod: Pod) -> int:
        """The index of the group ``pod`` belongs to (found by identity for the batch's own pods:
        the plans of the batch hold those; by ``key_of`` for any other)."""
        gi = self.member_of.get(id(pod))
        return gi if gi is not None else self.group_of()[self.key_of(pod)]

    def conflicts(self, a: int, b: int) -> list[str]:
        """Topology keys of the anti-affinity terms by which groups ``a`` and ``b`` (or a group's
        own pods, when equal) keep out of each other's domains."""
        ga, gb = self.groups[a], self.groups[b]
        keys = {t.topology_key for t in ga.shape.anti_affinity if self.terms.index(t) in gb.selected_by}
        keys |= {t.topology_key for t in gb.shape.anti_affinity if self.terms.index(t) in ga.selected_by}
        return sorted(keys)


def pod_terms(pods: Sequence[Pod], state: ClusterState) -> tuple[PodAffinityTerm, ...]:
    """The distinct required pod (anti-)affinity terms of ``pods``, and the anti-affinity terms of
    the pods ``state`` holds."""
    seen = dict.fromkeys(t for p in pods for t in (*p.anti_affinity, *p.affinity))
    seen.update(dict.fromkeys(t for _, holder in state.holders for t in holder.anti_affinity))
    return tuple(seen)


def _group_key(
    pod: Pod,
    terms: Sequence[PodAffinityTerm],
    spreads: Sequence[Spread],
    state: ClusterState | None = None,
    wishes: Sequence[PodAffinityTerm] = (),
) -> GroupKey:
    selected = tuple(i for i, t in enumerate(terms) if pod.selected_by(t))
    counted = tuple(i for i, c in enumerate(spreads) if pod.selected_by(c))
    own = tuple(i for i, (_, t) in enumerate(pod.preferred_apart) if pod.selected_by(t))
    identity: Identity = ()
    if state is not None:  # the preferred terms, of placed pods and of the batch's, that select it
        identity = (state.wish_signature(pod), tuple(i for i, t in enumerate(wishes) if pod.selected_by(t)))
    gang = pod.gang.name if pod.gang is not None else ""
    return pod.shape, gang, selected, counted, own, identity, 0 if pod.gang is not None else pod.priority


def node_classes(state: ClusterState, extra: Sequence[IntArray] = ()) -> np.ndarray:
    """Class id per node: equal ids have equal free CPU, memory, GPU product and GPU shares
    (and equal ``extra`` columns: free islands, MIG instances, topology domains)."""
    free = np.sort(state.gpu_free, axis=1)
    c = state.cluster
    sig = np.column_stack([state.cpu_free, state.mem_free, c.model_id, c.product_id, c.taint_id, free, *extra])
    _, inverse = np.unique(sig, axis=0, return_inverse=True)
    return inverse.reshape(-1)


def _class_extras(
    state: ClusterState,
    groups: Sequence[Group],
    peers: Sequence[BoolArray | None] = (),
    penalties: Sequence[IntArray | None] = (),
) -> list[IntArray]:
    """Signature columns that only batches asking for islands, MIG, storage, node selectors, gang domains
    or the pods already placed (anti-affinity, spread) need."""
    cl = state.cluster
    extra: list[IntArray] = []
    shapes = [g.shape for g in groups]
    if cl.island_count > 1 and any(s.island for s in shapes):
        extra.append(np.sort(state.island_idle, axis=1) * 64 + (cl.islands.max(axis=1) + 1)[:, None])
    if any(s.mig_profile for s in shapes) and cl.mig_profiles:
        extra.extend([state.mig_free, cl.mig_can.astype(np.int64), state.partitionable_gpus])
    if any(s.storage_mib for s in shapes):
        extra.append(state.storage_free)
    if cl.pods_metered:  # nodes with room for the whole batch are alike, whatever the limit
        extra.append(np.minimum(state.pods_free, sum(len(g.pods) for g in groups)))
    for port in sorted({p for s in shapes for p in s.host_ports}):
        extra.append((~state.ports_free(frozenset({port}))).astype(np.int64))
    selectors = {
        x for s in shapes for x in (s.node_selector, s.volume_selector, s.provision_selector, s.attach_selector) if x
    }
    for selector in sorted(selectors, key=repr):
        extra.append(cl.selector_mask(selector).astype(np.int64))
    for preference in sorted({s.preferred_nodes for s in shapes if s.preferred_nodes}, key=repr):
        extra.append(cl.preference_scores(preference))
    if cl.soft_tainted:
        extra.append(cl.soft_taint_id)
    keys = {g.gang.topology_key for g in groups if g.gang is not None and g.gang.topology_key}
    keys |= {t.topology_key for s in shapes for t in s.anti_affinity if _shared_domains(state, t.topology_key)}
    keys |= {c.topology_key for s in shapes for c in s.spread if _shared_domains(state, c.topology_key)}
    keys |= {t.topology_key for s in shapes for t in s.affinity if _shared_domains(state, t.topology_key)}
    keys |= {t.topology_key for s in shapes for _, t in s.pod_wishes if _shared_domains(state, t.topology_key)}
    for key in sorted(keys):
        extra.append(cl.domains(key)[0])
    masks = {m.tobytes(): m for m in peers if m is not None}
    extra.extend(m.astype(np.int64) for _, m in sorted(masks.items()))
    columns = {p.tobytes(): p for p in penalties if p is not None}
    extra.extend(p for _, p in sorted(columns.items()))
    return extra


def followed(groups: Sequence[Group], terms: Sequence[PodAffinityTerm], gi: int) -> list[int]:
    """The other groups of the batch whose pods group ``gi``'s required pod affinity may follow:
    those all its terms select that have no pod affinity of their own (they are bound first, and
    never wait on a follower)."""
    group = groups[gi]
    if not group.shape.affinity:
        return []
    mine = {terms.index(t) for t in group.shape.affinity}
    return [
        hi
        for hi, other in enumerate(groups)
        if hi != gi and not other.shape.affinity and mine <= set(other.selected_by)
    ]


def _shared_domains(state: ClusterState, key: str) -> bool:
    """Some value of label ``key`` spans several nodes (unlike the hostname's)."""
    column, ids = state.cluster.domains(key)
    return len(ids) < int((column >= 0).sum())


def domain_of(state: ClusterState, node: int, gang: Gang) -> str:
    """The gang's topology domain of ``node``: its label value, or the node on its own
    (``node/<name>``) when the label is missing."""
    node_obj = state.cluster.nodes[node]
    return node_obj.labels.get(gang.topology_key) or f"node/{node_obj.name}"


def beside_placed(pods: Sequence[Pod], placed: Iterable[Assignment], state: ClusterState) -> list[Pod]:
    """``pods`` with the members of each gang that ``placed`` places members of counted beside
    those, as beside members already running (``Gang.beside``): the rest of the gang is
    placed member by member, in the topology domain of one of those when it has a key."""
    count: dict[str, int] = defaultdict(int)
    where: dict[str, str] = {}
    for a in placed:
        g = a.pod.gang
        if g is not None:
            count[g.name] += 1
            if g.topology_key and g.name not in where and 0 <= a.node < len(state.cluster):
                where[g.name] = state.cluster.nodes[a.node].labels.get(g.topology_key, "")
    if not count:
        return list(pods)
    return [
        replace(p, gang=g.beside(count[g.name], where.get(g.name, "")))
        if (g := p.gang) is not None and count.get(g.name)
        else p
        for p in pods
    ]


def _mig_ub(state: ClusterState, shape: PodShape, sel: IntArray) -> IntArray:
    """Instances of the shape's profile that each node could offer: free ones, plus those of
    partitioning every idle GPU with the layout richest in the profile."""
    col = state.cluster.mig_index[shape.mig_profile]
    ub: IntArray = state.mig_free[sel, col].copy()
    most: dict[str, int] = {}  # per GPU model: instances of the profile in its richest layout
    for j, n in enumerate(sel):
        geom = state.cluster.geometry[int(n)]
        if geom is not None and state.cluster.mig_can[n, col] and state.partitionable_gpus[n]:
            if geom.model not in most:
                most[geom.model] = max(lay.counts.get(shape.mig_profile, 0) for lay in geom.layouts())
            ub[j] += most[geom.model] * int(state.partitionable_gpus[n])
    return ub


_ROOMY = 1 << 40
"""More pods than any node holds: ``_room`` without a cap."""


def _room(state: ClusterState, shape: PodShape, nodes: IntArray, most: int) -> IntArray:
    """Pods of ``shape`` each of ``nodes`` has room for alone, at most ``most``."""
    ub: IntArray = np.full(nodes.size, most, dtype=np.int64)
    if shape.cpu_milli:
        ub = np.minimum(ub, state.cpu_free[nodes] // shape.cpu_milli)
    if shape.memory_mib:
        ub = np.minimum(ub, state.mem_free[nodes] // shape.memory_mib)
    if shape.storage_mib:
        ub = np.minimum(ub, state.storage_free[nodes] // shape.storage_mib)
    if state.cluster.pods_metered:
        ub = np.minimum(ub, state.pods_free[nodes])
    if shape.host_ports:
        ub = np.minimum(ub, 1)  # two pods binding one host port never share a node
    if shape.is_fractional:
        ub = np.minimum(ub, (state.gpu_free[nodes] // shape.gpu_milli).sum(axis=1))
    elif shape.mig_profile:
        ub = np.minimum(ub, _mig_ub(state, shape, nodes))
    elif shape.island == "required":
        ub = np.minimum(ub, (state.island_idle[nodes] // shape.num_gpu).sum(axis=1))
    elif shape.num_gpu:
        ub = np.minimum(ub, state.full_free_gpus[nodes] // shape.num_gpu)
    return ub


def _pack(state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    cl = state.cluster
    cpu = np.where(cl.cpu_cap[nodes] > 0, 100 - 100 * state.cpu_free[nodes] // np.maximum(cl.cpu_cap[nodes], 1), 0)
    cap = cl.gpu_count[nodes] * GPU_MILLI
    gpu = np.where(cap > 0, 100 - 100 * state.gpu_free[nodes].sum(axis=1) // np.maximum(cap, 1), 0)
    return (cpu + gpu).astype(np.int64)


def build_instance(
    pods: Sequence[Pod],
    state: ClusterState,
    scorer: FragScorer,
    hint: Plan,
    candidates_per_pod: int,
    *,
    preferences: bool = True,
) -> Instance:
    """Group, prune and describe one batch against ``state``; with ``preferences`` off (their
    weight is 0) the candidates kept are not ranked by them either."""
    terms = pod_terms(pods, state)
    spreads = tuple(dict.fromkeys(c for p in pods for c in p.spread))
    wishes = tuple(dict.fromkeys(t for p in pods for _, t in p.pod_wishes)) if preferences else ()
    identities = preferences and bool(state.wish_terms or wishes)
    told = state if identities else None  # preferred terms tell pods apart
    by_shape: dict[GroupKey, list[tuple[int, Pod]]] = defaultdict(list)
    for i, p in enumerate(pods):
        by_shape[_group_key(p, terms, spreads, told, wishes)].append((i, p))
    groups = tuple(
        Group(
            key[0],
            tuple(p for _, p in sorted(members, key=lambda ip: (-ip[1].priority, ip[0]))),
            members[0][1].gang,
            key[2],
            key[3],
            key[4],
            key[5],
            key[6],
        )
        for key, members in by_shape.items()
    )
    peers = [state.peer_mask(g.pods[0], bool(followed(groups, terms, gi))) for gi, g in enumerate(groups)]
    penalties = [(state.wish_penalty if identities else state.apart_penalty)(g.pods[0]) for g in groups]
    gang_sizes: dict[str, int] = defaultdict(int)
    for g in groups:
        if g.gang is not None:
            gang_sizes[g.gang.name] += len(g.pods)
    disagree = gang_conflicts(pods) if gang_sizes else {}  # such gangs are not placed (``constraints.gang``)
    member_of = {id(p): gi for gi, g in enumerate(groups) for p in g.pods}  # the hint holds these pods
    by_key: dict[GroupKey, int] = {}
    hinted: dict[int, set[int]] = defaultdict(set)
    for a in hint.assignments:
        gi = member_of.get(id(a.pod))
        if gi is None:  # not one of the batch's objects: found by its key
            by_key = by_key or {g.key: i for i, g in enumerate(groups)}
            gi = by_key.get(_group_key(a.pod, terms, spreads, told, wishes), -1)
        hinted[gi].add(a.node)

    classes = node_classes(state, _class_extras(state, groups, peers, penalties))
    order = np.argsort(classes, kind="stable")
    starts = np.searchsorted(classes[order], np.arange(classes.max() + 1 if classes.size else 0))
    gpu_free = state.gpu_free

    # Required pod affinity over shared domains: the pods that follow and those they follow must
    # be able to meet in one domain, which the best-ranked nodes alone may not offer.
    together = {terms.index(t) for g in groups for t in g.shape.affinity if _shared_domains(state, t.topology_key)}
    cands: list[Candidate] = []
    sizes = np.diff(np.append(starts, classes.size))  # nodes per class
    pruned = False
    demand: dict[int, int] = defaultdict(int)  # per class, the pods of the groups that fit there
    least: dict[int, int] = {}  # per class, the fewest of its nodes a group it was offered to got
    for gi, group in enumerate(groups):
        shape, count = group.shape, len(group.pods)
        mask = state.fit_mask(shape)
        away = peers[gi]
        if away is not None:
            mask = mask & away
        gang = group.gang
        if gang is not None and gang.name in disagree:
            continue
        if gang is not None and gang.topology == "required":
            key, held = gang.topology_key, gang.domain
            mask = mask & np.array(
                [bool(n.labels.get(key)) and (not held or n.labels.get(key) == held) for n in state.cluster.nodes]
            )
        feasible = np.flatnonzero(mask)
        if feasible.size == 0:
            continue
        delta, _, _ = scorer.delta(state, shape)
        cls = np.unique(classes[feasible])
        reps = order[starts[cls]]  # first node of each class
        pack = _pack(state, reps)
        keys = [-pack, delta[reps]]
        if preferences and (shape.has_preferences or penalties[gi] is not None):  # the nodes it prefers first
            prefer = state.cluster.preference_scores(shape.preferred_nodes)[reps]
            penalty = penalties[gi]
            keys.append(-(prefer - penalty[reps]) if penalty is not None else -prefer)
        avoided = state.cluster.avoided(shape.tolerations) if preferences else None
        if avoided is not None:  # before all, the nodes without PreferNoSchedule taints it minds
            keys.append(avoided[reps])
        rank = np.lexsort(keys)
        chosen: list[int] = []
        # A gang's groups compete for the same nodes: each may need room for every member.
        reach = gang_sizes[gang.name] if gang is not None else count
        quota = max(candidates_per_pod, reach)
        if gang is not None and gang.topology_key:
            quota = feasible.size  # a gang needs enough candidates inside one domain: keep them all
        if together and (any(terms.index(t) in together for t in shape.affinity) or together & set(group.selected_by)):
            quota = feasible.size  # as a gang's: the series needs a domain with room for all of it
        # Wishes to be apart from (or with) pods over shared domains: the best candidates of every
        # domain, up to the quota each (a class lies within one domain of each key).
        wish_keys = dict.fromkeys(t.topology_key for _, t in shape.pod_wishes)
        if identities:  # placed pods' terms that select it, and the batch's
            pod0 = group.pods[0]
            wish_keys.update(dict.fromkeys(t.topology_key for t in state.wish_signature(pod0)))
            wish_keys.update(dict.fromkeys(t.topology_key for t in wishes if pod0.selected_by(t)))
        apart_keys = [k for k in wish_keys if _shared_domains(state, k)]
        per_domain: dict[tuple[int, ...], int] | None = {} if apart_keys else None
        if any(_shared_domains(state, c.topology_key) for c in shape.spread):
            quota, per_domain = feasible.size, None  # spread over domains: candidates in every one of them
        # Pods that keep out of each other's domains (a class lies within one): a node per class.
        spread = any(
            terms.index(t) in group.selected_by and _shared_domains(state, t.topology_key) for t in shape.anti_affinity
        )
        columns = [state.cluster.domains(k)[0] for k in apart_keys]
        taken: dict[int, int] = {}  # nodes taken per class: always its first ones
        for r in rank:
            c = cls[r]
            size = sizes[c]
            take = 1 if spread else min(int(size), reach)
            if per_domain is not None:
                first = int(order[starts[c]])
                dom = tuple(int(col[first]) for col in columns)
                have = per_domain.get(dom, 0)
                if have >= quota:
                    continue
                per_domain[dom] = have + take
            chosen.extend(int(n) for n in order[starts[c] : starts[c] + take])
            taken[int(c)] = take
            if per_domain is None and len(chosen) >= quota:
                break
        if len(taken) < cls.size:
            # The escape: the class with the most room for the shape (the best-ranked of equals),
            # as many of its nodes as hold the group.  The classes ranked first are those every
            # group ranks first; this one is where the group goes when the others took them.
            room = _room(state, shape, reps, _ROOMY)
            r = rank[int(np.argmax(room[rank]))]
            c = int(cls[r])
            if c not in taken:
                take = 1 if spread else min(int(sizes[c]), -(-reach // max(int(room[r]), 1)))
                chosen.extend(int(n) for n in order[starts[c] : starts[c] + take])
                taken[c] = take
        pruned = pruned or len(taken) < cls.size  # a class it fits on left out
        for c in cls.tolist():
            demand[c] += count
        for c, take in taken.items():
            least[c] = min(least.get(c, take), take)
        chosen_set = set(chosen) | hinted.get(gi, set())
        sel = np.array(sorted(chosen_set), dtype=np.int64)
        ub = _room(state, shape, sel, count)
        per_gpu = scorer.gpu_delta(state, shape) if shape.is_fractional else None
        packs = _pack(state, sel)
        for j, n in enumerate(sel):
            if ub[j] <= 0:
                continue
            gpus: tuple[tuple[int, int, int], ...] = ()
            if per_gpu is not None:
                gpus = tuple(
                    (g, int(gpu_free[n, g] // shape.gpu_milli), round(float(per_gpu[n, g])))
                    for g in range(state.cluster.nodes[n].gpu_count)
                    if gpu_free[n, g] >= shape.gpu_milli
                )
            d = float(delta[n])
            cands.append(Candidate(gi, int(n), int(ub[j]), round(d) if np.isfinite(d) else 0, int(packs[j]), gpus))
    # The nodes of a class are alike, and every group offered it gets its first nodes: a class
    # whose every group got as many of them as the batch could use there loses nothing.
    pruned = pruned or any(take < min(int(sizes[c]), demand[c]) for c, take in least.items())
    nodes = tuple(sorted({c.node for c in cands}))
    return Instance(state, groups, tuple(cands), nodes, hint, terms, spreads, identities, wishes, member_of, pruned)
