"""`python -m trainer.task` with --backup_dir: preemption, resume, completion.

Runs the trainer as real processes: SIGTERM after a backup exists, exit 143,
restart, and compare the final model with an uninterrupted run's.
"""

import json
import os
import pathlib
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


@pytest.mark.slow
def test_sigterm_exits_143_and_the_restart_ends_equal_to_an_uninterrupted_run(tmp_path):
    # The uninterrupted reference runs beside the run to preempt (one process each):
    # they share nothing but the flags.
    reference = _start(tmp_path, "reference", tmp_path / "reference-backup", *LONGER)
    backup_dir = tmp_path / "backup"
    victim = _start(tmp_path, "preempted", backup_dir, *LONGER)
    try:
        poll_until(
            lambda: committed_steps(backup_dir) or victim.poll() is not None,
            timeout=TIMEOUT,
            what="the first backup",
        )
        assert victim.poll() is None, log_tail(victim)
        victim.send_signal(signal.SIGTERM)
        code = _finish(victim, timeout=60)
        reference_code = _finish(reference)
    finally:
        _finish(victim, timeout=1)
        _finish(reference, timeout=1)
    assert code == EXIT_PREEMPTED, log_tail(victim)
    assert reference_code == 0, f"reference exited {reference_code}:\n{log_tail(reference)}"
    total = EPOCHS * PREEMPTED_STEPS_PER_EPOCH
    assert _summary(reference.out)["steps_completed"] == total
    assert _summary(reference.out)["resumed_from_step"] == 0
    notice_step = committed_steps(backup_dir)[-1]
    assert 0 < notice_step < total
    assert f"stopping after step {notice_step}" in log_tail(victim)
    assert not (victim.out / "summary.json").exists()

    resumed = _run(tmp_path, "resumed", backup_dir, *LONGER)

    summary = _summary(resumed.out)
    assert summary["resumed_from_step"] == notice_step
    assert summary["steps_completed"] == total
    for want, got in zip(_weights(reference.out), _weights(resumed.out), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert os.listdir(backup_dir) == ["COMPLETED.json"]

    # Restarted by accident after it finished: no training, outputs untouched.
    before = (resumed.out / "model.keras").read_bytes()
    again = _run(tmp_path, "again", backup_dir, *LONGER, f"--model_dir={resumed.out}")
    assert "not training again" in log_tail(again)
    assert (resumed.out / "model.keras").read_bytes() == before


@pytest.mark.slow
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
LAST_STEP_CASES = {
    "default": ((), ["--strategy=default"]),
    "multiworker": pytest.param(
        (*_LAUNCH, "--workers=2", "--"), ["--strategy=multiworker"], marks=pytest.mark.slow
    ),
    "parameter_server": pytest.param(
        (*_LAUNCH, "--chief", "--workers=1", "--ps=1", "--"),
        ["--strategy=parameter_server", "--nodeterministic"],
        marks=pytest.mark.slow,
    ),
}


@pytest.mark.parametrize(
    "launcher, strategy_flags", LAST_STEP_CASES.values(), ids=LAST_STEP_CASES.keys()
)
def test_a_restart_after_the_last_step_writes_the_outputs_and_trains_nothing(
    tmp_path, launcher, strategy_flags
):
    backup_dir = tmp_path / "backup"
    finished = _run(
        tmp_path, "finished", backup_dir, "--keep_backup", *strategy_flags, launcher=launcher
    )
    summary = _summary(finished.out)
    weights = _weights(finished.out)
    _crash_after_the_last_step(finished.out, backup_dir)
    steps_before = committed_steps(backup_dir)

    again = _run(
        tmp_path,
        "again",
        backup_dir,
        f"--model_dir={finished.out}",
        "--keep_backup",
        *strategy_flags,
        launcher=launcher,
    )
    assert "Epoch " not in log_tail(again), "no step may run again"
    resumed = _summary(finished.out)
    assert resumed["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    assert resumed["resumed_from_step"] == EPOCHS * STEPS_PER_EPOCH
    for key in ("final_loss", "metrics", "steps_per_epoch", "global_batch_size", "strategy"):
        assert resumed[key] == summary[key], key
    for got, want in zip(_weights(finished.out), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (backup_dir / "COMPLETED.json").exists()
    assert committed_steps(backup_dir) == steps_before, "no backup may be lost"
