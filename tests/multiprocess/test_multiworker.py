"""Keras 3 under MultiWorkerMirroredStrategy: equal to one process, and the upstream bug.

Every test here starts real TensorFlow processes on loopback through
`tfdist.launch.testing.local_cluster` (or, for runs several tests share, a
`LocalCluster` in a module fixture), which keeps per-task logs, prints them when a
test fails and checks that no process is left behind.
"""

import json
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support import model_state
from tfdist.launch.testing import SHARED_PRELOADERS, poll_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = str(ROOT / "tests" / "jobs" / "multiworker_task.py")
ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
WAIT_SECONDS = 240


def _single_env() -> dict:
    import os  # pylint: disable=g-import-not-at-top

    env = {
        key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "CLUSTER_SPEC")
    }
    env.update(ENV)
    return env


def _start_single(args: list[str], log_path: pathlib.Path) -> subprocess.Popen:
    """Starts one process without a cluster; its output goes to `log_path`."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=_single_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _run_cluster(local_cluster, args: list[str], num_workers: int = 2) -> dict:
    cluster = local_cluster(num_workers=num_workers, command=[sys.executable, *args], env=ENV)
    cluster.start()
    codes = cluster.wait(timeout=WAIT_SECONDS)
    assert set(codes.values()) == {0}, cluster.format_logs()
    return codes


def _run_single_beside_cluster(
    local_cluster, single_args: list[str], cluster_args: list[str], log_path: pathlib.Path
) -> None:
    """Runs one process and a 2-worker cluster side by side: they share nothing but flags.

    The single process's output goes to `log_path`, shown if it fails.
    """
    single = _start_single(single_args, log_path)
    try:
        _run_cluster(local_cluster, cluster_args)
        code = single.wait(timeout=WAIT_SECONDS)
    finally:
        if single.poll() is None:  # the cluster failed or a wait timed out
            single.kill()
            single.wait()
    assert code == 0, log_path.read_text(errors="replace")[-4000:]


def _weights(npz_path: pathlib.Path) -> list[np.ndarray]:
    with np.load(npz_path, allow_pickle=False) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


def _model_weights(model_dir: pathlib.Path) -> list[np.ndarray]:
    import keras  # pylint: disable=g-import-not-at-top

    # Its first use registers tfdist>LARS, tfdist>LAMB and tfdist>WarmupDecay with Keras.
    from tfdist.optimizers import LARS  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True)
    return model.get_weights()


def _max_difference(left: list[np.ndarray], right: list[np.ndarray]) -> float:
    assert [w.shape for w in left] == [w.shape for w in right]
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


# The case whose 2-worker cluster also has an evaluator: the evaluator test below
# reads that run's outputs (an evaluator reads checkpoints; it changes no weight).
# LARS and 5 steps per execution are checked in one run: the optimizer and the fused
# loop are independent (SGD on 2 workers against one process, at auto's choice of
# steps per execution, is tests/multiprocess/test_execution_tuner.py's).
EVALUATED_CASE = ("mlp", "lars", "1.0", "5")


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    """`run(model, optimizer, learning_rate, steps_per_execution) -> (one, two)` output dirs.

    Each configuration runs once on one process and once on 2 workers, side by
    side (they share nothing but flags), the first time a test asks for it.
    """
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top

    done = {}

    def run(*case: str) -> tuple[pathlib.Path, pathlib.Path]:
        if case in done:
            return done[case]
        model, optimizer, learning_rate, steps_per_execution = case
        tmp_path = tmp_path_factory.mktemp("-".join(case))
        common = [
            "-m",
            "trainer.task",
            f"--model={model}",
            f"--optimizer={optimizer}",
            f"--learning_rate={learning_rate}",
            "--global_batch_size=64",
            "--epochs=2",
            f"--steps_per_execution={steps_per_execution}",
            "--steps_per_epoch=10",
            "--num_examples=2048",
            "--seed=3",
        ]
        one, two = tmp_path / "one", tmp_path / "two"
        single = _start_single(
            [*common, "--strategy=default", f"--model_dir={one}"], tmp_path / "one.log"
        )
        try:
            with LocalCluster(
                preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
                num_workers=2,
                has_evaluator=case == EVALUATED_CASE,
                env=ENV,
                log_dir=tmp_path / "two-logs",
                command=[sys.executable, *common, "--strategy=multiworker", f"--model_dir={two}"],
            ) as cluster:
                codes = cluster.wait(timeout=WAIT_SECONDS)
                assert set(codes.values()) == {0}, cluster.format_logs()
            code = single.wait(timeout=WAIT_SECONDS)
        finally:
            if single.poll() is None:  # the cluster failed or a wait timed out
                single.kill()
                single.wait()
        assert code == 0, (tmp_path / "one.log").read_text(errors="replace")[-4000:]
        done[case] = one, two
        return one, two

    return run


@pytest.mark.parametrize(
    "model,optimizer,learning_rate,steps_per_execution",
    [EVALUATED_CASE, ("cnn", "adam", "0.001", "1")],
)
def test_two_workers_end_with_the_weights_of_one_process(
    trainer_runs, model, optimizer, learning_rate, steps_per_execution
):
    one_dir, two_dir = trainer_runs(model, optimizer, learning_rate, steps_per_execution)

    one = json.loads((one_dir / "summary.json").read_text())
    two = json.loads((two_dir / "summary.json").read_text())
    assert (two["num_workers"], two["num_replicas"], two["steps_completed"]) == (2, 2, 20)
    assert one["steps_completed"] == 20
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-5)
    assert _max_difference(_model_weights(one_dir), _model_weights(two_dir)) < 1e-5


def test_only_the_chief_writes_and_an_evaluator_reads_its_checkpoints(trainer_runs):
    _, out = trainer_runs(*EVALUATED_CASE)

    written = {path.relative_to(out).parts[0] for path in out.rglob("*") if path.is_file()}
    assert written == {"checkpoints", "eval", "logs", "model.keras", "summary.json"}, written
    evaluated = [
        json.loads(line) for line in (out / "eval" / "metrics.jsonl").read_text().splitlines()
    ]
    assert evaluated[-1]["step"] == 20, evaluated
    assert set(evaluated[-1]["metrics"]) == {"loss", "accuracy"}


# The flags of the shared runs below: 4 steps per graph execution, and every task
# records the logs its `on_train_batch_end` saw (a callback that only reads them).
SHARED_FLAGS = ("--steps=8", "--steps_per_execution=4", "--record")


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory):
    """The task at `SHARED_FLAGS` on one device, on 2 local CPUs and on 2 workers.

    The three runs differ only in their strategy and share nothing but flags:
    they run side by side, once for the tests below that compare them.

    Returns:
        {"one_device" | "mirrored" | "two_workers": output directory}.
    """
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top

    tmp_path = tmp_path_factory.mktemp("shared_runs")
    outs = {name: tmp_path / name for name in ("one_device", "mirrored", "two_workers")}
    for out in outs.values():
        out.mkdir()
    singles = {
        "one_device": ["--strategy=default"],
        "mirrored": ["--strategy=mirrored", "--num_cpu_devices=2"],
    }
    started = {
        name: _start_single(
            [TASK, *strategy, f"--out={outs[name]}", *SHARED_FLAGS], tmp_path / f"{name}.log"
        )
        for name, strategy in singles.items()
    }
    try:
        with LocalCluster(
            preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
            num_workers=2,
            env=ENV,
            log_dir=tmp_path / "two_workers-logs",
            command=[
                sys.executable,
                TASK,
                "--strategy=multiworker",
                f"--out={outs['two_workers']}",
                *SHARED_FLAGS,
            ],
        ) as cluster:
            codes = cluster.wait(timeout=WAIT_SECONDS)
            assert set(codes.values()) == {0}, cluster.format_logs()
        for name, process in started.items():
            code = process.wait(timeout=WAIT_SECONDS)
            log = (tmp_path / f"{name}.log").read_text(errors="replace")
            assert code == 0, f"{name} exited {code}:\n{log[-4000:]}"
    finally:
        for process in started.values():
            if process.poll() is None:  # a run failed or a wait timed out
                process.kill()
                process.wait()
    return outs


def test_evaluate_and_predict_under_two_workers_equal_one_process(shared_runs):
    one, two = shared_runs["one_device"], shared_runs["two_workers"]
    assert _max_difference(_weights(one / "weights.npz"), _weights(two / "weights.npz")) < 1e-5
    one_eval = json.loads((one / "evaluate.json").read_text())
    two_eval = json.loads((two / "evaluate.json").read_text())
    assert two_eval == pytest.approx(one_eval, rel=1e-5)
    one_predict = np.load(one / "predict.npy", allow_pickle=False)
    two_predict = np.load(two / "predict.npy", allow_pickle=False)
    assert two_predict.shape == one_predict.shape == (100, 10)
    np.testing.assert_allclose(two_predict, one_predict, rtol=1e-5, atol=1e-5)


def _json(path: pathlib.Path):
    return json.loads(path.read_text())


def test_fused_executions_under_two_workers_equal_two_local_cpus(shared_runs):
    """`steps_per_execution=4`: 4 steps per graph execution, the same result as mirrored.

    Also the per-batch logs (what the progress bar and batch callbacks see):
    equal on both workers and in one process, and the last one equals the
    epoch log, which Keras reads from the metric variables, so a reduction of
    step outputs that summed replicas instead of averaging them fails here.
    """
    one, two = shared_runs["mirrored"], shared_runs["two_workers"]

    assert _json(two / "train_graph.json") == {"fused": True, "while_reaches_all_reduce": True}
    assert _max_difference(_weights(one / "weights.npz"), _weights(two / "weights.npz")) < 1e-6
    assert _json(two / "evaluate.json") == pytest.approx(_json(one / "evaluate.json"), rel=1e-6)

    single = _json(one / "batch_logs-single.json")
    assert [log["batch"] for log in single] == [3, 7]
    for task in ("worker-0", "worker-1"):
        logs = _json(two / f"batch_logs-{task}.json")
        assert [log["batch"] for log in logs] == [3, 7]
        for got, expected in zip(logs, single):
            assert got == pytest.approx(expected, rel=1e-6), task
    epoch = {name: values[-1] for name, values in _json(two / "history.json").items()}
    assert set(epoch) == {"loss", "accuracy"}
    assert {name: single[-1][name] for name in epoch} == pytest.approx(epoch, rel=1e-6)
    assert {name: logs[-1][name] for name in epoch} == pytest.approx(epoch, rel=1e-6)


def test_replica_xla_under_two_workers_equals_two_local_cpus(local_cluster, tmp_path):
    """`jit_compile=True`: each replica's step compiled by XLA, the all-reduce outside."""
    one, two = tmp_path / "mirrored", tmp_path / "two_workers"
    one.mkdir()
    two.mkdir()
    flags = ["--steps=8", "--steps_per_execution=4", "--jit_compile"]
    _run_single_beside_cluster(
        local_cluster,
        [TASK, "--strategy=mirrored", "--num_cpu_devices=2", f"--out={one}", *flags],
        [TASK, "--strategy=multiworker", f"--out={two}", *flags],
        tmp_path / "mirrored.log",
    )
    assert _max_difference(_weights(one / "weights.npz"), _weights(two / "weights.npz")) < 1e-6
    assert _json(two / "evaluate.json") == pytest.approx(_json(one / "evaluate.json"), rel=1e-6)


