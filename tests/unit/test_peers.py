"""tfdist checked against implementations nobody here wrote, kept in the suite.

| tfdist | peer | tolerance |
|---|---|---|
| Keras 3 + tfdist on 2 workers (MWMS) | tf_keras (Keras 2) on 2 workers | 0 |
| `tfdist.optimizers.LARS` | Model Garden `official/modeling/optimization/lars.py` | 0 |
| `tfdist.optimizers.LAMB` | Model Garden `lamb.py` (TF Addons' code) | 1e-5 relative |
| TF's "Multi-worker training with Keras" tutorial | upstream Keras 3 (fails) | trains |

The full table, with the measured differences, is docs/peers.md.

The peers are installed packages, never fetched here: `tf-keras` from the
`peers` extra, and `tf-models-official` installed without its requirements
(it pins another TensorFlow; see docs/peers.md). A test that needs a peer that
is not installed is skipped, except under CI (`CI=true`), where `.ci/run`
installs the peers and a missing one fails the test. TF Addons is not compared
directly: it does not import under TensorFlow 2.21; Model Garden's `lamb.py`
carries its LAMB.

Select these tests with `python -m pytest -m peers`.
"""

import importlib.metadata
import importlib.util
import os
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.peers
STEPS = 30
INSTALL_HINT = (
    "python -m pip install -e '.[peers]' && "
    "python -m pip install --no-deps tf-models-official==2.20.0"
)


def _require_peer(distribution: str) -> importlib.metadata.Distribution:
    """The installed peer package; skips the test if it is not installed (fails under CI)."""
    try:
        return importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        message = (
            f"peer package {distribution!r} is not installed; install the peers "
            f"with: {INSTALL_HINT}"
        )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (.ci/run installs them)")
    pytest.skip(message)


def _model_garden(name: str):
    """Model Garden's `official/modeling/optimization/<name>.py`, from the installed package.

    Loaded from the file rather than imported as `official.modeling.optimization.<name>`:
    that package's `__init__` imports its whole configuration system (gin,
    yaml, the optimizer factory, ...), which needs requirements we do not
    install, because tf-models-official pins another TensorFlow. `lars.py` and
    `lamb.py` import only TensorFlow, tf_keras, numpy and the standard library.
    """
    _require_peer("tf-keras")
    distribution = _require_peer("tf-models-official")
    path = pathlib.Path(distribution.locate_file(f"official/modeling/optimization/{name}.py"))
    assert path.is_file(), f"tf-models-official {distribution.version} has no {path}"
    spec = importlib.util.spec_from_file_location(f"model_garden_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _max_difference(left, right) -> float:
    assert [np.shape(a) for a in left] == [np.shape(b) for b in right]
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(left, right))


def _assert_bitwise_equal(ours, theirs, what: str) -> None:
    unequal = [
        index
        for index, (a, b) in enumerate(zip(ours, theirs))
        if not np.array_equal(np.asarray(a), np.asarray(b))
    ]
    assert not unequal, (
        f"{what}: variables {unequal} differ, max difference {_max_difference(ours, theirs):.3g}"
    )


# ---------------------------------------------------------------------------------------
# Optimizers: the same gradients, applied by tfdist (Keras 3) and by Model Garden (tf_keras).

NUM_FEATURES = 8
NUM_CLASSES = 3
BATCH = 32


def _batches(steps: int = STEPS):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(steps, BATCH, NUM_FEATURES)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=(steps, BATCH)).astype(np.int32)
    return features, labels


def _models(*, batch_norm: bool):
    """A Keras 3 model and a tf_keras model with the same layers, names and initial weights.

    Layer names are set so that the exclusion patterns ("bias", "batch_norm")
    match the same variables in both (Keras 3 paths are "sequential/hidden/bias",
    tf_keras names "hidden/bias:0").
    """
    import keras  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top

    def stack(module, input_layer):
        layers = [input_layer, module.layers.Dense(16, name="hidden")]
        if batch_norm:
            layers.append(module.layers.BatchNormalization(name="batch_norm"))
        layers += [module.layers.ReLU(), module.layers.Dense(NUM_CLASSES, name="logits")]
        return module.Sequential(layers)

    keras.utils.set_random_seed(1)
    ours = stack(keras, keras.Input((NUM_FEATURES,)))
    theirs = stack(tf_keras, tf_keras.layers.InputLayer((NUM_FEATURES,)))
    theirs.set_weights(ours.get_weights())
    return ours, theirs


