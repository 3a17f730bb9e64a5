"""The task's examples as tfdist's deterministic streams, and the epoch they size.

`build_inputs` calls the task's `build_inputs` for both splits, checks them
against the contract, applies declared batching and class weights, shards
files per worker and counts the steps of an epoch; `Inputs` makes the
training, evaluation and validation streams from them, and each
parameter-server worker's own batches (`Inputs.worker_batches`).
`TrainingPosition` backs up the iterator position of a task's own dataset
with every backup and restores it on restart (`tfdist.data.resume_input`, the
mechanism of `tfdist.resumable.fit`).
"""

import dataclasses
from typing import Callable

import tensorflow as tf
from absl import logging

from tfdist import data as data_lib
from tfdist import keras_compat
from tfdist import tasks as tasks_lib
from tfdist.data import batching as batching_lib
from tfdist.data import counts as data_counts
from tfdist.data import streaming, worker_shares
from tfdist.data.resume_input import ResumableInput
from tfdist.data.shards import Shard
from tfdist.errors import UsageError
from tfdist.tasks import first_batch_check, weighting
from trainer.config import AUTO, ExperimentConfig, check_steps_per_execution
from trainer.tasks import LoadedTask


@dataclasses.dataclass(frozen=True)
class Inputs:
    """A task's examples or sources, and the streams tfdist makes of them.

    Attributes:
        train: The training split (`tfdist.data.TaskInput`).
        evaluation: The evaluation split, or None.
        num_train_examples: Examples in one training pass; None when not
            counted (`--steps_per_epoch` given and the size unknown without a pass).
        steps_per_epoch: Optimizer updates per epoch.
        global_batch_size: Examples per step across all replicas.
        seed: Fixes the order of every pass.
        batching: The task's declared padding or bucketing (`tfdist.data.batching`), or None.
        build_train: Builds the training split anew (the task's
            `build_inputs(True)` with its class weights), for a function that
            must build its own dataset: a parameter-server worker's. None:
            `train` is used as it is.
    """

    train: data_lib.TaskInput
    evaluation: data_lib.TaskInput | None
    num_train_examples: int | None
    steps_per_epoch: int
    global_batch_size: int
    seed: int
    batching: object = None
    build_train: Callable[[], data_lib.TaskInput] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    position: "TrainingPosition | None" = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def eval_examples(self):
        return None if self.evaluation is None else self.evaluation.value

    @property
    def train_examples(self):
        return self.train.value

    def train_stream(
        self,
        first_step: int = 0,
        strategy: tf.distribute.Strategy | None = None,
        *,
        end_step: int | None = None,
    ):
        """Global batches from step `first_step` on, the same in every process.

        `end_step` ends a dataset's stream before that step: nothing past it is
        read ahead (`tfdist.data.TaskInput.training_stream`).

        A source under a strategy with several replicas comes back distributed:
        each worker builds only its replicas' part of every global batch. With
        a `position` in use, the stream from step 0 whose iterator state the
        backups hold (restored at `first_step` already).
        """
        if self.position is not None:
            return self.position.next_stream(first_step)
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            padded = batching_lib.padded_training_batches(
                self.train.value,
                self.batching,
                global_batch_size=self.global_batch_size,
                seed=self.seed,
                num_examples=self.num_train_examples,
                first_step=first_step,
            )
            return padded if end_step is None else padded.take(max(0, end_step - first_step))
        return self.train.training_stream(
            strategy,
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            first_step=first_step,
            num_examples=self.num_train_examples,
            end_step=end_step,
        )

    def eval_stream(self) -> tf.data.Dataset | None:
        if self.evaluation is None:
            return None
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            return batching_lib.padded_evaluation_batches(
                self.evaluation.examples(), self.batching, global_batch_size=self.global_batch_size
            )
        return self.evaluation.evaluation_stream(self.global_batch_size)

    def worker_batches(self, num_workers: int) -> Callable[[int, int], tf.data.Dataset]:
        """`(worker, first_batch) -> dataset`: a worker's own batches from its batch `first_batch`.

        Worker `w` of a parameter-server job reads its part of every round of
        `num_workers` global batches (`tfdist.data.worker_shares`): the workers
        read distinct examples in an order fixed by the seed, and a worker
        started at the batch it had reached neither replays nor skips one.

        Raises:
            UsageError: Fewer examples than one global batch per worker, or a
                source read in Python (workers run graphs only).
        """
        size = self.num_train_examples
        if size is None:
            size = self.train.known_size()
        if size is None:  # reads at most one round of examples
            size = int(
                self.train.first_examples(self.global_batch_size * num_workers).reduce(
                    tf.constant(0, tf.int64), lambda count, _: count + 1
                )
            )
        worker_shares.rounds_per_pass(size, self.global_batch_size, num_workers)
        self.train.graph_examples()  # refuses a Python source before any step is scheduled
        shard_files = self.batching is None and self.train.file_shards == num_workers

        def make_batches(worker: int, first_batch: int) -> tf.data.Dataset:
            # Called inside the function each worker runs: a dataset made
            # eagerly on the chief cannot be captured by it (a source can).
            split = (
                self.train
                if self.train.is_source or self.build_train is None
                else self.build_train()
            )
            return worker_shares.worker_batches(
                split,
                worker=worker,
                num_workers=num_workers,
                global_batch_size=self.global_batch_size,
                seed=self.seed,
                first_batch=first_batch,
                num_examples=self.num_train_examples,
                batching=self.batching,
                shard_files=shard_files,
            )

        return make_batches

    def sample_batch(self) -> Callable[[], tf.data.Dataset] | None:
        """What a parameter-server coordinator builds the variables on: one batch, decoding it only.

        None with declared batching: the coordinator then takes worker 0's first batch.
        """
        if self.batching is not None:
            return None

        def sample() -> tf.data.Dataset:
            first = self.train.first_examples(self.global_batch_size)
            return first.batch(self.global_batch_size, drop_remainder=True)

        return sample


