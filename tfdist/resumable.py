"""Step-exact resume and preemption handling for an existing Keras training script.

Three lines change in a script that already trains with `model.fit`:

    import tfdist.resumable                                   # 1: import
    strategy = tfdist.resumable.strategy_from_environment()   # 2: instead of MirroredStrategy()
    ...
    tfdist.resumable.fit(model, dataset, backup_dir=DIR, epochs=10)  # 3: instead of model.fit

A script without a strategy calls `set_strategy_from_environment()` at its top
instead of line 2 (no `with strategy.scope():`, nothing re-indented), and
`fit(model, x, y, batch_size=..., validation_split=..., ...)` takes NumPy arrays
as `model.fit` does (`tfdist.data.arrays`: a seeded permutation per epoch).

`strategy_from_environment` reads `TF_CONFIG` / `CLUSTER_SPEC` and builds the
strategy the cluster calls for (`auto`), with the Keras 3 multi-worker
corrections applied. `fit` restores the newest backup in `backup_dir`, runs the
`model.fit` calls that finish training exactly once, backs up atomically (the
chief only), and on SIGTERM saves at an agreed step and exits with code 143.
Run again after any stop: it resumes at the exact step, with the history and
the state of the script's callbacks; a finished job's rerun trains nothing and
leaves the trained weights in the model. With several workers, only the
chief's callback files and `write_path(...)` files land where they were asked.

A `tf.data.Dataset` resumes at its saved position: every worker's iterator
state is committed in each backup with the weights, and a restart restores it,
decoding only what the remaining steps need (`tfdist.data.resume_input`). A
finite dataset is iterated as one stream across epochs (`repeat()`, an epoch
being its length), so a reshuffling shuffle's seed state is in that state;
`strategy_from_environment()` sets TensorFlow's global seed when the script
set none, so an unseeded `shuffle(buffer)` built after it resumes exactly.
Where the position cannot be restored (`from_generator`, a state above
`max_input_state_bytes`, another number of workers) one line says so and a
restart skips the batches already taken. docs/data.md has the table.

In the main thread of a job's task (`TF_CONFIG` or `CLUSTER_SPEC` set) that is
not an interactive session, a `tfdist.errors.UsageError` from these functions is one
`error:` line on stderr and exit code 2, as from tfdist's commands.
"""

import contextlib
import logging
import os
import sys

import keras
import tensorflow as tf

from tfdist import cli
from tfdist._internal import peer_noise
from tfdist._internal.peers import PEER_FAILURES
from tfdist.callbacks import BackupAndRestore
from tfdist.data import arrays as fit_arrays
from tfdist.data.resume_input import DEFAULT_MAX_STATE_BYTES, ResumableInput
from tfdist.distribute import worker_files
from tfdist.distribute.cluster import resolve_cluster

# Re-exported: line 2 of the upgrade (`tfdist.resumable.strategy_from_environment()`).
from tfdist.distribute.strategy import set_strategy_from_environment, strategy_from_environment
from tfdist.errors import DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS, StorageError, UsageError
from tfdist.preemption import PreemptionOptions

__all__ = [
    "StorageFault",
    "PeerLost",
    "fit",
    "set_strategy_from_environment",
    "strategy_from_environment",
    "write_path",
]

_log = logging.getLogger(__name__)


class StorageFault(SystemExit):
    """Storage refused a write (full, read-only, no permission): exits with 74.

    74 is `tfdist.cli.EXIT_STORAGE`, which restart policies do not retry: a
    restart on the same storage fails the same way. The last committed backup
    is intact; free space or fix the storage and run again, it resumes there.
    Raised by `fit` in place of the error, after one line on stderr.
    """

    def __init__(self):
        super().__init__(cli.EXIT_STORAGE)


class PeerLost(SystemExit):
    """Another task of a multi-worker job was lost mid-training: exits with 200.

    200 is `tfdist.cli.EXIT_PEER_LOST`, a code restart policies retry (TFJob's
    `ExitCode` retries >= 128; Vertex AI and Ray restart the job); the restarted
    job resumes from the last backup. Raised by `fit` in place of the
    collective's error, after one line on stderr.
    """

    def __init__(self):
        super().__init__(cli.EXIT_PEER_LOST)


