"""Reclaim between tenants: quota decides, never pushing a tenant below its own quota nor a pod
past its tenant's; and preemption kept within a tenant when asked to."""

from __future__ import annotations

from dataclasses import replace

from gpusched.model import Assignment, Cluster, ClusterState, Plan, Pod
from gpusched.model.pod import Gang
from gpusched.model.tenants import TenantRule, Tenants
from gpusched.solver.preempt import Budget, plan_preemptions
from gpusched.solver.reclaim import plan_reclaims
from gpusched.solver.validate import validate_plan
from tests.factories import gpu_node, pod


def of(name: str, tenant: str, gpus: int = 1, priority: int = 0) -> Pod:
    return replace(pod(name, gpus=gpus), namespace=tenant, priority=priority)


def on(name: str, tenant: str, node: int, gpus: tuple[int, ...], priority: int = 0) -> Assignment:
    return Assignment(of(name, tenant, len(gpus), priority), node, gpus)


def setup(placed: list[Assignment], nodes: int = 1, gpus: int = 2) -> ClusterState:
    return Cluster([gpu_node(f"n{i}", gpus=gpus) for i in range(nodes)]).empty_state().apply(placed)


def reclaims(pods: list[Pod], placed: list[Assignment], tenants: Tenants, **kw: object) -> list[tuple[str, list[str]]]:
    state = setup(placed, **kw)  # type: ignore[arg-type]
    found = plan_reclaims(pods, state, placed, tenants, tenants.usage(a.pod for a in placed))
    for pre in found:  # each pod fits where it says once its victims are gone
        validate_plan(Plan((pre.placement,), ()), state.release(pre.victims), [pre.pod])
    return [(pre.pod.name, sorted(v.pod.name for v in pre.victims)) for pre in found]


QUOTA_B = Tenants(rules={"b": TenantRule(quota=2000)})


def test_a_pod_within_its_quota_evicts_the_lowest_borrowed_pod() -> None:
    placed = [on("a-hi", "a", 0, (0,), priority=5), on("a-lo", "a", 0, (1,), priority=1)]
    assert reclaims([of("b0", "b", priority=-100)], placed, QUOTA_B) == [("b0", ["a-lo"])]


def test_no_tenant_is_pushed_below_its_quota() -> None:
    t = Tenants(rules={"a": TenantRule(quota=1000), "b": TenantRule(quota=2000)})
    placed = [on("a0", "a", 0, (0,)), on("a1", "a", 0, (1,))]  # a borrows 1 GPU
    assert reclaims([of("b-two", "b", gpus=2)], placed, t) == []  # would take both of a's
    assert reclaims([of("b0", "b"), of("b1", "b")], placed, t) == [("b0", ["a0"])]  # the second finds no room


def test_a_pod_past_its_own_quota_reclaims_nothing() -> None:
    t = Tenants(rules={"b": TenantRule(quota=1000)})
    placed = [on("a0", "a", 0, (0,)), on("b-run", "b", 0, (1,))]
    assert reclaims([of("b1", "b")], placed, t) == []
    placed = [on("a0", "a", 0, (0,)), on("a1", "a", 0, (1,))]
    (found,) = reclaims([of("b1", "b"), of("b2", "b")], placed, t)  # one pod's worth only
    assert found[0] == "b1"
    assert len(found[1]) == 1


def test_pods_of_the_protected_priority_its_own_tenant_and_gangs_are_left_alone() -> None:
    placed = [on("crit", "a", 0, (0,), priority=1_000_000), on("own", "b", 0, (1,))]
    t = Tenants(rules={"b": TenantRule(quota=2000)})
    assert reclaims([of("b1", "b")], placed, t) == []
    placed = [on("a0", "a", 0, (0,)), on("a1", "a", 0, (1,))]
    member = replace(of("m", "b"), gang=Gang("g", 1))
    assert reclaims([member], placed, t) == []
    assert reclaims([replace(of("never", "b"), preempts=False)], placed, t) == []


