"""LARS against the issue's update rule, written here in float64 NumPy."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import UsageError
from tfdist.optimizers import LAMB, LARS

STEPS = 30


def lars_reference(
    initial, gradients, *, lr, momentum, weight_decay_rate, eeta, epsilon, nesterov, decays, adapts
):
    """The issue's LARS rule in float64, one list of arrays per step."""
    weights = [w.astype(np.float64) for w in initial]
    velocities = [np.zeros_like(w) for w in weights]
    for step_gradients in gradients:
        for i, g in enumerate(step_gradients):
            w = weights[i]
            g = g.astype(np.float64)
            if weight_decay_rate > 0 and decays[i]:
                g = g + weight_decay_rate * w
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            trust = 1.0
            if adapts[i] and w_norm > 0 and g_norm > 0:
                trust = eeta * w_norm / (g_norm + epsilon)
            velocities[i] = momentum * velocities[i] + lr * trust * g
            if nesterov:
                weights[i] = w - (momentum * velocities[i] + lr * trust * g)
            else:
                weights[i] = w - velocities[i]
    return weights


def small_model():
    """dense/{kernel,bias}, batch_normalization/{gamma,beta}, head/{kernel,bias}."""
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, name="dense"),
            keras.layers.BatchNormalization(name="batch_normalization"),
            keras.layers.Dense(3, name="head"),
        ],
        name="net",
    )


def random_gradients(variables, steps, seed):
    rng = np.random.default_rng(seed)
    gradients = []
    for _ in range(steps):
        scale = 10.0 ** rng.uniform(-2, 1)
        gradients.append(
            [(scale * rng.standard_normal(v.shape)).astype(np.float32) for v in variables]
        )
    return gradients


def run_tf(optimizer, variables, gradients):
    optimizer.build(variables)

    @tf.function
    def apply(step_gradients):
        optimizer.apply_gradients(zip(step_gradients, variables))

    for step_gradients in gradients:
        apply([tf.constant(g) for g in step_gradients])
    return [v.numpy().astype(np.float64) for v in variables]


def max_relative_error(initial, got, want):
    """Largest ‖got − want‖ / ‖want − initial‖: error relative to the distance moved."""
    errors = []
    for w0, g, r in zip(initial, got, want):
        moved = np.linalg.norm(r - w0)
        assert moved > 0, "the reference did not move this variable; the case tests nothing"
        errors.append(np.linalg.norm(g - r) / moved)
    return max(errors)


