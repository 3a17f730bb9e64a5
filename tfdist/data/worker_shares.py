"""Each worker's own stream of whole batches, for workers that take whole steps (parameter servers).

Under `ParameterServerStrategy` every step is one worker's batch of the
global batch size `G`. With `N` workers, worker `w`'s `k`-th batch is its part
of *round* `k`: the `k`-th batch of `N * G` examples of tfdist's seeded
stream, whose part `w` (a `Shard(w, N)`) is exactly `G` examples. So:

- the workers read distinct examples: within a pass, every example belongs
  to one worker's part of one round;
- the order is fixed by the seed: worker `w`'s batch `k` is the same in
  every run and restart;
- a worker that starts at batch `k` (a resume) starts there by the same
  arithmetic a synchronous resume uses: sources skip indices or records and
  decode none of them; a task's own dataset skips examples, which it decodes.

What each worker decodes, by what the task returned:

| the split | worker `w` decodes per step | before its first step |
|---|---|---|
| `FileSource`, `ArraySource` | its `G` examples | its first batch + prefetch |
| a `tf.data.Dataset` reading >= `N` files | its `G` examples (its files only) | its shuffle window (<= 16 MiB of examples) |
| a `tf.data.Dataset` reading fewer files | the whole round (`N * G`) | the shuffle window |
"""

import tensorflow as tf

from tfdist.data import files as files_lib
from tfdist.data import random_access, streaming
from tfdist.data.inputs import DATASET, FILES, RANDOM, TaskInput
from tfdist.data.shards import Shard
from tfdist.data.sources import ArraySource
from tfdist.errors import UsageError

__all__ = ["rounds_per_pass", "worker_batches"]


def rounds_per_pass(num_examples: int, global_batch_size: int, num_workers: int) -> int:
    """Rounds (one batch per worker) in one pass over `num_examples` examples.

    Raises:
        UsageError: Fewer examples than one round of `num_workers` global batches.
    """
    round_size = global_batch_size * num_workers
    if num_examples < round_size:
        raise UsageError(
            f"the training data has {num_examples} examples, fewer than one global batch "
            f"({global_batch_size}) for each of the {num_workers} parameter-server workers "
            f"({round_size}); lower --global_batch_size, use fewer workers or provide more "
            f"examples"
        )
    return num_examples // round_size


def worker_batches(
    split: TaskInput,
    *,
    worker: int,
    num_workers: int,
    global_batch_size: int,
    seed: int,
    first_batch: int = 0,
    num_examples: int | None = None,
    batching=None,
    shard_files: bool = False,
) -> tf.data.Dataset:
    """Worker `worker`'s endless stream of batches of `global_batch_size`, from its batch `first_batch`.

    Args:
        split: The training split. A task's own dataset must be built where
            the stream runs (inside the worker's dataset function).
        worker: This worker's index (0 .. `num_workers` - 1).
        num_workers: Workers that take steps.
        global_batch_size: Examples per step (one worker's batch).
        seed: Fixes the order of every pass.
        first_batch: Batches this worker had consumed before (a resume).
        num_examples: Examples in one pass of a task's own dataset, or None
            when not counted.
        batching: The task's declared padding or bucketing, or None.
        shard_files: A task's own dataset has enough files for `num_workers`
            workers by `keras_compat.enough_files_to_shard`, the policy the
            Keras path follows too (`TaskInput.sharded_by_file` records its
            answer as `file_shards`): each worker reads only its share of them.

    Raises:
        UsageError: A Python random-access source (workers run graphs only).
    """
    shard = Shard(index=worker, count=num_workers, local_replicas=1)
    round_size = global_batch_size * num_workers
    if split.kind == RANDOM and not isinstance(split.value, ArraySource):
        split.graph_examples()  # refuses a Python source with the one-line reason
    if split.kind in (RANDOM, FILES):
        reader = random_access if split.kind == RANDOM else files_lib
        options = {"in_graph": True} if split.kind == RANDOM else {}
        return reader.replica_batches(
            split.value,
            global_batch_size=round_size,
            seed=seed,
            first_step=first_batch,
            shard=shard,
            **options,
        )
    assert split.kind == DATASET
    if shard_files and batching is None:
        return streaming.file_sharded_batches(
            split.value,
            shard=shard,
            global_batch_size=round_size,
            seed=seed,
            first_step=first_batch,
        )
    if batching is not None:
        from tfdist.data import batching as batching_lib  # pylint: disable=g-import-not-at-top

        rounds = batching_lib.padded_training_batches(
            split.value,
            batching,
            global_batch_size=round_size,
            seed=seed,
            num_examples=num_examples,
            first_step=first_batch,
        )
    else:
        rounds = streaming.training_batches(
            split.value,
            global_batch_size=round_size,
            seed=seed,
            num_examples=num_examples,
            first_step=first_batch,
        )
    start = worker * global_batch_size
    return rounds.map(
        lambda *batch: tf.nest.map_structure(
            lambda part: part[start : start + global_batch_size],
            batch if len(batch) > 1 else batch[0],
        )
    )
