"""The built-in models and datasets as one task: `--model=mlp|cnn --dataset=synthetic|<tfds>`."""

import keras

from tfdist.tasks import Task
from trainer.tasks import datasets, models


class BuiltinTask(Task):
    """A built-in model on a built-in dataset, through the same task contract as a user's.

    Args:
        model: A name from `trainer.tasks.models.MODELS`.
        dataset: `synthetic` or a prepared tfds image-classification set.
        data_dir: The tfds data directory; nothing is downloaded.
        num_examples: Training examples of the synthetic dataset.
        seed: Fixes the synthetic data.
    """

    def __init__(
        self,
        *,
        model: str,
        dataset: str,
        data_dir: str = "",
        num_examples: int = 8192,
        seed: int = 0,
    ):
        models.check_model_name(model)
        self.model_name, self.dataset_name = model, dataset
        self.num_examples, self.seed = num_examples, seed
        if dataset == datasets.SYNTHETIC:
            self._builder = None
            self.info = datasets.DatasetInfo(
                datasets.SYNTHETIC_IMAGE_SHAPE,
                datasets.SYNTHETIC_NUM_CLASSES,
                num_examples,
                datasets.synthetic_test_size(num_examples),
            )
        else:
            self._builder = datasets.tfds_builder(dataset, data_dir)
            self.info = datasets.tfds_info(self._builder)

    @property
    def identity(self) -> str:
        """What decides the examples: dataset name, and size for synthetic data."""
        if self._builder is None:
            return f"{self.dataset_name}(num_examples={self.num_examples}, seed={self.seed})"
        return f"{self.dataset_name}:{self._builder.info.version}"

    def build_model(self) -> keras.Model:
        return models.MODELS[self.model_name](self.info.input_shape, self.info.num_classes)

    def build_inputs(self, training: bool):
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        if self._builder is None:
            split = "train" if training else "test"
            size = self.info.num_train_examples if training else self.info.num_test_examples
            return tf.data.Dataset.from_tensor_slices(
                datasets.synthetic_arrays(size, self.seed, split)
            )
        split = "train" if training else datasets.tfds_test_split(self._builder)
        return datasets.tfds_input(self._builder, split)

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
