"""gpusched: a secondary Kubernetes scheduler that packs GPUs with CP-SAT."""

__version__ = "0.1.0"
