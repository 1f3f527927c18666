"""The replay protocol: shuffle per seed, then tune GPU demand to a multiple of capacity."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import pytest

from gpusched.model import GPU_MILLI, Pod
from gpusched.sim.protocol import prepare_workload


def trace() -> list[Pod]:
    """40 pods: fractional, whole and multi-GPU pods and a few CPU-only ones; 28 GPUs of demand."""
    pods: list[Pod] = []
    for i in range(40):
        if i % 8 == 0:
            pods.append(Pod(f"cpu-{i:02d}", 1000, 1024))
        elif i % 8 == 1:
            pods.append(Pod(f"multi-{i:02d}", 8000, 8192, num_gpu=2, gpu_milli=GPU_MILLI))
        elif i % 8 == 2:
            pods.append(Pod(f"whole-{i:02d}", 4000, 4096, num_gpu=1, gpu_milli=GPU_MILLI))
        else:
            pods.append(Pod(f"frac-{i:02d}", 2000, 2048, num_gpu=1, gpu_milli=100 + 20 * i))
    return pods


def demand(pods: Sequence[Pod]) -> int:
    return sum(p.gpu_demand_milli for p in pods)


def names(pods: Sequence[Pod]) -> list[str]:
    return [p.name for p in pods]


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fail(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"did not finish within {seconds}s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


MAX_POD = max(p.gpu_demand_milli for p in trace())


def test_trace_demand() -> None:
    assert demand(trace()) == 28_000


@pytest.mark.parametrize("tune", [0.5, 1.0, 2.0])
def test_same_seed_same_workload(tune: float) -> None:
    a = prepare_workload(trace(), 16, seed=7, tune=tune)
    b = prepare_workload(trace(), 16, seed=7, tune=tune)
    assert a == b


@pytest.mark.parametrize("gpus", [16, 40])
def test_input_order_does_not_matter(gpus: int) -> None:
    pods = trace()
    a = prepare_workload(pods, gpus, seed=3, tune=1.3)
    b = prepare_workload(list(reversed(pods)), gpus, seed=3, tune=1.3)
    assert a == b


@pytest.mark.parametrize("tune", [0.5, 2.0])
def test_different_seeds_differ(tune: float) -> None:
    runs = {tuple(names(prepare_workload(trace(), 16, seed=s, tune=tune))) for s in range(5)}
    assert len(runs) == 5


def test_originals_are_shuffled_not_sorted() -> None:
    out = prepare_workload(trace(), 40, seed=1, tune=1.2)
    originals = out[:40]
    assert sorted(names(originals)) == sorted(names(trace()))
    assert names(originals) != sorted(names(originals))


@pytest.mark.parametrize(("gpus", "tune"), [(28, 1.0), (30, 1.5), (40, 1.0), (16, 2.0), (10, 4.0)])
def test_tune_up_reaches_the_target_within_one_pod(gpus: int, tune: float) -> None:
    out = prepare_workload(trace(), gpus, seed=11, tune=tune)
    target = tune * gpus * GPU_MILLI
    assert abs(demand(out) - target) <= MAX_POD
    # It stops at the first sampled pod whose per-GPU share would pass the target.
    assert demand(out) > target - GPU_MILLI


def test_tune_up_appends_renamed_copies_of_trace_pods() -> None:
    by_name = {p.name: p for p in trace()}
    out = prepare_workload(trace(), 40, seed=5, tune=1.0)
    assert len(out) > 40
    assert sorted(names(out[:40])) == sorted(by_name)
    assert len(set(names(out))) == len(out)
    for copy in out[40:]:
        base, _, n = copy.name.rpartition("-tuned-")
        assert n.isdigit()
        original = by_name[base]
        assert copy.shape == original.shape


@pytest.mark.parametrize(("gpus", "tune"), [(16, 1.0), (16, 0.5), (10, 1.0), (4, 1.0), (16, 0.1)])
def test_tune_down_removes_pods_to_within_one_pod_below_target(gpus: int, tune: float) -> None:
    pods = trace()
    out = prepare_workload(pods, gpus, seed=2, tune=tune)
    target = tune * gpus * GPU_MILLI
    assert demand(out) <= target
    assert demand(out) > target - MAX_POD
    assert set(names(out)) < set(names(pods))
    assert len(set(names(out))) == len(out)


def test_tune_down_keeps_the_shuffled_order() -> None:
    full = names(prepare_workload(trace(), 40, seed=9, tune=1.0))  # tuned up: originals come first
    assert sorted(full[:40]) == sorted(names(trace()))
    cut = names(prepare_workload(trace(), 10, seed=9, tune=1.0))
    positions = [full.index(n) for n in cut]
    assert positions == sorted(positions)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="tune must be positive"):
        prepare_workload(trace(), 16, seed=0, tune=0)
    with pytest.raises(ValueError, match="pod list is empty"):
        prepare_workload([], 16, seed=0, tune=1.0)


def test_cpu_only_trace_is_rejected_instead_of_looping() -> None:
    with time_limit(5), pytest.raises(ValueError, match="no pod requests a GPU"):
        prepare_workload([Pod("a", 1, 1), Pod("b", 1, 1)], 4, seed=0, tune=1.0)


def test_the_draws_are_pinned_for_a_seed() -> None:
    """The shuffle, then resampling from the name-sorted trace (not the shuffled one), with one
    random stream: a change in any of these changes every published-protocol figure."""
    up = prepare_workload(trace(), 30, seed=7, tune=1.0)
    assert names(up[40:]) == ["whole-02-tuned-0", "frac-12-tuned-1", "frac-04-tuned-2"]
    down = prepare_workload(trace(), 20, seed=7, tune=1.0)
    assert names(down)[:6] == ["frac-03", "whole-02", "frac-13", "frac-11", "frac-06", "frac-12"]
    assert (len(down), demand(down)) == (25, 19_560)


def test_a_workload_at_its_target_already_is_left_as_it_is() -> None:
    """Ten one-GPU pods and two CPU pods on ten GPUs at --tune 1.0: nothing appended (the
    reference returns the pods when demand equals the target; CPU pods always pass the stop
    test and would be appended until a GPU pod is drawn)."""
    pods = [Pod(f"g{i}", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI) for i in range(10)]
    pods += [Pod("c0", 1000, 1024), Pod("c1", 1000, 1024)]
    for seed in range(5):
        out = prepare_workload(pods, 10, seed=seed, tune=1.0)
        assert sorted(names(out)) == sorted(names(pods))


def test_copies_never_take_a_name_the_trace_holds() -> None:
    """A workload saved after tuning holds ``a-tuned-0`` already: the copies made now get names
    of their own (two pods of one name would be one pod twice in a batch's plan)."""
    pods = [Pod("a", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI)]
    pods += [Pod(f"a-tuned-{i}", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI) for i in range(6)]
    for seed in range(10):
        out = prepare_workload(pods, 20, seed=seed, tune=1.0)
        assert len(out) == 20
        assert len(set(names(out))) == len(out)
