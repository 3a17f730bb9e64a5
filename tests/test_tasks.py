"""`--task=MODULE:NAME`: a user's model and data through the trainer, and every way to get it wrong."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from tfdist import tasks as tasks_lib
from tfdist.errors import UsageError

REPO = pathlib.Path(__file__).resolve().parents[1]
TOY = "tests.tasks.toy_tasks"


def run_trainer(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "trainer.task", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def describe(result) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


def test_a_subclassed_task_with_batch_norm_trains_and_saves(tmp_path):
    result = run_trainer(f"--task={TOY}:SubclassedTask",
                         '--task_config={"num_examples": 256, "sample_weights": true}',
                         "--global_batch_size=32", "--epochs=2", "--optimizer=adam",
                         "--learning_rate=0.01", f"--model_dir={tmp_path}")
    assert result.returncode == 0, describe(result)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_per_epoch"] == 8, "default: the examples over the global batch"
    assert summary["steps_completed"] == 16
    assert summary["metrics"]["test"]["accuracy"] > 0.7
    model = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True,
                                    custom_objects={"TwoHeads": _two_heads()})
    moving_mean = [v for v in model.weights if "moving_mean" in v.path][0]
    assert not np.allclose(moving_mean.numpy(), 0.0), "batch-norm statistics were trained"


def _two_heads():
    from tests.tasks.toy_tasks import TwoHeads  # pylint: disable=g-import-not-at-top
    return TwoHeads


def test_a_zero_argument_factory_and_a_config_file(tmp_path):
    config = tmp_path / "task.json"
    config.write_text("{}")
    result = run_trainer(f"--task={TOY}:make_task", f"--task_config={config}",
                         "--global_batch_size=32", "--epochs=1", f"--model_dir={tmp_path}")
    assert result.returncode == 0, describe(result)
    assert json.loads((tmp_path / "summary.json").read_text())["steps_completed"] == 4


BROKEN = {
    "no colon": ("no_colon_here", None, "expected MODULE:NAME"),
    "import fails": ("tests.tasks.broken_import:Task", None,
                     "cannot be imported (ModuleNotFoundError: No module named "
                     "'this_module_does_not_exist')"),
    "missing name": (f"{TOY}:Missing", None, "has no callable 'Missing'"),
    "missing method": (f"{TOY}:NoLoss", None, "without loss"),
    "unknown argument": (f"{TOY}:SubclassedTask", '{"epochs": 3}',
                         "does not accept the --task_config arguments ['epochs']"),
    "config not an object": (f"{TOY}:SubclassedTask", "[1, 2]", "holds a JSON list"),
    "config not json": (f"{TOY}:SubclassedTask", "{bad", "is not valid JSON"),
    "config file missing": (f"{TOY}:SubclassedTask", "/no/such/file.json",
                            "neither a JSON object nor an existing file"),
    "inputs not a dataset": (f"{TOY}:ReturnsNumpy", None,
                             "returned tuple, expected a tf.data.Dataset"),
    "model not a model": (f"{TOY}:ReturnsALayer", None,
                          "build_model() returned Dense, expected a keras.Model"),
    "batched dicts": (f"{TOY}:Batched", None, "yields dicts with keys ['x', 'y'], expected tuples"),
    "endless": (f"{TOY}:Endless", None, "is infinite (it repeats)"),
}


@pytest.mark.parametrize("spec, task_config, expected", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_task_is_refused_before_training(spec, task_config, expected):
    with pytest.raises(UsageError) as raised:
        task = tasks_lib.load_task(spec, task_config)
        tasks_lib.preflight(task, spec)
        tasks_lib.check_examples(task.build_inputs(True), spec, training=True)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("flags, expected", [
    ([f"--task={TOY}:ReturnsALayer"], "build_model() returned Dense"),
    (["--task=tests.tasks.broken_import:Task"], "cannot be imported"),
])
def test_a_broken_task_is_one_line_and_exit_2(tmp_path, flags, expected):
    result = run_trainer(*flags, f"--model_dir={tmp_path}")
    assert result.returncode == 2, describe(result)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and expected in lines[-1], describe(result)
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_broken_task_fails_before_any_peer_is_contacted(tmp_path):
    # Two workers whose task returns the wrong type: both exit 2 at once,
    # before the strategy is created (which would wait for the other worker).
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.launch", "--workers=2", "--timeout=120", "--",
         sys.executable, "-m", "trainer.task", "--strategy=multiworker",
         f"--task={TOY}:ReturnsALayer", f"--model_dir={tmp_path}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 2, describe(result)
    assert "build_model() returned Dense" in result.stdout + result.stderr
    assert "coordination" not in (result.stdout + result.stderr).lower()


def test_load_task_reports_what_the_factory_raised_for_bad_arguments():
    with pytest.raises(UsageError, match="num_exampels"):
        tasks_lib.load_task(f"{TOY}:SubclassedTask", {"num_exampels": 3})


def test_the_base_class_names_what_is_missing():
    class Half(tasks_lib.Task):
        pass

    with pytest.raises(NotImplementedError, match="Half.build_model is not implemented"):
        Half().build_model()
    assert Half().metrics() == []