def test_mirrored_on_two_logical_cpus_equals_one_device(shared_runs):
    one, two = shared_runs["one_device"], shared_runs["mirrored"]
    assert _max_difference(_weights(one / "weights.npz"), _weights(two / "weights.npz")) < 1e-5
    np.testing.assert_allclose(
        np.load(two / "predict.npy"), np.load(one / "predict.npy"), rtol=1e-5, atol=1e-5
    )


@pytest.fixture(scope="module")
def upstream_errors(tmp_path_factory):
    """What `fit` raised on each worker under each upstream setting, from one 2-worker run.

    `--compat=each_upstream`: every task tries `fit` with no correction, then
    with the first, then with both reductions corrected (each failure comes
    before the next one's place), and records each error. Skips when this Keras
    is not patched.

    Returns:
        {task: {setting: error text or None}}.
    """
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top

    if not keras_compat.needs_patch():
        pytest.skip(f"keras {keras_compat.keras_version()} is not patched")
    out = tmp_path_factory.mktemp("upstream")
    with LocalCluster(
        preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
        num_workers=2,
        env=ENV,
        log_dir=out / "logs",
        command=[
            sys.executable,
            TASK,
            "--strategy=multiworker",
            "--compat=each_upstream",
            f"--out={out}",
            "--steps=4",
            "--steps_per_execution=2",
        ],
    ) as cluster:
        codes = cluster.wait(timeout=WAIT_SECONDS)
        assert set(codes.values()) == {0}, cluster.format_logs()
    return {task: _json(out / f"upstream-{task}.json") for task in ("worker-0", "worker-1")}


