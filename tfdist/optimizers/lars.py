"""LARS: SGD with momentum and a layer-wise trust ratio, for Keras 3."""

import keras
from keras import ops

from tfdist.optimizers import _layerwise, choice, exclusions

__all__ = ["LARS"]


@keras.saving.register_keras_serializable(package="tfdist")
class LARS(_layerwise.LayerwiseExclusions, keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al., 2017).

    For each variable `w` with (cross-replica aggregated) gradient `g`:

    ```
    g ← g + weight_decay_rate · w            (unless excluded from weight decay)
    trust = eeta · ‖w‖ / (‖g‖ + epsilon)     (1 if excluded from layer
                                              adaptation or a norm is 0)
    v ← momentum · v + lr · trust · g
    w ← w − (momentum · v + lr · trust · g)  if nesterov, else w ← w − v
    ```

    Weight decay sits inside the trust ratio (it is added to the gradient before
    the norms are taken). Norms are computed in float32 when the variable is
    float16 or bfloat16.

    Args:
        learning_rate: A float, a `keras.optimizers.schedules.LearningRateSchedule`
            or a callable returning the learning rate.
        momentum: Momentum in [0, 1). 0 keeps no velocity slot.
        weight_decay_rate: L2 coefficient added to the gradient, >= 0.
        eeta: The trust coefficient, >= 0.
        epsilon: Added to the gradient norm in the trust ratio's denominator, >= 0.
        nesterov: Whether to use Nesterov momentum.
        exclude_from_weight_decay: Regular expressions searched in variable
            paths (e.g. `"bias"`); matching variables get no weight decay.
        exclude_from_layer_adaptation: Same, for the trust ratio (matching
            variables use trust 1, i.e. plain SGD with momentum at the full
            learning rate). Independent of `exclude_from_weight_decay`.
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
        momentum=0.9,
        weight_decay_rate=0.0,
        eeta=0.001,
        epsilon=0.0,
        nesterov=False,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        **kwargs,
    ):
        _layerwise.refuse_decoupled_weight_decay(kwargs, type(self).__name__)
        choice.check_arguments(
            "lars",
            {
                "momentum": momentum,
                "weight_decay_rate": weight_decay_rate,
                "eeta": eeta,
                "epsilon": epsilon,
            },
        )
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = float(momentum)
        self.weight_decay_rate = float(weight_decay_rate)
        self.eeta = float(eeta)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self._set_exclusions(exclude_from_weight_decay, exclude_from_layer_adaptation)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._velocities = []
        if self.momentum:
            self._velocities = self.add_optimizer_variables(var_list, "velocity")
        self._decays, self._adapts = exclusions.layer_masks(
            var_list, self.weight_decay_rate, self._decay_exclusions, self._adaptation_exclusions
        )

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = _layerwise.update_dtype(variable.dtype)
        weights = ops.cast(variable, dtype)
        # Sparse (IndexedSlices) gradients are made dense: the norm spans the tensor.
        gradient = ops.cast(_layerwise.dense(gradient), dtype)
        if self._decays[index]:
            gradient = gradient + self.weight_decay_rate * weights
        scaled_lr = ops.cast(learning_rate, dtype)
        if self._adapts[index]:
            w_norm = _layerwise.norm(weights)
            g_norm = _layerwise.norm(gradient)
            # Where a norm is 0 the quotient may be nan or inf; `where` drops it.
            trust = ops.where(
                ops.logical_and(w_norm > 0, g_norm > 0),
                self.eeta * w_norm / (g_norm + self.epsilon),
                1.0,
            )
            scaled_lr = scaled_lr * trust
        step = scaled_lr * gradient
        if not self.momentum:
            self.assign_sub(variable, step)
            return
        velocity_var = self._velocities[index]
        velocity = self.momentum * ops.cast(velocity_var, dtype) + step
        self.assign(velocity_var, velocity)
        if self.nesterov:
            self.assign_sub(variable, self.momentum * velocity + step)
        else:
            self.assign_sub(variable, velocity)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay_rate": self.weight_decay_rate,
                "eeta": self.eeta,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "exclude_from_weight_decay": _layerwise.as_list(self._decay_exclusions),
                "exclude_from_layer_adaptation": _layerwise.as_list(self._adaptation_exclusions),
            }
        )
        return config
