"""Independent plan checks: a valid plan passes, and each kind of violation is reported."""

from __future__ import annotations

import pytest

from gpusched.model import Assignment, Cluster, ClusterState, Node, Plan, Pod, SolveStats
from gpusched.model.pod import Gang
from gpusched.solver.validate import PlanError, plan_problems, validate_plan

A100, V100, CPU = 0, 1, 2


def make_state() -> ClusterState:
    cluster = Cluster(
        [
            Node("a100-0", 8000, 32768, gpu_count=2, gpu_model="A100"),
            Node("v100-0", 4000, 16384, gpu_count=1, gpu_model="V100"),
            Node("cpu-0", 16000, 65536),
        ]
    )
    return cluster.empty_state()


def cpu_pod(name: str, cpu: int = 1000, mem: int = 1024) -> Pod:
    return Pod(name, cpu, mem)


def gpu_pod(name: str, gpus: int = 1, milli: int = 1000, models: frozenset[str] = frozenset()) -> Pod:
    return Pod(name, 1000, 1024, num_gpu=gpus, gpu_milli=milli, gpu_models=models)


def plan(*assignments: Assignment, unplaced: tuple[Pod, ...] = ()) -> Plan:
    return Plan(assignments, unplaced, SolveStats(policy="test-policy"))


def only_problem(p: Plan, state: ClusterState, pods: list[Pod] | None = None) -> str:
    problems = plan_problems(p, state, pods)
    assert len(problems) == 1, problems
    return problems[0]


def test_valid_plan_passes() -> None:
    state = make_state()
    f1, f2 = gpu_pod("f1", milli=600), gpu_pod("f2", milli=400)
    w = gpu_pod("w", models=frozenset({"V100"}))
    m = gpu_pod("m", gpus=1)
    c = cpu_pod("c", cpu=15000)
    u = gpu_pod("u", gpus=4)
    p = plan(
        Assignment(f1, A100, (0,)),
        Assignment(f2, A100, (0,)),  # two shares filling one GPU exactly
        Assignment(m, A100, (1,)),
        Assignment(w, V100, (0,)),
        Assignment(c, CPU),
        unplaced=(u,),
    )
    assert plan_problems(p, state, [f1, f2, w, m, c, u]) == []
    validate_plan(p, state, [f1, f2, w, m, c, u])


def test_valid_plan_on_a_busy_state_passes() -> None:
    state = make_state()
    state = state.apply([Assignment(gpu_pod("old", milli=300), A100, (0,))])
    p = plan(Assignment(gpu_pod("new", milli=700), A100, (0,)), Assignment(gpu_pod("w"), A100, (1,)))
    assert plan_problems(p, state) == []


def test_empty_plan_passes() -> None:
    assert plan_problems(plan(), make_state(), []) == []


def test_cpu_over_commit() -> None:
    p = plan(Assignment(cpu_pod("a", cpu=5000), A100), Assignment(cpu_pod("b", cpu=4000), A100))
    assert only_problem(p, make_state()) == "a100-0: CPU over-committed (9000m > 8000m free)"
    p = plan(Assignment(cpu_pod("a", cpu=5000), A100), Assignment(cpu_pod("b", cpu=3001), A100))
    assert only_problem(p, make_state()) == "a100-0: CPU over-committed (8001m > 8000m free)"  # one millicore
    p = plan(Assignment(cpu_pod("a", cpu=5000), A100), Assignment(cpu_pod("b", cpu=3000), A100))
    assert plan_problems(p, make_state()) == []  # exactly full


def test_cpu_over_commit_counts_what_is_already_used() -> None:
    state = make_state().apply([Assignment(cpu_pod("old", cpu=3500), V100)])
    p = plan(Assignment(cpu_pod("a", cpu=1000), V100))
    assert only_problem(p, state) == "v100-0: CPU over-committed (1000m > 500m free)"
    assert only_problem(plan(Assignment(cpu_pod("a", cpu=501), V100)), state) == (
        "v100-0: CPU over-committed (501m > 500m free)"
    )
    assert plan_problems(plan(Assignment(cpu_pod("a", cpu=500), V100)), state) == []  # exactly full


def test_memory_over_commit() -> None:
    p = plan(Assignment(cpu_pod("a", mem=10000), V100), Assignment(cpu_pod("b", mem=10000), V100))
    assert only_problem(p, make_state()) == "v100-0: memory over-committed (20000Mi > 16384Mi)"
    p = plan(Assignment(cpu_pod("a", mem=10000), V100), Assignment(cpu_pod("b", mem=6385), V100))
    assert only_problem(p, make_state()) == "v100-0: memory over-committed (16385Mi > 16384Mi)"  # one MiB
    p = plan(Assignment(cpu_pod("a", mem=10000), V100), Assignment(cpu_pod("b", mem=6384), V100))
    assert plan_problems(p, make_state()) == []  # exactly full


