"""tfdist.outputs.hypertune: the metric file Vertex AI tuning reads, chief only, and
per-trial output directories."""

import json
import os

import numpy as np
import pytest

from tfdist.callbacks import HypertuneCallback
from tfdist.errors import UsageError
from tfdist.outputs import hypertune


def _lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def _fit(callback, epochs=3, validation=True):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 4)).astype("float32")
    labels = (features[:, 0] > 0).astype("int32")
    history = model.fit(
        features,
        labels,
        batch_size=16,
        epochs=epochs,
        verbose=0,
        validation_data=(features, labels) if validation else None,
        callbacks=[callback],
    )
    return history


def test_callback_reports_each_evaluation_in_the_hypertune_format(tmp_path):
    metric_file = tmp_path / "hypertune" / "output.metrics"
    reporter = hypertune.MetricReporter(
        environ={hypertune.METRIC_FILE_ENV: str(metric_file), hypertune.TRIAL_ID_ENV: "7"}
    )
    callback = HypertuneCallback("val_accuracy", is_chief=True, reporter=reporter)
    history = _fit(callback)
    entries = _lines(metric_file)
    assert [entry["global_step"] for entry in entries] == ["4", "8", "12"]  # 4 steps an epoch
    assert [float(entry["val_accuracy"]) for entry in entries] == pytest.approx(
        history.history["val_accuracy"]
    )
    for entry in entries:
        assert set(entry) == {
            "timestamp",
            "trial",
            "val_accuracy",
            "global_step",
            "checkpoint_path",
        }
        assert entry["trial"] == "7" and isinstance(entry["val_accuracy"], str)
    assert not [name for name in os.listdir(metric_file.parent) if name != "output.metrics"]


def test_non_chief_writes_nothing(tmp_path):
    metric_file = tmp_path / "output.metrics"
    reporter = hypertune.MetricReporter(metric_file=str(metric_file), environ={})
    _fit(HypertuneCallback("val_accuracy", is_chief=False, reporter=reporter))
    assert not metric_file.exists()


def test_unknown_metric_is_a_usage_error_naming_the_logged_ones(tmp_path):
    reporter = hypertune.MetricReporter(metric_file=str(tmp_path / "m"), environ={})
    with pytest.raises(UsageError, match="val_acuracy.*expected one of: .*val_accuracy"):
        _fit(HypertuneCallback("val_acuracy", is_chief=True, reporter=reporter), epochs=1)


def test_a_validation_metric_without_validation_is_a_usage_error(tmp_path):
    reporter = hypertune.MetricReporter(metric_file=str(tmp_path / "m"), environ={})
    with pytest.raises(UsageError, match="never reported"):
        _fit(
            HypertuneCallback("val_accuracy", is_chief=True, reporter=reporter),
            epochs=1,
            validation=False,
        )
    assert not (tmp_path / "m").exists()


def test_only_the_newest_100_reports_are_kept(tmp_path):
    reporter = hypertune.MetricReporter(metric_file=str(tmp_path / "m"), environ={})
    for step in range(1, 131):
        reporter.report("loss", 1.0 / step, step)
    entries = _lines(tmp_path / "m")
    assert len(entries) == 100 and entries[0]["global_step"] == "31"
    assert entries[0]["trial"] == "0", "outside a trial the package writes trial 0"


def test_trial_id_from_either_variable():
    assert hypertune.trial_id({"CLOUD_ML_TRIAL_ID": "4"}) == "4"
    spec = json.dumps({"cluster": {}, "task": {"type": "workerpool0", "index": 0, "trial": "9"}})
    assert hypertune.trial_id({"CLUSTER_SPEC": spec}) == "9"
    assert hypertune.trial_id({}) == ""
    with pytest.raises(UsageError, match="CLOUD_ML_TRIAL_ID"):
        hypertune.trial_id({"CLOUD_ML_TRIAL_ID": "../../etc"})


def test_each_trial_gets_its_own_output_directory():
    trial = {
        "CLOUD_ML_TRIAL_ID": "3",
        "AIP_MODEL_DIR": "gs://b/hp/3/model/",
        "AIP_CHECKPOINT_DIR": "gs://b/hp/3/checkpoints/",
    }
    assert hypertune.trial_output_dir("gs://b/runs/exp", trial) == "gs://b/runs/exp/3"
    assert hypertune.trial_output_dir("/backups/", trial) == "/backups/3"
    assert hypertune.trial_output_dir("gs://b/hp/3/model/", trial) == "gs://b/hp/3/model/", (
        "Vertex's AIP_* directories are per-trial already"
    )
    assert hypertune.trial_output_dir("gs://b/hp/3/checkpoints", trial) == "gs://b/hp/3/checkpoints"
    assert hypertune.trial_output_dir("gs://b/runs/exp", {}) == "gs://b/runs/exp"
    assert hypertune.trial_output_dir("", trial) == ""
