"""Sharding a user's `tf.data` pipeline by record, right after its file reader, before decoding.

With fewer files than workers a pipeline cannot be sharded by file, and
TensorFlow's `DATA` policy makes every worker decode every example and keep
its part of each batch. When the pipeline is a chain of per-element
operations after one reader (`TextLineDataset(file).map(decode).batch(n)`, a
`list_files().interleave(reader)`), this inserts `shard(num_shards, index)`
between the reader and the rest: every worker still reads every record
(cheap), but decodes only its own. There is no public op for that; the
pipeline's graph (`Dataset._as_serialized_graph`) is edited and rebuilt with
`DatasetFromGraph`, the way TensorFlow's own auto-shard rewrite works. Any
other shape of pipeline (a `zip`, `take`, `skip`, `repeat`, a reader inside a
`map`, no reader) is left alone: `shard_by_record` returns None.

Python functions in the pipeline (`py_function`, `numpy_function`) are called
by a token that stays registered while the original dataset lives, so the
rebuilt dataset keeps a reference to it.
"""

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tfdist.keras_compat._file_sharding import READER_OPS, UNSHARDABLE, file_shard

# Operations that transform examples one by one (or group them) and so can
# come after the shard: each worker's part goes through them unchanged.
PER_ELEMENT_OPS = frozenset(
    {
        "MapDataset",
        "ParallelMapDataset",
        "ParallelMapDatasetV2",
        "FilterDataset",
        "BatchDataset",
        "BatchDatasetV2",
        "ParallelBatchDataset",
        "PaddedBatchDataset",
        "PaddedBatchDatasetV2",
        "DenseToSparseBatchDataset",
        "UnbatchDataset",
        "PrefetchDataset",
        "ShuffleDatasetV2",
        "ShuffleDatasetV3",
        "CacheDatasetV2",
        "OptionsDataset",
        "ModelDataset",
        "MaxIntraOpParallelismDataset",
        "PrivateThreadPoolDataset",
        "IgnoreErrorsDataset",
    }
)
_SHARD_NODE = "tfdist_record_shard"


class _Pipeline:
    """A dataset's graph: where its records come from, and what consumes them."""

    def __init__(self, dataset: tf.data.Dataset):
        self.dataset = dataset
        self.graph = graph_pb2.GraphDef()
        serialized = dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
        )
        self.graph.ParseFromString(serialized.numpy())
        self._nodes = {node.name: node for node in self.graph.node}
        self._functions = {f.signature.name: f for f in self.graph.library.function}

    def _function_reads(self, name: str, seen: frozenset = frozenset()) -> bool:
        function = self._functions.get(name)
        if function is None or name in seen:
            return False
        return any(self._node_reads(node, seen | {name}) for node in function.node_def)

    def _node_reads(self, node, seen: frozenset = frozenset()) -> bool:
        if node.op in READER_OPS:
            return True
        return any(
            value.HasField("func") and self._function_reads(value.func.name, seen)
            for value in node.attr.values()
        )

    def records(self, passing: frozenset = PER_ELEMENT_OPS):
        """`(consumer, reader)`: the node that reads records and its consumer, or None.

        None unless everything between the reader and the output is in
        `passing` (`PER_ELEMENT_OPS`).
        """
        outputs = [node for node in self.graph.node if node.op == "_Retval"]
        if len(outputs) != 1:
            return None
        consumer, node = outputs[0], self._nodes.get(outputs[0].input[0])
        while node is not None and not self._node_reads(node):
            if node.op not in passing:
                return None
            consumer, node = node, self._nodes.get(node.input[0])
        if node is None or "output_types" not in node.attr and node.op not in READER_OPS:
            return None
        return consumer, node

    def rebuilt(self, element_spec) -> tf.data.Dataset:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=self.graph.SerializeToString())
        rebuilt = tf.data.experimental.from_variant(variant, element_spec)
        rebuilt._tfdist_original = self.dataset  # pylint: disable=protected-access  (keeps py funcs registered)
        return rebuilt


