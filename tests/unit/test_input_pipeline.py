"""tfdist's training stream: seeded permutations per pass, exact skipping, bounded resume cost."""

import itertools

import pytest
import tensorflow as tf

from tfdist import data as data_lib
from tfdist.errors import UsageError

NUM_EXAMPLES = 640
BATCH = 64
PER_PASS = NUM_EXAMPLES // BATCH


def examples(count: int = NUM_EXAMPLES) -> tf.data.Dataset:
    return tf.data.Dataset.range(count).map(lambda i: (tf.cast(i, tf.float32), i))


def stream(seed: int = 0, first_step: int = 0, count: int = NUM_EXAMPLES, batch: int = BATCH):
    return data_lib.training_batches(
        examples(count),
        global_batch_size=batch,
        seed=seed,
        num_examples=count,
        first_step=first_step,
    )


def labels(dataset, steps: int) -> list[list[int]]:
    return [y.numpy().tolist() for _, y in itertools.islice(iter(dataset), steps)]


def test_every_pass_is_a_permutation_of_the_examples():
    # Repeat-then-shuffle (the old pipeline) showed only 484 of 640 examples in epoch 0.
    batches = labels(stream(), 3 * PER_PASS)
    for pass_index in range(3):
        seen = [
            label
            for batch in batches[pass_index * PER_PASS : (pass_index + 1) * PER_PASS]
            for label in batch
        ]
        assert sorted(seen) == list(range(NUM_EXAMPLES))
    assert batches[:PER_PASS] != batches[PER_PASS : 2 * PER_PASS], "every pass has its own order"


def test_the_same_seed_gives_the_same_stream_and_another_seed_another():
    assert labels(stream(seed=7), 25) == labels(stream(seed=7), 25)
    assert labels(stream(seed=7), 1) != labels(stream(seed=8), 1)


def test_the_order_does_not_depend_on_tensorflows_global_seed():
    reference = labels(stream(seed=3), 12)
    for global_seed in (0, 1234):
        tf.random.set_seed(global_seed)
        assert labels(stream(seed=3), 12) == reference


@pytest.mark.parametrize("first_step", [1, PER_PASS - 1, PER_PASS, 2 * PER_PASS + 3])
def test_starting_at_a_step_yields_the_rest_of_the_same_stream(first_step):
    reference = labels(stream(), first_step + 12)
    assert labels(stream(first_step=first_step), 12) == reference[first_step:]


def test_resuming_far_into_training_reads_at_most_one_pass():
    reads = tf.Variable(0, dtype=tf.int64)

    def counted(i):
        reads.assign_add(1)
        return tf.cast(i, tf.float32), i

    counted_examples = tf.data.Dataset.range(NUM_EXAMPLES).map(counted)
    far = 100_000 * PER_PASS + 3
    resumed = data_lib.training_batches(
        counted_examples, global_batch_size=BATCH, seed=0, num_examples=NUM_EXAMPLES, first_step=far
    )
    first = next(iter(resumed))
    assert first[0].shape == (BATCH,)
    assert int(reads.numpy()) <= 2 * NUM_EXAMPLES, "a resume must not replay earlier passes"
    reference_pass = 100_000 * PER_PASS
    assert labels(stream(first_step=far), 2) == labels(stream(first_step=reference_pass), 5)[3:]


def test_a_pass_drops_its_remainder_and_batches_are_full():
    for x, y in itertools.islice(iter(stream(count=100, batch=32)), 7):
        assert x.shape == (32,) and y.shape == (32,)


def test_fewer_examples_than_one_batch_is_a_usage_error():
    with pytest.raises(UsageError, match="has 10 examples, fewer than one global batch of 64"):
        stream(count=10)


def test_ragged_examples_are_refused_with_a_fix():
    ragged = tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant([[1], [1, 2]] * 64), tf.zeros(128))
    )
    with pytest.raises(UsageError, match="expected dense tensors only"):
        data_lib.training_batches(ragged, global_batch_size=8, seed=0, num_examples=128)


def test_training_streams_shard_by_data_and_evaluation_leaves_the_choice_to_keras_compat():
    policy = tf.data.experimental.AutoShardPolicy
    evaluation = data_lib.evaluation_batches(examples(), global_batch_size=BATCH)
    assert stream().options().experimental_distribute.auto_shard_policy == policy.DATA
    assert evaluation.options().experimental_distribute.auto_shard_policy == policy.AUTO


def test_evaluation_is_one_pass_with_a_partial_last_batch():
    batches = list(data_lib.evaluation_batches(examples(100), global_batch_size=32))
    assert [len(y) for _, y in batches] == [32, 32, 32, 4]


def test_count_examples_with_and_without_a_known_cardinality():
    assert data_lib.count_examples(examples(37)) == 37
    assert data_lib.count_examples(examples(37).filter(lambda x, y: y % 2 == 0)) == 19
    assert data_lib.count_examples(examples(0)) == 0
