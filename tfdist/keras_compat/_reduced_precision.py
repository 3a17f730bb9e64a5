"""Gradient all-reduce in a narrower dtype (bfloat16): half the bytes on the wire.

Keras 3's TensorFlow optimizer sums gradients across replicas in
`TFOptimizer._all_reduce_sum_gradients` (keras/src/backend/tensorflow/
optimizer.py) in the gradients' own dtype, and offers no option to send them
narrower (tf_keras had none either; Horovod has `compression=fp16`). Here one
optimizer object gets an instance attribute of that name that casts each dense
gradient to `dtype`, calls Keras's own method, and casts the sum back: the
all-reduce moves half the bytes, and each gradient sum is rounded to bfloat16
(8 significant bits) before the update. Nothing changes under a single
replica, for sparse (`IndexedSlices`) gradients, or for other optimizers.

Private Keras internals: gated to Keras 3 with the TensorFlow backend, where
`_all_reduce_sum_gradients` exists; `set_gradient_all_reduce_dtype` raises
`NotImplementedError` elsewhere rather than silently doing nothing.
"""

import keras
import tensorflow as tf

# The method of Keras's TensorFlow optimizer that all-reduces gradients.
_METHOD = "_all_reduce_sum_gradients"
_DTYPE_ATTRIBUTE = "_tfdist_all_reduce_dtype"
REDUCED_DTYPES = ("float32", "bfloat16", "float16")


def _supported(optimizer) -> bool:
    major = int(keras.__version__.split(".")[0])
    return (
        major == 3
        and keras.backend.backend() == "tensorflow"
        and callable(getattr(type(optimizer), _METHOD, None))
    )


def set_gradient_all_reduce_dtype(optimizer, dtype: str = "bfloat16"):
    """Makes `optimizer` all-reduce dense gradients in `dtype` (float32 restores Keras's way).

    Call before the train function is traced (before `fit`, or call
    `model.make_train_function(force=True)`). A `LossScaleOptimizer` is
    handled through its inner optimizer (the one that all-reduces).

    Args:
        optimizer: A Keras 3 optimizer (TensorFlow backend).
        dtype: "bfloat16" (or "float16") to send gradients narrower; "float32"
            removes the override.

    Returns:
        The optimizer whose reduction was changed.

    Raises:
        ValueError: `dtype` is not one of `REDUCED_DTYPES`.
        NotImplementedError: This Keras has no `_all_reduce_sum_gradients`.
    """
    if dtype not in REDUCED_DTYPES:
        raise ValueError(
            f"all-reduce dtype {dtype!r} is not supported, expected one of "
            f"{', '.join(REDUCED_DTYPES)}"
        )
    target = getattr(optimizer, "inner_optimizer", optimizer)
    if not _supported(target):
        raise NotImplementedError(
            f"reduced-precision all-reduce needs Keras 3 on TensorFlow with "
            f"{type(target).__name__}.{_METHOD}; this is Keras {keras.__version__} on "
            f"{keras.backend.backend()}"
        )
    target.__dict__.pop(_METHOD, None)
    target.__dict__.pop(_DTYPE_ATTRIBUTE, None)
    if dtype == "float32":
        return target
    keras_method = getattr(target, _METHOD)

    def all_reduce_narrow(grads_and_vars):
        pairs = list(grads_and_vars)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return keras_method(pairs)
        narrowed, original_dtypes = [], []
        for grad, variable in pairs:
            dense = isinstance(grad, tf.Tensor) and grad.dtype.is_floating
            original_dtypes.append(grad.dtype if dense else None)
            narrowed.append((tf.cast(grad, dtype) if dense else grad, variable))
        reduced = keras_method(narrowed)
        return [
            (tf.cast(grad, wanted) if wanted is not None and grad is not None else grad, variable)
            for (grad, variable), wanted in zip(reduced, original_dtypes)
        ]

    setattr(target, _METHOD, all_reduce_narrow)
    setattr(target, _DTYPE_ATTRIBUTE, dtype)
    return target


def gradient_all_reduce_dtype(optimizer) -> str:
    """ "bfloat16"/"float16" when `set_gradient_all_reduce_dtype` narrowed it, else "float32"."""
    target = getattr(optimizer, "inner_optimizer", optimizer)
    return target.__dict__.get(_DTYPE_ATTRIBUTE, "float32")
