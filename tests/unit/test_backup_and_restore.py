"""`tfdist.callbacks.BackupAndRestore` in one process: arguments, resume plans,
step-exact resume, completion, and the guards against replaying steps.

Killing a real process is in tests/multiprocess/test_preemption.py.
"""

import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.fault_injection import CrashAfterBatches
from tfdist.backups import FitSegment, ResumePoint
from tfdist.callbacks import BackupAndRestore
from tfdist.errors import UsageError

EPOCHS, STEPS = 3, 10


@pytest.mark.parametrize(
    "save_freq", [False, True, 0, -1, -50, 1.5, 2.0, "steps", "Epoch", None, "10"]
)
def test_bad_save_freq_is_a_one_line_usage_error(tmp_path, save_freq):
    with pytest.raises(
        UsageError,
        match=r"save_freq is .*, expected 'epoch' or a whole "
        r"number of steps > 0",
    ) as error:
        BackupAndRestore(str(tmp_path), save_freq=save_freq)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backup_dir": ""}, "backup_dir is ''"),
        ({"backup_dir": "/tmp/x", "delete_checkpoint": "yes"}, "delete_checkpoint is 'yes'"),
        ({"backup_dir": "/tmp/x", "keep": 0}, "keep is 0"),
        ({"backup_dir": "/tmp/x", "preemption": 30}, "preemption is 30"),
    ],
)
def test_other_bad_arguments_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BackupAndRestore(**kwargs)


def test_good_save_freq_values_are_kept(tmp_path):
    assert BackupAndRestore(str(tmp_path), save_freq="epoch").save_freq == "epoch"
    assert BackupAndRestore(str(tmp_path), save_freq=1).save_freq == 1


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, [FitSegment(0, 3, 10, 0, 0)]),
        (10, [FitSegment(1, 3, 10, 10, 0)]),
        (16, [FitSegment(1, 2, 4, 16, 6), FitSegment(2, 3, 10, 20, 0)]),
        (29, [FitSegment(2, 3, 1, 29, 9)]),
        (30, []),
    ],
)
def test_resume_segments_run_every_remaining_step_once(step, expected):
    segments = ResumePoint(global_step=step).segments(epochs=EPOCHS, steps_per_epoch=STEPS)
    assert list(segments) == expected
    assert sum(s.steps_per_epoch * (s.epochs - s.initial_epoch) for s in segments) == 30 - step


def test_mid_epoch_resume_without_steps_per_epoch_is_refused():
    point = ResumePoint(global_step=16, epoch=1, step_in_epoch=6)
    with pytest.raises(UsageError, match="expected steps_per_epoch"):
        point.segments(epochs=EPOCHS, steps_per_epoch=None)
    assert ResumePoint(global_step=20, epoch=2).segments(epochs=3, steps_per_epoch=None) == (
        FitSegment(2, 3, None, 20, 0),
    )


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3, seed=3),
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def _stream() -> tf.data.Dataset:
    features = np.random.RandomState(0).rand(256, 4).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, features.sum(1, keepdims=True)))
    return dataset.shuffle(256, seed=5).batch(8, drop_remainder=True).repeat()


def _train(backup_dir: str, *, crash_at: int = 0, **kwargs) -> tuple[keras.Model, BackupAndRestore]:
    model = _model()
    backup = BackupAndRestore(backup_dir, save_freq=4, preemption=None, **kwargs)
    extra = [CrashAfterBatches(crash_at)] if crash_at else []
    for segment in backup.resume(model, epochs=EPOCHS, steps_per_epoch=STEPS):
        model.fit(
            _stream().skip(segment.first_step),
            verbose=0,
            shuffle=False,
            callbacks=[backup, *extra],
            **segment.fit_kwargs(),
        )
    return model, backup


def _assert_same_weights(expected: keras.Model, actual: keras.Model) -> None:
    for want, got in zip(expected.get_weights(), actual.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory) -> str:
    """A backup directory left by a run that crashed after step 17."""
    backup_dir = str(tmp_path_factory.mktemp("crashed") / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(backup_dir, crash_at=17)
    return backup_dir


@pytest.fixture
def crashed_backup(crashed_run, tmp_path) -> str:
    """A private copy of `crashed_run`'s backup directory."""
    return shutil.copytree(crashed_run, tmp_path / "backup")


def test_crash_mid_epoch_then_resume_equals_uninterrupted_run(crashed_backup, tmp_path):
    reference, _ = _train(str(tmp_path / "reference"))
    backup_dir = str(crashed_backup)
    # (and the lease of the run that crashed in this process: tfdist.backups.lease)
    assert sorted(os.listdir(backup_dir)) == [
        "LEASE.json",
        "backup-000000000012",
        "backup-000000000016",
    ]

    resumed, backup = _train(backup_dir)

    assert backup.resumed_from_step == 16
    assert backup.global_step == 30 and int(resumed.optimizer.iterations.numpy()) == 30
    _assert_same_weights(reference, resumed)
    assert os.listdir(backup_dir) == ["COMPLETED.json"]


def test_finished_job_restarted_does_not_train_again(tmp_path):
    backup_dir = str(tmp_path)
    _train(backup_dir)
    model = _model()
    backup = BackupAndRestore(backup_dir, save_freq=4, preemption=None)
    assert backup.resume(model, epochs=EPOCHS, steps_per_epoch=STEPS) == ()
    assert backup.completed and backup.resumed_from_step == 30
    with pytest.raises(UsageError, match="records that training completed at step 30"):
        model.fit(_stream(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0, callbacks=[backup])
    assert int(model.optimizer.iterations.numpy()) == 0


def test_keep_backup_option_keeps_the_last_backups(tmp_path):
    _train(str(tmp_path), delete_checkpoint=False)
    assert sorted(os.listdir(tmp_path)) == [
        "COMPLETED.json",
        "backup-000000000028",
        "backup-000000000030",
    ]


def test_plain_fit_after_a_mid_epoch_backup_refuses_to_replay(crashed_backup):
    backup_dir = str(crashed_backup)
    model = _model()
    backup = BackupAndRestore(backup_dir, save_freq=4, preemption=None)
    with pytest.raises(UsageError, match="fit starts epoch 0 but training resumes at epoch 1"):
        model.fit(_stream(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0, callbacks=[backup])
    assert int(model.optimizer.iterations.numpy()) == 16  # restored, nothing replayed


def test_wrong_length_for_the_rest_of_an_epoch_is_refused(crashed_backup):
    backup_dir = str(crashed_backup)
    model = _model()
    backup = BackupAndRestore(backup_dir, save_freq=4, preemption=None)
    backup.resume(model, epochs=EPOCHS, steps_per_epoch=STEPS)
    with pytest.raises(UsageError, match="expected steps_per_epoch=4"):
        model.fit(
            _stream(),
            initial_epoch=1,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            verbose=0,
            callbacks=[backup],
        )


def test_epoch_frequency_backs_up_at_epoch_ends(tmp_path):
    model = _model()
    backup = BackupAndRestore(
        str(tmp_path), save_freq="epoch", delete_checkpoint=False, preemption=None
    )
    model.fit(_stream(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0, callbacks=[backup])
    assert sorted(os.listdir(tmp_path)) == [
        "COMPLETED.json",
        "backup-000000000020",
        "backup-000000000030",
    ]
    assert backup.completed
