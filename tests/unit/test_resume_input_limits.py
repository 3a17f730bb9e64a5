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
from tfdist import keras_compat

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
    # What its remaining steps consume, give or take the shuffle buffer and a batch in
    # flight (restored decoded with the state, or refilled after it: 68 and 76 seen);
    # skipping the 12 batches taken decoded 48 more.
    remaining = (STEPS - RESUMED_AT) * BATCH
    assert abs(decodes - remaining) <= BUFFER + BATCH, decodes
    assert "could not be saved" not in caplog.text
    assert "skipping the batches already taken" not in caplog.text


# ------------------------------------------------- a reshuffle whose pass ends with a partial batch

PASS_ROWS, PASS_BATCH = 197, 16  # 13 batches a pass, the last one of 5


def _no_injected_prefetch(dataset):
    # tf.data's injected prefetch reads ahead by a varying number of batches; without it
    # the iterator is exactly where the steps left it.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def _state(iterator) -> bytes:
    from tensorflow.python.ops import gen_dataset_ops  # pylint: disable=g-import-not-at-top

    variant = gen_dataset_ops.serialize_iterator(
        iterator._iterator_resource,  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
    )
    return tf.io.serialize_tensor(variant).numpy()


def _restored_stream(build, taken: int, total: int):
    from tensorflow.python.ops import gen_dataset_ops  # pylint: disable=g-import-not-at-top

    before = iter(build())
    for _ in range(taken):
        next(before)
    state = _state(before)
    after = iter(build())  # a new dataset object, as a restarted process builds it
    gen_dataset_ops.deserialize_iterator(
        after._iterator_resource,  # pylint: disable=protected-access
        tf.io.parse_tensor(state, tf.variant),
    )
    return state, [next(after).numpy().tolist() for _ in range(total - taken)]


@pytest.mark.parametrize("shape", ["partial last batch", "drop_remainder", "a map before it"])
def test_tf_restores_a_reshuffle_after_a_partial_last_batch_into_another_next_pass(shape):
    """The TF 2.21 limit the warnings below name, measured on tf.data alone."""
    drop_remainder = shape == "drop_remainder"
    exact = shape != "partial last batch"

    def build():
        dataset = tf.data.Dataset.range(PASS_ROWS).shuffle(128, seed=7)
        if shape == "a map before it":  # fused into one MapAndBatchDataset, which keeps its input
            dataset = dataset.map(lambda value: value * 2)
        return _no_injected_prefetch(dataset.batch(PASS_BATCH, drop_remainder).repeat())

    predicted = keras_compat.pipeline_facts(build()).partial_passes
    assert predicted == (() if exact else ((PASS_ROWS, PASS_BATCH),))
    per_pass = PASS_ROWS // PASS_BATCH + (0 if drop_remainder else 1)
    total = 3 * per_pass
    uninterrupted = [batch.numpy().tolist() for batch in build().take(total)]
    # Inside a pass the restored iterator goes on exactly, the next passes included.
    state, rest = _restored_stream(build, per_pass - 1, total)
    assert rest == uninterrupted[per_pass - 1 :]
    assert keras_compat.holds_shuffle_seed_state(state, 1)
    # Right after a pass's last batch: the rest of the pass is empty, the next pass differs
    # unless every batch is whole (the batch then holds no exhausted input).
    state, rest = _restored_stream(build, per_pass, total)
    assert (rest == uninterrupted[per_pass:]) is exact
    assert keras_compat.holds_shuffle_seed_state(state, 1) is exact


def _timeseries(rows):
    series = np.linspace(-1.0, 1.0, rows * 6, dtype="float32").reshape(rows, 6)
    targets = (series.sum(axis=1) > 0).astype("int64")
    return keras.utils.timeseries_dataset_from_array(
        series, targets, sequence_length=4, batch_size=PASS_BATCH, shuffle=True, seed=7
    ).map(lambda x, y: (tf.reshape(x, [-1, 24]), y))


def _backups(dataset, *, steps: int, count: int = 2, **options):
    from tfdist.backups.sync import WorkerSync  # pylint: disable=g-import-not-at-top
    from tfdist.data.resume_input import ResumableInput  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(1)
    width = dataset.element_spec[0].shape[-1]
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2)])
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    training = ResumableInput(dataset, steps_per_epoch=None, **options)
    with training.capture():
        model.fit(training.dataset, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return [training.backup(WorkerSync()) for _ in range(count)]


MARKER = "may differ from the uninterrupted run"


def _warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if MARKER in record.getMessage()]


def test_timeseries_dataset_from_array_says_once_at_the_first_backup_that_its_next_pass_may_differ(
    caplog,
):
    with caplog.at_level(logging.INFO, logger="tfdist"):
        files, metadata = _backups(_timeseries(200), steps=3)[0]  # 197 sequences
    assert files and metadata  # the position is still saved
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert "ShuffleDatasetV3" in lines[0] and "partial batch" in lines[0]
    assert "197 examples" in lines[0] and "drop_remainder=True" in lines[0]


