"""Room for a whole gang at once: which running pods of lower priority its members evict."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import Assignment, Cluster, ClusterState, Node, Plan, Pod
from gpusched.model.pod import Gang
from gpusched.solver.preempt import Preemption, find_gang_preemption, find_preemption, gang_budgets, plan_preemptions
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod
from tests.solver.test_preempt import running, state_of, urgent


def members(n: int, gpus: int = 1, priority: int = 10, **gang: object) -> list[Pod]:
    g = Gang("train", min_members=n, **gang)  # type: ignore[arg-type]
    return [replace(pod(f"m{i}", gpus=gpus), priority=priority, gang=g) for i in range(n)]


def regang(gang: list[Pod], **change: str) -> list[Pod]:
    """The same members, their gang's rules changed."""
    g = gang[0].gang
    assert g is not None
    return [replace(m, gang=replace(g, **change)) for m in gang]  # type: ignore[arg-type]


def racked(name: str, rack: str, gpus: int = 2) -> Node:
    return replace(gpu_node(name, gpus=gpus), labels={"rack": rack})


def two_racks(priorities: tuple[int, int, int, int], a0_gpus: int = 2) -> tuple[ClusterState, list[Assignment]]:
    """Racks a (a0, a1) and b (b0, b1) of 2-GPU nodes (a0 of ``a0_gpus``), each node running one
    2-GPU pod (a-0, a-1, b-0, b-1) of ``priorities``."""
    c = Cluster([racked("a0", "a", gpus=a0_gpus), racked("a1", "a"), racked("b0", "b"), racked("b1", "b")])
    placed = [running(f"{'aabb'[i]}-{i % 2}", i, (0, 1), prio) for i, prio in enumerate(priorities)]
    return state_of(c, placed), placed


def check(state: ClusterState, found: list[Preemption], gang: list[Pod]) -> list[str]:
    """Every member placed, beside the others, once every victim is gone; the victims' names."""
    assert sorted(p.pod.name for p in found) == sorted(m.name for m in gang)
    victims = [v for p in found for v in p.victims]
    assert len({id(v) for v in victims}) == len(victims)
    assert all(v.pod.priority < min(m.priority for m in gang) for v in victims)
    validate_plan(Plan(tuple(p.placement for p in found), ()), state.release(victims), gang)
    return sorted(v.pod.name for v in victims)


def test_every_member_gets_room_and_only_the_pods_in_the_way_go() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2), gpu_node("c", gpus=2)])
    placed = [
        running("low-a", 0, (0, 1), 0),
        running("low-b", 1, (0, 1), 1),
        running("vip", 2, (0, 1), 100),
    ]
    state = state_of(c, placed)
    gang = members(2, gpus=2)
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["low-a", "low-b"]


def test_no_pod_is_evicted_for_part_of_a_gang() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2), gpu_node("c", gpus=2)])
    placed = [running("low-a", 0, (0, 1), 0), running("low-b", 1, (0, 1), 0), running("vip", 2, (0, 1), 100)]
    state = state_of(c, placed)
    # Three members of two GPUs: two could have room, the third never: no one is evicted.
    assert find_gang_preemption(members(3, gpus=2), state, placed) is None
    # Fewer members than the gang's minimum: the rest have not arrived.
    assert find_gang_preemption(members(2, gpus=2)[:1], state, placed) is None
    # A member that may not preempt holds the gang back.
    polite = members(2, gpus=2)
    polite[1] = replace(polite[1], preempts=False)
    assert find_gang_preemption(polite, state, placed) is None


def test_without_room_for_every_member_a_gang_gets_room_for_its_cheapest_minimum() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2), gpu_node("c", gpus=2)])
    placed = [running("low-a", 0, (0, 1), 0), running("low-b", 1, (0, 1), 0), running("vip", 2, (0, 1), 100)]
    state = state_of(c, placed)
    g = Gang("train", min_members=2)
    gang = [replace(pod(f"m{i}", gpus=gpus), priority=10, gang=g) for i, gpus in enumerate((3, 1, 2))]
    # No node takes m0's 3 GPUs: no room for all three, but for the two cheapest, beside each other.
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert sorted(p.pod.name for p in found) == ["m1", "m2"]
    victims = [v for p in found for v in p.victims]
    assert len(victims) == 2  # m2's 2 GPUs and m1's 1 are on two nodes: a and b
    validate_plan(Plan(tuple(p.placement for p in found), ()), state.release(victims), gang[1:])
    # Where room can be made for all three, all three get it, not only its minimum.
    small = [replace(m, num_gpu=1) for m in gang]
    found = find_gang_preemption(small, state, placed)
    assert found is not None
    assert sorted(p.pod.name for p in found) == ["m0", "m1", "m2"]


