"""The callbacks of a training run: the non-finite guard, tuning, TensorBoard, exports, backup.

`training_callbacks` puts them in order (the backup last: it may end the
process after a preemption notice; under `python -m trainer.ray`, Ray's own
preemption notice is polled just before it and the committed backups are
reported to Ray just after it, under every strategy); `evaluation_exporter`
is the chief's checkpoint exporter for an evaluator task, and
`finish_exports` its last export once training is over. With a saved input
position (`trainer.run.inputs.TrainingPosition`), `SavedInputPosition` comes
first: it records the iterator `fit` builds over the task's dataset, and
restores the backed-up position into it. The throughput meter
is not among them: `trainer.run.pipeline.prepare` hands it to the loop on its
own, and only a loop whose callbacks see every step runs it.
"""

import contextlib
import sys
from typing import Mapping

import keras

from tfdist.callbacks import (
    BackupAndRestore,
    CheckpointExporter,
    EpochTensorBoard,
    HypertuneCallback,
    NonFiniteGuard,
)
from tfdist.distribute.cluster import Cluster, has_evaluator
from trainer.config import ExperimentConfig
from trainer.run.directories import OutputDirs

# Evaluation checkpoints kept; the evaluator reads the newest.
EVALUATION_CHECKPOINTS_KEPT = 3


def evaluation_exporter(
    config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs, environ: Mapping[str, str]
) -> CheckpointExporter | None:
    """The chief's exporter when an evaluator exists or one was asked for; else None."""
    if not dirs.model_dir or not (config.evaluation_checkpoints or has_evaluator(cluster, environ)):
        return None
    return CheckpointExporter(dirs.checkpoints_dir, max_to_keep=EVALUATION_CHECKPOINTS_KEPT)


def training_callbacks(
    *,
    config: ExperimentConfig,
    cluster: Cluster,
    dirs: OutputDirs,
    backup: BackupAndRestore | None,
    exporter: CheckpointExporter | None,
    environ: Mapping[str, str],
    position=None,
) -> list:
    """The chief's TensorBoard and exporter, and the backup (with Ray's calls), in order.

    Args:
        position: The task's dataset's saved position
            (`trainer.run.inputs.TrainingPosition`), or None.
    """
    callbacks = []
    if position is not None:
        callbacks.append(SavedInputPosition(position))
    if backup is None:
        callbacks.append(NonFiniteGuard())  # the backup checks the same itself
    if config.hparam_metric:
        callbacks.append(HypertuneCallback(config.hparam_metric, is_chief=cluster.is_chief))
    if cluster.is_chief:
        if dirs.tensorboard_dir:
            callbacks.append(EpochTensorBoard(dirs.tensorboard_dir))
        if exporter is not None:
            callbacks.append(exporter)
    if backup is not None:
        ray_backend = ray_backend_if_set_up()
        if ray_backend is not None:
            # Under parameter servers callbacks run at sync points only: poll at each.
            callbacks.append(ray_backend.PreemptionNotice(every_steps=1 if cluster.num_ps else 8))
        callbacks.append(backup)  # it may end the process after a preemption notice
        if ray_backend is not None:
            callbacks.append(ray_backend.ReportBackups(dirs.backup_dir))
    return callbacks


class SavedInputPosition(keras.callbacks.Callback):
    """Keeps each `fit` call inside `position.capture()`, from its start to its end.

    Keras builds its iterator over the training data after `on_train_begin`:
    while captured, that iterator is recorded (its state goes into each
    backup) and a restored position is put into it before the first step.
    On several workers that iterator is a plain tf.data iterator, not the
    distributed one the steps-per-execution tuner traced the step with: the
    first `fit` traces its step anew.
    """

    def __init__(self, position):
        super().__init__()
        self._position = position
        self._inside = contextlib.ExitStack()
        self._traced = False

    def on_train_begin(self, logs=None):
        if not self._position.in_use:
            return
        self._inside.enter_context(self._position.capture())
        if not self._traced and self._position.workers > 1:
            self.model.make_train_function(force=True)
        self._traced = True

    def on_train_end(self, logs=None):
        self._inside.close()


def ray_backend_if_set_up():
    """`tfdist.ray` when its backend set this run up (`python -m trainer.ray`); else None.

    Every rank that runs `fit` (the chief of a parameter-server job; every
    training task of a synchronous one) then polls Ray's own preemption notice
    (`ray.train.get_preemption_info()`) and reports the committed backups as Ray
    checkpoints (`ray.train.report`). Both are collectives of every Ray rank:
    the parameter-server workers and ps tasks and an evaluator, which never run
    `fit`, make the same calls after rank 0 (`tfdist.ray.job_end`).
    """
    ray_backend = sys.modules.get("tfdist.ray")  # never imports Ray for a run outside it
    if ray_backend is None or not ray_backend.set_up_by_backend():
        return None
    return ray_backend


def finish_exports(exporter: CheckpointExporter | None, model: keras.Model) -> None:
    """Exports the final checkpoint and marks training done for the evaluator.

    Works also when no `fit` ran in this process (a restart after the last step).
    """
    if exporter is None:
        return
    if exporter.model is None:
        exporter.set_model(model)
        exporter.on_train_begin()
    exporter.finish()
