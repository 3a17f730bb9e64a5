"""One "enough files to shard by file" policy for every path that reads a user's dataset (issue #28, 2).

The trainer's task path (`TaskInput.sharded_by_file`, whose answer feeds
`tfdist.data.worker_shares` and the synchronous streams) and the Keras path
(`keras_compat`'s per-worker sharding of a dataset given to `fit`) decide it
with `keras_compat.enough_files_to_shard`: the reader's file names are
counted, no example is decoded.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist import keras_compat
from tfdist.data.inputs import TaskInput
from tfdist.keras_compat import _epoch_sharding

_AUTO = tf.data.experimental.AutoShardPolicy.AUTO


class Decodes:
    """A decode map that counts the examples it decodes."""

    def __init__(self):
        self.count = 0

    def _tick(self, _):
        self.count += 1
        return np.int64(0)

    def __call__(self, line):
        tick = tf.numpy_function(self._tick, [tf.constant(1)], tf.int64, stateful=True)
        with tf.control_dependencies([tick]):
            return tf.strings.to_number(line, tf.int64)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lines")
    paths = []
    for part in range(4):
        path = root / f"part-{part}.txt"
        path.write_text("".join(f"{i}\n" for i in range(part * 25, (part + 1) * 25)))
        paths.append(str(path))
    return paths


def _pipelines(files, decodes):
    return {
        "one file": (tf.data.TextLineDataset(files[:1]).map(decodes), 2),
        "four files, 2 workers": (tf.data.TextLineDataset(files).map(decodes), 2),
        "four files, 5 workers": (tf.data.TextLineDataset(files).map(decodes), 5),
        "no reader": (tf.data.Dataset.range(10), 2),
        # Examples of the first file only survive the filter: the last shard's files
        # yield no example, but it has its files.
        "a filter after the reader": (
            tf.data.TextLineDataset(files[:2]).map(decodes).filter(lambda value: value < 25),
            2,
        ),
    }


def _keras_path_shards_by_file(dataset, num_workers) -> bool:
    kept = _epoch_sharding.worker_dataset(
        dataset, role="training", num_workers=num_workers, worker_index=0
    )
    return kept is dataset and kept.options().experimental_distribute.auto_shard_policy == _AUTO


def test_the_task_path_and_the_keras_path_decide_alike_decoding_nothing(files):
    decodes = Decodes()
    decided = {}
    for name, (dataset, workers) in _pipelines(files, decodes).items():
        task = TaskInput(dataset).sharded_by_file(workers).file_shards == workers
        assert task == _keras_path_shards_by_file(dataset, workers), name
        decided[name] = task
    assert decodes.count == 0
    assert decided == {
        "one file": False,
        "four files, 2 workers": True,
        "four files, 5 workers": False,
        "no reader": False,
        "a filter after the reader": True,
    }


def test_the_policy_is_one_function(files):
    decodes = Decodes()
    for name, (dataset, workers) in _pipelines(files, decodes).items():
        expected = TaskInput(dataset).sharded_by_file(workers).file_shards == workers
        assert keras_compat.enough_files_to_shard(dataset, workers) == expected, name
    four = tf.data.TextLineDataset(files)
    assert not keras_compat.enough_files_to_shard(four, 1)  # one worker: nothing to shard
    assert TaskInput(four).order_depends_on_workers()
    assert not TaskInput(tf.data.TextLineDataset(files[:1])).order_depends_on_workers()
    assert decodes.count == 0