def test_a_member_that_fits_as_things_are_evicts_no_one() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    placed = [running("low", 0, (0, 1), 0)]
    state = state_of(c, placed)
    gang = members(2, gpus=2)
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["low"]
    assert sorted(len(p.victims) for p in found) == [0, 1]
    # The whole gang fits as things are: nothing to preempt.
    assert find_gang_preemption(members(2, gpus=1), state, placed) is None


def test_a_required_domain_is_freed_whole_where_the_victims_matter_least() -> None:
    state, placed = two_racks((5, 5, 0, 1))
    gang = members(2, gpus=2, topology_key="rack", topology="required")
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["b-0", "b-1"]
    # Members already run in rack a: the rest go there, whatever it costs.
    held = regang(gang, domain="a")
    found = find_gang_preemption(held, state, placed)
    assert found is not None
    assert check(state, found, held) == ["a-0", "a-1"]
    # One rack cannot hold three such members: none is evicted anywhere.
    assert find_gang_preemption(members(3, gpus=2, topology_key="rack", topology="required"), state, placed) is None


def test_a_preferred_domain_gives_way_to_less_harm_across_domains() -> None:
    state, placed = two_racks((0, 5, 0, 5))
    gang = members(2, gpus=2, topology_key="rack", topology="preferred")
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["a-0", "b-0"]  # no priority-5 pod goes
    # At equal harm, one domain: not the first two nodes in order, which are in two.
    c = Cluster([racked("n0", "a"), racked("n1", "b"), racked("n2", "a"), racked("n3", "b")])
    placed = [running(f"low-{i}", i, (0, 1), 0) for i in range(4)]
    state = state_of(c, placed)
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["low-0", "low-2"]


@st.composite
def racks(draw: st.DrawFn) -> tuple[ClusterState, list[Assignment], list[Pod]]:
    """Small crowded clusters in two racks, pods of priority 0-3, and a gang of 2-4 of 0-4."""
    nodes = [
        replace(gpu_node(f"n{i}", gpus=draw(st.integers(1, 4)), cpu=4000), labels={"rack": "ab"[i % 2]})
        for i in range(draw(st.integers(1, 6)))
    ]
    placed: list[Assignment] = []
    for n, node in enumerate(nodes):
        for g in range(node.gpu_count):
            if draw(st.booleans()):
                milli = draw(st.sampled_from([1000, 500]))
                p = replace(pod(f"r{n}-{g}", cpu=500, gpus=1, milli=milli), priority=draw(st.integers(0, 3)))
                placed.append(Assignment(p, n, (g,)))
    topology = draw(st.sampled_from(["", "required", "preferred"]))
    size = draw(st.integers(2, 4))
    gang = members(size, gpus=draw(st.integers(1, 2)), priority=draw(st.integers(0, 4)))
    gang = [replace(m, priority=m.priority + draw(st.sampled_from([0, 0, 2]))) for m in gang]  # some mixed
    if topology:
        gang = regang(gang, topology_key="rack", topology=topology)
    return Cluster(nodes).empty_state().apply(placed), placed, gang


@settings(max_examples=300, deadline=None)
@given(racks())
def test_a_gang_preemption_frees_room_for_all_members_together_or_evicts_no_one(
    case: tuple[ClusterState, list[Assignment], list[Pod]],
) -> None:
    state, placed, gang = case
    found = find_gang_preemption(gang, state, placed)
    if found is None:
        return
    assert any(p.victims for p in found)
    check(state, found, gang)


def test_with_every_lower_pod_gone_a_gang_that_fits_always_finds_room() -> None:
    # The search is greedy member by member, but on empty-able nodes of one shape it cannot miss.
    c = Cluster([gpu_node(f"n{i}", gpus=2) for i in range(4)])
    placed = [running(f"low-{i}-{g}", i, (g,), i % 2) for i in range(4) for g in range(2)]
    state = state_of(c, placed)
    for size in (1, 2, 3, 4):
        gang = members(size, gpus=2)
        found = find_gang_preemption(gang, state, placed)
        assert found is not None, size
        victims = check(state, found, gang)
        assert len(victims) == 2 * size
        # Pods of priority 0 go before those of priority 1.
        assert sum(int(v.split("-")[1]) % 2 for v in victims) == max(0, size - 2) * 2


