"""`tfdist.resumable.fit(model, x, y, ...)` with NumPy arrays, as `keras.Model.fit` takes them.

In this process: a crash is an exception (tests/support/fault_injection.py) and each
run builds a new model, as a restarted process would. The 2-worker kill -9 of the
same shapes is tests/multiprocess/test_upgraded_scripts.py.
"""

import os
import sys
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist.resumable
from tests.support.fault_injection import CrashAfterBatches
from tfdist.data import arrays
from tfdist.errors import UsageError

NUM_EXAMPLES, BATCH = 100, 16  # 80 training examples after a 0.2 split: 5 steps


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0.8).astype(np.int32)
    return x, y


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _fit(backup_dir, callbacks=(), **kwargs):
    x, y = _data()
    model = _model()
    options = dict(batch_size=BATCH, epochs=3, validation_split=0.2, class_weight={0: 1.0, 1: 3.0})
    options.update(kwargs)
    history = tfdist.resumable.fit(
        model,
        x,
        y,
        backup_dir=str(backup_dir),
        callbacks=list(callbacks),
        save_freq=2,
        verbose=0,
        **options,
    )
    return model, history


def test_fit_takes_x_and_y_arrays_with_keras_arguments(tmp_path):
    model, history = _fit(tmp_path / "backup")
    assert int(model.optimizer.iterations) == 3 * 5
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len(history.history["val_loss"]) == 3


def test_without_shuffle_it_trains_exactly_as_keras_fit_does(tmp_path):
    """Same batches as `model.fit(x, y, shuffle=False)`, the last one partial (50 = 3*16 + 2)."""
    x, y = _data()
    expected = _model()
    expected.fit(x[:50], y[:50], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _model()
    tfdist.resumable.fit(
        model,
        x[:50],
        y[:50],
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        backup_dir=str(tmp_path / "backup"),
        verbose=0,
    )
    assert int(model.optimizer.iterations) == int(expected.optimizer.iterations) == 8
    for got, want in zip(model.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_crash_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    reference, _ = _fit(tmp_path / "reference")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(tmp_path / "resumed", callbacks=[CrashAfterBatches(8)])  # step 8: epoch 2, step 3
    resumed, history = _fit(tmp_path / "resumed")
    assert len(history.history["loss"]) == 3
    assert int(resumed.optimizer.iterations) == 15
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def _examples(dataset, steps):
    return [batch[0].numpy() for batch in dataset.take(steps)]


def test_each_epoch_is_a_new_seeded_permutation_of_the_training_part_only():
    x, y = _data()
    inputs = arrays.fit_inputs(x, y, batch_size=BATCH, validation_split=0.2, seed=7)
    stream = _examples(inputs.training.training_batches(), 10)
    epochs = [np.concatenate(stream[:5]), np.concatenate(stream[5:])]
    for epoch in epochs:  # every training example once per epoch, none of the last 20
        np.testing.assert_array_equal(np.sort(epoch[:, 0]), np.sort(x[:80, 0]))
    assert not np.array_equal(epochs[0], epochs[1])
    validation = np.concatenate([batch[0].numpy() for batch in inputs.validation_data])
    np.testing.assert_array_equal(validation, x[80:])
    # Step 7 from a restart at step 7 is step 7 of the stream; another seed, another order.
    np.testing.assert_array_equal(_examples(inputs.training.training_batches(7), 1)[0], stream[7])
    other = arrays.fit_inputs(x, y, batch_size=BATCH, validation_split=0.2, seed=8)
    assert not np.array_equal(_examples(other.training.training_batches(), 1)[0], stream[0])


def test_the_default_seed_is_tensorflows_global_seed():
    tf.random.set_seed(11)
    assert arrays.default_seed() == 11
    assert arrays.fit_inputs(*_data()).training.seed == 11


def test_dicts_of_arrays_and_sample_weights_keep_their_structure():
    x, y = _data()
    inputs = arrays.fit_inputs(
        {"a": x[:, :3], "b": x[:, 3:]}, y, sample_weight=np.ones(len(y)), batch_size=10
    )
    features, labels, weights = next(iter(inputs.training.training_batches()))
    assert sorted(features) == ["a", "b"] and features["a"].shape == (10, 3)
    assert labels.shape == (10,) and weights.shape == (10,)


def _generator():
    yield np.zeros((4, 6)), np.zeros(4)


class _Batches(keras.utils.PyDataset):
    def __len__(self):
        return 1

    def __getitem__(self, index):
        return np.zeros((4, 6)), np.zeros(4)


@pytest.mark.parametrize(
    "x, expected",
    [
        (_generator(), "a Python generator or iterator"),
        (_Batches(), "keras.utils.PyDataset"),
        ("data.csv", "a str, which is neither arrays nor a tf.data.Dataset"),
    ],
    ids=["generator", "PyDataset", "str"],
)
def test_a_form_it_cannot_resume_is_refused_naming_what_to_pass(tmp_path, x, expected):
    with pytest.raises(UsageError) as raised:
        tfdist.resumable.fit(_model(), x, backup_dir=str(tmp_path))
    message = str(raised.value)
    assert expected in message and "tf.data.Dataset.from_generator" in message
    assert "NumPy arrays" in message and "\n" not in message
    assert not os.path.exists(tmp_path / "backup")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(y=np.zeros(4)), "y=... is given with a tf.data.Dataset"),
        (dict(batch_size=4), "batch_size=... is given with a tf.data.Dataset"),
        (dict(validation_split=0.1), "validation_split=0.1 needs arrays"),
    ],
    ids=["y", "batch_size", "validation_split"],
)
def test_array_arguments_with_a_dataset_are_refused(tmp_path, kwargs, expected):
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((8, 6)), np.zeros(8))).batch(4)
    with pytest.raises(UsageError, match=expected):
        tfdist.resumable.fit(_model(), dataset, backup_dir=str(tmp_path), **kwargs)


