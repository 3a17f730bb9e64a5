"""tfdist.data sources: each shard reads only its part, resumes are arithmetic, records skip undecoded."""

import itertools
import json

import numpy as np
import pytest
import tensorflow as tf

import tfdist.data
from tests.jobs.tasks import record_tasks
from tfdist.data import files as files_lib
from tfdist.data import random_access, streaming
from tfdist.data.inputs import TaskInput
from tfdist.data.shards import Shard
from tfdist.errors import UsageError

BATCH = 8
# Decodes tf.data's AUTOTUNE map and prefetch may run ahead of the consumer before a count is
# read: timing-dependent (up to 37 records seen under a loaded CI machine), so bounds allow 80.
READ_AHEAD = 80


class CountingRecords:
    """A random-access source that remembers which indices were read."""

    def __init__(self, count: int):
        self.count, self.read = count, []

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        self.read.append(index)
        return np.float32(index), np.int64(index)


def _labels(dataset, steps: int) -> list[list[int]]:
    return [batch[1].numpy().tolist() for batch in itertools.islice(iter(dataset), steps)]


def _array_source(count: int = 100) -> tfdist.data.ArraySource:
    return tfdist.data.ArraySource(
        (np.arange(count, dtype=np.float32)[:, None], np.arange(count, dtype=np.int64))
    )


@pytest.mark.parametrize(
    "shards",
    [
        [Shard(0, 2, 1), Shard(1, 2, 1)],  # 2 workers of 1 replica
        [Shard(0, 1, 2)],  # 1 worker of 2 replicas
        [Shard(0, 2, 2), Shard(1, 2, 2)],  # 2 workers of 2 replicas
    ],
)
def test_random_access_shards_together_read_the_one_process_batches(shards):
    source = _array_source()
    steps = 30  # more than two passes of 12 batches
    one = _labels(random_access.replica_batches(source, global_batch_size=BATCH, seed=5), steps)
    local = shards[0].local_replicas
    parts = [
        _labels(
            random_access.replica_batches(source, global_batch_size=BATCH, seed=5, shard=shard),
            steps * local,
        )
        for shard in shards
    ]
    joined = [
        sum((part[step * local + r] for part in parts for r in range(local)), [])
        for step in range(steps)
    ]
    assert joined == one
    for pass_index in range(2):
        seen = sorted(sum(one[pass_index * 12 : (pass_index + 1) * 12], []))
        assert len(seen) == len(set(seen)) == 96, "a pass reads each example at most once"
    assert one[:12] != one[12:24], "every pass has its own order"


def test_a_random_access_resume_reads_only_records_of_the_steps_it_trains_on():
    records = CountingRecords(1_000_000)
    source = tfdist.data.RandomAccessSource(records)
    first_step = 200_000
    reference = _labels(
        random_access.replica_batches(
            tfdist.data.RandomAccessSource(CountingRecords(1_000_000)),
            global_batch_size=BATCH,
            seed=1,
        ),
        1,
    )
    resumed = random_access.replica_batches(
        source, global_batch_size=BATCH, seed=1, first_step=first_step, shard=Shard(1, 2, 1)
    )
    batch = _labels(resumed, 1)[0]
    assert len(batch) == BATCH // 2
    # One record to learn the structure, then whole steps of this shard's 4 records,
    # a few steps read ahead at most: nothing of the 200,000 steps before.
    assert len(records.read) <= 1 + 8 * (BATCH // 2), len(records.read)
    assert reference[0] != batch


def test_a_restarted_stream_continues_the_uninterrupted_one_for_every_source_kind(tmp_path):
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 96, num_files=3)
    for value in (
        _array_source(),
        tfdist.data.FileSource(pattern, preprocess=record_tasks.decoder(False)),
    ):
        split = TaskInput(value)
        for shard in (Shard(), Shard(1, 2, 1), Shard(0, 3, 1)):

            def stream(first_step, split=split, shard=shard):
                return split.replica_batches(
                    global_batch_size=12,
                    seed=3,
                    first_step=first_step,
                    shard=shard,
                    num_examples=None,
                )

            whole = _labels(stream(0), 20)
            assert _labels(stream(13), 7) == whole[13:], (type(value).__name__, shard)


def _decoding_source(pattern: str, counter: list):
    decode = record_tasks.decoder(False)

    def counted(record):
        tick = tf.numpy_function(lambda: counter.append(1) or np.int64(0), [], tf.int64)
        image, label = decode(record)
        return image + tf.cast(tick, tf.float32), label

    return tfdist.data.FileSource(pattern, preprocess=counted)