def write_path(path: str) -> str:
    """Where this task writes a file that only the chief should write.

    On the chief (or in a single process) `path` itself; on any other worker
    a path of the same name in this task's own temporary directory, removed
    when the process exits. The pattern of TensorFlow's multi-worker guide:
    every worker still runs the same code (a save may take part in
    collectives), but only the chief's file lands where you asked.

        model.save(tfdist.resumable.write_path(f"{out}/model.keras"))

    `fit` already applies it to the files of `ModelCheckpoint`, `CSVLogger`
    and `TensorBoard` callbacks.
    """
    return worker_files.write_path(path, resolve_cluster(os.environ))


@cli.usage_errors_exit_in_jobs
def fit(  # pylint: disable=too-many-arguments  (keras.Model.fit's, in its order)
    model: keras.Model,
    x=None,
    y=None,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose="auto",
    callbacks=None,
    validation_split: float = 0.0,
    validation_data=None,
    shuffle: bool = True,
    class_weight=None,
    sample_weight=None,
    initial_epoch=None,
    steps_per_epoch: int | None = None,
    *,
    backup_dir: str,
    validation_batch_size: int | None = None,
    seed: int | None = None,
    save_freq="epoch",
    preemption: PreemptionOptions | None = PreemptionOptions(),
    max_restarts_without_progress: int | None = DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS,
    run_settings=None,
    changeable=None,
    max_input_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    **fit_kwargs,
) -> keras.callbacks.History:
    """`model.fit(x, y, ...)` that resumes from `backup_dir` at the exact step.

    The arguments up to `steps_per_epoch` are `keras.Model.fit`'s, in its
    order (so `model.fit(...)` becomes `tfdist.resumable.fit(model, ...,
    backup_dir=...)`); the rest are keyword-only.

    What a resume keeps (docs/fault_tolerance.md): the weights, optimizer and
    learning rate, the epoch and step, the history, the metrics of an
    interrupted epoch, the state of `callbacks` (Keras's `EarlyStopping`,
    `ReduceLROnPlateau`, `ModelCheckpoint`, `CSVLogger`, and any callback with
    `get_state()` / `set_state(state)`), and what epoch-end callbacks changed.
    The final backup stays: a rerun of a finished job (also one stopped early)
    trains nothing and leaves the trained weights in `model`.

    Args:
        model: A compiled model.
        x: As in `model.fit`: NumPy arrays (a list or dict of them for
            several inputs; tensors and DataFrames are read as arrays), or a
            deterministic `tf.data.Dataset` of batches, endless (then
            `steps_per_epoch` is required) or finite (one epoch per pass). A
            Python generator or a `keras.utils.PyDataset` is refused in one
            line (wrap a generator in `tf.data.Dataset.from_generator`).
        y: The labels, with arrays `x` (None for a dataset, which holds them).
        batch_size: With arrays: examples per step, all replicas together
            (the global batch), as `model.fit` under a strategy; default 32.
            Each epoch is one pass over the arrays in batches of it, the last
            one partial. Refused with a dataset (already batched).
        epochs: Total epochs of the job, as in `model.fit`.
        verbose: As in `model.fit`.
        callbacks: More Keras callbacks; they run before the backup. On
            workers other than the chief their files go to `write_path(...)`.
        validation_split: With arrays, as in `model.fit`: this fraction of
            the examples, taken from the end before any shuffling, is held out
            and evaluated after each epoch (unless `validation_data` is given).
        validation_data: As in `model.fit`: a dataset, or a tuple `(x_val,
            y_val[, val_sample_weight])` of arrays.
        shuffle: With arrays: a new permutation every epoch, a function of
            `seed` and the epoch's pass only, so a restart resumes it at the
            exact step; False keeps the arrays' order. Ignored for a dataset
            (as `model.fit` ignores it): shuffle the dataset with a seed.
        class_weight: As in `model.fit`.
        sample_weight: With arrays, as in `model.fit`.
        initial_epoch: Refused: the backup decides where training starts.
        steps_per_epoch: As in `model.fit`; without it, a finite dataset
            resumes mid-epoch with the epoch length its backup recorded, and
            arrays take one pass per epoch. With arrays and a number, epochs
            follow one another along the passes (a new pass, reshuffled,
            begins where the last ends).
        backup_dir: Where backups go; the same directory on every restart.
        validation_batch_size: Batch of validation arrays (default:
            `batch_size`).
        seed: Fixes the arrays' permutation per epoch; default TensorFlow's
            global seed (`keras.utils.set_random_seed(n)` sets it), else a
            fixed value. The backup records it (and the arrays' length and
            `batch_size`): a restart with other values is refused.
        save_freq: `"epoch"` or a number of steps between backups.
        preemption: What SIGTERM does; None leaves signals alone.
        run_settings: Settings your script decides the steps with (e.g.
            `{"learning_rate": 0.01, "batch_size": 64}`), recorded in every
            backup and in the completion record: a rerun with other values is
            refused (`tfdist.errors.BackupMismatchError`, exit 2), also after
            the job finished. See `BackupAndRestore(run_settings=...)`.
        changeable: Of those, the ones a rerun may change, each with why.
        max_restarts_without_progress: Reruns allowed from one backup without
            committing a new one; one more raises `tfdist.errors.CrashLoopError`
            (exit 4 under `tfdist.cli.run`) before training. None: no limit.
        max_input_state_bytes: Largest iterator state of a dataset `x` saved
            per worker with each backup (a shuffle's buffer is part of it);
            above it none is saved and a restart skips, as one line says.
        **fit_kwargs: Passed to every `model.fit` call (`validation_steps`,
            `validation_freq`, ...).

    Returns:
        The `History` of every epoch of the job, including those run before a
        restart (on a rerun of a finished job: all of them, as they were).

    Raises:
        UsageError: A bad argument, an endless dataset without
            `steps_per_epoch`, or a finished job whose final backup is gone.
            In the main thread of a job's task (`TF_CONFIG` or
            `CLUSTER_SPEC` set, as under `tfdist.launch`, Vertex AI or
            Kubeflow) that is not an interactive session, it is printed as
            one `error:` line and the process exits with code 2 instead
            (`tfdist.cli.usage_errors_exit`).
        tfdist.preemption.Preempted: After SIGTERM, once the backup is saved
            (a `SystemExit` with code 143).
        StorageFault: Storage refused a write: full, read-only, a missing bucket,
            permission denied (a `SystemExit` with code 74, one line on stderr).
        CrashLoopError: The job restarted more than `max_restarts_without_progress`
            times from its newest backup without committing a new one.
        PeerLost: Another task of a multi-worker job died or became unreachable
            (a `SystemExit` with code 200, which restart policies retry).
    """
    if initial_epoch is not None:
        raise UsageError(
            f"fit got initial_epoch={initial_epoch!r}, which tfdist.resumable.fit sets itself "
            f"from the backup; remove it"
        )
    fit_kwargs["verbose"] = verbose
    if class_weight is not None:
        fit_kwargs["class_weight"] = class_weight
    inputs = fit_arrays.fit_inputs(
        x,
        y,
        batch_size=batch_size,
        shuffle=shuffle,
        sample_weight=sample_weight,
        validation_split=validation_split,
        validation_data=validation_data,
        validation_batch_size=validation_batch_size,
        seed=seed,
    )
    arrays = inputs.training
    if arrays is not None and steps_per_epoch is None:
        steps_per_epoch = arrays.steps_per_pass
    if inputs.validation_data is not None:
        fit_kwargs["validation_data"] = inputs.validation_data
    endless = arrays is not None or int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    if endless and steps_per_epoch is None:
        raise UsageError(
            "x repeats forever but steps_per_epoch is not set, expected the "
            "number of steps in one epoch; pass steps_per_epoch=N"
        )
    try:
        return _fit(
            model,
            x,
            backup_dir=backup_dir,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            save_freq=save_freq,
            callbacks=callbacks,
            preemption=preemption,
            endless=endless,
            arrays=arrays,
            max_input_state_bytes=max_input_state_bytes,
            max_restarts_without_progress=max_restarts_without_progress,
            run_settings=run_settings,
            changeable=changeable,
            **fit_kwargs,
        )
    except StorageError as error:
        print(
            f"error: {cli.describe_storage_fault(error)} (exit {cli.EXIT_STORAGE})",
            file=sys.stderr,
            flush=True,
        )
        raise StorageFault() from None


