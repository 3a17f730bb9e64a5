"""tfdist.outputs.export: a SavedModel that plain TensorFlow (Vertex AI Prediction's
TF Serving) loads and that predicts what the Keras model predicts."""

import numpy as np
import pytest

from tfdist.errors import UsageError
from tfdist.outputs import export


def _model():
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    model.fit(
        rng.normal(size=(64, 6)).astype("float32"),
        rng.integers(0, 3, size=64),
        epochs=1,
        batch_size=16,
        verbose=0,
    )  # non-trivial weights and BN statistics
    return model


def test_export_replaces_an_older_saved_model(tmp_path):
    first, second = _model(), _model()
    second.layers[-1].kernel.assign(second.layers[-1].kernel * 0.0)
    export.export_saved_model(first, str(tmp_path))
    export.export_saved_model(second, str(tmp_path))
    import tensorflow as tf

    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    features = np.ones((2, 6), "float32")
    (output,) = serve(features=tf.constant(features)).values()
    np.testing.assert_allclose(output.numpy(), second.predict(features, verbose=0), rtol=1e-5)


def test_unbuilt_model_is_a_usage_error(tmp_path):
    import keras

    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(UsageError, match="not built"):
        export.export_saved_model(model, str(tmp_path))


@pytest.mark.parametrize(
    "value,expected", [("savedmodel", "savedmodel"), ("Both", "both"), ("keras", "keras")]
)
def test_export_formats(value, expected):
    assert export.check_export_format(value) == expected


def test_unknown_export_format_is_one_line_naming_the_choices():
    with pytest.raises(UsageError) as caught:
        export.check_export_format("onnx" * 100)
    assert "savedmodel, keras, both" in str(caught.value)
    assert len(str(caught.value)) < 300


def test_default_format_is_both_on_vertex_and_keras_elsewhere():
    assert export.default_export_format({"AIP_MODEL_DIR": "gs://b/run/model/"}) == "both"
    assert export.default_export_format({}) == "keras"
    assert export.wants_saved_model("both") and export.wants_keras("both")
    assert export.wants_saved_model("savedmodel") and not export.wants_keras("savedmodel")


def test_a_model_built_under_a_strategy_with_named_inputs_exports(tmp_path):
    """What the trainer has after fit: variables created in a strategy scope."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        dense = keras.Input((3,), name="dense_features")
        extra = keras.Input((2,), name="extra")
        outputs = keras.layers.Dense(2)(keras.layers.Concatenate()([dense, extra]))
        model = keras.Model({"dense_features": dense, "extra": extra}, outputs)
        model.compile(optimizer="adam", loss="mse")
    features = {"dense_features": np.ones((8, 3), "float32"), "extra": np.ones((8, 2), "float32")}
    model.fit(features, np.zeros((8, 2), "float32"), verbose=0)
    export.export_saved_model(model, str(tmp_path))
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    assert set(serve.structured_input_signature[1]) == {"dense_features", "extra"}, (
        "request keys are the Keras input names"
    )
    (output,) = serve(**{name: tf.constant(value) for name, value in features.items()}).values()
    np.testing.assert_allclose(output.numpy(), model.predict(features, verbose=0), rtol=1e-5)