def test_gangs_and_pods_preempt_in_priority_order_never_sharing_a_victim() -> None:
    c = Cluster([gpu_node(f"n{i}", gpus=2) for i in range(3)])
    placed = [running(f"low-{i}", i, (0, 1), i) for i in range(3)]
    for first, second in ((20, 10), (10, 20)):
        state = state_of(c, placed)
        before = state.gpu_free.copy()
        gang = members(2, gpus=2, priority=first)
        single = replace(pod("solo", gpus=2), priority=second)
        found = plan_preemptions([single], state, placed, gangs=[gang])
        assert (state.gpu_free == before).all()  # the caller's state is left as it was
        assert sorted(p.pod.name for p in found) == ["m0", "m1", "solo"]
        victims = [v for p in found for v in p.victims]
        assert sorted(v.pod.name for v in victims) == ["low-0", "low-1", "low-2"]
        validate_plan(Plan(tuple(p.placement for p in found), ()), state.release(victims), [*gang, single])
        # The one that matters more frees the least important pods.
        ahead = {p.pod.name: p for p in found}["solo" if second > first else "m0"]
        assert ahead.victims[0].pod.name in {"low-0", "low-1"}
    # A gang that cannot have room whole evicts no one, and leaves the rest to the pods after it.
    state = state_of(c, placed)
    found = plan_preemptions([replace(pod("solo", gpus=2), priority=5)], state, placed, gangs=[members(4, gpus=2)])
    assert [(p.pod.name, [v.pod.name for v in p.victims]) for p in found] == [("solo", ["low-0"])]


def test_the_search_stops_once_its_domains_hold_enough_candidate_nodes() -> None:
    # Rack a has a free GPU, so it is tried first; rack b's victims matter less.
    state, placed = two_racks((5, 5, 0, 0), a0_gpus=3)
    gang = members(2, gpus=2, topology_key="rack", topology="required")
    found = find_gang_preemption(gang, state, placed)
    assert found is not None
    assert check(state, found, gang) == ["b-0", "b-1"]
    # With a budget of two candidate nodes, rack a alone is enough.
    found = find_gang_preemption(gang, state, placed, min_candidates=2)
    assert found is not None
    assert check(state, found, gang) == ["a-0", "a-1"]


