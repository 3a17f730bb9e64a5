"""Parameter-server workers' own streams: distinct examples, an order fixed by the seed, exact resume.

Each worker's stream is built in-process here (what the worker builds from its
index); the multi-process run is in tests/multiprocess/test_data_multiworker.py.
"""

import hashlib
import itertools
import json

import numpy as np
import pytest
import tensorflow as tf

import tfdist.data
from tests.jobs.tasks import record_tasks
from tfdist.data import worker_shares
from tfdist.data.inputs import TaskInput
from tfdist.errors import UsageError

GLOBAL_BATCH = 16
WORKERS = 2
NUM_EXAMPLES = 256
ROUNDS = NUM_EXAMPLES // (GLOBAL_BATCH * WORKERS)  # batches per worker in one pass


def _ids(batch) -> list[str]:
    """One id per example: the hash of its decoded image (the records are random images)."""
    return [hashlib.sha1(image.tobytes()).hexdigest()[:12] for image in batch[0].numpy()]


def _split(kind: str, root, num_examples: int = NUM_EXAMPLES, count: bool = False):
    """The training split of `kind`, and whether it is a dataset sharded by file."""
    num_files = 1 if kind.endswith("one_file") else 4
    pattern = record_tasks.write_tfrecords(
        str(root / f"{kind}-{num_examples}"), num_examples, num_files=num_files
    )
    decode = record_tasks.decoder(count=count)
    if kind.startswith("dataset"):
        value = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(pattern))).map(decode)
        return TaskInput(value), num_files >= WORKERS
    if kind.startswith("files"):
        return TaskInput(tfdist.data.FileSource(pattern, preprocess=decode)), False
    images, labels = zip(*(decode(record) for record in record_tasks.examples(num_examples)))
    arrays = (np.stack([image.numpy() for image in images]), np.asarray(labels))
    return TaskInput(tfdist.data.ArraySource(arrays)), False


def _worker_ids(split, shard_files, worker, batches, *, seed=0, first_batch=0):
    stream = worker_shares.worker_batches(
        split,
        worker=worker,
        num_workers=WORKERS,
        global_batch_size=GLOBAL_BATCH,
        seed=seed,
        first_batch=first_batch,
        num_examples=NUM_EXAMPLES,
        shard_files=shard_files,
    )
    return [_ids(batch) for batch in itertools.islice(iter(stream), batches)]


@pytest.mark.parametrize(
    "kind", ["dataset_files", "dataset_one_file", "files", "files_one_file", "array"]
)
def test_workers_read_distinct_examples_in_an_order_fixed_by_the_seed_and_resume_exactly(
    kind, tmp_path
):
    split, shard_files = _split(kind, tmp_path)
    per_worker = [_worker_ids(split, shard_files, worker, ROUNDS) for worker in range(WORKERS)]
    read = [example for batches in per_worker for batch in batches for example in batch]
    # One pass's worth of batches on each worker: every example once, none twice.
    assert len(read) == NUM_EXAMPLES and len(set(read)) == NUM_EXAMPLES, kind
    assert all(len(batch) == GLOBAL_BATCH for batches in per_worker for batch in batches)
    # The same seed gives the same order; another seed another one.
    assert _worker_ids(split, shard_files, 1, ROUNDS) == per_worker[1]
    assert _worker_ids(split, shard_files, 1, ROUNDS, seed=7) != per_worker[1]
    # A worker resumed at its batch 5 reads exactly what it would have read next.
    assert _worker_ids(split, shard_files, 0, 3, first_batch=5) == per_worker[0][5:8]


def test_data_smaller_than_one_batch_per_worker_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"fewer than one global batch \(16\) for each of the 4"):
        worker_shares.rounds_per_pass(48, 16, 4)


def _trainer_inputs(tmp_path, kind: str, num_examples: int = NUM_EXAMPLES):
    from trainer import tasks  # pylint: disable=g-import-not-at-top
    from trainer.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
    from trainer.run.inputs import build_inputs  # pylint: disable=g-import-not-at-top

    root = tmp_path / f"{kind}-{num_examples}"
    pattern = record_tasks.write_tfrecords(str(root / "tf"), num_examples, num_files=4)
    config = ExperimentConfig(
        task="tests.jobs.tasks.record_tasks:RecordImages",
        # count_dir: the task's decoder counts its decodes (in this process).
        task_config=json.dumps({"pattern": pattern, "kind": kind, "count_dir": str(root)}),
        global_batch_size=GLOBAL_BATCH,
        steps_per_execution=1,
        steps_per_epoch=num_examples // GLOBAL_BATCH,
    )
    return build_inputs(tasks.load(config), config, num_workers=WORKERS)


