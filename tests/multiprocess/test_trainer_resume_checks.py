"""A restart whose settings differ from its backup's: refused in one line, no backup touched.

One finished run (`--keep_backup`, its completion record removed: the state of a job that
died after its last backup) is restarted with one setting changed at a time.
"""

import json
import pathlib
import shutil
import sys

import pytest

from tests.support.backup_files import committed_steps, snapshot
from tests.support.forked_runs import run_forked_trainers
from tests.support.logged_process import clean_environment, finish, log_tail, start_logged

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 300
BASE = [
    "--model=mlp",
    "--dataset=synthetic",
    "--num_examples=512",
    "--epochs=2",
    "--steps_per_epoch=4",
    "--global_batch_size=32",
    "--backup_every_steps=2",
    "--seed=1",
    "--keep_backup",
]


def _train(out: pathlib.Path, backup_dir: pathlib.Path, *flags: str) -> tuple[int, str]:
    out.mkdir(exist_ok=True)
    process = start_logged(
        [
            sys.executable,
            "-m",
            "trainer.task",
            *BASE,
            *flags,
            f"--model_dir={out}",
            f"--backup_dir={backup_dir}",
        ],
        out,
        cwd=REPO,
    )
    code = finish(process, TIMEOUT)
    return code, log_tail(process)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """A finished job's model directory and backup directory (final backups kept)."""
    root = tmp_path_factory.mktemp("finished")
    backup_dir = root / "backup"
    code, log = _train(root / "model", backup_dir)
    assert code == 0, log
    assert committed_steps(backup_dir) == [6, 8]
    return root / "model", backup_dir


@pytest.fixture(scope="module")
def interrupted_backup(finished_run, tmp_path_factory) -> pathlib.Path:
    backup_dir = tmp_path_factory.mktemp("interrupted") / "backup"
    shutil.copytree(finished_run[1], backup_dir)
    (backup_dir / "COMPLETED.json").unlink()
    return backup_dir


def _final_backup_deleted(backup_dir: pathlib.Path) -> None:
    for step in committed_steps(backup_dir):
        shutil.rmtree(backup_dir / f"backup-{step:012d}")


def _marker_dropped_mid_run(backup_dir: pathlib.Path) -> None:
    shutil.rmtree(backup_dir / "backup-000000000008")


# Job B on the directory of finished job A: (flags, how its copy of A's backup is altered).
REUSED = {
    "other learning rate, other model_dir": (["--learning_rate=0.5"], None),
    "same job, other model_dir": ([], None),
    "same job, other model_dir, backups deleted": ([], _final_backup_deleted),
    "completion record dropped beside older backups": ([], _marker_dropped_mid_run),
}


@pytest.fixture(scope="module")
def reused_finished(finished_run, tmp_path_factory) -> dict:
    """Each REUSED job on its own copy of the finished job's backup, forked side by side."""
    root = tmp_path_factory.mktemp("reused")
    runs, prepared = [], {}
    for name, (flags, alter) in REUSED.items():
        case_dir = root / name.replace(" ", "_").replace(",", "")
        backup_dir = case_dir / "backup"
        shutil.copytree(finished_run[1], backup_dir)
        if alter:
            alter(backup_dir)
        out = case_dir / "model"
        prepared[name] = (snapshot(backup_dir), backup_dir, out)
        runs.append([*BASE, *flags, f"--model_dir={out}", f"--backup_dir={backup_dir}"])
    results = run_forked_trainers(runs, cwd=REPO, env=clean_environment(), timeout=TIMEOUT)
    return {
        name: (result.returncode, result.stdout + result.stderr, *prepared[name])
        for name, result in zip(REUSED, results, strict=True)
    }


@pytest.mark.parametrize(
    "case, expected",
    [
        ("other learning rate, other model_dir", "learning_rate=0.05, this run has 0.5"),
        ("same job, other model_dir, backups deleted", "wrote model.keras and summary.json to"),
        ("completion record dropped beside older backups", "resume from step 6"),
    ],
)
def test_a_finished_jobs_directory_reused_is_refused_in_one_line(reused_finished, case, expected):
    code, log, before, backup_dir, out = reused_finished[case]
    assert code == 2, log
    error_lines = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and expected in error_lines[0], log
    assert "Traceback" not in log
    assert snapshot(backup_dir) == before
    assert not (out / "summary.json").exists()


def test_the_same_job_with_another_model_dir_writes_its_outputs_from_the_final_backup(
    reused_finished, finished_run
):
    code, log, _, _, out = reused_finished["same job, other model_dir"]
    assert code == 0, log
    summary = json.loads((out / "summary.json").read_text())
    original = json.loads((finished_run[0] / "summary.json").read_text())
    assert summary["steps_completed"] == original["steps_completed"] == 8
    assert summary["final_loss"] == original["final_loss"]
    assert (out / "model.keras").stat().st_size > 0