def test_disruption_budgets_steer_reclaim_to_the_unprotected_pod() -> None:
    placed = [on("kept", "a", 0, (0,)), on("free", "a", 1, (0,))]
    placed = [replace(placed[0], pod=replace(placed[0].pod, labels=(("app", "x"),))), placed[1]]
    state = setup(placed, nodes=2, gpus=1)
    from gpusched.model.affinity import Requirement

    budget = Budget("a", (Requirement("app", "In", ("x",)),), 0)
    found = plan_reclaims([of("b0", "b")], state, placed, QUOTA_B, {"a": 2000}, budgets=[budget])
    assert [v.pod.name for pre in found for v in pre.victims] == ["free"]


def test_preemption_within_a_tenant_leaves_other_tenants_pods_alone() -> None:
    placed = [on("a-low", "a", 0, (0,)), on("b-low", "b", 1, (0,))]
    state = setup(placed, nodes=2, gpus=1)
    urgent = of("b-urgent", "b", priority=10)
    anyone = plan_preemptions([urgent], state, placed)
    assert [v.pod.name for pre in anyone for v in pre.victims] == ["a-low"]  # the first node, by order
    mine = plan_preemptions([urgent], state, placed, scope=lambda p: p.namespace)
    assert [v.pod.name for pre in mine for v in pre.victims] == ["b-low"]
    alone = plan_preemptions([of("c-urgent", "c", priority=10)], state, placed, scope=lambda p: p.namespace)
    assert alone == []


def test_a_pod_at_its_tenants_limit_takes_only_the_room_its_own_victims_leave() -> None:
    from gpusched.solver.reclaim import plan_at_limit

    limited = Tenants(rules={"a": TenantRule(limit=1000)})
    placed = [on("a-low", "a", 0, (0,)), on("b-low", "b", 1, (0,))]
    state = setup(placed, nodes=2, gpus=2)  # a GPU free on each node
    (pre,) = plan_at_limit([of("a-urgent", "a", priority=10)], state, placed, limited)
    assert [v.pod.name for v in pre.victims] == ["a-low"]
    assert pre.placement.node == 0  # not the free GPU of either node: the tenant would hold 2
    assert pre.placement.gpus == (0,)
    # Nothing of its own tenant below it: it waits, though b's pod is of lower priority.
    assert plan_at_limit([of("c-urgent", "c", priority=10)], state, placed, limited) == []
    # Two GPUs asked, one of its own to take: never more than the tenant had.
    assert plan_at_limit([of("a-two", "a", gpus=2, priority=10)], state, placed, limited) == []
    assert plan_at_limit([replace(of("m", "a", priority=10), gang=Gang("g", 1))], state, placed, limited) == []


def test_reclaim_stays_within_the_reclaimers_limit() -> None:
    t = Tenants(rules={"b": TenantRule(quota=2000, limit=2000)})
    placed = [on("a0", "a", 0, (0,)), on("a1", "a", 0, (1,)), on("a2", "a", 1, (0,)), on("a3", "a", 1, (1,))]
    state = setup(placed, nodes=2)
    pods = [of("b0", "b"), of("b1", "b")]
    assert len(plan_reclaims(pods, state, placed, t, {"a": 4000})) == 2
    # One GPU of b's limit is taken by a pod of b still leaving (counted against the limit only).
    assert len(plan_reclaims(pods, state, placed, t, {"a": 4000}, allowance={"b": 1000})) == 1


def test_preemption_within_a_tenant_stays_within_its_limit() -> None:
    placed = [on("a-low", "a", 0, (0,)), on("a-low2", "a", 1, (0,))]
    state = setup(placed, nodes=2, gpus=4)
    scope = lambda p: p.namespace  # noqa: E731
    big = [of("p1", "a", gpus=4, priority=10), of("p2", "a", gpus=4, priority=10)]
    assert len(plan_preemptions(big, state, placed, scope=scope)) == 2
    # Each evicts 1 GPU of a and takes 4: 3 more each; a may take 4 more in all.
    assert len(plan_preemptions(big, state, placed, scope=scope, allowance={"a": 4000})) == 1


