"""Sharding a task's own dataset by file for one input pipeline (TensorFlow's auto-shard rewrite).

`tf.distribute` shards a dataset by file only inside
`experimental_distribute_dataset`, which also rebatches it for the strategy;
there is no public op that gives one input pipeline its share of the files of
an arbitrary `tf.data` pipeline (`TFRecordDataset(files).map(decode)`, a
`list_files().interleave(...)`). The rewrite behind it, `_AutoShardDataset`
with the FILE policy, does exactly that: it walks up to the reader and shards
its file names. It raises `NotFoundError` (at the first read) when the
pipeline has no reader, and gives a shard no files when there are fewer files
than shards; tfdist then keeps every worker's whole pipeline. `tests/multiprocess/test_keras_compat.py` shows that the
public API still has no such op.
"""

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute

# What a FILE-policy rewrite raises when it cannot shard the pipeline by file.
UNSHARDABLE = (tf.errors.NotFoundError, tf.errors.InvalidArgumentError)
# Reader datasets the FILE rewrite shards (their first input is the file names).
READER_OPS = frozenset(
    {
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
    }
)


def reads_files(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline's graph holds a file reader (in any of its functions too)."""
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
    ops = {node.op for node in graph.node}
    ops.update(node.op for function in graph.library.function for node in function.node_def)
    return bool(ops & READER_OPS)


def file_shard(dataset: tf.data.Dataset, num_shards: int, index: int) -> tf.data.Dataset:
    """The FILE rewrite's shard `index` of `num_shards`, its options left as they are."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return tf_data_distribute._AutoShardDataset(  # pylint: disable=protected-access
        dataset.with_options(options), num_shards, index, num_replicas=num_shards
    )


def shard_by_file(dataset: tf.data.Dataset, num_shards: int, index: int) -> tf.data.Dataset:
    """The examples of file shard `index` of `num_shards` (errors surface at the first read)."""
    sharded = file_shard(dataset, num_shards, index)
    # The rewrite ran; later strategies must not shard these examples again.
    off = tf.data.Options()
    off.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return sharded.with_options(off)


def can_shard_by_file(dataset: tf.data.Dataset, num_shards: int) -> bool:
    """Whether the pipeline reads at least `num_shards` files (reads one example to know).

    The last shard gets the fewest files: none when there are fewer files than
    shards, and then it yields nothing. A pipeline without a file reader is
    not rewritten at all (the rewrite would log an error).
    """
    if not reads_files(dataset):
        return False
    try:
        for _ in shard_by_file(dataset, num_shards, num_shards - 1).take(1):
            return True
    except UNSHARDABLE:
        return False
    return False
