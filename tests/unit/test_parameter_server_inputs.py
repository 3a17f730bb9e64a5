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


def test_a_worker_decodes_its_first_batch_and_read_ahead_whatever_the_size_of_the_data(
    tmp_path,
):
    """A `FileSource` of 512 and of 8,192 records: the same bounded count of decodes."""
    decoded = {}
    for num_examples in (512, 8192):
        split, _ = _split("files", tmp_path, num_examples, count=True)
        record_tasks._decodes["count"] = 0  # pylint: disable=protected-access
        iterator = iter(
            worker_shares.worker_batches(
                split,
                worker=1,
                num_workers=WORKERS,
                global_batch_size=GLOBAL_BATCH,
                seed=0,
                first_batch=ROUNDS * 3,  # a resume in its fourth pass decodes no skipped record
            )
        )
        next(iterator)
        decoded[num_examples] = record_tasks._decodes["count"]  # pylint: disable=protected-access
        del iterator
    # The batch, plus what tf.data's autotuned map and prefetch read ahead at that moment.
    assert all(GLOBAL_BATCH <= count <= 10 * GLOBAL_BATCH for count in decoded.values()), decoded


def test_data_smaller_than_one_batch_per_worker_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"fewer than one global batch \(16\) for each of the 4"):
        worker_shares.rounds_per_pass(48, 16, 4)


def _trainer_inputs(tmp_path, kind: str):
    from trainer import tasks  # pylint: disable=g-import-not-at-top
    from trainer.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
    from trainer.run import pipeline  # pylint: disable=g-import-not-at-top

    pattern = record_tasks.write_tfrecords(str(tmp_path / "tf"), NUM_EXAMPLES, num_files=4)
    config = ExperimentConfig(
        task="tests.jobs.tasks.record_tasks:RecordImages",
        task_config=json.dumps({"pattern": pattern, "kind": kind}),
        global_batch_size=GLOBAL_BATCH,
        steps_per_execution=1,
        steps_per_epoch=ROUNDS * WORKERS,
    )
    loaded = tasks.load(config)
    return loaded, pipeline.build_inputs(loaded, config, num_workers=WORKERS)


@pytest.mark.parametrize("kind", ["dataset", "files"])
def test_the_trainers_worker_stream_is_the_same_in_every_build_and_starts_where_it_stood(
    kind, tmp_path
):
    """Today's main started each worker at a batch drawn from the clock (and decoded the skip)."""
    from trainer.run import parameter_server  # pylint: disable=g-import-not-at-top

    loaded, inputs = _trainer_inputs(tmp_path, kind)

    def first_batches(start: int, count: int):
        # Outside a worker, the dataset function builds worker 0's stream.
        dataset_fn = parameter_server._worker_dataset_fn(  # pylint: disable=protected-access
            loaded, inputs, WORKERS, [start, 0]
        )
        return [_ids(batch) for batch in itertools.islice(iter(dataset_fn(None)), count)]

    fresh = first_batches(0, 6)
    assert first_batches(0, 6) == fresh
    assert first_batches(4, 2) == fresh[4:6]
    assert len({example for batch in fresh for example in batch}) == 6 * GLOBAL_BATCH
