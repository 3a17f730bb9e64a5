"""The training data's size, counted once and kept beside the backups.

A count is a whole pass over the data (for a task's own dataset, a pass that
decodes every example). It is written to `<backup_dir>/input_count.json` by the
chief, keyed by what decides the data (the task's identity and, for files,
their names and sizes), so a restart reads it instead of counting again.
"""

import hashlib
import json
import logging
import os

import tensorflow as tf

from tfdist._internal.files import write_json_atomically
from tfdist.data.inputs import FILES, TaskInput

__all__ = ["COUNT_FILE", "data_key", "count_once"]

COUNT_FILE = "input_count.json"
_log = logging.getLogger(__name__)


def data_key(split: TaskInput, identity: str) -> str:
    """What decides the count: the task's identity, and the files' names and sizes."""
    parts = [identity, split.kind]
    if split.kind == FILES:
        parts += [f"{path}:{tf.io.gfile.stat(path).length}" for path in split.value.paths()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def count_once(split: TaskInput, *, identity: str, directory: str, is_chief: bool) -> int:
    """The number of examples: read from `directory`'s record of it, else counted (and recorded).

    Sizes known without a pass (a random-access source, a dataset's
    cardinality) are never recorded.
    """
    size = split.known_size()
    if size is not None:
        return size
    path = os.path.join(directory, COUNT_FILE) if directory else ""
    key = data_key(split, identity) if path else ""
    if path and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as handle:
            record = json.load(handle)
        if record.get("key") == key and isinstance(record.get("count"), int):
            _log.info(
                "Training data size %d read from %s (not counted again).", record["count"], path
            )
            return record["count"]
    count = split.count()
    if path and is_chief:
        tf.io.gfile.makedirs(directory)
        write_json_atomically(path, {"key": key, "count": count})
    return count
