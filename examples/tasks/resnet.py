"""A small ResNet-style image classifier: residual blocks, batch norm, augmentation.

    python -m trainer.task --task=examples.tasks.resnet:ResNetTask \
        --task_config='{"image_size": 16}' --epochs=2 --model_dir=/tmp/resnet

The data are made here, offline and deterministically: images of stripes
(horizontal, vertical, checkerboard or none) at a random phase, tinted by
class, under noise. Flips and small shifts keep the class, so the
augmentation layers (`RandomFlip`, `RandomTranslation`, active in training
only) make the model learn what matters.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.tasks import Task

NUM_CLASSES = 4
_PERIOD = 4
_NOISE = 0.6


def make_images(count: int, *, image_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` images `(image_size, image_size, 3)` and their int32 labels in [0, 4).

    Class 0: horizontal stripes, 1: vertical stripes, 2: a checkerboard,
    3: no pattern; each class also tints the image with its own colour.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=count).astype(np.int32)
    rows, cols = np.meshgrid(np.arange(image_size), np.arange(image_size), indexing="ij")
    phase = rng.integers(0, _PERIOD, size=(count, 1, 1))
    horizontal = np.sin(2 * np.pi * (rows[None] + phase) / _PERIOD)
    vertical = np.sin(2 * np.pi * (cols[None] + phase) / _PERIOD)
    patterns = np.stack(
        [horizontal, vertical, horizontal * vertical, np.zeros_like(horizontal)], axis=1
    )[np.arange(count), labels]
    tints = np.random.default_rng(1000).normal(scale=0.3, size=(NUM_CLASSES, 3))
    images = (
        patterns[..., None]
        + tints[labels][:, None, None, :]
        + rng.normal(scale=_NOISE, size=(count, image_size, image_size, 3))
    )
    return images.astype(np.float32), labels


def augmentation() -> keras.Sequential:
    """Random horizontal flips and shifts of up to 1/8 of the image; identity at inference."""
    return keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomTranslation(0.125, 0.125, fill_mode="reflect"),
        ],
        name="augmentation",
    )


def batch_norm(name: str) -> keras.layers.BatchNormalization:
    # Momentum 0.9, as in TF Model Garden's ResNets: the moving statistics settle
    # within tens of steps, which short runs need.
    return keras.layers.BatchNormalization(momentum=0.9, name=name)


def residual_block(x, filters: int, *, stride: int, name: str):
    """Two 3x3 convolutions with batch norm, added to a (projected) shortcut."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(
            filters, 1, strides=stride, use_bias=False, name=f"{name}_proj"
        )(x)
        shortcut = batch_norm(name=f"{name}_proj_bn")(shortcut)
    y = keras.layers.Conv2D(
        filters, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1"
    )(x)
    y = batch_norm(name=f"{name}_bn1")(y)
    y = keras.layers.Activation("relu", name=f"{name}_relu1")(y)
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = batch_norm(name=f"{name}_bn2")(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.Activation("relu", name=f"{name}_out")(y)


def resnet(image_size: int, width: int) -> keras.Model:
    """Stem, two residual stages (the second halves the resolution), pooled logits."""
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = augmentation()(inputs)
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem_conv")(x)
    x = batch_norm(name="stem_bn")(x)
    x = keras.layers.Activation("relu", name="stem_relu")(x)
    x = residual_block(x, width, stride=1, name="block1")
    x = residual_block(x, 2 * width, stride=2, name="block2")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    # float32 logits keep the loss stable under mixed precision.
    outputs = keras.layers.Dense(NUM_CLASSES, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet")


class ResNetTask(Task):
    """Stripes classification with a small ResNet.

    Args:
        image_size: Height and width of the images.
        width: Filters of the first stage (the second has twice as many).
        num_examples: Training examples; evaluation has a quarter as many.
        data_seed: Fixes the images (the training order is fixed by `--seed`).
    """

    def __init__(
        self, image_size: int = 16, width: int = 8, num_examples: int = 1024, data_seed: int = 0
    ):
        self.image_size = image_size
        self.width = width
        self.num_examples = num_examples
        self.data_seed = data_seed

    def build_model(self) -> keras.Model:
        return resnet(self.image_size, self.width)

    def build_inputs(self, training: bool) -> tf.data.Dataset:
        count = self.num_examples if training else max(self.num_examples // 4, 1)
        images, labels = make_images(
            count, image_size=self.image_size, seed=self.data_seed * 2 + (0 if training else 1)
        )
        return tf.data.Dataset.from_tensor_slices((images, labels))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
