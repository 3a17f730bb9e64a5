"""A backup directory belongs to one job: its completion record is checked before it is trusted.

Issue 32, first row: job B (other settings) started on the directory of a finished job A
trained nothing and exited 0; a valid completion record dropped beside a run's backups
did the same. Both are refused now, and nothing in the directory changes.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

import tfdist.resumable
from tests.support.backup_files import committed_steps, snapshot, without_bookkeeping
from tests.support.fault_injection import AfterBatches, CrashAfterBatches
from tests.unit.test_backup_and_restore import EPOCHS, STEPS, _model, _stream, _train
from tfdist.backups.fingerprint import fingerprint_of
from tfdist.backups.lease import BackupInUseError, BackupLease, digest, job_identity, process_start
from tfdist.callbacks import BackupAndRestore
from tfdist.errors import BackupMismatchError, CrashLoopError

SETTINGS = {"learning_rate": 0.01, "global_batch_size": 8}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished job's directory (final backups kept) and one whose backups were deleted."""
    root = tmp_path_factory.mktemp("finished")
    kept, deleted = root / "kept", root / "deleted"
    _train(str(kept), run_settings=SETTINGS, delete_checkpoint=False)
    _train(str(deleted), run_settings=SETTINGS)
    return kept, deleted


@pytest.fixture
def finished(finished_run, tmp_path):
    kept, deleted = finished_run
    return shutil.copytree(kept, tmp_path / "kept"), shutil.copytree(deleted, tmp_path / "deleted")


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    """Backups (steps 12, 16) of a run that crashed after step 17."""
    backup_dir = tmp_path_factory.mktemp("crashed") / "backup"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(str(backup_dir), crash_at=17)
    (backup_dir / "LEASE.json").unlink()  # as when the crashed process exited
    return backup_dir


@pytest.fixture
def crashed_copy(crashed_run, tmp_path):
    return shutil.copytree(crashed_run, tmp_path / "backup")


def _restart(backup_dir, **kwargs) -> BackupAndRestore:
    backup = BackupAndRestore(str(backup_dir), save_freq=4, preemption=None, **kwargs)
    backup.resume(_model(), epochs=EPOCHS, steps_per_epoch=STEPS)
    return backup


@pytest.mark.parametrize("which", ["kept", "deleted"])
def test_a_job_with_other_settings_on_a_finished_jobs_directory_is_refused(finished, which):
    backup_dir = finished[0] if which == "kept" else finished[1]
    before = snapshot(backup_dir)
    with pytest.raises(BackupMismatchError, match="learning_rate=0.01, this run has 0.5") as error:
        _restart(backup_dir, run_settings={**SETTINGS, "learning_rate": 0.5})
    assert "\n" not in str(error.value)
    assert snapshot(backup_dir) == before


def test_the_same_job_rerun_finds_its_completion_and_where_its_outputs_went(tmp_path):
    backup_dir = tmp_path / "backup"
    _train(str(backup_dir), run_settings=SETTINGS, outputs={"model_dir": "/runs/a"})
    record = json.loads((backup_dir / "COMPLETED.json").read_text())
    assert record["user"]["outputs"] == {"model_dir": "/runs/a"}
    assert record["user"]["fingerprint"]["run"] == SETTINGS

    backup = _restart(backup_dir, run_settings=SETTINGS)

    assert backup.completed and backup.completion.step == EPOCHS * STEPS
    assert backup.completion.outputs == {"model_dir": "/runs/a"}


@pytest.fixture
def crashed_with_dropped_marker(finished, tmp_path):
    """Backups of a run that crashed at step 17, and a valid completion record dropped beside them."""
    backup_dir = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(str(backup_dir), crash_at=17, run_settings=SETTINGS)
    shutil.copy(finished[1] / "COMPLETED.json", backup_dir / "COMPLETED.json")
    return backup_dir


def test_a_completion_record_dropped_beside_a_runs_backups_is_refused(crashed_with_dropped_marker):
    backup_dir = crashed_with_dropped_marker
    before = without_bookkeeping(snapshot(backup_dir))
    with pytest.raises(BackupMismatchError, match="completed at step 30, but the newest") as error:
        _restart(backup_dir, run_settings=SETTINGS)
    assert "delete" in str(error.value) and "resume from step 16" in str(error.value)
    assert snapshot(backup_dir) == before  # the crashed run's lease (same process) is let go


def test_an_old_style_completion_record_beside_older_backups_is_refused(
    crashed_with_dropped_marker,
):
    backup_dir = crashed_with_dropped_marker
    (backup_dir / "COMPLETED.json").write_text(
        json.dumps({"format": "tfdist-backup/1", "step": 30})
    )
    with pytest.raises(BackupMismatchError, match="newest backup beside it is at step 16"):
        _restart(backup_dir, run_settings=SETTINGS)


