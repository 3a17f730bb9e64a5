"""`python -m trainer.task` as a user runs it: outputs, summary, exit codes, messages."""

import math
import pathlib

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfdist.distribute.cluster import resolve_cluster
from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import run as run_lib
from trainer.tasks import datasets as datasets_lib
from trainer.tasks.builtin import BuiltinTask

# --- tfds datasets through the real loading path -----------------------------


def _write_tfds_metadata(data_dir: pathlib.Path, name: str, splits: dict) -> None:
    """Writes what a prepared tfds dataset has besides its records.

    `tfds.testing.mock_data` replaces the reading of records; the trainer still
    asks the builder whether the dataset is prepared, which needs these files.
    Nothing is downloaded: the builder class and its features ship with tfds.
    """
    builder = tfds.builder(name, data_dir=str(data_dir))
    builder.info.set_splits(
        tfds.core.SplitDict(
            [
                tfds.core.SplitInfo(
                    name=split, shard_lengths=[count], num_bytes=0, filename_template=None
                )
                for split, count in splits.items()
            ]
        )
    )
    pathlib.Path(builder.data_dir).mkdir(parents=True, exist_ok=True)
    builder.info.write_to_directory(builder.data_dir)


def test_tfds_dataset_trains_through_the_trainer(tmp_path):
    data_dir = tmp_path / "tfds"
    _write_tfds_metadata(data_dir, "mnist", {"train": 96, "test": 32})
    config = config_lib.ExperimentConfig(
        strategy="default",
        model="cnn",
        dataset="mnist",
        data_dir=str(data_dir),
        epochs=1,
        steps_per_epoch=3,
        global_batch_size=16,
        model_dir=str(tmp_path / "model"),
    )
    with tfds.testing.mock_data(num_examples=96, data_dir=str(data_dir)):
        task = BuiltinTask(model="cnn", dataset="mnist", data_dir=str(data_dir))
        images, labels = next(iter(task.build_inputs(True).batch(16)))
        summary = run_lib.run(config, resolve_cluster({}), environ={})
    assert task.info == datasets_lib.DatasetInfo((28, 28, 1), 10, 96, 32)
    assert images.shape == (16, 28, 28, 1) and images.dtype.name == "float32"
    assert 0.0 <= float(np.min(images)) and float(np.max(images)) <= 1.0
    assert labels.dtype.name == "int32" and set(labels.numpy()) <= set(range(10))
    assert summary["steps_completed"] == 3
    assert math.isfinite(summary["final_loss"])
    model = keras.saving.load_model(tmp_path / "model" / "model.keras", safe_mode=True)
    assert model.input_shape == (None, 28, 28, 1)


def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty-data-dir"
    empty.mkdir()
    with pytest.raises(UsageError) as raised:
        BuiltinTask(model="mlp", dataset="mnist", data_dir=str(empty))
    message = str(raised.value)
    assert f"--dataset='mnist' is not prepared under --data_dir={str(empty)!r}" in message
    assert "nothing is downloaded" in message
    assert "tfds build mnist" in message
    assert list(empty.iterdir()) == []
