"""EpochTensorBoard records exactly what Keras's TensorBoard records.

Its point is speed (no per-batch scalar calls at update_freq="epoch"), which
bench/bench_overhead.py measures; these tests pin that nothing recorded changes.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.callbacks import EpochTensorBoard


def _scalar_tags(log_dir) -> set[str]:
    tags = set()
    for path in tf.io.gfile.glob(f"{log_dir}/train/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


def _fit(callback):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    features = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model.fit(features, features[:, :1], batch_size=16, epochs=2, verbose=0, callbacks=[callback])


def test_epoch_recording_writes_the_same_tags_as_keras(tmp_path):
    _fit(keras.callbacks.TensorBoard(str(tmp_path / "keras")))
    _fit(EpochTensorBoard(str(tmp_path / "ours")))
    ours = _scalar_tags(tmp_path / "ours")
    assert "epoch_loss" in ours
    assert ours == _scalar_tags(tmp_path / "keras")


def test_per_batch_recording_still_works_when_asked(tmp_path):
    _fit(EpochTensorBoard(str(tmp_path / "batch"), update_freq=1))
    assert "batch_loss" in _scalar_tags(tmp_path / "batch")
