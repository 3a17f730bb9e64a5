"""Storage faults are one line: a full disk, read-only storage, a directory that cannot be made.

On real small filesystems (a tmpfs of a given size, remounted read-only), mounted for the
test and unmounted in teardown; skipped where this process may not mount. What a user
observes: a `StorageError` naming the path and the cause (`trainer.task` and
`tfdist.resumable.fit` exit 74 with it in one line), found at start when the storage is
read-only, and the last committed backup intact and restorable after a full disk.
"""

import errno
import os
import pathlib
import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import tfdist.resumable
from tfdist import cli
from tfdist._internal.storage import check_writable
from tfdist.backups.store import BackupStore
from tfdist.callbacks import BackupAndRestore
from tfdist.distribute.cluster import resolve_cluster
from tfdist.errors import StorageError
from trainer import config as config_lib
from trainer import run as run_lib

# One backup of the trainer's built-in mlp is ~870 KB (measured): 1.5 MB holds one, not two.
ONE_BACKUP_ONLY = "1500k"


@pytest.fixture
def tmpfs(tmp_path):
    """`mount(name, size, read_only=False)`: a tmpfs of `size` at tmp_path/name."""
    mounted = []

    def mount(name: str, size: str, *, read_only: bool = False) -> pathlib.Path:
        target = tmp_path / name
        target.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(target)
        if read_only:
            remount(target, "ro")
        return target

    def remount(target: pathlib.Path, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(target)], check=True, timeout=30)

    mount.remount = remount
    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], check=False, timeout=30)


def _trainer_config(**overrides) -> config_lib.ExperimentConfig:
    values = dict(
        strategy="default",
        epochs=1,
        steps_per_epoch=20,
        num_examples=1280,
        steps_per_execution=10,
        backup_every_steps=10,
    )
    values.update(overrides)
    return config_lib.ExperimentConfig(**values)


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _dataset() -> tf.data.Dataset:
    x = np.arange(64 * 4, dtype="float32").reshape(64, 4) / 256
    return tf.data.Dataset.from_tensor_slices((x, x[:, :2])).batch(8)


class _CountSteps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


def test_read_only_backup_dir_is_refused_at_start_in_one_line(tmpfs, tmp_path):
    read_only = tmpfs("ro", "1m", read_only=True)
    config = _trainer_config(backup_dir=str(read_only / "backups"), model_dir=str(tmp_path / "m"))
    with pytest.raises(StorageError) as raised:
        run_lib.run(config, resolve_cluster({}), environ={})
    message = str(raised.value)
    assert f"'{read_only / 'backups'}'" in message and "read-only file system" in message
    assert "--backup_dir" in message  # the start-time check, not the first save
    assert "\n" not in message
    # The check leaves nothing behind (the model dir it probed did not exist before).
    assert not (tmp_path / "m").exists()


def test_full_backup_disk_keeps_the_last_backup_and_the_rerun_resumes_from_it(tmpfs, tmp_path):
    disk = tmpfs("full", ONE_BACKUP_ONLY)
    backups = disk / "backups"
    config = _trainer_config(backup_dir=str(backups), model_dir=str(tmp_path / "m"))
    with pytest.raises(StorageError) as raised:
        run_lib.run(config, resolve_cluster({}), environ={})
    message = str(raised.value)
    assert "step 20" in message and f"'{backups}'" in message
    assert "no space left on the device" in message and "free of" in message
    # Step 10 is committed and whole; the torn step-20 copy was removed (its space given back).
    store = BackupStore(str(backups))
    assert store.committed_steps() == [10]
    assert store.validate(10).step == 10
    assert sorted(os.listdir(backups)) == ["backup-000000000010"]

    tmpfs.remount(disk, "size=4m")  # someone freed space
    summary = run_lib.run(config, resolve_cluster({}), environ={})
    assert summary["resumed_from_step"] == 10 and summary["steps_completed"] == 20


