"""The import rules of docs/architecture.md.

- `tfdist` never imports `trainer` (every import statement of every module, lazy ones too);
- a tfdist package imports only the packages its row of the layer table allows;
- no two tfdist modules import each other, directly or through others (imports inside
  functions count);
- the configuration modules never import TensorFlow (tests/multiprocess/test_architecture.py,
  in a fresh interpreter);
- tfdist/ has at most `MAX_ROOMS` rooms (public top-level modules and packages);
- Keras-registered names (`tfdist>LARS`, ...) do not depend on module paths.
"""

import ast
import pathlib
import zipfile

import numpy as np

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
    "distribute.choice": {"errors", "_internal", "distribute.cluster"},
    "keras_compat": {"errors"},
    "optimizers": {"errors"},
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
}

# The rooms a reader of tfdist/ walks through: its public top-level modules and packages
# (`__init__.py` and the private `_internal` aside; the same set as `tfdist.MODULES`).
MAX_ROOMS = 15


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imported_modules(path: pathlib.Path):
    """(line, module) of every import statement of the file, those inside functions included."""
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_tfdist_has_at_most_max_rooms_rooms():
    rooms = sorted(
        path.stem if path.suffix else path.name
        for path in TFDIST.iterdir()
        if not path.name.startswith("_")
        and (path.suffix == ".py" or (path / "__init__.py").is_file())
    )
    assert len(rooms) <= MAX_ROOMS, (
        f"tfdist/ has {len(rooms)} top-level modules and packages ({', '.join(rooms)}), "
        f"expected at most {MAX_ROOMS}: put the new module in the package whose job it shares"
    )


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


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in _tfdist_files()}
    return {
        name: {module for _, module in _imported_modules(path) if module in modules} - {name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_tfdist_modules_import_each_other():
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_keras_registered_names_do_not_depend_on_module_paths(tmp_path):
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