def gang_reclaims(
    gangs: list[list[Pod]], placed: list[Assignment], tenants: Tenants, nodes: int, gpus: int
) -> list[tuple[str, list[str]]]:
    state = setup(placed, nodes=nodes, gpus=gpus)
    found = plan_reclaims([], state, placed, tenants, tenants.usage(a.pod for a in placed), gangs=gangs)
    validate_plan(
        Plan(tuple(pre.placement for pre in found), ()),
        state.release([v for pre in found for v in pre.victims]),
        [pre.pod for pre in found],
    )
    return sorted((pre.pod.name, sorted(v.pod.name for v in pre.victims)) for pre in found)


def test_a_gang_within_its_quota_reclaims_for_all_its_members_or_none() -> None:
    t = Tenants(rules={"b": TenantRule(quota=2000)})
    placed = [on(f"a{i}", "a", i, (0,)) for i in range(2)]  # a borrows both GPUs, one per node
    gang = [replace(of(f"m{i}", "b"), gang=Gang("g", 2)) for i in range(2)]
    assert gang_reclaims([gang], placed, t, nodes=2, gpus=1) == [("m0", ["a0"]), ("m1", ["a1"])]
    # Past the quota together (3 GPUs of a quota of 2): no member reclaims.
    three = [replace(of(f"m{i}", "b"), gang=Gang("g", 3)) for i in range(3)]
    placed3 = [on(f"a{i}", "a", i, (0,)) for i in range(3)]
    assert gang_reclaims([three], placed3, t, nodes=3, gpus=1) == []
    # The lender keeps its quota: a holds 2 with a quota of 1, so only one GPU is borrowed.
    lender = Tenants(rules={"a": TenantRule(quota=1000), "b": TenantRule(quota=2000)})
    assert gang_reclaims([gang], placed, lender, nodes=2, gpus=1) == []
    # A member that may not preempt keeps the whole gang from reclaiming.
    shy = [gang[0], replace(gang[1], preempts=False)]
    assert gang_reclaims([shy], placed, t, nodes=2, gpus=1) == []


def test_a_gang_started_by_a_launcher_without_a_gpu_reclaims_for_the_workers_its_quota_covers() -> None:
    t = Tenants(rules={"b": TenantRule(quota=2000)})
    placed = [on(f"a{i}", "a", i, (0,)) for i in range(3)]  # a borrows every GPU, one per node
    launcher = replace(of("launcher", "b", 0), gang=Gang("job", 1))
    workers = [replace(of(f"w{i}", "b"), gang=Gang("job", 1)) for i in range(3)]
    found = gang_reclaims([[launcher, *workers]], placed, t, nodes=3, gpus=1)
    # b's quota covers two workers: two of a's pods go for them; the launcher needs no victim.
    assert sorted(v for _, vs in found for v in vs) in (["a0", "a1"], ["a0", "a2"], ["a1", "a2"]), found
    assert {name for name, vs in found if vs} <= {"w0", "w1", "w2"}
    # With b's quota spent, the launcher alone is within it and reclaims nothing.
    assert (
        gang_reclaims(
            [[launcher, *workers]],
            [*placed, on("b0", "b", 0, ())],
            Tenants(rules={"b": TenantRule(quota=0)}),
            nodes=3,
            gpus=1,
        )
        == []
    )


def test_a_gang_reclaims_from_a_second_lender_when_the_first_has_too_little_beyond_its_quota() -> None:
    # a holds 2 GPUs with a quota of 1 (1 borrowed); c holds 2 with no quota (2 borrowed).
    t = Tenants(rules={"a": TenantRule(quota=1000), "b": TenantRule(quota=2000)})
    placed = [on("a0", "a", 0, (0,)), on("a1", "a", 1, (0,))]
    placed += [on("c0", "c", 2, (0,), priority=5), on("c1", "c", 3, (0,), priority=5)]
    gang = [replace(of(f"m{i}", "b"), gang=Gang("g", 2)) for i in range(2)]
    found = gang_reclaims([gang], placed, t, nodes=4, gpus=1)
    # m0 <- a0 (or a1), m1 <- c0 (or c1): within every lender's room.
    assert len(found) == 2, found
    lenders = sorted(v[0] for _, vs in found for v in vs)
    assert lenders == ["a", "c"], "one GPU of a's, beyond its quota, and one of c's"


