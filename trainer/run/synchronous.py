"""Training under the synchronous strategies: default, one_device, mirrored, multiworker, tpu.

Every worker runs this; `fit` keeps them in step, and only the chief writes.
"""

import contextlib
import time
from typing import Mapping

import tensorflow as tf
from absl import logging

from tfdist._internal import peer_noise
from tfdist.distribute.cluster import Cluster
from tfdist.tasks import custom_steps
from trainer.config import ExperimentConfig
from trainer.run import pipeline
from trainer.run.directories import OutputDirs
from trainer.run.inputs import validation_kwargs
from trainer.run.outputs import Outcome, epoch_logs
from trainer.run.restarts import already_completed
from trainer.run.throughput import ThroughputMeter
from trainer.tasks import LoadedTask


def train(
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    loaded: LoadedTask,
    *,
    strategy: tf.distribute.Strategy,
    environ: Mapping[str, str],
    strategy_name: str,
) -> dict:
    """Trains the task to the end (or from its backup) and returns the summary."""
    run = pipeline.prepare(config, cluster, dirs, loaded, strategy, strategy_name, environ)
    num_replicas = int(strategy.num_replicas_in_sync)
    if run.todo.completed:
        return already_completed(run.backup, dirs, strategy_name, num_replicas)

    model, inputs = run.model, run.inputs
    meter = next(c for c in run.callbacks if isinstance(c, ThroughputMeter))
    cannot_evaluate = custom_steps.evaluation_skip_reason(model)
    if cannot_evaluate:
        logging.info("Skipping evaluation: %s.", cannot_evaluate)
    validation = {} if cannot_evaluate else validation_kwargs(config, inputs)
    started = time.perf_counter()
    history = None
    # A lost peer's one-line error (printed by trainer.task) before TensorFlow's C++ lines.
    hold = peer_noise.HeldPeerNoise() if cluster.num_workers > 1 else contextlib.nullcontext()
    with hold:
        for segment in run.todo.segments:
            history = model.fit(
                inputs.train_stream(segment.first_step, strategy),
                callbacks=list(run.callbacks),
                shuffle=False,
                verbose=2 if cluster.is_chief else 0,
                **segment.fit_kwargs(),
                **validation,
            )
    wall_seconds = time.perf_counter() - started
    train_logs = epoch_logs(history, run.backup)
    eval_stream = None if cannot_evaluate else inputs.eval_stream()
    evaluation = (
        {
            name: float(value)
            for name, value in model.evaluate(eval_stream, verbose=0, return_dict=True).items()
        }
        if eval_stream is not None
        else {}
    )
    return pipeline.conclude(
        config,
        cluster,
        dirs,
        run,
        Outcome(
            strategy=strategy_name,
            num_replicas=num_replicas,
            num_workers=cluster.num_workers,
            steps_per_epoch=inputs.steps_per_epoch,
            steps_completed=int(model.optimizer.iterations.numpy()),
            train_logs=train_logs,
            evaluation=evaluation,
            examples_per_second=meter.examples_per_second,
            wall_seconds=wall_seconds,
            resumed_from_step=run.todo.resumed_from_step,
        ),
        environ=environ,
    )
