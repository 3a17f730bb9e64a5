"""The task's examples as tfdist's deterministic streams, and the epoch they size.

`build_inputs` calls the task's `build_inputs` for both splits, checks them
against the contract, applies declared batching and class weights, shards
files per worker and counts the steps of an epoch; `Inputs` makes the
training, evaluation and validation streams from them.
"""

import dataclasses

import tensorflow as tf
from absl import logging

from tfdist import data as data_lib
from tfdist import tasks as tasks_lib
from tfdist.data import batching as batching_lib
from tfdist.data import counts as data_counts
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
    """

    train: data_lib.TaskInput
    evaluation: data_lib.TaskInput | None
    num_train_examples: int | None
    steps_per_epoch: int
    global_batch_size: int
    seed: int
    batching: object = None

    @property
    def eval_examples(self):
        return None if self.evaluation is None else self.evaluation.value

    @property
    def train_examples(self):
        return self.train.value

    def train_stream(self, first_step: int = 0, strategy: tf.distribute.Strategy | None = None):
        """Global batches from step `first_step` on, the same in every process.

        A source under a strategy with several replicas comes back distributed:
        each worker builds only its replicas' part of every global batch.
        """
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            return batching_lib.padded_training_batches(
                self.train.value,
                self.batching,
                global_batch_size=self.global_batch_size,
                seed=self.seed,
                num_examples=self.num_train_examples,
                first_step=first_step,
            )
        return self.train.training_stream(
            strategy,
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            first_step=first_step,
            num_examples=self.num_train_examples,
        )

    def eval_stream(self) -> tf.data.Dataset | None:
        if self.evaluation is None:
            return None
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            return batching_lib.padded_evaluation_batches(
                self.evaluation.examples(), self.batching, global_batch_size=self.global_batch_size
            )
        return self.evaluation.evaluation_stream(self.global_batch_size)


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
    train = weighting.with_class_weight(
        train, weighting.class_weight_of(loaded.task, loaded.spec), loaded.spec
    )
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
    if config.steps_per_execution != AUTO:
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
