"""What the trainer exports for Vertex AI: a SavedModel to serve, tuning metrics, per-trial dirs."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.logged_process import clean_environment, run_forked, run_side_by_side

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 300
# steps_per_execution is pinned (no assertion here depends on it): auto's probe traces and
# times a step function per candidate, which tests/multiprocess/test_execution_tuner.py covers.
SHORT = ["--epochs=2", "--steps_per_epoch=4", "--global_batch_size=32", "--steps_per_execution=1"]


def _train(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = clean_environment()
    environ.update(env or {})
    # Forked from one import of TensorFlow (tests/support/logged_process.py).
    return run_forked(
        [sys.executable, "-m", "trainer.task", *SHORT, *flags],
        cwd=REPO,
        env=environ,
        timeout=TIMEOUT,
    )


def _train_side_by_side(*runs: tuple[list[str], dict]) -> list[subprocess.CompletedProcess]:
    """`_train` for independent runs (each its own dirs), all started at once."""
    commands = []
    for flags, env in runs:
        environ = clean_environment()
        environ.update(env)
        environ["PYTHONPATH"] = str(REPO)
        commands.append(([sys.executable, "-m", "trainer.task", *SHORT, *flags], environ))
    return run_side_by_side(commands, cwd=REPO, timeout=TIMEOUT)


def _ok(result):
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Three runs side by side, one per export setting; maps a name to its directory.

    "vertex": a task's model, with AIP_MODEL_DIR and no --export (Vertex AI's
    default: both formats); "local": --model_dir and no --export; "served":
    --export=savedmodel.
    """
    root = tmp_path_factory.mktemp("exports")
    dirs = {name: root / name for name in ("vertex", "local", "served")}
    for result in _train_side_by_side(
        (
            ["--task=tests.jobs.tasks.toy_tasks:SubclassedTask"],
            {"AIP_MODEL_DIR": str(dirs["vertex"])},
        ),
        ([f"--model_dir={dirs['local']}"], {}),
        (["--export=savedmodel", f"--model_dir={dirs['served']}"], {}),
    ):
        _ok(result)
    return dirs


def test_a_task_model_exports_a_savedmodel_that_plain_tensorflow_serves(exports):
    model_dir = exports["vertex"]
    assert (model_dir / "saved_model.pb").exists() and (model_dir / "model.keras").exists()
    features = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    served = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    outputs = list(served(tf.constant(features)).values())
    from tests.jobs.tasks.toy_tasks import TwoHeads  # pylint: disable=g-import-not-at-top

    model = keras.saving.load_model(
        model_dir / "model.keras", safe_mode=True, custom_objects={"TwoHeads": TwoHeads}
    )
    np.testing.assert_allclose(
        outputs[0].numpy(), model.predict(features, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_vertex_defaults_to_both_and_savedmodel_alone_writes_no_keras_file(exports):
    vertex_dir, local_dir, served_only = exports["vertex"], exports["local"], exports["served"]
    assert (vertex_dir / "saved_model.pb").exists() and (vertex_dir / "model.keras").exists()
    assert (local_dir / "model.keras").exists() and not (local_dir / "saved_model.pb").exists()
    assert (served_only / "saved_model.pb").exists()
    assert not (served_only / "model.keras").exists()
    assert json.loads((served_only / "summary.json").read_text())["steps_completed"] == 8


def test_a_tuning_trial_reports_its_metric_and_writes_into_its_own_directories(tmp_path):
    metric_file = tmp_path / "hypertune" / "output.metrics"
    result = _train(
        "--hparam_metric=val_accuracy",
        "--validation_steps=2",
        f"--model_dir={tmp_path / 'model'}",
        f"--backup_dir={tmp_path / 'backup'}",
        "--keep_backup",
        env={"CLOUD_ML_TRIAL_ID": "7", "CLOUD_ML_HP_METRIC_FILE": str(metric_file)},
    )
    _ok(result)
    lines = [json.loads(line) for line in metric_file.read_text().splitlines()]
    assert [line["global_step"] for line in lines] == ["4", "8"]
    assert all(line["trial"] == "7" and 0.0 <= float(line["val_accuracy"]) <= 1.0 for line in lines)
    assert (tmp_path / "model" / "7" / "summary.json").exists()
    assert os.listdir(tmp_path / "backup") == ["7"]


def test_a_validation_metric_without_validation_is_refused(tmp_path):
    result = _train("--hparam_metric=val_loss", f"--model_dir={tmp_path}")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: --hparam_metric=val_loss is a validation metric but --validation_steps is 0"
        )
    )
    assert list(tmp_path.iterdir()) == []
