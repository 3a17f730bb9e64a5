"""Non-finite training stops with its own error before anything non-finite is saved.

A NaN loss (checked every batch from the logs Keras already has) or a NaN/Inf
variable (checked before every backup, in one fused reduction) raises
`NonFiniteError`; the last finite backup stays byte-for-byte; command-line
entry points exit with `tfdist.cli.EXIT_NON_FINITE` and one line on stderr.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.backup_files import snapshot, without_bookkeeping
from tests.support.fault_injection import AfterBatches, CrashAfterBatches
from tfdist import errors
from tfdist.callbacks import BackupAndRestore

STEPS, BATCH = 4, 8


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def _stream(nan_at_batch: int | None = None) -> tf.data.Dataset:
    """Batches in a fixed order, repeated; batch `nan_at_batch` holds a NaN."""
    features = np.random.RandomState(0).rand(STEPS * 4 * BATCH, 4).astype("float32")
    if nan_at_batch is not None:
        features[nan_at_batch * BATCH, 0] = np.nan
    labels = features.sum(1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH).repeat()


def _run(backup_dir, stream, *, crash_at=0, before=()):
    model = _model()
    backup = BackupAndRestore(backup_dir, save_freq=2, preemption=None, delete_checkpoint=False)
    callbacks = [*before, backup, *([CrashAfterBatches(crash_at)] if crash_at else [])]
    for segment in backup.resume(model, epochs=3, steps_per_epoch=STEPS):
        model.fit(
            stream.skip(segment.first_step), verbose=0, callbacks=callbacks, **segment.fit_kwargs()
        )
    return model, backup


def test_nan_loss_stops_the_job_and_the_last_finite_backup_stays(tmp_path):
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(backup_dir, _stream(), crash_at=5)  # after the backup at the end of epoch 0
    finite = without_bookkeeping(snapshot(backup_dir))
    # (and the lease of the run that crashed in this process: tfdist.backups.lease)
    assert sorted(os.listdir(backup_dir)) == [
        "LEASE.json",
        "backup-000000000002",
        "backup-000000000004",
    ]

    # Step 6 (batch index 5) sees a NaN: the loss is NaN, the weights after it too.
    with pytest.raises(errors.NonFiniteError, match="step 6") as error:
        _run(backup_dir, _stream(nan_at_batch=5))
    assert "\n" not in str(error.value) and "step 4" in str(error.value)
    assert without_bookkeeping(snapshot(backup_dir)) == finite


class _PoisonWeights(AfterBatches):
    """Makes a weight infinite after batch `at` (the loss of that batch stays finite)."""

    def act(self) -> None:
        self.model.layers[1].bias.assign([np.inf])


def test_non_finite_variable_is_never_backed_up(tmp_path):
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(errors.NonFiniteError, match=r"layers/dense_1/bias") as error:
        _run(backup_dir, _stream(), before=[_PoisonWeights(at=4)])
    assert "step 4" in str(error.value)
    assert sorted(os.listdir(backup_dir)) == ["backup-000000000002"]


def test_guard_without_backups_stops_on_a_nan_loss():
    from tfdist.callbacks import NonFiniteGuard

    model = _model()
    with pytest.raises(errors.NonFiniteError, match="loss is nan at batch 1 of epoch 0"):
        model.fit(
            _stream(nan_at_batch=1),
            epochs=2,
            steps_per_epoch=STEPS,
            verbose=0,
            callbacks=[NonFiniteGuard()],
        )


def test_guard_without_backups_checks_variables_at_epoch_end():
    from tfdist.callbacks import NonFiniteGuard

    model = _model()
    with pytest.raises(
        errors.NonFiniteError, match=r"in layers/dense_1/bias at the end of epoch 0"
    ):
        model.fit(
            _stream(),
            epochs=2,
            steps_per_epoch=STEPS,
            verbose=0,
            callbacks=[_PoisonWeights(at=STEPS), NonFiniteGuard()],
        )