def test_a_mig_pod_at_its_tenants_limit_takes_the_instance_of_a_lower_pod_of_its_tenant_and_profile() -> None:
    from gpusched.model import Node
    from gpusched.solver.reclaim import plan_at_limit

    def mig(name: str, tenant: str, profile: str = "1g.10gb", priority: int = 0) -> Pod:
        return replace(pod(name), namespace=tenant, priority=priority, mig_profile=profile)

    node = Node("m", 64000, 262144, 0, "NVIDIA-A100-SXM4-80GB", mig_slices=(("1g.10gb", 3), ("2g.20gb", 1)))
    limited = Tenants(rules={"a": TenantRule(limit=286)})  # two 1g sevenths
    placed = [
        Assignment(mig("a-low", "a"), 0, ()),
        Assignment(mig("a-2g", "a", "2g.20gb", priority=-5), 0, ()),
        Assignment(mig("b-low", "b", priority=-10), 0, ()),
    ]
    state = Cluster([node]).empty_state().apply(placed)
    assert state.mig_free[0, state.cluster.mig_index["1g.10gb"]] == 1  # a free instance it must not take
    (pre,) = plan_at_limit([mig("a-urgent", "a", priority=10)], state, placed, limited)
    assert [v.pod.name for v in pre.victims] == ["a-low"], "its own tenant's pod of its profile, not b's"
    validate_plan(Plan((pre.placement,), ()), state.release(pre.victims), [pre.pod])
    # A 2g instance freed is no 1g instance; b's pods are not its tenant's: nothing to take.
    alone = [Assignment(mig("a-2g", "a", "2g.20gb"), 0, ()), Assignment(mig("b-low", "b"), 0, ())]
    state = Cluster([node]).empty_state().apply(alone)
    assert plan_at_limit([mig("a-urgent", "a", priority=10)], state, alone, limited) == []


def test_a_mig_pod_at_its_limit_looks_past_a_whole_gpu_that_would_need_re_partitioning() -> None:
    from gpusched.model import Node
    from gpusched.solver.reclaim import plan_at_limit

    a100 = "NVIDIA-A100-SXM4-80GB"
    nodes = [
        Node("w", 64000, 262144, 1, a100, mig_repartition=True),
        Node("m", 64000, 262144, 0, a100, mig_slices=(("1g.10gb", 1),)),
    ]
    mig = replace(pod("a-m"), namespace="a", mig_profile="1g.10gb")
    placed = [Assignment(replace(of("a-w", "a"), priority=-10), 0, (0,)), Assignment(mig, 1, ())]
    state = Cluster(nodes, repartition="idle-nodes").empty_state().apply(placed)
    urgent = replace(mig, name="u", priority=10)
    (pre,) = plan_at_limit([urgent], state, placed, Tenants(rules={"a": TenantRule(limit=1000)}))
    assert [v.pod.name for v in pre.victims] == ["a-m"], "the instance of its profile, not the whole GPU"
    assert pre.placement.node == 1


def test_a_mig_pod_at_its_limit_takes_the_instance_of_a_pod_that_holds_a_gpu_beside_it() -> None:
    """Another scheduler may have bound a pod onto a GPU and a slice: its slice is an instance too."""
    from gpusched.model import Node
    from gpusched.solver.reclaim import plan_at_limit

    node = Node("m", 64000, 262144, 1, "NVIDIA-A100-SXM4-80GB", mig_slices=(("3g.40gb", 1),))
    both = replace(of("a-both", "a"), priority=-5, mig_held=(("3g.40gb", 1),))
    placed = [Assignment(both, 0, (0,))]
    state = Cluster([node]).empty_state().apply(placed)
    urgent = replace(pod("a-urgent"), namespace="a", priority=10, mig_profile="3g.40gb")
    (pre,) = plan_at_limit([urgent], state, placed, Tenants(rules={"a": TenantRule(limit=1143)}))
    assert [v.pod.name for v in pre.victims] == ["a-both"]
    validate_plan(Plan((pre.placement,), ()), state.release(pre.victims), [pre.pod])
