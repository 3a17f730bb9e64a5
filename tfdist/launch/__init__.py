"""Local multi-process clusters on loopback: the launcher, the cluster, the pytest fixture.

- `python -m tfdist.launch --workers N [--ps M] [--chief] [--evaluator] -- CMD...`
  (`launcher`, which defines the launcher's absl flags: imported only by the command);
- `local_cluster.LocalCluster`: the same cluster from Python;
- `preload`: forking a cluster's Python tasks from one import of TensorFlow;
- `testing`: the `local_cluster` pytest fixture and `poll_until`.

None of them imports TensorFlow (the preload server does, in its own process). See docs/local_cluster.md.
"""

__all__ = []
