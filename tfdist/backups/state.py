"""What a training backup holds, and where training resumes from it.

A backup holds every variable of the model (trainable, non-trainable such as
batch-norm statistics, and Keras seed-generator states), every variable of the
optimizer (slots, `iterations`, a variable learning rate), everything else the
model tracks in its attributes (its own optimizers, seed generators and metrics
outside `model.variables`, `tf.Variable`s: `tracked`), any extra trackable
state the caller adds (e.g. a `tf.random.Generator`), and the counters
`global_step`, `epoch` and `step_in_epoch`. The input pipeline's position is the
global step: a deterministic pipeline skips that many batches on resume.

Every backup also records a run fingerprint (`fingerprint.RunFingerprint`):
the variables' stable paths, shapes and dtypes, the optimizer class, the
mixed-precision policy and the caller's run settings. A restart that differs
is refused before anything is loaded or any backup touched. Variables are
restored by stable path (attribute names, see `paths`), not by Keras's
per-process layer names (`dense_3`), so layers created in another order still
get their own weights; by position only where no stable path exists, with a
warning. Nothing non-finite is ever backed up.
"""

import contextlib
import dataclasses
import logging
from typing import Mapping

import tensorflow as tf

from tfdist._internal.preconditions import check_whole_number
from tfdist.backups.completion import Completion, check_completion, completion_metadata
from tfdist.backups.fingerprint import (
    RunFingerprint,
    check_changeable,
    check_run_settings,
    compare,
    compare_tracked,
    fingerprint_of,
)
from tfdist.backups.finite import FiniteCheck
from tfdist.backups.store import BackupInfo, BackupStore, CorruptBackupError
from tfdist.backups.sync import WorkerSync
from tfdist.backups.tracked import (
    TrackedState,
    build_saved_optimizers,
    ensure_built,
    entries_of,
    tracked_state,
)
from tfdist.errors import BackupMismatchError, NonFiniteError, UsageError

__all__ = ["FitSegment", "ResumePoint", "TrainingBackup"]

_log = logging.getLogger(__name__)


# The checkpoint's own entries (see `TrainingBackup._trackables`).
_RESERVED = ("model_variables", "optimizer_variables", "tracked")


def _check_positive(name: str, value) -> int:
    return check_whole_number(name, value, minimum=1)