REFUSED = {
    "global batch": (["--global_batch_size=64"], "global_batch_size=32, this run has 64"),
    "seed": (["--seed=2"], "seed=1, this run has 2"),
    "steps per epoch": (["--steps_per_epoch=8"], "steps_per_epoch=4, this run has 8"),
    "synthetic size": (["--num_examples=1024"], "num_train_examples=512, this run has 1024"),
    "model": (["--model=cnn"], "was made with"),
    "epochs under decay": (["--lr_decay=cosine", "--epochs=3"], "was made with"),
    "optimizer": (["--optimizer=lars"], 'optimizer="SGD", this run has "LARS"'),
    "mixed precision": (
        ["--mixed_precision=mixed_float16"],
        'dtype_policy="float32", this run has "mixed_float16"',
    ),
}


@pytest.fixture(scope="module")
def refused_restarts(interrupted_backup, tmp_path_factory) -> dict:
    """Each REFUSED restart, on its own copy of the backup, each its own process.

    Every restart is refused in its start-up, before it trains, so each runs as a
    process forked from one import of TensorFlow (`tests.support.forked_runs`): its
    own exit code and output, without a TensorFlow import apiece.

    Returns:
        Case name to (exit code, log, snapshot of its backup before, its backup dir).
    """
    root = tmp_path_factory.mktemp("refused")
    runs, prepared = [], {}
    for name, (flags, _) in REFUSED.items():
        case_dir = root / name.replace(" ", "_")
        backup_dir = case_dir / "backup"
        shutil.copytree(interrupted_backup, backup_dir)
        out = case_dir / "model"
        out.mkdir()
        prepared[name] = (snapshot(backup_dir), backup_dir)
        runs.append([*BASE, *flags, f"--model_dir={out}", f"--backup_dir={backup_dir}"])
    results = run_forked_trainers(runs, cwd=REPO, env=clean_environment(), timeout=TIMEOUT)
    return {
        name: (result.returncode, result.stdout + result.stderr, *prepared[name])
        for name, result in zip(REFUSED, results, strict=True)
    }


@pytest.mark.parametrize("case", REFUSED)
def test_a_changed_setting_is_one_line_exit_2_and_no_backup_is_touched(refused_restarts, case):
    _, expected = REFUSED[case]
    code, log, before, backup_dir = refused_restarts[case]
    assert code == 2, log
    error_lines = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and expected in error_lines[0], log
    assert "Traceback" not in log
    assert snapshot(backup_dir) == before


def test_more_epochs_at_a_constant_rate_resume_and_say_so(interrupted_backup, tmp_path):
    backup_dir = tmp_path / "backup"
    shutil.copytree(interrupted_backup, backup_dir)
    code, log = _train(tmp_path / "model", backup_dir, "--epochs=3", "--verbosity=0")
    assert code == 0, log
    assert "epochs=2 -> 3" in log
    assert "Epoch 3/3" in log and "Epoch 1/3" not in log and "Epoch 2/3" not in log


@pytest.mark.parametrize("with_backup", [True, False], ids=["backup", "no backup"])
def test_a_diverging_run_exits_3_and_keeps_its_last_finite_backup(tmp_path, with_backup):
    backup_dir = tmp_path / "backup"
    flags = ["--learning_rate=1e12", "--backup_every_steps=1"]
    process_dir = tmp_path / "model"
    if with_backup:
        code, log = _train(process_dir, backup_dir, *flags)
    else:
        process_dir.mkdir()
        process = start_logged(
            [sys.executable, "-m", "trainer.task", *BASE, *flags, f"--model_dir={process_dir}"],
            process_dir,
            cwd=REPO,
        )
        code, log = finish(process, TIMEOUT), log_tail(process)
    assert code == 3, log
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and ("is nan" in errors[0] or "is inf" in errors[0]), log
    assert not (process_dir / "summary.json").exists()
    assert not (process_dir / "model.keras").exists()
    if with_backup:
        steps = committed_steps(backup_dir)
        assert steps and f"the last backup (step {steps[-1]}) holds finite values" in errors[0]


def test_a_crash_at_the_same_step_on_every_start_ends_with_exit_4_naming_step_and_count(
    tmp_path,
):
    """Issue 32: killed at step 5 (SIGKILL, as by the OOM killer) on every start, restarted forever."""
    flags = [
        "--task=tests.jobs.tasks.toy_tasks:DiesAtStep",
        "--epochs=2",
        "--steps_per_epoch=4",
        "--global_batch_size=16",
        "--backup_every_steps=2",
        "--steps_per_execution=1",
        "--max_restarts_without_progress=2",
        f"--model_dir={tmp_path / 'model'}",
        f"--backup_dir={tmp_path / 'backup'}",
    ]
    codes = []
    for _ in range(5):  # what a restart policy that does not count does: start again
        (result,) = run_forked_trainers([flags], cwd=REPO, env=clean_environment(), timeout=TIMEOUT)
        codes.append(result.returncode)
        if result.returncode not in (-9, 137):
            break
    assert codes[:3] == [codes[0]] * 3 and codes[0] in (-9, 137), codes  # start, restarts 1, 2
    assert codes[3:] == [4], (codes, result.stdout + result.stderr)
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, result.stderr
    assert "restarted 3 times from the backup at step 4" in error_lines[0]
    assert "max_restarts_without_progress=2" in error_lines[0]
    assert committed_steps(tmp_path / "backup") == [2, 4]