def test_a_running_gang_is_left_its_minimum_as_a_disruption_budget_would_leave_it() -> None:
    c = Cluster([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    job = Gang("ns/job", min_members=2)
    workers = [running(f"w{g}", 0, (g,), 0, gang=job) for g in range(2)]
    others = [running(f"o{g}", 1, (g,), 1) for g in range(2)]
    placed = workers + others
    state = state_of(c, placed)
    budgets = gang_budgets(placed)
    assert [(b.gang, b.allowed) for b in budgets] == [("ns/job", 0)]
    # Evicting a worker would leave the job short: pods of higher priority go instead.
    found = find_preemption(urgent(gpus=2), state, placed, budgets=budgets)
    assert found is not None
    assert (found.node, found.violations) == (1, 0)
    found = find_preemption(urgent(gpus=1), state, placed, budgets=budgets)
    assert found is not None
    assert [v.pod.name for v in found.victims] == ["o1"]
    # A worker beyond the minimum may go; and when every way breaks the job, one is taken.
    spare = [replace(w, pod=replace(w.pod, gang=replace(job, min_members=1))) for w in workers]
    budgets = gang_budgets(spare + others)
    assert [(b.gang, b.allowed) for b in budgets] == [("ns/job", 1)]
    found = find_preemption(urgent(gpus=1), state, spare + others, budgets=budgets)
    assert found is not None
    assert ([v.pod.name for v in found.victims], found.violations) == (["w0"], 0)
    only = find_preemption(urgent(gpus=2), state_of(c, workers), workers, budgets=gang_budgets(workers))
    assert only is not None
    assert (sorted(v.pod.name for v in only.victims), only.violations) == (["w0", "w1"], 2)
    # A gang short of its minimum already, or being deleted, is kept by nothing.
    assert gang_budgets(workers[:1]) == []
    leaving = [replace(w, pod=replace(w.pod, terminating=True)) for w in workers]
    assert gang_budgets(leaving) == []


def _ranked(*named: tuple[str, int]) -> list[Pod]:
    """One-GPU members of one gang, by (name, priority)."""
    g = Gang("train", min_members=len(named))
    return [replace(pod(n, gpus=1), priority=p, gang=g) for n, p in named]


def test_a_gang_preempts_at_its_least_important_members_priority_whatever_the_names() -> None:
    c = Cluster([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)])
    placed = [running("low-0", 0, (0,), 0), running("low-1", 1, (0,), 30)]
    state = state_of(c, placed)
    # The member of 20 may not evict the pod of 30, and so neither may the member of 50.
    assert find_gang_preemption(_ranked(("m1", 50), ("m2", 20)), state, placed) is None
    assert find_gang_preemption(_ranked(("a2", 20), ("m1", 50)), state, placed) is None
    found = find_gang_preemption(_ranked(("m1", 50), ("m2", 40)), state, placed)
    assert found is not None
    assert check(state, found, _ranked(("m1", 50), ("m2", 40))) == ["low-0", "low-1"]
    # Placed at its own priority all the same.
    assert sorted(p.pod.priority for p in found) == [40, 50]


def test_mig_members_do_not_count_one_idle_gpu_twice() -> None:
    a100 = "A100-SXM4-80GB"

    def mig_node(name: str, cpu: int = 64000) -> Node:
        return Node(name, cpu, 262144, gpu_count=1, gpu_model=a100, mig_repartition=True)

    def workers(n: int) -> list[Pod]:
        g = Gang("train", min_members=n)
        return [replace(pod(f"w{i}"), mig_profile="7g.80gb", priority=10, gang=g) for i in range(n)]

    # m's idle GPU holds one 7g.80gb instance: the second member needs b's GPU.
    c = Cluster([mig_node("m"), mig_node("b")])
    placed = [running("low", 1, (0,), 0)]
    state = state_of(c, placed)
    found = find_gang_preemption(workers(2), state, placed)
    assert found is not None
    assert sorted(v.pod.name for p in found for v in p.victims) == ["low"]
    # Three members, three GPUs: both pods go, or none.
    c = Cluster([mig_node("m", cpu=2000), mig_node("b"), mig_node("c")])
    placed = [running("low-b", 1, (0,), 0), running("low-c", 2, (0,), 0)]
    state = state_of(c, placed)
    found = find_gang_preemption(workers(3), state, placed)
    assert found is not None
    assert sorted(v.pod.name for p in found for v in p.victims) == ["low-b", "low-c"]
    assert sorted(c.nodes[p.node].name for p in found) == ["b", "c", "m"]


def test_a_mig_pod_placed_by_one_preemption_is_not_counted_idle_by_the_next() -> None:
    # b: GPU 0 runs a pod of priority 0, GPU 1 one of 5; c: one GPU running a pod of 7.  The
    # first 7g.80gb pod takes b's GPU 0 (partitioned for it); the second must then evict the 5
    # on b's GPU 1, which harms less than the 7 on c.
    a100 = "A100-SXM4-80GB"
    c = Cluster(
        [
            Node("b", 64000, 262144, gpu_count=2, gpu_model=a100, mig_repartition=True),
            Node("c", 64000, 262144, gpu_count=1, gpu_model=a100, mig_repartition=True),
        ]
    )
    placed = [running("b-0", 0, (0,), 0), running("b-1", 0, (1,), 5), running("c-0", 1, (0,), 7)]
    state = state_of(c, placed)
    pods = [replace(pod(f"p{i}"), mig_profile="7g.80gb", priority=10) for i in range(2)]
    found = plan_preemptions(pods, state, placed)
    assert [(p.pod.name, c.nodes[p.node].name, [v.pod.name for v in p.victims]) for p in found] == [
        ("p0", "b", ["b-0"]),
        ("p1", "b", ["b-1"]),
    ]


def test_ties_between_free_nodes_break_alike_in_every_search() -> None:
    # m1 must evict; m2 fits on any of eight empty nodes, all alike: the same one every time,
    # whatever was searched before.
    def cluster(n: int) -> tuple[ClusterState, list[Assignment]]:
        c = Cluster([gpu_node("busy", gpus=2)] + [gpu_node(f"free-{i}", gpus=1) for i in range(n)])
        placed = [running("low", 0, (0, 1), 0)]
        return state_of(c, placed), placed

    g = Gang("train", min_members=2)
    gang = [replace(pod("m1", gpus=2), priority=10, gang=g), replace(pod("m2", gpus=1), priority=10, gang=g)]
    state, placed = cluster(8)
    first = find_gang_preemption(gang, state, placed)
    assert first is not None
    for n in (3, 5, 8):  # searches on clusters of other sizes in between
        other, others = cluster(n)
        find_gang_preemption(gang, other, others)
    again = find_gang_preemption(gang, state, placed)
    assert again is not None
    assert sorted((p.pod.name, p.node) for p in first) == sorted((p.pod.name, p.node) for p in again)
