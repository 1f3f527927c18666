"""Hard constraints of the batch model, one module each, each exposing ``build(inst, model, v)``.

GPU model constraints and per-pod feasibility are enforced before the model
exists: a candidate is only created where one pod of its shape fits alone
(``solver.instance``).
"""

from gpusched.solver.constraints import (
    affinity,
    anti_affinity,
    capacity,
    demand,
    gang,
    island,
    mig,
    ports,
    share,
    spread,
    whole_gpu,
)

ALL = (demand, capacity, ports, affinity, anti_affinity, spread, mig, whole_gpu, island, share, gang)
"""Every constraint module, in build order: mig before whole_gpu (which counts the GPUs layouts
take), whole_gpu before island and share (which use its variables)."""

__all__ = [
    "ALL",
    "anti_affinity",
    "capacity",
    "demand",
    "gang",
    "island",
    "mig",
    "ports",
    "share",
    "spread",
    "whole_gpu",
]
