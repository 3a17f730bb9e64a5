"""The position of the input iterator Keras `fit` builds, saved and restored.

Keras 3's `fit` builds its own iterator over the dataset it is given
(`TFEpochIterator`) and offers no way to save or restore it; upstream resumes
by replaying the data (`BackupAndRestore`, `dataset.skip(n)`: tf.data's skip
decodes what it skips). Under `MultiWorkerMirroredStrategy` that iterator is a
`DistributedIterator` over an `OwnedMultiDeviceIterator`, which has no
checkpoint support at all (shown by
`tests/multiprocess/test_resume_pipelines.py::test_upstream_distributed_iterator_cannot_be_saved`).

`TrainingInput.capture()` wraps `fit` calls: while it is active, the iterator
Keras builds over `TrainingInput.dataset` is recorded, with a single-device
worker iterator made a plain tf.data iterator (the same per-worker dataset,
after tfdist's sharding and TensorFlow's rebatching; only the device prefetch
goes), and a pending state is restored into each iterator Keras builds before
the first training step. `state()` is the tf.data iterator state
(`SerializeIterator`) as bytes. All of it touches TensorFlow 2.21 and Keras
3.x internals, so it is gated on them (`supported()`).
"""

import contextlib
import dataclasses
import logging

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer
from tensorflow.core.framework import graph_pb2
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.distribute import input_lib
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_dataset_ops

from tfdist.keras_compat import _patching

_log = logging.getLogger(__name__)
_IGNORE = tf.data.experimental.ExternalStatePolicy.IGNORE

# Ops whose state depends on Python (a generator's position, a py_function's
# objects): a tf.data iterator checkpoint cannot hold it.
PYTHON_STATE_OPS = frozenset({"GeneratorDataset", "PyFunc", "EagerPyFunc"})
# Dataset ops whose iterator state holds elements (a buffer), not a position,
# even under `experimental_symbolic_checkpoint` (TF 2.21).
BUFFERING_OPS = frozenset(
    {
        "ShuffleDataset",
        "ShuffleDatasetV2",
        "ShuffleDatasetV3",
        "ShuffleAndRepeatDataset",
        "ShuffleAndRepeatDatasetV2",
        "SlidingWindowDataset",
        "WindowDataset",
        "GroupByWindowDataset",
        "SnapshotDatasetV2",
        "CacheDatasetV2",
        "CacheDataset",
    }
)
_SHUFFLES = frozenset(name for name in BUFFERING_OPS if name.startswith("Shuffle"))
# Dataset ops that only arrange tensors already in memory: a pipeline of these
# alone (`from_tensor_slices(arrays).shuffle(n)`) decodes nothing, so reading
# it again costs no decoding.
IN_MEMORY_OPS = frozenset(
    {
        "TensorSliceDataset",
        "TensorDataset",
        "RangeDataset",
        "ShuffleDataset",
        "ShuffleDatasetV2",
        "ShuffleDatasetV3",
        "BatchDataset",
        "BatchDatasetV2",
        "PaddedBatchDataset",
        "PaddedBatchDatasetV2",
        "PrefetchDataset",
        "RepeatDataset",
        "TakeDataset",
        "SkipDataset",
        "OptionsDataset",
        "CacheDataset",
        "CacheDatasetV2",
        "ZipDataset",
        "ConcatenateDataset",
        "UnbatchDataset",
        "ShardDataset",
        "ModelDataset",
        "FinalizeDataset",
        "AssertCardinalityDataset",
    }
)

_active: list["TrainingInput"] = []


def supported() -> bool:
    """Whether this TensorFlow and Keras have the internals this module uses."""
    return (
        hasattr(tf_trainer, "TFEpochIterator")
        and hasattr(input_lib, "DistributedDataset")
        and hasattr(input_lib, "_SingleWorkerOwnedDatasetIterator")
        and hasattr(gen_dataset_ops, "serialize_iterator")
        and hasattr(iterator_ops, "OwnedIterator")
    )


@dataclasses.dataclass(frozen=True)
class PipelineFacts:
    """What the dataset's graph says about restoring its iterator.

    Attributes:
        python_state: Ops holding Python state (`from_generator`, `py_function`).
        buffers: Dataset ops whose saved state holds elements.
        unseeded_shuffles: Shuffle ops without a seed (op and global seed 0).
        reshuffles: Shuffle ops that reshuffle each pass (a seed generator).
        shuffle_seeds: Each shuffle op's `(seed, seed2)`, in graph order.
        partial_passes: A reshuffled pass that ends with a partial batch, as
            `(examples per pass, batch size)` per batch op after a reshuffle
            (see `reshuffled_partial_batches`).
        in_memory: Every dataset op only arranges tensors in memory
            (`IN_MEMORY_OPS`): no map, no file reader, no generator.
    """

    python_state: tuple[str, ...]
    buffers: tuple[str, ...]
    unseeded_shuffles: int
    reshuffles: int = 0
    shuffle_seeds: tuple[tuple[int, int], ...] = ()
    partial_passes: tuple[tuple[int, int], ...] = ()
    in_memory: bool = False


