"""tfdist checked against implementations nobody here wrote, kept in the suite.

| tfdist | peer | tolerance |
|---|---|---|
| Keras 3 + tfdist on 2 workers (MWMS) | tf_keras (Keras 2) on 2 workers | 0 |
| `tfdist.optimizers.LARS` | Model Garden `official/modeling/optimization/lars.py` | 0 |
| `tfdist.optimizers.LAMB` | Model Garden `lamb.py` (TF Addons' code) | 1e-5 relative |
| TF's "Multi-worker training with Keras" tutorial | upstream Keras 3 (fails) | trains |

The full table, with the measured differences, is docs/peers.md.

The peers are installed packages, never fetched here: `tf-keras` from the
`peers` extra, and `tf-models-official` installed without its requirements
(it pins another TensorFlow; see docs/peers.md). A test that needs a peer that
is not installed is skipped, except under CI (`CI=true`), where `.ci/run`
installs the peers and a missing one fails the test. TF Addons is not compared
directly: it does not import under TensorFlow 2.21; Model Garden's `lamb.py`
carries its LAMB.

Select these tests with `python -m pytest -m peers`.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.unit.test_peers import (  # shared with the in-process half
    _assert_bitwise_equal,
    _max_difference,
    _require_peer,
)

pytestmark = pytest.mark.peers

ROOT = pathlib.Path(__file__).resolve().parents[2]
MLP_JOB = ROOT / "tests" / "jobs" / "mlp_job.py"
TUTORIAL = ROOT / "examples" / "multiworker_tutorial" / "main.py"
ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
WAIT_SECONDS = 300  # A backstop against hangs, never a speed assertion.
STEPS = 30


# ---------------------------------------------------------------------------------------
# Multi-worker: Keras 3 + tfdist against tf_keras, each on a 2-worker local cluster.


def _weights(path: pathlib.Path) -> list[np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


def _job_reports(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _mlp_job(framework: str, initial: pathlib.Path, out: pathlib.Path) -> list[str]:
    out.mkdir()
    return [
        sys.executable,
        str(MLP_JOB),
        f"--framework={framework}",
        f"--initial={initial}",
        f"--out={out}",
        f"--steps={STEPS}",
    ]


def _cluster_reports(cluster, codes) -> list[dict]:
    assert set(codes.values()) == {0}, cluster.format_logs()
    return [report for task in cluster.tasks for report in _job_reports(cluster.log(task))]


def _start_one_process(command: list[str], out: pathlib.Path) -> subprocess.Popen:
    """Starts `command` without a cluster; stdout to <out>/stdout.txt, stderr to log.txt."""
    environ = {
        key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "CLUSTER_SPEC")
    }
    with open(out / "stdout.txt", "wb") as stdout, open(out / "log.txt", "wb") as stderr:
        return subprocess.Popen(command, env={**environ, **ENV}, stdout=stdout, stderr=stderr)


def _finish_one_process(process: subprocess.Popen, timeout: float) -> int:
    """The exit code; kills the process if it outlives `timeout`."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_keras3_with_tfdist_on_two_workers_equals_tf_keras_on_two_workers(local_cluster, tmp_path):
    _require_peer("tf-keras")
    rng = np.random.default_rng(3)
    initial = tmp_path / "initial.npz"
    np.savez(
        initial,
        (0.3 * rng.normal(size=(8, 16))).astype(np.float32),
        np.zeros(16, np.float32),
        (0.3 * rng.normal(size=(16, 3))).astype(np.float32),
        np.zeros(3, np.float32),
    )

    # The three runs share nothing but their inputs: they run side by side.
    clusters = {
        framework: local_cluster(
            num_workers=2, env=ENV, command=_mlp_job(framework, initial, tmp_path / framework)
        )
        for framework in ("keras3", "tf_keras")
    }
    for cluster in clusters.values():
        cluster.start()
    single = _start_one_process(
        _mlp_job("tf_keras", initial, tmp_path / "one_process"), tmp_path / "one_process"
    )
    try:
        codes = {
            framework: cluster.wait(timeout=WAIT_SECONDS) for framework, cluster in clusters.items()
        }
        single_code = _finish_one_process(single, WAIT_SECONDS)
    finally:
        if single.poll() is None:  # a cluster failed or timed out first
            single.kill()
            single.wait()
    assert single_code == 0, (tmp_path / "one_process" / "log.txt").read_text()[-4000:]
    reports = {
        framework: _cluster_reports(cluster, codes[framework])
        for framework, cluster in clusters.items()
    }
    reports["one_process"] = _job_reports((tmp_path / "one_process" / "stdout.txt").read_text())
    # One report per optimizer (SGD, Adam) per process.
    for run, processes in (("keras3", 2), ("tf_keras", 2), ("one_process", 1)):
        assert len(reports[run]) == 2 * processes, reports[run]
        assert {(r["steps"], r["replicas"]) for r in reports[run]} == {(STEPS, processes)}

    for optimizer in ("sgd", "adam"):
        runs = {
            f"{framework} worker {i}": _weights(tmp_path / framework / f"{optimizer}-worker{i}.npz")
            for framework in ("keras3", "tf_keras")
            for i in (0, 1)
        }
        one_process = _weights(tmp_path / "one_process" / f"{optimizer}-single.npz")
        assert _max_difference(_weights(initial), one_process) > 0.1  # It trained.
        for name, weights in runs.items():
            _assert_bitwise_equal(
                weights, runs["tf_keras worker 0"], f"{optimizer}: {name} against tf_keras worker 0"
            )
        # One process sums the global batch's 64 gradients at once, two workers
        # sum 32 each and then add: float32 round-off, measured 6e-8 (SGD) and
        # 1.8e-7 (Adam) after 30 steps.
        assert _max_difference(runs["keras3 worker 0"], one_process) < 1e-6, optimizer


