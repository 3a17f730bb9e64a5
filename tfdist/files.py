"""Small file helpers over `tf.io.gfile`, so they work on local paths and `gs://`."""

import json
import math
import os

import tensorflow as tf


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
        raise ValueError(f"{bad} is not a finite number, which JSON cannot hold; write None "
                         f"for a missing value (not writing {path})")
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as handle:
        handle.write(text)
    tf.io.gfile.rename(temporary, path, overwrite=True)
