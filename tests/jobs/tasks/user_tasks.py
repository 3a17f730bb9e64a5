"""Tasks written the way keras.io teaches, and the mistakes new users make with them.

Each trains in seconds on one CPU. `tests/multiprocess/test_user_tasks.py` runs them through
`python -m trainer.task`.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.tasks import Task

FEATURES = 6
WORDS = ("red", "green", "blue", "cyan", "black", "white", "grey", "pink")


def _arrays(count: int, seed: int, features: int = FEATURES):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, features)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return x, y


class Binary(Task):
    """A small dense classifier; the base of the mistakes below."""

    def __init__(self, num_examples: int = 256):
        self.num_examples = num_examples

    def build_model(self):
        return keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(2)]
        )

    def build_inputs(self, training):
        x, y = _arrays(self.num_examples if training else 64, 1 if training else 2)
        return tf.data.Dataset.from_tensor_slices((x, y))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


# --- custom train_step (keras.io "Customizing what happens in fit", lower level) ---


@keras.saving.register_keras_serializable(package="tfdist_tests")
class CustomStepModel(keras.Model):
    """Computes its own loss in `train_step`; compiled without a loss."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1)
        self.loss_fn = keras.losses.MeanSquaredError()
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(tf.reshape(y, (-1, 1)), y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(tf.reshape(y, (-1, 1)), y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


@keras.saving.register_keras_serializable(package="tfdist_tests")
class CustomStepsModel(CustomStepModel):
    """The same with its own `test_step`: it can evaluate."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(
            keras.losses.mean_squared_error(tf.reshape(y, (-1, 1)), y_pred)
        )
        self.mae_metric.update_state(tf.reshape(y, (-1, 1)), y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}


class CustomTrainStep(Task):
    """Regression with a model that overrides `train_step` only; `loss()` is None."""

    def __init__(self, with_test_step: bool = False):
        self.with_test_step = with_test_step

    def build_model(self):
        return CustomStepsModel() if self.with_test_step else CustomStepModel()

    def build_inputs(self, training):
        x, _ = _arrays(256 if training else 64, 1 if training else 2)
        y = (x[:, 0] - 2.0 * x[:, 1]).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices((x, y))

    def loss(self):
        return None


# --- strings in the model ---


def _phrases(count: int, seed: int):
    rng = np.random.default_rng(seed)
    first = rng.integers(0, len(WORDS), size=count)
    second = rng.integers(0, len(WORDS), size=count)
    text = np.array([f"{WORDS[a]} {WORDS[b]}" for a, b in zip(first, second)])
    return text, (first < len(WORDS) // 2).astype(np.int32)


class Text(Task):
    """String features through `TextVectorization` inside the model."""

    def build_model(self):
        vectorize = keras.layers.TextVectorization(
            max_tokens=20, output_sequence_length=2, vocabulary=list(WORDS)
        )
        inputs = keras.Input((), dtype="string")
        tokens = vectorize(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 8)(tokens))
        return keras.Model(inputs, keras.layers.Dense(2)(hidden))

    def build_inputs(self, training):
        text, labels = _phrases(256 if training else 64, 1 if training else 2)
        return tf.data.Dataset.from_tensor_slices((text, labels))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


# --- variable-length features ---


def _sequences(count: int, seed: int):
    """Token sequences of 1..12 tokens; the label is whether token 1 appears."""
    rng = np.random.default_rng(seed)
    sequences = [rng.integers(1, 10, size=rng.integers(1, 13)) for _ in range(count)]
    return sequences, np.array([int(1 in s) for s in sequences], np.int32)


class VariableLength(Task):
    """Variable-length token ids from a generator (`TensorSpec((None,))`) or ragged slices.

    Args:
        source: "generator" or "ragged".
        batching: None (undeclared), "longest", "declared" (pad to 16) or "buckets".
    """

    def __init__(self, source: str = "generator", batching: str | None = None):
        self.source = source
        self.batching_mode = batching

    def build_model(self):
        inputs = keras.Input((None,), dtype="int32")
        embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
        pooled = keras.layers.GlobalAveragePooling1D()(embedded)
        return keras.Model(inputs, keras.layers.Dense(2)(pooled))

    def build_inputs(self, training):
        sequences, labels = _sequences(256 if training else 64, 1 if training else 2)
        if self.source == "ragged":
            return tf.data.Dataset.from_tensor_slices(
                (tf.ragged.constant(sequences, dtype=tf.int32), labels)
            )

        def generate():
            yield from zip(sequences, labels)

        return tf.data.Dataset.from_generator(
            generate,
            output_signature=(tf.TensorSpec((None,), tf.int32), tf.TensorSpec((), tf.int32)),
        )

    def batching(self):
        from tfdist.data import batching  # pylint: disable=g-import-not-at-top

        if self.batching_mode == "longest":
            return batching.PadToLongest()
        if self.batching_mode == "declared":
            return batching.PadToShape(features=(16,))
        if self.batching_mode == "buckets":
            return batching.BucketByLength(boundaries=(5, 9))
        return None

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


# --- weighted metrics and class weights ---


class Weighted(Binary):
    """Declares `weighted_metrics` and `class_weight` (class 1 counts 3 times)."""

    def weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="weighted_accuracy")]

    def class_weight(self):
        return {0: 1.0, 1: 3.0}


# --- mistakes ---


class StringLabels(Binary):
    """Labels "yes"/"no" for a numeric loss."""

    def build_inputs(self, training):
        x, y = _arrays(self.num_examples, 1)
        return tf.data.Dataset.from_tensor_slices((x, np.where(y == 1, "yes", "no")))


class OneHotLabels(Binary):
    """One-hot labels with a sparse loss."""

    def build_inputs(self, training):
        x, y = _arrays(self.num_examples, 1)
        return tf.data.Dataset.from_tensor_slices((x, np.eye(2, dtype=np.float32)[y]))


class WrongWidth(Binary):
    """Features of width 4 for a model built for 6."""

    def build_inputs(self, training):
        x, y = _arrays(self.num_examples, 1, features=4)
        return tf.data.Dataset.from_tensor_slices((x, y))


class LossNone(Binary):
    """`loss()` returns None for a model that does not compute its own loss."""

    def loss(self):
        return None


class AlreadyBatched(Binary):
    """Returns its examples batched by 32 (`num_examples` before batching)."""

    def build_inputs(self, training):
        return super().build_inputs(training).batch(32)


class Compiled(Binary):
    """`build_model` returns a compiled model."""

    def build_model(self):
        model = super().build_model()
        model.compile(optimizer="adam", loss="mse")
        return model
