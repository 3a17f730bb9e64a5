"""keras.io-shaped scripts upgraded to `tfdist.resumable`, on 2 workers, killed and resumed.

One module-scoped run per script shares its processes among the tests: an uninterrupted
2-worker job, the same job SIGKILLed on both workers after a committed mid-epoch backup,
and its restart, whose weights must equal the uninterrupted job's bit for bit.
"""

import json
import pathlib
import signal
import sys

import keras
import numpy as np
import pytest

from tests.support import model_state
from tests.support.backup_files import committed_steps, snapshot
from tfdist import cli
from tfdist.launch.local_cluster import LocalCluster
from tfdist.launch.testing import SHARED_PRELOADERS

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
JOB = [sys.executable, str(REPO / "tests" / "jobs" / "example_run.py")]
TIMEOUT = 300  # A backstop against hangs, never a speed assertion.
WORKERS = ("worker:0", "worker:1")
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def _job(log_dir: pathlib.Path, command: list[str]) -> tuple[dict, LocalCluster]:
    with LocalCluster(
        num_workers=2,
        env=ENV,
        log_dir=log_dir,
        command=command,
        preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
    ) as cluster:
        codes = cluster.wait(timeout=TIMEOUT, stop_on_failure=False)
    return codes, cluster


def _weights(path: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(path, safe_mode=True, compile=False)
    return model.get_weights()


@pytest.fixture(scope="module")
def no_strategy_runs(tmp_path_factory):
    """examples/no_strategy_script/after.py: uninterrupted, then killed at step 24 and resumed.

    Backups every 10 steps and at each epoch's end (13 steps: 800 training examples in
    batches of 64, the last of 32); the kill lands after step 24, so the restart
    resumes from the backup of step 20, mid-epoch 2.
    """
    tmp = tmp_path_factory.mktemp("no_strategy")
    script = str(EXAMPLES / "no_strategy_script" / "after.py")
    reference, resumed = tmp / "reference", tmp / "resumed"
    reference.mkdir()
    resumed.mkdir()
    history = [f"--history={out / 'history.json'}" for out in (reference, resumed)]
    runs = {"reference": _job(tmp / "logs-reference", [*JOB, history[0], script, str(reference)])}
    runs["killed"] = _job(
        tmp / "logs-killed", [*JOB, "--kill_after_batches=24", script, str(resumed)]
    )
    runs["steps_when_killed"] = committed_steps(resumed / "backup")
    runs["resumed"] = _job(tmp / "logs-resumed", [*JOB, history[1], script, str(resumed)])
    return reference, resumed, runs


def test_no_strategy_script_killed_mid_epoch_resumes_to_the_uninterrupted_weights(
    no_strategy_runs,
):
    reference, resumed, runs = no_strategy_runs
    for name in ("reference", "resumed"):
        codes, cluster = runs[name]
        assert codes == {task: 0 for task in WORKERS}, cluster.format_logs()
    codes, cluster = runs["killed"]
    # A worker whose peer died first loses it in a collective and exits 200.
    assert -signal.SIGKILL in codes.values(), cluster.format_logs()
    assert set(codes.values()) <= {-signal.SIGKILL, cli.EXIT_PEER_LOST}, cluster.format_logs()
    assert runs["steps_when_killed"][-1] == 20, runs["steps_when_killed"]
    log = runs["resumed"][1].log("worker:0")
    assert "Epoch 1/4" not in log and "Epoch 4/4" in log, log
    for got, want in zip(
        _weights(resumed / "model.keras"), _weights(reference / "model.keras"), strict=True
    ):
        np.testing.assert_array_equal(got, want)


def _examples_seen(history: dict, prefix: str = "") -> list[float]:
    """Examples counted per epoch by keras.io's confusion-matrix metrics (fn + fp + tn + tp)."""
    names = [f"{prefix}{name}" for name in ("fn", "fp", "tn", "tp")]
    return [sum(values) for values in zip(*(history[name] for name in names))]


def test_two_workers_share_each_global_batch_and_validation_split_holds_out_the_last_fifth(
    no_strategy_runs,
):
    """1000 examples, validation_split=0.2: 800 trained on per epoch by the 2 workers
    together (each computes on its half of every batch of 64), 200 validated; the resumed
    job's history counts the same, the interrupted epoch included."""
    reference, resumed, runs = no_strategy_runs
    for out, name in ((reference, "reference"), (resumed, "resumed")):
        assert (out / "history.json").exists(), runs[name][1].format_logs()
        history = json.loads((out / "history.json").read_text())
        assert _examples_seen(history) == [800.0] * 4, history
        assert _examples_seen(history, "val_") == [200.0] * 4, history


def test_a_restart_with_another_batch_size_is_one_line_and_exit_2_on_every_worker(
    no_strategy_runs, tmp_path
):
    """A UsageError inside the user's script (from the backup) under the launcher."""
    _, resumed, _ = no_strategy_runs
    before = snapshot(resumed / "backup")
    override = json.dumps({"batch_size": 32})
    script = str(EXAMPLES / "no_strategy_script" / "after.py")
    codes, cluster = _job(
        tmp_path / "logs", [*JOB, f"--fit_override={override}", script, str(resumed)]
    )
    assert codes == {task: cli.EXIT_USAGE for task in WORKERS}, cluster.format_logs()
    for task in WORKERS:
        log = cluster.log(task)
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "arrays_batch_size=64" in errors[0], log
        assert "Traceback" not in log, log
    assert snapshot(resumed / "backup") == before


@pytest.fixture(scope="module")
def gan_runs(tmp_path_factory):
    """examples/gan_script/after.py: uninterrupted, then killed after step 14 and resumed.

    8 steps an epoch (256 images in batches of 32), backups every 4: the restart resumes
    from step 12, mid-epoch 2. Both complete runs also write every variable of the model
    and of both its optimizers (`--state`, tests/support/model_state.py); the uninterrupted
    job's chief lingers 15 s after the script ends, past TensorFlow's 10 s heartbeat
    timeout. The one 2-worker GAN run of the suite (tests/multiprocess/test_backup_tracked.py
    has the one-process one). A job that fails from the start is not run again.
    """
    tmp = tmp_path_factory.mktemp("gan")
    script = str(EXAMPLES / "gan_script" / "after.py")
    reference, resumed = tmp / "reference", tmp / "resumed"
    reference.mkdir()
    resumed.mkdir()
    runs = {
        "reference": _job(
            tmp / "logs-reference",
            [*JOB, f"--state={reference / 'state'}", "--chief_lingers=15", script, str(reference)],
        )
    }
    if set(runs["reference"][0].values()) == {0}:
        runs["killed"] = _job(
            tmp / "logs-killed",
            [*JOB, "--kill_after_batches=14", f"--state={resumed / 'state'}", script, str(resumed)],
        )
        runs["steps_when_killed"] = committed_steps(resumed / "backup")
        runs["state_when_killed"] = sorted(p.name for p in (resumed / "state").glob("*"))
        runs["resumed"] = _job(
            tmp / "logs-resumed", [*JOB, f"--state={resumed / 'state'}", script, str(resumed)]
        )
    return reference, resumed, runs


def test_gan_with_its_own_optimizers_killed_mid_epoch_resumes_exactly(gan_runs):
    reference, resumed, runs = gan_runs
    codes, cluster = runs["reference"]
    assert codes == {task: 0 for task in WORKERS}, cluster.format_logs()
    codes, cluster = runs["killed"]
    assert -signal.SIGKILL in codes.values(), cluster.format_logs()
    assert set(codes.values()) <= {-signal.SIGKILL, cli.EXIT_PEER_LOST}, cluster.format_logs()
    assert runs["steps_when_killed"][-1] == 12, runs["steps_when_killed"]
    assert runs["state_when_killed"] == [], runs["state_when_killed"]
    codes, cluster = runs["resumed"]
    assert codes == {task: 0 for task in WORKERS}, cluster.format_logs()
    log = cluster.log("worker:0")
    assert "Epoch 1/2" not in log, log
    assert "iterations: d_optimizer 16, g_optimizer 16" in log, log
    for name in ("discriminator.keras", "generator.keras"):
        for got, want in zip(_weights(resumed / name), _weights(reference / name), strict=True):
            np.testing.assert_array_equal(got, want)


def test_two_workers_killed_after_a_backup_resume_bit_for_bit(gan_runs):
    """Not only the saved networks: both optimizers' iterations and slots, the seed
    generator's state, the history and every other variable end as uninterrupted."""
    reference, resumed, runs = gan_runs
    assert runs["resumed"][0] == {task: 0 for task in WORKERS}, runs["resumed"][1].format_logs()
    model_state.assert_same_end(
        resumed / "state", reference / "state", steps=16, optimizers=("d_optimizer", "g_optimizer")
    )


# What TensorFlow prints when a task outlives another by its heartbeat timeout.
COORDINATION_CRASH = ("The tasks have crashed", "CoordinationServiceError", "Failed to send RPC")


def test_a_chief_that_outlives_its_peer_past_the_heartbeat_timeout_prints_no_crash(gan_runs):
    """The uninterrupted job's chief lingers 15 s after worker 1 is done: the job
    succeeded, so neither task may print the other as crashed."""
    codes, cluster = gan_runs[2]["reference"]
    assert codes == {task: 0 for task in WORKERS}, cluster.format_logs()
    logs = cluster.format_logs(max_chars_per_task=1_000_000)
    assert not [text for text in COORDINATION_CRASH if text in logs], logs