def test_resumable_fit_refuses_a_dropped_completion_record(crashed_copy):
    backup_dir = crashed_copy
    (backup_dir / "COMPLETED.json").write_text(
        json.dumps({"format": "tfdist-backup/1", "step": 30})
    )
    model = _model()
    with pytest.raises(BackupMismatchError, match="resume from step 16"):
        tfdist.resumable.fit(
            model,
            _stream(),
            backup_dir=str(backup_dir),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            preemption=None,
            verbose=0,
        )
    assert int(model.optimizer.iterations.numpy()) == 0


# --- Crash loops end (issue 32: a crash at the same step on every start restarted forever) ---


def _crash_from_the_same_backup(backup_dir, **kwargs):
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(str(backup_dir), crash_at=3, **kwargs)  # from step 16: crashes at 19, no backup


def test_restarts_from_one_backup_without_a_new_one_stop_with_the_step_and_the_count(
    crashed_copy,
):
    backup_dir = crashed_copy  # backups at 12 and 16
    for _ in range(2):
        _crash_from_the_same_backup(backup_dir, max_restarts_without_progress=2)
    before = without_bookkeeping(snapshot(backup_dir))
    model = _model()
    with pytest.raises(CrashLoopError) as error:
        BackupAndRestore(
            str(backup_dir), save_freq=4, preemption=None, max_restarts_without_progress=2
        ).resume(model, epochs=EPOCHS, steps_per_epoch=STEPS)
    message = str(error.value)
    assert "restarted 3 times from the backup at step 16" in message and "\n" not in message
    # The counts stay: every further restart stops too.
    assert without_bookkeeping(snapshot(backup_dir)) == before
    assert (backup_dir / "backup-000000000016" / "STARTS.json").exists()
    with pytest.raises(CrashLoopError):
        _train(str(backup_dir), max_restarts_without_progress=2)


def test_a_new_backup_resets_the_count(crashed_copy):
    backup_dir = crashed_copy
    _crash_from_the_same_backup(backup_dir, max_restarts_without_progress=2)
    # Restart 2 from 16 commits 20 before crashing at 23: progress, the count starts again.
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(str(backup_dir), crash_at=7, max_restarts_without_progress=2)
    for _ in range(2):
        _crash_from_the_same_backup(backup_dir, max_restarts_without_progress=2)
    with pytest.raises(CrashLoopError, match="restarted 3 times from the backup at step 20"):
        _train(str(backup_dir), max_restarts_without_progress=2)
    model, backup = _train(str(backup_dir), max_restarts_without_progress=None)
    assert backup.completed and int(model.optimizer.iterations.numpy()) == 30
    assert os.listdir(backup_dir) == ["COMPLETED.json"]


def test_a_crash_before_the_first_backup_is_counted_too(tmp_path):
    backup_dir = tmp_path / "backup"
    for _ in range(3):  # the first start and 2 restarts, each crashing at step 2
        with pytest.raises(RuntimeError, match="simulated crash"):
            _train(str(backup_dir), crash_at=2, max_restarts_without_progress=2)
    with pytest.raises(CrashLoopError, match="restarted 3 times from the start"):
        _train(str(backup_dir), max_restarts_without_progress=2)


def test_resumable_fit_stops_a_crash_loop(crashed_copy):
    backup_dir = crashed_copy
    for _ in range(3):
        _crash_from_the_same_backup(backup_dir)
    with pytest.raises(CrashLoopError, match="restarted 4 times .*max_restarts_without_progress=3"):
        tfdist.resumable.fit(
            _model(),
            _stream(),
            backup_dir=str(backup_dir),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            preemption=None,
            verbose=0,
        )


# --- One writer at a time (issue 32: two jobs on one directory quarantined each other's backups) ---


def _lease_record(**fields) -> dict:
    """A LEASE.json as another process writes it (the format in tfdist.backups.lease)."""
    me = BackupLease("/unused", job="", fingerprint="", lease_seconds=30)._me
    record = {**me, "owner": "another-job", "renewed_at": time.time(), "renewals": 1}
    record.update(fields)
    return record


def _write_lease(backup_dir, record) -> None:
    backup_dir.mkdir(parents=True, exist_ok=True)
    (backup_dir / "LEASE.json").write_text(json.dumps(record))


@pytest.fixture
def live_process():
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    yield process
    process.stdin.close()
    process.wait(timeout=60)


def test_a_second_job_on_a_live_jobs_directory_is_refused_before_it_touches_anything(
    crashed_copy, live_process
):
    _write_lease(
        crashed_copy,
        _lease_record(pid=live_process.pid, process_start=process_start(live_process.pid)),
    )
    before = snapshot(crashed_copy)
    model = _model()
    with pytest.raises(BackupInUseError, match=f"held by process {live_process.pid} on") as error:
        BackupAndRestore(str(crashed_copy), save_freq=4, preemption=None).resume(
            model, epochs=EPOCHS, steps_per_epoch=STEPS
        )
    assert "\n" not in str(error.value) and "use another backup directory" in str(error.value)
    assert snapshot(crashed_copy) == before
    assert int(model.optimizer.iterations.numpy()) == 0


