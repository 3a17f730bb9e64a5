"""The synthetic dataset: deterministic for a seed, learnable, one stream for every iterator."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import UsageError
from trainer import datasets as datasets_lib
from trainer import models

BATCH = 32
NUM_EXAMPLES = 256


def load(seed: int = 0, num_examples: int = NUM_EXAMPLES, batch: int = BATCH):
    return datasets_lib.load_datasets("synthetic", global_batch_size=batch, seed=seed,
                                      num_examples=num_examples)


def take(dataset_or_iterator, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    iterator = iter(dataset_or_iterator)
    return [(x.numpy(), y.numpy()) for x, y in itertools.islice(iterator, count)]


def assert_same_batches(first, second):
    assert len(first) == len(second)
    for (x1, y1), (x2, y2) in zip(first, second):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


# Enough batches to cross the end of the training split more than once.
CROSSING = 2 * NUM_EXAMPLES // BATCH + 3


def test_same_seed_gives_the_same_batches():
    assert_same_batches(take(load(seed=7).train, CROSSING), take(load(seed=7).train, CROSSING))
    assert_same_batches(take(load(seed=7).test, 100), take(load(seed=7).test, 100))


def test_another_seed_gives_other_data():
    first, second = take(load(seed=1).train, 1), take(load(seed=2).train, 1)
    assert not np.allclose(first[0][0], second[0][0])


def test_every_iterator_over_train_yields_the_same_stream():
    train = load(seed=3).train
    reference = take(train, CROSSING)
    iterator = iter(train)
    take(iterator, 5)  # A second iterator opened mid-way through another...
    assert_same_batches(take(train, CROSSING), reference)  # ...starts from the top.
    assert_same_batches(take(iterator, 4), reference[5:9])
    assert_same_batches(take(tf.data.Dataset.range(1).flat_map(lambda _: train), CROSSING),
                        reference)


def test_batches_have_the_global_batch_size_and_valid_labels():
    data = load(num_examples=100, batch=BATCH)
    for x, y in take(data.train, 10):
        assert x.shape == (BATCH,) + datasets_lib.SYNTHETIC_IMAGE_SHAPE
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert set(y) <= set(range(datasets_lib.SYNTHETIC_NUM_CLASSES))
    assert data.info == datasets_lib.DatasetInfo(
        datasets_lib.SYNTHETIC_IMAGE_SHAPE, datasets_lib.SYNTHETIC_NUM_CLASSES, 100, 12)
    assert sum(len(y) for _, y in take(data.test, 100)) == 12


def test_train_and_test_splits_hold_different_examples():
    train_images, _ = datasets_lib.synthetic_arrays(64, 0, "train")
    test_images, _ = datasets_lib.synthetic_arrays(64, 0, "test")
    assert not np.allclose(train_images, test_images)


def test_pipelines_shard_by_data():
    data = load()
    for dataset in (data.train, data.test):
        assert (dataset.options().experimental_distribute.auto_shard_policy
                == tf.data.experimental.AutoShardPolicy.DATA)


def test_synthetic_is_learnable_well_above_chance():
    keras.utils.set_random_seed(0)
    data = load(seed=0, num_examples=2048, batch=64)
    model = models.build_model("mlp", data.info.input_shape, data.info.num_classes)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    untrained = model.evaluate(data.test, verbose=0, return_dict=True)["accuracy"]
    model.fit(data.train, epochs=1, steps_per_epoch=60, verbose=0, shuffle=False)
    trained = model.evaluate(data.test, verbose=0, return_dict=True)["accuracy"]
    chance = 1 / datasets_lib.SYNTHETIC_NUM_CLASSES
    assert untrained < 0.3
    assert trained > 0.5 > 3 * chance


def test_unknown_dataset_name_is_a_usage_error():
    with pytest.raises(UsageError, match="neither 'synthetic' nor a tfds dataset"):
        datasets_lib.load_datasets("no_such_dataset_xyz", global_batch_size=8, seed=0,
                                   num_examples=8)
