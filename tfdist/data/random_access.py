"""Random-access input: a seeded permutation of indices per pass, each worker reads its own.

Step `s` of the stream is global batch `s % per_pass` of pass `s // per_pass`,
whose examples are positions `[b * G, (b + 1) * G)` of that pass's permutation
(`tf.random.experimental.index_shuffle`, stateless, seed `(seed, pass)`). A
worker whose replicas are global replicas `[first, first + local)` reads the
indices at positions `b * G + first * B + [0, local * B)` only, so N workers
together read the batch one process reads, and no worker reads another's.
Starting at step `s` is arithmetic: nothing before it is read.
"""

import numpy as np
import tensorflow as tf

from tfdist.data.shards import Shard, batches_per_pass, check_global_batch
from tfdist.data.sources import ArraySource, RandomAccessSource
from tfdist.errors import UsageError

__all__ = ["replica_batches", "examples", "first_examples", "in_memory_examples"]

# Indices per Python read when a whole pass is read in order (evaluation, samples).
_SEQUENTIAL_READ = 256


def _flatten(record) -> list:
    if isinstance(record, dict):
        return [leaf for key in sorted(record) for leaf in _flatten(record[key])]
    if isinstance(record, (tuple, list)):
        return [leaf for item in record for leaf in _flatten(item)]
    return [record]


def _pack(structure, leaves):
    """`leaves` (flat, in `_flatten` order) in the nesting of `structure`."""
    leaves = iter(leaves)

    def pack(node):
        if isinstance(node, dict):
            return {key: pack(node[key]) for key in sorted(node)}
        if isinstance(node, (tuple, list)):
            return tuple(pack(item) for item in node)
        return next(leaves)

    return pack(structure)


def _leaf_spec(value) -> tf.TensorSpec:
    if isinstance(value, (bytes, str)):
        return tf.TensorSpec((), tf.string)
    array = np.asarray(value)
    if array.dtype.kind in "SUO":
        return tf.TensorSpec(array.shape, tf.string)
    return tf.TensorSpec(array.shape, tf.as_dtype(array.dtype))


class _Reader:
    """Reads a batch of indices from a source into flat, stacked NumPy leaves."""

    def __init__(self, source: RandomAccessSource | ArraySource):
        self.source = source
        if len(source) == 0:
            raise UsageError(
                f"the {type(source).__name__} holds no records, expected at least "
                f"one global batch of them"
            )
        if isinstance(source, ArraySource):
            self.structure = source.arrays
            self.specs = [
                tf.TensorSpec(leaf.shape[1:], tf.as_dtype(leaf.dtype))
                for leaf in _flatten(source.arrays)
            ]
        else:
            first = source.read([0])[0]
            self.structure = first
            self.specs = [_leaf_spec(leaf) for leaf in _flatten(first)]

    def read_flat(self, indices: np.ndarray) -> list:
        if isinstance(self.source, ArraySource):
            return [np.ascontiguousarray(leaf) for leaf in _flatten(self.source.read(indices))]
        records = self.source.read(indices.tolist())
        columns = zip(*(_flatten(record) for record in records))
        out = []
        for spec, column in zip(self.specs, columns):
            if spec.dtype == tf.string:
                out.append(
                    np.array([_as_bytes(v) for v in column], dtype=object).reshape(
                        (len(records),) + tuple(spec.shape)
                    )
                )
            else:
                out.append(np.stack([np.asarray(v, spec.dtype.as_numpy_dtype) for v in column]))
        return out

    def records(self, indices: tf.Tensor):
        """The records at a vector of indices, as tensors with a leading batch dimension."""
        leaves = tf.numpy_function(
            self.read_flat, [indices], [spec.dtype for spec in self.specs], stateful=False
        )
        leaves = [
            tf.ensure_shape(leaf, [None] + spec.shape.as_list())
            for leaf, spec in zip(leaves, self.specs)
        ]
        return _pack(self.structure, leaves)


class _GraphReader:
    """Reads an `ArraySource` with graph ops only (for workers that run no Python)."""

    def __init__(self, source: ArraySource):
        self.arrays = _pack(source.arrays, [tf.constant(leaf) for leaf in _flatten(source.arrays)])

    def records(self, indices: tf.Tensor):
        return _pack(self.arrays, [tf.gather(leaf, indices) for leaf in _flatten(self.arrays)])


def _as_bytes(value):
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.ndarray):
        return value.item() if value.shape == () else value.tobytes()
    return value


def _preprocessed(records: tf.data.Dataset, source) -> tf.data.Dataset:
    if source.preprocess is None:
        return records
    return records.map(source.preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def replica_batches(
    source: RandomAccessSource | ArraySource,
    *,
    global_batch_size: int,
    seed: int,
    first_step: int = 0,
    shard: Shard = Shard(),
    in_graph: bool = False,
) -> tf.data.Dataset:
    """The endless stream of this shard's per-replica batches, from step `first_step`.

    Each step yields `shard.local_replicas` consecutive batches of
    `global_batch_size / shard.num_replicas` examples, the parts of global
    batch `step` that this shard's replicas compute on. `in_graph` reads an
    `ArraySource` with graph ops (parameter-server workers run no Python).
    """
    reader = _GraphReader(source) if in_graph else _Reader(source)
    num_examples = len(source)
    per_pass = batches_per_pass(num_examples, global_batch_size)
    per_replica = check_global_batch(global_batch_size, shard.num_replicas)
    span = per_replica * shard.local_replicas
    start = shard.first_replica * per_replica
    last_index = tf.constant(num_examples - 1, tf.int64)

    def indices(step):
        pass_index, batch = step // per_pass, step % per_pass
        positions = batch * global_batch_size + start + tf.range(span, dtype=tf.int64)
        return tf.random.experimental.index_shuffle(
            positions,
            tf.stack([tf.constant(seed, tf.int64), pass_index]),
            tf.fill([span], last_index),
        )

    steps = tf.data.Dataset.range(first_step, tf.int64.max)
    records = steps.map(
        lambda step: reader.records(indices(step)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    ).unbatch()
    return (
        _preprocessed(records, source)
        .batch(per_replica, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def examples(
    source: RandomAccessSource | ArraySource, num_shards: int = 1, index: int = 0
) -> tf.data.Dataset:
    """One pass over the source's examples in index order (evaluation, samples).

    With `num_shards`, only the indices of contiguous part `index` of
    `num_shards` (as equal as can be): the parts are disjoint and together
    hold every example once.
    """
    reader = _Reader(source)
    num_examples = len(source)
    first = num_examples * index // num_shards
    end = num_examples * (index + 1) // num_shards
    mine = end - first
    chunks = tf.data.Dataset.range(first, end, _SEQUENTIAL_READ).map(
        lambda start: tf.range(start, tf.minimum(start + _SEQUENTIAL_READ, end))
    )
    records = chunks.map(
        reader.records, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    ).unbatch()
    records = records.apply(tf.data.experimental.assert_cardinality(mine))
    return _preprocessed(records, source)


def first_examples(source: RandomAccessSource | ArraySource, count: int) -> tf.data.Dataset:
    """Examples `0 .. count - 1`, reading no other record (the structure, the one-batch check)."""
    reader = _Reader(source)
    records = (
        tf.data.Dataset.from_tensors(tf.range(count, dtype=tf.int64)).map(reader.records).unbatch()
    )
    return _preprocessed(records, source)


def in_memory_examples(source: ArraySource) -> tf.data.Dataset:
    """The examples as graph tensors, for workers that run no Python (parameter servers)."""
    records = tf.data.Dataset.from_tensor_slices(source.arrays)
    return _preprocessed(records, source)
