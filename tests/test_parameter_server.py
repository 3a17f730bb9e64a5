"""Parameter-server training of Keras 3 models: exact steps, failures, sidecar evaluation.

The multi-process tests run `tests/parameter_server_job.py` as every task of a
loopback cluster (chief + 2 workers + 1 ps, sometimes an evaluator).
"""

import json
import os
import pathlib
import signal
import sys
import time

import pytest

from tfdist.errors import UsageError
from tfdist.testing import local_cluster, poll_until  # noqa: F401  (pytest fixture)

REPO = pathlib.Path(__file__).resolve().parents[1]
JOB = str(REPO / "tests" / "parameter_server_job.py")
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
JOB_TIMEOUT = 150


def _cluster(local_cluster, out, *args, evaluator=False):  # noqa: F811
    return local_cluster(num_workers=2, num_ps=1, has_chief=True, has_evaluator=evaluator,
                         command=[sys.executable, JOB, f"--out={out}", *args], env=ENV,
                         grace_period=5.0)


def _summary(out: pathlib.Path, cluster) -> dict:
    path = out / "summary.json"
    assert path.exists(), f"no summary.json\n{cluster.format_logs()}"
    return json.loads(path.read_text())


# ------------------------------------------------------------ in-process checks

def test_fit_without_steps_per_epoch_is_a_usage_error():
    import keras

    from tfdist import parameter_server

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(UsageError, match=r"steps_per_epoch is missing.*pass steps_per_epoch=N"):
        parameter_server.fit(model, lambda context: None, epochs=2)


def test_trainer_refuses_a_model_built_outside_parameter_server_strategy():
    import keras

    from tfdist import parameter_server

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(UsageError, match="expected a tf.distribute.ParameterServerStrategy"):
        parameter_server.ParameterServerTrainer(model)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps_per_epoch": 0}, "steps_per_epoch is 0"),
    ({"steps_per_epoch": 5, "steps_per_sync": -1}, "steps_per_sync is -1"),
    ({"steps_per_epoch": 5, "initial_epoch": 4, "epochs": 3}, "initial_epoch is 4"),
    ({"steps_per_epoch": 5, "has_validation_data": True}, "validation_steps is None"),
])
def test_fit_plan_rejects_bad_schedules(kwargs, message):
    from tfdist.parameter_server.training import FitPlan

    with pytest.raises(UsageError, match=message):
        FitPlan(**kwargs)


def test_fit_plan_syncs_once_per_epoch_by_default():
    from tfdist.parameter_server.training import FitPlan

    assert FitPlan(epochs=2, steps_per_epoch=7).steps_per_sync == 7


def test_chief_watch_needs_the_chief_to_come_and_then_stay_away():
    from tfdist.parameter_server import ChiefWatch

    now = [0.0]
    answers = iter([False, False, True, False, False, True, False, False, False])
    watch = ChiefWatch("127.0.0.1:1", gone_seconds=2.0, probe=lambda address: next(answers),
                       clock=lambda: now[0])
    seen = []
    for _ in range(9):
        seen.append(watch.gone())
        now[0] += 1.0
    # Unreachable before it ever came up is not "gone"; coming back resets the clock.
    assert seen == [False, False, False, False, False, False, False, False, True]


def test_partitioner_is_off_unless_asked():
    from tfdist.parameter_server import variable_partitioner

    assert variable_partitioner(min_shard_bytes=0, max_shards=4) is None
    assert variable_partitioner(min_shard_bytes=1024, max_shards=1) is None
    assert variable_partitioner(min_shard_bytes=1024, max_shards=2) is not None
    with pytest.raises(UsageError, match="max_shards is 0"):
        variable_partitioner(min_shard_bytes=1024, max_shards=0)


