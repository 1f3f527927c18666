"""Pure, immutable inputs of placement: nodes, pods, cluster state and plans.

No I/O and no asyncio here; everything is hashable or read-only.
"""

from gpusched.model.cluster import Cluster, ClusterState, mig_plan
from gpusched.model.node import GPU_MILLI, Node
from gpusched.model.placement import Assignment, Plan, SolveStats
from gpusched.model.pod import Pod, PodShape
from gpusched.model.quantity import QuantityError, cpu_milli, memory_mib, parse_quantity

__all__ = [
    "GPU_MILLI",
    "Assignment",
    "Cluster",
    "ClusterState",
    "Node",
    "Plan",
    "Pod",
    "PodShape",
    "QuantityError",
    "SolveStats",
    "cpu_milli",
    "memory_mib",
    "mig_plan",
    "parse_quantity",
]
