"""Building the model: the bulk objective gives what ``CpModel.maximize`` gives; pods find their groups."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ortools.sat.python import cp_model

from gpusched.model import Assignment, Cluster, Plan
from gpusched.solver.fragmentation import FragScorer, TypicalPods
from gpusched.solver.instance import build_instance
from gpusched.solver.model import maximize
from gpusched.solver.solve import cp_solver
from tests.factories import gpu_node, pod


def _pair() -> tuple[cp_model.CpModel, cp_model.CpModel, list[cp_model.IntVar], list[cp_model.IntVar]]:
    a, b = cp_model.CpModel(), cp_model.CpModel()
    xa = [a.new_int_var(0, 3, f"x{i}") for i in range(4)]
    xb = [b.new_int_var(0, 3, f"x{i}") for i in range(4)]
    for m, x in ((a, xa), (b, xb)):
        m.add(x[0] + x[1] + x[2] + x[3] <= 5)
    return a, b, xa, xb


@pytest.mark.parametrize(
    "terms",
    [
        lambda x: 7 * x[0] - 2 * x[1] + 3 * x[2] + 11,  # an offset, a negative coefficient
        lambda x: 4 * x[0] + 1 * x[0] - x[3],  # one variable twice: merged
        lambda x: sum(c * v for c, v in zip((5, 0, 2, 9), x, strict=True)) - 4,  # a zero coefficient
    ],
)
def test_the_objective_is_the_one_maximize_writes_and_solves_the_same(terms: object) -> None:
    a, b, xa, xb = _pair()
    a.maximize(terms(xa))  # type: ignore[operator]
    maximize(b, terms(xb))  # type: ignore[operator]
    pa, pb = a.proto.objective, b.proto.objective
    got = sorted((v, c) for v, c in zip(pb.vars, pb.coeffs, strict=True) if c)
    want: dict[int, int] = {}
    for v, c in zip(pa.vars, pa.coeffs, strict=True):
        want[v] = want.get(v, 0) + c
    assert got == sorted((v, c) for v, c in want.items() if c)
    assert (pb.offset, pb.scaling_factor) == (pa.offset, pa.scaling_factor)
    sa, sb = cp_solver(), cp_solver()
    assert sa.solve(a) == sb.solve(b) == cp_model.OPTIMAL
    assert sb.objective_value == sa.objective_value


def test_a_constant_objective_is_written_as_maximize_writes_it() -> None:
    a, b, _, _ = _pair()
    a.maximize(0)
    maximize(b, 0)
    pa, pb = a.proto.objective, b.proto.objective
    assert (list(pb.vars), list(pb.coeffs), pb.offset) == (list(pa.vars), list(pa.coeffs), pa.offset) == ([], [], 0)


def test_a_pod_finds_its_group_whether_it_is_the_batchs_own_object_or_an_equal_copy() -> None:
    c = Cluster([gpu_node(f"n{i}", gpus=4) for i in range(3)])
    pods = [pod("a0", gpus=1), pod("a1", gpus=1), pod("f0", gpus=1, milli=300), pod("c0")]
    inst = build_instance(pods, c.empty_state(), FragScorer(c, TypicalPods.from_pods(pods)), Plan((), tuple(pods)), 24)
    for p in pods:
        gi = inst.group_index(p)
        assert any(q is p for q in inst.groups[gi].pods)
        assert inst.group_index(replace(p)) == gi  # not the batch's object: found by its key
    assert inst.group_index(pods[0]) == inst.group_index(pods[1]) != inst.group_index(pods[2])


def test_the_node_a_warm_start_chose_stays_a_candidate_whoever_holds_the_pod() -> None:
    # Forty nodes, each a class of its own (different CPU); one candidate per pod is kept by rank,
    # plus the node the hint put the pod on, also when the hint holds an equal copy of the pod.
    c = Cluster([gpu_node(f"n{i}", gpus=2, cpu=4000 + 100 * i) for i in range(40)])
    p = pod("a", gpus=1)
    state, scorer = c.empty_state(), FragScorer(c, TypicalPods.from_pods([p]))
    for held in (p, replace(p)):
        hint = Plan((Assignment(held, 17, (0,)),), ())
        inst = build_instance([p], state, scorer, hint, 1)
        nodes = {cand.node for cand in inst.candidates}
        assert 17 in nodes
        assert len(nodes) == 2  # the best-ranked node and the hinted one
