"""Hard constraints of the batch model, one module each, each exposing ``build(inst, model, v)``.

GPU model constraints and per-pod feasibility are enforced before the model
exists: a candidate is only created where one pod of its shape fits alone
(``solver.instance``).
"""

from gpusched.solver.constraints import capacity, demand, share, whole_gpu

ALL = (demand, capacity, whole_gpu, share)
"""Every constraint module, in build order (whole_gpu before share: share uses its variables)."""

__all__ = ["ALL", "capacity", "demand", "share", "whole_gpu"]