def test_a_restart_after_kill_9_on_the_same_host_takes_over_at_once(crashed_copy, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    _write_lease(crashed_copy, _lease_record(pid=dead.pid, process_start="1"))
    with caplog.at_level(logging.WARNING, logger="tfdist.backups.lease"):
        model, backup = _train(str(crashed_copy))
    assert backup.resumed_from_step == 16 and int(model.optimizer.iterations.numpy()) == 30
    assert f"its process {dead.pid} on this host is gone" in caplog.text
    assert "waiting" not in caplog.text
    assert os.listdir(crashed_copy) == ["COMPLETED.json"]  # the lease is released at the end


def test_a_restart_of_the_same_job_elsewhere_takes_over_at_once(crashed_copy, caplog, monkeypatch):
    monkeypatch.setenv("TFDIST_JOB_ID", "job-7")
    fingerprint = digest(fingerprint_of(_built_model(), run_settings={}).to_json())
    job = job_identity({}, {"TFDIST_JOB_ID": "job-7"})
    _write_lease(crashed_copy, _lease_record(host="another-host", job=job, fingerprint=fingerprint))
    with caplog.at_level(logging.WARNING, logger="tfdist.backups.lease"):
        _, backup = _train(str(crashed_copy))
    assert backup.resumed_from_step == 16
    assert "a restart of the same job" in caplog.text and "waiting" not in caplog.text


def _built_model():
    model = _model()
    model.optimizer.build(model.trainable_variables)
    return model


class _RemoteOwner(threading.Thread):
    """Renews a lease as a live job on another host would, until stopped."""

    def __init__(self, backup_dir, record):
        super().__init__(daemon=True)
        self.backup_dir, self.record, self.stop = backup_dir, record, threading.Event()

    def run(self):
        while not self.stop.wait(0.1):
            self.record = {**self.record, "renewals": self.record["renewals"] + 1}
            _write_lease(self.backup_dir, {**self.record, "renewed_at": time.time()})


def test_a_second_job_elsewhere_is_refused_when_it_sees_the_owner_renew(crashed_copy):
    record = _lease_record(host="another-host", lease_seconds=5.0)
    _write_lease(crashed_copy, record)
    owner = _RemoteOwner(crashed_copy, record)
    owner.start()
    try:
        with pytest.raises(BackupInUseError, match="on another-host"):
            BackupAndRestore(str(crashed_copy), save_freq=4, preemption=None).resume(
                _model(), epochs=EPOCHS, steps_per_epoch=STEPS
            )
    finally:
        owner.stop.set()
        owner.join(timeout=30)
    assert json.loads((crashed_copy / "LEASE.json").read_text())["owner"] == "another-job"


def test_a_lease_nobody_renews_is_taken_over_once_it_expires(crashed_copy, caplog):
    _write_lease(crashed_copy, _lease_record(host="another-host", lease_seconds=1.0))
    with caplog.at_level(logging.WARNING, logger="tfdist.backups.lease"):
        _, backup = _train(str(crashed_copy))
    assert backup.resumed_from_step == 16
    assert "waiting up to 1 s" in caplog.text and "expired" in caplog.text


class _TakeOver(AfterBatches):
    """Another job takes the directory's lease after batch `at`."""

    def __init__(self, at, backup_dir):
        super().__init__(at)
        self.backup_dir = backup_dir

    def act(self):
        _write_lease(self.backup_dir, _lease_record(host="another-host"))


def test_a_job_whose_lease_was_taken_over_writes_no_further_backup(tmp_path):
    backup_dir = tmp_path / "backup"
    model = _model()
    backup = BackupAndRestore(str(backup_dir), save_freq=4, preemption=None)
    with pytest.raises(BackupInUseError, match="another job took over"):
        for segment in backup.resume(model, epochs=EPOCHS, steps_per_epoch=STEPS):
            model.fit(
                _stream(),
                verbose=0,
                callbacks=[_TakeOver(5, backup_dir), backup],
                **segment.fit_kwargs(),
            )
    assert committed_steps(backup_dir) == [4]
    assert json.loads((backup_dir / "LEASE.json").read_text())["owner"] == "another-job"


def test_resumable_fit_lets_go_of_the_lease_when_training_raises(tmp_path):
    backup_dir = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="simulated crash"):
        tfdist.resumable.fit(
            _model(),
            _stream(),
            backup_dir=str(backup_dir),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            save_freq=4,
            callbacks=[CrashAfterBatches(5)],
            preemption=None,
            verbose=0,
        )
    assert sorted(os.listdir(backup_dir)) == ["backup-000000000004"]  # no LEASE.json left


def test_resumable_fit_refuses_a_finished_job_rerun_with_other_run_settings(tmp_path):
    def fit(learning_rate):
        return tfdist.resumable.fit(
            _model(),
            _stream(),
            backup_dir=str(tmp_path / "backup"),
            epochs=1,
            steps_per_epoch=STEPS,
            preemption=None,
            run_settings={"learning_rate": learning_rate},
            verbose=0,
        )

    fit(0.01)
    assert len(fit(0.01).history["loss"]) == 1  # the same job: nothing trains again
    with pytest.raises(BackupMismatchError, match="learning_rate=0.01, this run has 0.02"):
        fit(0.02)
