"""Preferences, scored as kube-scheduler scores them and never worth a pod.

Per pod, a node earns the weight of the preferred node affinity terms it meets, plus each
preferred pod affinity term's weight once per pod the term selects in the node's domain; these
raw scores are normalised to 0..100 points over the pod's candidate nodes (kube-scheduler
normalises NodeAffinity and InterPodAffinity scores to 0..100 per pod).  Preferred
anti-affinity is counted in full, not normalised: a pod pays the term's weight per pod it
selects in the node's domain, whether that pod runs already or comes in the same batch (then
per pair sharing a domain: replicas of one group, or a pod with the term and one it selects;
a batch pod's affinity term earns per such pair too, replicas' to one another included).  So
six replicas spread 2/2/2 over three empty domains rather than 4/1/1, and stay out of a domain
ten of them already crowd, as kube-scheduler, placing them one by one, would; replicas that
prefer one another's zone share one.

In the work-conserving mode no wish keeps out a pod that fits: ``placed.placement_first``
weighs one pod placed above the batch's whole ``swing``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from ortools.sat.python import cp_model

from gpusched.solver.instance import Instance
from gpusched.solver.params import Weights
from gpusched.solver.vars import Vars

POINTS = 100
"""The range a pod's node-level preference score is normalised to."""
TAINT_POINTS = 150
"""The range of avoiding PreferNoSchedule taints: ``TAINT_POINTS * (1 - taints / most taints
among the candidates)``, as kube-scheduler normalises its TaintToleration score, weighed against
the affinity scores as its default profile does (3 to 2)."""


def wishes(inst: Instance, gi: int) -> bool:
    """Whether group ``gi`` has anything to prefer among nodes: affinity of its own, placed pods'
    preferred terms that select it, or PreferNoSchedule taints it does not tolerate somewhere."""
    group = inst.groups[gi]
    shape, state = group.shape, inst.state
    return (
        shape.has_preferences
        or state.cluster.avoided(shape.tolerations) is not None
        or (inst.identities and state.wished(group.pods[0]) is not None)
    )


CROSS_DOMAINS = 512
"""At most this many domains, over all pairs of groups, get a product of pod counts in one model:
the pairs of groups that weigh most first, each with all its shared domains or none (a pair
scored in some domains only would be pushed into the others)."""


