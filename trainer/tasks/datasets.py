"""Built-in data: `synthetic` (offline) and tfds image-classification sets by name.

Each split is returned as unbatched `(image, label)` examples, as the task
contract asks (`tfdist.tasks`); tfdist shuffles, batches and shards them.
"""

import dataclasses

import numpy as np

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


def synthetic_arrays(num_examples: int, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Class templates plus noise: learnable, deterministic for a seed.

    The templates depend only on `seed`; the examples also on `split`, so the
    test split holds different examples of the same classes.
    """
    templates = (
        np.random.default_rng(seed)
        .normal(size=(SYNTHETIC_NUM_CLASSES,) + SYNTHETIC_IMAGE_SHAPE)
        .astype(np.float32)
    )
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    labels = rng.integers(0, SYNTHETIC_NUM_CLASSES, size=num_examples).astype(np.int32)
    noise = rng.normal(scale=_SYNTHETIC_NOISE, size=(num_examples,) + SYNTHETIC_IMAGE_SHAPE)
    images = 0.15 * templates[labels] + noise.astype(np.float32)
    return images, labels


def synthetic_test_size(num_examples: int) -> int:
    return max(num_examples // 8, 1)


def tfds_builder(name: str, data_dir: str):
    """The prepared tfds builder of an image-classification set; runs no TensorFlow op.

    Raises:
        UsageError: Unknown or unprepared dataset, or one without
            `(image, label)` supervised keys.
    """
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except Exception as error:  # tfds raises several types for an unknown name.
        raise UsageError(
            f"--dataset is {name!r}, which is neither 'synthetic' nor a tfds dataset "
            f"({type(error).__name__}); expected 'synthetic' or a tfds name such as "
            f"'mnist'"
        ) from None
    if not builder.is_prepared():
        raise UsageError(
            f"--dataset={name!r} is not prepared under --data_dir={data_dir or builder.data_dir!r}; "
            f"nothing is downloaded at run time; prepare it once with "
            f"`tfds build {name} --data_dir=DIR` and pass --data_dir=DIR"
        )
    keys = builder.info.supervised_keys
    features = builder.info.features
    if (
        not keys
        or len(keys) != 2
        or not all(isinstance(key, str) for key in keys)
        or not isinstance(features[keys[0]], tfds.features.Image)
        or not isinstance(features[keys[1]], tfds.features.ClassLabel)
    ):
        raise UsageError(
            f"--dataset={name!r} has no (image, class label) supervised keys (it has "
            f"{keys!r}), expected an image classification set; write a task for it "
            f"(--task=MODULE:NAME, see docs/tasks.md)"
        )
    return builder


def tfds_info(builder) -> DatasetInfo:
    image_key, label_key = builder.info.supervised_keys
    features, splits = builder.info.features, builder.info.splits
    return DatasetInfo(
        tuple(features[image_key].shape),
        features[label_key].num_classes,
        splits["train"].num_examples,
        splits[tfds_test_split(builder)].num_examples,
    )


def tfds_test_split(builder) -> str:
    return "test" if "test" in builder.info.splits else "validation"


def is_array_record(builder) -> bool:
    """Whether the prepared dataset's files are ArrayRecord (random access)."""
    file_format = getattr(builder.info, "file_format", None)
    return getattr(file_format, "value", file_format) == "array_record"


def tfds_input(builder, split: str):
    """The split as tfdist reads it: random access for ArrayRecord, streaming otherwise."""
    if is_array_record(builder):
        return tfds_source(builder, split)
    return tfds_examples(builder, split)


def tfds_source(builder, split: str):
    """A `RandomAccessSource` over the prepared ArrayRecord files of `split`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.data import RandomAccessSource  # pylint: disable=g-import-not-at-top

    image_key, label_key = builder.info.supervised_keys

    def preprocess(record):
        return (
            tf.cast(record[image_key], tf.float32) / 255.0,
            tf.cast(record[label_key], tf.int32),
        )

    return RandomAccessSource(
        builder.as_data_source(split=split),
        preprocess=preprocess,
        name=f"{builder.name}:{builder.info.version}:{split}",
    )


def tfds_examples(builder, split: str):
    """Unbatched `(image in [0, 1], int32 label)` examples of `split`, in file order."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    dataset = builder.as_dataset(
        split=split,
        as_supervised=True,
        shuffle_files=False,
        read_config=tfds.ReadConfig(shuffle_seed=0),
    )
    return dataset.map(
        lambda image, label: (tf.cast(image, tf.float32) / 255.0, tf.cast(label, tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
