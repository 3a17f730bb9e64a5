"""`--strategy=parameter_server`: the chief's coordinator loop over the same pipeline.

Workers and ps tasks serve (`tfdist.parameter_server.serve`); the chief builds
the task's inputs and model with `trainer.run.pipeline.prepare` and drives the steps
with `tfdist.parameter_server.ParameterServerTrainer`.
"""

import time
from typing import Mapping

import tensorflow as tf
from absl import logging

from tfdist import data as data_lib
from tfdist import parameter_server
from tfdist.data import worker_shares
from tfdist.distribute.cluster import WORKER, Cluster
from tfdist.tasks import custom_steps, weighting
from trainer.config import ExperimentConfig
from trainer.run import pipeline
from trainer.run.directories import OutputDirs
from trainer.run.inputs import Inputs, validation_kwargs
from trainer.run.outputs import Outcome, epoch_logs
from trainer.run.restarts import already_completed
from trainer.run.throughput import ThroughputMeter
from trainer.tasks import LoadedTask


def _worker_batches(loaded: LoadedTask, inputs: Inputs, num_workers: int):
    """`(worker, first_batch) -> dataset`: worker `worker`'s own batches from its batch `first_batch`.

    Worker `w` reads its part of every round of `num_workers` global batches
    (`tfdist.data.worker_shares`): the workers read distinct examples in an
    order fixed by the seed, and a worker started at the batch it had reached
    neither replays nor skips one.

    Raises:
        UsageError: Fewer examples than one global batch per worker, or a
            source read in Python (workers run graphs only).
    """
    size = inputs.num_train_examples
    if size is None:
        size = inputs.train.known_size()
    if size is None:  # reads at most one round of examples
        size = int(
            inputs.train.first_examples(inputs.global_batch_size * num_workers).reduce(
                tf.constant(0, tf.int64), lambda count, _: count + 1
            )
        )
    worker_shares.rounds_per_pass(size, inputs.global_batch_size, num_workers)
    inputs.train.graph_examples()  # refuses a Python source before any step is scheduled
    shard_files = inputs.batching is None and inputs.train.file_shards == num_workers

    def make_batches(worker: int, first_batch: int):
        # Built here, inside the function each worker runs: a dataset made
        # eagerly on the chief cannot be captured by it.
        split = (
            inputs.train
            if inputs.train.is_source
            else weighting.with_class_weight(  # the task's class weights, if any
                data_lib.TaskInput(loaded.task.build_inputs(True)),
                weighting.class_weight_of(loaded.task),
            )
        )
        return worker_shares.worker_batches(
            split,
            worker=worker,
            num_workers=num_workers,
            global_batch_size=inputs.global_batch_size,
            seed=inputs.seed,
            first_batch=first_batch,
            num_examples=inputs.num_train_examples,
            batching=inputs.batching,
            shard_files=shard_files,
        )

    return make_batches


def _worker_dataset_fn(loaded: LoadedTask, inputs: Inputs, num_workers: int, first_batches):
    """The dataset function of `fit`: on worker `w`, its batches from `first_batches[w]`."""

    def sample():
        # What the coordinator builds the variables on: one batch, decoding only it.
        first = inputs.train.first_examples(inputs.global_batch_size)
        return first.batch(inputs.global_batch_size, drop_remainder=True)

    return parameter_server.per_worker_dataset_fn(
        _worker_batches(loaded, inputs, num_workers),
        first_batches,
        sample=None if inputs.batching else sample,
    )


def train(
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    loaded: LoadedTask,
    *,
    strategy: tf.distribute.Strategy,
    environ: Mapping[str, str],
) -> dict:
    """Coordinates training from the chief and returns the summary."""
    num_workers = cluster.count(WORKER)
    positions = parameter_server.WorkerPositions(strategy, num_workers)
    run = pipeline.prepare(
        config,
        cluster,
        dirs,
        loaded,
        strategy,
        "parameter_server",
        environ,
        extra_state={"worker_positions": positions.variable},
    )
    num_replicas = int(strategy.num_replicas_in_sync)
    if run.todo.completed:
        return already_completed(run.backup, dirs, "parameter_server", num_replicas)

    model, inputs = run.model, run.inputs
    trainer = parameter_server.ParameterServerTrainer(model, positions=positions)
    # Callbacks run at sync points only: throughput comes from the trainer.
    callbacks = [c for c in run.callbacks if not isinstance(c, ThroughputMeter)]
    cannot_evaluate = custom_steps.evaluation_skip_reason(model)
    if cannot_evaluate:
        logging.info("Skipping evaluation: %s.", cannot_evaluate)
    validation = {} if cannot_evaluate else validation_kwargs(config, inputs)
    started = time.perf_counter()
    history = None
    for segment in run.todo.segments:
        first_batches = positions.read()
        if any(first_batches):
            logging.info(
                "Parameter-server workers resume their own streams at batches %s (of %d "
                "consumed before).",
                first_batches,
                sum(first_batches),
            )
        history = trainer.fit(
            _worker_dataset_fn(loaded, inputs, num_workers, first_batches),
            epochs=segment.epochs,
            initial_epoch=segment.initial_epoch,
            steps_per_epoch=segment.steps_per_epoch,
            steps_per_sync=config.backup_every_steps or None,
            callbacks=callbacks,
            verbose=2,
            **validation,
        )
    wall_seconds = time.perf_counter() - started
    train_logs = epoch_logs(history, run.backup)
    eval_stream = None if cannot_evaluate else inputs.eval_stream()
    evaluation = trainer.evaluate_on_coordinator(eval_stream) if eval_stream is not None else {}
    return pipeline.conclude(
        config,
        cluster,
        dirs,
        run,
        Outcome(
            strategy="parameter_server",
            num_replicas=num_replicas,
            num_workers=num_workers,
            num_ps=cluster.num_ps,
            steps_per_epoch=inputs.steps_per_epoch,
            steps_completed=int(model.optimizer.iterations.numpy()),
            train_logs=train_logs,
            evaluation=evaluation,
            examples_per_second=trainer.steps_per_second * config.global_batch_size,
            wall_seconds=wall_seconds,
            resumed_from_step=run.todo.resumed_from_step,
        ),
        environ=environ,
    )
