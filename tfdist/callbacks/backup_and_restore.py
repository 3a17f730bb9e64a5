"""`BackupAndRestore`: step-exact, atomic, multi-worker-safe backups for `fit`.

Unlike `keras.callbacks.BackupAndRestore`, backups commit atomically and the
previous one stays until the next commits; only the chief writes to
`backup_dir`; a torn backup falls back to the previous one; a run interrupted
mid-epoch resumes at the exact step instead of replaying the epoch; a preemption
signal saves at an agreed step and exits with 143; a finished job that is
restarted by accident does not train again; a restart under other settings
(model, optimizer, precision, the caller's `run_settings`) is refused in one
line without touching any backup; and a NaN/Inf loss or variable stops
training with `NonFiniteError` before anything non-finite is backed up.
Given the other callbacks (`resume(..., callbacks=...)`), it saves their
state with every backup and writes it back after each `on_train_begin`
(`tfdist.callbacks.callback_state`), and the metric sums of an interrupted
epoch, so a resumed run's callbacks act as the uninterrupted run's did.

Keras `fit` can only start at an epoch boundary, so resuming takes the callback's
help before `fit`:

    backup = tfdist.callbacks.BackupAndRestore("/tmp/backup", save_freq=50)
    for segment in backup.resume(model, epochs=10, steps_per_epoch=100,
                                 callbacks=others):
        model.fit(stream.skip(segment.first_step), callbacks=[*others, backup],
                  **segment.fit_kwargs())

where `stream` is the deterministic, repeated input pipeline iterated once
across epochs. A mid-epoch resume runs as two `fit` calls: the rest of the
interrupted epoch, then the remaining epochs.
"""

import logging
import math
import os

import keras
import numpy as np

from tfdist._internal.preconditions import require
from tfdist.backups import BackupStore, ResumePoint, TrainingBackup, WorkerSync
from tfdist.backups.fingerprint import check_changeable, check_run_settings
from tfdist.backups.lease import (
    DEFAULT_LEASE_SECONDS,
    BackupInUseError,
    BackupLease,
    digest,
    job_identity,
)
from tfdist.backups.restarts import DEFAULT_MAX_RESTARTS, RestartCount
from tfdist.backups.state import FitSegment
from tfdist.callbacks.callback_state import (
    ARRAYS_FILE,
    CallbackStates,
    arrays_from_file,
    arrays_to_bytes,
)
from tfdist.callbacks.non_finite import check_loss
from tfdist.distribute.cluster import Cluster, resolve_cluster
from tfdist.errors import NonFiniteError, StorageError, UsageError
from tfdist.preemption import PreemptionOptions, PreemptionWatcher
from tfdist.preemption.agreement import exit_together

__all__ = ["check_save_freq", "BackupAndRestore"]

_log = logging.getLogger(__name__)


def check_save_freq(save_freq) -> int | str:
    """Returns `save_freq` if it is `"epoch"` or a whole number > 0.

    Raises:
        UsageError: `False`, `0`, negatives, floats and anything else.
    """
    if save_freq == "epoch" and isinstance(save_freq, str):
        return save_freq
    require(
        isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0,
        f"save_freq is {save_freq!r}, expected 'epoch' or a whole number of steps > 0; "
        f"use save_freq='epoch' to back up once per epoch",
    )
    return save_freq


