"""keras.io's GAN on `tfdist.resumable.fit`, killed with SIGKILL after a committed backup and
resumed, ends bit for bit where the uninterrupted run ends: its weights, both of its own
optimizers (their iterations and slots), its seed generator. One process and two workers.

The in-process half (a raised crash, the keys, the refusals) is
tests/unit/test_backup_tracked.py.
"""

import json
import pathlib
import signal
import sys

import numpy as np

from tests.jobs import gan_script
from tests.support.logged_process import finish, log_tail, start_logged
from tfdist.cli import EXIT_PEER_LOST

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "jobs" / "gan_script.py"
TIMEOUT = 240
# Backups every 3 steps: killed after step 7, the job resumes from step 6, mid-epoch 1.
KILL_AFTER = 7
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def _arrays(out: pathlib.Path) -> dict[str, np.ndarray]:
    with np.load(out / "weights.npz") as data:
        return {name: data[name] for name in data.files}


def _assert_same_end(out: pathlib.Path, reference: pathlib.Path) -> None:
    result = json.loads((out / "result.json").read_text())
    expected = json.loads((reference / "result.json").read_text())
    steps = gan_script.EPOCHS * gan_script.STEPS_PER_EPOCH
    assert expected["d_iterations"] == expected["g_iterations"] == steps
    assert result == expected
    want, got = _arrays(reference), _arrays(out)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _run(out: pathlib.Path, *flags: str) -> tuple[int, str]:
    process = start_logged([sys.executable, str(SCRIPT), str(out), *flags], out, cwd=REPO)
    return finish(process, timeout=TIMEOUT), log_tail(process)


def test_one_process_killed_after_a_backup_resumes_bit_for_bit(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    out.mkdir()
    gan_script.run(reference)  # in this process: one TensorFlow start-up less
    code, log = _run(out, f"--kill_after_batches={KILL_AFTER}")
    assert code == -signal.SIGKILL, log
    assert not (out / "result.json").exists()
    code, log = _run(out)
    assert code == 0, log
    _assert_same_end(out, reference)


def _cluster_run(local_cluster, out: pathlib.Path, *flags: str, expect_success: bool = True):
    cluster = local_cluster(
        num_workers=2,
        command=[sys.executable, str(SCRIPT), str(out), "--multiworker", *flags],
        env=ENV,
    )
    cluster.start()
    codes = cluster.wait(timeout=TIMEOUT, stop_on_failure=expect_success)
    if expect_success:
        assert set(codes.values()) == {0}, cluster.format_logs()
    return codes, cluster


# What TensorFlow prints when a task outlives another by its heartbeat timeout.
COORDINATION_CRASH = ("The tasks have crashed", "CoordinationServiceError", "Failed to send RPC")


def test_two_workers_killed_after_a_backup_resume_bit_for_bit(local_cluster, tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    # The chief outlives worker 1 by more than the 10 s heartbeat timeout; the job
    # succeeded, so neither may print the other as crashed.
    _, cluster = _cluster_run(local_cluster, reference, "--chief_lingers=15")
    logs = cluster.format_logs(max_chars_per_task=1_000_000)
    assert not [text for text in COORDINATION_CRASH if text in logs], logs
    codes, killed = _cluster_run(
        local_cluster, out, f"--kill_after_batches={KILL_AFTER}", expect_success=False
    )
    assert -signal.SIGKILL in codes.values(), killed.format_logs()
    assert set(codes.values()) <= {-signal.SIGKILL, EXIT_PEER_LOST}, killed.format_logs()
    assert not (out / "result.json").exists()
    _cluster_run(local_cluster, out)
    _assert_same_end(out, reference)