def _first_batches(inputs, start: int, count: int) -> tuple[list, int]:
    """Worker 0's first `count` batches from its batch `start`, and the decodes until then."""
    record_tasks._decodes["count"] = 0  # pylint: disable=protected-access
    make_batches = inputs.worker_batches(WORKERS)
    batches = [_ids(batch) for batch in itertools.islice(iter(make_batches(0, start)), count)]
    return batches, record_tasks._decodes["count"]  # pylint: disable=protected-access


@pytest.mark.parametrize("kind", ["dataset", "files"])
def test_the_trainers_worker_stream_is_the_same_in_every_build_and_starts_where_it_stood(
    kind, tmp_path
):
    """Today's main started each worker at a batch drawn from the clock, decoding the skip."""
    inputs = _trainer_inputs(tmp_path, kind)
    fresh, _ = _first_batches(inputs, 0, 6)
    assert _first_batches(inputs, 0, 6)[0] == fresh
    assert _first_batches(inputs, 4, 2)[0] == fresh[4:6]
    assert len({example for batch in fresh for example in batch}) == 6 * GLOBAL_BATCH


def test_a_worker_decodes_its_first_batch_and_read_ahead_whatever_the_size_of_the_data(
    tmp_path,
):
    """A `FileSource` of 256 and of 4,096 records; today's main decoded all of them first."""
    decoded = {}
    for num_examples in (NUM_EXAMPLES, 4096):
        inputs = _trainer_inputs(tmp_path, "files", num_examples)
        decoded[num_examples] = _first_batches(inputs, 0, 1)[1]
    # The batch, plus what tf.data's autotuned map and prefetch had read ahead by then.
    assert all(GLOBAL_BATCH <= count <= 8 * GLOBAL_BATCH for count in decoded.values()), decoded


def test_the_coordinator_builds_the_model_on_one_batch_and_decodes_only_it(tmp_path):
    from trainer.run import parameter_server  # pylint: disable=g-import-not-at-top

    inputs = _trainer_inputs(tmp_path, "dataset")
    dataset_fn = parameter_server.worker_dataset_fn(inputs, WORKERS, [0, 0])
    record_tasks._decodes["count"] = 0  # pylint: disable=protected-access
    batches = list(dataset_fn(None).take(2))  # outside a worker: the coordinator's sample
    assert len(batches) == 1 and batches[0][0].shape[0] == GLOBAL_BATCH
    assert record_tasks._decodes["count"] == GLOBAL_BATCH  # pylint: disable=protected-access


def test_a_dataset_sharded_by_file_decodes_one_pass_of_its_share_before_its_first_batch(tmp_path):
    """tf.data's shuffle-and-repeat fusion would fill the window across 3 passes of the share."""
    split, _ = _split("dataset_files", tmp_path, count=True)
    record_tasks._decodes["count"] = 0  # pylint: disable=protected-access
    iterator = iter(
        worker_shares.worker_batches(
            split,
            worker=0,
            num_workers=WORKERS,
            global_batch_size=GLOBAL_BATCH,
            seed=0,
            shard_files=True,
        )
    )
    next(iterator)
    share = NUM_EXAMPLES // WORKERS
    decoded = record_tasks._decodes["count"]  # pylint: disable=protected-access
    assert share <= decoded <= share + 8 * GLOBAL_BATCH, decoded


def test_declared_padding_gives_each_worker_distinct_padded_batches():
    from tfdist.data import batching  # pylint: disable=g-import-not-at-top

    examples = tf.data.Dataset.range(64).map(lambda i: (tf.range(i % 5 + 1), i))

    def labels(worker: int, first_batch: int = 0) -> list[list[int]]:
        stream = worker_shares.worker_batches(
            TaskInput(examples),
            worker=worker,
            num_workers=WORKERS,
            global_batch_size=8,
            seed=0,
            first_batch=first_batch,
            num_examples=64,
            batching=batching.PadToLongest(),
        )
        return [batch[1].numpy().tolist() for batch in itertools.islice(iter(stream), 4)]

    read = [label for worker in range(WORKERS) for batch in labels(worker) for label in batch]
    assert sorted(read) == list(range(64))
    assert labels(1, first_batch=2)[:2] == labels(1)[2:4]
