"""Old module paths of tfdist, kept importable after the regrouping (docs/architecture.md).

`MOVED` maps each old path to its new one. `install()` (called by
`tfdist/__init__.py`) puts a finder first on `sys.meta_path` that answers an
old path with the very module object of the new path, so monkeypatching,
private names and `isinstance` behave as before, and warns once per process
with a `DeprecationWarning` that names the new path. A moved package maps its
submodules too (`tfdist.checkpointing.store` is `tfdist.backups.store`).

Keep `MOVED` a plain dict of string literals: the script that rewrote the
imports reads it as data (regroup: keep old paths).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "tfdist.batching": "tfdist.data.batching",
    "tfdist.checkpointing": "tfdist.backups",
    "tfdist.cluster": "tfdist.distribute.cluster",
    "tfdist.custom_steps": "tfdist.tasks.custom_steps",
    "tfdist.evaluation": "tfdist.outputs.evaluation",
    "tfdist.execution_tuner": "tfdist.distribute.execution_tuner",
    "tfdist.export": "tfdist.outputs.export",
    "tfdist.files": "tfdist._internal.files",
    "tfdist.first_batch_check": "tfdist.tasks.first_batch_check",
    "tfdist.flags": "tfdist.distribute.flags",
    "tfdist.hypertune": "tfdist.outputs.hypertune",
    "tfdist.local_cluster": "tfdist.launch.local_cluster",
    "tfdist.preconditions": "tfdist._internal.preconditions",
    "tfdist.preemption_agreement": "tfdist.preemption.agreement",
    "tfdist.schedules": "tfdist.optimizers.schedules",
    "tfdist.signal_relay": "tfdist.preemption.signal_relay",
    "tfdist.startup_logs": "tfdist._internal.startup_logs",
    "tfdist.strategy": "tfdist.distribute.strategy",
    "tfdist.strategy_choice": "tfdist.distribute.choice",
    "tfdist.testing": "tfdist.launch.testing",
    "tfdist.weighting": "tfdist.tasks.weighting",
    "tfdist.worker_files": "tfdist.distribute.worker_files",
}


def new_name(old: str) -> str | None:
    """The new path of `old` (a moved module or a submodule of a moved package), else None."""
    prefix = old
    while prefix:
        if prefix in MOVED:
            return MOVED[prefix] + old[len(prefix) :]
        prefix = prefix.rpartition(".")[0]
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module of its new path."""

    def __init__(self):
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(
            f"{spec.name} moved to {new}; import {new} instead "
            f"(the old path is an alias of the same module)",
            DeprecationWarning,
            stacklevel=2,
        )  # importlib's frames are skipped
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        """The module is the new path's, already executed: only its own spec is put back."""
        module.__spec__ = self._specs.pop(module.__spec__.name)


_FINDER = _MovedFinder()


def install() -> None:
    """Puts the finder first on `sys.meta_path` (before the path finder would load a copy)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