def _json_number(value):
    """A log value as JSON can hold it: a float, or None when not finite."""
    number = float(value)
    return number if math.isfinite(number) else None


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the training state and resumes from it at the exact step.

    Every worker of a synchronous job runs it; only the chief writes to
    `backup_dir`, the others write to a local scratch directory removed after
    each save (checkpoint saving is collective, so every worker takes part).

    Args:
        backup_dir: Where backups go; shared storage (`gs://...`) when workers
            run on several hosts. Use it for nothing else.
        save_freq: `"epoch"`, or a whole number of steps: back up whenever the
            global step reaches a multiple of it. The end of every epoch is
            backed up in both cases.
        delete_checkpoint: Delete the backups when training completes (the
            completion record stays, so a restart does not retrain).
        complete_on_train_end: Record completion as soon as the last planned
            step has run. Pass False when outputs are written after `fit`, and
            call `complete()` once they are: a restart in between then finds
            the final backup instead of a finished job without outputs.
        keep: Committed backups kept (>= 2).
        preemption: How to react to SIGTERM; `None` leaves signals alone.
        extra_state: Named trackables saved too, e.g. `{"rng": generator}`.
        strategy: The strategy; defaults to the model's.
        cluster: The cluster; defaults to `TF_CONFIG` / `CLUSTER_SPEC`.
        verify_checksums: Check each file's CRC-32 on restore.
        scratch_dir: Parent of non-chief scratch directories (default: the
            local temporary directory).
        run_settings: Settings that decide what the next step computes,
            recorded in every backup and compared on restore: a difference
            raises `tfdist.errors.BackupMismatchError` (a `UsageError`: exit
            2) naming the field, old and new value, and leaves every backup
            as it was. JSON values, e.g. `{"global_batch_size": 64, "seed":
            1, "dataset": "mnist", "num_examples": 60000, "steps_per_epoch":
            500, "steps_per_execution": 1, "learning_rate": {...}}`. The
            model's variables (by stable path, shape, dtype), the optimizer
            class and variables and the dtype policy are always recorded.
        changeable: Field names that may change between restarts, each
            mapped to why that is safe (logged in one line when it changed),
            e.g. `{"num_workers": "same global batch"}`. Applies to
            run-settings names, `"dtype_policy"` and `"optimizer"`.
        check_finite: Stop with `tfdist.errors.NonFiniteError` when the loss
            of a batch is NaN/Inf (checked every batch from the logs) or a
            variable is (checked before every backup); the last backup stays
            the last finite one.
        restore_completed: When the job had completed and its final backup
            was kept (`delete_checkpoint=False`), load it, so that a rerun
            holds the trained weights (see `restored_final_backup`).
        outputs: Where the job writes its outputs, e.g. `{"model_dir": DIR}`:
            recorded in the completion record with the run's fingerprint, so a
            rerun can tell whether they are where it looks (`completion`).
        max_restarts_without_progress: Restarts allowed from one backup
            without committing a new one; one more raises
            `tfdist.errors.CrashLoopError` (exit 4) before training. Counted in
            `backup_dir` (`tfdist.backups.restarts`); `None` for no limit.
        lease_seconds: The chief holds a lease on `backup_dir` while it trains
            (`tfdist.backups.lease`): a second job is refused with
            `tfdist.backups.lease.BackupInUseError` (exit 2) before it touches
            anything; a killed owner's lease lets a restart take over at once
            when it is recognized (same job, or the owner's process gone from
            this host), else after at most this many seconds. `None`: no lease.
        input_state: The training input's saved position
            (`tfdist.data.resume_input.ResumableInput`, what `tfdist.resumable.fit`
            passes): every worker's iterator state is gathered to the chief and
            committed in each backup, inside its checksums.
    """

    def __init__(
        self,
        backup_dir: str,
        *,
        save_freq="epoch",
        delete_checkpoint: bool = True,
        complete_on_train_end: bool = True,
        keep: int = 2,
        preemption: PreemptionOptions | None = PreemptionOptions(),
        extra_state=None,
        strategy=None,
        cluster: Cluster | None = None,
        verify_checksums: bool = True,
        scratch_dir: str | None = None,
        run_settings=None,
        changeable=None,
        check_finite: bool = True,
        restore_completed: bool = False,
        outputs=None,
        max_restarts_without_progress: int | None = DEFAULT_MAX_RESTARTS,
        lease_seconds: float | None = DEFAULT_LEASE_SECONDS,
        input_state=None,
    ):
        super().__init__()
        self.input_state = input_state
        self.save_freq = check_save_freq(save_freq)
        self._run_settings = check_run_settings(run_settings)
        self._changeable = check_changeable(changeable)
        self._check_finite = bool(check_finite)
        if not isinstance(delete_checkpoint, bool):
            raise UsageError(f"delete_checkpoint is {delete_checkpoint!r}, expected True or False")
        if preemption is not None and not isinstance(preemption, PreemptionOptions):
            raise UsageError(
                f"preemption is {preemption!r}, expected a "
                f"tfdist.preemption.PreemptionOptions or None"
            )
        cluster = cluster or resolve_cluster(os.environ)
        self.delete_checkpoint = delete_checkpoint
        self.complete_on_train_end = bool(complete_on_train_end)
        self.store = BackupStore(
            backup_dir,
            is_chief=cluster.is_chief,
            task_name=f"{cluster.task_type or 'single'}-{cluster.task_index}",
            keep=keep,
            verify_checksums=verify_checksums,
            scratch_root=scratch_dir,
        )
        self._preemption_options = preemption
        self._extra_state = extra_state
        self._strategy = strategy
        self._backup = None
        self._job_strategy = None
        self._watcher = None
        self._resume_point = None
        self._global_step = 0
        self._epoch = 0
        self._step_in_epoch = 0
        self._batch_offset = 0
        self._steps_per_epoch = None
        self._total_steps = None
        self._last_saved_step = None
        self._completed = False
        self._epoch_logs: dict = {}
        self._restore_completed = bool(restore_completed)
        if outputs is not None and not isinstance(outputs, dict):
            raise UsageError(
                f"outputs is {outputs!r}, expected a dict of names to paths, e.g. "
                f"{{'model_dir': '/runs/a'}}, or None"
            )
        self._outputs = dict(outputs or {})
        if lease_seconds is not None:
            require(
                isinstance(lease_seconds, (int, float))
                and not isinstance(lease_seconds, bool)
                and math.isfinite(lease_seconds)
                and lease_seconds > 0,
                f"lease_seconds is {lease_seconds!r}, expected a finite number of seconds > 0 "
                f"(how long a backup directory's lease lasts without renewal), or None",
            )
        self._lease_seconds = lease_seconds
        self._lease = None
        self._job = job_identity(cluster.addresses, os.environ)
        self._restart_count = RestartCount(
            self.store.backup_dir,
            max_restarts=max_restarts_without_progress,
            is_chief=cluster.is_chief,
        )
        self._is_chief = cluster.is_chief
        self._epochs = None
        self._history: dict = {"epoch": [], "history": {}}
        self._states = CallbackStates([])
        self._pending_metrics = None
        self._stop_at_epoch_end = False
        self._final_pending = False
        self._hidden_best_weights = []

    # ------------------------------------------------------------ public API

    @property
    def backup_dir(self) -> str:
        return self.store.backup_dir

    @property
    def resumed_from_step(self) -> int:
        """The global step training resumed from (0 on a fresh start)."""
        return self._resume_point.global_step if self._resume_point else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps applied so far, including those before a resume."""
        return self._global_step

    @property
    def resume_point(self) -> ResumePoint | None:
        """Where training resumed, once `restore` has run."""
        return self._resume_point

    @property
    def preemption(self) -> PreemptionWatcher | None:
        """The preemption watcher, once `restore` has run (None if disabled)."""
        return self._watcher

    @property
    def epoch_logs(self) -> dict:
        """The logs of the last completed epoch: this run's, else the restored backup's.

        A restart after the last step runs no epoch; these are what the
        finished run reported for its last one.
        """
        return dict(self._epoch_logs)

    @property
    def completed(self) -> bool:
        """Whether training has completed (now, or in an earlier run)."""
        return self._completed

    @property
    def restored_final_backup(self) -> bool:
        """Whether a completed job's final backup was loaded (`restore_completed`)."""
        point = self._resume_point
        return bool(point and point.completed and point.backup_path)

    @property
    def completion(self):
        """The checked completion record of a finished job (`tfdist.backups.completion.Completion`).

        `None` unless `restore` found that the job had completed.
        """
        return self._backup.completion if self._backup is not None else None

    def any_worker(self, flag: bool) -> bool:
        """Whether any worker passed `True`: a collective, every worker calls it (after `restore`)."""
        if self._backup is None:
            raise RuntimeError("any_worker() called before restore() or resume()")
        return self._backup.sync.any(flag)

    @property
    def history(self) -> dict:
        """Every epoch's logs so far, this run's and the restored backup's.

        `{"epoch": [0, 1, ...], "history": {"loss": [...], ...}}`, as
        `keras.callbacks.History` holds them (non-finite values as None).
        """
        return {
            "epoch": list(self._history["epoch"]),
            "history": {name: list(values) for name, values in self._history["history"].items()},
        }

    def restore(self, model=None) -> ResumePoint:
        """Loads the newest good backup into `model`; idempotent.

        Call on every worker before training. `fit` calls it when it has not
        been called, but only `resume` can start `fit` in the right place.
        """
        if self._resume_point is not None:
            return self._resume_point
        # Before any peer is contacted: read-only or full storage is one line now, not at
        # the first backup.
        self.store.check_writable()
        if model is not None:
            self.set_model(model)
        model = self.model
        strategy = self._strategy or getattr(model, "distribute_strategy", None)
        sync = WorkerSync(strategy)
        self._backup = TrainingBackup(
            self.store,
            model,
            sync=sync,
            extra_state=self._extra_state,
            strategy=strategy,
            run_settings=self._run_settings,
            changeable=self._changeable,
            check_finite=self._check_finite,
        )
        if self._preemption_options is not None:
            self._watcher = PreemptionWatcher(self._preemption_options, sync=sync)
            self._watcher.install()
        try:
            if self._is_chief and self._lease_seconds is not None:
                self._lease = BackupLease(
                    self.store.backup_dir,
                    job=self._job,
                    fingerprint=digest(self._backup.fingerprint.to_json()),
                    lease_seconds=self._lease_seconds,
                )
                self._lease.acquire()  # before anything in backup_dir is read or changed
            point = self._backup.restore(load_when_completed=self._restore_completed)
            if not point.completed:
                self._count_restart(point, sync)
        except BaseException:
            self._let_go()  # a refused restart leaves SIGTERM to its default
            raise
        self._resume_point = point
        self._epoch_logs = dict(point.epoch_logs or {})
        history = point.metadata.get("history") or {}
        self._history = {
            "epoch": list(history.get("epoch", [])),
            "history": {
                name: list(values) for name, values in (history.get("history") or {}).items()
            },
        }
        self._completed = point.completed
        self._job_strategy = strategy
        if point.completed:
            self._let_go()  # nothing will train: leave SIGTERM to its default
            exit_together(strategy)
        self._global_step = self._last_saved_step = point.global_step
        self._epoch, self._step_in_epoch = point.epoch, point.step_in_epoch
        return point

    def _count_restart(self, point: ResumePoint, sync: WorkerSync) -> None:
        """Counts this start from `point`; stops a crash loop (every worker, agreed)."""
        count = self._restart_count
        mine = count.restarts(point.global_step, point.backup_path) if self._is_chief else 0
        count.check(point.global_step, point.backup_path, max(sync.gather(mine)))

    def resume(
        self, model, *, epochs: int, steps_per_epoch: int | None, callbacks=None
    ) -> tuple[FitSegment, ...]:
        """Restores, then returns the `fit` calls that finish the job exactly once.

        Args:
            model: The built, compiled model.
            epochs: Total epochs of the job.
            steps_per_epoch: Steps per epoch (`None`: the dataset decides; a
                mid-epoch backup then resumes with the number it recorded).
            callbacks: The other callbacks passed to every `fit` call (this
                one goes last): their state is saved with every backup and
                restored (see `tfdist.callbacks.callback_state`).

        Returns:
            The segments to run in order; empty when training had completed.
        """
        self._states = CallbackStates(callbacks)
        point = self.restore(model)
        segments = point.segments(epochs=epochs, steps_per_epoch=steps_per_epoch)
        self._epochs = epochs
        self._steps_per_epoch = steps_per_epoch or point.steps_per_epoch
        if steps_per_epoch is not None:
            self._total_steps = epochs * steps_per_epoch
            if not point.completed:
                self._epoch, self._step_in_epoch = divmod(point.global_step, steps_per_epoch)
        if point.backup_path:
            arrays = arrays_from_file(f"{point.backup_path}/{ARRAYS_FILE}")
            saved = point.metadata.get("callbacks")
            self._states.remember(saved, arrays)
            self._states.prepare_csv(saved, is_chief=self._is_chief)
            names = point.metadata.get("metric_arrays")
            if point.step_in_epoch and not point.completed and names:
                self._pending_metrics = [arrays[name] for name in names]
            if point.completed or not segments:
                self._states.restore_pending()
        if not segments and not point.completed:
            _log.info(
                "The backup is at step %d, past the %d planned steps; nothing to run.",
                point.global_step,
                self._total_steps or 0,
            )
        return segments

    def complete(self) -> None:
        """Records that the job is complete, then deletes backups if asked.

        Call on every task; only the chief writes. Idempotent.
        """
        if self._backup is None:
            raise RuntimeError("complete() called before restore() or resume()")
        if not self._completed:
            self._backup.finish(
                global_step=self._global_step,
                delete_backups=self.delete_checkpoint,
                outputs=self._outputs,
            )
            self._restart_count.clear()
        self._completed = True
        self._let_go()
        # Without it, a task that outlives another by the heartbeat timeout (the
        # chief writing outputs) prints TensorFlow's "The tasks have crashed".
        exit_together(self._job_strategy)

    def close(self) -> None:
        """Restores the signal handlers; call if training stops before its end."""
        if self._watcher is not None:
            self._watcher.close()

    def release(self) -> None:
        """Gives up the lease on `backup_dir` (done for you at completion, preemption, exit)."""
        if self._lease is not None:
            self._lease.release()

    def _let_go(self) -> None:
        self.close()
        self.release()

    # -------------------------------------------------------------- callback

    def on_train_begin(self, logs=None):
        point = self.restore()
        if point.completed:
            raise UsageError(
                f"{self.backup_dir} records that training completed at step "
                f"{point.global_step}, so fit will not train again; use a new backup "
                f"directory to train anew"
            )
        if self._steps_per_epoch is None and not self._step_in_epoch:
            self._steps_per_epoch = self.params.get("steps")
        if self._watcher is not None:
            self._watcher.install()
        # After every other callback's on_train_begin (this one runs last), which
        # resets theirs: EarlyStopping's wait and best, ReduceLROnPlateau's, ...
        self._states.restore_pending()

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self._epoch:
            raise UsageError(
                f"fit starts epoch {epoch} but training resumes at epoch {self._epoch} "
                f"(step {self._step_in_epoch} of it, global step {self._global_step}); "
                f"run fit once per segment of callback.resume(model, epochs=..., "
                f"steps_per_epoch=...) with segment.fit_kwargs()"
            )
        if self._step_in_epoch:
            remaining = (self._steps_per_epoch or 0) - self._step_in_epoch
            if self.params.get("steps") != remaining:
                raise UsageError(
                    f"fit runs {self.params.get('steps')} steps in epoch {epoch} but "
                    f"{self._step_in_epoch} of its {self._steps_per_epoch} steps were "
                    f"already applied, expected steps_per_epoch={remaining}; use "
                    f"callback.resume(...) and segment.fit_kwargs()"
                )
        self._batch_offset = self._step_in_epoch

    def _epoch_steps(self) -> int | None:
        if self._steps_per_epoch is not None:
            return self._steps_per_epoch
        steps = self.params.get("steps")
        return None if steps is None else steps + self._batch_offset

    def on_train_batch_begin(self, batch, logs=None):
        if self.input_state is not None:
            self.input_state.training_started()

    def on_train_batch_end(self, batch, logs=None):
        if self._pending_metrics is not None:
            self._restore_metrics()
        done_in_epoch = self._batch_offset + batch + 1
        self._global_step += done_in_epoch - self._step_in_epoch
        self._step_in_epoch = done_in_epoch
        if self._check_finite:
            try:
                check_loss(logs, where=f"step {self._global_step}", after=self._last_backup_note())
            except NonFiniteError:
                self._let_go()
                raise
        # An epoch's last step is saved by `on_epoch_end`, after the epoch-end
        # callbacks (a learning rate they change is kept) and as "end of epoch N".
        epoch_end = done_in_epoch == self._epoch_steps()
        if self.save_freq != "epoch" and not epoch_end:
            previous = self._last_saved_step or 0
            if self._global_step // self.save_freq > previous // self.save_freq:
                self._save()
        if self._watcher is not None and self._watcher.should_stop(self._global_step):
            if epoch_end:
                self._stop_at_epoch_end = True
                return
            if self._last_saved_step != self._global_step:
                self._save()
            self.release()
            raise self._watcher.finish()

    def _training_over(self) -> bool:
        if self.model.stop_training:
            return True
        if self._total_steps is not None:
            return self._global_step >= self._total_steps
        return self._epoch >= (self._epochs or self.params.get("epochs", 0))

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_logs = {name: _json_number(value) for name, value in (logs or {}).items()}
        self._history["epoch"].append(epoch)
        for name, value in self._epoch_logs.items():
            self._history["history"].setdefault(name, []).append(value)
        if (
            self._steps_per_epoch is None
            and not self._batch_offset
            and not self.model.stop_training
        ):
            self._steps_per_epoch = self._step_in_epoch
        self._epoch = epoch + 1
        self._step_in_epoch = 0
        self._batch_offset = 0
        if self._training_over():
            # Saved by on_train_end, after what the callbacks do there
            # (EarlyStopping(restore_best_weights=True) sets the best weights).
            self._final_pending = True
            return
        self._save()
        if epoch + 1 == self.params.get("epochs"):
            self._hide_best_weights()  # this fit call ends, training goes on
        if self._stop_at_epoch_end:
            self.release()
            raise self._watcher.finish()

    def on_train_end(self, logs=None):
        finished = self._training_over()
        if not finished:
            self._show_best_weights()
            self._states.remember_current()
            self._states.keep_appending_csv()
        if finished and (self._final_pending or self._last_saved_step != self._global_step):
            self._save(final=True)
            self._final_pending = False
        if finished and self.complete_on_train_end:
            self.complete()
        elif finished and self._total_steps is None:
            self._total_steps = self._global_step
        if finished or self._total_steps is None or self.model.stop_training:
            self.close()

    # -------------------------------------------------------------- internal

    def _early_stoppers(self) -> list:
        return [
            callback
            for callback in self._states.callbacks
            if isinstance(callback, keras.callbacks.EarlyStopping)
            and callback.restore_best_weights
            and callback.best_weights is not None
        ]

    def _hide_best_weights(self) -> None:
        """Keeps EarlyStopping from restoring its best weights when one fit call of several ends."""
        self._hidden_best_weights = [
            (callback, callback.best_weights) for callback in self._early_stoppers()
        ]
        for callback, _ in self._hidden_best_weights:
            callback.best_weights = None

    def _show_best_weights(self) -> None:
        for callback, weights in self._hidden_best_weights:
            callback.best_weights = weights
        self._hidden_best_weights = []

    def _restore_metrics(self) -> None:
        """Adds the metric sums of the interrupted epoch's steps run before the backup.

        Called after the first step of the rest of that epoch (Keras builds
        compiled metrics in the first step): a sum then adds up in the order
        it would have without the restart.
        """
        saved, self._pending_metrics = self._pending_metrics, None
        variables = list(self.model.metrics_variables)
        if [tuple(v.shape) for v in variables] != [value.shape for value in saved]:
            _log.warning(
                "The model's metrics differ from the backup's; the logs of "
                "epoch %d cover only the steps run after the restart.",
                self._epoch,
            )
            return
        for variable, value in zip(variables, saved):
            # Every worker assigns the same total: a sum-on-read variable splits
            # an assignment across the replicas so that reading it sums back to it.
            if getattr(variable, "aggregation", None) == "sum":
                value = np.asarray(variable.numpy()) + value
            variable.assign(value)

    def _last_backup_note(self) -> str:
        if self._last_saved_step:
            return (
                f" before backing it up: the last backup (step {self._last_saved_step}) "
                f"holds finite values"
            )
        return " before backing it up"

    def _save(self, final: bool = False) -> None:
        states, arrays = self._states.capture()
        metadata = {
            "epoch_logs": self._epoch_logs,
            "history": self._history,
            "callbacks": states,
            "stopped": final and bool(self.model.stop_training),
        }
        if self._step_in_epoch and not final:
            values = [np.asarray(variable.numpy()) for variable in self.model.metrics_variables]
            metadata["metric_arrays"] = [f"metric{index}" for index in range(len(values))]
            arrays.update(zip(metadata["metric_arrays"], values))
        files = {ARRAYS_FILE: arrays_to_bytes(arrays)} if arrays else {}
        if self.input_state is not None:
            # A collective: every worker's state, gathered to the chief's commit.
            input_files, input_metadata = self.input_state.backup(self._backup.sync)
            files.update(input_files)
            if input_metadata is not None:
                metadata["input_state"] = input_metadata
        try:
            if self._lease is not None:
                self._lease.check()  # another job took the directory: write nothing more
            self._backup.save(
                global_step=self._global_step,
                epoch=self._epoch,
                step_in_epoch=self._step_in_epoch,
                steps_per_epoch=self._steps_per_epoch,
                extra_metadata=metadata,
                extra_files=files or None,
            )
        except (NonFiniteError, StorageError, BackupInUseError):
            self._let_go()  # training stops here: leave SIGTERM to its default
            raise
        self._restart_count.progress()
        self._last_saved_step = self._global_step