def test_full_model_dir_names_the_model_dir(tmpfs):
    disk = tmpfs("model", "300k")
    config = _trainer_config(steps_per_epoch=2, steps_per_execution=1, model_dir=str(disk / "out"))
    config = config.replace(backup_every_steps=0)
    with pytest.raises(StorageError) as raised:
        run_lib.run(config, resolve_cluster({}), environ={})
    assert f"the model and summary.json to '{disk / 'out'}'" in str(raised.value)
    assert not (disk / "out" / "summary.json").exists()


def test_backup_store_on_a_full_disk_keeps_the_committed_backup(tmpfs):
    disk = tmpfs("store", "256k")
    store = BackupStore(str(disk / "b"))
    variable = tf.Variable(tf.zeros([1000]))

    def write(prefix):
        tf.train.Checkpoint(v=variable).write(prefix)

    store.save(write, step=1, metadata={"note": "kept"})
    (disk / "filler").write_bytes(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize))
    with pytest.raises(StorageError, match="no space left on the device"):
        store.save(write, step=2, metadata={})
    assert store.committed_steps() == [1]
    assert store.validate(1).metadata == {"note": "kept"}
    (disk / "filler").unlink()
    assert store.save(write, step=2, metadata={}).step == 2


def test_backup_and_restore_on_read_only_storage_stops_before_the_first_step(tmpfs):
    read_only = tmpfs("ro", "1m", read_only=True)
    counter = _CountSteps()
    backup = BackupAndRestore(str(read_only / "b"), save_freq=2, preemption=None)
    with pytest.raises(StorageError, match="read-only file system"):
        _model().fit(_dataset(), epochs=1, callbacks=[counter, backup], shuffle=False, verbose=0)
    assert counter.steps == 0


def test_resumable_fit_exits_74_in_one_line(tmpfs, capsys):
    read_only = tmpfs("ro", "1m", read_only=True)
    counter = _CountSteps()
    with pytest.raises(SystemExit) as exit_info:
        tfdist.resumable.fit(
            _model(),
            _dataset(),
            backup_dir=str(read_only / "b"),
            callbacks=[counter],
            preemption=None,
            verbose=0,
        )
    assert exit_info.value.code == cli.EXIT_STORAGE == 74
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "read-only" in err[0], err
    assert counter.steps == 0


def test_a_directory_that_cannot_be_created_is_one_storage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="not a directory|exists where a directory"):
        check_writable(str(tmp_path / "file" / "backups"), "the backup directory")
    with pytest.raises(StorageError, match="exists where a directory"):
        check_writable(str(tmp_path / "file"), "the backup directory")


def test_tensorflow_filesystems_are_checked_through_gfile(tmpfs):
    read_only = tmpfs("ro", "1m", read_only=True)
    with pytest.raises(StorageError, match="read-only file system"):
        check_writable(f"file://{read_only}/b", "the backup directory")
    check_writable("ram://storage-check/b", "the backup directory")  # writable: no error
    assert tf.io.gfile.listdir("ram://storage-check/b") == []


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device", "/data/x"),
        tf.errors.PermissionDeniedError(None, None, "/data/b; Read-only file system"),
        StorageError("cannot write the backup '/data/b': read-only file system", cause="ro"),
    ],
)
def test_every_entry_point_reports_storage_faults_as_exit_74_in_one_line(error, capsys):
    def main(argv):
        raise error

    with flagsaver.flagsaver(), pytest.raises(SystemExit) as exit_info:
        cli.run(main, ["prog"])
    assert exit_info.value.code == cli.EXIT_STORAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "/data/" in err[0], err


def test_an_out_of_memory_error_is_not_a_storage_fault():
    assert StorageError.cause_of(tf.errors.ResourceExhaustedError(None, None, "OOM")) is None


@pytest.mark.parametrize(
    "error, cause",
    [
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
        (OSError(errno.EACCES, "Permission denied", "/x"), "permission denied"),
        (
            tf.errors.NotFoundError(None, None, "gs://nob/b; The specified bucket does not exist."),
            "the bucket does not exist",
        ),
        (
            tf.errors.PermissionDeniedError(
                None, None, "sa@p.iam does not have storage.objects.create access to gs://b/x"
            ),
            "permission denied (storage.objects.create)",
        ),
    ],
)
def test_storage_causes_are_named(error, cause):
    assert StorageError.cause_of(error) == cause
