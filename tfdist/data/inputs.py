"""One split of a task's input, whatever `build_inputs` returned, as tfdist's streams.

| `build_inputs` returned | each worker decodes per step | resume at step s | size |
|---|---|---|---|
| `RandomAccessSource`, `ArraySource` | its replicas' examples | index arithmetic | `len()` |
| `FileSource` | its replicas' examples | skips records, decodes none | counted on records, only without `--steps_per_epoch` |
| `tf.data.Dataset` | the whole global batch; its files only when it reads at least one file per worker | a restart restores each worker's iterator state saved in the backup (`tfdist.data.resume_input`); where it cannot, skips examples (they are decoded) | cardinality, else counted, only without `--steps_per_epoch` |
"""

import dataclasses
import logging

import tensorflow as tf

from tfdist.data import files as files_lib
from tfdist.data import random_access, streaming
from tfdist.data.shards import Shard
from tfdist.data.sources import RANDOM_ACCESS, ArraySource, FileSource, is_source

__all__ = ["TaskInput"]

_log = logging.getLogger(__name__)

DATASET, RANDOM, FILES = "dataset", "random_access", "files"


@dataclasses.dataclass(frozen=True)
class TaskInput:
    """A split's input: a `tf.data.Dataset` of examples or a `tfdist.data` source."""

    value: object
    file_shards: int = 0

    @property
    def kind(self) -> str:
        if isinstance(self.value, RANDOM_ACCESS):
            return RANDOM
        if isinstance(self.value, FileSource):
            return FILES
        return DATASET

    @property
    def is_source(self) -> bool:
        return is_source(self.value)

    def known_size(self) -> int | None:
        """The number of examples when it costs no pass over the data, else None."""
        if self.kind == RANDOM:
            return len(self.value)
        if self.kind == DATASET:
            cardinality = int(self.value.cardinality())
            return cardinality if cardinality >= 0 else None
        return None

    def count(self) -> int:
        """The number of examples: read without a pass where possible, else counted."""
        size = self.known_size()
        if size is not None:
            return size
        if self.kind == FILES:
            _log.info(
                "Counting the records of the training files (no decoding; give "
                "--steps_per_epoch to skip this)."
            )
            return files_lib.count_records(self.value)
        _log.info(
            "Counting the training examples: the task's dataset has no known size "
            "(give --steps_per_epoch, or return a tfdist.data source, to skip this)."
        )
        return streaming.count_examples(self.value)

    def examples(self) -> tf.data.Dataset:
        """One pass over the examples, in order, preprocessed."""
        if self.kind == RANDOM:
            return random_access.examples(self.value)
        if self.kind == FILES:
            return files_lib.examples(self.value)
        return self.value

    def graph_examples(self) -> tf.data.Dataset:
        """One pass, built from graph ops only (for workers that run no Python).

        Raises:
            UsageError: A Python random-access source (ArrayRecord, tfds, Grain).
        """
        from tfdist.errors import UsageError  # pylint: disable=g-import-not-at-top

        if isinstance(self.value, ArraySource):
            return random_access.in_memory_examples(self.value)
        if self.kind == RANDOM:
            raise UsageError(
                "the task returned a RandomAccessSource, whose records are read in Python, "
                "which parameter-server workers cannot run; use a synchronous strategy, an "
                "ArraySource or a FileSource"
            )
        return self.examples()

    def element_spec(self):
        return self.first_examples(1).element_spec

    def first_examples(self, count: int) -> tf.data.Dataset:
        """The first `count` examples, reading no more records than that."""
        if self.kind == RANDOM:
            return random_access.first_examples(self.value, count)
        return self.examples().take(count)

    def check_size(self, global_batch_size: int) -> None:
        """Refuses data smaller than one global batch, reading at most one batch.

        Raises:
            UsageError: Fewer examples than one global batch.
        """
        size = self.known_size()
        if size is None:
            size = int(
                self.first_examples(global_batch_size).reduce(
                    tf.constant(0, tf.int64), lambda count, _: count + 1
                )
            )
        streaming.batches_per_pass(size, global_batch_size)

    def sharded_by_file(self, num_pipelines: int) -> "TaskInput":
        """This input, its dataset sharded by file among `num_pipelines` when it reads enough files.

        A source is returned as it is (it shards itself). A task's own dataset is
        sharded when it has a file reader with at least `num_pipelines` files
        (`keras_compat.enough_files_to_shard`, the policy of the Keras path
        too: file names are read, no example is decoded); otherwise every
        worker keeps the whole pipeline.
        """
        from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

        if self.kind != DATASET or not keras_compat.enough_files_to_shard(
            self.value, num_pipelines
        ):
            return self
        return dataclasses.replace(self, file_shards=num_pipelines)

    def order_depends_on_workers(self) -> bool:
        """Whether the examples' order changes with the number of workers (file sharding).

        A task's own dataset that can be sharded by file among 2 workers can
        be read in another order under another number of workers.
        """
        from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

        if self.kind == FILES or self.file_shards:
            return True
        return self.kind == DATASET and keras_compat.enough_files_to_shard(self.value, 2)

    def describe(self, num_pipelines: int) -> str:
        """One line for the log: what each worker reads and decodes."""
        if self.kind == RANDOM:
            return (
                f"random-access source of {len(self.value)} examples: each worker reads "
                f"and decodes only its replicas' examples; resume is index arithmetic"
            )
        if self.kind == FILES:
            return files_lib.describe(self.value, num_pipelines)
        if self.file_shards:
            return (
                f"the task's tf.data.Dataset, sharded by file among {self.file_shards} "
                f"workers (each reads and decodes only its files; the order depends on the "
                f"number of workers)"
            )
        if num_pipelines > 1:
            return (
                "the task's tf.data.Dataset reads fewer files than workers (or no files): "
                "every worker builds the whole pipeline and keeps its part of each global "
                "batch (it decodes the whole batch); use more files or return a tfdist.data "
                "source so that each worker decodes only its own (docs/data.md)"
            )
        return "the task's tf.data.Dataset of examples"

    def replica_batches(
        self,
        *,
        global_batch_size: int,
        seed: int,
        first_step: int,
        shard: Shard,
        num_examples: int | None,
    ) -> tf.data.Dataset:
        """This shard's per-replica batches (a source's own pipeline)."""
        if self.kind == RANDOM:
            return random_access.replica_batches(
                self.value,
                global_batch_size=global_batch_size,
                seed=seed,
                first_step=first_step,
                shard=shard,
            )
        if self.kind == FILES:
            return files_lib.replica_batches(
                self.value,
                global_batch_size=global_batch_size,
                seed=seed,
                first_step=first_step,
                shard=shard,
            )
        raise TypeError("a tf.data.Dataset input is batched by streaming.training_batches")

    def training_stream(
        self,
        strategy: tf.distribute.Strategy | None,
        *,
        global_batch_size: int,
        seed: int,
        first_step: int = 0,
        num_examples: int | None = None,
        end_step: int | None = None,
    ):
        """What `fit` takes: global batches, or per-worker batches already distributed.

        A source under a strategy with several replicas is distributed with
        `distribute_datasets_from_function`, each worker building only its part.
        `end_step` ends a dataset's stream before that step, reading nothing
        past it (`streaming.training_batches`); a source's stream is endless.
        """
        if self.kind == DATASET and self.file_shards:
            return strategy.distribute_datasets_from_function(
                lambda context: self.file_shard_batches(
                    Shard.of(context),
                    global_batch_size=global_batch_size,
                    seed=seed,
                    first_step=first_step,
                    num_examples=num_examples,
                    end_step=end_step,
                )
            )
        if self.kind == DATASET:
            return streaming.training_batches(
                self.value,
                global_batch_size=global_batch_size,
                seed=seed,
                num_examples=num_examples,
                first_step=first_step,
                end_step=end_step,
            )
        options = dict(
            global_batch_size=global_batch_size,
            seed=seed,
            first_step=first_step,
            num_examples=num_examples,
        )
        if strategy is None or strategy.num_replicas_in_sync == 1:
            return self.replica_batches(shard=Shard(), **options)
        return strategy.distribute_datasets_from_function(
            lambda context: self.replica_batches(shard=Shard.of(context), **options)
        )

    def file_shard_batches(
        self,
        shard: Shard,
        *,
        global_batch_size: int,
        seed: int,
        first_step: int = 0,
        num_examples: int | None = None,
        end_step: int | None = None,
    ) -> tf.data.Dataset:
        """Input pipeline `shard`'s per-replica batches of a dataset sharded by file (`file_shards`).

        `num_examples`: of the whole pass, if counted (a small pass is then
        cached); `end_step`: the stream ends before that step.
        """
        return streaming.file_sharded_batches(
            self.value,
            shard=shard,
            global_batch_size=global_batch_size,
            seed=seed,
            first_step=first_step,
            num_examples=num_examples,
            end_step=end_step,
        )

    def evaluation_stream(self, global_batch_size: int) -> tf.data.Dataset:
        """One pass in global batches; under several workers each evaluates only its share.

        A random-access source tells `keras_compat` how to read one worker's
        share (`worker_shard`); a dataset or a file source is sharded by file,
        or by record after its reader (`keras_compat`'s evaluation policy).
        """
        batches = streaming.evaluation_batches(self.examples(), global_batch_size=global_batch_size)
        if self.kind == RANDOM:
            batches.worker_shard = lambda num_shards, index: streaming.evaluation_batches(
                random_access.examples(self.value, num_shards, index),
                global_batch_size=global_batch_size,
            )
        return batches
