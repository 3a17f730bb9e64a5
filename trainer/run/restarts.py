"""The restart policy: what a backup records, what a restart may change, where it resumes.

`run_settings` is the run's fingerprint beyond its variables;
`changeable_settings` the settings a restart may change, each with why;
`make_backup` the `BackupAndRestore` that checks them; `plan` restores the
newest good backup and returns the `fit` segments left; `already_completed`
answers a restart after the job had finished, once `plan` has checked that its
outputs are where this run looks for them (else they are written again from the
kept final backup, or the restart is refused in one line saying where they are).
"""

import dataclasses
import os

import keras
import tensorflow as tf
from absl import logging

from tfdist.backups import ResumePoint
from tfdist.backups.state import FitSegment
from tfdist.callbacks import BackupAndRestore
from tfdist.distribute.cluster import Cluster
from tfdist.errors import UsageError
from tfdist.preemption import PreemptionOptions
from trainer.config import ExperimentConfig
from trainer.run.directories import OutputDirs
from trainer.run.inputs import Inputs
from trainer.run.outputs import SUMMARY_FILE, read_summary
from trainer.tasks import LoadedTask

# What decides the steps a run computes, recorded in every backup. The model's
# variables, the optimizer's class and variables and the dtype policy are
# recorded by the backup itself.
_SCHEDULE_FIELDS = (
    "learning_rate",
    "momentum",
    "weight_decay",
    "lr_scaling",
    "reference_batch_size",
    "warmup_epochs",
    "warmup_steps",
    "lr_decay",
    "decay_power",
    "decay_boundaries",
    "decay_rate",
    "exclude_from_weight_decay",
    "exclude_from_layer_adaptation",
)
_SAME_GLOBAL_BATCH = (
    "every step still averages the same global batch of the same examples, "
    "so it computes the same update"
)


def run_settings(
    config: ExperimentConfig,
    loaded: LoadedTask,
    inputs: Inputs,
    cluster: Cluster,
    strategy_name: str,
) -> dict:
    """The run's fingerprint beyond its variables, as `BackupAndRestore(run_settings=)` takes it."""
    settings = {
        "task": loaded.identity,
        "num_train_examples": inputs.num_train_examples,
        "input": inputs.train.kind,
        "global_batch_size": config.global_batch_size,
        "seed": config.seed,
        "steps_per_epoch": inputs.steps_per_epoch,
        "steps_per_execution": config.steps_per_execution,
        "epochs": config.epochs,
        "strategy": strategy_name,
        "num_workers": cluster.num_workers,
        "all_reduce_dtype": config.all_reduce_dtype,
    }
    for name in _SCHEDULE_FIELDS:
        value = getattr(config, name)
        settings[name] = list(value) if isinstance(value, tuple) else value
    return settings


def changeable_settings(
    config: ExperimentConfig, inputs: Inputs | None = None, strategy_name: str = ""
) -> dict:
    """Settings a restart may change, each with why the change is safe (it is logged).

    Files sharded per worker are read in an order that depends on the number
    of workers: a restart with another number cannot resume exactly. Nor can a
    parameter-server job, whose workers each read their own stream from where
    the backup recorded it.
    """
    changeable = {
        "steps_per_execution": "an execution only groups steps; each step is the same",
    }
    same_order = inputs is None or not inputs.train.order_depends_on_workers()
    if same_order and strategy_name != "parameter_server":
        changeable["num_workers"] = _SAME_GLOBAL_BATCH
        changeable["strategy"] = _SAME_GLOBAL_BATCH
    if config.lr_decay == "constant":
        changeable["epochs"] = (
            "the learning rate does not decay, so no step depends on the total number of steps"
        )
    return changeable