def pipeline_facts(dataset: tf.data.Dataset) -> PipelineFacts:
    """Reads the dataset's serialized graph (its functions included)."""
    data = dataset._as_serialized_graph(external_state_policy=_IGNORE)  # pylint: disable=protected-access
    graph = graph_pb2.GraphDef.FromString(data.numpy())
    nodes = list(graph.node)
    for function in graph.library.function:
        nodes.extend(function.node_def)
    ops = [node.op for node in nodes]
    by_name = {node.name: node for node in graph.node}
    unseeded, reshuffles, seeds_of = 0, 0, []
    for node in graph.node:
        if node.op in _SHUFFLES and len(node.input) >= 4:
            seeds = [by_name.get(name.split(":")[0]) for name in node.input[2:4]]
            values = [
                list(seed.attr["value"].tensor.int64_val) if seed is not None else [1]
                for seed in seeds
            ]
            if all(value in ([0], []) for value in values):
                unseeded += 1
            seeds_of.append(tuple(int(value[0]) if value else 0 for value in values))
            reshuffle = node.attr.get("reshuffle_each_iteration")
            if reshuffle is None or reshuffle.b:
                reshuffles += 1
    return PipelineFacts(
        python_state=tuple(sorted({op for op in ops if op in PYTHON_STATE_OPS})),
        buffers=tuple(op for op in ops if op in BUFFERING_OPS),
        unseeded_shuffles=unseeded,
        reshuffles=reshuffles,
        shuffle_seeds=tuple(seeds_of),
        partial_passes=reshuffled_partial_batches(dataset),
        in_memory=all(op in IN_MEMORY_OPS for op in ops if "Dataset" in op),
    )


# Batch ops that emit a pass's partial last batch after dropping their exhausted
# input iterator (measured on TF 2.21; `batch(num_parallel_calls=...)` keeps it,
# and so does the `MapAndBatchDataset` tf.data fuses a map and a batch into).
_DROPPING_BATCHES = frozenset({"_BatchDataset", "_PaddedBatchDataset"})
_MAPS = frozenset({"_MapDataset", "_ParallelMapDataset"})


def _fuses_map_and_batch(dataset: tf.data.Dataset) -> bool:
    optimization = dataset.options().experimental_optimization
    return (
        optimization.apply_default_optimizations is not False
        and optimization.map_and_batch_fusion is not False
    )


def _inputs(dataset) -> list:
    try:
        return list(dataset._inputs())  # pylint: disable=protected-access
    except (AttributeError, NotImplementedError, TypeError):
        return []


