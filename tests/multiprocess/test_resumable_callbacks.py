"""`tfdist.resumable.fit` with a typical script's callbacks: a resume ends where the
uninterrupted run ends, a finished job stays finished with its trained weights.

Most tests run tests/jobs/callbacks_script.py's `run` in this process: each call builds
a new model and new callbacks, as a restarted process would, and a crash is an
exception from tests/support/fault_injection.py. The slow ones kill real processes with
SIGKILL and run 2 workers.
"""

import json
import pathlib
import signal
import sys

import numpy as np
import pytest

from tests.jobs import callbacks_script as script
from tests.support.logged_process import finish, log_tail, start_logged
from tests.unit.test_resumable_callbacks import (  # shared with the in-process half
    _assert_like_reference,
    _weights,
)
from tfdist.cli import EXIT_PEER_LOST

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "jobs" / "callbacks_script.py"
TIMEOUT = 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The script run from start to end without interruption."""
    out = tmp_path_factory.mktemp("reference")
    result = script.run(out)
    # The scenario the tests rely on: a reduced learning rate, an early stop, an
    # early best epoch.
    assert result["learning_rate"] < 0.005
    assert 0 < result["early_stopping"]["stopped_epoch"] < script.EPOCHS - 1
    assert result["early_stopping"]["best_epoch"] < result["early_stopping"]["stopped_epoch"]
    return out, result


def test_sigkill_twice_then_reruns_end_like_the_uninterrupted_script(tmp_path, reference):
    def run(*flags: str) -> tuple[int, str]:
        process = start_logged(
            [sys.executable, str(SCRIPT), str(tmp_path), *flags], tmp_path, cwd=REPO
        )
        return finish(process, timeout=TIMEOUT), log_tail(process)

    for kill_after in (20, 23):  # steps 20 and 41 (an epoch's first step)
        code, log = run(f"--kill_after_batches={kill_after}")
        assert code == -signal.SIGKILL, log
    for _ in range(3):  # the resume, then two reruns of the finished job
        code, log = run()
        assert code == 0, log
        result = json.loads((tmp_path / "result.json").read_text())
        _assert_like_reference(tmp_path, result, reference)


MULTIWORKER_ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def test_two_workers_killed_mid_epoch_resume_and_only_the_chief_writes_files(
    local_cluster, tmp_path, reference
):
    """Both workers are SIGKILLed at step 20, the job restarts; the CSV log is appended to
    (CSVLogger(append=True)), so a second writer would show as a second header and rows."""
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), str(out), "--multiworker"]
    killed = local_cluster(
        num_workers=2, command=[*command, "--kill_after_batches=20"], env=MULTIWORKER_ENV
    )
    killed.start()
    codes = killed.wait(timeout=TIMEOUT, stop_on_failure=False)
    # A worker whose peer killed itself first loses it inside a collective, before its own
    # kill, and exits 200 (tfdist.resumable.PeerLost): both are a job to restart.
    assert -signal.SIGKILL in codes.values(), killed.format_logs()
    assert set(codes.values()) <= {-signal.SIGKILL, EXIT_PEER_LOST}, killed.format_logs()
    resumed = local_cluster(num_workers=2, command=command, env=MULTIWORKER_ENV)
    resumed.start()
    codes = resumed.wait(timeout=TIMEOUT)
    assert set(codes.values()) == {0}, resumed.format_logs()

    assert sorted(path.name for path in out.iterdir()) == [
        "backup",
        "best.keras",
        "log.csv",
        "model.keras",
        "result.json",
    ]
    rows = (out / "log.csv").read_text().splitlines()
    expected_rows = (reference[0] / "log.csv").read_text().splitlines()
    assert rows[0] == expected_rows[0] and rows.count(rows[0]) == 1
    assert [row.split(",")[0] for row in rows[1:]] == [
        row.split(",")[0] for row in expected_rows[1:]
    ]
    result, expected = json.loads((out / "result.json").read_text()), reference[1]
    assert result["learning_rate"] == expected["learning_rate"]
    assert result["early_stopping"]["stopped_epoch"] == expected["early_stopping"]["stopped_epoch"]
    assert result["iterations"] == expected["iterations"]
    # 2 workers average the same global batch as one process: equal up to round-off.
    for got, want in zip(
        _weights(out / "model.keras"), _weights(reference[0] / "model.keras"), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