def shards_itself(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline holds a `shard` of its own (in any of its functions too)."""
    try:
        pipeline = _Pipeline(dataset)
    except (tf.errors.OpError, ValueError, TypeError):
        return True  # unknown: assume the user knows
    graph = pipeline.graph
    ops = {node.op for node in graph.node}
    ops.update(node.op for function in graph.library.function for node in function.node_def)
    return "ShardDataset" in ops


def _add_constant(graph, name: str, value: int) -> None:
    node = graph.node.add()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = types_pb2.DT_INT64
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, tf.int64))


def _record_structure(node):
    """`(output_types, output_shapes)` attributes of the reader node's records."""
    if "output_types" in node.attr:
        return node.attr["output_types"], node.attr["output_shapes"]
    return None


def _pipeline_or_none(dataset: tf.data.Dataset, passing: frozenset = PER_ELEMENT_OPS):
    try:
        pipeline = _Pipeline(dataset)
    except (tf.errors.OpError, ValueError, TypeError):
        return None
    return pipeline if pipeline.records(passing) is not None else None


# Counting the files a pipeline reads looks at its reader only: a `repeat` after
# it (a finite dataset iterated as one stream, `tfdist.data.resume_input`) reads
# the same files.
_PROBE_PASSING = PER_ELEMENT_OPS | {"RepeatDataset"}


def shard_by_record(dataset: tf.data.Dataset, num_shards: int, index: int):
    """The pipeline with records `index, index + num_shards, ...` after its reader, or None.

    None when the pipeline does not have that shape (see the module docstring).
    """
    pipeline = _pipeline_or_none(dataset)
    if pipeline is None:
        return None
    consumer, reader = pipeline.records()
    graph = pipeline.graph
    _add_constant(graph, f"{_SHARD_NODE}/num_shards", num_shards)
    _add_constant(graph, f"{_SHARD_NODE}/index", index)
    shard = graph.node.add()
    shard.name, shard.op = _SHARD_NODE, "ShardDataset"
    shard.input.extend([reader.name, f"{_SHARD_NODE}/num_shards", f"{_SHARD_NODE}/index"])
    shard.attr["require_non_empty"].b = False
    structure = _record_structure(reader)
    if structure is None:  # a reader op itself: scalar strings
        shard.attr["output_types"].list.type.append(types_pb2.DT_STRING)
        shard.attr["output_shapes"].list.shape.add()
    else:
        shard.attr["output_types"].CopyFrom(structure[0])
        shard.attr["output_shapes"].CopyFrom(structure[1])
    consumer.input[0] = _SHARD_NODE
    try:
        return pipeline.rebuilt(dataset.element_spec)
    except (tf.errors.OpError, ValueError, TypeError):
        return None


def enough_files_to_shard(dataset: tf.data.Dataset, num_workers: int) -> bool:
    """Whether each of `num_workers` workers can read its own files of the pipeline.

    The one policy of every path that reads a user's dataset: the Keras path
    (`_epoch_sharding`) and the task path (`tfdist.data.TaskInput.sharded_by_file`,
    whose answer `tfdist.data.worker_shares` and the synchronous streams follow).
    True with at least 2 workers and a file reader of at least `num_workers`
    files, found by reading its file names and at most one record, decoding
    nothing (`reads_at_least`). What comes after the reader does not change
    the answer: a filter that leaves a worker's files without an example still
    gives that worker its files.
    """
    return num_workers >= 2 and reads_at_least(dataset, num_workers)


def reads_at_least(dataset: tf.data.Dataset, num_files: int) -> bool:
    """Whether the pipeline reads at least `num_files` files, decoding nothing to find out.

    When the pipeline has the shape `shard_by_record` handles, only its records
    are probed (one record of the last file shard); otherwise one example of
    the whole pipeline is read (`can_shard_by_file`).
    """
    from tfdist.keras_compat._file_sharding import (  # pylint: disable=g-import-not-at-top
        can_shard_by_file,
        reads_files,
    )

    pipeline = _pipeline_or_none(dataset, _PROBE_PASSING)
    if pipeline is None:
        return can_shard_by_file(dataset, num_files)
    _, reader = pipeline.records(_PROBE_PASSING)
    outputs = next(node for node in pipeline.graph.node if node.op == "_Retval")
    outputs.input[0] = reader.name
    structure = _record_structure(reader)
    if structure is None:
        spec = tf.TensorSpec([], tf.string)
    else:
        spec = tf.nest.pack_sequence_as(
            [0] * len(structure[0].list.type),
            [
                tf.TensorSpec(tf.TensorShape(shape), tf.dtypes.as_dtype(dtype))
                for dtype, shape in zip(structure[0].list.type, structure[1].list.shape)
            ],
        )
        if len(structure[0].list.type) == 1:
            spec = spec[0]
    try:
        records = pipeline.rebuilt(spec)
        if not reads_files(records):
            return False
        for _ in file_shard(records, num_files, num_files - 1).take(1):
            return True
    except UNSHARDABLE:
        return False
    return False
