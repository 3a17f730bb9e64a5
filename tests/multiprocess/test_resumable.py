"""`tfdist.resumable`: a Keras script gains strategy, exact resume and preemption in three lines."""

import pathlib
import sys

import keras
import numpy as np

from tests.support.logged_process import finish, log_tail, start_logged
from tfdist.cli import EXIT_PREEMPTED

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "resumable_script"
TIMEOUT = 300


def _weights(path: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(path / "model.keras", safe_mode=True, compile=False)
    return model.get_weights()


def _run(command: list[str], out: pathlib.Path) -> tuple[int, str]:
    process = start_logged(command, out, cwd=REPO)
    code = finish(process, timeout=TIMEOUT)
    return code, log_tail(process)


def test_a_preempted_script_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    reference.mkdir()
    resumed.mkdir()
    code, log = _run([sys.executable, str(SCRIPTS / "after.py"), str(reference)], reference)
    assert code == 0, log

    job = [
        sys.executable,
        str(REPO / "tests" / "jobs" / "preempted_script.py"),
        str(resumed),
        str(tmp_path / "preempted.marker"),
    ]
    code, log = _run(job, resumed)
    assert code == EXIT_PREEMPTED, log
    assert not (resumed / "model.keras").exists()
    code, log = _run(job, resumed)
    assert code == 0, log
    assert "Epoch 1/4" not in log, "the restart must resume, not train from the start"
    assert "Epoch 4/4" in log

    for expected, actual in zip(_weights(reference), _weights(resumed), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