def test_file_shards_read_disjoint_files_and_decode_only_their_share(tmp_path):
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 400, num_files=4)
    plans = [files_lib.plan(tfdist.data.FileSource(pattern), Shard(i, 2, 1)) for i in range(2)]
    assert [plan.sharding for plan in plans] == ["files", "files"]
    assert not set(plans[0].paths) & set(plans[1].paths)
    assert len(plans[0].paths) + len(plans[1].paths) == 4

    counter = []
    stream = files_lib.replica_batches(
        _decoding_source(pattern, counter), global_batch_size=BATCH, seed=0, shard=Shard(0, 2, 1)
    )
    steps = 40
    batches = list(itertools.islice(iter(stream), steps))
    assert all(batch[0].shape[0] == BATCH // 2 for batch in batches)
    # This shard's 160 examples, plus read-ahead; decoding both shards would be 320 and more.
    mine = steps * (BATCH // 2)
    assert mine <= len(counter) <= mine + READ_AHEAD, len(counter)


def test_a_file_resume_skips_records_without_decoding_them(tmp_path):
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 400, num_files=4)
    counter = []
    stream = files_lib.replica_batches(
        _decoding_source(pattern, counter),
        global_batch_size=BATCH,
        seed=0,
        first_step=150,
        shard=Shard(1, 2, 1),
    )
    next(iter(stream))
    # Decoding what was skipped would be this shard's 300 records and more.
    assert len(counter) <= BATCH // 2 + READ_AHEAD, (
        f"{len(counter)} decodes for one batch after skipping 150 steps (600 records)"
    )


def test_fewer_files_than_workers_read_every_record_and_decode_only_their_part(tmp_path):
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 200, num_files=1)
    source = tfdist.data.FileSource(pattern, preprocess=record_tasks.decoder(False))
    assert files_lib.plan(source, Shard(0, 2, 1)).sharding == "records"
    one = files_lib.replica_batches(source, global_batch_size=BATCH, seed=2)
    halves = [
        files_lib.replica_batches(source, global_batch_size=BATCH, seed=2, shard=Shard(i, 2, 1))
        for i in range(2)
    ]
    for whole, first, second in itertools.islice(zip(one, *halves), 30):
        np.testing.assert_array_equal(
            whole[0].numpy(), np.concatenate([first[0].numpy(), second[0].numpy()])
        )


def test_file_sources_read_object_store_paths_through_tensorflow_file_systems():
    # ram:// stands in for gs:// (TensorFlow's file system layer, no network).
    pattern = record_tasks.write_tfrecords("ram://bucket/images", 64, num_files=2)
    split = TaskInput(tfdist.data.FileSource(pattern, preprocess=record_tasks.decoder(False)))
    assert split.count() == 64
    images, labels = next(iter(split.training_stream(None, global_batch_size=16, seed=0)))
    assert images.shape == (16, record_tasks.SIZE, record_tasks.SIZE, 3)
    assert labels.dtype == tf.int32


def test_sources_refuse_bad_arguments_with_one_line():
    with pytest.raises(UsageError, match="expected an object with __len__ and __getitem__"):
        tfdist.data.RandomAccessSource(5)
    with pytest.raises(UsageError, match="lengths \\[3, 4\\]"):
        tfdist.data.ArraySource((np.zeros(3), np.zeros(4)))
    with pytest.raises(UsageError, match="expected one of tfrecord, text"):
        tfdist.data.FileSource("x", reader="parquet")
    with pytest.raises(UsageError, match="matches no file"):
        tfdist.data.FileSource("/nonexistent/dir/train-*.tfrecord").paths()
    with pytest.raises(UsageError, match="fewer than one global batch of 256"):
        TaskInput(_array_source(100)).check_size(256)


def test_the_size_of_a_source_is_read_and_of_files_counted_without_decoding(tmp_path):
    assert TaskInput(_array_source(77)).known_size() == 77
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 90, num_files=3)
    counter = []
    split = TaskInput(_decoding_source(pattern, counter))
    assert split.known_size() is None
    assert split.count() == 90
    assert counter == []


def _record_task_config(pattern: str, kind: str, **overrides):
    from trainer.config import ExperimentConfig  # pylint: disable=g-import-not-at-top

    return ExperimentConfig(
        task="tests.jobs.tasks.record_tasks:RecordImages",
        task_config=json.dumps({"pattern": pattern, "kind": kind}),
        global_batch_size=16,
        steps_per_execution=1,
        **overrides,
    )


