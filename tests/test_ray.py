"""tfdist under Ray Train's own TensorflowTrainer with `tfdist.ray.TensorflowConfig`:
a real local Ray cluster (loopback, 2 CPUs, no dashboard). In one run (Ray's
start-up dominates): worker 1 is SIGKILLed at step 10, and after Ray's restart
it gets a SIGTERM at step 18; each time Ray's FailureConfig restarts the group
and tfdist resumes from its backups."""

import re

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.logged_process import clean_environment

pytest.importorskip("ray.train")

REPO = pathlib.Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "ray_train_job.py"
TIMEOUT = 400


def _start(out: pathlib.Path, *args) -> subprocess.Popen:
    """Starts the job in its own session (Ray's processes with it), output in `out/log.txt`."""
    out.mkdir(parents=True)
    env = clean_environment()
    # Ray swaps 127.0.0.1 for the machine's address unless clusters are off: keep it on loopback.
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", CUDA_VISIBLE_DEVICES="",
               RAY_USAGE_STATS_ENABLED="0")
    with open(out / "log.txt", "wb") as log:
        process = subprocess.Popen([sys.executable, str(JOB), f"--out={out}", *args], cwd=REPO,
                                   env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    process.out = out
    return process


def _finish(*processes: subprocess.Popen) -> list[str]:
    """Waits for each (every one is killed, with its session, on a timeout); their logs."""
    try:
        codes = [process.wait(timeout=TIMEOUT) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    logs = [(process.out / "log.txt").read_text(errors="replace") for process in processes]
    for code, log in zip(codes, logs):
        assert code == 0, log[-6000:]
    return logs


@pytest.mark.slow
def test_a_killed_then_preempted_worker_under_ray_resumes_at_the_exact_steps(tmp_path):
    reference_run = _start(tmp_path / "reference", "--reference")  # one process, no Ray
    log, _ = _finish(_start(tmp_path / "ray", "--workers=2", "--kill_rank=1",
                            "--kill_at_step=10", "--term_at_step=18", "--max_failures=2"),
                     reference_run)
    out = tmp_path / "ray"

    assert (out / "killed").read_text() == "10"
    assert (out / "terminated").read_text() == "18"
    starts = [json.loads(line) for line in (out / "starts.txt").read_text().splitlines()]
    assert sorted(start["rank"] for start in starts) == [0, 0, 0, 1, 1, 1], starts  # 2 restarts
    for start in starts:
        assert start["keras"].startswith("3.") and start["legacy"] == "0", start
        assert start["replicas"] == 2 and start["hosts"] == ["127.0.0.1"], start
    # After the SIGKILL: the backup before it (save_freq 4).
    assert "Resuming from the backup at step 8 " in log, log[-6000:]
    # The SIGTERM reached tfdist on Ray's training thread; the workers agreed on a step,
    # backed it up, and the restart resumed exactly there.
    assert "Received SIGTERM" in log, log[-6000:]
    agreed = re.findall(r"Preemption notice agreed: stopping after step (\d+)", log)
    assert agreed and len(set(agreed)) == 1 and 18 <= int(agreed[0]) < 24, agreed
    assert f"Resuming from the backup at step {agreed[0]} " in log, log[-6000:]

    # Every step ran exactly once, and the weights are those of one uninterrupted process.
    assert json.loads((out / "iterations.json").read_text()) == 24
    ray_weights = np.load(out / "weights.npz")
    reference = np.load(tmp_path / "reference" / "weights.npz")
    difference = max(float(np.abs(ray_weights[name] - reference[name]).max())
                     for name in reference.files)
    print(f"max |ray, killed and resumed - one process| = {difference:.2e}")
    assert difference < 1e-6

    # tfdist's committed backups are Ray's checkpoints, the last one at the last step.
    result = json.loads((out / "result.json").read_text())
    assert result["error"] is None and result["metrics"]["step"] == 24, result
    checkpoint = pathlib.Path(result["checkpoint"])
    assert checkpoint.name == "tfdist-backup-000000000024"
    assert json.loads((checkpoint / "metadata.json").read_text())["step"] == 24
    reported = sorted(path.name for path in checkpoint.parent.glob("tfdist-backup-*"))
    assert reported[-1] == checkpoint.name and len(reported) >= 2, reported


def test_the_config_is_rays_own_and_refuses_a_bad_keras_choice():
    import ray.train.tensorflow  # pylint: disable=g-import-not-at-top

    import tfdist.ray  # pylint: disable=g-import-not-at-top
    from tfdist.errors import UsageError  # pylint: disable=g-import-not-at-top

    config = tfdist.ray.TensorflowConfig()
    assert isinstance(config, ray.train.tensorflow.TensorflowConfig)
    assert config.to_dict() == {"preemption_signals": [int(signal.SIGTERM)], "legacy_keras": "0"}
    with pytest.raises(UsageError, match="legacy_keras is 'yes', expected '0'"):
        tfdist.ray.TensorflowConfig(legacy_keras="yes")
