"""Small file helpers over `tf.io.gfile`, so they work on local paths and `gs://`."""

import json
import os

import tensorflow as tf


def write_json_atomically(path: str, payload: dict) -> None:
    """Writes `payload` as JSON to `path` through a temporary file and a rename.

    Readers see the old file or the whole new one, never a partial write, on
    filesystems with atomic rename (object stores copy, then delete).
    """
    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as handle:
        handle.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)
