"""Operational telemetry of the scheduler daemon: the Prometheus metrics it exports (batch sizes,
solve times and gaps, scheduled and unschedulable pods, bind errors, queue depths, cluster GPU
allocation and fragmentation, leadership, configuration reloads) in a registry of its own, and the
small HTTP server that serves them on ``/metrics`` beside the ``/healthz`` and ``/readyz`` probes;
and what it reads: GPU utilisation measured by DCGM, polled from Prometheus into a cached view
(``source``).
"""

from gpusched.metrics.exporter import HealthServer, ReadyCheck, SchedulerMetrics

__all__ = ["HealthServer", "ReadyCheck", "SchedulerMetrics"]
