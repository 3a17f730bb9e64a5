"""`--task=MODULE:NAME`: a user's model and data through the trainer, and every way to get it wrong."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.support.forked_runs import run_forked_trainers
from tests.support.logged_process import clean_environment, run_forked

REPO = pathlib.Path(__file__).resolve().parents[2]
TOY = "tests.jobs.tasks.toy_tasks"
# For runs whose assertions hold for any execution length: auto's probe traces and
# times a step function per candidate, which tests/multiprocess/test_execution_tuner.py covers.
PINNED_EXECUTION = "--steps_per_execution=1"


def run_trainer(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # Forked from one import of TensorFlow (tests/support/logged_process.py).
    return run_forked(
        [sys.executable, "-m", "trainer.task", *flags],
        cwd=REPO,
        env=clean_environment(),
        timeout=timeout,
    )


def describe(result) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


def test_a_subclassed_task_with_batch_norm_trains_and_saves(tmp_path):
    result = run_trainer(
        f"--task={TOY}:SubclassedTask",
        '--task_config={"num_examples": 256, "sample_weights": true}',
        "--global_batch_size=32",
        "--epochs=2",
        "--optimizer=adam",
        "--learning_rate=0.01",
        PINNED_EXECUTION,
        f"--model_dir={tmp_path}",
    )
    assert result.returncode == 0, describe(result)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_per_epoch"] == 8, "default: the examples over the global batch"
    assert summary["steps_completed"] == 16
    assert summary["metrics"]["test"]["accuracy"] > 0.7
    model = keras.saving.load_model(
        tmp_path / "model.keras", safe_mode=True, custom_objects={"TwoHeads": _two_heads()}
    )
    moving_mean = [v for v in model.weights if "moving_mean" in v.path][0]
    assert not np.allclose(moving_mean.numpy(), 0.0), "batch-norm statistics were trained"


def _two_heads():
    from tests.jobs.tasks.toy_tasks import TwoHeads  # pylint: disable=g-import-not-at-top

    return TwoHeads


def test_a_zero_argument_factory_and_a_config_file(tmp_path):
    config = tmp_path / "task.json"
    config.write_text("{}")
    result = run_trainer(
        f"--task={TOY}:make_task",
        f"--task_config={config}",
        "--global_batch_size=32",
        "--epochs=1",
        PINNED_EXECUTION,
        f"--model_dir={tmp_path}",
    )
    assert result.returncode == 0, describe(result)
    assert json.loads((tmp_path / "summary.json").read_text())["steps_completed"] == 4


BROKEN_TASKS = {
    "returns a layer": ([f"--task={TOY}:ReturnsALayer"], "build_model() returned Dense"),
    "cannot be imported": (["--task=tests.jobs.tasks.broken_import:Task"], "cannot be imported"),
}


@pytest.fixture(scope="module")
def broken_task_runs(tmp_path_factory):
    """Each broken task's run, its own process forked from one import of TensorFlow
    (tests/support/forked_runs.py); maps a case to its result and model directory."""
    model_dirs = {name: tmp_path_factory.mktemp("broken") for name in BROKEN_TASKS}
    results = run_forked_trainers(
        [[*flags, f"--model_dir={model_dirs[name]}"] for name, (flags, _) in BROKEN_TASKS.items()],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=300,
    )
    return {name: (result, model_dirs[name]) for name, result in zip(BROKEN_TASKS, results)}


@pytest.mark.parametrize("case", BROKEN_TASKS)
def test_a_broken_task_is_one_line_and_exit_2(broken_task_runs, case):
    result, model_dir = broken_task_runs[case]
    expected = BROKEN_TASKS[case][1]
    assert result.returncode == 2, describe(result)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and expected in lines[-1], describe(result)
    assert "Traceback" not in result.stderr
    assert list(model_dir.iterdir()) == []


def test_a_broken_task_fails_before_any_peer_is_contacted(tmp_path):
    # Two workers whose task returns the wrong type: both exit 2 at once,
    # before the strategy is created (which would wait for the other worker).
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdist.launch",
            "--workers=2",
            "--timeout=120",
            "--",
            sys.executable,
            "-m",
            "trainer.task",
            "--strategy=multiworker",
            f"--task={TOY}:ReturnsALayer",
            f"--model_dir={tmp_path}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 2, describe(result)
    assert "build_model() returned Dense" in result.stdout + result.stderr
    assert "coordination" not in (result.stdout + result.stderr).lower()
