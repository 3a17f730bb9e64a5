"""The dated tables of what Vertex AI offers, as data files beside this module.

    machines.json   accelerators, counts and TPU topologies per machine type; boot
                    disks per family; ARM machines; the GPUs DWS provisions
    images.json     the prebuilt TensorFlow images Vertex lists, with their end of
                    availability; the default prediction image
    network.json    machines' egress bandwidth and the Reduction Server defaults

Each file carries the date its contents were checked (`table_date`) and the pages
they come from (`sources`), so a table update is a change of data: edit the file,
run tests/unit/test_vertex_tables.py. The modules that use a table
(`trainer.vertex.machines`, `images`, `network`) load it once, at import, through
`load`, which checks it against the module's `SHAPE`: a malformed file is one
`UsageError` naming the file, the key and the shape expected there (at the
command line, `python -m trainer.submit`'s one `error:` line and exit 2).

Files are read with the package's one capped JSON reader
(`tfdist._internal.json_input.read_json_file`: capped, strict numbers, no
duplicated keys).
setup.cfg (`package_data`) and MANIFEST.in ship them in the wheel and the sdist.
"""

import datetime
import importlib.resources
import re
from typing import Any, Callable, Mapping

from tfdist._internal.json_input import read_json_file
from tfdist._internal.preconditions import quoted
from tfdist.errors import UsageError

MAX_TABLE_BYTES = 1 << 20


class Shape:
    """What a value in a table must be; `describe` says it in words."""

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, where: str, source: str) -> None:
        raise NotImplementedError


_FIX = "fix the file (trainer/vertex/tables/__init__.py describes the tables)"


def refuse(source: str, where: str, value: Any, expected: str, *, problem: str = "") -> None:
    """Raises the one error a malformed table gives: the file, the key, the shape expected.

    Args:
        source: The file.
        where: The key, e.g. `tpu_machines['ct5lp-hightpu-4t'].count` ("" for the whole file).
        value: The value found there (quoted, cut short).
        expected: The shape expected there, in words.
        problem: Said instead of "is VALUE" (e.g. "has no key count").
    """
    raise UsageError(
        f"Vertex AI table {source}: {where or 'the top level'} "
        f"{problem or f'is {quoted(value)}'}, expected {expected}; {_FIX}"
    )


class _Leaf(Shape):
    def __init__(self, words: str, accepts):
        self._words, self._accepts = words, accepts

    def describe(self) -> str:
        return self._words

    def check(self, value, where, source):
        if not self._accepts(value):
            refuse(source, where, value, self._words)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_date(value) -> bool:
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


TEXT = _Leaf("a non-empty string", lambda value: isinstance(value, str) and bool(value))
STRING = _Leaf("a string", lambda value: isinstance(value, str))
POSITIVE_INTEGER = _Leaf("a whole number > 0", lambda value: _is_int(value) and value > 0)
POSITIVE_NUMBER = _Leaf(
    "a number > 0",
    lambda value: (_is_int(value) or isinstance(value, float)) and value > 0,
)
DATE = _Leaf("a date YYYY-MM-DD", _is_date)
URL = _Leaf(
    "an https:// URL",
    lambda value: isinstance(value, str) and bool(re.fullmatch(r"https://\S+", value)),
)


class ListOf(Shape):
    """A non-empty JSON list whose items all have `item`'s shape."""

    def __init__(self, item: Shape):
        self.item = item

    def describe(self) -> str:
        return f"a non-empty list of ({self.item.describe()})"

    def check(self, value, where, source):
        if not isinstance(value, list) or not value:
            refuse(source, where, value, self.describe())
        for index, item in enumerate(value):
            self.item.check(item, f"{where}[{index}]", source)


class MapOf(Shape):
    """A non-empty JSON object of names to values of `value`'s shape."""

    def __init__(self, value: Shape):
        self.value = value

    def describe(self) -> str:
        return f"a non-empty object of names to ({self.value.describe()})"

    def check(self, value, where, source):
        if not isinstance(value, dict) or not value:
            refuse(source, where, value, self.describe())
        for key, item in value.items():
            TEXT.check(key, f"a key of {where}", source)
            self.value.check(item, f"{where}[{key!r}]", source)


class Record(Shape):
    """A JSON object with exactly these keys (`optional` ones may be left out)."""

    def __init__(self, fields: Mapping[str, Shape], *, optional: Mapping[str, Shape] = None):
        self.fields, self.optional = dict(fields), dict(optional or {})

    def describe(self) -> str:
        names = list(self.fields) + [f"{name} (optional)" for name in self.optional]
        return f"an object with the keys {', '.join(names)}"

    def check(self, value, where, source):
        if not isinstance(value, dict):
            refuse(source, where, value, self.describe())
        missing = [name for name in self.fields if name not in value]
        if missing:
            problem = f"has no key {', '.join(missing)}"
            refuse(source, where, value, self.describe(), problem=problem)
        unknown = [name for name in value if name not in self.fields and name not in self.optional]
        if unknown:
            problem = f"has the unknown key {quoted(', '.join(unknown))}"
            refuse(source, where, value, self.describe(), problem=problem)
        for name, shape in {**self.fields, **self.optional}.items():
            if name in value:
                shape.check(value[name], f"{where}.{name}" if where else name, source)


def table(fields: Mapping[str, Shape]) -> Record:
    """A whole table: its date, its sources, a note on what it is, and `fields`."""
    return Record({"about": TEXT, "table_date": DATE, "sources": ListOf(URL), **fields})


def expect(condition: bool, source: str, where: str, value: Any, expected: str) -> None:
    """`refuse` unless `condition`: for the rules of a table its shape cannot say."""
    if not condition:
        refuse(source, where, value, expected)


def read(path, shape: Shape, check: Callable[[dict, str], None] | None = None) -> dict:
    """The table in the file at `path` (a path or an `importlib.resources` file), checked.

    Args:
        path: The file.
        shape: What the whole table must be.
        check: Called with the table and the file's name, for the rules `shape`
            cannot say (names that must appear elsewhere in the table); raises
            through `expect`.

    Raises:
        UsageError: The file is missing, too large, not strict JSON, or not of
            `shape`; the message names the file, the key and the shape expected.
    """
    source = str(path)
    value = read_json_file(
        path,
        source=f"Vertex AI table {source}",
        hint=_FIX,
        missing_hint="the package ships it: reinstall tfdist",
        max_bytes=MAX_TABLE_BYTES,
    )
    shape.check(value, "", source)
    if check:
        check(value, source)
    return value


def packaged(name: str):
    """The packaged table file `name` (e.g. `machines.json`), as `importlib.resources` gives it."""
    return importlib.resources.files(__name__).joinpath(name)


def load(name: str, shape: Shape, check: Callable[[dict, str], None] | None = None) -> dict:
    """The packaged table `name`, checked (see `read`). Modules call it once, at import."""
    return read(packaged(name), shape, check)
