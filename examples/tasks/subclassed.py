"""A subclassed `keras.Model` built from custom layers (no custom `train_step`).

    python -m trainer.task --task=examples.tasks.subclassed:SubclassedTask \
        --epochs=2 --model_dir=/tmp/subclassed

The data are made here, offline and deterministically: points in 12
dimensions whose class (one of 3) is decided by which of three fixed
nonlinear scores is largest. The model stacks `GatedResidual` blocks (a
custom layer with its own weights, layer norm and dropout) under a
`keras.Model` subclass. Both classes are registered, so `model.keras` loads
with `safe_mode=True` once this module is imported.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.tasks import Task

NUM_FEATURES = 12
NUM_CLASSES = 3


def make_points(count: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` float32 points and int32 labels: the largest of three fixed nonlinear scores."""
    directions = np.random.default_rng(2024).normal(size=(NUM_FEATURES, NUM_CLASSES))
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(count, NUM_FEATURES))
    scores = np.tanh(points @ directions) + 0.5 * (points[:, :NUM_CLASSES] ** 2)
    return points.astype(np.float32), np.argmax(scores, axis=1).astype(np.int32)


@keras.saving.register_keras_serializable(package="tfdist_examples")
class GatedResidual(keras.layers.Layer):
    """`x + dropout(sigmoid(x W_g + b_g) * gelu(x W + b))`, then layer norm.

    The weights are created in `build` with `add_weight`, as a custom layer's
    should be, so the strategy places them.
    """

    def __init__(self, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.drop = keras.layers.Dropout(dropout)
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)

    def build(self, input_shape):
        width = input_shape[-1]
        self.kernel = self.add_weight(
            shape=(width, width), initializer="glorot_uniform", name="kernel"
        )
        self.bias = self.add_weight(shape=(width,), initializer="zeros", name="bias")
        self.gate_kernel = self.add_weight(
            shape=(width, width), initializer="glorot_uniform", name="gate_kernel"
        )
        self.gate_bias = self.add_weight(shape=(width,), initializer="zeros", name="gate_bias")
        self.norm.build(input_shape)

    def call(self, inputs, training=False):
        value = keras.ops.gelu(keras.ops.matmul(inputs, self.kernel) + self.bias)
        gate = keras.ops.sigmoid(keras.ops.matmul(inputs, self.gate_kernel) + self.gate_bias)
        return self.norm(inputs + self.drop(gate * value, training=training))

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout}


@keras.saving.register_keras_serializable(package="tfdist_examples")
class GatedResidualClassifier(keras.Model):
    """A projection, `depth` gated residual blocks, and logits."""

    def __init__(
        self,
        *,
        width: int = 32,
        depth: int = 2,
        num_classes: int = NUM_CLASSES,
        dropout: float = 0.1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.width, self.depth = width, depth
        self.num_classes, self.dropout = num_classes, dropout
        self.project = keras.layers.Dense(width, name="project")
        self.blocks = [GatedResidual(dropout, name=f"block{i}") for i in range(depth)]
        self.logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")

    def call(self, inputs, training=False):
        x = self.project(inputs)
        for block in self.blocks:
            x = block(x, training=training)
        return self.logits(x)

    def get_config(self):
        return {
            "width": self.width,
            "depth": self.depth,
            "num_classes": self.num_classes,
            "dropout": self.dropout,
            "name": self.name,
        }


class SubclassedTask(Task):
    """Three-class points with a subclassed gated-residual network.

    Args:
        width: Hidden width.
        depth: Gated residual blocks.
        dropout: Dropout rate inside each block.
        num_examples: Training examples; evaluation has a quarter as many.
        data_seed: Fixes the points (the training order is fixed by `--seed`).
    """

    def __init__(
        self,
        width: int = 32,
        depth: int = 2,
        dropout: float = 0.1,
        num_examples: int = 2048,
        data_seed: int = 0,
    ):
        self.width, self.depth, self.dropout = width, depth, dropout
        self.num_examples, self.data_seed = num_examples, data_seed

    def build_model(self) -> keras.Model:
        return GatedResidualClassifier(
            width=self.width, depth=self.depth, dropout=self.dropout, name="gated_residual"
        )

    def build_inputs(self, training: bool) -> tf.data.Dataset:
        count = self.num_examples if training else max(self.num_examples // 4, 1)
        points, labels = make_points(count, seed=self.data_seed * 2 + (0 if training else 1))
        return tf.data.Dataset.from_tensor_slices((points, labels))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