@pytest.mark.parametrize("kind", ["files", "dataset"])
def test_the_trainer_counts_nothing_with_steps_per_epoch_and_counts_once_without(kind, tmp_path):
    from trainer import tasks  # pylint: disable=g-import-not-at-top
    from trainer.run.inputs import build_inputs  # pylint: disable=g-import-not-at-top

    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 80, num_files=2)
    given = build_inputs(
        tasks.load(_record_task_config(pattern, kind, steps_per_epoch=3)),
        _record_task_config(pattern, kind, steps_per_epoch=3),
        count_dir=str(tmp_path / "backup"),
    )
    assert (given.num_train_examples, given.steps_per_epoch) == (None, 3)
    assert not (tmp_path / "backup").exists(), "nothing was counted, nothing recorded"

    config = _record_task_config(pattern, kind)
    counted = build_inputs(tasks.load(config), config, count_dir=str(tmp_path / "backup"))
    assert (counted.num_train_examples, counted.steps_per_epoch) == (80, 5)
    record = json.loads((tmp_path / "backup" / "input_count.json").read_text())
    assert record["count"] == 80
    # A restart reads the record: make it say something no count would, and see it used.
    (tmp_path / "backup" / "input_count.json").write_text(json.dumps({**record, "count": 64}))
    again = build_inputs(tasks.load(config), config, count_dir=str(tmp_path / "backup"))
    assert again.num_train_examples == 64
    if kind == "files":
        # Other files (another size): counted anew.
        record_tasks.write_tfrecords(str(tmp_path / "tf"), 96, num_files=2)
        fresh = build_inputs(tasks.load(config), config, count_dir=str(tmp_path / "backup"))
        assert fresh.num_train_examples == 96


def test_a_restart_with_another_worker_count_is_refused_only_for_file_sources(tmp_path):
    from trainer.run.inputs import Inputs  # pylint: disable=g-import-not-at-top
    from trainer.run.restarts import changeable_settings  # pylint: disable=g-import-not-at-top

    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 32, num_files=2)
    config = _record_task_config(pattern, "files")
    for value, changeable in ((tfdist.data.FileSource(pattern), False), (_array_source(), True)):
        inputs = Inputs(
            train=TaskInput(value),
            evaluation=None,
            num_train_examples=None,
            steps_per_epoch=2,
            global_batch_size=16,
            seed=0,
        )
        settings = changeable_settings(config, inputs)
        assert ("num_workers" in settings) is changeable, type(value).__name__


def test_a_grain_source_is_read_as_a_random_access_source(tmp_path):
    grain = pytest.importorskip("grain")
    pattern = record_tasks.write_array_records(str(tmp_path / "ar"), 40, num_files=2)
    records = grain.sources.ArrayRecordDataSource(sorted(str(p) for p in tmp_path.glob("ar/*")))
    split = TaskInput(
        tfdist.data.RandomAccessSource(records, preprocess=record_tasks.decoder(False))
    )
    assert pattern and split.known_size() == 40
    images, labels = next(iter(split.training_stream(None, global_batch_size=8, seed=0)))
    assert images.shape == (8, record_tasks.SIZE, record_tasks.SIZE, 3)
    reference = [int(label) for _, label in split.examples()]
    assert sorted(labels.numpy().tolist()) == sorted(
        reference[i] for i in _first_batch_indices(40, 8, seed=0)
    )


def _first_batch_indices(count: int, batch: int, seed: int) -> list[int]:
    return (
        tf.random.experimental.index_shuffle(
            tf.range(batch, dtype=tf.int64),
            tf.constant([seed, 0], tf.int64),
            tf.fill([batch], tf.constant(count - 1, tf.int64)),
        )
        .numpy()
        .tolist()
    )


def _decoding_dataset(pattern: str, counter: list) -> tf.data.Dataset:
    """`TFRecordDataset(files).map(decode)`, as a task returns it, its decodes counted."""
    source = _decoding_source(pattern, counter)
    return tf.data.TFRecordDataset(source.paths()).map(source.preprocess)


@pytest.mark.parametrize("sharded", [False, True], ids=["global", "file-sharded"])
def test_a_stream_ending_at_a_pass_end_reads_nothing_of_the_next_pass(tmp_path, sharded):
    # The trainer's stream ends at the run's last step: its prefetch must not
    # start the next pass (a shuffle window's fill), which a restart would decode.
    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), 400, num_files=4)
    counter = []
    examples = _decoding_dataset(pattern, counter)
    if sharded:
        share, shard = 200, Shard(0, 2, 1)
        stream = streaming.file_sharded_batches(
            examples, shard=shard, global_batch_size=BATCH, seed=0, end_step=2 * 200 // 4
        )
    else:
        share = 400
        stream = streaming.training_batches(
            examples, global_batch_size=BATCH, seed=0, num_examples=None, end_step=2 * 400 // 8
        )
    batches = list(stream)
    assert len(batches) == 2 * share // (BATCH // 2 if sharded else BATCH)
    # Two whole passes of this pipeline's share, then the end: not one decode more.
    assert len(counter) == 2 * share, len(counter)
