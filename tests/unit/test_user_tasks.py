"""Tasks written the way keras.io teaches, through `python -m trainer.task` (issue 19).

Custom `train_step` models, string features under several replicas,
variable-length features, weighted metrics and class weights, and the
mistakes users make: each mistake is one `error:` line and exit 2, under one
process and under two workers.
"""

import numpy as np
import pytest
import tensorflow as tf


def _sequences(count=40, seed=3):
    rng = np.random.default_rng(seed)
    sequences = [
        rng.integers(1, 10, size=rng.integers(1, 13)).astype(np.int32) for _ in range(count)
    ]
    return tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant(sequences), np.arange(count, dtype=np.int32))
    )


def _take(stream, count):
    return [tuple(np.array(part) for part in batch) for batch in stream.take(count)]


@pytest.mark.parametrize("mode", ["longest", "declared", "buckets"])
def test_padded_and_bucketed_streams_are_deterministic_and_resume_exactly(mode):
    from tfdist.data import batching  # pylint: disable=g-import-not-at-top

    declared = {
        "longest": batching.PadToLongest(),
        "declared": batching.PadToShape((16,)),
        "buckets": batching.BucketByLength(boundaries=(4, 8)),
    }[mode]

    def stream(first_step=0):
        return batching.padded_training_batches(
            _sequences(),
            declared,
            global_batch_size=8,
            seed=5,
            num_examples=40,
            first_step=first_step,
        )

    first, again, resumed = _take(stream(), 12), _take(stream(), 12), _take(stream(7), 5)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    for a, b in zip(first[7:], resumed):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert all(features.shape[0] == 8 for features, _ in first)
    if isinstance(declared, batching.PadToShape):
        assert {features.shape[1] for features, _ in first} == {16}
    else:  # padded to the longest of each batch: some batch is shorter than 12
        assert min(features.shape[1] for features, _ in first) < 12
        assert all(np.count_nonzero(features[:, -1]) > 0 for features, _ in first)
    # Every example once per 5 batches of the passes (40 examples, batches of 8).
    seen = np.concatenate([labels for _, labels in first[:5]])
    if not isinstance(declared, batching.BucketByLength):
        assert sorted(seen.tolist()) == list(range(40))


def test_a_bad_declaration_is_refused_with_what_is_expected():
    from tfdist.data import batching  # pylint: disable=g-import-not-at-top

    with pytest.raises(Exception, match="expected increasing positive ints"):
        batching.BucketByLength(boundaries=(8, 4))
    with pytest.raises(Exception, match=r"expected a tuple of positive ints"):
        batching.PadToShape(features=16)


def test_class_weight_multiplies_the_sample_weights():
    from tfdist.tasks import weighting  # pylint: disable=g-import-not-at-top

    examples = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, 2), np.float32), np.array([0, 1, 2, 1]), np.array([1.0, 2.0, 1.0, 1.0]))
    )
    weighted = weighting.apply_class_weight(examples, {1: 3.0, 0: 0.5})
    assert [float(w) for _, _, w in weighted] == [0.5, 6.0, 1.0, 3.0]
    one_hot = tf.data.Dataset.from_tensor_slices(
        (np.zeros((2, 2), np.float32), np.eye(2, dtype=np.float32))
    )
    assert [float(w) for _, _, w in weighting.apply_class_weight(one_hot, {1: 4.0})] == [1.0, 4.0]
