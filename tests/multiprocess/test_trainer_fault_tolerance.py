"""`python -m trainer.task` with --backup_dir: preemption, resume, completion.

Runs the trainer as real processes: SIGTERM after a backup exists, exit 143,
restart, and compare the final model with an uninterrupted run's.
"""

import json
import os
import pathlib
import shutil
import signal
import sys

import keras
import numpy as np
import pytest

from tests.support.backup_files import committed_steps
from tests.support.logged_process import finish, log_tail, start_logged
from tfdist.cli import EXIT_PREEMPTED
from tfdist.launch.testing import poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 300
EPOCHS, STEPS_PER_EPOCH = 2, 60
TRAIN_FLAGS = [
    "--model=mlp",
    "--dataset=synthetic",
    "--num_examples=1024",
    f"--epochs={EPOCHS}",
    f"--steps_per_epoch={STEPS_PER_EPOCH}",
    "--global_batch_size=32",
    "--backup_every_steps=10",
    "--deterministic",
    "--seed=3",
]
# The single-process SIGTERM test trains 350 steps after its first backup (about 0.7 s
# here): room for the signal that follows that backup to land before training ends.
PREEMPTED_STEPS_PER_EPOCH = 180
LONGER = (f"--steps_per_epoch={PREEMPTED_STEPS_PER_EPOCH}",)  # overrides TRAIN_FLAGS'
# One process (`--strategy=auto` picks `default` here too), the SIGTERM test's length.
SINGLE = ("--strategy=default", *LONGER)


def _start(
    tmp_path: pathlib.Path,
    name: str,
    backup_dir: pathlib.Path,
    *extra: str,
    launcher: tuple[str, ...] = (),
):
    model_dir = tmp_path / name
    model_dir.mkdir()
    return start_logged(
        [
            *launcher,
            sys.executable,
            "-m",
            "trainer.task",
            *TRAIN_FLAGS,
            f"--model_dir={model_dir}",
            f"--backup_dir={backup_dir}",
            *extra,
        ],
        model_dir,
        cwd=REPO,
    )


def _finish(process, timeout: float = TIMEOUT) -> int:
    return finish(process, timeout)


def _run(tmp_path, name, backup_dir, *extra, launcher=()):
    process = _start(tmp_path, name, backup_dir, *extra, launcher=launcher)
    code = _finish(process)
    assert code == 0, f"{name} exited {code}:\n{log_tail(process)}"
    return process


def _weights(model_dir: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True, compile=False)
    return [np.asarray(weight) for weight in model.get_weights()]


