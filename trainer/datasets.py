"""Built-in datasets: `synthetic` (offline) and any tfds dataset by name.

Every dataset is returned batched by the *global* batch size with the `DATA`
auto-shard policy (see `tfdist.data`), in an order fixed by the seed.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tfdist.data import with_shard_policy
from tfdist.errors import UsageError

SYNTHETIC = "synthetic"
SYNTHETIC_IMAGE_SHAPE = (28, 28, 1)
SYNTHETIC_NUM_CLASSES = 10
_SYNTHETIC_NOISE = 1.0


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset."""

    input_shape: tuple[int, ...]
    num_classes: int
    num_train_examples: int
    num_test_examples: int


@dataclasses.dataclass(frozen=True)
class Datasets:
    """Batched training and test pipelines.

    Attributes:
        info: Shapes and sizes.
        train: Repeats forever; one epoch is `steps_per_epoch` global batches.
        test: One pass over the test split, the last batch possibly partial.
    """

    info: DatasetInfo
    train: tf.data.Dataset
    test: tf.data.Dataset


def synthetic_arrays(num_examples: int, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Class templates plus noise: learnable, deterministic for a seed.

    The templates depend only on `seed`; the examples also on `split`, so the
    test split holds different examples of the same classes.
    """
    templates = np.random.default_rng(seed).normal(
        size=(SYNTHETIC_NUM_CLASSES,) + SYNTHETIC_IMAGE_SHAPE).astype(np.float32)
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    labels = rng.integers(0, SYNTHETIC_NUM_CLASSES, size=num_examples).astype(np.int32)
    noise = rng.normal(scale=_SYNTHETIC_NOISE, size=(num_examples,) + SYNTHETIC_IMAGE_SHAPE)
    images = 0.15 * templates[labels] + noise.astype(np.float32)
    return images, labels


def _synthetic(num_examples: int, seed: int) -> tuple[DatasetInfo, tf.data.Dataset,
                                                     tf.data.Dataset]:
    num_test = max(num_examples // 8, 1)
    info = DatasetInfo(SYNTHETIC_IMAGE_SHAPE, SYNTHETIC_NUM_CLASSES, num_examples, num_test)
    train = tf.data.Dataset.from_tensor_slices(synthetic_arrays(num_examples, seed, "train"))
    test = tf.data.Dataset.from_tensor_slices(synthetic_arrays(num_test, seed, "test"))
    return info, train, test


def check_dataset(name: str, data_dir: str = "") -> None:
    """Checks that `name` can be loaded, without running any TensorFlow op.

    Call it before building a strategy, so that a typo fails at once instead
    of after the task has joined the cluster.

    Raises:
        UsageError: Unknown or unprepared dataset.
    """
    if name != SYNTHETIC:
        _tfds_builder(name, data_dir)


def _tfds_builder(name: str, data_dir: str):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except Exception as error:  # tfds raises several types for an unknown name.
        raise UsageError(
            f"--dataset is {name!r}, which is neither 'synthetic' nor a tfds dataset "
            f"({type(error).__name__}); expected 'synthetic' or a tfds name such as "
            f"'mnist'") from None
    if not builder.is_prepared():
        raise UsageError(
            f"--dataset={name!r} is not prepared under --data_dir={data_dir or builder.data_dir!r}; "
            f"nothing is downloaded at run time; prepare it once with "
            f"`tfds build {name} --data_dir=DIR` and pass --data_dir=DIR")
    return builder


def _tfds(name: str, data_dir: str) -> tuple[DatasetInfo, tf.data.Dataset, tf.data.Dataset]:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    builder = _tfds_builder(name, data_dir)
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise UsageError(f"--dataset={name!r} has features {sorted(features.keys())}, "
                         f"expected 'image' and 'label' (an image classification set)")
    splits = builder.info.splits
    test_split = "test" if "test" in splits else "validation"
    read = tfds.ReadConfig(shuffle_seed=0)

    def load(split):
        dataset = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False,
                                     read_config=read)
        return dataset.map(lambda image, label: (tf.cast(image, tf.float32) / 255.0,
                                                 tf.cast(label, tf.int32)))

    info = DatasetInfo(tuple(features["image"].shape), features["label"].num_classes,
                       splits["train"].num_examples, splits[test_split].num_examples)
    return info, load("train"), load(test_split)


def load_datasets(name: str, *, global_batch_size: int, seed: int, num_examples: int,
                  data_dir: str = "") -> Datasets:
    """Builds the training and test pipelines for dataset `name`.

    Args:
        name: `synthetic` or a tfds dataset name, loaded from `data_dir` only.
        global_batch_size: Examples per step across all replicas.
        seed: Fixes the synthetic data and the shuffling order.
        num_examples: Size of the synthetic training split.
        data_dir: tfds data directory.

    Raises:
        UsageError: Unknown or unprepared dataset.
    """
    if name == SYNTHETIC:
        info, train, test = _synthetic(num_examples, seed)
    else:
        info, train, test = _tfds(name, data_dir)
    # Shuffling the repeated stream with a fixed order makes every iterator over
    # `train` yield the same batches: Keras may open more than one, and a
    # resumed run skips into the same stream.
    train = (train.repeat()
             .shuffle(min(info.num_train_examples, 16384), seed=seed,
                      reshuffle_each_iteration=False)
             .batch(global_batch_size, drop_remainder=True)
             .prefetch(tf.data.AUTOTUNE))
    test = test.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)
    return Datasets(info, with_shard_policy(train), with_shard_policy(test))
