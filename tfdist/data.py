"""Distributed input: global vs per-replica batches and deliberate sharding.

Datasets given to Keras under a strategy are batched by the *global* batch
size; the strategy splits each global batch among the replicas. With the
`DATA` auto-shard policy every worker builds the same pipeline and keeps its
own part of each global batch, so N workers together see exactly the examples
one process sees at the same global batch size.
"""

import tensorflow as tf

from tfdist.errors import UsageError


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """The batch each replica computes on.

    Raises:
        UsageError: `global_batch_size` is not a multiple of `num_replicas`.
    """
    if global_batch_size % num_replicas:
        lower = global_batch_size - global_batch_size % num_replicas
        raise UsageError(
            f"--global_batch_size={global_batch_size} does not divide among "
            f"{num_replicas} replicas, expected a multiple of {num_replicas}; use "
            f"{lower or num_replicas} or {lower + num_replicas}")
    return global_batch_size // num_replicas


def with_shard_policy(dataset: tf.data.Dataset,
                      policy=tf.data.experimental.AutoShardPolicy.DATA) -> tf.data.Dataset:
    """Sets the auto-shard policy explicitly (which also silences TF's warning)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)
