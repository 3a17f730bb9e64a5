"""tfdist's input layer: the task's examples or sources as deterministic, sharded streams.

- `tfdist.data.sources`: what a task may return instead of a dataset
  (`RandomAccessSource`, `ArraySource`, `FileSource`); see docs/data.md.
- `tfdist.data.inputs.TaskInput`: one split, whatever was returned, as `fit`'s
  training stream and the evaluation batches.
- `tfdist.data.streaming`: a task's own `tf.data.Dataset`, shuffled per pass.
- `tfdist.data.random_access`, `tfdist.data.files`: the sources' pipelines.
- `tfdist.data.arrays`: NumPy arrays given to `tfdist.resumable.fit` as
  `keras.Model.fit` takes them (batches, `validation_split`, a seeded
  permutation per epoch).
- `tfdist.data.worker_shares`: each parameter-server worker's own batches.
"""

from tfdist.data.inputs import TaskInput
from tfdist.data.shards import Shard, batches_per_pass
from tfdist.data.sources import (
    DECODED_SHUFFLE_BYTES,
    DEFAULT_SHUFFLE_BYTES,
    ArraySource,
    FileSource,
    RandomAccessSource,
    is_source,
)
from tfdist.data.streaming import (
    MAX_CACHED_BYTES,
    MAX_SHUFFLE_BUFFER,
    count_examples,
    evaluation_batches,
    per_replica_batch_size,
    shuffle_window,
    training_batches,
    with_shard_policy,
)

__all__ = [
    "ArraySource",
    "DECODED_SHUFFLE_BYTES",
    "DEFAULT_SHUFFLE_BYTES",
    "FileSource",
    "MAX_CACHED_BYTES",
    "MAX_SHUFFLE_BUFFER",
    "RandomAccessSource",
    "Shard",
    "TaskInput",
    "batches_per_pass",
    "count_examples",
    "evaluation_batches",
    "is_source",
    "per_replica_batch_size",
    "shuffle_window",
    "training_batches",
    "with_shard_policy",
]
