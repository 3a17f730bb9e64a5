"""Issue #10 checks with 2 real workers (MultiWorkerMirroredStrategy on loopback).

Every worker reaches the same verdict on its own, so none is left waiting in a
collective: a NaN stops both with 3 before it is backed up; a restart of that
job's backup with another global batch exits 2 on both workers with one line
each and leaves the backups byte for byte.
"""

import os
import pathlib
import shutil
import sys

import pytest

from tests.support.backup_files import snapshot
from tfdist import cli
from tfdist.launch.local_cluster import LocalCluster
from tfdist.launch.testing import SHARED_PRELOADERS

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


@pytest.fixture(scope="module")
def nan_stopped(tmp_path_factory) -> tuple[dict, LocalCluster, pathlib.Path]:
    """A 2-worker job with a NaN in the batch of step 5 (backups every 2 steps).

    Both tests use it: one checks the stop, the other restarts what it left (its
    backups, no completion record: a job to resume) with another global batch.

    Returns:
        The exit codes, the (closed) cluster for its logs, the backup directory.
    """
    tmp_path = tmp_path_factory.mktemp("nan")
    backup_dir = tmp_path / "backup"
    with LocalCluster(
        preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
        num_workers=2,
        env=_env(tmp_path),
        log_dir=tmp_path / "logs",
        command=[*JOB, f"--backup_dir={backup_dir}", "--nan_at_step=5"],
    ) as cluster:
        codes = cluster.wait(timeout=PROCESS_TIMEOUT, stop_on_failure=False)
    return codes, cluster, backup_dir


def test_two_workers_stop_on_nan_before_backing_it_up(nan_stopped):
    codes, cluster, backup_dir = nan_stopped
    assert codes == {task: cli.EXIT_NON_FINITE for task in WORKERS}, cluster.format_logs()
    for task in WORKERS:
        lines = _error_lines(cluster, task)
        assert len(lines) == 1 and "loss is nan at step 5" in lines[0], cluster.format_logs()
    assert sorted(os.listdir(backup_dir)) == ["backup-000000000002", "backup-000000000004"]


def test_two_workers_refuse_a_changed_global_batch_and_touch_no_backup(
    local_cluster, tmp_path, nan_stopped
):
    _, stopped, stopped_backup = nan_stopped
    assert sorted(os.listdir(stopped_backup)) == [
        "backup-000000000002",
        "backup-000000000004",
    ], stopped.format_logs()
    backup_dir = tmp_path / "backup"
    shutil.copytree(stopped_backup, backup_dir)
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
