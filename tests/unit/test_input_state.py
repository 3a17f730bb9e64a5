"""The position of a user's dataset in `fit`, saved and restored (issue #28, 3).

Killing real processes (1 process and 2 workers, keras.io-shaped pipelines)
is in tests/multiprocess/test_resume_pipelines.py; these run in this process.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import keras_compat
from tfdist.backups import BackupStore, TrainingBackup
from tfdist.data.resume_input import ResumableInput, state_file


@pytest.fixture(scope="module")
def strategy():
    # One replica, but a strategy: Keras reads the data through a DistributedIterator.
    return tf.distribute.MirroredStrategy(["/cpu:0"])


def _dataset():
    x = np.arange(40 * 3, dtype="float32").reshape(40, 3) / 100.0
    y = (x.sum(axis=1) > 0.6).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16, seed=5).batch(4)


def _model(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(2, kernel_initializer=keras.initializers.GlorotUniform(1)),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def test_upstream_distributed_iterator_cannot_be_saved(strategy):
    # The gap _input_state closes: the iterator Keras builds under a strategy is a
    # DistributedIterator, which tf.train.Checkpoint refuses (TF 2.21).
    iterator = iter(strategy.experimental_distribute_dataset(_dataset()))
    with pytest.raises(ValueError, match="trackable"):
        tf.train.Checkpoint(iterator=iterator)


def test_a_new_fit_restored_from_the_saved_state_continues_the_same_stream(strategy):
    whole = _model(strategy)
    training = ResumableInput(_dataset(), steps_per_epoch=None, strategy=strategy)
    assert training.steps_per_epoch == 10 and training.endless  # one stream across epochs
    with training.capture():
        whole.fit(training.dataset, epochs=3, steps_per_epoch=10, verbose=0)

    first = _model(strategy)
    before = ResumableInput(_dataset(), steps_per_epoch=None, strategy=strategy)
    with before.capture():
        first.fit(before.dataset, epochs=1, steps_per_epoch=14, verbose=0)
    state = before._compat.state()  # pylint: disable=protected-access
    # A new dataset object, as a restarted process builds it: the state says where.
    after = ResumableInput(_dataset(), steps_per_epoch=None, strategy=strategy)
    after._compat.restore_into_next(state)  # pylint: disable=protected-access
    with after.capture():
        first.fit(after.dataset, epochs=1, steps_per_epoch=16, verbose=0)
    for got, want in zip(first.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_what_the_pipeline_graph_tells_about_restoring_it():
    tf.random.set_seed(None)
    unseeded = tf.data.Dataset.range(8).shuffle(4)
    tf.random.set_seed(4)  # what strategy_from_environment does when the script set none
    under_global_seed = tf.data.Dataset.range(8).shuffle(4)
    tf.random.set_seed(None)
    seeded = tf.data.Dataset.range(8).shuffle(4, seed=3)
    generator = tf.data.Dataset.from_generator(
        lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int64)
    )
    facts = keras_compat.pipeline_facts(seeded.batch(2))
    assert facts.buffers == ("ShuffleDatasetV3",) and not facts.python_state
    assert keras_compat.pipeline_facts(tf.data.Dataset.range(8).batch(2)).buffers == ()
    assert "GeneratorDataset" in keras_compat.pipeline_facts(generator).python_state
    # Unseeded only when no global seed was set when the shuffle was built.
    assert keras_compat.pipeline_facts(unseeded).unseeded_shuffles == 1
    assert keras_compat.pipeline_facts(under_global_seed).unseeded_shuffles == 0
    assert keras_compat.pipeline_facts(seeded).unseeded_shuffles == 0


def test_a_backup_missing_a_workers_input_state_falls_back_to_the_previous(tmp_path, caplog):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    backup = TrainingBackup(BackupStore(str(tmp_path)), model)
    both = {state_file(0): b"zero", state_file(1): b"one"}
    listed = {"input_state": {"workers": 2, "files": sorted(both)}}
    backup.save(global_step=1, epoch=0, step_in_epoch=1, extra_metadata=listed, extra_files=both)
    # A commit that lists worker 1's state without holding it is never restored.
    backup.save(
        global_step=2,
        epoch=0,
        step_in_epoch=2,
        extra_metadata=listed,
        extra_files={state_file(0): b"zero"},
    )
    with caplog.at_level(logging.WARNING):
        point = TrainingBackup(BackupStore(str(tmp_path)), model).restore()
    assert point.global_step == 1
    assert "input-worker-1.state is missing" in caplog.text