def test_a_usage_error_in_a_job_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {}}')
    monkeypatch.delattr(sys, "ps1", raising=False)
    with pytest.raises(SystemExit) as raised:
        _fit(tmp_path / "backup", batch_size=0)
    assert raised.value.code == 2
    assert capsys.readouterr().err == "error: batch_size is 0, expected a positive integer\n"


def test_a_usage_error_in_an_interactive_session_stays_an_exception(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {}}')
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    with pytest.raises(UsageError, match="batch_size is 0"):
        _fit(tmp_path / "backup", batch_size=0)


def test_a_usage_error_outside_a_job_stays_an_exception(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("CLUSTER_SPEC", raising=False)
    with pytest.raises(UsageError, match="batch_size is 0"):
        _fit(tmp_path / "backup", batch_size=0)


def test_validation_split_leaving_no_example_is_refused():
    x, y = _data()
    with pytest.raises(UsageError, match="leaves no example on one side of 1,"):
        arrays.fit_inputs(x[:1], y[:1], validation_split=0.5)


def test_arrays_of_different_lengths_are_refused():
    x, y = _data()
    with pytest.raises(UsageError, match=r"first dimensions \[99, 100\]"):
        arrays.fit_inputs(x, y[:99])


def test_string_arrays_train_a_model_that_looks_them_up(tmp_path):
    """Text as NumPy strings (keras.io's text scripts with a StringLookup in the model)."""
    words = np.array(["cat", "dog", "fish", "bird"] * 8)
    labels = (np.arange(32) % 2).astype(np.int32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((), dtype="string"),
            keras.layers.StringLookup(vocabulary=["cat", "dog", "fish", "bird"]),
            keras.layers.CategoryEncoding(num_tokens=5, output_mode="one_hot"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True))
    tfdist.resumable.fit(
        model, words, labels, batch_size=8, epochs=1, backup_dir=str(tmp_path), verbose=0
    )
    assert int(model.optimizer.iterations) == 4


def test_set_strategy_from_environment_builds_the_rest_of_the_script_in_its_scope(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("CLUSTER_SPEC", raising=False)
    strategy = tfdist.resumable.set_strategy_from_environment("mirrored")
    try:
        assert tf.distribute.get_strategy() is strategy and tf.distribute.has_strategy()
        model = _model()  # built at the top level, no `with strategy.scope():`
        assert model.distribute_strategy is strategy
    finally:
        tf.distribute.experimental_set_strategy(None)
    assert not tf.distribute.has_strategy()


def test_a_bad_cluster_variable_in_a_job_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    monkeypatch.delattr(sys, "ps1", raising=False)
    with pytest.raises(SystemExit) as raised:
        tfdist.resumable.strategy_from_environment()
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "TF_CONFIG" in err, err
    assert "{not json" not in err  # never logged verbatim


def test_a_usage_error_in_a_thread_of_a_job_stays_an_exception(tmp_path, monkeypatch):
    """Ray Train runs the training function in a thread: sys.exit would end only that thread."""
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {}}')
    monkeypatch.delattr(sys, "ps1", raising=False)
    raised = []

    def train():
        try:
            _fit(tmp_path / "backup", batch_size=0)
        except BaseException as error:  # pylint: disable=broad-except  (asserted below)
            raised.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(timeout=120)
    assert len(raised) == 1 and isinstance(raised[0], UsageError), raised


def test_keras_fit_positional_arguments_keep_their_meaning(tmp_path):
    """`model.fit(x, y, 16, 2, 0)` is `fit(model, x, y, 16, 2, 0, backup_dir=...)`."""
    x, y = _data()
    model = _model()
    history = tfdist.resumable.fit(model, x, y, 16, 2, 0, backup_dir=str(tmp_path))
    assert int(model.optimizer.iterations) == 2 * 7  # 100 examples in batches of 16
    assert len(history.history["loss"]) == 2


def test_initial_epoch_is_refused_because_the_backup_sets_it(tmp_path):
    x, y = _data()
    with pytest.raises(UsageError, match="initial_epoch=2, which tfdist.resumable.fit sets"):
        tfdist.resumable.fit(_model(), x, y, initial_epoch=2, backup_dir=str(tmp_path))
