"""tfdist.keras_compat in one process: each upstream Keras bug still exists, and the corrections.

`tests/jobs/keras_compat_job.py` runs in a fresh process (it splits the CPU into 2
logical devices) and trains small models under MirroredStrategy with the
corrections removed, then applied. When an `upstream` test fails, Keras fixed
that bug: raise `keras_compat.FIRST_FIXED_KERAS` and retire the correction.
The multi-worker upstream failures are in `tests/multiprocess/test_multiworker.py`.
"""

import numpy as np
import pytest


@pytest.fixture
def applied():
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    was_applied = keras_compat.is_applied()
    keras_compat.apply()
    yield keras_compat
    if not was_applied:
        keras_compat.remove()


def test_replica_xla_refuses_a_model_that_overrides_train_step(applied):
    del applied
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.errors import UsageError  # pylint: disable=g-import-not-at-top

    class OwnStep(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = OwnStep([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((8, 4), np.float32), np.ones((8, 1), np.float32))
    ).batch(4)
    with pytest.raises(UsageError, match="OwnStep overrides train_step"):
        model.fit(data, epochs=1, verbose=0)


def test_parameter_server_lock_spares_only_metrics_that_keras_increments():
    """Loss, Mean, accuracy keep lock-free atomic increments; `assign` metrics take the lock."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.keras_compat import _parameter_server  # pylint: disable=g-import-not-at-top

    class DocstringCount(keras.metrics.Metric):
        def __init__(self):
            super().__init__(name="docstring_count")
            self.count = self.add_variable(shape=(), initializer="zeros", name="count")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.count.assign(self.count + 1.0)

        def result(self):
            return self.count

    class OwnAccuracy(keras.metrics.BinaryAccuracy):
        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign(self.total + keras.ops.sum(y_pred))

    def compiled(metrics):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile("sgd", "binary_crossentropy", metrics=metrics)
        model.fit(np.ones((4, 3), np.float32), np.ones((4, 1), np.float32), verbose=0)
        return {metric.name: _parameter_server.only_increments(metric) for metric in model.metrics}

    assert compiled(["accuracy", keras.metrics.BinaryCrossentropy()]) == {
        "loss": True,
        "compile_metrics": True,
    }
    for locked in (keras.metrics.Precision(), keras.metrics.AUC(), DocstringCount(), OwnAccuracy()):
        assert compiled(["accuracy", locked]) == {"loss": True, "compile_metrics": False}, locked


def _pipeline_starts_in_fit() -> int:
    """How many times `fit` starts a 1-device MirroredStrategy model's input pipeline."""
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    starts = []

    def started(_):
        starts.append(1)
        return np.int64(0)

    examples = tf.data.Dataset.from_tensor_slices(
        (np.ones((32, 3), np.float32), np.zeros((32, 1), np.float32))
    ).batch(8)
    dataset = (
        tf.data.Dataset.range(1)
        .map(lambda i: tf.numpy_function(started, [i], tf.int64))
        .flat_map(lambda _: examples)
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset, epochs=1, steps_per_epoch=4, verbose=0)
    return len(starts)


def test_upstream_symbolic_build_still_starts_the_input_pipeline_twice():
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    if not keras_compat.needs_patch():
        pytest.skip(f"keras {keras_compat.keras_version()} is not patched")
    was_applied = keras_compat.is_applied()
    keras_compat.remove()
    try:
        upstream = _pipeline_starts_in_fit()
        keras_compat.apply()
        corrected = _pipeline_starts_in_fit()
    finally:
        keras_compat.remove()
        if was_applied:
            keras_compat.apply()
    assert upstream == 2, "upstream reads a batch for the build from an iterator it discards"
    assert corrected == 1


def test_upstream_public_sharding_of_a_tasks_dataset_still_decodes_every_example(tmp_path):
    """`Dataset.shard`, the public op, shards by element: every worker decodes everything.

    Why `keras_compat.shard_by_file` uses TensorFlow's private auto-shard rewrite.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tests.jobs.tasks import record_tasks  # pylint: disable=g-import-not-at-top
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    pattern = record_tasks.write_tfrecords(str(tmp_path), 64, num_files=4)
    decoded = []

    def counted(record):
        tick = tf.numpy_function(lambda: decoded.append(1) or np.int64(0), [], tf.int64)
        with tf.control_dependencies([tick]):
            return tf.identity(record)

    dataset = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(pattern))).map(counted)
    assert sum(1 for _ in dataset.shard(2, 0)) == 32
    assert len(decoded) == 64, "the public shard decodes every example"
    decoded.clear()
    assert sum(1 for _ in keras_compat.shard_by_file(dataset, 2, 0)) == 32
    assert len(decoded) == 32
    assert not keras_compat.can_shard_by_file(tf.data.Dataset.range(8), 2)
    assert not keras_compat.can_shard_by_file(dataset, 5), "4 files cannot feed 5 shards"


def _timeseries():
    import keras  # pylint: disable=g-import-not-at-top

    series = np.stack([np.sin(np.arange(200) * (k + 1) / 9.0) for k in range(7)], 1)
    return keras.utils.timeseries_dataset_from_array(
        series[:-20].astype("float32"),
        (series[20:, 0] > 0).astype("float32"),
        sequence_length=20,
        batch_size=16,
    )


@pytest.mark.parametrize("model_kind", ["functional", "sequential without Input"])
def test_a_strategy_builds_from_the_element_spec_with_unknown_dimensions_kept(applied, model_kind):
    """`timeseries_dataset_from_array` (`(None, None, 7)`) into a model of windows of 20.

    Today's main built from a batch of 1s: "expected shape=(None, 20, 7), found
    shape=(1, 1, 7)". A `Sequential` without `Input` cannot be built from the
    spec (its `Dense` needs the flattened size) and builds from a first batch.
    """
    del applied
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    dataset = _timeseries()
    assert dataset.element_spec[0].shape.as_list() == [None, None, 7]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        layers = [keras.layers.Flatten(), keras.layers.Dense(1)]
        if model_kind == "functional":
            inputs = keras.Input((20, 7))
            model = keras.Model(inputs, keras.Sequential(layers)(inputs))
        else:
            model = keras.Sequential(layers)
        model.compile(optimizer="sgd", loss="mse")
    history = model.fit(dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.iterations.numpy()) == 11  # 161 windows at 16
