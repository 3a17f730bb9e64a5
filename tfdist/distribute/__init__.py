"""Who computes where: the cluster, the strategy chosen for it, its flags, per-worker files.

`cluster`, `choice` and `flags` parse configuration and do not import TensorFlow;
`strategy`, `worker_files` and `execution_tuner` do. See docs/architecture.md.
"""

__all__ = []