def _fit(
    model,
    x,
    *,
    backup_dir,
    epochs,
    steps_per_epoch,
    save_freq,
    callbacks,
    preemption,
    endless,
    arrays,
    max_input_state_bytes,
    max_restarts_without_progress,
    run_settings,
    changeable,
    **fit_kwargs,
):
    callbacks = list(callbacks or [])
    cluster = resolve_cluster(os.environ)
    worker_files.redirect_callbacks(callbacks, cluster)
    backup = BackupAndRestore(
        backup_dir,
        save_freq=save_freq,
        preemption=preemption,
        delete_checkpoint=False,
        restore_completed=True,
        cluster=cluster,
        max_restarts_without_progress=max_restarts_without_progress,
        run_settings=_run_settings(run_settings, arrays),
        changeable=changeable,
    )
    training_input = None
    if arrays is None:
        point = backup.restore(model)
        training_input = ResumableInput(
            x,
            steps_per_epoch=steps_per_epoch or point.steps_per_epoch,
            strategy=model.distribute_strategy,
            max_state_bytes=max_input_state_bytes,
        )
        backup.input_state = training_input
        steps_per_epoch, endless = training_input.steps_per_epoch, training_input.endless
    segments = backup.resume(
        model, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks
    )
    if backup.completed:
        _check_final_backup(backup)
    # The position of a user's dataset: restored from the backup (each worker its
    # own iterator state), else the batches already taken are skipped.
    restored = True
    capture = contextlib.nullcontext()
    if training_input is not None:
        point = backup.resume_point
        restored = not point.global_step or training_input.restore_from(
            point.backup_path, point.metadata.get("input_state")
        )
        capture = training_input.capture()
    hold = peer_noise.HeldPeerNoise() if cluster.num_workers > 1 else contextlib.nullcontext()
    try:
        with hold, capture:
            for number, segment in enumerate(segments):
                if arrays is not None:  # a stream built from the step: nothing to skip
                    data = arrays.training_batches(segment.first_step)
                elif restored:
                    data = training_input.dataset_for(0)
                    if number:
                        training_input.carry_over()
                else:
                    skip = segment.first_step if endless else segment.first_step_in_epoch
                    data = training_input.dataset_for(skip)
                model.fit(
                    data,
                    callbacks=_around_backup(callbacks, backup),
                    shuffle=False,
                    **segment.fit_kwargs(),
                    **fit_kwargs,
                )
                if backup.completed or model.stop_training:
                    break
    except PEER_FAILURES as error:
        backup.release()
        if cluster.num_workers < 2:
            raise
        # Before TensorFlow's C++ lines about the aborted collective (held back).
        peer_noise.write_first(
            f"error: {cli.describe_lost_peer(error)} (exit {cli.EXIT_PEER_LOST})\n"
        )
        raise PeerLost() from None
    except BaseException:
        backup.release()  # this process writes no more backups: a restart need not wait
        raise
    if not backup.completed:
        # A restart from the final backup of a run that ended before recording it.
        backup.complete()
    return _history(model, backup)


