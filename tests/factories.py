"""Small builders shared by the unit tests."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.model import GPU_MILLI, Cluster, ClusterState, Node, Plan, Pod
from gpusched.solver.fragmentation import TypicalPods
from gpusched.solver.params import Limits, SolverParams
from gpusched.solver.registry import make_policy
from gpusched.solver.validate import validate_plan


def gpu_node(name: str = "n0", gpus: int = 2, cpu: int = 8000, mem: int = 32768, model: str = "A100") -> Node:
    """A node with ``gpus`` GPUs of ``model`` (no model when it has no GPU)."""
    return Node(name, cpu, mem, gpu_count=gpus, gpu_model=model if gpus else "")


def pod(name: str, cpu: int = 1000, gpus: int = 0, milli: int = 0, models: Sequence[str] = (), mem: int = 1024) -> Pod:
    """A pod; ``gpus`` without ``milli`` means whole GPUs."""
    if gpus and not milli:
        milli = GPU_MILLI
    return Pod(name, cpu, mem, num_gpu=gpus, gpu_milli=milli, gpu_models=frozenset(models))


def place_checked(
    policy: str, cluster: Cluster, pods: Sequence[Pod], state: ClusterState | None = None, *, hint_kept: bool = False
) -> Plan:
    """``policy``'s plan for ``pods``, checked valid; for CP-SAT, its own plan (no fallback to the
    greedy warm start, nor the warm start kept unless ``hint_kept``)."""
    st = cluster.empty_state() if state is None else state
    params = SolverParams(limits=Limits(time_limit_s=1.0, workers=1))
    plan = make_policy(policy, cluster, TypicalPods.from_pods(pods), 0, params).place(pods, st)
    validate_plan(plan, st, pods)
    assert "FALLBACK" not in plan.stats.status  # CP-SAT's own plan, not the greedy one it started from
    assert hint_kept or plan.stats.status != "HINT_KEPT"
    return plan
