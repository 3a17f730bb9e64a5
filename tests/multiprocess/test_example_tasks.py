"""The tasks in examples/tasks: each learns and saves a safely loadable model, and keeps
tfdist's guarantees when the trainer runs it under each strategy.

The fast tests run a task in this process, as `trainer.run` would (the same task
contract and input stream); the slow ones run `python -m trainer.task --task=...`
as real processes, on loopback clusters from `tfdist.launch.testing.local_cluster`,
which keeps every task's log and prints it when a test fails.
"""

import importlib
import json
import pathlib
import signal
import sys

import keras
import numpy as np

from tests.support.logged_process import finish, log_tail, start_logged
from tests.unit.test_example_tasks import (
    EXAMPLES,  # shared with the in-process half
    Example,  # shared with the in-process half
)
from tfdist.backups import BackupStore
from tfdist.launch.testing import poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
# Backstops against hangs, never speed assertions.
WAIT_SECONDS = 480
CLUSTER_ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


BATCH = 32


def _max_difference(left: list, right: list) -> float:
    assert [np.shape(w) for w in left] == [np.shape(w) for w in right]
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(left, right, strict=True)
    )


# ------------------------------------------------------------------ as processes


def _trainer(example: Example, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer.task",
        f"--task={example.spec}",
        f"--task_config={json.dumps(example.config)}",
        "--optimizer=adam",
        f"--learning_rate={example.learning_rate}",
        f"--global_batch_size={BATCH}",
        "--seed=3",
        *flags,
    ]


def _start_single(out: pathlib.Path, command: list[str]):
    out.mkdir()
    return start_logged(command, out, cwd=REPO)


def _finish_single(process) -> None:
    code = finish(process, WAIT_SECONDS)
    assert code == 0, f"{process.out.name} exited {code}:\n{log_tail(process)}"


def _summary(model_dir: pathlib.Path) -> dict:
    return json.loads((model_dir / "summary.json").read_text())


def _weights(model_dir: pathlib.Path, example: Example) -> list[np.ndarray]:
    """Every variable of the saved model, batch-norm statistics included."""
    importlib.import_module(example.spec.split(":")[0])  # registers its custom classes
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True, compile=False)
    return [np.asarray(variable) for variable in model.weights]


def test_resnet_on_two_workers_equals_mirrored_on_two_cpus_and_is_evaluated(
    local_cluster, tmp_path
):
    example = EXAMPLES["resnet"]
    # steps_per_execution is pinned: auto's probe traces and times a step function per
    # candidate in every process, which tests/multiprocess/test_execution_tuner.py covers.
    steps = ["--epochs=2", "--steps_per_epoch=4", "--steps_per_execution=4"]
    mirrored = _start_single(
        tmp_path / "mirrored",
        _trainer(
            example,
            *steps,
            "--strategy=mirrored",
            "--num_cpu_devices=2",
            f"--model_dir={tmp_path / 'mirrored'}",
        ),
    )
    try:
        cluster = local_cluster(
            num_workers=2,
            has_evaluator=True,
            env=CLUSTER_ENV,
            command=_trainer(
                example,
                *steps,
                "--strategy=multiworker",
                "--evaluation_checkpoints",
                f"--model_dir={tmp_path / 'workers'}",
            ),
        )
        cluster.start()
        codes = cluster.wait(timeout=WAIT_SECONDS)
        assert set(codes.values()) == {0}, cluster.format_logs()
    finally:
        _finish_single(mirrored)

    one, two = _summary(tmp_path / "mirrored"), _summary(tmp_path / "workers")
    assert (one["num_replicas"], one["num_workers"], one["steps_completed"]) == (2, 1, 8)
    assert (two["num_replicas"], two["num_workers"], two["steps_completed"]) == (2, 2, 8)
    difference = _max_difference(
        _weights(tmp_path / "mirrored", example), _weights(tmp_path / "workers", example)
    )
    print(f"resnet: 2 workers vs mirrored on 2 CPUs, max |weight difference| = {difference:g}")
    assert difference <= 1e-6

    evaluated = [
        json.loads(line)
        for line in (tmp_path / "workers" / "eval" / "metrics.jsonl").read_text().splitlines()
    ]
    assert evaluated[-1]["step"] == 8, evaluated
    assert set(evaluated[-1]["metrics"]) == {"loss", "accuracy"}, evaluated


