"""One training run: strategy, data, model, fit, and the chief's outputs."""

import json
import os
import time
from typing import Mapping

from absl import logging
import keras
import tensorflow as tf

from tfdist import strategy as strategy_lib
from tfdist.callbacks import BackupAndRestore, EpochTensorBoard
from tfdist.checkpointing import ResumePoint
from tfdist.cluster import EVALUATOR, Cluster
from tfdist.data import per_replica_batch_size
from tfdist.files import write_json_atomically
from tfdist.preemption import PreemptionOptions
from trainer import datasets as datasets_lib
from trainer import models
from trainer import sidecar
from trainer.config import ExperimentConfig
from trainer.optimization import build_optimizer
from trainer.throughput import ThroughputMeter

# What a collective or a remote call raises when another task died or hung.
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                 tf.errors.AbortedError, tf.errors.CancelledError)

MODEL_FILE = "model.keras"
SUMMARY_FILE = "summary.json"


def output_dirs(config: ExperimentConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """Model, backup and TensorBoard directories; Vertex's `AIP_*` are defaults."""
    model_dir = config.model_dir or environ.get("AIP_MODEL_DIR", "")
    tensorboard_dir = (config.tensorboard_dir or environ.get("AIP_TENSORBOARD_LOG_DIR", "")
                       or (os.path.join(model_dir, "logs") if model_dir else ""))
    return {
        "model_dir": model_dir,
        "backup_dir": config.backup_dir or environ.get("AIP_CHECKPOINT_DIR", ""),
        "tensorboard_dir": tensorboard_dir,
    }


def strategy_options(config: ExperimentConfig) -> strategy_lib.StrategyOptions:
    return strategy_lib.StrategyOptions(all_reduce=config.all_reduce,
                                        num_cpu_devices=config.num_cpu_devices,
                                        tpu=config.tpu)


def _seed_everything(config: ExperimentConfig) -> None:
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()


def compile_model(model: keras.Model, config: ExperimentConfig, steps_per_epoch: int) -> None:
    model.compile(optimizer=build_optimizer(config, steps_per_epoch=steps_per_epoch),
                  steps_per_execution=config.steps_per_execution, **models.loss_and_metrics())


def run(config: ExperimentConfig, cluster: Cluster,
        environ: Mapping[str, str] = os.environ) -> dict | None:
    """Runs this task's part of the job; returns the summary where training ran.

    Only the chief writes `model.keras`, `summary.json`, TensorBoard logs and
    the per-epoch checkpoints an evaluator task reads; an evaluator task
    evaluates those and returns None.
    """
    dirs = output_dirs(config, environ)
    tf.get_logger().setLevel("WARNING")
    strategy_name = strategy_lib.resolve_strategy_name(config.strategy, cluster,
                                                       strategy_options(config))
    if config.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(config.mixed_precision)
    # Names are checked before any task contacts another: a typo must not hang.
    models.check_model_name(config.model)
    datasets_lib.check_dataset(config.dataset, config.data_dir)
    if cluster.task_type == EVALUATOR:
        sidecar.evaluate_checkpoints(config, cluster, dirs)
        return None
    if strategy_name == "parameter_server":
        # Chief, worker and ps tasks all run this same command.
        from trainer import parameter_server_roles  # pylint: disable=g-import-not-at-top
        return parameter_server_roles.run(config, cluster, dirs)
    replicas = strategy_lib.expected_num_replicas(strategy_name, cluster,
                                                  strategy_options(config))
    if replicas:
        per_replica_batch_size(config.global_batch_size, replicas)
    strategy = strategy_lib.make_strategy(strategy_name, cluster, strategy_options(config))
    _seed_everything(config)

    data = datasets_lib.load_datasets(
        config.dataset, global_batch_size=config.global_batch_size, seed=config.seed,
        num_examples=config.num_examples, data_dir=config.data_dir)
    steps_per_epoch = (config.steps_per_epoch
                       or max(data.info.num_train_examples // config.global_batch_size, 1))
    with strategy.scope():
        model = models.build_model(config.model, data.info.input_shape, data.info.num_classes)
        compile_model(model, config, steps_per_epoch)

    backup = _make_backup(config, dirs["backup_dir"], strategy, cluster)
    if backup is not None:
        segments = backup.resume(model, epochs=config.epochs, steps_per_epoch=steps_per_epoch)
        if backup.completed:
            return _already_completed(backup, dirs["model_dir"], strategy_name, strategy)
    else:
        segments = ResumePoint().segments(epochs=config.epochs,
                                          steps_per_epoch=steps_per_epoch)

    meter = ThroughputMeter(global_batch_size=config.global_batch_size,
                            steps_per_execution=config.steps_per_execution)
    callbacks = [meter]
    exporter = None
    if cluster.is_chief:
        if dirs["tensorboard_dir"]:
            callbacks.append(EpochTensorBoard(dirs["tensorboard_dir"]))
        exporter = sidecar.checkpoint_exporter(dirs["model_dir"])
        if exporter is not None:
            callbacks.append(exporter)
    if backup is not None:
        callbacks.append(backup)  # last: it may end the process after a preemption notice
    validation = ({"validation_data": data.test, "validation_steps": config.validation_steps}
                  if config.validation_steps else {})
    started = time.perf_counter()
    train_logs = {}
    for segment in segments:
        # The training stream is deterministic and runs across epochs, so a
        # resumed run skips the batches that earlier runs consumed.
        history = model.fit(data.train.skip(segment.first_step), callbacks=callbacks,
                            verbose=2 if cluster.is_chief else 0, shuffle=False,
                            **segment.fit_kwargs(), **validation)
        train_logs = {name: float(values[-1]) for name, values in history.history.items()}
    evaluation = model.evaluate(data.test, verbose=0, return_dict=True)
    if exporter is not None:
        exporter.finish()

    summary = {
        "strategy": strategy_name,
        "num_replicas": int(strategy.num_replicas_in_sync),
        "num_workers": cluster.num_workers,
        "global_batch_size": config.global_batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps_completed": int(model.optimizer.iterations.numpy()),
        "final_loss": train_logs.get("loss", float(evaluation["loss"])),
        "metrics": {
            "train": train_logs,
            "test": {name: float(value) for name, value in evaluation.items()},
        },
        "examples_per_second": meter.examples_per_second,
        "wall_seconds": time.perf_counter() - started,
        "resumed_from_step": backup.resumed_from_step if backup is not None else 0,
    }
    if cluster.is_chief:
        _write_outputs(model, summary, dirs["model_dir"])
    if backup is not None:
        backup.complete()  # only once the outputs exist: a restart before this re-writes them
    return summary


def _make_backup(config: ExperimentConfig, backup_dir: str, strategy: tf.distribute.Strategy,
                 cluster: Cluster) -> BackupAndRestore | None:
    if not backup_dir:
        logging.warning("No --backup_dir (and no AIP_CHECKPOINT_DIR): training cannot resume "
                        "after a failure or preemption.")
        return None
    return BackupAndRestore(backup_dir, save_freq=config.backup_every_steps or "epoch",
                            delete_checkpoint=not config.keep_backup,
                            complete_on_train_end=False, strategy=strategy, cluster=cluster,
                            preemption=PreemptionOptions(
                                grace_period_seconds=config.preemption_grace_seconds))


def _already_completed(backup: BackupAndRestore, model_dir: str, strategy_name: str,
                       strategy: tf.distribute.Strategy) -> dict:
    """The summary of a job that had finished before this restart; trains nothing."""
    logging.warning("%s records that this job completed at step %d; not training again. "
                    "Use a new --backup_dir to train anew.", backup.backup_dir,
                    backup.resumed_from_step)
    path = os.path.join(model_dir, SUMMARY_FILE) if model_dir else ""
    if path and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    return {"strategy": strategy_name, "num_replicas": int(strategy.num_replicas_in_sync),
            "steps_completed": backup.resumed_from_step, "final_loss": None,
            "examples_per_second": 0.0, "resumed_from_step": backup.resumed_from_step}


def _write_outputs(model: keras.Model, summary: dict, model_dir: str) -> None:
    if not model_dir:
        logging.warning("No --model_dir (and no AIP_MODEL_DIR): the model and summary are "
                        "not saved.")
        return
    tf.io.gfile.makedirs(model_dir)
    model_path = os.path.join(model_dir, MODEL_FILE)
    # Keras needs the .keras suffix; the rename keeps a previous model intact
    # until the new one is complete.
    temporary = os.path.join(model_dir, f".model.tmp-{os.getpid()}.keras")
    model.save(temporary)
    tf.io.gfile.rename(temporary, model_path, overwrite=True)
    write_json_atomically(os.path.join(model_dir, SUMMARY_FILE), summary)
    logging.info("Wrote %s and %s.", model_path, os.path.join(model_dir, SUMMARY_FILE))
