"""LAMB: Adam with weight decay inside a layer-wise trust ratio, for Keras 3."""

import keras
from keras import ops

from tfdist.optimizers import _layerwise, choice, exclusions

__all__ = ["LAMB"]


@keras.saving.register_keras_serializable(package="tfdist")
class LAMB(_layerwise.LayerwiseExclusions, keras.optimizers.Optimizer):
    """Layer-wise Adaptive Moments for Batch training (You et al., 2019).

    With `t` the 1-based step, for each variable `w` with gradient `g`:

    ```
    m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
    m̂ = m / (1−β1^t),      v̂ = v / (1−β2^t)
    r = m̂ / (√v̂ + epsilon)
    r ← r + weight_decay_rate · w           (unless excluded from weight decay)
    ratio = ‖w‖ / ‖r‖                        (1 if excluded from layer adaptation
                                              or a norm is 0)
    w ← w − lr · ratio · r
    ```

    Unlike `keras.optimizers.Lamb`, weight decay is inside the trust ratio and
    variables can be excluded from either. Norms are computed in float32 when
    the variable is float16 or bfloat16.

    Args:
        learning_rate: A float, a `keras.optimizers.schedules.LearningRateSchedule`
            or a callable returning the learning rate.
        beta_1: Decay rate of the first moment, in [0, 1).
        beta_2: Decay rate of the second moment, in [0, 1).
        epsilon: Added to √v̂, >= 0.
        weight_decay_rate: Coefficient of `w` added to the update, >= 0.
        exclude_from_weight_decay: Regular expressions searched in variable
            paths (e.g. `"bias"`); matching variables get no weight decay.
        exclude_from_layer_adaptation: Same, for the trust ratio (matching
            variables use ratio 1, i.e. Adam). Independent of
            `exclude_from_weight_decay`.
        **kwargs: Keras optimizer arguments (`name`, `clipnorm`, `use_ema`,
            ...). Keras's decoupled `weight_decay` is refused: use
            `weight_decay_rate`.

    Raises:
        UsageError: An argument out of its range, Keras's `weight_decay`, or
            an exclusion that is not a regular expression.
    """

    def __init__(
        self,
        learning_rate,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay_rate=0.0,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        **kwargs,
    ):
        _layerwise.refuse_decoupled_weight_decay(kwargs, type(self).__name__)
        choice.check_arguments(
            "lamb",
            {
                "beta_1": beta_1,
                "beta_2": beta_2,
                "epsilon": epsilon,
                "weight_decay_rate": weight_decay_rate,
            },
        )
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.weight_decay_rate = float(weight_decay_rate)
        self._set_exclusions(exclude_from_weight_decay, exclude_from_layer_adaptation)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )
        self._decays, self._adapts = exclusions.layer_masks(
            var_list, self.weight_decay_rate, self._decay_exclusions, self._adaptation_exclusions
        )

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = _layerwise.update_dtype(variable.dtype)
        weights = ops.cast(variable, dtype)
        # Sparse (IndexedSlices) gradients are made dense: the norm spans the tensor.
        gradient = ops.cast(_layerwise.dense(gradient), dtype)
        step = ops.cast(self.iterations + 1, dtype)
        momentum_var = self._momentums[index]
        velocity_var = self._velocities[index]
        momentum = self.beta_1 * ops.cast(momentum_var, dtype) + (1.0 - self.beta_1) * gradient
        velocity = self.beta_2 * ops.cast(velocity_var, dtype) + (1.0 - self.beta_2) * ops.square(
            gradient
        )
        self.assign(momentum_var, momentum)
        self.assign(velocity_var, velocity)
        momentum_hat = momentum / (1.0 - ops.power(ops.cast(self.beta_1, dtype), step))
        velocity_hat = velocity / (1.0 - ops.power(ops.cast(self.beta_2, dtype), step))
        update = momentum_hat / (ops.sqrt(velocity_hat) + self.epsilon)
        if self._decays[index]:
            update = update + self.weight_decay_rate * weights
        scaled_lr = ops.cast(learning_rate, dtype)
        if self._adapts[index]:
            w_norm = _layerwise.norm(weights)
            r_norm = _layerwise.norm(update)
            # Where a norm is 0 the quotient may be nan or inf; `where` drops it.
            ratio = ops.where(ops.logical_and(w_norm > 0, r_norm > 0), w_norm / r_norm, 1.0)
            scaled_lr = scaled_lr * ratio
        self.assign_sub(variable, scaled_lr * update)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "weight_decay_rate": self.weight_decay_rate,
                "exclude_from_weight_decay": _layerwise.as_list(self._decay_exclusions),
                "exclude_from_layer_adaptation": _layerwise.as_list(self._adaptation_exclusions),
            }
        )
        return config