def _reshuffles_upstream(dataset) -> bool:
    pending, seen = [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__name__ == "_ShuffleDataset" and bool(
            getattr(current, "_reshuffle_each_iteration", True)
        ):
            return True
        pending.extend(_inputs(current))
    return False


def reshuffled_partial_batches(dataset: tf.data.Dataset) -> tuple[tuple[int, int], ...]:
    """`(examples per pass, batch size)` of each batch after a reshuffle whose passes end partial.

    A `batch` (or `padded_batch`) without `drop_remainder` drops its input's
    iterator when the input ends, then yields the partial batch. An iterator
    state saved there holds no state of the shuffle before it, so its seed
    generator's count is lost: restored, the next pass draws other seeds (TF
    2.21, `holds_shuffle_seed_state`). Only passes whose length tf.data knows
    are listed; for the others the saved state itself tells. A `batch` right
    after a `map` is left out: tf.data fuses the two (`map_and_batch_fusion`).
    """
    fused = _fuses_map_and_batch(dataset)
    found, pending, seen = [], [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        pending.extend(_inputs(current))
        if type(current).__name__ not in _DROPPING_BATCHES:
            continue
        drop = tf.get_static_value(getattr(current, "_drop_remainder", True))
        batch = tf.get_static_value(getattr(current, "_batch_size", 0))
        source = getattr(current, "_input_dataset", None)
        if drop or not batch or source is None or not _reshuffles_upstream(source):
            continue
        if fused and type(current).__name__ == "_BatchDataset" and type(source).__name__ in _MAPS:
            continue
        per_pass = int(source.cardinality())
        if per_pass >= 0 and per_pass % int(batch):
            found.append((per_pass, int(batch)))
    return tuple(found)


def holds_shuffle_seed_state(state: bytes, reshuffles: int) -> bool:
    """Whether an iterator state holds the seed-generator count of each of `reshuffles` shuffles.

    Each shuffle iterator in the state writes `epoch_num_random_samples`, the
    count its restore resets the seed generator to. A state saved after a
    batch dropped its exhausted input (a pass's partial last batch) has none:
    restored, the shuffle's next pass draws its seeds from a fresh generator
    that the restore itself already advanced, and differs.
    """
    return state.count(b"epoch_num_random_samples") >= reshuffles


def _local_iterator(iterator):
    """The tf.data iterator behind what Keras iterates, or None."""
    if isinstance(iterator, iterator_ops.OwnedIterator):
        return iterator
    workers = getattr(iterator, "_iterators", None)  # DistributedIterator
    if workers and len(workers) == 1:
        inner = getattr(workers[0], "_iterator", None)
        if isinstance(inner, iterator_ops.OwnedIterator):
            return inner
    return None


def _plain_worker_iterator(distributed) -> None:
    """Makes a one-device worker's distributed iterator a plain, savable tf.data iterator."""
    workers = distributed._input_workers  # pylint: disable=protected-access
    if workers.num_workers != 1 or len(workers.compute_devices_for_worker(0)) != 1:
        return
    distributed._options = tf.distribute.InputOptions(  # pylint: disable=protected-access
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )


def global_seed_is_set() -> bool:
    """Whether TensorFlow's global seed is set (read without drawing an op seed)."""
    return context.global_seed() is not None


def worker_of(strategy) -> tuple[int, int]:
    """(this worker's index, the number of workers) of a synchronous strategy."""
    extended = getattr(strategy, "extended", None)
    if (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and getattr(extended, "_in_multi_worker_mode", lambda: False)()
    ):  # pylint: disable=protected-access
        return int(extended._id_in_cluster), int(extended._num_workers)  # pylint: disable=protected-access
    return 0, 1


class _Recording:
    """What `TFEpochIterator._get_iterator` returns while an input is captured."""

    def __init__(self, training_input: "TrainingInput", source):
        self._input = training_input
        self._source = source

    def __iter__(self):
        distributed = (input_lib.DistributedDataset, input_lib.DistributedDatasetsFromFunction)
        if isinstance(self._source, distributed):
            _plain_worker_iterator(self._source)
        iterator = iter(self._source)
        self._input._built(iterator)  # pylint: disable=protected-access
        return iterator


def _reads(adapter_dataset, dataset) -> bool:
    """Whether Keras's adapter reads `dataset`: itself, or its `class_weight` map.

    With `fit(class_weight=...)` Keras's `TFDatasetAdapter` reads
    `dataset.map(class_weight_fn).prefetch(AUTOTUNE)`; the iterator over that
    is recorded, its state holding the position of `dataset` inside it.
    """
    if adapter_dataset is dataset:
        return True
    if type(adapter_dataset).__name__ != "_PrefetchDataset":
        return False
    mapped = getattr(adapter_dataset, "_input_dataset", None)
    return (
        type(mapped).__name__ == "_MapDataset"
        and getattr(mapped, "_input_dataset", None) is dataset
    )


def _get_iterator(self):
    original = _patching.original(tf_trainer.TFEpochIterator, "_get_iterator")
    source = original(self)
    for training_input in _active:
        if _reads(getattr(self.data_adapter, "_dataset", None), training_input.dataset):
            return _Recording(training_input, source)
    return source


class TrainingInput:
    """The training dataset of `fit` calls and the state of the iterator Keras reads it with.

    Args:
        dataset: The dataset passed to `fit` (itself: its identity is how the
            iterator is recognized).
    """

    def __init__(self, dataset: tf.data.Dataset):
        self.dataset = dataset
        self._iterator = None
        self._pending: bytes | None = None
        self._started = False

    @contextlib.contextmanager
    def capture(self):
        """Records the iterator Keras builds over `dataset` in the `fit` calls inside."""
        _patching.install(tf_trainer.TFEpochIterator, "_get_iterator", _get_iterator)
        _active.append(self)
        try:
            yield self
        finally:
            _active.remove(self)

    def restore_into_next(self, state: bytes) -> None:
        """Restores `state` into the iterators Keras builds until training starts."""
        self._pending = state
        self._started = False

    def training_started(self) -> None:
        """The first step ran: later iterators are Keras's own (a new epoch's)."""
        self._started = True
        self._pending = None

    def _built(self, iterator) -> None:
        local = _local_iterator(iterator)
        self._iterator = local
        if local is not None and self._pending is not None and not self._started:
            # pylint: disable-next=protected-access
            resource = local._iterator_resource
            gen_dataset_ops.deserialize_iterator(
                resource, tf.io.parse_tensor(self._pending, tf.variant)
            )

    @property
    def savable(self) -> bool:
        return self._iterator is not None

    def state(self) -> bytes:
        """The recorded iterator's state (its position, and buffers where ops hold them)."""
        if self._iterator is None:
            raise RuntimeError("no iterator recorded: call state() after a training step")
        variant = gen_dataset_ops.serialize_iterator(
            self._iterator._iterator_resource,  # pylint: disable=protected-access
            external_state_policy=_IGNORE.value,
        )
        return tf.io.serialize_tensor(variant).numpy()
