"""Makes Keras 3 `fit`, `evaluate` and `predict` work under MultiWorkerMirroredStrategy.

The one module of tfdist that touches private Keras internals. Upstream Keras
3 (through 3.15, keras-team/keras#20585) fails under MultiWorkerMirroredStrategy
in two reductions of `keras/src/backend/tensorflow/trainer.py`:

1. `TensorFlowTrainer._maybe_symbolic_build` averages the first distributed
   batch with `strategy.reduce("MEAN", batch)` to learn its shapes, which a
   multi-worker strategy cannot do eagerly ("Attempt to convert a value
   (PerReplica...)"). We build from the first local replica's batch instead:
   only its shapes and dtypes matter.
2. `reduce_per_replica(..., "mean")` reduces every step output with
   `strategy.reduce("MEAN", value, axis=0)`; for scalar metrics axis 0 does not
   exist ("Invalid reduction dimension 0"). We average across replicas only
   (`axis=None`), which is what the single-worker path computes.

3. With `steps_per_execution > 1`, `_make_function` runs the steps in a
   `tf.while_loop` whose `tf.cond` branches hold the collective step; the
   graph fails to run under a multi-worker strategy ("You must feed a value
   for placeholder tensor 'while/cond/Placeholder'"). We run the steps of one
   execution as calls of the compiled single step instead.

`apply()` installs the corrections once, only on Keras versions that need
them; each correction hands every call under any other strategy to the
original Keras code unchanged. Nothing happens at import time.
`tests/test_keras_compat.py` runs the unpatched path to show the upstream bug
still exists, so this module can be retired when it is fixed.
"""

import functools
import threading

import keras
from keras.src.backend.tensorflow import trainer as tf_trainer
import tensorflow as tf

# First Keras release assumed fixed; raise it while the upstream test still fails.
FIRST_FIXED_KERAS = (3, 16)
_lock = threading.Lock()
_originals: dict[str, object] = {}


def keras_version() -> tuple[int, int]:
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def needs_patch() -> bool:
    """Whether this Keras version has the multi-worker reduction bugs."""
    return (3, 0) <= keras_version() < FIRST_FIXED_KERAS


def is_applied() -> bool:
    return bool(_originals)


def _is_multi_worker(strategy) -> bool:
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())  # pylint: disable=protected-access


def _first_local_value(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    original = _originals["_maybe_symbolic_build"]
    strategy = self._distribute_strategy  # pylint: disable=protected-access
    if iterator is None or strategy is None or not _is_multi_worker(strategy):
        return original(self, iterator=iterator, data_batch=data_batch)
    for _, _, batches in iterator:
        data_batch = tf.nest.map_structure(_first_local_value, next(batches))
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access


def _make_function(self, step_function):
    original = _originals["_make_function"]
    strategy = self.distribute_strategy
    if self.steps_per_execution == 1 or not _is_multi_worker(strategy):
        return original(self, step_function)

    def one_step_on_data(data):
        outputs = strategy.run(step_function, args=(data,))
        return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    if not self.run_eagerly:
        one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True,
                                       jit_compile=self.jit_compile)

    def function(iterator):
        outputs = None
        for _ in range(self.steps_per_execution):
            next_batch = iterator.get_next_as_optional()
            if not next_batch.has_value():
                break
            outputs = one_step_on_data(next_batch.get_value())
        if outputs is None:
            raise StopIteration
        return outputs

    return function


def _reduce_per_replica(values, strategy, reduction):
    original = _originals["reduce_per_replica"]
    if reduction not in ("auto", "mean") or not _is_multi_worker(strategy):
        return original(values, strategy, reduction)
    return tf.nest.map_structure(lambda value: strategy.reduce("MEAN", value, axis=None),
                                 values)


CORRECTIONS = ("symbolic_build", "reduce_per_replica", "steps_per_execution")


def apply(corrections: tuple[str, ...] = CORRECTIONS) -> bool:
    """Installs the corrections if this Keras needs them. Idempotent.

    Args:
        corrections: Which corrections to install; tests install a subset to
            show each upstream failure on its own.

    Returns:
        Whether any correction is installed.
    """
    if not needs_patch():
        return False
    with _lock:
        if "symbolic_build" in corrections and "_maybe_symbolic_build" not in _originals:
            original = tf_trainer.TensorFlowTrainer._maybe_symbolic_build  # pylint: disable=protected-access
            _originals["_maybe_symbolic_build"] = original
            tf_trainer.TensorFlowTrainer._maybe_symbolic_build = functools.wraps(original)(  # pylint: disable=protected-access
                _maybe_symbolic_build)
        if "reduce_per_replica" in corrections and "reduce_per_replica" not in _originals:
            original = tf_trainer.reduce_per_replica
            _originals["reduce_per_replica"] = original
            tf_trainer.reduce_per_replica = functools.wraps(original)(_reduce_per_replica)
        if "steps_per_execution" in corrections and "_make_function" not in _originals:
            original = tf_trainer.TensorFlowTrainer._make_function  # pylint: disable=protected-access
            _originals["_make_function"] = original
            tf_trainer.TensorFlowTrainer._make_function = functools.wraps(original)(  # pylint: disable=protected-access
                _make_function)
    return bool(_originals)


def remove() -> None:
    """Restores the original Keras functions (for tests of the upstream bug)."""
    with _lock:
        if "_maybe_symbolic_build" in _originals:
            tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _originals.pop(  # pylint: disable=protected-access
                "_maybe_symbolic_build")
        if "reduce_per_replica" in _originals:
            tf_trainer.reduce_per_replica = _originals.pop("reduce_per_replica")
        if "_make_function" in _originals:
            tf_trainer.TensorFlowTrainer._make_function = _originals.pop("_make_function")  # pylint: disable=protected-access
