"""Step-exact resume and preemption handling for an existing Keras training script.

Three lines change in a script that already trains with `model.fit`:

    import tfdist.resumable                                   # 1: import
    strategy = tfdist.resumable.strategy_from_environment()   # 2: instead of MirroredStrategy()
    ...
    tfdist.resumable.fit(model, dataset, backup_dir=DIR, epochs=10)  # 3: instead of model.fit

`strategy_from_environment` reads `TF_CONFIG` / `CLUSTER_SPEC` and builds the
strategy the cluster calls for (`auto`), with the Keras 3 multi-worker
corrections applied. `fit` restores the newest backup in `backup_dir`, runs the
`model.fit` calls that finish training exactly once, backs up atomically (the
chief only), and on SIGTERM saves at an agreed step and exits with code 143.
Run again after any stop: it resumes at the exact step, with the history and
the state of the script's callbacks; a finished job's rerun trains nothing and
leaves the trained weights in the model. With several workers, only the
chief's callback files and `write_path(...)` files land where they were asked.

Resume is exact when the dataset is deterministic: either an endless stream
(`.repeat()`) iterated across epochs, which resumes by skipping the steps
already taken, or a finite dataset that yields the same batches in every
epoch, which resumes by skipping the steps already taken in the interrupted
epoch. A dataset reshuffled every epoch with a random seed cannot resume
exactly; use `tfdist.data.training_batches` for a seeded permutation per pass.
"""

import logging
import os
import sys

import keras
import tensorflow as tf

from tfdist import cli
from tfdist._internal.peers import PEER_FAILURES
from tfdist.callbacks import BackupAndRestore
from tfdist.distribute import strategy as strategy_lib
from tfdist.distribute import worker_files
from tfdist.distribute.cluster import resolve_cluster, resolve_cluster_for_strategy
from tfdist.errors import DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS, UsageError
from tfdist.preemption import PreemptionOptions

_log = logging.getLogger(__name__)


class PeerLost(SystemExit):
    """Another task of a multi-worker job was lost mid-training: exits with 200.

    200 is `tfdist.cli.EXIT_PEER_LOST`, a code restart policies retry (TFJob's
    `ExitCode` retries >= 128; Vertex AI and Ray restart the job); the restarted
    job resumes from the last backup. Raised by `fit` in place of the
    collective's error, after one line on stderr.
    """

    def __init__(self):
        super().__init__(cli.EXIT_PEER_LOST)


def strategy_from_environment(
    name: str = "auto", *, options: strategy_lib.StrategyOptions | None = None
):
    """The strategy for the cluster `TF_CONFIG` or `CLUSTER_SPEC` describes.

    Call it before any other TensorFlow operation (a multi-worker strategy
    must be configured at program start).

    Args:
        name: A strategy name (`tfdist.distribute.choice.STRATEGIES`); `auto`
            chooses from the cluster and the machine, and logs why.
        options: Implementation choices.
    """
    options = options or strategy_lib.StrategyOptions()
    cluster = resolve_cluster_for_strategy(os.environ, name)
    return strategy_lib.make_strategy(name, cluster, options)


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


def fit(
    model: keras.Model,
    x: tf.data.Dataset,
    *,
    backup_dir: str,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    save_freq="epoch",
    callbacks=None,
    preemption: PreemptionOptions | None = PreemptionOptions(),
    max_restarts_without_progress: int | None = DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS,
    run_settings=None,
    changeable=None,
    **fit_kwargs,
) -> keras.callbacks.History:
    """`model.fit(x, epochs=..., ...)` that resumes from `backup_dir` at the exact step.

    What a resume keeps (docs/fault_tolerance.md): the weights, optimizer and
    learning rate, the epoch and step, the history, the metrics of an
    interrupted epoch, the state of `callbacks` (Keras's `EarlyStopping`,
    `ReduceLROnPlateau`, `ModelCheckpoint`, `CSVLogger`, and any callback with
    `get_state()` / `set_state(state)`), and what epoch-end callbacks changed.
    The final backup stays: a rerun of a finished job (also one stopped early)
    trains nothing and leaves the trained weights in `model`.

    Args:
        model: A compiled model.
        x: A deterministic `tf.data.Dataset` of batches: endless (then
            `steps_per_epoch` is required) or finite (one epoch per pass).
        backup_dir: Where backups go; the same directory on every restart.
        epochs: Total epochs of the job, as in `model.fit`.
        steps_per_epoch: As in `model.fit`; without it, a finite dataset
            resumes mid-epoch with the epoch length its backup recorded.
        save_freq: `"epoch"` or a number of steps between backups.
        callbacks: More Keras callbacks; they run before the backup. On
            workers other than the chief their files go to `write_path(...)`.
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
        **fit_kwargs: Passed to every `model.fit` call (`verbose`,
            `validation_data`, ...), except `initial_epoch` and `shuffle`.

    Returns:
        The `History` of every epoch of the job, including those run before a
        restart (on a rerun of a finished job: all of them, as they were).

    Raises:
        UsageError: A bad argument, an endless dataset without
            `steps_per_epoch`, or a finished job whose final backup is gone.
        tfdist.preemption.Preempted: After SIGTERM, once the backup is saved
            (a `SystemExit` with code 143).
        CrashLoopError: The job restarted more than `max_restarts_without_progress`
            times from its newest backup without committing a new one.
        PeerLost: Another task of a multi-worker job died or became unreachable
            (a `SystemExit` with code 200, which restart policies retry).
    """
    for reserved in ("initial_epoch", "shuffle", "x"):
        if reserved in fit_kwargs:
            raise UsageError(
                f"fit got {reserved}=..., which tfdist.resumable.fit sets itself; remove it"
            )
    if not isinstance(x, tf.data.Dataset):
        raise UsageError(
            f"x is a {type(x).__name__}, expected a tf.data.Dataset of batches "
            f"(wrap arrays with tf.data.Dataset.from_tensor_slices(...).batch(n))"
        )
    endless = int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    if endless and steps_per_epoch is None:
        raise UsageError(
            "x repeats forever but steps_per_epoch is not set, expected the "
            "number of steps in one epoch; pass steps_per_epoch=N"
        )
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
        run_settings=run_settings,
        changeable=changeable,
    )
    segments = backup.resume(
        model, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks
    )
    if backup.completed:
        _check_final_backup(backup)
    try:
        for segment in segments:
            skip = segment.first_step if endless else segment.first_step_in_epoch
            model.fit(
                x.skip(skip) if skip else x,
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
        print(
            f"error: {cli.describe_lost_peer(error)} (exit {cli.EXIT_PEER_LOST})",
            file=sys.stderr,
            flush=True,
        )
        raise PeerLost() from None
    except BaseException:
        backup.release()  # this process writes no more backups: a restart need not wait
        raise
    if not backup.completed:
        # A restart from the final backup of a run that ended before recording it.
        backup.complete()
    return _history(model, backup)


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
