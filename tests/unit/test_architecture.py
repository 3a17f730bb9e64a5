"""The import rules of docs/architecture.md, and the old module paths kept importable.

- `tfdist` never imports `trainer` (every import statement of every module, lazy ones too);
- a tfdist package imports only the packages its row of the layer table allows;
- the configuration modules never import TensorFlow (imported in a fresh interpreter);
- every path in `tfdist._moved.MOVED` is the very module object of its new path, with a
  DeprecationWarning naming the new path; Keras-registered names did not move.

(regroup: keep old paths - the rewrite of issue 22 skips this file.)
"""

import ast
import importlib
import pathlib
import sys
import warnings
import zipfile

import numpy as np
import pytest

from tfdist import _moved

ROOT = pathlib.Path(__file__).resolve().parents[2]
TFDIST = ROOT / "tfdist"

# Which tfdist units may import which (docs/architecture.md, "Layers"). A unit is a top-level
# module or package of tfdist; distribute's configuration modules are units of their own,
# below everything that needs TensorFlow. Every unit may import itself.
ALLOWED = {
    "errors": set(),
    "_internal": {"errors"},
    "cli": {"errors"},
    "distribute.cluster": {"errors", "_internal"},
    "distribute.choice": {"errors", "distribute.cluster"},
    "optimizer_choice": {"errors"},  # optimizer and schedule names (configuration, no TensorFlow)
    "keras_compat": {"errors"},
    "optimizers": {"errors", "optimizer_choice"},
    "backups": {"errors", "_internal"},
    "data": {"errors", "_internal", "keras_compat"},
    "tasks": {"errors", "_internal", "data", "keras_compat"},
    "parameter_server": {"errors", "_internal", "cli", "distribute.cluster", "keras_compat"},
    "preemption": {"errors", "_internal", "cli", "backups"},
    "outputs": {"errors", "_internal"},
    "distribute": {
        "errors",
        "_internal",
        "cli",
        "distribute.cluster",
        "distribute.choice",
        "keras_compat",
        "parameter_server",
    },
    "launch": {"errors", "_internal", "cli", "distribute.cluster"},
    "callbacks": {"errors", "_internal", "backups", "distribute.cluster", "outputs", "preemption"},
    "resumable": {
        "errors",
        "cli",
        "_internal",
        "callbacks",
        "data",
        "distribute",
        "distribute.cluster",
        "preemption",
    },
    "ray": {
        "errors",
        "_internal",
        "backups",
        "distribute.cluster",
        "launch",
        "parameter_server",
        "preemption",
    },
    "_moved": set(),
}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imported_modules(path: pathlib.Path):
    """(line, module) of every import, lazy ones included, but not module `__getattr__`
    bodies (they keep moved names importable and load the new module only on request)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for top in tree.body
        if isinstance(top, ast.FunctionDef) and top.name == "__getattr__"
        for node in ast.walk(top)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                yield node.lineno, name if _is_module(name) else node.module


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tfdist" or len(parts) == 1:
        return None
    if parts[1] == "distribute" and len(parts) > 2 and parts[2] in ("cluster", "choice"):
        return f"distribute.{parts[2]}"
    return parts[1]


def _tfdist_files():
    return sorted(TFDIST.rglob("*.py"))


def test_tfdist_never_imports_trainer():
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _tfdist_files()
        for line, module in _imported_modules(path)
        if module == "trainer" or module.startswith("trainer.")
    ]
    assert not found, "\n".join(found)


def test_the_job_writers_do_not_import_each_other():
    """`trainer.kubernetes` and `trainer.vertex` share `trainer.submission`; neither imports
    the other (docs/architecture.md, "The trainer")."""
    found = {
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for package, other in (("kubernetes", "vertex"), ("vertex", "kubernetes"))
        for path in sorted((ROOT / "trainer" / package).rglob("*.py"))
        for line, module in _imported_modules(path)
        if module == f"trainer.{other}" or module.startswith(f"trainer.{other}.")
    }
    assert not found, "\n".join(sorted(found))


def test_every_tfdist_unit_is_in_the_layer_table():
    units = {_unit(_module_name(path)) for path in _tfdist_files()} - {None}
    assert not units - set(ALLOWED), (
        f"{sorted(units - set(ALLOWED))} not in the layer table: add a row to ALLOWED here and "
        f"to docs/architecture.md"
    )


def test_tfdist_packages_import_only_what_the_layer_table_allows():
    found = []
    for path in _tfdist_files():
        importer = _unit(_module_name(path))
        for line, module in _imported_modules(path):
            imported = _unit(module)
            if imported is None or imported == importer or importer is None:
                continue
            if imported not in ALLOWED[importer]:
                found.append(
                    f"{path.relative_to(ROOT)}:{line}: {importer} imports {imported} "
                    f"({module}); allowed: {sorted(ALLOWED[importer])}"
                )
    assert not found, "\n".join(found)


def _forget(old: str) -> None:
    """Drops the alias (not the module) so the next import goes through the finder again."""
    for name in [name for name in sys.modules if name == old or name.startswith(old + ".")]:
        del sys.modules[name]
    parent, _, leaf = old.rpartition(".")
    if parent in sys.modules and getattr(sys.modules[parent], leaf, None) is not None:
        delattr(sys.modules[parent], leaf)


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old):
    new = _moved.MOVED[old]
    module = importlib.import_module(new)
    _forget(old)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        alias = importlib.import_module(old)
    assert alias is module
    assert module.__name__ == new and module.__spec__.name == new


def test_old_imports_of_every_form_reach_the_same_objects(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import tfdist.checkpointing.store as old_store  # pylint: disable=g-import-not-at-top
        from tfdist import strategy_choice  # pylint: disable=g-import-not-at-top
        from tfdist.cluster import Cluster  # pylint: disable=g-import-not-at-top
    from tfdist.backups import store  # pylint: disable=g-import-not-at-top
    from tfdist.distribute import choice, cluster  # pylint: disable=g-import-not-at-top

    assert strategy_choice is choice and old_store is store and Cluster is cluster.Cluster
    monkeypatch.setattr("tfdist.cluster.CHIEF", "patched")
    assert cluster.CHIEF == "patched"


def test_callbacks_that_moved_are_the_same_classes():
    from tfdist import callbacks, parameter_server  # pylint: disable=g-import-not-at-top
    from tfdist.outputs import evaluation, hypertune  # pylint: disable=g-import-not-at-top

    assert evaluation.CheckpointExporter is callbacks.CheckpointExporter
    assert hypertune.HypertuneCallback is callbacks.HypertuneCallback
    with pytest.warns(DeprecationWarning, match="tfdist.outputs.evaluation.SidecarEvaluator"):
        assert parameter_server.SidecarEvaluator is evaluation.SidecarEvaluator
    with pytest.warns(DeprecationWarning, match="tfdist.callbacks.CheckpointExporter"):
        assert parameter_server.CheckpointExporter is callbacks.CheckpointExporter


def test_keras_registered_names_did_not_move(tmp_path):
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.optimizers import LAMB, LARS  # pylint: disable=g-import-not-at-top
    from tfdist.optimizers.schedules import WarmupDecay  # pylint: disable=g-import-not-at-top
    from tfdist.parameter_server import ShardedEmbedding  # pylint: disable=g-import-not-at-top

    names = {
        cls: keras.saving.get_registered_name(cls)
        for cls in (LARS, LAMB, WarmupDecay, ShardedEmbedding)
    }
    assert names == {
        LARS: "tfdist>LARS",
        LAMB: "tfdist>LAMB",
        WarmupDecay: "tfdist>WarmupDecay",
        ShardedEmbedding: "tfdist>ShardedEmbedding",
    }
    # A model.keras as main wrote it before the move: its config names the old module paths.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=LARS(WarmupDecay(0.1, total_steps=10, warmup_steps=2)), loss="mse")
    model.train_on_batch(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"))
    saved = tmp_path / "new.keras"
    model.save(saved)
    old = tmp_path / "old.keras"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(old, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "config.json":
                text = data.decode().replace('"tfdist.optimizers.schedules"', '"tfdist.schedules"')
                assert '"tfdist.schedules"' in text
                data = text.encode()
            target.writestr(item, data)
    loaded = keras.saving.load_model(old, safe_mode=True)
    assert isinstance(loaded.optimizer, LARS)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.optimizer.get_config()["learning_rate"]["registered_name"] == "tfdist>WarmupDecay"
