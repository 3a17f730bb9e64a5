"""What README.md and docs/*.md name exists: every `tfdist.…`/`trainer.…` dotted path is a
module, or a name defined in one, and every repository file path is a file or directory.

Checked on disk (an `ast` read of the module), so nothing is imported (no TensorFlow) and a
name a module `__getattr__` answers counts only when the module declares it in `__all__`
(tfdist's entry points, loaded on first use)."""

import ast
import functools
import pathlib
import re

from tests.unit.test_public_api import declared_names

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]

_DOTTED = re.compile(r"(?<![\w./-])((?:tfdist|trainer)(?:\.[A-Za-z_]\w*)+)(?![\w/-]|\.\w)")
_FILE = re.compile(
    r"(?<![\w./-])((?:tfdist|trainer|tests|bench|docs|configs|examples|docker)/[\w./-]*"
    r"\.(?:py|md|json|yaml|yml|cfg|toml|txt|sh|png))(?![\w/])"
)


@functools.cache
def _defined_names(path: pathlib.Path) -> frozenset:
    """Names a module defines or imports at its top level (`if`/`try` blocks included, function
    bodies such as a module `__getattr__` not)."""
    names, statements = set(), list(ast.parse(path.read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            statements += [
                *node.body,
                *getattr(node, "orelse", ()),
                *getattr(node, "finalbody", ()),
                *(
                    statement
                    for handler in getattr(node, "handlers", ())
                    for statement in handler.body
                ),
            ]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update(declared_names(path) or ())
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a module of this checkout or a name one of them defines."""
    parts = dotted.split(".")
    directory = ROOT
    for index, part in enumerate(parts):
        if (directory / part / "__init__.py").is_file():
            directory = directory / part
            continue
        module = directory / f"{part}.py"
        if module.is_file():
            rest = parts[index + 1 :]
            return not rest or rest[0] in _defined_names(module)
        # A name defined in the package itself (and, for a class, its attribute: not checked).
        return index > 0 and part in _defined_names(directory / "__init__.py")
    return True


def _references(text: str):
    # Variables a code example names `trainer` (e.g. `trainer = ParameterServerTrainer(...)`)
    # are not the package.
    variables = set(re.findall(r"^\s*(tfdist|trainer)\s*=", text, re.M))
    for number, line in enumerate(text.splitlines(), 1):
        for match in _DOTTED.finditer(line):
            dotted = match.group(1)
            if dotted.split(".")[0] in variables:
                continue
            yield number, "module path", dotted, resolves(dotted)
        for match in _FILE.finditer(line):
            yield number, "file", match.group(1), (ROOT / match.group(1)).exists()


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def stale_references(paths=DOCS) -> list[str]:
    found = []
    for path in paths:
        text = path.read_text()
        found += [
            f"{_shown(path)}:{number}: {kind} {name} does not exist"
            for number, kind, name, exists in _references(text)
            if not exists
        ]
    return found


def test_every_module_path_and_file_the_docs_name_exists():
    assert not stale_references(), "\n".join(stale_references())


def test_the_check_sees_a_stale_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Use `tfdist.testing` or `tfdist.launch.testing.local_cluster` "
        "(see tests/multiprocess/test_nothing.py and tfdist/launch/testing.py); "
        "`tfdist.callbacks.HypertuneCallback`, not `tfdist.outputs.hypertune.HypertuneCallback`.\n"
    )
    found = [line.split(": ", 1)[1] for line in stale_references([page])]
    assert found == [
        "module path tfdist.testing does not exist",
        "module path tfdist.outputs.hypertune.HypertuneCallback does not exist",
        "file tests/multiprocess/test_nothing.py does not exist",
    ]