def _summary(model_dir: pathlib.Path) -> dict:
    return json.loads((model_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def finished_single(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """One process run from start to end without interruption (`SINGLE`, `--keep_backup`).

    The SIGTERM test's uninterrupted reference, and (copied) the single-process case of
    the restart after the last step: the same flags, and `--keep_backup` changes no step.

    Returns:
        Its model directory and its backup directory.
    """
    tmp_path = tmp_path_factory.mktemp("finished-single")
    backup_dir = tmp_path / "backup"
    finished = _run(tmp_path, "finished", backup_dir, "--keep_backup", *SINGLE)
    return finished.out, backup_dir


def test_sigterm_exits_143_and_the_restart_ends_equal_to_an_uninterrupted_run(
    tmp_path, finished_single
):
    reference_dir, _ = finished_single
    backup_dir = tmp_path / "backup"
    victim = _start(tmp_path, "preempted", backup_dir, *SINGLE)
    try:
        poll_until(
            lambda: committed_steps(backup_dir) or victim.poll() is not None,
            timeout=TIMEOUT,
            what="the first backup",
        )
        assert victim.poll() is None, log_tail(victim)
        victim.send_signal(signal.SIGTERM)
        code = _finish(victim, timeout=60)
    finally:
        _finish(victim, timeout=1)
    assert code == EXIT_PREEMPTED, log_tail(victim)
    total = EPOCHS * PREEMPTED_STEPS_PER_EPOCH
    assert _summary(reference_dir)["steps_completed"] == total
    assert _summary(reference_dir)["resumed_from_step"] == 0
    notice_step = committed_steps(backup_dir)[-1]
    assert 0 < notice_step < total
    assert f"stopping after step {notice_step}" in log_tail(victim)
    assert not (victim.out / "summary.json").exists()

    resumed = _run(tmp_path, "resumed", backup_dir, *SINGLE)

    summary = _summary(resumed.out)
    assert summary["resumed_from_step"] == notice_step
    assert summary["steps_completed"] == total
    for want, got in zip(_weights(reference_dir), _weights(resumed.out), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert os.listdir(backup_dir) == ["COMPLETED.json"]

    # Restarted by accident after it finished: no training, outputs untouched.
    before = (resumed.out / "model.keras").read_bytes()
    again = _run(tmp_path, "again", backup_dir, *SINGLE, f"--model_dir={resumed.out}")
    assert "not training again" in log_tail(again)
    assert (resumed.out / "model.keras").read_bytes() == before


def test_two_workers_sigterm_to_one_exit_143_then_resume(local_cluster, tmp_path):
    backup_dir = tmp_path / "backup"
    model_dir = tmp_path / "model"
    command = [
        sys.executable,
        "-m",
        "trainer.task",
        *TRAIN_FLAGS,
        "--strategy=multiworker",
        f"--backup_dir={backup_dir}",
        f"--model_dir={model_dir}",
    ]
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    cluster = local_cluster(num_workers=2, command=command, env=env)
    cluster.start()
    poll_until(lambda: committed_steps(backup_dir), timeout=TIMEOUT, what="the first backup")
    assert cluster.kill("worker:1", signal.SIGTERM), cluster.format_logs()
    codes = cluster.wait(timeout=60, stop_on_failure=False)
    assert codes == {"worker:0": EXIT_PREEMPTED, "worker:1": EXIT_PREEMPTED}, cluster.format_logs()
    notice_step = committed_steps(backup_dir)[-1]
    assert all(name.startswith("backup-") for name in os.listdir(backup_dir)), os.listdir(
        backup_dir
    )

    restarted = local_cluster(num_workers=2, command=command, env=env)
    restarted.start()
    codes = restarted.wait(timeout=TIMEOUT)

    assert codes == {"worker:0": 0, "worker:1": 0}, restarted.format_logs()
    summary = _summary(model_dir)
    assert summary["resumed_from_step"] == notice_step > 0
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    assert summary["num_workers"] == 2
    assert os.listdir(backup_dir) == ["COMPLETED.json"]


def _crash_after_the_last_step(model_dir: pathlib.Path, backup_dir: pathlib.Path) -> None:
    """Leaves what a job killed after its last backup but before its outputs leaves.

    The finished run kept its backups (--keep_backup); removing the outputs and the
    completion record is the state of a job that died during its final evaluate or save.
    """
    (backup_dir / "COMPLETED.json").unlink()
    (model_dir / "model.keras").unlink()
    (model_dir / "summary.json").unlink()


_LAUNCH = (sys.executable, "-m", "tfdist.launch", "--timeout=240")
# The clusters' runs are shorter than TRAIN_FLAGS': what is checked is the restart after
# the last step, whichever step that is. The single process is `finished_single`.
CLUSTER_STEPS_PER_EPOCH = 20
_CLUSTER_STEPS = (f"--steps_per_epoch={CLUSTER_STEPS_PER_EPOCH}",)
LAST_STEP_CASES = {  # launcher, strategy flags, steps in all
    "default": ((), SINGLE, EPOCHS * PREEMPTED_STEPS_PER_EPOCH),
    "multiworker": (
        (*_LAUNCH, "--workers=2", "--"),
        ("--strategy=multiworker", *_CLUSTER_STEPS),
        EPOCHS * CLUSTER_STEPS_PER_EPOCH,
    ),
    "parameter_server": (
        (*_LAUNCH, "--chief", "--workers=1", "--ps=1", "--"),
        ("--strategy=parameter_server", "--nodeterministic", *_CLUSTER_STEPS),
        EPOCHS * CLUSTER_STEPS_PER_EPOCH,
    ),
}


def _finished(request, tmp_path, launcher, strategy_flags) -> tuple[pathlib.Path, pathlib.Path]:
    """A run from start to end with `--keep_backup`: its model and backup directories."""
    backup_dir = tmp_path / "backup"
    if not launcher:  # the single process: a copy of the one the SIGTERM test compares with
        model_dir, finished_backup = request.getfixturevalue("finished_single")
        shutil.copytree(model_dir, tmp_path / "finished")
        shutil.copytree(finished_backup, backup_dir)
        return tmp_path / "finished", backup_dir
    finished = _run(
        tmp_path, "finished", backup_dir, "--keep_backup", *strategy_flags, launcher=launcher
    )
    return finished.out, backup_dir


@pytest.mark.parametrize(
    "launcher, strategy_flags, total", LAST_STEP_CASES.values(), ids=LAST_STEP_CASES.keys()
)
def test_a_restart_after_the_last_step_writes_the_outputs_and_trains_nothing(
    request, tmp_path, launcher, strategy_flags, total
):
    model_dir, backup_dir = _finished(request, tmp_path, launcher, strategy_flags)
    summary = _summary(model_dir)
    weights = _weights(model_dir)
    _crash_after_the_last_step(model_dir, backup_dir)
    steps_before = committed_steps(backup_dir)

    again = _run(
        tmp_path,
        "again",
        backup_dir,
        f"--model_dir={model_dir}",
        "--keep_backup",
        *strategy_flags,
        launcher=launcher,
    )
    assert "Epoch " not in log_tail(again), "no step may run again"
    resumed = _summary(model_dir)
    assert resumed["steps_completed"] == total
    assert resumed["resumed_from_step"] == total
    for key in ("final_loss", "metrics", "steps_per_epoch", "global_batch_size", "strategy"):
        assert resumed[key] == summary[key], key
    for got, want in zip(_weights(model_dir), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (backup_dir / "COMPLETED.json").exists()
    assert committed_steps(backup_dir) == steps_before, "no backup may be lost"
