"""Reading the JSON files the submitter takes (`--job_config`, `--hparam_tuning`).

Every read is capped (`MAX_CONFIG_BYTES`): a config file is a few hundred
bytes, and a mistaken path to a large file must not be read into memory.
"""

import os
from typing import Iterable

from tfdist._internal.json_input import load_json
from tfdist.errors import UsageError
from trainer.vertex.checks import quoted, require

MAX_CONFIG_BYTES = 1 << 20


def read_json_object(path: str, *, flag: str, keys: Iterable[str], example: str) -> dict:
    """The JSON object in the file at `path`, whose keys must be in `keys`.

    Args:
        path: The file.
        flag: The flag that named it, for messages (e.g. `--job_config`).
        keys: Allowed keys.
        example: A shipped example file, for messages.

    Raises:
        UsageError: Missing, a directory, larger than `MAX_CONFIG_BYTES`, not
            UTF-8 JSON, not an object, or with unknown keys.
    """
    shown = quoted(path)
    require(
        os.path.exists(path),
        f"{flag} file {shown} does not exist, expected a JSON file such as {example}",
    )
    require(
        not os.path.isdir(path),
        f"{flag} {shown} is a directory, expected a JSON file such as {example}",
    )
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise UsageError(
            f"{flag} file {shown} cannot be read ({error.strerror}), expected a readable JSON file"
        ) from None
    require(
        len(data) <= MAX_CONFIG_BYTES,
        f"{flag} file {shown} is larger than {MAX_CONFIG_BYTES} bytes, expected a small "
        f"JSON object of option names to values such as {example}",
    )
    raw = load_json(
        data,
        source=f"{flag} file {shown}",
        hint="expected an object of option names to values",
        max_bytes=MAX_CONFIG_BYTES,
    )
    require(
        isinstance(raw, dict),
        f"{flag} file {shown} holds a JSON {type(raw).__name__}, "
        f"expected an object of option names to values",
    )
    nulls = sorted(key for key, value in raw.items() if value is None)
    require(
        not nulls,
        f"{flag} file {shown} has null for {quoted(', '.join(nulls))}, expected a value; "
        f"leave the key out to keep its default",
    )
    allowed = tuple(keys)
    unknown = sorted(set(raw) - set(allowed))
    require(
        not unknown,
        f"{flag} file {shown} has unknown key(s) "
        f"{quoted(', '.join(unknown))}, expected names from: "
        f"{', '.join(allowed)}",
    )
    return raw