# ---------------------------------------------------------------------------------------
# TensorFlow's "Multi-worker training with Keras" tutorial, as a Keras 3 user runs it.


@pytest.fixture(scope="module")
def tutorial_runs(tmp_path_factory):
    """The tutorial on 2 workers with the compat layer and, if Keras still needs it,
    without: two independent clusters, run side by side once for both tests below.

    Returns:
        {"compat" | "upstream": (cluster, exit codes, model path)}; no "upstream"
        when this Keras is not patched.
    """
    import contextlib  # pylint: disable=g-import-not-at-top

    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top
    from tfdist.launch.testing import SHARED_PRELOADERS  # pylint: disable=g-import-not-at-top

    tmp_path = tmp_path_factory.mktemp("tutorial")
    runs = {"compat": (tmp_path / "compat" / "model" / "model.keras", ())}
    if keras_compat.needs_patch():
        runs["upstream"] = (tmp_path / "upstream" / "model.keras", ("--upstream_keras",))
    with contextlib.ExitStack() as stack:
        clusters = {}
        for name, (model_path, extra) in runs.items():
            model_path.parent.mkdir(parents=True)
            clusters[name] = stack.enter_context(
                LocalCluster(
                    preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
                    num_workers=2,
                    env=ENV,
                    log_dir=tmp_path / name / "logs",
                    command=[
                        sys.executable,
                        str(TUTORIAL),
                        "--epochs=2",
                        "--steps_per_epoch=10",
                        f"--model_path={model_path}",
                        *extra,
                    ],
                )
            )
        results = {
            name: (cluster, cluster.wait(timeout=WAIT_SECONDS), runs[name][0])
            for name, cluster in clusters.items()
        }
    return results


def test_tutorial_trains_on_two_workers_with_the_compat_layer(tutorial_runs):
    cluster, codes, model_path = tutorial_runs["compat"]
    assert set(codes.values()) == {0}, cluster.format_logs()

    reports = {task: _job_reports(cluster.log(task))[-1] for task in cluster.tasks}
    assert set(reports) == {"worker:0", "worker:1"}
    for report in reports.values():
        assert report["num_workers"] == 2 and report["steps"] == 20, report
        assert report["loss"][1] < report["loss"][0], report  # It learns.
    assert reports["worker:0"]["weights_sha256"] == reports["worker:1"]["weights_sha256"]
    assert reports["worker:0"]["loss"] == reports["worker:1"]["loss"]
    # As in the tutorial: the chief saved the model; worker 1 removed its copy.
    assert sorted(p.name for p in model_path.parent.iterdir()) == ["model.keras"]
    import keras  # pylint: disable=g-import-not-at-top

    saved = keras.saving.load_model(model_path, safe_mode=True)
    assert saved.count_params() > 0


def test_tutorial_fails_on_upstream_keras_without_the_compat_layer(tutorial_runs):
    """When this fails, upstream Keras fixed the bug and the layer can come off."""
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    if "upstream" not in tutorial_runs:
        pytest.skip(f"keras {keras_compat.keras_version()} is not patched")
    cluster, codes, model_path = tutorial_runs["upstream"]

    assert any(code not in (0, None) for code in codes.values()), cluster.format_logs()
    logs = "".join(cluster.log(task) for task in cluster.tasks)
    assert "ValueError: Attempt to convert a value (PerReplica" in logs, cluster.format_logs()
    assert not model_path.exists()