def _run_settings(run_settings, arrays) -> dict | None:
    """The script's own run settings and, with arrays, the arrays' (seed, length, batch)."""
    settings = {**(run_settings or {}), **(arrays.run_settings() if arrays is not None else {})}
    return settings or None


def _check_final_backup(backup: BackupAndRestore) -> None:
    if not backup.restored_final_backup:
        raise UsageError(
            f"{backup.backup_dir} records that training completed at step "
            f"{backup.resumed_from_step}, but its final backup is gone, so the trained "
            f"weights cannot be restored and fit would return an untrained model; load the "
            f"model your script saved, or delete {backup.backup_dir} to train again"
        )
    _log.info(
        "Training had completed at step %d: restored its final backup from %s, not "
        "training again (delete the directory to train anew).",
        backup.resumed_from_step,
        backup.backup_dir,
    )


def _history(model: keras.Model, backup: BackupAndRestore) -> keras.callbacks.History:
    history = keras.callbacks.History()
    history.set_model(model)
    record = backup.history
    history.epoch = record["epoch"]
    history.history = record["history"]
    return history


def _around_backup(callbacks: list, backup: BackupAndRestore) -> list:
    """The script's callbacks, the backup after them, and after it those that read backups.

    The backup runs after the callbacks whose state it saves (epoch-end changes
    are kept); a callback with `reads_backups = True` (e.g.
    `tfdist.ray.ReportBackups`) runs after it, so it sees the backup of the
    same step, the final one included.
    """
    readers = [callback for callback in callbacks if getattr(callback, "reads_backups", False)]
    others = [callback for callback in callbacks if callback not in readers]
    return [*others, backup, *readers]