@dataclasses.dataclass(frozen=True)
class FitSegment:
    """One `model.fit` call of a resumed run.

    Attributes:
        initial_epoch: Pass as `fit(initial_epoch=...)`.
        epochs: Pass as `fit(epochs=...)`.
        steps_per_epoch: Pass as `fit(steps_per_epoch=...)`; shorter than an
            epoch for the rest of an interrupted epoch.
        first_step: Global index of this segment's first batch: skip that many
            batches of an input stream that starts at step 0 and runs across
            epochs (`dataset.repeat()` iterated once).
        first_step_in_epoch: Index of the first batch within its epoch: skip
            that many batches of a dataset that restarts every epoch.
    """

    initial_epoch: int
    epochs: int
    steps_per_epoch: int | None
    first_step: int
    first_step_in_epoch: int

    def fit_kwargs(self) -> dict:
        """`initial_epoch`, `epochs` and `steps_per_epoch` for `model.fit`."""
        return {
            "initial_epoch": self.initial_epoch,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
        }


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where training continues.

    Attributes:
        global_step: Optimizer steps already applied (0 on a fresh start).
        epoch: The epoch that step falls in.
        step_in_epoch: Steps of `epoch` already applied.
        completed: Training finished before; nothing is left to run.
        backup_path: The backup restored, if any.
        epoch_logs: The logs of the last epoch completed before the backup
            (what `fit` reported for it), if the backup recorded them.
        stopped: A callback had stopped training (`model.stop_training`, e.g.
            `EarlyStopping`) when the backup was taken: nothing is left to run,
            whatever `epochs` the restart asks for.
        steps_per_epoch: The steps of one epoch, as the backup recorded them.
        metadata: The backup's metadata (empty without a backup).
    """

    global_step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    completed: bool = False
    backup_path: str | None = None
    epoch_logs: Mapping | None = None
    stopped: bool = False
    steps_per_epoch: int | None = dataclasses.field(default=None, compare=False)
    metadata: Mapping = dataclasses.field(default_factory=dict, compare=False)

    def segments(self, *, epochs: int, steps_per_epoch: int | None) -> tuple[FitSegment, ...]:
        """The `fit` calls that run the rest of `epochs` epochs exactly once.

        Keras `fit` starts only at an epoch boundary, so a run interrupted in
        the middle of an epoch resumes with one short `fit` over the rest of
        that epoch, then one over the remaining whole epochs.

        Args:
            epochs: Total epochs of the job.
            steps_per_epoch: Steps per epoch; `None` when the dataset decides,
                which only resumes from backups taken at an epoch boundary.

        Returns:
            Zero, one or two segments, in order.

        Raises:
            UsageError: Bad arguments, or a mid-epoch backup without
                `steps_per_epoch`.
        """
        _check_positive("epochs", epochs)
        if self.completed or self.stopped:
            return ()
        if steps_per_epoch is None:
            if self.step_in_epoch and self.steps_per_epoch is None:
                raise UsageError(
                    f"the backup at step {self.global_step} stops {self.step_in_epoch} "
                    f"steps into epoch {self.epoch} of unknown length, expected "
                    f"steps_per_epoch to resume there exactly; pass steps_per_epoch=N "
                    f"(the number of batches in one epoch) to fit"
                )
            if self.epoch >= epochs:
                return ()
            if self.step_in_epoch:
                rest = self.steps_per_epoch - self.step_in_epoch
                return (
                    FitSegment(
                        self.epoch, self.epoch + 1, rest, self.global_step, self.step_in_epoch
                    ),
                    *(
                        (FitSegment(self.epoch + 1, epochs, None, self.global_step + rest, 0),)
                        if self.epoch + 1 < epochs
                        else ()
                    ),
                )
            return (FitSegment(self.epoch, epochs, None, self.global_step, 0),)
        _check_positive("steps_per_epoch", steps_per_epoch)
        epoch, step_in_epoch = divmod(self.global_step, steps_per_epoch)
        result = []
        if step_in_epoch and epoch < epochs:
            result.append(
                FitSegment(
                    epoch,
                    epoch + 1,
                    steps_per_epoch - step_in_epoch,
                    self.global_step,
                    step_in_epoch,
                )
            )
            epoch += 1
        if epoch < epochs:
            result.append(FitSegment(epoch, epochs, steps_per_epoch, epoch * steps_per_epoch, 0))
        return tuple(result)


class TrainingBackup:
    """Saves and restores a Keras model's full training state in a store.

    Every worker of a synchronous job holds one, calls `restore` once before
    training and `save` at the same steps: saves and restores take part in
    collectives, and the restored step is checked to agree across workers.

    Args:
        store: Where backups go.
        model: A built Keras model; its compiled optimizer is saved too.
        sync: Cross-worker agreement; `None` for one process.
        extra_state: Named trackables saved alongside, e.g.
            `{"rng": tf.random.Generator}`.
        strategy: The strategy the model was built under (the optimizer is
            built in its scope when it has not been yet).
        run_settings: What else decides what the next step computes, recorded
            in every backup and compared on restore, e.g. `{"global_batch_size":
            64, "seed": 1, "dataset": "mnist", "steps_per_epoch": 500}`. JSON
            values only.
        changeable: Fields that may differ on restart, mapped to why that is
            safe, e.g. `{"epochs": "constant learning rate"}`; a difference is
            then logged in one line instead of refused. Keys are run-settings
            names, `"dtype_policy"` or `"optimizer"`.
        check_finite: Refuse to back up NaN/Inf variables (`NonFiniteError`).
    """

    def __init__(
        self,
        store: BackupStore,
        model,
        *,
        sync: WorkerSync | None = None,
        extra_state: Mapping[str, object] | None = None,
        strategy: tf.distribute.Strategy | None = None,
        run_settings: Mapping | None = None,
        changeable: Mapping | None = None,
        check_finite: bool = True,
    ):
        self._run_settings = check_run_settings(run_settings)
        self._changeable = check_changeable(changeable)
        self._check_finite = bool(check_finite)
        self.store = store
        self.model = model
        self.sync = sync or WorkerSync(None)
        self._extra_state = dict(extra_state or {})
        reserved = set(_RESERVED) & set(self._extra_state)
        if reserved:
            raise UsageError(f"extra_state uses reserved name(s) {sorted(reserved)}; rename them")
        self._strategy = strategy
        self._checkpoint = None
        self._tracked_checkpoint = None
        self._fingerprint = None
        self._finite_check = None
        self.last_saved_step: int | None = None
        self.completion: Completion | None = None

    @property
    def optimizer(self):
        return getattr(self.model, "optimizer", None)

    def _variable_shapes(self) -> list[list]:
        return [list(variable.shape) for variable in self.model.variables]

    def _trackables(
        self,
        *,
        model_order: list[int] | None = None,
        optimizer_order: list[int] | None = None,
        tracked: TrackedState | None = None,
    ) -> dict:
        """Everything a backup holds, by checkpoint name: the one place that says so.

        Args:
            model_order: Which of `model.variables` goes in each saved position
                (the backup's order on restore); `None`: their own order.
            optimizer_order: The same for the compiled optimizer's variables.
            tracked: The model's other state (`tracked.tracked_state`); left
                out when `None` or empty, so that a model without any writes
                and reads the checkpoints it always did.
        """
        model_variables = list(self.model.variables)
        if model_order is not None:
            model_variables = [model_variables[i] for i in model_order]
        parts = {"model_variables": model_variables}
        if self.optimizer is not None:
            optimizer_variables = list(self.optimizer.variables)
            if optimizer_order is not None:
                optimizer_variables = [optimizer_variables[i] for i in optimizer_order]
            parts["optimizer_variables"] = optimizer_variables
        if tracked is not None and tracked.variables:
            parts["tracked"] = dict(tracked.variables)
        return {**parts, **self._extra_state}

    def _ensure_checkpoint(self) -> tf.train.Checkpoint:
        if self._checkpoint is not None:
            return self._checkpoint
        ensure_built(self.model)
        optimizer = self.optimizer
        if optimizer is not None and not optimizer.built:
            scope = self._strategy.scope() if self._strategy else contextlib.nullcontext()
            with scope:
                optimizer.build(self.model.trainable_variables)
        self._checkpoint = tf.train.Checkpoint(**self._trackables())
        self._fingerprint = fingerprint_of(self.model, run_settings=self._run_settings)
        return self._checkpoint

    def _saving_checkpoint(self, tracked: TrackedState) -> tf.train.Checkpoint:
        """The checkpoint of this save: the model's, plus its tracked state as of now."""
        if not tracked.variables:
            return self._ensure_checkpoint()
        keys = tuple((key, id(variable)) for key, variable in tracked.variables.items())
        if self._tracked_checkpoint is None or self._tracked_checkpoint[0] != keys:
            self._tracked_checkpoint = (
                keys,
                tf.train.Checkpoint(**self._trackables(tracked=tracked)),
            )
        return self._tracked_checkpoint[1]

    @property
    def fingerprint(self) -> RunFingerprint:
        """This run's fingerprint, as recorded in its backups."""
        self._ensure_checkpoint()
        return self._fingerprint

    def _reading_checkpoint(
        self,
        model_order: list[int],
        optimizer_order: list[int],
        saved_tracked: tuple | None,
    ) -> tf.train.Checkpoint:
        """A checkpoint whose variable lists are in the backup's order, with its tracked state."""
        tracked = None
        if saved_tracked is None:
            current = tracked_state(self.model)
            if current.variables:
                _log.warning(
                    "The backup in %s was written before tfdist backed up what a model "
                    "tracks beyond its variables and optimizer; %s start from their "
                    "values in this run.",
                    self.store.backup_dir,
                    ", ".join(sorted({key.split("/")[0] for key in current.variables})),
                )
        else:
            tracked = tracked_state(self.model)
            if build_saved_optimizers(tracked, saved_tracked, self.model, strategy=self._strategy):
                tracked = tracked_state(self.model)
            compare_tracked(saved_tracked, entries_of(tracked), backup_dir=self.store.backup_dir)
        identity = model_order == list(range(len(model_order))) and optimizer_order == list(
            range(len(optimizer_order))
        )
        if identity and not (tracked and tracked.variables):
            return self._checkpoint
        if not identity:
            _log.info(
                "The model's variables are in another order than in the backup (layers "
                "created in another order); restoring them by stable path."
            )
        return tf.train.Checkpoint(
            **self._trackables(
                model_order=model_order, optimizer_order=optimizer_order, tracked=tracked
            )
        )

    def _check_legacy(self, info: BackupInfo) -> None:
        _log.warning(
            "The backup at step %d in %s has no run fingerprint (written by an "
            "older tfdist): its settings cannot be checked and its variables are "
            "restored by position.",
            info.step,
            self.store.backup_dir,
        )
        saved = info.metadata.get("model_variable_shapes")
        if saved is not None and saved != self._variable_shapes():
            raise BackupMismatchError(
                f"the backup at step {info.step} in {self.store.backup_dir} holds "
                f"{len(saved)} model variables whose shapes differ from this model's "
                f"{len(self.model.variables)}; it belongs to another model: point the "
                f"backup directory at a new path or delete the old one",
                field="model variable shapes",
            )

    def _read(self, info: BackupInfo) -> None:
        """Checks `info` against this run, then loads it; raises before loading."""
        where = f"at step {info.step} in {self.store.backup_dir}"
        # Every worker's input position is part of the backup: one missing makes it
        # unusable, as a torn file does (the restore falls back to the previous one).
        for name in (info.metadata.get("input_state") or {}).get("files", []):
            if not tf.io.gfile.exists(f"{info.path}/{name}"):
                raise CorruptBackupError(f"{info.path}: {name} is missing")
        record = info.metadata.get("fingerprint")
        if record is None:
            self._check_legacy(info)
            checkpoint = self._checkpoint
        else:
            saved = RunFingerprint.from_json(record, where=where)
            orders = compare(
                saved,
                self._fingerprint,
                backup_dir=self.store.backup_dir,
                changeable=self._changeable,
            )
            checkpoint = self._reading_checkpoint(*orders, saved.tracked)
        try:
            checkpoint.read(info.checkpoint_prefix).assert_existing_objects_matched()
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, AssertionError) as error:
            # The files passed their checks: this is a mismatch, not damage.
            reason = " ".join(str(error).split())[:300]
            raise BackupMismatchError(
                f"the backup {where} cannot be loaded into this run: {reason}; restart "
                f"with the settings it was made with or use a new backup directory",
                field="checkpoint",
            ) from error

    def restore(self, *, load_when_completed: bool = False) -> ResumePoint:
        """Loads the newest good backup; call once, on every worker, before training.

        Args:
            load_when_completed: Load the final backup of a completed job too
                (when it was kept), so that the model holds the trained weights.

        Returns:
            Where to resume. `completed` when a finished run is restarted
            (`backup_path` names the final backup if it was loaded).

        Raises:
            BackupMismatchError: The newest intact backup was made by another
                model, optimizer, precision or run settings; nothing was
                loaded and no backup touched.
            RuntimeError: Workers restored different steps (their backup
                directories differ: use storage every worker can read).
        """
        completion = self.store.completion()
        if completion is not None:
            self._ensure_checkpoint()
            self.completion = check_completion(
                completion,
                fingerprint=self._fingerprint,
                changeable=self._changeable,
                backup_dir=self.store.backup_dir,
                committed_steps=self.store.committed_steps(),
            )
            _log.info(
                "Training already completed at step %d (%s); nothing to resume.",
                completion["step"],
                self.store.backup_dir,
            )
            info = None
            if load_when_completed and completion["step"] in self.store.committed_steps():
                self._ensure_checkpoint()
                info = self.store.restore(self._read)
            if info is None or info.step != completion["step"]:
                return ResumePoint(global_step=completion["step"], completed=True)
            return self._point(info, completed=True)
        self._ensure_checkpoint()
        info = self.store.restore(self._read)
        # Only now: a refused restart must leave the directory exactly as it was.
        self.store.clean_leftovers()
        step = info.step if info else 0
        self.last_saved_step = info.step if info else None
        steps = self.sync.gather(step)
        if len(set(steps)) > 1:
            raise RuntimeError(
                f"workers restored different backups (steps {steps}); every worker must "
                f"read the chief's backups: use a backup directory on storage they all "
                f"share, such as gs://"
            )
        if info is None:
            return ResumePoint()
        metadata = info.metadata
        iterations = metadata.get("optimizer_iterations")
        if iterations is not None and self.optimizer is not None:
            restored = int(self.optimizer.iterations.numpy())
            if restored != iterations:
                _log.warning(
                    "Restored optimizer.iterations=%d but the backup recorded %d.",
                    restored,
                    iterations,
                )
        _log.info("Resuming from the backup at step %d (%s).", info.step, info.path)
        return self._point(info)

    @staticmethod
    def _point(info: BackupInfo, completed: bool = False) -> ResumePoint:
        metadata = info.metadata
        steps_per_epoch = metadata.get("steps_per_epoch")
        return ResumePoint(
            global_step=info.step,
            epoch=int(metadata.get("epoch", 0)),
            step_in_epoch=int(metadata.get("step_in_epoch", 0)),
            completed=completed,
            backup_path=info.path,
            epoch_logs=metadata.get("epoch_logs"),
            stopped=bool(metadata.get("stopped", False)),
            steps_per_epoch=int(steps_per_epoch) if steps_per_epoch else None,
            metadata=dict(metadata),
        )

    def save(
        self,
        *,
        global_step: int,
        epoch: int,
        step_in_epoch: int,
        steps_per_epoch: int | None = None,
        extra_metadata: Mapping | None = None,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> BackupInfo | None:
        """Backs up the current state; every worker calls it at the same step.

        Returns once the chief's backup has committed on every worker.
        `extra_files` (name to bytes) are written beside the checkpoint and
        checked like its own files.

        Raises:
            NonFiniteError: A model or optimizer variable holds NaN or Inf
                (with `check_finite`); nothing was written.
        """
        self._ensure_checkpoint()
        tracked = tracked_state(self.model)
        checkpoint = self._saving_checkpoint(tracked)
        if self._check_finite:
            self._assert_finite(global_step, tracked)
        metadata = {
            "global_step": global_step,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "steps_per_epoch": steps_per_epoch,
            "num_workers": self.sync.num_workers,
            "model_variable_shapes": self._variable_shapes(),
            "fingerprint": dataclasses.replace(
                self._fingerprint, tracked=entries_of(tracked)
            ).to_json(),
            **dict(extra_metadata or {}),
        }
        if self.optimizer is not None:
            metadata["optimizer_iterations"] = int(self.optimizer.iterations.numpy())

        def write(prefix: str) -> None:
            checkpoint.write(prefix)
            directory = prefix.rsplit("/", 1)[0] if "/" in prefix else "."
            for name, data in (extra_files or {}).items():
                if "/" in name:
                    tf.io.gfile.makedirs(f"{directory}/{name.rsplit('/', 1)[0]}")
                with tf.io.gfile.GFile(f"{directory}/{name}", "wb") as handle:
                    handle.write(data)

        info = self.store.save(write, step=global_step, metadata=metadata)
        self.sync.barrier()
        self.last_saved_step = global_step
        if info is not None:
            _log.info("Backed up step %d to %s.", global_step, info.path)
        return info

    def _assert_finite(self, global_step: int, tracked: TrackedState) -> None:
        keys = tuple((key, id(variable)) for key, variable in tracked.variables.items())
        if self._finite_check is None or self._finite_check[0] != keys:
            fingerprint = self._fingerprint
            named = [
                (path or variable.path, variable)
                for (path, _, _), variable in zip(fingerprint.model_variables, self.model.variables)
            ]
            if self.optimizer is not None:
                named += [
                    (f"optimizer {key or variable.path}", variable)
                    for (key, _, _), variable in zip(
                        fingerprint.optimizer_variables, self.optimizer.variables
                    )
                ]
            named += list(tracked.variables.items())
            self._finite_check = (keys, FiniteCheck(named))
        bad = self._finite_check[1].non_finite()
        if self.sync.any(bool(bad)):
            where = (
                f"{bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
                if bad
                else "another worker's variables"
            )
            last = (
                f"the last backup (step {self.last_saved_step}) holds finite values"
                if self.last_saved_step is not None
                else "no backup was made"
            )
            raise NonFiniteError(
                f"non-finite values (NaN or Inf) in {where} at step {global_step}; not "
                f"backed up, {last}; lower the learning rate or check the input data"
            )

    def finish(
        self, *, global_step: int, delete_backups: bool, outputs: Mapping | None = None
    ) -> None:
        """Records completion (then deletes backups if asked); the chief writes.

        The record holds this run's fingerprint and `outputs` (where the job's
        outputs went, e.g. `{"model_dir": ...}`), checked by a restart
        (`tfdist.backups.completion`).
        """
        self._ensure_checkpoint()
        self.store.mark_completed(
            step=global_step, metadata=completion_metadata(self._fingerprint, outputs)
        )
        if delete_backups:
            self.store.delete_backups()