@pytest.mark.parametrize(
    "compat,upstream_error",
    [
        ("none", "Attempt to convert a value (PerReplica"),
        ("build_only", "Invalid reduction dimension 0"),
        ("no_steps_per_execution", "You must feed a value for placeholder tensor"),
    ],
)
def test_upstream_keras_still_fails_without_the_compat_layer(
    upstream_errors, compat, upstream_error
):
    """When this fails, upstream fixed the bug: raise `FIRST_FIXED_KERAS` and retire the patch."""
    for task, errors in upstream_errors.items():
        assert errors[compat] is not None and upstream_error in errors[compat], (task, errors)


@pytest.mark.parametrize("program", ["trainer.task", "resumable script"])
def test_survivor_fails_within_a_bound_when_a_peer_dies(local_cluster, tmp_path, program):
    if program == "trainer.task":
        command, started = (
            [
                sys.executable,
                "-m",
                "trainer.task",
                "--strategy=multiworker",
                "--epochs=2",
                "--steps_per_epoch=100000",
                "--num_examples=512",
            ],
            "Epoch 1/2",
        )
    else:  # a user's own script: tfdist.resumable.fit exits 200 too (tfdist.resumable.PeerLost)
        command, started = (
            [
                sys.executable,
                str(ROOT / "tests" / "jobs" / "lost_peer_script.py"),
                str(tmp_path / "backup"),
            ],
            "training",
        )
    cluster = local_cluster(num_workers=2, command=command, env=ENV)
    cluster.start()
    poll_until(
        lambda: started in cluster.log("worker:0"),
        timeout=WAIT_SECONDS,
        what="the chief to start training",
    )
    killed_at = time.monotonic()
    assert cluster.kill("worker:1", signal.SIGKILL)
    codes = cluster.wait(timeout=120, stop_on_failure=False)
    survivor_seconds = time.monotonic() - killed_at
    assert codes["worker:1"] == -signal.SIGKILL
    # 200 (tfdist.cli.EXIT_PEER_LOST): >= 128, so TFJob's ExitCode policy retries it.
    assert codes["worker:0"] == 200, cluster.format_logs()
    assert "error: lost contact with another task of the job" in cluster.log("worker:0")
    # First after training started, before TensorFlow's C++ lines about the aborted
    # collective (tfdist._internal.peer_noise).
    after = cluster.log("worker:0").split(f"{started}\n", 1)[1]
    assert after.startswith("error: lost contact with another task"), after
    print(f"survivor exited {codes['worker:0']} {survivor_seconds:.1f} s after its peer died")


def test_deterministic_two_workers_equal_two_local_cpus_bit_for_bit(local_cluster, tmp_path):
    """`--deterministic`: a biased conv before batch norm, Adam, 16 steps.

    With grappler on, the one-process two-device step is rewritten otherwise than each
    worker's step, and the conv's bias ended 1.1e-3 apart (every other weight 2.4e-7).
    """
    one, two = tmp_path / "mirrored", tmp_path / "two_workers"
    flags = [
        "-m",
        "trainer.task",
        "--task=tests.jobs.tasks.toy_tasks:ConvBeforeNormTask",
        "--deterministic",
        "--optimizer=adam",
        "--learning_rate=0.01",
        "--epochs=2",
        "--global_batch_size=32",
        "--steps_per_execution=1",
    ]
    _run_single_beside_cluster(
        local_cluster,
        [*flags, "--strategy=mirrored", "--num_cpu_devices=2", f"--model_dir={one}"],
        [*flags, "--strategy=multiworker", f"--model_dir={two}"],
        tmp_path / "mirrored.log",
    )
    want, got = model_state.saved_weights(one), model_state.saved_weights(two)
    assert sorted(got) == sorted(want) and len(want) > 8
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
