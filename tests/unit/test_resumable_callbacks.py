"""`tfdist.resumable.fit` with a typical script's callbacks: a resume ends where the
uninterrupted run ends, a finished job stays finished with its trained weights.

Most tests run tests/jobs/callbacks_script.py's `run` in this process: each call builds
a new model and new callbacks, as a restarted process would, and a crash is an
exception from tests/support/fault_injection.py. The slow ones kill real processes with
SIGKILL and run 2 workers.
"""

import json
import logging
import pathlib
import shutil
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist.resumable
from tests.jobs import callbacks_script as script
from tests.support.fault_injection import CrashAfterBatches
from tfdist.errors import UsageError

REPO = pathlib.Path(__file__).resolve().parents[2]


def _weights(path: pathlib.Path) -> list[np.ndarray]:
    return keras.saving.load_model(path, safe_mode=True, compile=False).get_weights()


def _assert_same_weights(actual: pathlib.Path, expected: pathlib.Path) -> None:
    for got, want in zip(_weights(actual), _weights(expected), strict=True):
        np.testing.assert_array_equal(got, want)


def _metadata(backup_dir: pathlib.Path, step: int) -> dict:
    path = backup_dir / f"backup-{step:012d}" / "metadata.json"
    return json.loads(path.read_text())["user"]


def _crash(out: pathlib.Path, at: int, **kwargs) -> None:
    with pytest.raises(RuntimeError, match="simulated crash"):
        script.run(out, crash_after_batches=at, **kwargs)


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


def _finished_like_reference(out: pathlib.Path, reference) -> dict:
    """Puts in `out` what the uninterrupted run left in its own directory; its result.

    The same call of `script.run` in a new directory would compute the same files again.
    """
    reference_out, reference_result = reference
    shutil.copytree(reference_out, out, dirs_exist_ok=True)
    return reference_result


def _assert_like_reference(out: pathlib.Path, result: dict, reference) -> None:
    reference_out, reference_result = reference
    assert result == reference_result
    assert (out / "log.csv").read_text() == (reference_out / "log.csv").read_text()
    _assert_same_weights(out / "model.keras", reference_out / "model.keras")
    _assert_same_weights(out / "best.keras", reference_out / "best.keras")


def test_crashes_mid_epoch_and_at_an_epoch_end_resume_to_the_uninterrupted_run(tmp_path, reference):
    _crash(tmp_path, 20)  # step 20 of 48: resumes from the mid-epoch backup at 18
    _crash(tmp_path, 23)  # step 41: resumes from the end of epoch 4 (step 40)
    assert (tmp_path / "backup" / "backup-000000000040").is_dir()
    result = script.run(tmp_path)
    _assert_like_reference(tmp_path, result, reference)


def test_a_finished_early_stopped_job_rerun_twice_returns_the_trained_model(tmp_path, reference):
    first = _finished_like_reference(tmp_path, reference)
    files = {name: (tmp_path / name).read_bytes() for name in ("log.csv", "best.keras")}
    for _ in range(2):
        again = script.run(tmp_path)
        assert again == first  # weights' learning rate, callbacks' state, whole history
        _assert_same_weights(tmp_path / "model.keras", reference[0] / "model.keras")
        for name, data in files.items():
            assert (tmp_path / name).read_bytes() == data, name


def test_a_job_killed_after_its_early_stop_before_its_completion_record_stays_stopped(
    tmp_path, reference
):
    _finished_like_reference(tmp_path, reference)
    (tmp_path / "backup" / "COMPLETED.json").unlink()  # what a kill in between leaves
    csv = (tmp_path / "log.csv").read_bytes()
    result = script.run(tmp_path)
    _assert_like_reference(tmp_path, result, reference)
    assert (tmp_path / "log.csv").read_bytes() == csv
    assert (tmp_path / "backup" / "COMPLETED.json").exists()


def test_a_finished_job_whose_final_backup_is_gone_is_refused(tmp_path, reference):
    _finished_like_reference(tmp_path, reference)
    for backup in (tmp_path / "backup").glob("backup-*"):
        for path in backup.iterdir():
            path.unlink()
        backup.rmdir()
    with pytest.raises(UsageError, match="final backup is gone") as error:
        script.run(tmp_path)
    assert "delete" in str(error.value) and "\n" not in str(error.value)


def test_the_shipped_script_rerun_and_after_a_crash_before_its_save_keeps_the_trained_model(
    tmp_path,
):
    sys.path.insert(0, str(REPO / "examples" / "resumable_script"))
    try:
        import after  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    after.main(str(tmp_path))
    trained = _weights(tmp_path / "model.keras")
    for crash_before_save in (True, False):
        if crash_before_save:
            (tmp_path / "model.keras").unlink()
        after.main(str(tmp_path))
        for got, want in zip(_weights(tmp_path / "model.keras"), trained, strict=True):
            np.testing.assert_array_equal(got, want)