def _cross(inst: Instance) -> dict[tuple[int, int, str], int]:
    """(group a, group b, topology key), a < b: the points per pair of their pods sharing a domain
    of the key that the preferred pod terms of either group's pods selecting the other's add up to
    (positive keeps apart, negative draws together; pairs that cancel out are left out).
    Anti-affinity counts its weight in full, as kube-scheduler charges the pod placed later for
    both pods' terms; affinity earns ``POINTS / |other group|`` per pair, so that a pod whose
    partners all join its domain earns the ``POINTS`` that its normalised score would.

    And (group a, a, key): per ordered pair of its own pods sharing a domain, the points of its
    preferred affinity terms that select its own pods, ``POINTS / (|group| - 1)`` each: a pod
    whose partners, the others, all join its domain earns ``POINTS``, and each pod of a pair earns
    for its own term (as ``_self_terms`` charges anti-affinity to its own pods twice per pair)."""
    selected: dict[int, list[int]] = defaultdict(list)  # batch term -> the groups it selects
    for b, gb in enumerate(inst.groups):
        for ti in gb.wished_by:
            selected[ti].append(b)
    index = {t: ti for ti, t in enumerate(inst.wishes)}
    out: dict[tuple[int, int, str], int] = defaultdict(int)
    for a, ga in enumerate(inst.groups):
        for weight, term in ga.shape.pod_wishes:
            for b in selected[index[term]] if term in index else ():
                if b != a:
                    points = weight if weight > 0 else -max(1, POINTS // len(inst.groups[b].pods))
                    out[min(a, b), max(a, b), term.topology_key] += points
                elif weight < 0 and len(ga.pods) > 1:  # replicas drawn to one another
                    out[a, a, term.topology_key] -= max(1, POINTS // (len(ga.pods) - 1))
    return {k: w for k, w in out.items() if w}


def _self_terms(inst: Instance, gi: int) -> list[tuple[int, int]]:
    """(term index, points per pair of its pods sharing a domain) of group ``gi``'s preferred
    anti-affinity terms that select its own pods: the weight twice, as kube-scheduler charges the
    pod placed later for its own term and for the earlier pod's (once for a ``ScheduleAnyway``
    spread constraint, which only the pod placed later's counts)."""
    group = inst.groups[gi]
    soft = group.pods[0].soft_spread
    out = []
    for ti in group.apart_self:
        weight, term = group.shape.preferred_apart[ti]
        out.append((ti, weight if term in soft else 2 * weight))
    return out


def swing(inst: Instance) -> int:
    """The most the batch's preferences can add up to, in points: each pod's full node-level
    range (its normalised score, and the anti-affinity weight of the pods already there), every
    pair of replicas sharing a domain, and every pair of pods of two groups whose terms weigh each
    other (of one group, when its terms draw its pods to one another)."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for ci, c in enumerate(inst.candidates):
        by_group[c.group].append(ci)
    total = 0
    for gi, group in enumerate(inst.groups):
        n = len(group.pods)
        if wishes(inst, gi):
            points = _points(inst, gi, by_group[gi]).values()
            reach = max([*points, 0]) - min([*points, 0])  # an unplaced pod scores 0
            total += n * max(reach, POINTS) + sum(w for _, w in _self_terms(inst, gi)) * n * (n - 1) // 2
    for (a, b, _), weight in _cross(inst).items():
        n = len(inst.groups[a].pods)
        total += abs(weight) * n * (len(inst.groups[b].pods) if b != a else n - 1)
    return total


def _points(inst: Instance, gi: int, mine: Sequence[int]) -> dict[int, int]:
    """Per candidate ``mine`` of group ``gi``, its points: the node affinity and pod affinity score
    normalised to 0..``POINTS`` over the candidates, plus 0..``TAINT_POINTS`` for the fewest
    untolerated PreferNoSchedule taints, less the anti-affinity weight of the pods already in
    the node's domain, counted in full (as the batch's own pairs are) above the least any
    candidate has."""
    group = inst.groups[gi]
    shape, pod = group.shape, group.pods[0]
    state = inst.state
    nodes = [inst.candidates[ci].node for ci in mine]
    scores = state.cluster.preference_scores(shape.preferred_nodes)[nodes]
    together = state.apart_penalty(pod, [(-w, t) for w, t in shape.preferred_together])
    if together is not None:
        scores = scores - together[nodes]
    theirs = state.wished(pod) if inst.identities else None
    if theirs is not None:  # placed pods' terms that select it: affinity normalised with its own
        scores = scores - np.minimum(theirs[nodes], 0)
    lo, hi = (int(scores.min()), int(scores.max())) if nodes else (0, 0)
    points = [(int(s) - lo) * POINTS // (hi - lo) if hi > lo else 0 for s in scores]
    avoided = state.cluster.avoided(shape.tolerations)
    if avoided is not None and nodes:
        bad = avoided[nodes]
        most = int(bad.max())
        if most:  # as kube-scheduler normalises it: the full range at none, nothing at the most
            points = [p + (most - int(b)) * TAINT_POINTS // most for p, b in zip(points, bad, strict=True)]
    apart = state.apart_penalty(pod, shape.preferred_apart)
    if theirs is not None:  # and their anti-affinity in full, as its own
        apart = np.maximum(theirs, 0) if apart is None else apart + np.maximum(theirs, 0)
    if apart is not None:
        counted = apart[nodes]
        points = [p - int(c) + int(counted.min()) for p, c in zip(points, counted, strict=True)]
    return dict(zip(mine, points, strict=True))


def stake(inst: Instance, w: Weights) -> int:
    """``swing`` points at ``preferred_affinity`` each."""
    return w.preferred_affinity * swing(inst) if w.preferred_affinity else 0


def build(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> cp_model.LinearExprT:
    """preferred_affinity * (normalised node points - weight per pair sharing a domain: replicas
    of one group, or pods of two groups whose terms weigh each other, or replicas drawn together)."""
    if not w.preferred_affinity:
        return 0
    cl = inst.state.cluster
    terms: list[cp_model.LinearExprT] = []
    for gi, group in enumerate(inst.groups):
        shape = group.shape
        if not wishes(inst, gi):
            continue
        mine = v.by_group[gi]
        for ci, pts in _points(inst, gi, mine).items():
            if pts:
                terms.append(w.preferred_affinity * pts * v.x[ci])
        for ti, weight in _self_terms(inst, gi):
            key = shape.preferred_apart[ti][1].topology_key
            by_domain: dict[str, list[int]] = defaultdict(list)
            for ci in mine:
                value = cl.nodes[inst.candidates[ci].node].labels.get(key)
                if value is not None:
                    by_domain[value].append(ci)
            for value, here in by_domain.items():
                most = min(sum(inst.candidates[ci].ub for ci in here), len(group.pods))
                if most < 2:
                    continue
                pairs = model.new_int_var(0, most * (most - 1) // 2, f"ap{gi}_{ti}_{value}")
                k = sum(v.x[ci] for ci in here)
                for j in range(1, most):  # k(k-1)/2 is convex: the largest of its chords at 1..most-1
                    model.add(pairs >= j * k - j * (j + 1) // 2)
                v.apart_pairs[gi, ti, value] = (pairs, tuple(here))
                terms.append(-w.preferred_affinity * weight * pairs)
    terms.extend(_cross_terms(inst, model, v, w))
    return sum(terms)


def _cross_terms(inst: Instance, model: cp_model.CpModel, v: Vars, w: Weights) -> list[cp_model.LinearExprT]:
    """Per pair of groups whose preferred terms weigh each other, and per domain both may use: the
    product of their pod counts there, at the terms' summed weight (a penalty for anti-affinity,
    a reward for affinity), as kube-scheduler, placing the later pod, would score the pair.  A
    group drawn to its own pods: the square of its count there less the count (its ordered pairs)."""
    cl = inst.state.cluster
    out: list[cp_model.LinearExprT] = []
    budget = CROSS_DOMAINS
    by_domain: dict[tuple[int, str], dict[str, list[int]]] = {}  # (group, key) -> its candidates per value
    counted: dict[tuple[int, str, str], tuple[cp_model.IntVar, int]] = {}  # a group's pods in a domain
    weighed = _cross(inst)
    order = sorted(weighed, key=lambda k: -abs(weighed[k]) * len(inst.groups[k[0]].pods) * len(inst.groups[k[1]].pods))
    for a, b, key in order:
        for gi in (a, b):
            if (gi, key) not in by_domain:
                here: dict[str, list[int]] = defaultdict(list)
                for ci in v.by_group[gi]:
                    value = cl.nodes[inst.candidates[ci].node].labels.get(key)
                    if value is not None:
                        here[value].append(ci)
                by_domain[gi, key] = here
        mine, theirs = by_domain[a, key], by_domain[b, key]
        shared = sorted(mine.keys() & theirs.keys())
        if len(shared) > budget:
            continue
        budget -= len(shared)
        for value in shared:
            counts: list[tuple[cp_model.IntVar, int]] = []
            for gi, cands in ((a, mine[value]), (b, theirs[value])):
                if (gi, key, value) not in counted:
                    most = min(sum(inst.candidates[ci].ub for ci in cands), len(inst.groups[gi].pods))
                    k = model.new_int_var(0, most, f"xk{gi}_{key}_{value}")
                    model.add(k == sum(v.x[ci] for ci in cands))
                    counted[gi, key, value] = (k, most)
                counts.append(counted[gi, key, value])
            (ka, most_a), (kb, most_b) = counts
            pairs = model.new_int_var(0, most_a * most_b, f"xp{a}_{b}_{value}")
            model.add_multiplication_equality(pairs, [ka, kb])
            v.cross_pairs[a, b, key, value] = (pairs, ka, kb, tuple(mine[value]), tuple(theirs[value]))
            out.append(-w.preferred_affinity * weighed[a, b, key] * (pairs if b != a else pairs - ka))
    return out
