"""`--strategy=parameter_server`: the chief's coordinator loop over the same pipeline.

Workers and ps tasks serve (`tfdist.parameter_server.serve`); the chief builds
the task's inputs and model with `trainer.run.pipeline.prepare` and drives the steps
with `tfdist.parameter_server.ParameterServerTrainer`.
"""

import functools
import time
from typing import Mapping

import tensorflow as tf
from absl import logging

from tfdist import data as data_lib
from tfdist import parameter_server
from tfdist.data import batching as batching_lib
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


def _worker_dataset_fn(loaded: LoadedTask, inputs: Inputs):
    """Each worker's copy of the training stream, starting at its own batch.

    Under ParameterServerStrategy every worker runs the same input graph and
    cannot learn its index from it; the same stream would give every worker
    the same batches at the same time. The offset comes from the clock of the
    worker that builds its copy, so copies start at different batches.
    Workers run graphs only: a source read in Python is refused
    (`TaskInput.graph_examples`).
    """
    per_pass = (
        data_lib.batches_per_pass(inputs.num_train_examples, inputs.global_batch_size)
        if inputs.num_train_examples is not None
        else inputs.steps_per_epoch
    )
    inputs.train.graph_examples()  # refuses a Python source before any step is scheduled

    def dataset_fn(input_context):
        # Built here, inside the function each worker runs: a dataset made
        # eagerly on the chief cannot be captured by it.
        del input_context  # Parameter-server input contexts do not tell workers apart.
        split = weighting.with_class_weight(  # the task's class weights, if any
            data_lib.TaskInput(loaded.task.build_inputs(True)),
            weighting.class_weight_of(loaded.task),
        )
        examples = split.graph_examples()
        make_batches = (
            data_lib.training_batches
            if inputs.batching is None
            else functools.partial(batching_lib.training_batches, batching=inputs.batching)
        )
        stream = make_batches(
            examples,
            global_batch_size=inputs.global_batch_size,
            seed=inputs.seed,
            num_examples=inputs.num_train_examples,
        )
        offset = tf.cast(tf.timestamp() * 1e6, tf.int64) % per_pass
        return stream.skip(offset)

    return dataset_fn


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
    run = pipeline.prepare(config, cluster, dirs, loaded, strategy, "parameter_server", environ)
    num_replicas = int(strategy.num_replicas_in_sync)
    if run.todo.completed:
        return already_completed(run.backup, dirs, "parameter_server", num_replicas)

    model, inputs = run.model, run.inputs
    trainer = parameter_server.ParameterServerTrainer(model)
    # Callbacks run at sync points only: throughput comes from the trainer.
    callbacks = [c for c in run.callbacks if not isinstance(c, ThroughputMeter)]
    cannot_evaluate = custom_steps.evaluation_skip_reason(model)
    if cannot_evaluate:
        logging.info("Skipping evaluation: %s.", cannot_evaluate)
    validation = {} if cannot_evaluate else validation_kwargs(config, inputs)
    dataset_fn = _worker_dataset_fn(loaded, inputs)
    started = time.perf_counter()
    history = None
    for segment in run.todo.segments:
        history = trainer.fit(
            dataset_fn,
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
            num_workers=cluster.count(WORKER),
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
