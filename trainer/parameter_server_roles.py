"""`--strategy=parameter_server`: what each task of the job does.

Every task runs the same `python -m trainer.task ... --strategy=parameter_server`:

- `worker` and `ps` tasks serve until the chief has finished
  (`tfdist.parameter_server.serve`), then exit 0;
- the `chief` coordinates training (`tfdist.parameter_server`'s loop), exports
  a checkpoint per epoch to `<model_dir>/checkpoints` for the evaluator, and
  writes the usual `model.keras` and `summary.json`;
- an `evaluator` evaluates each exported checkpoint (`trainer.sidecar`).
"""

# This module is trainer/train.py's parameter-server branch and shares its
# helpers (_compile, _make_backup, _already_completed, _write_outputs).
# pylint: disable=protected-access

import os
import time

import keras
import tensorflow as tf

from tfdist import parameter_server
from tfdist.callbacks import EpochTensorBoard
from tfdist import strategy as strategy_lib
from tfdist.checkpointing import ResumePoint
from tfdist.cluster import CHIEF, PS, WORKER, Cluster
from tfdist.errors import UsageError
from trainer import datasets as datasets_lib
from trainer import models
from trainer import sidecar
from trainer import train
from trainer.config import ExperimentConfig



def run(config: ExperimentConfig, cluster: Cluster, dirs: dict) -> dict | None:
    """Runs this task's part of a parameter-server job (the evaluator's is in `trainer.sidecar`).

    Returns:
        The summary on the chief; None on the other tasks.
    """
    if cluster.task_type in (WORKER, PS):
        parameter_server.serve(cluster)
        return None
    if cluster.task_type != CHIEF:
        raise UsageError(
            f"task type {cluster.task_type!r} has no part in parameter-server training, "
            f"expected chief, worker, ps or evaluator")
    return _train(config, cluster, dirs)


def _load(config: ExperimentConfig):
    keras.utils.set_random_seed(config.seed)
    data = datasets_lib.load_datasets(
        config.dataset, global_batch_size=config.global_batch_size, seed=config.seed,
        num_examples=config.num_examples, data_dir=config.data_dir)
    steps_per_epoch = (config.steps_per_epoch
                       or max(data.info.num_train_examples // config.global_batch_size, 1))
    return data, steps_per_epoch


def _load_train_stream(config: ExperimentConfig) -> tf.data.Dataset:
    return datasets_lib.load_datasets(
        config.dataset, global_batch_size=config.global_batch_size, seed=config.seed,
        num_examples=config.num_examples, data_dir=config.data_dir).train


def _worker_stream(train_stream: tf.data.Dataset, num_batches: int) -> tf.data.Dataset:
    """Starts each worker's copy of the stream at its own offset.

    Under ParameterServerStrategy every worker runs the same input graph and
    cannot learn its index from it; the fixed-seed stream would give every
    worker the same batches at the same time. The offset comes from the clock
    of the worker that builds its copy, so copies start at different batches.
    """
    offset = tf.cast(tf.timestamp() * 1e6, tf.int64) % max(num_batches, 1)
    return train_stream.skip(offset)


def _train(config: ExperimentConfig, cluster: Cluster, dirs: dict) -> dict:
    options = strategy_lib.StrategyOptions(
        all_reduce=config.all_reduce,
        ps_min_shard_bytes=getattr(config, "ps_min_shard_bytes", 0),
        ps_max_shards=getattr(config, "ps_max_shards", 1))
    strategy = strategy_lib.make_strategy("parameter_server", cluster, options)
    data, steps_per_epoch = _load(config)
    with strategy.scope():
        model = models.build_model(config.model, data.info.input_shape, data.info.num_classes)
        train.compile_model(model, config, steps_per_epoch)
    trainer = parameter_server.ParameterServerTrainer(model)

    backup = train._make_backup(config, dirs["backup_dir"], strategy, cluster)
    if backup is not None:
        segments = backup.resume(model, epochs=config.epochs, steps_per_epoch=steps_per_epoch)
        if backup.completed:
            return train._already_completed(backup, dirs["model_dir"], "parameter_server",
                                            strategy)
    else:
        segments = ResumePoint().segments(epochs=config.epochs, steps_per_epoch=steps_per_epoch)

    callbacks = []
    exporter = None
    if dirs["model_dir"]:
        exporter = parameter_server.CheckpointExporter(
            os.path.join(dirs["model_dir"], sidecar.CHECKPOINTS_SUBDIR))
        callbacks.append(exporter)
    if dirs["tensorboard_dir"]:
        callbacks.append(EpochTensorBoard(dirs["tensorboard_dir"]))
    if backup is not None:
        callbacks.append(backup)  # last: it may end the process after a preemption notice
    validation = ({"validation_data": data.test, "validation_steps": config.validation_steps}
                  if config.validation_steps else {})
    num_batches = max(data.info.num_train_examples // config.global_batch_size, 1)

    def dataset_fn(input_context):
        # Built here, inside the function each worker runs: a dataset made
        # eagerly on the chief cannot be captured by it.
        del input_context  # Parameter-server input contexts do not tell workers apart.
        return _worker_stream(_load_train_stream(config), num_batches)

    started = time.perf_counter()
    train_logs = {}
    for segment in segments:
        history = trainer.fit(dataset_fn, epochs=segment.epochs,
                              initial_epoch=segment.initial_epoch,
                              steps_per_epoch=segment.steps_per_epoch,
                              steps_per_sync=config.backup_every_steps or None,
                              callbacks=callbacks, verbose=2, **validation)
        train_logs = {name: float(values[-1]) for name, values in history.history.items()}
    wall_seconds = time.perf_counter() - started
    evaluation = trainer.evaluate_on_coordinator(data.test)
    if exporter is not None:
        exporter.finish()

    summary = {
        "strategy": "parameter_server",
        "num_replicas": int(strategy.num_replicas_in_sync),
        "num_workers": cluster.count(WORKER),
        "num_ps": cluster.num_ps,
        "global_batch_size": config.global_batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps_completed": int(model.optimizer.iterations.numpy()),
        "final_loss": train_logs.get("loss", evaluation.get("loss")),
        "metrics": {"train": train_logs, "test": evaluation},
        "examples_per_second": trainer.steps_per_second * config.global_batch_size,
        "wall_seconds": wall_seconds,
        "resumed_from_step": backup.resumed_from_step if backup is not None else 0,
    }
    train._write_outputs(model, summary, dirs["model_dir"])
    if backup is not None and hasattr(backup, "complete"):
        backup.complete()  # only once the outputs exist
    return summary
