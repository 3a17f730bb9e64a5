"""The one training loop; a `Driver` is what a kind of strategy does inside it.

As Orbit's `Controller` runs an `AbstractTrainer` (`orbit/controller.py`,
`orbit/runner.py`), `train` runs the steps every strategy shares once:
`pipeline.prepare`, the answer to a restart after the job had finished, the
evaluation-skip line, the validation arguments, the clock, one `fit` per
segment of the plan, the last epoch's logs, the final evaluation and
`pipeline.conclude` with the run's `Outcome`. A driver brings the rest:
`trainer.run.synchronous.SynchronousDriver` (Keras `fit` on every worker) and
`trainer.run.parameter_server.ParameterServerDriver` (the chief's
coordinator).
"""

import abc
import contextlib
import time
from typing import Any, ContextManager, Mapping

import tensorflow as tf
from absl import logging

from tfdist.backups.state import FitSegment
from tfdist.distribute.cluster import Cluster
from tfdist.tasks import custom_steps
from trainer.config import ExperimentConfig
from trainer.run import pipeline
from trainer.run.directories import OutputDirs
from trainer.run.inputs import validation_kwargs
from trainer.run.outputs import Outcome, epoch_logs
from trainer.run.restarts import already_completed
from trainer.tasks import LoadedTask

__all__ = ["Driver", "train"]


class Driver(abc.ABC):
    """What one kind of strategy does inside `train`.

    Attributes:
        num_workers: The workers that read the training data, each its own
            pipeline; the summary's `num_workers`.
        num_ps: The parameter servers; the summary's `num_ps` (under
            `parameter_server` only).
    """

    num_workers: int
    num_ps: int = 0

    def extra_state(self) -> Mapping[str, Any] | None:
        """Named trackables backed up with the weights; None: the weights alone."""
        return None

    def begin(self, run: pipeline.Prepared) -> None:
        """Called once the run is prepared and not already complete, before any segment."""
        del run

    def running(self) -> ContextManager:
        """The context every segment's `fit` runs in; none by default."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def fit(self, run: pipeline.Prepared, segment: FitSegment, validation: Mapping[str, Any]):
        """Runs one segment of the plan; returns its Keras `History`."""

    @abc.abstractmethod
    def evaluate(self, run: pipeline.Prepared, stream: tf.data.Dataset) -> dict[str, float]:
        """The trained model's metrics on the evaluation split."""

    @abc.abstractmethod
    def examples_per_second(self, run: pipeline.Prepared) -> float:
        """The measured training throughput, in global examples per second."""


def train(
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    loaded: LoadedTask,
    *,
    strategy: tf.distribute.Strategy,
    environ: Mapping[str, str],
    strategy_name: str,
    driver: Driver,
) -> dict:
    """Trains the task to the end (or from its backup) and returns the summary."""
    run = pipeline.prepare(
        config,
        cluster,
        dirs,
        loaded,
        strategy,
        strategy_name,
        environ,
        num_workers=driver.num_workers,
        extra_state=driver.extra_state(),
    )
    num_replicas = int(strategy.num_replicas_in_sync)
    if run.todo.completed:
        return already_completed(run.backup, dirs, strategy_name, num_replicas)

    driver.begin(run)
    model, inputs = run.model, run.inputs
    cannot_evaluate = custom_steps.evaluation_skip_reason(model)
    if cannot_evaluate:
        logging.info("Skipping evaluation: %s.", cannot_evaluate)
    validation = {} if cannot_evaluate else validation_kwargs(config, inputs)
    started = time.perf_counter()
    history = None
    with driver.running():
        for segment in run.todo.segments:
            history = driver.fit(run, segment, validation)
    wall_seconds = time.perf_counter() - started
    train_logs = epoch_logs(history, run.backup)
    eval_stream = None if cannot_evaluate else inputs.eval_stream()
    evaluation = driver.evaluate(run, eval_stream) if eval_stream is not None else {}
    return pipeline.conclude(
        config,
        cluster,
        dirs,
        run,
        Outcome(
            strategy=strategy_name,
            num_replicas=num_replicas,
            num_workers=driver.num_workers,
            num_ps=driver.num_ps,
            steps_per_epoch=inputs.steps_per_epoch,
            steps_completed=int(model.optimizer.iterations.numpy()),
            train_logs=train_logs,
            evaluation=evaluation,
            examples_per_second=driver.examples_per_second(run),
            wall_seconds=wall_seconds,
            resumed_from_step=run.todo.resumed_from_step,
        ),
        environ=environ,
    )
