"""Learning-rate scaling and the warmup-then-decay schedule."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import UsageError
from tfdist.optimizers import schedules


@pytest.mark.parametrize("rule, expected", [("none", 0.1), ("linear", 1.6), ("sqrt", 0.4)])
def test_scale_learning_rate(rule, expected):
    scaled = schedules.scale_learning_rate(
        0.1, rule=rule, global_batch_size=4096, reference_batch_size=256
    )
    assert scaled == pytest.approx(expected)


def test_scale_learning_rate_rejects_bad_input():
    with pytest.raises(UsageError, match="'cubic'"):
        schedules.scale_learning_rate(
            0.1, rule="cubic", global_batch_size=8, reference_batch_size=8
        )
    with pytest.raises(UsageError, match="reference_batch_size is 0"):
        schedules.scale_learning_rate(
            0.1, rule="linear", global_batch_size=8, reference_batch_size=0
        )


def values(schedule, steps):
    """The schedule evaluated in graph mode, as Keras optimizers do."""
    evaluate = tf.function(lambda step: schedule(step))
    return [float(evaluate(tf.constant(step, tf.int64))) for step in steps]


def test_warmup_is_linear_and_reaches_the_peak():
    schedule = schedules.WarmupDecay(2.0, total_steps=20, warmup_steps=4)
    assert values(schedule, [0, 1, 2, 3, 4, 19, 100]) == pytest.approx(
        [0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0]
    )


def test_cosine_decay_after_warmup():
    schedule = schedules.WarmupDecay(
        1.0, total_steps=12, warmup_steps=2, decay="cosine", end_learning_rate=0.1
    )
    steps = [2, 4, 7, 12, 30]
    expected = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min((s - 2) / 10, 1))) for s in steps]
    assert values(schedule, steps) == pytest.approx(expected, rel=1e-6)
    assert values(schedule, [7])[0] == pytest.approx(0.55)


def test_polynomial_decay_with_power():
    schedule = schedules.WarmupDecay(0.8, total_steps=10, decay="polynomial", power=2.0)
    assert values(schedule, [0, 5, 9, 10, 50]) == pytest.approx(
        [0.8, 0.2, 0.008, 0.0, 0.0], abs=1e-7
    )


def test_step_decay_at_fractions_of_the_decay_phase():
    schedule = schedules.WarmupDecay(
        1.0, total_steps=110, warmup_steps=10, decay="step", boundaries=(0.5, 0.75), decay_rate=0.1
    )
    # Decay phase: steps 10..109; boundaries at 10 + 50 and 10 + 75.
    assert values(schedule, [10, 59, 60, 84, 85, 200]) == pytest.approx(
        [1.0, 1.0, 0.1, 0.1, 0.01, 0.01], rel=1e-6
    )


def test_constant_without_warmup():
    schedule = schedules.WarmupDecay(0.3, total_steps=5)
    assert values(schedule, [0, 4, 9]) == pytest.approx([0.3, 0.3, 0.3])


def test_config_round_trip_and_deserialize_by_name():
    schedule = schedules.WarmupDecay(
        1.5,
        total_steps=100,
        warmup_steps=5,
        decay="step",
        boundaries=(0.3, 0.6),
        decay_rate=0.2,
        name="lr",
    )
    config = schedule.get_config()
    assert schedules.WarmupDecay.from_config(config).get_config() == config
    serialized = json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule)))
    restored = keras.optimizers.schedules.deserialize(serialized)
    assert isinstance(restored, schedules.WarmupDecay)
    assert values(restored, [0, 40, 80]) == pytest.approx(values(schedule, [0, 40, 80]))


def test_optimizer_with_schedule_saves_and_loads(tmp_path):
    schedule = schedules.WarmupDecay(0.1, total_steps=8, warmup_steps=2, decay="cosine")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    x = np.ones((8, 2), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    restored = loaded.optimizer.learning_rate
    assert float(restored) == pytest.approx(float(schedule(2)))
    saved = loaded.optimizer.get_config()["learning_rate"]
    assert saved == model.optimizer.get_config()["learning_rate"]
    assert saved["registered_name"] == "tfdist>WarmupDecay"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(total_steps=10, warmup_steps=11), "warmup_steps is 11"),
        (dict(total_steps=10, decay="linear"), "decay is 'linear'"),
        (dict(total_steps=10, decay="step"), "no boundaries"),
        (dict(total_steps=10, decay="step", boundaries=(0.6, 0.4)), "increasing fractions"),
        (dict(total_steps=10, decay="step", boundaries=(30,)), "increasing fractions"),
        (dict(total_steps=0), "total_steps is 0"),
        (dict(total_steps=10, decay="polynomial", power=0.0), "power is 0.0"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(UsageError, match=message):
        schedules.WarmupDecay(1.0, **kwargs)
