"""Which running pods a pending pod of higher priority evicts, and where it then goes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod
from gpusched.model.affinity import PodAffinityTerm, Requirement
from gpusched.solver.preempt import Budget, find_preemption, harm, plan_preemptions, through_room
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod


def running(name: str, node: int, gpus: tuple[int, ...], priority: int, **kw: object) -> Assignment:
    return Assignment(replace(pod(name, gpus=len(gpus)), priority=priority, **kw), node, gpus)  # type: ignore[arg-type]


def state_of(cluster: Cluster, placed: list[Assignment]) -> ClusterState:
    return cluster.empty_state().apply(placed)


def check_room(state: ClusterState, found_victims: tuple[Assignment, ...], placement: Assignment) -> None:
    """Once the victims are gone, the pod fits where the preemption says, on the GPUs it names."""
    after = state.release(found_victims)
    validate_plan(Plan((placement,), ()), after, [placement.pod])


def urgent(name: str = "urgent", gpus: int = 1, priority: int = 10) -> Pod:
    return replace(pod(name, gpus=gpus), priority=priority)


def test_the_fewest_pods_of_lower_priority_are_evicted_and_the_others_reprieved() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    placed = [running("low-0", 0, (0,), 0), running("low-1", 0, (1,), 5), running("high", 1, (0, 1), 100)]
    state = state_of(c, placed)
    found = find_preemption(urgent(), state, placed)
    assert found is not None
    assert found.node == 0
    assert [v.pod.name for v in found.victims] == ["low-0"]  # low-1 ranks higher: reprieved first
    assert found.placement.gpus == (0,)
    check_room(state, found.victims, found.placement)


def test_no_preemption_without_a_pod_of_lower_priority_or_when_the_pod_may_not_preempt() -> None:
    c = Cluster([gpu_node("a", gpus=1)])
    equal = [running("peer", 0, (0,), 10)]
    assert find_preemption(urgent(), state_of(c, equal), equal) is None
    lower = [running("low", 0, (0,), 0)]
    assert find_preemption(replace(urgent(), preempts=False), state_of(c, lower), lower) is None
    # A pod being deleted already is no victim: its room is on its way.
    leaving = [running("low", 0, (0,), 0, terminating=True)]
    assert find_preemption(urgent(), state_of(c, leaving), leaving) is None
    # Evicting everything of lower priority would still not make room.
    assert find_preemption(urgent(gpus=2), state_of(c, lower), lower) is None


def test_a_pod_held_to_a_node_by_its_volume_preempts_only_there() -> None:
    c = Cluster(
        [replace(gpu_node("a", gpus=1), labels={"zone": "a"}), replace(gpu_node("b", gpus=1), labels={"zone": "b"})]
    )
    placed = [running("cheap", 0, (0,), 0), running("dear", 1, (0,), 5)]
    state = state_of(c, placed)
    free = find_preemption(urgent(), state, placed)
    assert free is not None
    assert free.node == 0
    held = replace(urgent(), volume_selector=((Requirement("zone", "In", ("b",)),),))
    found = find_preemption(held, state, placed)
    assert found is not None
    assert found.node == 1
    assert [v.pod.name for v in found.victims] == ["dear"]
    check_room(state, found.victims, found.placement)
    nowhere = replace(urgent(), volume_selector=((Requirement("zone", "In", ("c",)),),))
    assert find_preemption(nowhere, state, placed) is None  # evicting would not let it in anywhere


def test_the_node_whose_most_important_victim_matters_least_wins_then_the_fewest_victims() -> None:
    c = Cluster([gpu_node("a", gpus=1), gpu_node("b", gpus=1), gpu_node("c", gpus=2)])
    placed = [
        running("mid", 0, (0,), 5),
        running("low", 1, (0,), 1),
        running("tiny-0", 2, (0,), 0),
        running("tiny-1", 2, (1,), 0),
    ]
    state = state_of(c, placed)
    found = find_preemption(urgent(), state, placed)
    assert found is not None
    # c: one victim of priority 0 (the other reprieved: of equal priority, by name) beats b
    # (priority 1) and a (priority 5).
    assert (found.node, [v.pod.name for v in found.victims]) == (2, ["tiny-1"])
    two = find_preemption(urgent(gpus=2), state, placed)
    assert two is not None
    assert (two.node, sorted(v.pod.name for v in two.victims)) == (2, ["tiny-0", "tiny-1"])
    check_room(state, two.victims, two.placement)


def test_fewer_victims_win_over_more_of_lower_priority_as_in_kube_scheduler() -> None:
    # a: victims of 1000, 0 and 0 (three pods); b: two of 1000.  kube-scheduler sums
    # priority + 2^31 per victim, so b's two victims beat a's three though their sum is higher.
    c = Cluster([gpu_node("a", gpus=3), gpu_node("b", gpus=3)])
    two = replace(pod("b-two", gpus=2), priority=1000)
    placed = [
        running("a-1000", 0, (0,), 1000),
        running("a-0", 0, (1,), 0),
        running("a-00", 0, (2,), 0),
        Assignment(two, 1, (0, 1)),
        running("b-1000", 1, (2,), 1000),
    ]
    state = state_of(c, placed)
    found = find_preemption(urgent(gpus=3, priority=2000), state, placed)
    assert found is not None
    assert (found.node, sorted(v.pod.name for v in found.victims)) == (1, ["b-1000", "b-two"])


def test_a_disruption_budget_steers_preemption_to_pods_it_does_not_protect() -> None:
    # a's pod is protected (its budget allows no disruption); b's pod of higher priority is not:
    # kube-scheduler counts budget violations before priorities.
    c = Cluster([gpu_node("a", gpus=1), gpu_node("b", gpus=1)])
    web = (("app", "web"),)
    placed = [running("web-0", 0, (0,), 0, labels=web), running("batch-0", 1, (0,), 5)]
    state = state_of(c, placed)
    guard = Budget("default", (Requirement("app", "In", ("web",)),), allowed=0)
    found = find_preemption(urgent(), state, placed, budgets=[guard])
    assert found is not None
    assert ([v.pod.name for v in found.victims], found.violations) == (["batch-0"], 0)
    # A budget with room, one that counted the pod already, or one with an empty selector
    # protects nothing: the lowest priority goes.
    for loose in (
        replace(guard, allowed=1),
        replace(guard, disrupted=frozenset({"web-0"})),
        replace(guard, selector=()),
    ):
        found = find_preemption(urgent(), state, placed, budgets=[loose])
        assert found is not None
        assert ([v.pod.name for v in found.victims], found.violations) == (["web-0"], 0)
    # When every way breaks a budget, one is broken, and said so.
    only = [placed[0]]
    found = find_preemption(urgent(), state_of(c, only), only, budgets=[guard])
    assert found is not None
    assert ([v.pod.name for v in found.victims], found.violations) == (["web-0"], 1)


def test_a_pod_without_labels_is_protected_by_no_budget_as_kube_scheduler_reads_them() -> None:
    # The budget selects the pods without a "tier" label.  kube-scheduler's preemption matches
    # no budget to a pod with no labels at all, so of two pods alike but for that, the bare one
    # goes, breaking nothing; the labelled one, on the first node, is protected.
    c = Cluster([gpu_node("a", gpus=1), gpu_node("b", gpus=1)])
    placed = [running("labelled", 0, (0,), 0, labels=(("app", "x"),)), running("bare", 1, (0,), 0)]
    for selector in ((Requirement("tier", "DoesNotExist"),), (Requirement("tier", "NotIn", ("x",)),)):
        budget = Budget("default", selector, 0)
        found = find_preemption(urgent(), state_of(c, placed), placed, budgets=[budget])
        assert found is not None
        assert ([v.pod.name for v in found.victims], found.violations) == (["bare"], 0)
        # Alone, the labelled one is evicted all the same, breaking the budget.
        only = placed[:1]
        found = find_preemption(urgent(), state_of(c, only), only, budgets=[budget])
        assert found is not None
        assert ([v.pod.name for v in found.victims], found.violations) == (["labelled"], 1)


def test_budgets_spent_by_one_preemption_count_for_the_next() -> None:
    # One disruption allowed among three web pods on three nodes: the first preemptor takes it,
    # the second breaks the budget only because nothing else is left.
    c = Cluster([gpu_node(n, gpus=1) for n in "abc"])
    web = (("app", "web"),)
    placed = [running(f"web-{i}", i, (0,), 0, labels=web) for i in range(2)] + [running("batch", 2, (0,), 1)]
    guard = Budget("default", (Requirement("app", "In", ("web",)),), allowed=1)
    found = plan_preemptions([urgent("u0"), urgent("u1"), urgent("u2")], state_of(c, placed), placed, budgets=[guard])
    assert [(p.pod.name, [v.pod.name for v in p.victims], p.violations) for p in found] == [
        ("u0", ["web-0"], 0),
        ("u1", ["batch"], 0),
        ("u2", ["web-1"], 1),
    ]


def test_a_fractional_pod_is_given_the_share_that_frees() -> None:
    c = Cluster([gpu_node("a", gpus=2)])
    placed = [
        Assignment(replace(pod("half-low", gpus=1, milli=500), priority=0), 0, (0,)),
        Assignment(replace(pod("half-high", gpus=1, milli=600), priority=50), 0, (0,)),
        running("whole-high", 0, (1,), 50),
    ]
    state = state_of(c, placed)
    share = replace(pod("share", gpus=1, milli=400), priority=10)
    found = find_preemption(share, state, placed)
    assert found is not None
    assert [v.pod.name for v in found.victims] == ["half-low"]
    assert found.placement.gpus == (0,)
    check_room(state, found.victims, found.placement)


def test_anti_affinity_of_a_running_pod_of_lower_priority_is_evicted_with_it() -> None:
    # The pod fits on a by resources, but a running pod's anti-affinity keeps it out: evicting
    # that pod is what makes room.
    c = Cluster([replace(gpu_node("a", gpus=4), labels={"kubernetes.io/hostname": "a"})])
    away = PodAffinityTerm((Requirement("app", "In", ("web",)),), None, "kubernetes.io/hostname")
    placed = [running("loner", 0, (0,), 0, anti_affinity=(away,)), running("other", 0, (1,), 0)]
    state = state_of(c, placed)
    web = replace(urgent(), labels=(("app", "web"),))
    found = find_preemption(web, state, placed)
    assert found is not None
    assert [v.pod.name for v in found.victims] == ["loner"]
    check_room(state, found.victims, found.placement)


def test_two_pods_never_share_victims_nor_the_room_they_leave() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=1)])
    placed = [running("low-0", 0, (0,), 0), running("low-1", 0, (1,), 0), running("low-2", 1, (0,), 3)]
    state = state_of(c, placed)
    found = plan_preemptions([urgent("u0"), urgent("u1", priority=20), urgent("u2")], state, placed)
    # Three pods, three GPUs of lower priority: each pod evicts one, the most urgent first.
    assert [p.pod.name for p in found] == ["u1", "u0", "u2"]
    victims = [v.pod.name for p in found for v in p.victims]
    assert sorted(victims) == ["low-0", "low-1", "low-2"]
    assert len({(p.node, p.placement.gpus) for p in found}) == 3
    everything = state.release([v for p in found for v in p.victims])
    validate_plan(Plan(tuple(p.placement for p in found), ()), everything, [p.pod for p in found])
    # A fourth finds nothing left to evict.
    assert len(plan_preemptions([urgent(f"u{i}") for i in range(4)], state, placed)) == 3


@st.composite
def crowded(draw: st.DrawFn) -> tuple[ClusterState, list[Assignment], Pod]:
    """Small full-ish clusters of pods of priority 0-3 (whole GPUs and shares), and a pod of 0-4."""
    nodes = [gpu_node(f"n{i}", gpus=draw(st.integers(1, 4)), cpu=4000) for i in range(draw(st.integers(1, 5)))]
    cluster = Cluster(nodes)
    placed: list[Assignment] = []
    for n, node in enumerate(nodes):
        for g in range(node.gpu_count):
            for k in range(draw(st.integers(0, 2))):
                milli = draw(st.sampled_from([1000, 500, 300])) if k == 0 else 300
                p = replace(pod(f"r{n}-{g}-{k}", cpu=500, gpus=1, milli=milli), priority=draw(st.integers(0, 3)))
                placed.append(Assignment(p, n, (g,)))
                if milli == 1000:
                    break
    state = cluster.empty_state().apply(placed)
    gpus = draw(st.sampled_from([1, 1, 2]))
    milli = draw(st.sampled_from([1000, 400])) if gpus == 1 else 1000
    new = replace(
        pod("new", cpu=draw(st.sampled_from([500, 3000])), gpus=gpus, milli=milli), priority=draw(st.integers(0, 4))
    )
    return state, placed, new


@settings(max_examples=300, deadline=None)
@given(crowded())
def test_a_preemption_evicts_only_lower_priority_makes_room_and_spares_every_pod_it_can(
    case: tuple[ClusterState, list[Assignment], Pod],
) -> None:
    state, placed, new = case
    found = find_preemption(new, state, placed)
    if found is None:
        # Nowhere does evicting every pod of lower priority from one node make room.
        for n in range(len(state.cluster)):
            lower = [a for a in placed if a.node == n and a.pod.priority < new.priority]
            assert not (lower and state.release(lower).pod_mask(new)[n] and not state.pod_mask(new)[n])
        return
    assert found.victims
    assert all(v.node == found.node and v.pod.priority < new.priority for v in found.victims)
    check_room(state, found.victims, found.placement)
    after = state.release(found.victims)
    for v in found.victims:  # each victim is needed: put back, the pod no longer fits there
        assert not after.apply([v]).pod_mask(new)[found.node], v.pod.name


@settings(max_examples=200, deadline=None)
@given(crowded(), st.integers(0, 4), st.sampled_from([1, 2]))
def test_several_preemptions_never_share_a_victim_and_all_fit_together(
    case: tuple[ClusterState, list[Assignment], Pod], priority: int, gpus: int
) -> None:
    state, placed, new = case
    pods = [new, replace(new, name="new-2", priority=priority), replace(pod("new-3", gpus=gpus), priority=priority)]
    found = plan_preemptions(pods, state, placed)
    gone = [v for p in found for v in p.victims]
    assert len({id(v) for v in gone}) == len(gone)
    assert all(v.pod.priority < p.pod.priority for p in found for v in p.victims)
    validate_plan(Plan(tuple(p.placement for p in found), ()), state.release(gone), [p.pod for p in found])
    # Each search sees the ones before it: alone, the first one finds the same.
    if found:
        first = find_preemption(found[0].pod, state, placed)
        assert first is not None
        assert (first.node, first.victims) == (found[0].node, found[0].victims)


def _plain_search(pod: Pod, state: ClusterState, running: list[Assignment]) -> tuple[int, list[str]] | None:
    """The search written plainly: a fresh state per trial, every node examined, no early stop."""
    best: tuple[tuple[int, int, int, int], int, list[str]] | None = None
    for node in range(len(state.cluster)):
        lower = sorted(
            (a for a in running if a.node == node and a.pod.priority < pod.priority),
            key=lambda a: (-a.pod.priority, a.pod.key),
        )
        room = state.release(lower)
        if not lower or not room.pod_mask(pod)[node]:
            continue
        victims = []
        for a in lower:
            back = room.apply([a])
            if back.pod_mask(pod)[node]:
                room = back
            else:
                victims.append(a)
        if victims:
            prio = [v.pod.priority for v in victims]
            key = (max(prio), sum(p + 2**31 for p in prio), len(prio), node)
            if best is None or key < best[0]:
                best = (key, node, sorted(v.pod.name for v in victims))
    return None if best is None else (best[1], best[2])


@settings(max_examples=300, deadline=None)
@given(crowded())
def test_the_search_in_place_with_its_early_stop_finds_what_the_plain_search_finds(
    case: tuple[ClusterState, list[Assignment], Pod],
) -> None:
    state, placed, new = case
    found = find_preemption(new, state, placed)
    assert (None if found is None else (found.node, sorted(v.pod.name for v in found.victims))) == _plain_search(
        new, state, placed
    )


def test_a_preemption_that_counted_on_a_dropped_ones_victims_is_dropped_too() -> None:
    # Node a: 2 GPUs, 8 CPUs.  v (priority 1) holds 800 of GPU 0 and 6 CPUs, s (priority 100)
    # the rest of GPU 0; w (priority 2) holds GPU 1.  p1 evicts v for a share of GPU 0; p2 then
    # evicts w for GPU 1, counting on the CPUs v frees.  Should p1's preemption be dropped (its
    # GPU turns out busy), p2's must go too: with only w gone, p2 does not fit.
    from gpusched.model import Node
    from gpusched.solver.preempt import still_standing

    cl = Cluster([Node("a", 8000, 32768, gpu_count=2, gpu_model="A100")])

    def p(name: str, prio: int, milli: int, cpu: int) -> Pod:
        return Pod(name, cpu, 100, num_gpu=1, gpu_milli=milli, priority=prio, uid=name)

    v = Assignment(p("v", 1, 800, 6000), 0, (0,))
    s = Assignment(p("s", 100, 200, 100), 0, (0,))
    w = Assignment(p("w", 2, 1000, 100), 0, (1,))
    state = cl.empty_state().apply([v, s, w])
    found = plan_preemptions([p("p1", 100, 500, 1000), p("p2", 50, 1000, 4000)], state, [v, s, w])
    assert [(f.pod.name, [x.pod.name for x in f.victims]) for f in found] == [("p1", ["v"]), ("p2", ["w"])]
    assert still_standing(found, state) == found  # together they hold
    assert still_standing(found[1:], state) == []  # p2 alone would evict w for nothing


def test_a_pod_whose_affinity_needs_a_peer_of_lower_priority_elsewhere_still_finds_room() -> None:
    """Its peer (priority 0, on b) may not be evicted in one's mind with every other pod of
    lower priority: evicting only "batch" on a leaves the peer in the zone, as kube-scheduler finds."""
    zone = {"zone": "z1"}
    cluster = Cluster([replace(gpu_node(n, gpus=1), labels={**zone, "kubernetes.io/hostname": n}) for n in "ab"])
    peer = running("cache", 1, (0,), 0, labels=(("app", "cache"),))
    blocker = running("batch", 0, (0,), 0)
    near = PodAffinityTerm((Requirement("app", "In", ("cache",)),), None, "zone")
    found = find_preemption(replace(urgent(), affinity=(near,)), state_of(cluster, [peer, blocker]), [peer, blocker])
    assert found is not None
    assert (found.node, [v.pod.name for v in found.victims]) == (0, ["batch"])


def test_a_pod_whose_spread_counts_pods_of_lower_priority_elsewhere_still_finds_room() -> None:
    from gpusched.model.affinity import Spread
    from gpusched.model.node import Taint

    web = (("app", "web"),)
    cluster = Cluster(
        [
            replace(gpu_node("a", gpus=2), labels={"zone": "z1"}),
            replace(gpu_node("b", gpus=1), labels={"zone": "z2"}, taints=(Taint("dedicated", "x", "NoSchedule"),)),
        ]
    )
    placed = [
        running("w-high", 0, (0,), 100, labels=web),
        running("blocker", 0, (1,), 0),
        running("w-low", 1, (0,), 0, labels=web),  # z2's one: all gone at once, z1 would be over-full
    ]
    even = Spread(1, "zone", (Requirement("app", "In", ("web",)),), "default")
    found = find_preemption(replace(urgent(priority=50), labels=web, spread=(even,)), state_of(cluster, placed), placed)
    assert found is not None
    assert (found.node, [v.pod.name for v in found.victims]) == (0, ["blocker"])


def test_of_victims_of_equal_priority_the_one_that_started_last_is_evicted() -> None:
    """Kept first is the pod that has run longest (the least work lost), whatever the names."""
    c = Cluster([gpu_node("a", gpus=2)])
    placed = [running("a-young", 0, (0,), 0, started=2_000.0), running("b-old", 0, (1,), 0, started=1_000.0)]
    found = find_preemption(urgent(), state_of(c, placed), placed)
    assert found is not None
    assert [v.pod.name for v in found.victims] == ["a-young"]
    placed = [running("a-old", 0, (0,), 0, started=1_000.0), running("b-young", 0, (1,), 0, started=2_000.0)]
    found = find_preemption(urgent(), state_of(c, placed), placed)
    assert found is not None
    assert [v.pod.name for v in found.victims] == ["b-young"]


def test_between_nodes_alike_in_their_victims_the_one_whose_victims_started_last_is_chosen() -> None:
    """Two victims a node (a node where one pod of the lowest priority makes room ends the search
    at once, whenever it started)."""
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    placed = [
        running("a0", 0, (0,), 0, started=1_000.0),
        running("a1", 0, (1,), 0, started=4_000.0),
        running("b0", 1, (0,), 0, started=3_000.0),
        running("b1", 1, (1,), 0, started=3_500.0),
    ]
    found = find_preemption(urgent(gpus=2), state_of(c, placed), placed)
    assert found is not None
    assert sorted(v.pod.name for v in found.victims) == ["b0", "b1"]  # a0 started first of all


def test_of_nodes_where_one_pod_of_the_lowest_priority_makes_room_the_one_whose_pod_started_last_wins() -> None:
    """The search may stop early at such a node, but not before a node whose one victim started
    later: less work is lost there, wherever it comes in the cluster's order."""
    c = Cluster([gpu_node(n, gpus=1) for n in "abcd"])
    placed = [
        running("a-old", 0, (0,), 0, started=1_000.0),
        running("b-older", 1, (0,), 0, started=500.0),
        running("c-young", 2, (0,), 0, started=3_000.0),
        running("d-mid", 3, (0,), 0, started=2_000.0),
    ]
    found = find_preemption(urgent(), state_of(c, placed), placed)
    assert found is not None
    assert (found.node, [v.pod.name for v in found.victims]) == (2, ["c-young"])
    placed[3] = running("d-new", 3, (0,), 0)  # bound, not started yet: nothing of it is lost
    found = find_preemption(urgent(), state_of(c, placed), placed)
    assert found is not None
    assert (found.node, [v.pod.name for v in found.victims]) == (3, ["d-new"])


def test_through_a_room_a_pod_fits_as_things_are_or_evicts_only_on_that_node() -> None:
    """``state`` as the daemon gives it: the room taken over free, its victims gone."""
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    placed = [running("low", 0, (0,), 0), running("lower", 1, (0, 1), -5)]
    state = state_of(c, placed)
    fits = through_room(urgent(), state, placed, 0)
    assert fits is not None
    assert (fits.node, fits.victims, fits.placement.gpus) == (0, (), (1,))
    evicts = through_room(urgent(gpus=2), state, placed, 0)  # node b would harm less: not offered
    assert evicts is not None
    assert (evicts.node, [v.pod.name for v in evicts.victims]) == (0, ["low"])
    check_room(state, evicts.victims, evicts.placement)
    assert harm(fits) < harm(evicts)
    assert through_room(urgent(gpus=2, priority=0), state, placed, 0) is None  # low is not below it
