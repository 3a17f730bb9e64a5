"""Issue #10 checks with 2 real workers (MultiWorkerMirroredStrategy on loopback).

Every worker reaches the same verdict on its own, so none is left waiting in a
collective: a restart with another global batch exits 2 on both workers with
one line each and leaves the backups byte for byte; a NaN stops both with 3
before it is backed up.
"""

import os
import pathlib
import sys

import pytest

from tests.support.backup_files import snapshot
from tfdist import cli

JOB = [sys.executable, "-m", "tests.jobs.resume_checks_job"]
WORKERS = ("worker:0", "worker:1")
PROCESS_TIMEOUT = 240


def _env(tmp_path: pathlib.Path) -> dict:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir(exist_ok=True)
    return {"TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(scratch)}


def _run(local_cluster, tmp_path, *args) -> tuple[dict, object]:
    cluster = local_cluster(num_workers=2, env=_env(tmp_path), command=[*JOB, *args])
    cluster.start()
    # Each worker must stop on its own: no task is stopped for another's failure.
    return cluster.wait(timeout=PROCESS_TIMEOUT, stop_on_failure=False), cluster


def _error_lines(cluster, task: str) -> list[str]:
    return [line for line in cluster.log(task).splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_two_workers_refuse_a_changed_global_batch_and_touch_no_backup(local_cluster, tmp_path):
    backup_dir = tmp_path / "backup"
    codes, cluster = _run(local_cluster, tmp_path, f"--backup_dir={backup_dir}")
    assert codes == {task: 0 for task in WORKERS}, cluster.format_logs()
    (backup_dir / "COMPLETED.json").unlink()  # as if the job had been killed at its end
    before = snapshot(backup_dir)

    codes, cluster = _run(
        local_cluster,
        tmp_path,
        f"--backup_dir={backup_dir}",
        "--global_batch_size=32",
        "--epochs=2",
    )

    assert codes == {task: cli.EXIT_USAGE for task in WORKERS}, cluster.format_logs()
    for task in WORKERS:
        assert _error_lines(cluster, task) == [
            f"error: the backup in {backup_dir} was made with global_batch_size=16, this run "
            f"has 32; restart with the same value or use a new backup directory"
        ], cluster.format_logs()
    assert snapshot(backup_dir) == before


@pytest.mark.slow
def test_two_workers_stop_on_nan_before_backing_it_up(local_cluster, tmp_path):
    backup_dir = tmp_path / "backup"
    codes, cluster = _run(local_cluster, tmp_path, f"--backup_dir={backup_dir}", "--nan_at_step=5")
    assert codes == {task: cli.EXIT_NON_FINITE for task in WORKERS}, cluster.format_logs()
    for task in WORKERS:
        lines = _error_lines(cluster, task)
        assert len(lines) == 1 and "loss is nan at step 5" in lines[0], cluster.format_logs()
    assert sorted(os.listdir(backup_dir)) == ["backup-000000000002", "backup-000000000004"]