def test_gpu_over_commit_by_shares() -> None:
    p = plan(
        Assignment(gpu_pod("a", milli=600), A100, (1,)),
        Assignment(gpu_pod("b", milli=500), A100, (1,)),
    )
    assert only_problem(p, make_state()) == "a100-0: GPU 1 over-committed (1100 > 1000 of 1000 free)"


def test_gpu_over_commit_against_state() -> None:
    state = make_state().apply([Assignment(gpu_pod("old", milli=800), V100, (0,))])
    p = plan(Assignment(gpu_pod("a", milli=300), V100, (0,)))
    assert only_problem(p, state) == "v100-0: GPU 0 over-committed (300 > 200 of 1000 free)"


def test_whole_gpu_on_a_busy_gpu() -> None:
    state = make_state().apply([Assignment(gpu_pod("old", milli=100), A100, (0,))])
    problems = plan_problems(plan(Assignment(gpu_pod("w"), A100, (0,))), state)
    assert "pod default/w: GPU 0 on a100-0 is not idle" in problems
    with pytest.raises(PlanError, match="not idle"):
        validate_plan(plan(Assignment(gpu_pod("w"), A100, (0,))), state)


def test_two_whole_pods_on_one_gpu() -> None:
    p = plan(Assignment(gpu_pod("w1"), A100, (1,)), Assignment(gpu_pod("w2"), A100, (1,)))
    problems = plan_problems(p, make_state())
    assert "pod default/w2: GPU 1 on a100-0 is already taken whole" in problems


def test_share_next_to_a_whole_gpu_in_the_same_plan() -> None:
    p = plan(Assignment(gpu_pod("w"), V100, (0,)), Assignment(gpu_pod("f", milli=1), V100, (0,)))
    assert only_problem(p, make_state()) == "v100-0: GPU 0 over-committed (1001 > 1000 of 1000 free)"


@pytest.mark.parametrize(
    ("pod", "gpus", "message"),
    [
        (gpu_pod("m", gpus=2), (0,), "pod default/m: asked for 2 GPUs, got indices [0]"),
        (gpu_pod("w"), (), "pod default/w: asked for 1 GPUs, got indices []"),
        (gpu_pod("w"), (0, 1), "pod default/w: asked for 1 GPUs, got indices [0, 1]"),
        (cpu_pod("c"), (0,), "pod default/c: asked for 0 GPUs, got indices [0]"),
    ],
)
def test_wrong_gpu_count(pod: Pod, gpus: tuple[int, ...], message: str) -> None:
    assert message in plan_problems(plan(Assignment(pod, A100, gpus)), make_state())


def test_repeated_gpu_index() -> None:
    problems = plan_problems(plan(Assignment(gpu_pod("m", gpus=2), A100, (1, 1))), make_state())
    assert "pod default/m: GPU index repeated in [1, 1]" in problems


def test_model_not_accepted() -> None:
    p = plan(Assignment(gpu_pod("v", models=frozenset({"V100", "T4"})), A100, (0,)))
    assert only_problem(p, make_state()) == "pod default/v: GPU model 'A100' on a100-0 is not accepted"


def test_duplicate_pod() -> None:
    a = gpu_pod("a", milli=100)
    p = plan(Assignment(a, A100, (0,)), unplaced=(a,))
    assert only_problem(p, make_state()) == "pod default/a appears more than once in the plan"


def test_same_name_in_another_namespace_is_not_a_duplicate() -> None:
    p = plan(Assignment(cpu_pod("a"), CPU), Assignment(Pod("a", 1, 1, namespace="ml"), CPU))
    assert plan_problems(p, make_state()) == []


def test_missing_pod() -> None:
    a, b = cpu_pod("a"), cpu_pod("b")
    assert only_problem(plan(Assignment(a, CPU)), make_state(), [a, b]) == "pod default/b is missing from the plan"


def test_pod_not_in_the_batch() -> None:
    a, b = cpu_pod("a"), cpu_pod("b")
    problem = only_problem(plan(Assignment(a, CPU), unplaced=(b,)), make_state(), [a])
    assert problem == "pod default/b is in the plan but not in the batch"


