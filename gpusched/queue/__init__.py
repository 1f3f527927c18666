"""Pending pods between the watch and the solver: active, backoff and unschedulable."""
