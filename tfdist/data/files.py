"""Streaming input from record files: shard files per worker, shuffle records, decode last.

Pass `p` reads this pipeline's files in a seeded order (seed `(seed, p)`),
interleaved, through a shuffle window of *encoded records* bounded in bytes,
and the passes follow one another without end. Only then does the task's
`preprocess` run, and only on the records this pipeline's replicas consume.

Sharding, chosen per run and logged:

- `files`: with at least as many files as pipelines, pipeline `i` of `n`
  reads the sorted files `i, i + n, ...`. Each worker reads and decodes only
  its share; the order depends on the number of workers.
- `records`: with fewer files, every pipeline reads every record (cheap: no
  decoding) and keeps its replicas' part of each global batch, which is then
  the batch a single process reads.

A start at step `s` skips records before decoding: none of the skipped
examples is decoded.
"""

import dataclasses
import logging

import tensorflow as tf

from tfdist.data.shards import Shard, check_global_batch
from tfdist.data.sources import FileSource
from tfdist.data.streaming import _seeded_shuffle

__all__ = [
    "FilePlan",
    "plan",
    "describe",
    "records",
    "replica_batches",
    "examples",
    "count_records",
]

_log = logging.getLogger(__name__)

# Records read to estimate a record's size, which sizes the shuffle window.
_SIZE_SAMPLE = 256
_MAX_WINDOW = 1 << 20
# What a record costs in the window beyond its bytes (tensor and buffer bookkeeping).
_RECORD_OVERHEAD_BYTES = 100
_CYCLE_LENGTH = 4
FILES, RECORDS = "files", "records"


@dataclasses.dataclass(frozen=True)
class FilePlan:
    """How a `FileSource` is read by one pipeline."""

    paths: tuple[str, ...]
    sharding: str
    window: int


def plan(source: FileSource, shard: Shard) -> FilePlan:
    """Matches the files, chooses the sharding and sizes the shuffle window."""
    paths = source.paths()
    sharding = FILES if len(paths) >= shard.count > 1 else RECORDS
    mine = tuple(paths[shard.index :: shard.count]) if sharding == FILES else tuple(paths)
    return FilePlan(paths=mine, sharding=sharding, window=_window(source, paths[0]))


def describe(source: FileSource, num_pipelines: int) -> str:
    """One log line: how the files are split among the input pipelines."""
    count = len(source.paths())
    if num_pipelines == 1:
        return f"{count} file(s) read by one input pipeline"
    if count >= num_pipelines:
        return (
            f"{count} files sharded among {num_pipelines} workers (each reads and decodes "
            f"only its files; the order depends on the number of workers)"
        )
    return (
        f"{count} file(s), fewer than the {num_pipelines} workers: every worker reads every "
        f"record and decodes only its replicas' part of each batch"
    )


def _reader(source: FileSource):
    if callable(source.reader):
        return source.reader
    if source.reader == "text":
        return tf.data.TextLineDataset
    return lambda path: tf.data.TFRecordDataset(path, compression_type=source.compression)


def _window(source: FileSource, first_path: str) -> int:
    """Records in a window of `source.shuffle_bytes`, from the sizes of the first records.

    Read eagerly, also when the pipeline is built inside a function (a
    parameter-server worker's dataset function).
    """
    with tf.init_scope():
        sizes = [
            len(record)
            for record in _reader(source)(tf.constant(first_path))
            .take(_SIZE_SAMPLE)
            .as_numpy_iterator()
        ]
    mean = sum(sizes) / max(1, len(sizes)) + _RECORD_OVERHEAD_BYTES
    return int(max(1, min(_MAX_WINDOW, source.shuffle_bytes // mean)))


def records(
    source: FileSource, file_plan: FilePlan, *, seed: int, shard: Shard, first_record: int = 0
) -> tf.data.Dataset:
    """This pipeline's endless stream of records, from record `first_record` on."""
    paths = tf.constant(file_plan.paths)
    read = _reader(source)
    salt = shard.index if file_plan.sharding == FILES else 0

    def one_pass(pass_index):
        order = tf.random.experimental.stateless_shuffle(
            paths, seed=tf.stack([tf.constant(seed, tf.int64), pass_index])
        )
        cycle = min(_CYCLE_LENGTH, len(file_plan.paths))
        stream = tf.data.Dataset.from_tensor_slices(order).interleave(
            read, cycle_length=cycle, block_length=1, num_parallel_calls=cycle, deterministic=True
        )
        return _seeded_shuffle(stream, file_plan.window, seed * 1009 + salt, pass_index)

    stream = tf.data.Dataset.range(tf.int64.max).flat_map(one_pass)
    return stream.skip(first_record) if first_record else stream


def replica_batches(
    source: FileSource,
    *,
    global_batch_size: int,
    seed: int,
    first_step: int = 0,
    shard: Shard = Shard(),
) -> tf.data.Dataset:
    """The endless stream of this shard's per-replica batches, from step `first_step`."""
    per_replica = check_global_batch(global_batch_size, shard.num_replicas)
    span = per_replica * shard.local_replicas
    file_plan = plan(source, shard)
    if file_plan.sharding == FILES:
        mine = records(source, file_plan, seed=seed, shard=shard, first_record=first_step * span)
    else:
        start = shard.first_replica * per_replica
        everything = records(
            source, file_plan, seed=seed, shard=shard, first_record=first_step * global_batch_size
        )
        mine = (
            everything
            if shard.count == 1
            else (
                everything.batch(global_batch_size, drop_remainder=True)
                .map(lambda batch: batch[start : start + span])
                .unbatch()
            )
        )
    if source.preprocess is not None:
        mine = mine.map(source.preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return mine.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def examples(source: FileSource) -> tf.data.Dataset:
    """One pass over every record, in file order, preprocessed (evaluation, samples)."""
    read = _reader(source)
    stream = tf.data.Dataset.from_tensor_slices(source.paths()).flat_map(read)
    if source.preprocess is not None:
        stream = stream.map(
            source.preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    return stream


def count_records(source: FileSource) -> int:
    """Records in all files: reads every record, decodes none."""
    read = _reader(source)
    stream = tf.data.Dataset.from_tensor_slices(source.paths()).flat_map(read)
    return int(stream.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