def test_a_pass_of_whole_batches_resumes_exactly_and_says_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="tfdist"):
        _backups(_timeseries(195), steps=12)  # 192 sequences: 12 whole batches
    assert _warnings(caplog) == []


def test_a_backup_at_a_pass_end_that_lost_the_shuffles_seed_state_says_so_once(lines, caplog):
    # A length tf.data does not know (a text file): the partial batch is seen in the state.
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    dataset = _csv_pipeline(lines, counter).unbatch().shuffle(BUFFER, seed=2).batch(6)
    dataset = _no_injected_prefetch(dataset)  # 40 examples: 6 batches of 6, one of 4
    with caplog.at_level(logging.INFO, logger="tfdist"):
        _backups(dataset, steps=3)
    assert _warnings(caplog) == []  # inside the pass: the state holds the seed state
    with caplog.at_level(logging.INFO, logger="tfdist"):
        _backups(dataset, steps=7, count=3)  # the pass's last batch
    lines_seen = _warnings(caplog)
    assert len(lines_seen) == 1, lines_seen
    assert "ShuffleDatasetV3" in lines_seen[0] and "holds no seed state" in lines_seen[0]


def test_a_state_above_the_bound_is_not_saved_and_the_line_names_the_callers_bound(caplog):
    with caplog.at_level(logging.INFO, logger="tfdist"):
        saved = _backups(
            _timeseries(195), steps=3, max_state_bytes=64, bound_name="--max_input_state_mb"
        )
    assert saved == [({}, None), ({}, None)]
    said = [r.getMessage() for r in caplog.records if "max_input_state" in r.getMessage()]
    assert len(said) == 1, said
    assert "above the bound of 64 bytes (--max_input_state_mb): not saved" in said[0]


def test_a_bound_of_zero_saves_no_position_and_says_so_without_blaming_the_pipeline(caplog):
    with caplog.at_level(logging.INFO, logger="tfdist"):
        saved = _backups(_timeseries(195), steps=3, max_state_bytes=0)
    assert saved == [({}, None), ({}, None)]
    said = [r.getMessage() for r in caplog.records if "training data" in r.getMessage()]
    assert said == [
        "Not backing up the training data's position (max_input_state_bytes is 0): a restart "
        "skips the batches already taken, decoding them again."
    ]


# ------------------------------------------- a shuffle seed drawn at random (image_dataset_from_directory)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for label in ("cat", "dog"):
        (root / label).mkdir()
        for number in range(12):
            pixels = rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)
            (root / label / f"{number}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    return str(root)


def _fit_images(root, backup_dir, *, numpy_seed, callbacks=()):
    model = _model_for_images()
    # A restarted process: NumPy seeded by the script (keras.utils.set_random_seed), or
    # from the operating system (np.random.seed(None)), as when the script seeds nothing.
    if numpy_seed is None:
        np.random.seed(None)
    else:
        keras.utils.set_random_seed(numpy_seed)
    dataset = keras.utils.image_dataset_from_directory(
        root, image_size=(8, 8), batch_size=BATCH, seed=None, verbose=False
    )
    tfdist.resumable.fit(
        model,
        dataset,
        epochs=EPOCHS,
        backup_dir=str(backup_dir),
        save_freq=SAVE_FREQ,
        callbacks=list(callbacks),
        preemption=None,
        verbose=0,
    )
    return model


def _model_for_images():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten()]
        + [keras.layers.Dense(2)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


SEEDS_MARKER = "shuffle seeds differ from the backed-up run's"


def test_image_dataset_seeded_by_numpy_resumes_bit_for_bit(images, tmp_path, caplog):
    reference = _fit_images(images, tmp_path / "reference", numpy_seed=4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit_images(images, tmp_path / "resumed", numpy_seed=4, callbacks=[CrashAfterBatches(8)])
    with caplog.at_level(logging.INFO, logger="tfdist"):
        resumed = _fit_images(images, tmp_path / "resumed", numpy_seed=4)
    _assert_same_weights(resumed, reference)
    assert SEEDS_MARKER not in caplog.text


def test_image_dataset_without_any_seed_says_at_the_restart_that_it_reads_another_order(
    images, tmp_path, caplog
):
    reference = _fit_images(images, tmp_path / "reference", numpy_seed=None)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit_images(images, tmp_path / "resumed", numpy_seed=None, callbacks=[CrashAfterBatches(8)])
    with caplog.at_level(logging.INFO, logger="tfdist"):
        resumed = _fit_images(images, tmp_path / "resumed", numpy_seed=None)
    # Another seed each run (1 in 10^6 to draw the same): the restart is not the run.
    assert not np.array_equal(resumed.get_weights()[0], reference.get_weights()[0])
    lines = [r.getMessage() for r in caplog.records if SEEDS_MARKER in r.getMessage()]
    assert len(lines) == 1, lines
    assert "keras.utils.set_random_seed" in lines[0] and "seed=" in lines[0]
