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
Run again after any stop: it resumes at the exact step.

Resume is exact when the dataset is deterministic: either an endless stream
(`.repeat()`) iterated across epochs, which resumes by skipping the steps
already taken, or a finite dataset that yields the same batches in every
epoch, which resumes by skipping the steps already taken in the interrupted
epoch. A dataset reshuffled every epoch with a random seed cannot resume
exactly; use `tfdist.data.training_batches` for a seeded permutation per pass.
"""

import os

import keras
import tensorflow as tf

from tfdist import strategy as strategy_lib
from tfdist.callbacks import BackupAndRestore
from tfdist.cluster import resolve_cluster_for_strategy
from tfdist.errors import UsageError
from tfdist.preemption import PreemptionOptions


def strategy_from_environment(name: str = "auto", *,
                              options: strategy_lib.StrategyOptions | None = None):
    """The strategy for the cluster `TF_CONFIG` or `CLUSTER_SPEC` describes.

    Call it before any other TensorFlow operation (a multi-worker strategy
    must be configured at program start).

    Args:
        name: A strategy name (`tfdist.strategy_choice.STRATEGIES`); `auto`
            chooses from the cluster and the machine, and logs why.
        options: Implementation choices.
    """
    options = options or strategy_lib.StrategyOptions()
    cluster = resolve_cluster_for_strategy(os.environ, name)
    return strategy_lib.make_strategy(name, cluster, options)


def fit(model: keras.Model, x: tf.data.Dataset, *, backup_dir: str, epochs: int = 1,
        steps_per_epoch: int | None = None, save_freq="epoch", callbacks=None,
        preemption: PreemptionOptions | None = PreemptionOptions(),
        **fit_kwargs) -> keras.callbacks.History:
    """`model.fit(x, epochs=..., ...)` that resumes from `backup_dir` at the exact step.

    Args:
        model: A compiled model.
        x: A deterministic `tf.data.Dataset` of batches: endless (then
            `steps_per_epoch` is required) or finite (one epoch per pass).
        backup_dir: Where backups go; the same directory on every restart.
        epochs: Total epochs of the job, as in `model.fit`.
        steps_per_epoch: As in `model.fit`; without it, a finite dataset
            resumes at epoch boundaries only.
        save_freq: `"epoch"` or a number of steps between backups.
        callbacks: More Keras callbacks; they run before the backup.
        preemption: What SIGTERM does; None leaves signals alone.
        **fit_kwargs: Passed to every `model.fit` call (`verbose`,
            `validation_data`, ...), except `initial_epoch` and `shuffle`.

    Returns:
        The `History` of the epochs run in this process (empty when an earlier
        run had already finished).

    Raises:
        UsageError: A bad argument, or an endless dataset without `steps_per_epoch`.
        tfdist.preemption.Preempted: After SIGTERM, once the backup is saved
            (a `SystemExit` with code 143).
    """
    for reserved in ("initial_epoch", "shuffle", "x"):
        if reserved in fit_kwargs:
            raise UsageError(f"fit got {reserved}=..., which tfdist.resumable.fit sets itself; "
                             f"remove it")
    if not isinstance(x, tf.data.Dataset):
        raise UsageError(f"x is a {type(x).__name__}, expected a tf.data.Dataset of batches "
                         f"(wrap arrays with tf.data.Dataset.from_tensor_slices(...).batch(n))")
    endless = int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    if endless and steps_per_epoch is None:
        raise UsageError("x repeats forever but steps_per_epoch is not set, expected the "
                         "number of steps in one epoch; pass steps_per_epoch=N")
    backup = BackupAndRestore(backup_dir, save_freq=save_freq, preemption=preemption)
    segments = backup.resume(model, epochs=epochs, steps_per_epoch=steps_per_epoch)
    history = keras.callbacks.History()
    history.set_model(model)
    history.on_train_begin()
    for segment in segments:
        skip = segment.first_step if endless else segment.first_step_in_epoch
        run = model.fit(x.skip(skip) if skip else x, callbacks=[*(callbacks or []), backup],
                        shuffle=False, **segment.fit_kwargs(), **fit_kwargs)
        history.epoch.extend(run.epoch)
        for name, values in run.history.items():
            history.history.setdefault(name, []).extend(values)
    return history
