"""The scheduler process: watches, queue, batch solves, binds, leadership, health.

Tasks (each named and supervised; the first to fail stops the process, so a
Deployment restarts it rather than leaving a half-working scheduler):

- ``watch-nodes``, ``watch-bound-pods``, ``watch-pending-pods``, ``watch-config``:
  reflectors feeding the cache, the queue and the configuration;
- ``leader``: the Lease (only the leader schedules; a standby keeps its cache warm);
- ``schedule``: waits until every watch has listed, then draws batches from the
  queue, solves each in a worker thread and starts its binds;
- ``utilisation`` (with ``--prometheus-url``): polls Prometheus for GPU utilisation
  measured by DCGM; a batch reads the last answer and leaves busy GPUs out;
- ``health``: ``/metrics``, ``/healthz``, ``/readyz``.

Binds, Events and conditions run as short named tasks limited by a semaphore
and the client's rate limit.  Shutdown (SIGTERM/SIGINT) stops the schedule
loop, lets in-flight binds finish (bounded), releases the Lease and closes the
connection, in that order.
"""

from gpusched.daemon.run import StartupError, explain_pod, report_costs, run_daemon
from gpusched.daemon.scheduler import Scheduler
from gpusched.daemon.settings import SCHEDULER_NAME, DaemonSettings

__all__ = [
    "SCHEDULER_NAME",
    "DaemonSettings",
    "Scheduler",
    "StartupError",
    "explain_pod",
    "report_costs",
    "run_daemon",
]
