"""XLA for each replica's forward and backward pass under a mirrored strategy.

Keras 3 compiles its whole step function with XLA when `jit_compile=True`.
Under MirroredStrategy that function holds every replica's step and the
gradient all-reduce, which XLA cannot place on several devices ("Trying to
access resource .../replica_1/... located in device CPU:1 from device CPU:0"),
and `jit_compile="auto"` is turned off under any strategy. Here each replica
runs its forward pass, loss and gradients as one XLA-compiled function on its
own device; the gradient all-reduce, the optimizer update and the metric
updates stay outside the compiled function, as in Keras's own `train_step`.
"""

import keras
from keras.src import tree
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.losses import loss as loss_module
import tensorflow as tf

from tfdist.errors import UsageError

_MIRRORED = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)


def applies(model) -> bool:
    """Whether `model` asked for XLA and runs under a mirrored strategy."""
    return (bool(model.jit_compile) and not model.run_eagerly
            and isinstance(model.distribute_strategy, _MIRRORED))


def _batch_size(x):
    return tf.shape(next(value for value in tree.flatten(x) if value is not None))[0]


def _call(model, x, training):
    if model._call_has_training_arg:  # pylint: disable=protected-access
        return model(x, training=training)
    return model(x)


def _make_train_step(model):
    @tf.function(jit_compile=True, reduce_retracing=True)
    def forward_backward(x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred = _call(model, x, training=True)
            loss = model._compute_loss(  # pylint: disable=protected-access
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled_loss = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_weights)
        return loss, y_pred, gradients

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = forward_backward(x, y, sample_weight)
        model._loss_tracker.update_state(  # pylint: disable=protected-access
            loss_module.unscale_loss_for_distribution(loss), sample_weight=_batch_size(x))
        model.optimizer.apply_gradients(zip(gradients, model.trainable_weights))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def _make_test_step(model):
    @tf.function(jit_compile=True, reduce_retracing=True)
    def forward(x, y, sample_weight):
        y_pred = _call(model, x, training=False)
        loss = model._compute_loss(  # pylint: disable=protected-access
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        return loss, y_pred

    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred = forward(x, y, sample_weight)
        model._loss_tracker.update_state(  # pylint: disable=protected-access
            loss_module.unscale_loss_for_distribution(loss), sample_weight=_batch_size(x))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return test_step


def replica_step(model, step_function):
    """The replica-compiled replacement of Keras's own `train_step` or `test_step`.

    Raises:
        UsageError: The model overrides the step, which cannot be split into a
            compiled part and the all-reduce.
    """
    function = getattr(step_function, "__func__", None)
    if function is tf_trainer.TensorFlowTrainer.train_step:
        if not model.trainable_weights:
            return step_function
        return _make_train_step(model)
    if function is tf_trainer.TensorFlowTrainer.test_step:
        return _make_test_step(model)
    name = getattr(step_function, "__name__", repr(step_function))
    raise UsageError(
        f"model {model.name!r} was compiled with jit_compile=True under "
        f"{type(model.distribute_strategy).__name__}, but {type(model).__name__} overrides "
        f"{name}: tfdist compiles only Keras's own train_step/test_step per replica (XLA "
        f"cannot compile a step that holds the cross-replica all-reduce); compile with "
        f"jit_compile=False, or XLA-compile the per-replica part of your {name} yourself "
        f"with tf.function(jit_compile=True)")
