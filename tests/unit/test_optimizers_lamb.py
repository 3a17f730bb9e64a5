"""LAMB against the issue's update rule, written here in float64 NumPy."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.unit.test_optimizers_lars import (
    PATHS,
    max_relative_error,
    random_gradients,
    run_tf,
    small_model,
)
from tfdist.errors import UsageError
from tfdist.optimizers import LAMB

STEPS = 30


def lamb_reference(
    initial, gradients, *, lr, beta_1, beta_2, epsilon, weight_decay_rate, decays, adapts
):
    """The issue's LAMB rule in float64, one list of arrays per step."""
    weights = [w.astype(np.float64) for w in initial]
    firsts = [np.zeros_like(w) for w in weights]
    seconds = [np.zeros_like(w) for w in weights]
    for t, step_gradients in enumerate(gradients, start=1):
        for i, g in enumerate(step_gradients):
            w = weights[i]
            g = g.astype(np.float64)
            firsts[i] = beta_1 * firsts[i] + (1 - beta_1) * g
            seconds[i] = beta_2 * seconds[i] + (1 - beta_2) * g * g
            m_hat = firsts[i] / (1 - beta_1**t)
            v_hat = seconds[i] / (1 - beta_2**t)
            r = m_hat / (np.sqrt(v_hat) + epsilon)
            if weight_decay_rate > 0 and decays[i]:
                r = r + weight_decay_rate * w
            w_norm, r_norm = np.linalg.norm(w), np.linalg.norm(r)
            ratio = w_norm / r_norm if adapts[i] and w_norm > 0 and r_norm > 0 else 1.0
            weights[i] = w - lr * ratio * r
    return weights


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
            weight_decay_rate=0.1,
            exclude_from_weight_decay=["bias$"],
            exclude_from_layer_adaptation=["head/"],
        ),
        decays=[True, False, True, True, True, False],
        adapts=[True, True, True, True, False, False],
    ),
    "other_betas": dict(
        kwargs=dict(
            beta_1=0.5,
            beta_2=0.9,
            epsilon=1e-3,
            weight_decay_rate=0.01,
            exclude_from_layer_adaptation=[],
        ),
        decays=[True] * 6,
        adapts=[True] * 6,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64_reference(case):
    spec = CASES[case]
    model = small_model()
    variables = model.trainable_variables
    assert [v.path for v in variables] == PATHS
    initial = [v.numpy().astype(np.float64) for v in variables]
    gradients = random_gradients(variables, STEPS, seed=100 + len(case))
    kwargs = dict(beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.0)
    kwargs.update(spec["kwargs"])
    lr = 0.01
    got = run_tf(LAMB(lr, **kwargs), variables, gradients)
    reference_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("exclude")}
    want = lamb_reference(
        initial, gradients, lr=lr, decays=spec["decays"], adapts=spec["adapts"], **reference_kwargs
    )
    assert max_relative_error(initial, got, want) < 5e-5


def test_single_step_golden_values():
    weights = keras.Variable([3.0, 4.0])
    LAMB(0.1).apply_gradients([(np.array([0.6, -0.8], "float32"), weights)])
    # r = g / (|g| + 1e-6) ≈ [1, -1]; ratio = 5 / √2; step = 0.1 · 5/√2 · r.
    step = 0.5 / np.sqrt(2.0)
    np.testing.assert_allclose(weights.numpy(), [3.0 - step, 4.0 + step], atol=2e-6)


def test_weight_decay_is_inside_the_trust_ratio():
    # Zero gradient: r = wd · w, ratio = ‖w‖ / ‖wd · w‖ = 1 / wd, so w ← w − lr · w.
    weights = keras.Variable([2.0, -1.0])
    LAMB(0.25, weight_decay_rate=0.01).apply_gradients([(np.zeros(2, "float32"), weights)])
    np.testing.assert_allclose(weights.numpy(), [1.5, -0.75], atol=1e-6)


def test_norms_are_float32_for_float16_variables():
    # 400² overflows float16: a float16 ‖w‖ would be inf and the ratio nan or inf.
    weights = keras.Variable(np.full(4, 400.0), dtype="float16")
    LAMB(0.01).apply_gradients([(np.full(4, 3.0, "float16"), weights)])
    # r ≈ 1 everywhere, ratio = 800 / 2 = 400; step = 0.01 · 400 = 4.
    np.testing.assert_allclose(weights.numpy().astype(np.float32), np.full(4, 396.0), atol=0.25)


def test_config_round_trip():
    optimizer = LAMB(
        0.002,
        beta_1=0.8,
        beta_2=0.99,
        epsilon=1e-7,
        weight_decay_rate=0.01,
        exclude_from_weight_decay=["bias", "layer_norm"],
        exclude_from_layer_adaptation=["bias"],
        global_clipnorm=1.0,
    )
    config = optimizer.get_config()
    assert LAMB.from_config(config).get_config() == config
    restored = keras.optimizers.deserialize(
        json.loads(json.dumps(keras.optimizers.serialize(optimizer)))
    )
    assert isinstance(restored, LAMB)
    assert restored.get_config() == config


def test_saved_model_loads_back_by_name(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=LAMB(0.01, weight_decay_rate=0.01, exclude_from_weight_decay=["bias"]), loss="mse"
    )
    x = np.random.default_rng(0).standard_normal((16, 3)).astype("float32")
    model.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded.optimizer, LAMB)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_does_not_retrace_on_second_call():
    variables = [keras.Variable(np.ones((3, 2), "float32")), keras.Variable(np.zeros(2))]
    optimizer = LAMB(0.01, weight_decay_rate=1e-3)
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


def test_rejects_keras_weight_decay_and_bad_values():
    with pytest.raises(UsageError, match="weight_decay_rate"):
        LAMB(0.01, weight_decay=0.1)
    with pytest.raises(UsageError, match="regular expression"):
        LAMB(0.01, exclude_from_layer_adaptation=["[bias"])


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"beta_1": 1.0}, "LAMB beta_1 is 1.0, expected a number in [0, 1), e.g. beta_1=0.9"),
        ({"beta_2": 1.5}, "LAMB beta_2 is 1.5, expected a number in [0, 1), e.g. beta_2=0.999"),
        ({"beta_2": -0.1}, "LAMB beta_2 is -0.1, expected a number in [0, 1)"),
        ({"epsilon": -1e-6}, "LAMB epsilon is -1e-06, expected a number >= 0, e.g. epsilon=1e-06"),
        ({"weight_decay_rate": -0.01}, "LAMB weight_decay_rate is -0.01, expected a number >= 0"),
    ],
    ids=["beta_1 1", "beta_2 above 1", "negative beta_2", "negative epsilon", "negative decay"],
)
def test_bad_arguments_are_one_line_usage_errors(arguments, message):
    with pytest.raises(UsageError) as raised:
        LAMB(0.01, **arguments)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)