class HalveAtEpochEnd(keras.callbacks.Callback):
    """Halves the learning rate at every epoch end, as a schedule callback would."""

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        optimizer.learning_rate.assign(optimizer.learning_rate * 0.5)


def test_the_backup_at_an_epochs_last_step_keeps_what_epoch_end_callbacks_changed(
    tmp_path, reference
):
    # save_freq=4 divides the 8 steps of an epoch: every epoch end is also a periodic step.
    reference_out = tmp_path / "reference"
    expected = script.run(reference_out, save_freq=4, extra_callbacks=[HalveAtEpochEnd()])
    out = tmp_path / "resumed"
    _crash(out, 9, save_freq=4, extra_callbacks=[HalveAtEpochEnd()])
    metadata = _metadata(out / "backup", 8)
    assert (metadata["epoch"], metadata["step_in_epoch"]) == (1, 0)  # end of epoch 0
    result = script.run(out, save_freq=4, extra_callbacks=[HalveAtEpochEnd()])
    assert result["learning_rate"] == expected["learning_rate"]
    _assert_same_weights(out / "model.keras", reference_out / "model.keras")


def test_a_finite_dataset_without_steps_per_epoch_resumes_at_and_between_epoch_ends(tmp_path):
    expected = script.run(tmp_path / "reference", finite=True, save_freq=4)
    out = tmp_path / "resumed"
    _crash(out, 9, finite=True, save_freq=4)  # newest backup: the end of epoch 0
    _crash(out, 5, finite=True, save_freq=4)  # step 13: the mid-epoch backup at step 12
    assert _metadata(out / "backup", 12)["step_in_epoch"] == 4
    result = script.run(out, finite=True, save_freq=4)
    assert result == expected
    assert (out / "log.csv").read_text() == (tmp_path / "reference" / "log.csv").read_text()
    _assert_same_weights(out / "model.keras", tmp_path / "reference" / "model.keras")


def _model_and_unknown_length_data():
    model = script.build_model()
    features = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((features, np.zeros(64, np.int32)))
    return model, data.filter(lambda x, y: True).batch(8)  # cardinality unknown


def test_a_mid_epoch_backup_of_unknown_epoch_length_resumes_with_the_length_counted_once(
    tmp_path, caplog
):
    # tfdist.data.resume_input counts one pass on the fresh start (8 batches) and the
    # backup records it: the restart resumes mid-epoch (it used to be refused).
    model, data = _model_and_unknown_length_data()
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="simulated crash"):
        tfdist.resumable.fit(
            model,
            data,
            epochs=2,
            save_freq=3,
            backup_dir=str(tmp_path),
            callbacks=[CrashAfterBatches(4)],
            verbose=0,
            preemption=None,
        )
    assert "counted one pass (8 batches)" in caplog.text
    caplog.clear()
    model, data = _model_and_unknown_length_data()
    with caplog.at_level(logging.INFO):
        tfdist.resumable.fit(
            model, data, epochs=2, save_freq=3, backup_dir=str(tmp_path), verbose=0, preemption=None
        )
    assert "counted one pass" not in caplog.text
    assert int(model.optimizer.iterations.numpy()) == 16


class EpochCounter(keras.callbacks.Callback):
    """A user callback with state, through the documented protocol."""

    def __init__(self):
        super().__init__()
        self.epochs_seen = []

    def on_train_begin(self, logs=None):
        self.epochs_seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen.append(epoch)

    def get_state(self) -> dict:
        return {"epochs_seen": list(self.epochs_seen)}

    def set_state(self, state: dict) -> None:
        self.epochs_seen = list(state["epochs_seen"])


class Unsaved(keras.callbacks.Callback):
    """State without the protocol."""

    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def test_user_callbacks_state_protocol_and_a_warning_for_state_without_it(tmp_path, caplog):
    counter, unsaved = EpochCounter(), Unsaved()
    with caplog.at_level(logging.WARNING, logger="tfdist"):
        _crash(tmp_path, 20, extra_callbacks=[counter, unsaved])
    warnings = [r.getMessage() for r in caplog.records if "Unsaved" in r.getMessage()]
    assert len(warnings) == 1 and "batches" in warnings[0] and "get_state()" in warnings[0]
    counter = EpochCounter()
    script.run(tmp_path, extra_callbacks=[counter, Unsaved()])
    stopped = json.loads((tmp_path / "result.json").read_text())["early_stopping"]
    assert counter.epochs_seen == list(range(stopped["stopped_epoch"] + 1))
