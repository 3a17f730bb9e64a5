"""Where a user's dataset resumes exactly in `tfdist.resumable.fit`, and the one line where not (issue #28, 3).

In this process: a crash is an exception (tests/support/fault_injection.py),
and each run builds its model and its dataset anew, as a restarted process
does. Killing real processes is tests/multiprocess/test_resume_pipelines.py.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist.resumable
from tests.support.fault_injection import CrashAfterBatches

ROWS, BATCH, BUFFER, EPOCHS, SAVE_FREQ = 40, 4, 16, 3, 2
STEPS = EPOCHS * ROWS // BATCH
CRASH_AT = 14  # epoch 2, step 4: it stops before its backup, so the restart is at step 12
RESUMED_AT = 12


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)  # 1 in 3 or so: the class weight matters
    path = tmp_path_factory.mktemp("csv") / "train.csv"
    path.write_text("".join(f"{a},{b},{c},{label}\n" for (a, b, c), label in zip(x, y)))
    return str(path)


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _csv_pipeline(path, counter):
    def decode(line):
        counter.assign_add(1)
        values = tf.io.decode_csv(line, [0.0, 0.0, 0.0, 0])
        return tf.stack(values[:3]), tf.cast(values[3], tf.int64)

    return tf.data.TextLineDataset([path]).map(decode).shuffle(BUFFER, seed=5).batch(BATCH)


def _fit_csv(path, backup_dir, callbacks=(), **kwargs):
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    model = _model()
    tfdist.resumable.fit(
        model,
        _csv_pipeline(path, counter),
        epochs=EPOCHS,
        backup_dir=str(backup_dir),
        save_freq=SAVE_FREQ,
        callbacks=list(callbacks),
        preemption=None,
        verbose=0,
        **kwargs,
    )
    return model, int(counter.numpy())


def _assert_same_weights(got, want):
    for mine, theirs in zip(got.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_class_weight_resumes_at_the_saved_position_bit_for_bit(lines, tmp_path, caplog):
    weights = {"class_weight": {0: 1.0, 1: 3.0}}
    reference, _ = _fit_csv(lines, tmp_path / "reference", **weights)
    unweighted, _ = _fit_csv(lines, tmp_path / "unweighted")
    assert not np.array_equal(reference.get_weights()[0], unweighted.get_weights()[0])
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit_csv(lines, tmp_path / "resumed", callbacks=[CrashAfterBatches(CRASH_AT)], **weights)
    with caplog.at_level(logging.INFO, logger="tfdist"):
        resumed, decodes = _fit_csv(lines, tmp_path / "resumed", **weights)
    _assert_same_weights(resumed, reference)
    # What its remaining steps consume, plus the shuffle buffer's refill and a batch in
    # flight; skipping the 12 batches taken decoded 48 more.
    remaining = (STEPS - RESUMED_AT) * BATCH
    assert remaining <= decodes <= remaining + BUFFER + BATCH, decodes
    assert "could not be saved" not in caplog.text
    assert "skipping the batches already taken" not in caplog.text