def test_strategy_refuses_a_worker_task():
    from tfdist.cluster import Cluster
    from tfdist.parameter_server import make_parameter_server_strategy

    cluster = Cluster(task_type="worker", task_index=0, source="TF_CONFIG",
                      addresses={"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                                 "ps": ["127.0.0.1:3"]})
    with pytest.raises(UsageError, match="expected the chief; worker and ps tasks run"):
        make_parameter_server_strategy(cluster)


# ------------------------------------------------------------ multi-process jobs

@pytest.mark.slow
def test_every_step_is_counted_exactly_and_the_evaluator_sees_the_last_checkpoint(
        local_cluster, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    cluster = _cluster(local_cluster, out, "--epochs=2", "--steps_per_epoch=20",
                       "--steps_per_sync=5", evaluator=True)
    cluster.start()
    codes = cluster.wait(timeout=JOB_TIMEOUT)
    assert codes["chief:0"] == 0 and codes["evaluator:0"] == 0, cluster.format_logs()
    summary = _summary(out, cluster)
    assert summary["steps_completed"] == 40, summary
    assert summary["iterations"] == 40, summary
    # The loss metric's count: every example of the last epoch's 20 steps of 16.
    assert summary["last_epoch_examples_counted"] == 20 * 16, summary
    assert summary["loss"][-1] < 0.5 * summary["loss"][0], summary
    lines = [json.loads(line) for line in (out / "eval" / "metrics.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines]
    assert steps[-1] == 40 and steps == sorted(set(steps)), lines
    assert set(lines[-1]["metrics"]) == {"loss", "mae"}, lines
    assert lines[-1]["metrics"]["loss"] < lines[0]["metrics"]["loss"] or len(lines) == 1, lines
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "eval"))


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_no_step(local_cluster, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    cluster = _cluster(local_cluster, out, "--epochs=2", "--steps_per_epoch=40",
                       "--steps_per_sync=20", "--hold_after_first_sync", "--mark_batches")
    cluster.start()
    poll_until(lambda: (out / "underway").exists(), timeout=JOB_TIMEOUT,
               what="the chief's first sync point")
    read_before = len(os.listdir(out / "batches"))
    (out / "release").write_text("go")
    # Workers are reading batches for the next 20 steps: kill one in the middle.
    poll_until(lambda: len(os.listdir(out / "batches")) >= read_before + 4,
               timeout=JOB_TIMEOUT, what="steps running after the release")
    assert cluster.kill("worker:1", signal.SIGKILL)
    codes = cluster.wait(timeout=JOB_TIMEOUT, stop_on_failure=False)
    assert codes["chief:0"] == 0, cluster.format_logs()
    assert codes["worker:1"] == -signal.SIGKILL
    summary = _summary(out, cluster)
    assert summary["steps_completed"] == 80, summary
    assert summary["iterations"] == 80, summary
    assert summary["last_epoch_examples_counted"] == 40 * 16, summary


@pytest.mark.slow
def test_losing_the_parameter_server_fails_the_chief_clearly_and_soon(
        local_cluster, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    cluster = _cluster(local_cluster, out, "--epochs=2", "--steps_per_epoch=200",
                       "--steps_per_sync=5", "--hold_after_first_sync")
    cluster.start()
    poll_until(lambda: (out / "underway").exists(), timeout=JOB_TIMEOUT,
               what="the chief's first sync point")
    assert cluster.kill("ps:0", signal.SIGKILL)
    killed_at = time.monotonic()
    (out / "release").write_text("go")
    codes = cluster.wait(timeout=JOB_TIMEOUT, stop_on_failure=False)
    failed_after = time.monotonic() - killed_at
    log = cluster.log("chief:0")
    assert codes["chief:0"] == 3, cluster.format_logs()
    assert "parameter-server training stopped: parameter server ps:0 " in log, log[-3000:]
    assert "restart the job to resume from the last backup" in log, log[-3000:]
    assert failed_after < 60, f"the chief took {failed_after:.0f} s to fail"
    assert not (out / "summary.json").exists()