def test_unknown_gpu_index() -> None:
    p = plan(Assignment(gpu_pod("w"), A100, (2,)))
    assert only_problem(p, make_state()) == "pod default/w: a100-0 has no GPU 2"
    q = plan(Assignment(gpu_pod("w"), CPU, (0,)))
    assert "pod default/w: cpu-0 has no GPU 0" in plan_problems(q, make_state())


@pytest.mark.parametrize("node", [3, -1])
def test_unknown_node_index(node: int) -> None:
    p = plan(Assignment(cpu_pod("a"), node))
    assert only_problem(p, make_state()) == f"pod default/a: node index {node} is not in the cluster"


def test_validate_plan_names_the_policy_and_caps_the_list() -> None:
    pods = [cpu_pod(f"p{i}", cpu=1) for i in range(8)]
    p = plan(*(Assignment(x, 9) for x in pods))
    with pytest.raises(PlanError) as info:
        validate_plan(p, make_state())
    message = str(info.value)
    assert message.startswith("invalid plan from test-policy: ")
    assert message.endswith("(+3 more)")
    assert message.count("is not in the cluster") == 5


def test_a_plan_naming_a_missing_gpu_or_mig_profile_is_reported_even_with_peer_rules() -> None:
    """The peer checks step through the plan; an assignment the other checks reject (a GPU the
    node lacks, a MIG profile no node offers) is reported, never raised on."""
    from gpusched.model.affinity import PodAffinityTerm, Requirement

    cluster = Cluster([Node("n0", 8000, 8192, gpu_count=1, gpu_model="T4", labels={"host": "n0"})])
    apart = (PodAffinityTerm((Requirement("app", "In", ("a",)),), None, "host"),)
    slice_pod = Pod("q", 100, 100, mig_profile="1g.5gb", anti_affinity=apart)
    gpu_pod = Pod("r", 100, 100, num_gpu=1, gpu_milli=1000, anti_affinity=apart)
    for pod, gpus, message in ((slice_pod, (), "MIG 1g.5gb over-committed"), (gpu_pod, (3,), "n0 has no GPU 3")):
        problems = plan_problems(Plan((Assignment(pod, 0, gpus),), (), SolveStats("test")), cluster.empty_state())
        assert any(message in p for p in problems), problems


def test_a_slice_pod_naming_its_model_fits_a_node_whose_gpus_are_all_in_mig_mode() -> None:
    """Such a node advertises no whole GPU, only slices; its GPU product still names the model."""
    from gpusched.solver.fragmentation import TypicalPods
    from gpusched.solver.registry import make_policy

    node = Node("mig", 8000, 8192, gpu_count=0, gpu_model="A100-SXM4-40GB", mig_slices=(("1g.5gb", 7),))
    cluster = Cluster([node])
    wants = Pod("p", 100, 100, mig_profile="1g.5gb", gpu_models=frozenset({"A100-SXM4-40GB"}))
    other = Pod("o", 100, 100, mig_profile="1g.5gb", gpu_models=frozenset({"H100-SXM5-80GB"}))
    state = cluster.empty_state()
    assert list(state.fit_mask(wants.shape)) == [True]
    assert list(state.fit_mask(other.shape)) == [False]
    for policy in ("cpsat", "fgd"):
        plan = make_policy(policy, cluster, TypicalPods.from_pods([wants]), 0).place([wants, other], state)
        assert [a.pod.name for a in plan.assignments] == ["p"], policy


def _racks(*values: str) -> ClusterState:
    rack = [
        Node(f"n{i}", 64000, 262144, gpu_count=8, gpu_model="H100", labels={"rack": v}) for i, v in enumerate(values)
    ]
    return Cluster(rack).empty_state()


def test_a_gang_on_nodes_whose_domain_label_is_empty_is_in_no_domain() -> None:
    """As the solver and the greedy policies read it: ``rack=""`` names no rack."""
    gang = Gang("ns/g", 2, "rack", "required")
    m0, m1 = (Pod(f"m{i}", 1000, 1024, 8, 1000, gang=gang) for i in range(2))
    plan = Plan((Assignment(m0, 0, tuple(range(8))), Assignment(m1, 1, tuple(range(8)))), ())
    assert plan_problems(plan, _racks("", ""), [m0, m1]) == ["gang ns/g: members span rack domains ['']"]
    assert plan_problems(plan, _racks("r1", "r1"), [m0, m1]) == []
    assert plan_problems(plan, _racks("r1", "r2"), [m0, m1]) == ["gang ns/g: members span rack domains ['r1', 'r2']"]