class TrainingPosition:
    """The iterator position of a task's own training dataset, in every backup.

    Every process trains on the stream from step 0 (`Inputs.train_stream(0)`,
    the same batches in every run) and its tf.data iterator state goes into
    each backup, inside the same atomic commit and checksums as the weights
    (`tfdist.data.resume_input.ResumableInput`: the files, log lines and
    warnings of `tfdist.resumable.fit`). A restart restores it: it decodes only
    what its remaining steps read, plus the buffers that state holds. A
    dataset sharded by file is each worker's own stream of its files
    (`TaskInput.file_shard_batches`), distributed as it is. Where it cannot be
    restored (no state in the backup, another number of workers,
    `from_generator`, a state above `--max_input_state_mb`) the run skips the
    batches already taken, as before, and its backups hold no position.

    Args:
        inputs: The run's inputs, their training split built anew.
        total_steps: The run's steps: the stream ends there, so that tf.data
            reads nothing ahead past the last step (a restart would decode it).
        strategy: The synchronous strategy `fit` runs under.
        max_state_mb: Largest state saved per worker (`--max_input_state_mb`).
    """

    def __init__(self, inputs: Inputs, *, total_steps: int, strategy, max_state_mb: int):
        self._inputs, self._strategy, self._total_steps = inputs, strategy, total_steps
        worker, self.workers = keras_compat.worker_of(strategy)
        if inputs.train.file_shards:
            # This worker's files only: its own stream, distributed as it is.
            shard = Shard(worker, self.workers, strategy.num_replicas_in_sync // self.workers)
            stream = inputs.train.file_shard_batches(
                shard,
                global_batch_size=inputs.global_batch_size,
                seed=inputs.seed,
                num_examples=inputs.num_train_examples,
                end_step=total_steps,
            )
        else:
            stream = inputs.train_stream(0, strategy, end_step=total_steps)
        self.input = ResumableInput(
            stream,
            steps_per_epoch=inputs.steps_per_epoch,
            strategy=strategy,
            endless=True,
            lost_seed_state=None if _caches_a_pass(inputs) else _WINDOW_READ,
            worker_part=bool(inputs.train.file_shards),
            max_state_bytes=max_state_mb << 20,
            bound_name="--max_input_state_mb",
        )
        self.in_use = True
        self._streams = 0

    def restore(self, backup) -> None:
        """Restores this worker's position from the backup `backup` resumed from, if any.

        Every worker decides alike from the backup's metadata. When the
        position cannot be restored, this run skips and `backup` saves no
        position (`in_use` is False).
        """
        point = backup.resume_point
        if point is None or not point.global_step:
            return
        self.in_use = self.input.restore_from(point.backup_path, point.metadata.get("input_state"))
        if not self.in_use:
            backup.input_state = None

    def next_stream(self, first_step: int):
        """The dataset of the next `fit` call: its iterator goes on where the last one's stopped.

        Not `in_use`: the stream of before, from `first_step` (its batches
        before it skipped), of the split built anew.
        """
        if not self.in_use:
            return self._inputs.train_stream(first_step, self._strategy, end_step=self._total_steps)
        if self._streams:
            self.input.carry_over()
        self._streams += 1
        return self.input.dataset_for(0)

    def capture(self):
        """The context `fit` must run in for its iterator to be saved and restored."""
        return self.input.capture()


# Why a backup of the trainer's stream can lack the seed state of the task's own
# reshuffling shuffle, and the fix.
_WINDOW_READ = (
    "saved once the trainer's shuffle window had read the rest of the pass from it, TF 2.21",
    "shuffle with reshuffle_each_iteration=False, or leave the shuffling to the trainer "
    "(--seed orders every pass).",
)


def _caches_a_pass(inputs: Inputs) -> bool:
    """Whether the trainer keeps the first pass in memory (`streaming.caches_first_pass`).

    Later passes then replay the first: a task's own reshuffling shuffle is
    drawn once, and no backup needs its seed state.
    """
    return inputs.batching is None and streaming.caches_first_pass(
        inputs.train.value, inputs.num_train_examples
    )


def training_position(
    inputs: Inputs,
    strategy: tf.distribute.Strategy,
    backup,
    *,
    epochs: int,
    max_state_mb: int,
) -> TrainingPosition | None:
    """The position of the task's own dataset, backed up by `backup` and restored from it.

    None (batches are skipped on restart, as before) without a backup, for a
    source (it resumes by arithmetic, decoding nothing), for tensors already in
    memory (`from_tensor_slices(arrays)` without a map: skipping them decodes
    nothing, and a backup need not hold the shuffle window), or when the
    stream is neither one dataset nor sharded by file among the workers (each
    worker's files are its own stream, `TaskInput.file_shard_batches`).
    """
    if backup is None or inputs.train.is_source or not keras_compat.input_state_supported():
        return None
    if keras_compat.pipeline_facts(inputs.train.value).in_memory:
        return None
    if inputs.build_train is not None:
        # A dataset of its own, iterated first by this stream in every process: the
        # seed generators of the task's own shuffles are where a fresh run's are, and a
        # pass the trainer caches holds the same examples in every run (the
        # checks and the count iterate the split built first).
        fresh = dataclasses.replace(inputs.build_train(), file_shards=inputs.train.file_shards)
        inputs = dataclasses.replace(inputs, train=fresh)
    workers = keras_compat.worker_of(strategy)[1]
    sharded = workers > 1 and inputs.train.file_shards == workers
    if not sharded and not isinstance(inputs.train_stream(0, strategy), tf.data.Dataset):
        return None
    position = TrainingPosition(
        inputs,
        total_steps=epochs * inputs.steps_per_epoch,
        strategy=strategy,
        max_state_mb=max_state_mb,
    )
    backup.input_state = position.input
    position.restore(backup)
    return position


def build_inputs(
    loaded: LoadedTask,
    config: ExperimentConfig,
    num_workers: int = 1,
    *,
    count_dir: str = "",
    is_chief: bool = True,
) -> Inputs:
    """Calls the task's `build_inputs` for both splits and sizes the epoch.

    The training data is counted only when `--steps_per_epoch` is not given and
    its size is unknown without a pass (a source's length is read; a file
    source's records are counted without decoding), and only once: the count
    is kept in `count_dir` (the backup directory) for restarts.

    Raises:
        UsageError: The task broke the contract, the data is smaller than one
            global batch, or `--steps_per_execution` does not divide the epoch.
    """
    train = data_lib.TaskInput(loaded.task.build_inputs(True))
    _check_split(train, loaded, training=True)
    evaluation_value = loaded.task.build_inputs(False)
    evaluation = None if evaluation_value is None else data_lib.TaskInput(evaluation_value)
    tasks_lib.check_examples(evaluation_value, loaded.spec, training=False)
    if evaluation is not None:
        _check_split(evaluation, loaded, training=False)
    # Declared padding/bucketing, class weights, already-batched data.
    batching = batching_lib.declared_batching(loaded.task, loaded.spec)
    if batching is not None and train.is_source:
        raise UsageError(
            f"--task {loaded.spec!r} declares batching() and returns a "
            f"{type(train.value).__name__}; declared padding applies to a tf.data.Dataset of "
            f"examples: return one, or pad in the source's preprocess to fixed shapes"
        )
    if not train.is_source:
        batching_lib.check_declared(train.value, batching, loaded.spec)
    class_weight = weighting.class_weight_of(loaded.task, loaded.spec)

    def weighted(split: data_lib.TaskInput) -> data_lib.TaskInput:
        return weighting.with_class_weight(split, class_weight, loaded.spec)

    train = weighted(train)
    if batching is None:
        train = train.sharded_by_file(num_workers)
    if config.steps_per_epoch:
        num_examples = train.known_size()
        if not train.is_source and num_examples is not None:
            first_batch_check.refuse_batched_if_too_few(
                train.value, num_examples, config.global_batch_size, loaded.spec
            )
        train.check_size(config.global_batch_size)
        steps_per_epoch = config.steps_per_epoch
    else:
        num_examples = data_counts.count_once(
            train, identity=loaded.identity, directory=count_dir, is_chief=is_chief
        )
        if not train.is_source:
            first_batch_check.refuse_batched_if_too_few(
                train.value, num_examples, config.global_batch_size, loaded.spec
            )
        steps_per_epoch = data_lib.batches_per_pass(num_examples, config.global_batch_size)
    if config.steps_per_execution != AUTO and not config.steps_per_epoch:
        # A given --steps_per_epoch was checked with the flags (`ExperimentConfig`).
        check_steps_per_execution(config.steps_per_execution, steps_per_epoch)
    logging.info("Input: %s.", train.describe(num_workers))
    return Inputs(
        train=train,
        evaluation=evaluation,
        num_train_examples=num_examples,
        steps_per_epoch=steps_per_epoch,
        global_batch_size=config.global_batch_size,
        seed=config.seed,
        batching=batching,
        build_train=lambda: weighted(data_lib.TaskInput(loaded.task.build_inputs(True))),
    )


def _check_split(split: data_lib.TaskInput, loaded: LoadedTask, *, training: bool) -> None:
    tasks_lib.check_examples(
        split.value,
        loaded.spec,
        training=training,
        element_spec=split.element_spec() if split.is_source else None,
    )


def validation_kwargs(config: ExperimentConfig, inputs: Inputs) -> dict:
    """`fit`'s validation arguments: `--validation_steps` batches of the evaluation split."""
    stream = inputs.eval_stream()
    if not config.validation_steps or stream is None:
        return {}
    return {"validation_data": stream, "validation_steps": config.validation_steps}
