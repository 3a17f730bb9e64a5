"""Tasks written the way keras.io teaches, through `python -m trainer.task` (issue 19).

Custom `train_step` models, string features under several replicas,
variable-length features, weighted metrics and class weights, and the
mistakes users make: each mistake is one `error:` line and exit 2, under one
process and under two workers.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.support.forked_runs import run_forked_trainers
from tests.support.logged_process import clean_environment, run_forked, run_side_by_side
from tfdist.launch.local_cluster import pick_free_ports

REPO = pathlib.Path(__file__).resolve().parents[2]
TASKS = "tests.jobs.tasks.user_tasks"
TIMEOUT = 300
# For runs whose assertions hold for any execution length: auto's probe traces and
# times a step function per candidate, which tests/multiprocess/test_execution_tuner.py covers.
PINNED_EXECUTION = "--steps_per_execution=1"


def trainer_command(task: str, model_dir, *flags: str) -> list[str]:
    return [sys.executable, "-m", "trainer.task", *trainer_args(task, model_dir, *flags)]


def trainer_args(task: str, model_dir, *flags: str) -> list[str]:
    return [
        f"--task={TASKS}:{task}",
        "--global_batch_size=32",
        "--epochs=2",
        f"--model_dir={model_dir}",
        *flags,
    ]


def run_trainer(task: str, model_dir, *flags: str) -> subprocess.CompletedProcess:
    # Forked from one import of TensorFlow (tests/support/logged_process.py).
    return run_forked(
        trainer_command(task, model_dir, *flags), cwd=REPO, env=clean_environment(), timeout=TIMEOUT
    )


def describe(result) -> str:
    return (
        f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
        f"stderr:\n{result.stderr[-4000:]}"
    )


def summary(model_dir) -> dict:
    return json.loads((pathlib.Path(model_dir) / "summary.json").read_text())


# --- custom train_step ---


def _weights(model_dir) -> list:
    import keras  # pylint: disable=g-import-not-at-top

    import tests.jobs.tasks.user_tasks  # noqa: F401  (registers the model class)

    return keras.saving.load_model(
        pathlib.Path(model_dir) / "model.keras", safe_mode=True
    ).get_weights()


def test_a_custom_train_step_without_test_step_trains_skips_evaluation_and_saves(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ("--learning_rate=0.01", "--steps_per_execution=1")
    results = run_side_by_side(
        [
            (trainer_command("CustomTrainStep", one, *flags), clean_environment()),
            (
                trainer_command(
                    "CustomTrainStep", two, *flags, "--strategy=mirrored", "--num_cpu_devices=2"
                ),
                clean_environment(),
            ),
        ],
        cwd=REPO,
        timeout=TIMEOUT,
    )
    for result, model_dir in zip(results, (one, two)):
        assert result.returncode == 0, describe(result)
        assert "Skipping evaluation: CustomStepModel overrides train_step but not test_step" in (
            result.stderr
        ), describe(result)
        assert (model_dir / "model.keras").exists()
        written = summary(model_dir)
        assert written["steps_completed"] == 16
        assert written["metrics"]["test"] == {}
        assert set(written["metrics"]["train"]) == {"loss", "mae"}
    # Upstream behaviour (docs/tasks.md): on 2 replicas the reported loss of a
    # keras.losses.Loss computed in train_step is halved; the weights are one device's.
    assert summary(two)["final_loss"] == pytest.approx(summary(one)["final_loss"] / 2, rel=1e-5)
    for want, got in zip(_weights(one), _weights(two), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_custom_train_step_with_its_test_step_is_evaluated(tmp_path):
    result = run_trainer(
        "CustomTrainStep",
        tmp_path,
        "--learning_rate=0.01",
        '--task_config={"with_test_step": true}',
        PINNED_EXECUTION,
    )
    assert result.returncode == 0, describe(result)
    assert "Skipping evaluation" not in result.stderr
    assert set(summary(tmp_path)["metrics"]["test"]) == {"loss", "mae"}


# --- strings ---


def test_upstream_string_symbolic_build_under_mirrored_still_fails(tmp_path):
    # When this fails, Keras/TensorFlow fixed tensorflow#80951: raise
    # keras_compat.FIRST_FIXED_KERAS or retire the string_symbolic_build correction.
    results = run_side_by_side(
        [
            (
                [
                    sys.executable,
                    str(REPO / "tests" / "jobs" / "string_reduction_job.py"),
                    f"--out={tmp_path / name}",
                    *flags,
                ],
                clean_environment(),
            )
            for name, flags in (("upstream.json", []), ("corrected.json", ["--corrected"]))
        ],
        cwd=REPO,
        timeout=TIMEOUT,
    )
    for result in results:
        assert result.returncode == 0, describe(result)
    upstream = json.loads((tmp_path / "upstream.json").read_text())
    corrected = json.loads((tmp_path / "corrected.json").read_text())
    assert upstream["error"] is not None and "string" in upstream["error"], upstream
    assert "AddN" in upstream["error"] or "allowed values" in upstream["error"], upstream
    assert corrected == {"error": None, "steps": 4}


def test_a_text_task_trains_under_mirrored_on_two_devices(tmp_path):
    result = run_trainer(
        "Text",
        tmp_path,
        "--strategy=mirrored",
        "--num_cpu_devices=2",
        "--epochs=3",
        PINNED_EXECUTION,
    )
    assert result.returncode == 0, describe(result)
    written = summary(tmp_path)
    assert written["num_replicas"] == 2 and written["steps_completed"] == 24
    assert written["metrics"]["test"]["accuracy"] > 0.6


# --- variable-length features ---


@pytest.mark.parametrize(
    "task_config", ['{"batching": "longest"}', '{"batching": "buckets", "source": "ragged"}']
)
def test_variable_length_features_train_when_the_task_declares_batching(tmp_path, task_config):
    result = run_trainer(
        "VariableLength", tmp_path, f"--task_config={task_config}", "--steps_per_execution=1"
    )
    assert result.returncode == 0, describe(result)
    assert summary(tmp_path)["steps_completed"] == 16
    assert (tmp_path / "model.keras").exists()


# --- weighted metrics and class weights ---


def test_weighted_metrics_and_class_weight_reach_compile_and_the_inputs(tmp_path):
    result = run_trainer("Weighted", tmp_path, PINNED_EXECUTION)
    assert result.returncode == 0, describe(result)
    train = summary(tmp_path)["metrics"]["train"]
    # Class 1 weighs 3: the weighted accuracy is not the plain one.
    assert "weighted_accuracy" in train and "accuracy" in train
    assert abs(train["weighted_accuracy"] - train["accuracy"]) > 1e-3, train


# --- mistakes: one line, exit 2 ---

MISTAKES = {
    "string labels": (
        "StringLabels",
        None,
        "the labels are strings (e.g. [b'yes', b'no']), expected numbers for the loss",
    ),
    "one-hot labels, sparse loss": ("OneHotLabels", None, "the labels look one-hot"),
    "features of the wrong width": (
        "WrongWidth",
        None,
        "expected axis -1 of input shape to have value 6, but received input with shape (8, 4)",
    ),
    "loss() is None": ("LossNone", None, "loss() returned None"),
    "batched, fewer than a global batch": (
        "AlreadyBatched",
        '{"num_examples": 256}',
        "yields examples that are already batched",
    ),
    "batched, 8192 examples": (
        "AlreadyBatched",
        '{"num_examples": 8192}',
        "yields examples that are already batched",
    ),
    "compiled model": ("Compiled", None, "build_model() returned a compiled model"),
    "variable lengths undeclared": ("VariableLength", None, "declare padding"),
    "ragged undeclared": ("VariableLength", '{"source": "ragged"}', "features (RaggedTensorSpec)"),
}


def _one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return errors[0]


def test_every_mistake_is_one_line_and_exit_2(tmp_path):
    # Each mistake is its own `python -m trainer.task` process (its own exit code and
    # stderr), forked from one import of TensorFlow: every mistake is found before training.
    runs = []
    for index, (task, task_config, _) in enumerate(MISTAKES.values()):
        flags = [f"--task_config={task_config}"] if task_config else []
        runs.append(trainer_args(task, tmp_path / str(index), *flags))
    results = run_forked_trainers(runs, cwd=REPO, env=clean_environment(), timeout=TIMEOUT)
    for index, (name, (_, _, expected)) in enumerate(MISTAKES.items()):
        result = results[index]
        assert result.returncode == 2, f"{name}: {describe(result)}"
        line = _one_error_line(result.stderr)
        assert expected in line, f"{name}: {line}"
        assert not (tmp_path / str(index)).exists() or not any((tmp_path / str(index)).iterdir()), (
            f"{name}: wrote outputs"
        )


def test_mistakes_and_a_text_task_under_two_workers(local_cluster, tmp_path):
    # Several 2-worker jobs side by side: every worker of a mistaken job exits 2
    # with the one line; the text task (strings) and a bucketed ragged task train.
    # A mistaken job's workers are found out before any task contacts another:
    # each worker is its own process, forked from one import of TensorFlow.
    mistakes = {
        "StringLabels": "labels are strings",
        "WrongWidth": "received input",
        "Compiled": "compiled model",
    }
    trained = {
        "Text": [],
        "VariableLength": ['--task_config={"batching": "buckets", "source": "ragged"}'],
    }
    multiworker = ("--strategy=multiworker", "--steps_per_execution=1")
    clusters = {
        task: local_cluster(
            num_workers=2,
            command=trainer_command(task, tmp_path / task, *multiworker, *extra),
            env={"PYTHONPATH": str(REPO)},
        )
        for task, extra in trained.items()
    }
    for cluster in clusters.values():
        cluster.start()
    workers, runs, run_envs = [], [], []
    for task in mistakes:
        addresses = [f"127.0.0.1:{port}" for port in pick_free_ports("127.0.0.1", 2)]
        for index in range(2):
            workers.append((task, f"worker:{index}"))
            runs.append(trainer_args(task, tmp_path / task, *multiworker))
            tf_config = {
                "cluster": {"worker": addresses},
                "task": {"type": "worker", "index": index},
            }
            run_envs.append({"TF_CONFIG": json.dumps(tf_config)})
    results = run_forked_trainers(
        runs, cwd=REPO, env=clean_environment(), timeout=TIMEOUT, run_envs=run_envs
    )
    for (task, worker), result in zip(workers, results, strict=True):
        assert result.returncode == 2, f"{task} {worker}: {describe(result)}"
        assert mistakes[task] in _one_error_line(result.stdout + result.stderr), describe(result)
    for task, cluster in clusters.items():
        codes = cluster.wait(timeout=TIMEOUT, stop_on_failure=False)
        assert set(codes.values()) == {0}, f"{task}: {codes}\n{cluster.format_logs()}"
    for task in trained:
        assert summary(tmp_path / task)["num_workers"] == 2
        assert summary(tmp_path / task)["steps_completed"] == 16
