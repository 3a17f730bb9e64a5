"""Sharding a user's tf.data pipeline per worker: by file, by record after its reader, or DATA.

In-process: the rewrites `keras_compat` applies under a multi-worker strategy,
checked on the examples each shard yields and on the decodes it costs (a
`numpy_function` counter in the decode map).
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.data import ArraySource, random_access
from tfdist.keras_compat import _epoch_sharding, _record_sharding

LINES = 100


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lines")
    (root / "one.txt").write_text("".join(f"{i}\n" for i in range(LINES)))
    for part in range(4):
        (root / f"part-{part}.txt").write_text(
            "".join(f"{i}\n" for i in range(part * 25, (part + 1) * 25))
        )
    return {"one": [str(root / "one.txt")], "four": [str(root / f"part-{p}.txt") for p in range(4)]}


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


def _values(dataset) -> list[int]:
    return sorted(int(v) for batch in dataset for v in np.ravel(batch))


def test_by_record_each_shard_decodes_only_its_records_and_together_all(text_files):
    decodes = Decodes()
    pipeline = tf.data.TextLineDataset(text_files["one"]).map(decodes).batch(32)
    shards = [_record_sharding.shard_by_record(pipeline, 2, index) for index in range(2)]
    first = _values(shards[0])
    assert decodes.count == LINES // 2
    second = _values(shards[1])
    assert decodes.count == LINES
    assert not set(first) & set(second)
    assert sorted(first + second) == list(range(LINES))
    assert [len(b) for b in shards[0]] == [32, 18]  # the shard's own partial last batch


@pytest.mark.parametrize(
    "shape",
    ["zip", "take", "repeat", "no reader"],
)
def test_by_record_refuses_pipelines_whose_meaning_a_shard_would_change(text_files, shape):
    lines = tf.data.TextLineDataset(text_files["one"])
    pipelines = {
        "zip": tf.data.Dataset.zip(lines, lines),
        "take": lines.take(10),
        "repeat": lines.repeat(2),
        "no reader": tf.data.Dataset.range(10).map(lambda i: i * 2),
    }
    assert _record_sharding.shard_by_record(pipelines[shape].batch(4), 2, 0) is None


def test_file_count_is_found_without_decoding(text_files):
    decodes = Decodes()
    one = tf.data.TextLineDataset(text_files["one"]).map(decodes).batch(8)
    four = tf.data.TextLineDataset(text_files["four"]).map(decodes).batch(8)
    assert not _record_sharding.reads_at_least(one, 2)
    assert _record_sharding.reads_at_least(four, 2)
    assert _record_sharding.reads_at_least(four, 4)
    assert not _record_sharding.reads_at_least(four, 5)
    assert decodes.count == 0


def test_the_policy_per_split(text_files):
    policy = tf.data.experimental.AutoShardPolicy
    one = tf.data.TextLineDataset(text_files["one"]).batch(8)
    four = tf.data.TextLineDataset(text_files["four"]).batch(8)
    generated = tf.data.Dataset.from_generator(
        lambda: iter(range(10)), output_signature=tf.TensorSpec((), tf.int64)
    ).batch(4)

    def chosen(dataset, role):
        sharded = _epoch_sharding.worker_dataset(dataset, role=role, num_workers=2, worker_index=1)
        return sharded, sharded.options().experimental_distribute.auto_shard_policy

    assert chosen(four, "training") == (four, policy.AUTO)  # TensorFlow shards it by file
    assert chosen(one, "training")[1] == policy.DATA
    assert chosen(generated, "evaluation")[1] == policy.DATA
    by_record, chosen_policy = chosen(one, "evaluation")
    assert chosen_policy == policy.OFF
    assert _values(by_record) == [int(v) for v in range(1, LINES, 2)] or _values(by_record) == list(
        range(1, LINES, 2)
    )
    mine = tf.data.TextLineDataset(text_files["one"]).batch(8)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.OFF
    kept = mine.with_options(options)
    assert chosen(kept, "evaluation")[0] is kept  # the user's own choice stays


def test_a_random_access_source_shards_by_read_and_keeps_every_example_once():
    source = ArraySource((np.arange(600, dtype=np.int64), np.zeros(600, np.int64)))
    shards = [random_access.examples(source, 2, index) for index in range(2)]
    values = [[int(x[0]) for x in shard] for shard in shards]
    assert [int(shard.cardinality()) for shard in shards] == [len(v) for v in values]
    assert sorted(values[0] + values[1]) == list(range(600))
    assert not set(values[0]) & set(values[1])


def test_an_off_policy_without_a_shard_of_its_own_is_named_once(text_files, caplog):
    policy = tf.data.experimental.AutoShardPolicy
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.OFF
    whole = tf.data.TextLineDataset(text_files["one"]).batch(8).with_options(options)
    own = tf.data.TextLineDataset(text_files["one"]).shard(2, 0).batch(8).with_options(options)
    with caplog.at_level("WARNING", logger="tfdist.keras_compat._epoch_sharding"):
        for dataset in (whole, whole, own):
            kept = _epoch_sharding.worker_dataset(
                dataset, role="training", num_workers=2, worker_index=0
            )
            assert kept is dataset
    lines = [r.getMessage() for r in caplog.records if "auto_shard_policy is OFF" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "every example 2 times" in lines[0]
