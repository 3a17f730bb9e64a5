"""XLA for each replica's forward and backward pass under a mirrored strategy.

Keras 3 compiles its whole step function with XLA when `jit_compile=True`.
Under MirroredStrategy that function holds every replica's step and the
gradient all-reduce, which XLA cannot place on several devices ("Trying to
access resource .../replica_1/... located in device CPU:1 from device CPU:0"),
and `jit_compile="auto"` is turned off under any strategy. Here each replica
runs its forward pass, loss and gradients as one XLA-compiled function on its
own device, statelessly (`keras.StatelessScope`): the function returns the
new values of the state the forward pass updates (batch-norm statistics,
seed-generator state) instead of assigning them. The gradient all-reduce, the
optimizer update, those assignments and the metric updates stay outside the
compiled function, as in Keras's own `train_step`.
"""

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.losses import loss as loss_module

from tfdist.errors import UsageError

_MIRRORED = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)


def applies(model) -> bool:
    """Whether `model` asked for XLA and runs under a mirrored strategy."""
    return (
        bool(model.jit_compile)
        and not model.run_eagerly
        and isinstance(model.distribute_strategy, _MIRRORED)
    )


def _batch_size(x):
    return tf.shape(next(value for value in tree.flatten(x) if value is not None))[0]


def _call(model, x, training):
    if model._call_has_training_arg:  # pylint: disable=protected-access
        return model(x, training=training)
    return model(x)


class _StatelessForward:
    """Runs `compute(x, y, sample_weight)` XLA-compiled without touching any variable.

    The compiled function reads the replica's trainable and non-trainable
    values as inputs and returns the new values of every variable the
    forward pass assigned (batch-norm statistics, seed-generator state,
    loss trackers); `__call__` assigns them outside the compiled function,
    where the strategy synchronizes them across replicas as in Keras's own
    step.
    """

    def __init__(self, model, compute):
        self._model = model
        self._compute = compute
        self._assigned: list = []  # the variables whose new values the function returns
        self._function = tf.function(self._stateless, jit_compile=True, reduce_retracing=True)

    def _stateless(self, trainable_values, non_trainable_values, x, y, sample_weight):
        model = self._model
        mapping = list(zip(model.trainable_variables, trainable_values)) + list(
            zip(model.non_trainable_variables, non_trainable_values)
        )
        with tf.GradientTape() as tape:
            tape.watch(trainable_values)
            with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                loss, scaled_loss, y_pred = self._compute(x, y, sample_weight)
        gradients = (
            tape.gradient(scaled_loss, trainable_values) if scaled_loss is not None else None
        )
        initial = {id(variable): value for variable, value in mapping}
        assigned = []
        for variable in [*model.non_trainable_variables, *model.metrics_variables]:
            value = scope.get_current_value(variable)
            if value is not None and value is not initial.get(id(variable)):
                assigned.append((variable, value))
        self._assigned = [variable for variable, _ in assigned]
        return loss, y_pred, gradients, [value for _, value in assigned]

    def __call__(self, x, y, sample_weight):
        model = self._model
        loss, y_pred, gradients, new_values = self._function(
            [variable.value for variable in model.trainable_variables],
            [variable.value for variable in model.non_trainable_variables],
            x,
            y,
            sample_weight,
        )
        for variable, value in zip(self._assigned, new_values):
            variable.assign(value)
        return loss, y_pred, gradients


def _make_train_step(model):
    def compute(x, y, sample_weight):
        y_pred = _call(model, x, training=True)
        loss = model._compute_loss(  # pylint: disable=protected-access
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        return loss, model.optimizer.scale_loss(loss), y_pred

    forward_backward = _StatelessForward(model, compute)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = forward_backward(x, y, sample_weight)
        model._loss_tracker.update_state(  # pylint: disable=protected-access
            loss_module.unscale_loss_for_distribution(loss), sample_weight=_batch_size(x)
        )
        model.optimizer.apply_gradients(zip(gradients, model.trainable_weights))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def _make_test_step(model):
    def compute(x, y, sample_weight):
        y_pred = _call(model, x, training=False)
        loss = model._compute_loss(  # pylint: disable=protected-access
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        return loss, None, y_pred

    forward = _StatelessForward(model, compute)

    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, _ = forward(x, y, sample_weight)
        model._loss_tracker.update_state(  # pylint: disable=protected-access
            loss_module.unscale_loss_for_distribution(loss), sample_weight=_batch_size(x)
        )
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
        f"with tf.function(jit_compile=True)"
    )
