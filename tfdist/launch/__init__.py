"""Local multi-process clusters on loopback: the launcher, the cluster, the pytest fixture.

- `python -m tfdist.launch --workers N [--ps M] [--chief] [--evaluator] -- CMD...`
  (`launcher`, which defines the launcher's absl flags: imported only by the command);
- `local_cluster.LocalCluster`: the same cluster from Python;
- `preload`: forking a cluster's Python tasks from one import of TensorFlow;
- `testing`: the `local_cluster` pytest fixture and `poll_until`.

None of them imports TensorFlow (the preload server does, in its own process). See docs/local_cluster.md.
"""

import importlib

_SUBMODULES = ("launcher", "local_cluster", "preload", "testing")


def __getattr__(name: str):
    # `tfdist.launch` was the launcher module: its names stay reachable here without
    # defining the launcher's flags in every program that imports the package
    # (`from tfdist.launch import local_cluster` asks here first).
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(f"{__name__}.launcher"), name)
