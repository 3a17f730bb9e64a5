"""tfdist: distributed training of Keras 3 models on TensorFlow.

The public surface is the modules in `__all__` and the names in their own
`__all__` (docs/api.md lists them; tests/unit/test_public_api.py pins them).
`tfdist.data`, `tfdist.resumable`, ... are attributes of this package without
an import of their own, and so are the stable entry points below, but nothing
is imported until it is first used: `import tfdist` loads no TensorFlow. The
packages and which may import which: docs/architecture.md.
"""

import importlib

__version__ = "0.1.0"

# The public modules, each loaded on first use.
MODULES = (
    "backups",
    "callbacks",
    "cli",
    "data",
    "distribute",
    "errors",
    "keras_compat",
    "launch",
    "optimizers",
    "outputs",
    "parameter_server",
    "preemption",
    "ray",
    "resumable",
    "tasks",
)

# The stable entry points: name -> the module that defines (or re-exports) it.
ENTRY_POINTS = {
    "BackupAndRestore": "tfdist.callbacks",
    "FileSource": "tfdist.data",
    "LAMB": "tfdist.optimizers",
    "LARS": "tfdist.optimizers",
    "LocalCluster": "tfdist.launch.local_cluster",
    "RandomAccessSource": "tfdist.data",
    "Task": "tfdist.tasks",
    "UsageError": "tfdist.errors",
    "WarmupDecay": "tfdist.optimizers.schedules",
    "fit": "tfdist.resumable",
    "set_strategy_from_environment": "tfdist.distribute.strategy",
    "strategy_from_environment": "tfdist.distribute.strategy",
}

__all__ = ["__version__", *MODULES, *sorted(ENTRY_POINTS)]


def __getattr__(name: str):
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in ENTRY_POINTS:
        return getattr(importlib.import_module(ENTRY_POINTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
