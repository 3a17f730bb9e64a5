"""Tasks for the tests: a subclassed model with batch norm and dropout, and broken tasks."""

import os
import signal

import keras
import numpy as np
import tensorflow as tf

from tfdist.tasks import Task

FEATURES = 6


def _arrays(count: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return x, y


class TwoHeads(keras.Model):
    """Two same-shape layers (`q`, `k`), batch norm and dropout."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.q = keras.layers.Dense(8)
        self.k = keras.layers.Dense(8)
        self.norm = keras.layers.BatchNormalization()
        self.drop = keras.layers.Dropout(0.1)
        self.out = keras.layers.Dense(2)

    def call(self, inputs, training=False):
        hidden = self.norm(keras.ops.relu(self.q(inputs) + self.k(inputs)), training=training)
        return self.out(self.drop(hidden, training=training))


class SubclassedTask(Task):
    """Binary classification with optional sample weights."""

    def __init__(self, num_examples: int = 256, sample_weights: bool = False):
        self.num_examples = num_examples
        self.sample_weights = sample_weights

    def build_model(self):
        return TwoHeads()

    def build_inputs(self, training):
        x, y = _arrays(self.num_examples if training else 64, 1 if training else 2)
        if self.sample_weights and training:
            weights = np.where(y == 1, 2.0, 1.0).astype(np.float32)
            return tf.data.Dataset.from_tensor_slices((x, y, weights))
        return tf.data.Dataset.from_tensor_slices((x, y))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


def make_task():
    """A zero-argument factory."""
    return SubclassedTask(num_examples=128)


class NoLoss:
    def build_model(self):
        return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2)])

    def build_inputs(self, training):
        return None

    def metrics(self):
        return []


class ReturnsNumpy(SubclassedTask):
    def build_inputs(self, training):
        return _arrays(16, 0)


class ReturnsALayer(SubclassedTask):
    def build_model(self):
        return keras.layers.Dense(2)


class Batched(SubclassedTask):
    def build_inputs(self, training):
        return super().build_inputs(training).batch(4).map(lambda x, y: {"x": x, "y": y})


class Endless(SubclassedTask):
    def build_inputs(self, training):
        return super().build_inputs(training).repeat()


class ConvBeforeNorm(keras.Model):
    """A biased conv before batch norm: the bias's gradient is ~0, and Adam turns round-off
    in it into full steps, so any difference in the reduction order shows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(8, 3, use_bias=True)
        self.norm = keras.layers.BatchNormalization()
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.out = keras.layers.Dense(3)

    def call(self, inputs, training=False):
        hidden = keras.ops.relu(self.norm(self.conv(inputs), training=training))
        return self.out(self.pool(hidden))


class ConvBeforeNormTask(SubclassedTask):
    """Three classes of 8x8x3 images."""

    def build_model(self):
        return ConvBeforeNorm()

    def build_inputs(self, training):
        rng = np.random.default_rng(1 if training else 2)
        x = rng.normal(size=(256 if training else 64, 8, 8, 3)).astype(np.float32)
        y = (x[..., 0].mean(axis=(1, 2)) > 0).astype(np.int32) + (x[:, 0, 0, 1] > 0)
        return tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))

    def metrics(self):
        return []


class _DiesAtStep(keras.layers.Layer):
    """Kills its process (SIGKILL, as the OOM killer does) in training call number `step`.

    The call count is a model variable, so it is backed up and restored: a restart
    from an earlier backup dies at the same step again, every time.
    """

    def __init__(self, step: int, **kwargs):
        super().__init__(**kwargs)
        self.step = step

    def build(self, input_shape):
        self.calls = self.add_weight(
            name="calls", shape=(), initializer="zeros", trainable=False, dtype="int64"
        )

    def call(self, inputs, training=False):
        if training:
            self.calls.assign_add(1)
            tf.py_function(self._die_at_step, [self.calls.value], [])
        return inputs

    def _die_at_step(self, calls):
        if int(calls) == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class DiesAtStep(SubclassedTask):
    """`SubclassedTask` whose process is killed at training step `step` on every start."""

    def __init__(self, step: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.step = step

    def build_model(self):
        return keras.Sequential([_DiesAtStep(self.step), TwoHeads()])
