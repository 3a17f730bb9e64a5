"""Small pieces shared by the layer-wise optimizers (LARS, LAMB)."""

import keras
import tensorflow as tf
from keras import ops

from tfdist.errors import UsageError
from tfdist.optimizers import exclusions


def refuse_decoupled_weight_decay(kwargs: dict, optimizer_name: str) -> None:
    """Rejects Keras's `weight_decay`, which would act outside the trust ratio."""
    weight_decay = kwargs.get("weight_decay")
    if weight_decay is not None:
        raise UsageError(
            f"{optimizer_name} got weight_decay={weight_decay!r}, Keras's decoupled "
            f"decay applied outside the trust ratio; pass weight_decay_rate instead"
        )


def update_dtype(dtype):
    """The dtype an update is computed in: float32 for float16/bfloat16 variables."""
    if keras.backend.standardize_dtype(dtype) in ("float16", "bfloat16"):
        return "float32"
    return dtype


def dense(gradient):
    """A sparse gradient (`tf.IndexedSlices`, e.g. from an Embedding) as a tensor."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def norm(tensor):
    """The L2 norm of a whole tensor."""
    return ops.sqrt(ops.sum(ops.square(tensor)))


def as_list(patterns):
    """Exclusion patterns as stored in a config: None or a list."""
    return None if patterns is None else list(patterns)


def refuse_keras_exclusions(optimizer_name: str) -> None:
    """Points callers of Keras's `exclude_from_weight_decay()` to our argument."""
    raise ValueError(
        f"{optimizer_name}.exclude_from_weight_decay() is Keras's hook for decoupled "
        f"decay, which {optimizer_name} does not use; pass "
        f"exclude_from_weight_decay=[patterns] to the constructor instead"
    )


class LayerwiseExclusions:
    """Mixin for LARS and LAMB: their two exclusion lists; Keras's decay hook refused."""

    def _set_exclusions(self, exclude_from_weight_decay, exclude_from_layer_adaptation):
        # Not `self.exclude_from_weight_decay`: that is a Keras optimizer method.
        self._decay_exclusions = exclusions.normalize_patterns(
            exclude_from_weight_decay, "exclude_from_weight_decay"
        )
        self._adaptation_exclusions = exclusions.normalize_patterns(
            exclude_from_layer_adaptation, "exclude_from_layer_adaptation"
        )

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Refused: Keras's hook for its decoupled decay, which this optimizer does not use."""
        del var_list, var_names
        refuse_keras_exclusions(type(self).__name__)
