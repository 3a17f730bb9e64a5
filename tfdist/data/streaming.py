"""Streaming input from a task's own `tf.data.Dataset` of decoded examples.

Datasets given to Keras under a strategy are batched by the *global* batch
size; the strategy splits each global batch among the replicas. With the
`DATA` auto-shard policy every worker builds the same pipeline and keeps its
own part of each global batch, so N workers together see exactly the examples
one process sees at the same global batch size, at the cost of every worker
decoding the whole global batch: a task avoids that by returning a source
(`tfdist.data.sources`) instead.
"""

import tensorflow as tf

from tfdist.data.shards import batches_per_pass, check_global_batch
from tfdist.data.sources import DECODED_SHUFFLE_BYTES
from tfdist.errors import UsageError

__all__ = [
    "per_replica_batch_size",
    "with_shard_policy",
    "MAX_SHUFFLE_BUFFER",
    "MAX_CACHED_BYTES",
    "caches_first_pass",
    "count_examples",
    "training_batches",
    "shuffle_window",
    "evaluation_batches",
    "file_sharded_batches",
]

per_replica_batch_size = check_global_batch


def with_shard_policy(
    dataset: tf.data.Dataset, policy=tf.data.experimental.AutoShardPolicy.DATA
) -> tf.data.Dataset:
    """Sets the auto-shard policy explicitly (which also silences TF's warning)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


# Examples held in the shuffle buffer at most: an epoch is still a permutation
# (every example exactly once), drawn through a window of this size, and of at
# most `DECODED_SHUFFLE_BYTES` of examples.
MAX_SHUFFLE_BUFFER = 16384
# One pass of examples up to this size is kept in memory after its first read, so
# later passes (and a resume's skipped batches) cost no decoding or file reads.
MAX_CACHED_BYTES = 256 * 2**20


def caches_first_pass(examples: tf.data.Dataset, num_examples: int | None) -> bool:
    """Whether the training streams keep the first pass in memory (`MAX_CACHED_BYTES`).

    When the examples were counted and one pass of them, of fully known
    shapes, fits. Later passes then replay the first, reshuffled by the
    stream's own seeded shuffle: a task's own reshuffling shuffle is drawn
    once, so no iterator state needs its seed state.
    """
    return num_examples is not None and _pass_bytes(examples, num_examples) <= MAX_CACHED_BYTES


def count_examples(examples: tf.data.Dataset) -> int:
    """The number of examples in a finite dataset (iterates it when TF cannot tell)."""
    cardinality = int(examples.cardinality())
    if cardinality >= 0:
        return cardinality
    return int(examples.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))


def training_batches(
    examples: tf.data.Dataset,
    *,
    global_batch_size: int,
    seed: int,
    num_examples: int | None,
    first_step: int = 0,
    shuffle_buffer: int = MAX_SHUFFLE_BUFFER,
    end_step: int | None = None,
) -> tf.data.Dataset:
    """The endless, deterministic stream of global training batches.

    Pass `p` over the examples is a permutation drawn with seed `(seed, p)`,
    cut into full global batches (the remainder of each pass is dropped), so
    batch `s` of the stream is the same in every process, worker and restart.
    Starting at `first_step` skips whole passes for free and at most one pass
    of batches: the cost of a resume does not grow with the step.

    Args:
        examples: One pass of unbatched examples.
        global_batch_size: Examples per step across all replicas.
        seed: Fixes every pass's order.
        num_examples: Examples in one pass (see `count_examples`), or None
            when not counted: the stream is the same, but a start at
            `first_step` then reads (and decodes) every batch before it, and
            nothing is cached.
        first_step: Index of the first batch to yield.
        shuffle_buffer: Upper bound of the shuffle window.
        end_step: The stream ends before batch `end_step` (None: never), and
            reads nothing for the batches after it: the read-ahead of the
            prefetch stops there (a restart would decode what it read).
    """
    _check_dense(examples)
    if num_examples is None:
        first_pass, offset = 0, 0
        buffer = shuffle_window(examples, shuffle_buffer, shuffle_buffer)
    else:
        per_pass = batches_per_pass(num_examples, global_batch_size)
        first_pass, offset = divmod(first_step, per_pass)
        buffer = shuffle_window(examples, num_examples, shuffle_buffer)
        if caches_first_pass(examples, num_examples):
            examples = examples.cache()

    def one_pass(pass_index, skipped_examples=0):
        # Skipping examples before batching copies nothing into the skipped batches.
        shuffled = _seeded_shuffle(examples, buffer, seed, pass_index)
        if skipped_examples:
            shuffled = shuffled.skip(skipped_examples)
        return shuffled.batch(
            global_batch_size,
            drop_remainder=True,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    rest = tf.data.Dataset.range(first_pass + 1, tf.int64.max).flat_map(one_pass)
    stream = one_pass(tf.constant(first_pass, tf.int64), offset * global_batch_size).concatenate(
        rest
    )
    if num_examples is None and first_step:
        stream = stream.skip(first_step)
    if end_step is not None:
        stream = stream.take(max(0, end_step - first_step))
    return with_shard_policy(stream.prefetch(tf.data.AUTOTUNE))


def shuffle_window(
    examples: tf.data.Dataset,
    num_examples: int,
    max_examples: int = MAX_SHUFFLE_BUFFER,
    max_bytes: int = DECODED_SHUFFLE_BYTES,
) -> int:
    """Examples in the shuffle window: at most `max_examples` and `max_bytes` of them."""
    example_bytes = _pass_bytes(examples, 1)
    by_bytes = (
        max_examples
        if example_bytes == float("inf")
        else max(1, int(max_bytes // max(1.0, example_bytes)))
    )
    return max(1, min(num_examples, max_examples, by_bytes))


def _pass_bytes(examples: tf.data.Dataset, num_examples: int) -> float:
    """Bytes of one pass of dense examples; infinite when a shape is not fully known."""
    total = 0
    for spec in tf.nest.flatten(examples.element_spec):
        if not spec.shape.is_fully_defined():
            return float("inf")
        total += spec.shape.num_elements() * spec.dtype.size
    return float(total * num_examples)


def _check_dense(examples: tf.data.Dataset) -> None:
    for spec in tf.nest.flatten(examples.element_spec):
        if not isinstance(spec, tf.TensorSpec):
            raise UsageError(
                f"the training examples hold a {type(spec).__name__}, expected dense tensors "
                f"only; pad or densify ragged and sparse features in build_inputs"
            )


def _seeded_shuffle(
    examples: tf.data.Dataset, buffer_size: int, seed: int, pass_index: tf.Tensor
) -> tf.data.Dataset:
    """`examples.shuffle` with the seed pair `(seed, pass_index)`, whatever the global seed.

    `Dataset.shuffle` combines a tensor seed with TensorFlow's global seed in
    Python and fails when that is 0 (`tf.random.set_seed(0)`); the shuffle op
    itself takes both seeds as tensors.
    """
    flat_specs = tf.nest.flatten(examples.element_spec)
    variant = tf.raw_ops.ShuffleDataset(
        input_dataset=tf.data.experimental.to_variant(examples),
        buffer_size=tf.constant(buffer_size, tf.int64),
        seed=tf.constant(seed, tf.int64),
        # (0, 0) would mean "unseeded" to the op.
        seed2=tf.cast(pass_index, tf.int64) + 1,
        reshuffle_each_iteration=False,
        output_types=[spec.dtype for spec in flat_specs],
        output_shapes=[spec.shape for spec in flat_specs],
    )
    return tf.data.experimental.from_variant(variant, examples.element_spec)


def evaluation_batches(examples: tf.data.Dataset, *, global_batch_size: int) -> tf.data.Dataset:
    """One pass over evaluation examples in global batches (the last may be partial).

    The shard policy stays `AUTO`: under several workers `keras_compat` gives
    each worker its share (by file, by record after the reader, else `DATA`).
    """
    return with_shard_policy(
        examples.batch(global_batch_size).prefetch(tf.data.AUTOTUNE),
        tf.data.experimental.AutoShardPolicy.AUTO,
    )


def file_sharded_batches(
    examples: tf.data.Dataset,
    *,
    shard,
    global_batch_size: int,
    seed: int,
    first_step: int = 0,
    shuffle_buffer: int = MAX_SHUFFLE_BUFFER,
    num_examples: int | None = None,
    end_step: int | None = None,
) -> tf.data.Dataset:
    """This input pipeline's per-replica batches of the examples of its share of the files.

    The task's pipeline is rewritten to read only file shard `shard.index` of
    `shard.count` (`keras_compat.shard_by_file`); the passes over that share
    follow one another (`repeat`), each shuffled anew in a window bounded in
    examples and bytes, in an order fixed by `seed` (and TensorFlow's global
    seed, which the trainer sets from `--seed`). The order depends on the
    number of workers; a start at `first_step` skips (and so decodes) this
    shard's examples before it. Check `keras_compat.can_shard_by_file` first.
    With `num_examples` (of the whole pass) given and the pass small enough
    (`caches_first_pass`), the share's first pass is kept in memory. With
    `end_step`, the stream ends before step `end_step`, reading nothing for
    the steps after it (as `training_batches`).
    """
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    _check_dense(examples)
    per_replica = check_global_batch(global_batch_size, shard.num_replicas)
    span = per_replica * shard.local_replicas
    mine = keras_compat.shard_by_file(examples, shard.count, shard.index)
    if caches_first_pass(examples, num_examples):
        mine = mine.cache()
    window = shuffle_window(mine, shuffle_buffer, shuffle_buffer)
    # The task's pipeline stays at the top of the graph, where tf.data's static
    # optimizations apply (its sequential `map(decode)` made parallel); inside a
    # `flat_map` of passes they do not, which cost 0.83-0.87x plain tf.data's
    # throughput (docs/benchmarks.md). The seed is never 0: (0, 0) means unseeded.
    stream = mine.shuffle(
        window, seed=seed * 1009 + shard.index + 1, reshuffle_each_iteration=True
    ).repeat()
    if first_step:
        stream = stream.skip(first_step * span)
    # Fused, shuffle and repeat would fill the window across passes: with a window larger
    # than the share, 3 passes decoded before the first batch instead of 1.
    unfused = tf.data.Options()
    unfused.experimental_optimization.shuffle_and_repeat_fusion = False
    batches = stream.batch(per_replica, drop_remainder=True)
    if end_step is not None:
        batches = batches.take(max(0, end_step - first_step) * shard.local_replicas)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(unfused)
