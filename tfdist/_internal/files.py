"""Atomic file writes for local paths and `gs://`-style URLs (one way, used everywhere).

Local paths use `os` (no TensorFlow import: the TensorFlow-free modules write
with it too); a path with a scheme (`gs://`, `ram://`) goes through
`tf.io.gfile`, loaded on first use.
"""

import json
import math
import os
import tempfile
from typing import Callable


def _non_finite_path(value, path: str = "") -> str | None:
    """The key path of the first NaN/Inf number in `value`, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "(top level)"
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def write_json_atomically(path: str, payload: dict) -> None:
    """Writes `payload` as strict JSON to `path` through a temporary file and a rename.

    Readers see the old file or the whole new one, never a partial write, on
    filesystems with atomic rename (object stores copy, then delete).

    Raises:
        ValueError: `payload` holds NaN or an infinity, which strict JSON
            cannot represent (write `None` instead); nothing is written.
    """
    bad = _non_finite_path(payload)
    if bad is not None:
        raise ValueError(
            f"{bad} is not a finite number, which JSON cannot hold; write None "
            f"for a missing value (not writing {path})"
        )
    write_atomically(path, json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _is_url(path: str) -> bool:
    return "://" in path


def replace_atomically(
    path: str, write: Callable[[str], None], *, temporary: str | None = None, suffix: str = ""
) -> None:
    """Calls `write(temporary)`, then renames the temporary file over `path`.

    Readers see the old file or the whole new one, never a partial write, on
    filesystems with atomic rename (object stores copy, then delete). If
    `write` raises, `path` is untouched and the temporary file is removed.

    Args:
        path: The file to replace.
        write: Writes the new content to the path it is given (e.g. `model.save`).
        temporary: Where to write first; default a fresh name beside `path`
            (a caller that cleans its own leftovers passes a name it recognizes).
        suffix: Ending of the default temporary name (Keras wants `.keras`).
    """
    directory, name = os.path.split(path)
    if temporary is None:
        if _is_url(path):
            temporary = os.path.join(
                directory, f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}{suffix}"
            )
        else:
            handle, temporary = tempfile.mkstemp(
                dir=directory or ".", prefix=f".{name}.tmp-", suffix=suffix
            )
            os.close(handle)
    if _is_url(temporary) or _is_url(path):
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        exists, remove = tf.io.gfile.exists, tf.io.gfile.remove

        def rename():
            tf.io.gfile.rename(temporary, path, overwrite=True)
    else:
        exists, remove = os.path.exists, os.remove

        def rename():
            os.replace(temporary, path)

    try:
        write(temporary)
        rename()
    except BaseException:
        if exists(temporary):
            remove(temporary)
        raise


def write_atomically(path: str, data: str | bytes, *, temporary: str | None = None) -> None:
    """Writes `data` (text as UTF-8) to `path` atomically; see `replace_atomically`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data

    def write(target: str) -> None:
        if _is_url(target):
            import tensorflow as tf  # pylint: disable=g-import-not-at-top

            with tf.io.gfile.GFile(target, "wb") as handle:
                handle.write(payload)
        else:
            with open(target, "wb") as handle:
                handle.write(payload)

    replace_atomically(path, write, temporary=temporary)