PATHS = [
    "net/dense/kernel",
    "net/dense/bias",
    "net/batch_normalization/gamma",
    "net/batch_normalization/beta",
    "net/head/kernel",
    "net/head/bias",
]
CASES = {
    "plain": dict(kwargs=dict(), decays=[False] * 6, adapts=[True] * 6),
    "weight_decay": dict(kwargs=dict(weight_decay_rate=0.01), decays=[True] * 6, adapts=[True] * 6),
    "exclusions_shared": dict(
        kwargs=dict(
            weight_decay_rate=0.01,
            exclude_from_weight_decay=["bias", "batch_normalization"],
            exclude_from_layer_adaptation=["bias", "batch_normalization"],
        ),
        decays=[True, False, False, False, True, False],
        adapts=[True, False, False, False, True, False],
    ),
    "decay_exclusions_only": dict(
        kwargs=dict(weight_decay_rate=0.01, exclude_from_weight_decay=["bias"]),
        decays=[True, False, True, True, True, False],
        adapts=[True] * 6,
    ),
    "exclusions_separate": dict(
        kwargs=dict(
            weight_decay_rate=0.05,
            exclude_from_weight_decay=["bias$"],
            exclude_from_layer_adaptation=["head/"],
        ),
        decays=[True, False, True, True, True, False],
        adapts=[True, True, True, True, False, False],
    ),
    "nesterov": dict(
        kwargs=dict(
            nesterov=True, weight_decay_rate=0.01, epsilon=1e-3, exclude_from_layer_adaptation=[]
        ),
        decays=[True] * 6,
        adapts=[True] * 6,
    ),
    "no_momentum": dict(
        kwargs=dict(momentum=0.0, eeta=0.01), decays=[False] * 6, adapts=[True] * 6
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64_reference(case):
    spec = CASES[case]
    model = small_model()
    variables = model.trainable_variables
    assert [v.path for v in variables] == PATHS
    initial = [v.numpy().astype(np.float64) for v in variables]
    gradients = random_gradients(variables, STEPS, seed=len(case))
    kwargs = dict(momentum=0.9, weight_decay_rate=0.0, eeta=0.001, epsilon=0.0, nesterov=False)
    kwargs.update(spec["kwargs"])
    lr = 2.0
    got = run_tf(LARS(lr, **kwargs), variables, gradients)
    reference_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("exclude")}
    want = lars_reference(
        initial, gradients, lr=lr, decays=spec["decays"], adapts=spec["adapts"], **reference_kwargs
    )
    assert max_relative_error(initial, got, want) < 1e-5


def test_single_step_golden_values():
    weights = keras.Variable([3.0, 4.0])
    LARS(1.0).apply_gradients([(np.array([0.6, 0.8], "float32"), weights)])
    # trust = 0.001 * 5 / 1 → step 0.005 * g.
    np.testing.assert_allclose(weights.numpy(), [2.997, 3.996], rtol=0, atol=1e-6)

    weights = keras.Variable([3.0, 4.0])
    LARS(1.0, weight_decay_rate=0.1, nesterov=True).apply_gradients(
        [(np.array([0.6, 0.8], "float32"), weights)]
    )
    # g + 0.1 w = [0.9, 1.2], trust = 0.005 / 1.5; w -= 1.9 * [0.003, 0.004].
    np.testing.assert_allclose(weights.numpy(), [2.9943, 3.9924], rtol=0, atol=1e-6)


def test_zero_weights_and_zero_gradient_use_trust_one():
    weights = keras.Variable([0.0, 0.0])
    still = keras.Variable([1.0, 2.0])
    LARS(0.5, momentum=0.0).apply_gradients(
        [(np.array([1.0, -2.0], "float32"), weights), (np.zeros(2, "float32"), still)]
    )
    np.testing.assert_allclose(weights.numpy(), [-0.5, 1.0], atol=1e-7)
    np.testing.assert_allclose(still.numpy(), [1.0, 2.0], atol=0)


def test_norms_are_float32_for_float16_variables():
    # 400² overflows float16 (max 65504): a float16 norm would be inf and trust 0 or nan.
    weights = keras.Variable(np.full(4, 400.0), dtype="float16")
    LARS(1.0, momentum=0.0, eeta=0.01).apply_gradients([(np.full(4, 300.0, "float16"), weights)])
    # trust = 0.01 * 800 / 600; step = trust * 300 = 4.
    np.testing.assert_allclose(weights.numpy().astype(np.float32), np.full(4, 396.0), atol=0.25)


def test_config_round_trip():
    optimizer = LARS(
        0.3,
        momentum=0.8,
        weight_decay_rate=1e-4,
        eeta=0.002,
        epsilon=1e-9,
        nesterov=True,
        exclude_from_weight_decay=["bias", "gamma"],
        exclude_from_layer_adaptation=[],
        clipnorm=1.0,
        name="my_lars",
    )
    config = optimizer.get_config()
    assert LARS.from_config(config).get_config() == config
    assert config["exclude_from_weight_decay"] == ["bias", "gamma"]
    assert config["exclude_from_layer_adaptation"] == []
    restored = keras.optimizers.deserialize(
        json.loads(json.dumps(keras.optimizers.serialize(optimizer)))
    )
    assert isinstance(restored, LARS)
    assert restored.get_config() == config


def test_saved_model_loads_back_by_name(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=LARS(0.5, weight_decay_rate=1e-3, exclude_from_weight_decay=["bias"]), loss="mse"
    )
    x = np.random.default_rng(0).standard_normal((16, 3)).astype("float32")
    model.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded.optimizer, LARS)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert int(loaded.optimizer.iterations) == 2
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_does_not_retrace_on_second_call():
    variables = [keras.Variable(np.ones((3, 2), "float32")), keras.Variable(np.zeros(2))]
    optimizer = LARS(0.1, weight_decay_rate=1e-3)
    optimizer.build(variables)
    traces = []

    @tf.function
    def apply(gradients):
        traces.append(1)
        optimizer.apply_gradients(zip(gradients, variables))

    for value in (1.0, 2.0, 3.0):
        apply([tf.fill((3, 2), value), tf.fill((2,), value)])
    assert len(traces) == 1
    assert int(optimizer.iterations) == 3


def test_rejects_keras_weight_decay_and_bad_patterns():
    with pytest.raises(UsageError, match="weight_decay_rate"):
        LARS(0.1, weight_decay=0.1)
    with pytest.raises(UsageError, match=r"'\(bias'"):
        LARS(0.1, exclude_from_weight_decay=["(bias"])
    with pytest.raises(ValueError, match="constructor"):
        LARS(0.1).exclude_from_weight_decay(var_names=["bias"])


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"momentum": 1.0}, "LARS momentum is 1.0, expected a number in [0, 1), e.g. momentum=0.9"),
        ({"momentum": -0.1}, "LARS momentum is -0.1, expected a number in [0, 1)"),
        ({"weight_decay_rate": -1e-4}, "LARS weight_decay_rate is -0.0001, expected a number >= 0"),
        ({"eeta": -0.001}, "LARS eeta is -0.001, expected a number >= 0, e.g. eeta=0.001"),
        ({"epsilon": float("nan")}, "LARS epsilon is nan, expected a number >= 0"),
        ({"momentum": "0.9"}, "LARS momentum is '0.9', expected a number in [0, 1)"),
    ],
    ids=[
        "momentum 1",
        "negative momentum",
        "negative decay",
        "negative eeta",
        "nan epsilon",
        "string momentum",
    ],
)
def test_bad_arguments_are_one_line_usage_errors(arguments, message):
    with pytest.raises(UsageError) as raised:
        LARS(0.1, **arguments)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: LARS(0.5, weight_decay_rate=1e-2),
        lambda: LAMB(0.01, weight_decay_rate=1e-2),
    ],
    ids=["lars", "lamb"],
)
def test_sparse_gradients_match_dense(make_optimizer):
    """Embedding-style IndexedSlices gradients give the dense gradient's update."""
    initial = np.arange(12, dtype="float32").reshape(4, 3) / 10
    rows = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]], "float32")
    sparse = tf.IndexedSlices(tf.constant(rows), tf.constant([0, 2]), tf.constant([4, 3]))
    dense = np.zeros((4, 3), "float32")
    dense[[0, 2]] = rows
    results = []
    for gradient in (sparse, tf.constant(dense)):
        variable = keras.Variable(initial)
        make_optimizer().apply_gradients([(gradient, variable)])
        results.append(variable.numpy())
    assert not np.array_equal(results[1], initial)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
