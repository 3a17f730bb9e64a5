"""One fused check that a set of variables holds only finite values."""

from typing import Sequence

import keras
import tensorflow as tf

__all__ = ["FiniteCheck"]


class FiniteCheck:
    """Checks many floating-point variables for NaN/Inf in one graph call.

    Args:
        named_variables: `(name, variable)` pairs; non-float variables (step
            counters, seed states) are skipped.
    """

    def __init__(self, named_variables: Sequence[tuple[str, object]]):
        floats = [
            (name, variable)
            for name, variable in named_variables
            if keras.backend.is_float_dtype(variable.dtype)
        ]
        self._names = [name for name, _ in floats]
        variables = [variable for _, variable in floats]

        def flags():
            return tf.stack(
                [
                    tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(variable)))
                    for variable in variables
                ]
            )

        self._flags = tf.function(flags, autograph=False) if variables else None

    def non_finite(self) -> list[str]:
        """Names of the variables holding a NaN or an infinity, in order."""
        if self._flags is None:
            return []
        flags = self._flags().numpy()
        if flags.all():
            return []
        return [name for name, finite in zip(self._names, flags) if not finite]