def test_a_recreated_member_of_a_gang_held_to_its_peers_rack_may_not_go_to_another() -> None:
    """Its peers run in rack r1 (``Gang.domain``): the member left to place must join them."""
    gang = Gang("ns/g", 1, "rack", "required", domain="r1", running=2)
    m = Pod("m2", 1000, 1024, 8, 1000, gang=gang)
    state = _racks("r1", "r2")
    assert plan_problems(Plan((Assignment(m, 0, tuple(range(8))),), ()), state, [m]) == []
    assert plan_problems(Plan((Assignment(m, 1, tuple(range(8))),), ()), state, [m]) == [
        "gang ns/g: members span rack domains ['r2']"
    ]


def test_a_gang_placed_with_fewer_members_than_its_minimum_is_rejected() -> None:
    gang = Gang("ns/g", 3)
    m0, m1 = (Pod(f"m{i}", 1000, 1024, 1, 1000, gang=gang) for i in range(2))
    plan = Plan((Assignment(m0, 0, (0,)), Assignment(m1, 0, (1,))), ())
    assert plan_problems(plan, _racks("r1"), [m0, m1]) == ["gang ns/g: 2 members placed, fewer than its minimum 3"]


def test_a_gang_placed_at_its_minimum_but_not_every_member_is_valid() -> None:
    gang = Gang("ns/g", 2)
    m0, m1, m2 = (Pod(f"m{i}", 1000, 1024, 1, 1000, gang=gang) for i in range(3))
    plan = Plan((Assignment(m0, 0, (0,)), Assignment(m1, 0, (1,))), (m2,))
    assert plan_problems(plan, _racks("r1"), [m0, m1, m2]) == []
    alone = Plan((Assignment(m0, 0, (0,)),), (m1, m2))
    assert plan_problems(alone, _racks("r1"), [m0, m1, m2]) == ["gang ns/g: 1 member placed, fewer than its minimum 2"]


def test_a_gang_with_members_running_needs_only_the_rest_of_its_minimum() -> None:
    """At least 4, 1 running (``min_members`` 3 left): 3 more are enough, 2 are not."""
    gang = Gang("ns/g", 3, running=1)  # as the scheduler gives it (``Gang.beside``)
    pods = [Pod(f"m{i}", 1000, 1024, 1, 1000, gang=gang) for i in range(4)]
    three = Plan(tuple(Assignment(p, 0, (i,)) for i, p in enumerate(pods[:3])), (pods[3],))
    assert plan_problems(three, _racks("r1"), pods) == []
    two = Plan(tuple(Assignment(p, 0, (i,)) for i, p in enumerate(pods[:2])), tuple(pods[2:]))
    assert plan_problems(two, _racks("r1"), pods) == [
        "gang ns/g: 2 members placed beside 1 running, fewer than its minimum 4"
    ]


def test_a_gang_placed_although_its_members_disagree_on_its_rules_is_rejected() -> None:
    m0 = Pod("m0", 1000, 1024, 1, 1000, gang=Gang("ns/g", 3))
    m1 = Pod("m1", 1000, 1024, 1, 1000, gang=Gang("ns/g", 1))
    plan = Plan((Assignment(m0, 0, (0,)), Assignment(m1, 0, (1,))), ())
    assert "gang ns/g: placed although its members disagree on its minimum or topology" in plan_problems(
        plan, _racks("r1"), [m0, m1]
    )


def _mig_state() -> ClusterState:
    """GPU 0 of the A100 node busy; the T4 node cannot be re-partitioned."""
    nodes = [
        Node("a100", 64000, 262144, gpu_count=2, gpu_model="A100-SXM4-80GB", mig_repartition=True),
        Node("t4", 8000, 8192, gpu_count=1, gpu_model="T4"),
    ]
    state = Cluster(nodes).empty_state()  # the simulator's rule: any idle GPU may be partitioned
    return state.apply([Assignment(Pod("old", 0, 0, num_gpu=1, gpu_milli=1000), 0, (0,))])