def make_backup(
    config: ExperimentConfig,
    dirs: OutputDirs,
    strategy: tf.distribute.Strategy,
    cluster: Cluster,
    settings: dict,
    inputs: Inputs | None = None,
    *,
    extra_state=None,
) -> BackupAndRestore | None:
    if not dirs.backup_dir:
        logging.warning(
            "No --backup_dir (and no AIP_CHECKPOINT_DIR): training cannot resume "
            "after a failure or preemption."
        )
        return None
    return BackupAndRestore(
        dirs.backup_dir,
        save_freq=config.backup_every_steps or "epoch",
        delete_checkpoint=not config.keep_backup,
        complete_on_train_end=False,
        strategy=strategy,
        cluster=cluster,
        preemption=PreemptionOptions(grace_period_seconds=config.preemption_grace_seconds),
        run_settings=settings,
        changeable=changeable_settings(config, inputs, settings.get("strategy", "")),
        extra_state=extra_state,
        restore_completed=True,
        outputs={"model_dir": dirs.model_dir},
        max_restarts_without_progress=config.max_restarts_without_progress,
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is left to run.

    Attributes:
        segments: The `fit` calls that finish training exactly once.
        resumed_from_step: Steps already applied before this run (0 when fresh).
        completed: An earlier run finished the job, outputs included.
    """

    segments: tuple[FitSegment, ...]
    resumed_from_step: int = 0
    completed: bool = False


def plan(
    backup: BackupAndRestore | None,
    model: keras.Model,
    *,
    epochs: int,
    steps_per_epoch: int,
    model_dir: str = "",
    is_chief: bool = True,
) -> Plan:
    """Restores the newest good backup into `model` and plans the rest of training.

    A job that had completed plans nothing, if its outputs are in `model_dir`;
    if they are not, it plans to write them from its final backup (kept with
    `--keep_backup`), else it is refused (`UsageError`) in one line saying
    where the outputs went.
    """
    if backup is None:
        return Plan(ResumePoint().segments(epochs=epochs, steps_per_epoch=steps_per_epoch))
    segments = backup.resume(model, epochs=epochs, steps_per_epoch=steps_per_epoch)
    if not backup.completed:
        return Plan(tuple(segments), backup.resumed_from_step)
    missing = (
        is_chief
        and bool(model_dir)
        and not tf.io.gfile.exists(os.path.join(model_dir, SUMMARY_FILE))
    )
    # Every worker takes the chief's path: writing the outputs evaluates (collectives).
    if not backup.any_worker(missing):
        return Plan((), backup.resumed_from_step, completed=True)
    if backup.restored_final_backup:
        logging.info(
            "%s records that this job completed at step %d, but its outputs are not in "
            "%s: writing them from its final backup (no step runs).",
            backup.backup_dir,
            backup.resumed_from_step,
            model_dir,
        )
        return Plan((), backup.resumed_from_step)
    raise UsageError(_outputs_missing(backup, model_dir))


def _outputs_missing(backup: BackupAndRestore, model_dir: str) -> str:
    step = backup.resumed_from_step
    recorded = (backup.completion.outputs if backup.completion else {}).get("model_dir", "")
    lost = "its final backup was not kept (--keep_backup), so they cannot be written again"
    if recorded and recorded != model_dir:
        return (
            f"{backup.backup_dir} records that this job completed at step {step} and wrote "
            f"model.keras and summary.json to {recorded}, not to --model_dir={model_dir}; "
            f"{lost}: take them from {recorded} (or rerun with --model_dir={recorded}), or "
            f"use a new --backup_dir to train again"
        )
    return (
        f"{backup.backup_dir} records that this job completed at step {step}, but "
        f"model.keras and summary.json are no longer in --model_dir={model_dir} and {lost}; "
        f"use a new --backup_dir (or delete {backup.backup_dir}) to train again"
    )


def already_completed(
    backup: BackupAndRestore, dirs: OutputDirs, strategy_name: str, num_replicas: int
) -> dict:
    """The summary of a job that had finished before this restart; trains nothing."""
    logging.warning(
        "%s records that this job completed at step %d; not training again. "
        "Use a new --backup_dir to train anew.",
        backup.backup_dir,
        backup.resumed_from_step,
    )
    return read_summary(dirs) or {
        "strategy": strategy_name,
        "num_replicas": num_replicas,
        "steps_completed": backup.resumed_from_step,
        "final_loss": None,
        "examples_per_second": 0.0,
        "resumed_from_step": backup.resumed_from_step,
    }