def _gradients(weights, features, labels, *, batch_norm: bool):
    """The loss gradient for these weights, in plain TensorFlow ops.

    Both sides get their gradients from this one function, so equal weights give
    bit-equal gradients and any difference comes from the optimizers.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    tensors = [tf.constant(w) for w in weights]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        if batch_norm:
            kernel, bias, gamma, beta, out_kernel, out_bias = tensors
        else:
            kernel, bias, out_kernel, out_bias = tensors
        hidden = tf.matmul(features, kernel) + bias
        if batch_norm:
            mean, variance = tf.nn.moments(hidden, [0])
            hidden = (hidden - mean) / tf.sqrt(variance + 1e-3) * gamma + beta
        logits = tf.matmul(tf.nn.relu(hidden), out_kernel) + out_bias
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    return tape.gradient(loss, tensors)


def _train_on_shared_gradients(ours_optimizer, theirs_optimizer, *, batch_norm: bool):
    """Applies STEPS gradient steps on each side; returns (initial, ours, theirs) weights."""
    ours, theirs = _models(batch_norm=batch_norm)
    our_vars, their_vars = ours.trainable_variables, theirs.trainable_variables
    initial = [v.numpy() for v in our_vars]
    for features, labels in zip(*_batches()):
        our_grads = _gradients(
            [v.numpy() for v in our_vars], features, labels, batch_norm=batch_norm
        )
        their_grads = _gradients(
            [v.numpy() for v in their_vars], features, labels, batch_norm=batch_norm
        )
        ours_optimizer.apply_gradients(zip(our_grads, our_vars))
        theirs_optimizer.apply_gradients(zip(their_grads, their_vars))
    assert int(ours_optimizer.iterations.numpy()) == STEPS
    assert int(theirs_optimizer.iterations.numpy()) == STEPS
    return initial, [v.numpy() for v in our_vars], [v.numpy() for v in their_vars]


LARS_SETTINGS = {"momentum": 0.9, "weight_decay_rate": 1e-4, "eeta": 0.001}
EXCLUDED = ["bias", "batch_norm"]


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_lars_equals_model_garden_lars_bit_for_bit(nesterov):
    model_garden = _model_garden("lars")
    from tfdist.optimizers import LARS  # pylint: disable=g-import-not-at-top

    # Model Garden excludes from layer adaptation what it excludes from weight
    # decay when given no adaptation list; tfdist keeps the two lists apart.
    ours = LARS(
        0.5,
        nesterov=nesterov,
        exclude_from_weight_decay=EXCLUDED,
        exclude_from_layer_adaptation=EXCLUDED,
        **LARS_SETTINGS,
    )
    theirs = model_garden.LARS(
        0.5, nesterov=nesterov, exclude_from_weight_decay=EXCLUDED, **LARS_SETTINGS
    )
    initial, our_weights, their_weights = _train_on_shared_gradients(ours, theirs, batch_norm=True)

    assert _max_difference(initial, their_weights) > 0.01  # They trained.
    _assert_bitwise_equal(our_weights, their_weights, "LARS after 30 steps")


def test_lars_fit_with_batch_norm_in_training_mode_equals_model_garden_lars():
    """Each framework computes its own gradients through its own BatchNormalization."""
    model_garden = _model_garden("lars")
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top

    from tfdist.optimizers import LARS  # pylint: disable=g-import-not-at-top

    ours, theirs = _models(batch_norm=True)
    initial = ours.get_weights()
    ours.compile(
        optimizer=LARS(
            0.5,
            exclude_from_weight_decay=EXCLUDED,
            exclude_from_layer_adaptation=EXCLUDED,
            **LARS_SETTINGS,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    theirs.compile(
        optimizer=model_garden.LARS(0.5, exclude_from_weight_decay=EXCLUDED, **LARS_SETTINGS),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    features, labels = _batches()
    data = tf.data.Dataset.from_tensor_slices(
        (features.reshape(-1, NUM_FEATURES), labels.reshape(-1))
    ).batch(BATCH)
    our_history = ours.fit(data, epochs=1, shuffle=False, verbose=0).history
    their_history = theirs.fit(data, epochs=1, shuffle=False, verbose=0).history

    assert int(ours.optimizer.iterations.numpy()) == int(theirs.optimizer.iterations) == STEPS
    assert our_history["loss"] == their_history["loss"]
    assert _max_difference(initial, theirs.get_weights()) > 0.01  # They trained.
    trainable = [v.numpy() for v in ours.trainable_variables]
    _assert_bitwise_equal(
        trainable,
        [v.numpy() for v in theirs.trainable_variables],
        "trainable weights after 30 fit steps",
    )
    # The batch-norm moving statistics are the layers', not the optimizers', and
    # differ by round-off only: Keras 3 updates them as `m * momentum + x * (1 -
    # momentum)`, tf_keras as `m - (m - x) * (1 - momentum)`. In training mode
    # they do not feed back into the loss, so the trainable weights stay equal.
    our_moving = [
        ours.get_layer("batch_norm").moving_mean.numpy(),
        ours.get_layer("batch_norm").moving_variance.numpy(),
    ]
    their_moving = [
        theirs.get_layer("batch_norm").moving_mean.numpy(),
        theirs.get_layer("batch_norm").moving_variance.numpy(),
    ]
    for our_value, their_value in zip(our_moving, their_moving):
        np.testing.assert_allclose(our_value, their_value, rtol=1e-5, atol=1e-7)


LAMB_SETTINGS = {"weight_decay_rate": 0.01, "epsilon": 1e-6}


def _lamb_runs(beta_1: float, beta_2: float):
    model_garden = _model_garden("lamb")
    from tfdist.optimizers import LAMB  # pylint: disable=g-import-not-at-top

    ours = LAMB(
        0.01,
        beta_1=beta_1,
        beta_2=beta_2,
        exclude_from_weight_decay=["bias"],
        exclude_from_layer_adaptation=["bias"],
        **LAMB_SETTINGS,
    )
    theirs = model_garden.LAMB(
        0.01, beta_1=beta_1, beta_2=beta_2, exclude_from_weight_decay=["bias"], **LAMB_SETTINGS
    )
    # No batch norm here: a bias just before batch norm has a gradient of
    # round-off size, which LAMB's m / sqrt(v) scales up to a full step.
    return _train_on_shared_gradients(ours, theirs, batch_norm=False)


def test_lamb_equals_model_garden_lamb_to_1e5_relative():
    """Not bit for bit, because of where `1 - beta` is computed.

    tfdist (Keras-style) computes `1 - beta_1` and `1 - beta_2` in Python
    floats, so the factor is float32(0.001); Model Garden and TF Addons compute
    them from float32 betas, float32(1) - float32(0.999) = 0.0010000467, 4.7e-5
    off. That moves every second-moment update a little (measured: at most
    6.0e-6 of a variable's largest weight after 30 steps). The next test shows
    it is the only difference.
    """
    initial, our_weights, their_weights = _lamb_runs(0.9, 0.999)

    assert _max_difference(initial, their_weights) > 0.01  # They trained.
    for index, (ours, theirs) in enumerate(zip(our_weights, their_weights)):
        relative = float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))
        assert relative <= 1e-5, f"variable {index}: {relative:.3g} of its largest weight"


def test_lamb_equals_model_garden_lamb_bit_for_bit_when_one_minus_beta_is_exact():
    # 1 - 0.5 and 1 - 0.75 come out the same in float32 and in Python floats.
    assert np.float32(1) - np.float32(0.5) == np.float32(1 - 0.5)
    assert np.float32(1) - np.float32(0.75) == np.float32(1 - 0.75)
    initial, our_weights, their_weights = _lamb_runs(0.5, 0.75)

    assert _max_difference(initial, their_weights) > 0.01  # They trained.
    _assert_bitwise_equal(our_weights, their_weights, "LAMB after 30 steps")
