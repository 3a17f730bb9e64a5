"""One run, start to end: `prepare` everything before the first step, `conclude` after the last.

Every strategy and role runs the same pieces, each in its own module
(`trainer/run/__init__.py` gives the reading order): `directories`,
`inputs`, `compiling`, `restarts`, `callbacks`, `outputs` and `throughput`.
Import their names from them.
"""

import dataclasses
from typing import Mapping

import keras
import tensorflow as tf

from tfdist.callbacks import BackupAndRestore, CheckpointExporter
from tfdist.distribute.cluster import Cluster
from tfdist.outputs import export as export_lib
from trainer.config import ExperimentConfig
from trainer.run.callbacks import evaluation_exporter, finish_exports, training_callbacks
from trainer.run.compiling import build_training_model, tune_steps_per_execution
from trainer.run.directories import OutputDirs
from trainer.run.inputs import Inputs, build_inputs, training_position
from trainer.run.outputs import Outcome, build_summary, write_outputs
from trainer.run.restarts import Plan, make_backup, plan, run_settings
from trainer.run.throughput import ThroughputMeter
from trainer.tasks import LoadedTask

__all__ = ["Prepared", "conclude", "prepare", "seed_everything"]


def seed_everything(config: ExperimentConfig) -> None:
    """Seeds weights, data order and dropout; `--deterministic` also fixes the ops.

    `--deterministic` also turns TensorFlow's graph optimizer (grappler) off:
    it rewrites the one-process step of MirroredStrategy on 2 devices otherwise
    than each worker's one-device step, and the round-off differs (a conv
    bias before batch norm, whose gradient is ~0, drifted 1e-3 apart in 16
    Adam steps). Without it, 2 workers and 2 local devices end bit for bit
    alike (docs/multiworker.md).
    """
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A run ready to train: its inputs, its model (restored), its backup and plan.

    Attributes:
        meter: Measures the throughput of `fit`'s steps; not among `callbacks`,
            which a loop that runs callbacks at sync points only leaves out.
        callbacks: The run's other callbacks, in order (`training_callbacks`).
    """

    inputs: Inputs
    model: keras.Model
    backup: BackupAndRestore | None
    todo: Plan
    exporter: CheckpointExporter | None
    meter: ThroughputMeter
    callbacks: tuple


def prepare(
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    loaded: LoadedTask,
    strategy: tf.distribute.Strategy,
    strategy_name: str,
    environ: Mapping[str, str],
    *,
    num_workers: int,
    extra_state=None,
) -> Prepared:
    """Inputs, model, restore and callbacks: everything before the first step.

    Args:
        num_workers: The workers that read the training data, each its own
            pipeline (under parameter servers each its own share,
            `tfdist.data.worker_shares`).
        extra_state: Named trackables backed up with the weights (the
            parameter-server workers' input positions).
    """
    seed_everything(config)
    inputs = build_inputs(
        loaded,
        config,
        num_workers=num_workers,
        count_dir=dirs.backup_dir,
        is_chief=cluster.is_chief,
    )
    model = build_training_model(
        loaded, config, inputs, strategy=strategy, strategy_name=strategy_name
    )
    backup = make_backup(
        config,
        dirs,
        strategy,
        cluster,
        run_settings(config, loaded, inputs, cluster, strategy_name),
        inputs,
        extra_state=extra_state,
    )
    todo = plan(
        backup,
        model,
        epochs=config.epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        model_dir=dirs.model_dir,
        is_chief=cluster.is_chief,
    )
    steps_per_execution = tune_steps_per_execution(
        config, model, inputs, todo, num_workers=num_workers
    )
    # After the tuner, whose probe reads a stream of its own.
    position = None
    if strategy_name != "parameter_server" and not todo.completed:
        position = training_position(
            inputs,
            strategy,
            backup,
            epochs=config.epochs,
            max_state_mb=config.max_input_state_mb,
        )
        inputs = dataclasses.replace(inputs, position=position)
    meter = ThroughputMeter(
        global_batch_size=config.global_batch_size, steps_per_execution=steps_per_execution
    )
    exporter = evaluation_exporter(config, cluster, dirs, environ) if cluster.is_chief else None
    callbacks = training_callbacks(
        config=config,
        cluster=cluster,
        dirs=dirs,
        backup=backup,
        exporter=exporter,
        environ=environ,
        position=position,
    )
    return Prepared(inputs, model, backup, todo, exporter, meter, tuple(callbacks))


def conclude(
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    run: Prepared,
    outcome: Outcome,
    environ: Mapping[str, str],
) -> dict:
    """Final exports, `summary.json` and `model.keras` (chief), then completion."""
    finish_exports(run.exporter, run.model)
    summary = build_summary(config, outcome)
    if cluster.is_chief:
        write_outputs(
            run.model, summary, dirs, config.export or export_lib.default_export_format(environ)
        )
    if run.backup is not None:
        run.backup.complete()  # only once the outputs exist: a restart before this re-writes them
    return summary
