"""`RecordImages` whose evaluation split is one file, its decodes counted per process.

`kind` `dataset` evaluates `TFRecordDataset(one file).map(decode)`, `array_record`
a `RandomAccessSource` over one ArrayRecord file. With `count_dir` every process
writes `<count_dir>/evaluation-<pid>.json` (`{"decodes": N}`) when it exits.
"""

import atexit
import glob
import json
import os

import numpy as np
import tensorflow as tf

import tfdist.data
from tests.jobs.tasks import record_tasks

_decodes = {"count": 0}


def _count(one):
    _decodes["count"] += int(one)
    return np.int64(0)


def _write_count(count_dir: str) -> None:
    with open(os.path.join(count_dir, f"evaluation-{os.getpid()}.json"), "w") as handle:
        json.dump({"decodes": _decodes["count"]}, handle)


def _counted(decode):
    def counted(record):
        tick = tf.numpy_function(_count, [tf.constant(1)], tf.int64, stateful=True)
        with tf.control_dependencies([tick]):
            return decode(tf.identity(record))

    return counted


class SharedEvaluation(record_tasks.RecordImages):
    """Training as `RecordImages`; evaluation from `eval_pattern` (one file), counted."""

    def __init__(self, pattern: str, eval_pattern: str, kind: str, count_dir: str = ""):
        super().__init__(pattern, kind=kind)
        self.eval_pattern = eval_pattern
        if count_dir:
            atexit.register(_write_count, count_dir)

    def build_inputs(self, training):
        if training:
            return super().build_inputs(True)
        decode = _counted(record_tasks.decoder(count=False))
        paths = sorted(glob.glob(self.eval_pattern))
        if self.kind == "dataset":
            return tf.data.TFRecordDataset(paths).map(decode)
        from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

        source = array_record_data_source.ArrayRecordDataSource(paths)
        return tfdist.data.RandomAccessSource(
            source, preprocess=decode, name=f"array_record:{self.eval_pattern}"
        )