@pytest.mark.parametrize(
    ("partitions", "slices", "message"),
    [
        ([(1, 0, (("1g.10gb", 0),))], 0, "MIG layout on node index 1, which may not be re-partitioned"),
        ([(0, 0, (("1g.10gb", 0),))], 0, "a100: GPU 0 is not an idle GPU to partition"),
        ([(0, 2, (("1g.10gb", 0),))], 0, "a100: GPU 2 is not an idle GPU to partition"),
        ([(0, 1, (("1g.10gb", 0),)), (0, 1, (("1g.10gb", 1),))], 0, "a100: GPU 1 is partitioned twice"),
        ([(0, 1, (("1g.10gb", 0), ("2g.20gb", 0)))], 0, "a100: GPU 1 layout {'1g.10gb': 1, '2g.20gb': 1} is not"),
        ([(0, 1, (("7g.80gb", 0), ("1g.10gb", 6)))], 0, "is not a valid A100-SXM4-80GB layout"),
        ([(0, 1, (("1g.10gb", 0), ("1g.10gb", 1)))], 3, "a100: MIG 1g.10gb over-committed (3 > 2 instances)"),
    ],
)
def test_each_wrong_mig_partition_is_reported(
    partitions: list[tuple[int, int, tuple[tuple[str, int], ...]]], slices: int, message: str
) -> None:
    from gpusched.model.mig import MigLayout

    state = _mig_state()
    pods = tuple(Pod(f"s{i}", 100, 100, mig_profile="1g.10gb") for i in range(slices))
    bad = Plan(
        tuple(Assignment(p, 0) for p in pods),
        (),
        SolveStats("test"),
        partitions=tuple((n, g, MigLayout(layout)) for n, g, layout in partitions),
    )
    problems = plan_problems(bad, state, list(pods))
    assert any(message in p for p in problems), problems
    used = Assignment(Pod("s", 100, 100, mig_profile="1g.10gb"), 0)
    good = Plan((used,), (), SolveStats("test"), partitions=((0, 1, MigLayout((("1g.10gb", 0), ("1g.10gb", 1)))),))
    assert plan_problems(good, state) == []


@pytest.mark.parametrize(
    ("profiles", "layout", "unused"),
    [
        ((), (("1g.10gb", 0), ("1g.10gb", 1)), True),  # no pod at all
        (("1g.10gb",), (("1g.10gb", 0), ("1g.10gb", 1)), True),  # the pod takes an instance free already
        (("1g.10gb",) * 3, (("1g.10gb", 0), ("1g.10gb", 1)), False),  # the third takes one of the layout
        (("1g.10gb",), (("1g.10gb", 0), ("2g.20gb", 2)), True),  # the layout offers the profile, not needed
        (("2g.20gb",), (("1g.10gb", 0), ("2g.20gb", 2)), False),
    ],
)
def test_a_partition_no_pod_of_the_plan_uses_is_reported(
    profiles: tuple[str, ...], layout: tuple[tuple[str, int], ...], unused: bool
) -> None:
    # Partitioning a GPU drains the node on a live cluster (the MIG manager): a plan partitions
    # a GPU only for pods of its own that find no instance free.
    from gpusched.model.mig import MigLayout

    node = Node("a100", 64000, 262144, 2, "A100-SXM4-80GB", mig_repartition=True, mig_slices=(("1g.10gb", 2),))
    state = Cluster([node]).empty_state()
    pods = [Pod(f"s{i}", 100, 100, mig_profile=p) for i, p in enumerate(profiles)]
    plan = Plan(tuple(Assignment(p, 0) for p in pods), (), SolveStats("test"), partitions=((0, 1, MigLayout(layout)),))
    message = "a100: GPU 1 is partitioned for no pod of the plan"
    assert (message in plan_problems(plan, state, pods)) == unused, plan_problems(plan, state, pods)


def test_a_partition_an_instance_freed_meanwhile_makes_needless_is_trimmed_not_refused() -> None:
    """The daemon checks a plan against the books after the solve: an instance of the profile
    freed (or newly advertised) meanwhile makes the plan's partition needless.  Trimmed against
    those books (``needed_partitions``), the plan holds; its pods take the free instance."""
    from gpusched.model.mig import MigLayout
    from gpusched.solver.partitions import needed_partitions

    node = Node("a100", 64000, 262144, 2, "A100-SXM4-80GB", mig_repartition=True, mig_slices=(("1g.10gb", 1),))
    cluster = Cluster([node])
    old = Assignment(Pod("old", 100, 100, mig_profile="1g.10gb", uid="o"), 0)
    at_snapshot, after = cluster.empty_state().apply([old]), cluster.empty_state()
    new = Pod("new", 100, 100, mig_profile="1g.10gb", uid="n")
    layout = MigLayout(tuple(("1g.10gb", i) for i in range(7)))
    plan = Plan((Assignment(new, 0),), (), SolveStats("t"), partitions=((0, 1, layout),))
    assert plan_problems(plan, at_snapshot) == []
    assert needed_partitions(plan.partitions, plan.assignments, at_snapshot) == plan.partitions
    assert needed_partitions(plan.partitions, plan.assignments, after) == ()
    assert plan_problems(Plan(plan.assignments, (), plan.stats), after) == []
