"""Corrections that make Keras 3 `fit`/`evaluate` run under MultiWorkerMirroredStrategy.

See the package docstring for the upstream failures these correct.
"""

import logging

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib

from tfdist.keras_compat import _epoch_sharding, _patching

_log = logging.getLogger(__name__)


def is_multi_worker(strategy) -> bool:
    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )  # pylint: disable=protected-access


def step_holds_collectives(strategy) -> bool:
    """Whether a step's all-reduce is collective ops (instance keys captured at call time).

    True under a multi-worker strategy, and under MirroredStrategy on several
    devices with its default cross-device ops on CPUs (`CollectiveAllReduce`).
    """
    if is_multi_worker(strategy):
        return True
    cross_device_ops = getattr(strategy.extended, "_cross_device_ops", None)
    return (
        isinstance(strategy, tf.distribute.MirroredStrategy)
        and strategy.num_replicas_in_sync > 1
        and isinstance(cross_device_ops, cross_device_ops_lib.CollectiveAllReduce)
    )


def _first_local_value(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _first_local_spec(spec):
    value_specs = getattr(spec, "_value_specs", None)  # PerReplicaSpec
    return value_specs[0] if value_specs else spec


def _local_spec(spec):
    """The first local replica's spec, or None when its rank is unknown."""
    spec = _first_local_spec(spec)
    if getattr(spec, "shape", None) is None or spec.shape.rank is None:
        return None
    return spec


def batch_from_element_spec(epoch_iterator):
    """The dataset's element spec as the batch to build from, or None when a rank is unknown.

    Keras's `_symbolic_build` turns each leaf into a `KerasTensor` of its shape
    and dtype; a `tf.TensorSpec` (or ragged or sparse spec) keeps its unknown
    dimensions unknown, as one process traces them, so the model meets no shape
    it would refuse. Reading a real batch instead would start the input
    pipeline on an iterator that Keras then discards (`EpochIterator.reset`):
    a shuffle window, files opened and decoded, all twice.
    """
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is None:
        return None
    specs = tf.nest.map_structure(_local_spec, dataset.element_spec)
    if any(leaf is None for leaf in tf.nest.flatten(specs)):
        return None
    return specs


def _holds_strings(element_spec) -> bool:
    return any(
        getattr(spec, "dtype", None) == tf.string
        for spec in tf.nest.flatten(element_spec, expand_composites=True)
    )


def _builds_from_first_replica(strategy, batches) -> bool:
    """Whether the first batch must not be averaged across replicas to learn its shapes.

    Multi-worker strategies cannot average eagerly (`symbolic_build`); no
    strategy can average strings (`string_symbolic_build`, tensorflow#80951:
    AddN has no string kernel).
    """
    if _patching.enabled("symbolic_build") and is_multi_worker(strategy):
        return True
    return (
        _patching.enabled("string_symbolic_build")
        and strategy.num_replicas_in_sync > 1
        and _holds_strings(getattr(batches, "element_spec", None))
    )


def _built_from(model, strategy, specs) -> bool:
    """Builds a built model's metrics, loss and optimizer from element specs.

    False (to build from a first batch instead) when its call cannot run on
    the spec's unknown dimensions.
    """
    try:
        with strategy.scope():
            model._symbolic_build(data_batch=specs)  # pylint: disable=protected-access
    except (ValueError, TypeError) as error:
        _log.info(
            "Building the model from a first batch: its element spec is not enough (%s).", error
        )
        return False
    return True


def maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Builds from the dataset's element spec (or the first local replica's batch).

    Under any strategy: no batch is read from an iterator Keras discards, and
    no batch is averaged across replicas (which fails on strings, tensorflow#80951,
    and eagerly under a multi-worker strategy, keras#20585).
    """
    original = _patching.original(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build")
    strategy = self._distribute_strategy  # pylint: disable=protected-access
    if iterator is None or strategy is None:
        return original(self, iterator=iterator, data_batch=data_batch)
    if _patching.enabled("symbolic_build"):
        dataset = getattr(iterator, "_distributed_dataset", None)
        strings = dataset is not None and _holds_strings(dataset.element_spec)
        data_batch = None
        if not strings or _patching.enabled("string_symbolic_build"):
            data_batch = batch_from_element_spec(iterator)
        # An unbuilt model (a `Sequential` without `Input`, a subclassed model)
        # would take the spec's unknown dimensions as its own input shape; it
        # builds from a first batch, as Keras does under any strategy.
        if data_batch is not None and self.built and _built_from(self, strategy, data_batch):
            return None
    for _, _, batches in iterator:
        if not _builds_from_first_replica(strategy, batches):
            break
        data_batch = tf.nest.map_structure(_first_local_value, next(batches))
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access
        return None
    return original(self, iterator=iterator, data_batch=data_batch)


def reduce_per_replica(values, strategy, reduction):
    """Averages step outputs across replicas only (`axis=None`), as one worker does."""
    original = _patching.original(tf_trainer, "reduce_per_replica")
    if reduction not in ("auto", "mean") or not is_multi_worker(strategy):
        return original(values, strategy, reduction)
    return tf.nest.map_structure(lambda value: strategy.reduce("MEAN", value, axis=None), values)


def make_fused_function(model, step_function, keras_function):
    """`steps_per_execution` steps in one graph execution when steps hold collectives.

    Keras's own loop calls its compiled single step inside a `tf.cond` in the
    `tf.while_loop` body. When the step's all-reduce is collective ops
    (`step_holds_collectives`), its collectives take their instance keys as call-time captures
    (`FuncGraph.capture_call_time_value`); a nested function called in a
    `tf.cond` branch registers that capture in the branch graph, which
    `cond_v2` never feeds ("You must feed a value for placeholder tensor
    'while/cond/Placeholder'"). A `tf.while_loop` body passes such captures
    on, so this loop calls the step directly in the body and checks for more
    data in the loop condition instead of a `tf.cond` around the step.

    Args:
        model: The Keras model.
        step_function: `model.train_step`, `model.test_step` or a replacement.
        keras_function: Keras's own function, used for inputs that are not
            TensorFlow iterators (`train_on_batch` passes a generator).

    Returns:
        `function(iterator) -> logs of the last step run`.
    """
    strategy = model.distribute_strategy
    steps = model.steps_per_execution

    def one_step_on_data(data):
        outputs = strategy.run(step_function, args=(data,))
        return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    one_step_on_data = model._autoconvert_optionals(  # pylint: disable=protected-access
        tf.function(one_step_on_data, reduce_retracing=True)
    )

    def multi_step_on_iterator(iterator):
        # The first batch is read like a single step: at the end of the data
        # it raises OutOfRangeError, which the epoch iterator turns into the
        # end of the epoch.
        outputs = one_step_on_data(iterator.get_next())

        def has_next_step(executed, outputs, next_inputs):
            del outputs
            return tf.logical_and(executed < steps, next_inputs.has_value())

        def next_step(executed, outputs, next_inputs):
            del outputs
            outputs = one_step_on_data(next_inputs.get_value())
            executed += 1
            # Read another batch only if it will be used in this execution.
            next_inputs = tf.cond(
                executed < steps, iterator.get_next_as_optional, lambda: next_inputs
            )
            return executed, outputs, next_inputs

        _, outputs, _ = tf.while_loop(
            has_next_step,
            next_step,
            loop_vars=(tf.constant(1), outputs, iterator.get_next_as_optional()),
        )
        return outputs

    fused = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return fused(iterator)
        return keras_function(iterator)

    function.fused_function = fused
    return function


def epoch_iterator_init(self, distribute_strategy=None, *args, **kwargs):
    """Keras's `TFEpochIterator.__init__`, sharding the dataset per worker first.

    Under a multi-worker strategy every split is read once per epoch across
    the workers whatever its number of files (`_epoch_sharding`); every other
    call is Keras's own.
    """
    original = _patching.original(tf_trainer.TFEpochIterator, "__init__")
    if not _patching.enabled("worker_sharding") or not is_multi_worker(distribute_strategy):
        return original(self, distribute_strategy, *args, **kwargs)
    super(tf_trainer.TFEpochIterator, self).__init__(*args, **kwargs)
    self._distribute_strategy = distribute_strategy  # pylint: disable=protected-access
    dataset = self.data_adapter.get_tf_dataset()
    if not isinstance(self.data_adapter, TFDatasetAdapter):
        # Arrays, generators, PyDatasets: no files, and their graph may hold the
        # arrays themselves; TensorFlow's AUTO policy falls back to DATA there.
        self._distributed_dataset = distribute_strategy.experimental_distribute_dataset(dataset)
        return None
    if not isinstance(dataset, tf.distribute.DistributedDataset):
        extended = distribute_strategy.extended
        dataset = distribute_strategy.experimental_distribute_dataset(
            _epoch_sharding.worker_dataset(
                dataset,
                role=_epoch_sharding.role_of(kwargs),
                num_workers=extended._num_workers,  # pylint: disable=protected-access
                worker_index=extended._id_in_cluster,  # pylint: disable=protected-access
            )
        )
    self._distributed_dataset = dataset  # pylint: disable=protected-access
    return None