def test_subclassed_worker_killed_mid_epoch_restarts_to_the_uninterrupted_weights(
    local_cluster, tmp_path
):
    example = EXAMPLES["subclassed"]
    # Backups at steps 30, 60, 90, 100 (an epoch's end), 120, ...: the worker is
    # killed right after the first, so training resumes mid-epoch.
    epochs, steps_per_epoch, every = 2, 100, 30
    total = epochs * steps_per_epoch

    def two_workers(name: str, **kwargs):
        # steps_per_execution is pinned (10 tiles the epoch, the backups and a resume at
        # any of them): auto's probe traces a step function per candidate at every start,
        # twice for the killed job; tests/multiprocess/test_execution_tuner.py and the trainer's
        # 2-worker SIGTERM test cover auto. The dropout seed state a backup must carry
        # advances every step whatever the execution length.
        return local_cluster(
            num_workers=2,
            env=CLUSTER_ENV,
            **kwargs,
            command=_trainer(
                example,
                f"--epochs={epochs}",
                f"--steps_per_epoch={steps_per_epoch}",
                f"--steps_per_execution={every // 3}",
                "--strategy=multiworker",
                f"--backup_dir={tmp_path / name / 'backup'}",
                f"--backup_every_steps={every}",
                f"--model_dir={tmp_path / name / 'model'}",
            ),
        )

    # The reference has the same workers: MirroredStrategy on 2 CPUs differs
    # from them by float32 round-off for this model (measured 3.7e-7).
    reference = two_workers("reference")
    reference.start()
    killed = two_workers("killed", restart_on_failure=1)
    killed.start()
    store = BackupStore(str(tmp_path / "killed" / "backup"))
    poll_until(store.committed_steps, timeout=WAIT_SECONDS, what="the first backup")
    assert killed.kill("worker:1", signal.SIGKILL), killed.format_logs()
    codes = killed.wait(timeout=WAIT_SECONDS)
    assert codes == {"worker:0": 0, "worker:1": 0}, killed.format_logs()
    assert killed.restarts == 1, killed.format_logs()
    assert set(reference.wait(timeout=WAIT_SECONDS).values()) == {0}, reference.format_logs()

    summary = _summary(tmp_path / "killed" / "model")
    assert summary["steps_completed"] == total, summary
    assert _summary(tmp_path / "reference" / "model")["steps_completed"] == total
    resumed = summary["resumed_from_step"]
    assert 0 < resumed < total and resumed % steps_per_epoch, summary
    difference = _max_difference(
        _weights(tmp_path / "reference" / "model", example),
        _weights(tmp_path / "killed" / "model", example),
    )
    print(
        f"subclassed: worker:1 killed, the job resumed at step {resumed}; max |weight "
        f"difference| to the uninterrupted run = {difference:g}"
    )
    assert difference <= 1e-6


def test_transformer_under_parameter_servers_applies_exactly_the_planned_steps(
    local_cluster, tmp_path
):
    example = EXAMPLES["transformer"]
    epochs, steps_per_epoch = 2, 10
    cluster = local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        env=CLUSTER_ENV,
        command=_trainer(
            example,
            f"--epochs={epochs}",
            f"--steps_per_epoch={steps_per_epoch}",
            "--strategy=parameter_server",
            f"--model_dir={tmp_path / 'model'}",
        ),
    )
    cluster.start()
    codes = cluster.wait(timeout=WAIT_SECONDS)
    assert codes["chief:0"] == 0, cluster.format_logs()

    summary = _summary(tmp_path / "model")
    assert (summary["strategy"], summary["num_workers"], summary["num_ps"]) == (
        "parameter_server",
        2,
        1,
    )
    assert summary["steps_completed"] == epochs * steps_per_epoch, summary
    assert set(summary["metrics"]["test"]) == {"loss", "accuracy"}, summary
