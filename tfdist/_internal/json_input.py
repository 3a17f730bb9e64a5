"""The one JSON reader for input a user gives: capped in size and depth, strict in numbers.

    value = load_json(text, source="TF_CONFIG", error=ClusterConfigError)
    value = read_json_file(path, source=f"--config file {quoted(path)}", hint=..., missing_hint=...)

Every program reads its JSON input here (`TF_CONFIG`, `CLUSTER_SPEC`,
`--config`, `--task_config`, job configs, manifests), so a pasted megabyte,
`'[' * 5000` (a `RecursionError` in `json`), `NaN`, `1e999`, a duplicated key
or a 5,000-digit number is one `UsageError` line, never a traceback and never a
value silently taken. Messages never quote the input: it may hold secrets.

`read_json_file` is the one reader of a JSON file (`--config`, `--job_config`,
`--hparam_tuning`, the packaged Vertex AI tables): a missing path, a directory,
an unreadable file, one over the cap (read no further than the cap, so a
mistaken path to a huge file costs no memory) and text that is not strict JSON
are each one line naming the file; what the value must hold is its caller's check.
"""

import json
import math
import re
from typing import Any, BinaryIO, Callable

from tfdist.errors import UsageError

MAX_JSON_BYTES = 1 << 20
# Config files and cluster variables nest a few levels; a manifest about ten.
MAX_JSON_DEPTH = 32

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of `[`/`{` in `text`, outside JSON strings (no recursion)."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group(0) in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows; expected a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range; expected a finite number")
    return value


def _unique_keys(pairs: list) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key[:60]!r} appears twice; expected each key once")
        result[key] = value
    return result


def load_json(
    text: str | bytes,
    *,
    source: str,
    error: type[UsageError] = UsageError,
    hint: str = "",
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parses `text` as strict JSON within the caps.

    Args:
        text: The JSON text (bytes are decoded as UTF-8).
        source: What holds it, for messages (e.g. `"TF_CONFIG"`, `"--config file 'a.json'"`).
        error: The `UsageError` subclass raised.
        hint: Appended to the message: what was expected or how to fix it.
        max_bytes: The largest input accepted.
        max_depth: The deepest nesting of arrays and objects accepted.

    Raises:
        UsageError: (`error`) Too large, too deep, not UTF-8, not JSON, a
            non-finite number, a duplicated key.
    """
    suffix = f"; {hint}" if hint else ""
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > max_bytes:
        raise error(f"{source} is {size} bytes, expected at most {max_bytes}{suffix}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as failure:
            raise error(
                f"{source} is not UTF-8 (byte {failure.start}), expected JSON text{suffix}"
            ) from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise error(
            f"{source} nests arrays or objects {depth} deep, expected at most {max_depth}{suffix}"
        )
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as failure:
        raise error(
            f"{source} is not valid JSON ({failure.msg} at line {failure.lineno} column "
            f"{failure.colno}){suffix}"
        ) from None
    except (ValueError, RecursionError) as failure:  # the hooks' refusals; huge integers
        reason = " ".join(str(failure).split())[:160]
        raise error(f"{source} is not accepted JSON ({reason}){suffix}") from None


def read_json_file(
    path,
    *,
    source: str,
    hint: str = "",
    missing_hint: str = "",
    error: type[UsageError] = UsageError,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """The strict JSON value in the file at `path`, read no further than `max_bytes`.

    Args:
        path: A file path, or a file as `importlib.resources` gives it (a packaged table).
        source: The file as messages name it, its path included (e.g.
            `"--config file 'a.json'"`).
        hint: Appended to the message when the file is there but wrong (too
            large, not JSON): what it should hold, how to fix it.
        missing_hint: Appended when there is no file to read (missing, a
            directory, unreadable): how to name the right one.
        error: The `UsageError` subclass raised.
        max_bytes: The largest file accepted.
        max_depth: The deepest nesting of arrays and objects accepted.

    Raises:
        UsageError: (`error`) Missing, a directory, unreadable, larger than
            `max_bytes`, or not strict JSON (see `load_json`).
    """
    suffix = f"; {hint}" if hint else ""
    missing = f"; {missing_hint}" if missing_hint else ""
    opener: Callable[[], BinaryIO] = (
        (lambda: path.open("rb")) if hasattr(path, "joinpath") else (lambda: open(path, "rb"))
    )
    try:
        with opener() as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{source} does not exist, expected a JSON file{missing}") from None
    except IsADirectoryError:
        raise error(f"{source} is a directory, expected a JSON file{missing}") from None
    except OSError as failure:
        raise error(
            f"{source} cannot be read ({failure.strerror or failure}), expected a readable "
            f"JSON file{missing}"
        ) from None
    if len(data) > max_bytes:
        raise error(
            f"{source} is larger than {max_bytes} bytes, expected a JSON file of at most "
            f"{max_bytes} bytes{suffix}"
        )
    return load_json(
        data, source=source, error=error, hint=hint, max_bytes=max_bytes, max_depth=max_depth
    )
