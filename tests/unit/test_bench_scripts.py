"""The benchmark scripts import only what exists.

Benchmarks are not run by the suite (they take minutes), and most import the
project lazily inside functions, so a module moved in a refactoring broke
`bench/bench_fused_multiworker.py` and `bench/bench_replica_jit.py` unnoticed
until someone ran them. This reads every import of `tfdist`/`trainer` in
`bench/*.py` and resolves it.
"""

import ast
import importlib
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH_SCRIPTS = sorted((REPO / "bench").glob("*.py"))


def _project_imports(path: pathlib.Path) -> list[tuple[str, str | None]]:
    """(module, name) pairs of the script's project imports; name None for `import module`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ("tfdist", "trainer"):
                found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, None)
                for alias in node.names
                if alias.name.split(".")[0] in ("tfdist", "trainer")
            ]
    return found


def test_there_are_benchmark_scripts():
    assert len(BENCH_SCRIPTS) >= 5


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda path: path.name)
def test_every_project_import_of_a_benchmark_resolves(script):
    missing = []
    for module_name, name in _project_imports(script):
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            missing.append(f"{module_name} ({error})")
            continue
        if name is None or hasattr(module, name):
            continue
        try:
            importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports what does not exist: {missing}"
