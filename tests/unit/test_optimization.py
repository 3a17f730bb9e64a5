"""build_optimizer: the optimizer, its scaled and scheduled rate, and the one log line."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import UsageError
from tfdist.optimizers import LAMB, LARS, usual_exclusions
from tfdist.optimizers.schedules import WarmupDecay
from trainer.config import build_config, load_config_file
from trainer.optimization import build_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LARGE_BATCH_CONFIG = os.path.join(REPO, "configs", "cnn_large_batch_lars.json")


class RecordingLogger:
    def __init__(self):
        self.lines = []

    def info(self, message, *args):
        self.lines.append(message % args)


def build(steps_per_epoch=10, **fields):
    logger = RecordingLogger()
    optimizer = build_optimizer(
        build_config(fields), steps_per_epoch=steps_per_epoch, logger=logger
    )
    return optimizer, logger.lines


def learning_rates(optimizer, steps):
    """The rate the optimizer would use at each step, evaluated in graph mode."""
    schedule = optimizer.get_config()["learning_rate"]
    if not isinstance(schedule, dict):
        return [schedule] * len(steps)
    schedule = keras.optimizers.schedules.deserialize(schedule)
    evaluate = tf.function(lambda step: schedule(step))
    return [float(evaluate(tf.constant(step, tf.int64))) for step in steps]


def test_linear_scaling_warmup_and_polynomial_decay_logged_once():
    optimizer, lines = build(
        optimizer="lars",
        learning_rate=0.1,
        lr_scaling="linear",
        reference_batch_size=256,
        global_batch_size=4096,
        epochs=5,
        warmup_epochs=1.0,
        lr_decay="polynomial",
        decay_power=2.0,
    )
    assert isinstance(optimizer, LARS)
    assert len(lines) == 1
    assert "lr_scaling=linear" in lines[0]
    assert "peak learning rate 1.6 " in lines[0]
    assert "warmup 10 steps" in lines[0]
    assert learning_rates(optimizer, [0, 9, 10, 30, 50]) == pytest.approx(
        [0.16, 1.6, 1.6, 1.6 * (1 - 20 / 40) ** 2, 0.0], abs=1e-6
    )


def test_sqrt_scaling_with_warmup_steps_and_cosine():
    optimizer, lines = build(
        optimizer="lamb",
        learning_rate=0.001,
        lr_scaling="sqrt",
        reference_batch_size=64,
        global_batch_size=1024,
        epochs=2,
        warmup_steps=4,
        lr_decay="cosine",
    )
    assert isinstance(optimizer, LAMB)
    assert "lr_scaling=sqrt" in lines[0] and "peak learning rate 0.004 " in lines[0]
    assert learning_rates(optimizer, [3, 4, 20]) == pytest.approx([0.004, 0.004, 0.0], abs=1e-7)


def test_step_decay_boundaries_are_fractions_of_the_decay_phase():
    optimizer, lines = build(
        optimizer="sgd",
        learning_rate=0.4,
        epochs=4,
        lr_decay="step",
        decay_boundaries=(0.5,),
        decay_rate=0.25,
    )
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert learning_rates(optimizer, [19, 20, 39]) == pytest.approx([0.4, 0.1, 0.1])
    assert "x0.25 at fractions 0.5 of 40 steps" in lines[0]


def test_constant_without_warmup_keeps_a_plain_float_rate():
    optimizer, lines = build(optimizer="adam", learning_rate=0.002)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert optimizer.get_config()["learning_rate"] == pytest.approx(0.002)
    assert "lr_scaling=none: peak learning rate 0.002;" in lines[0]


def test_lars_defaults_and_usual_exclusions_with_weight_decay():
    optimizer, _ = build(optimizer="lars", weight_decay=1e-4)
    config = optimizer.get_config()
    assert config["momentum"] == 0.9 and config["eeta"] == 0.001
    assert config["weight_decay_rate"] == 1e-4
    assert config["exclude_from_weight_decay"] == list(usual_exclusions())
    assert config["exclude_from_layer_adaptation"] == []


def test_explicit_exclusions_are_passed_through():
    optimizer, _ = build(
        optimizer="lamb",
        weight_decay=0.01,
        exclude_from_weight_decay=("bias",),
        exclude_from_layer_adaptation=("layer_norm", "bias"),
    )
    config = optimizer.get_config()
    assert config["exclude_from_weight_decay"] == ["bias"]
    assert config["exclude_from_layer_adaptation"] == ["layer_norm", "bias"]


def test_usual_exclusions_leave_out_biases_and_normalization_only():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, name="dense"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.LayerNormalization(name="layer_normalization"),
            keras.layers.Dense(2, name="head"),
        ],
        name="net",
    )
    optimizer, _ = build(optimizer="lars", weight_decay=0.1, learning_rate=1.0)
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    # A zero gradient: only weight decay (inside the trust ratio) moves a variable.
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])
    moved = [v.path for v, value in zip(variables, before) if not np.array_equal(v.numpy(), value)]
    assert moved == ["net/dense/kernel", "net/head/kernel"]


def test_sgd_weight_decay_exclusions_apply():
    optimizer, _ = build(
        optimizer="sgd",
        learning_rate=0.5,
        momentum=0.0,
        weight_decay=0.1,
        exclude_from_weight_decay=("bias",),
    )
    layer = keras.layers.Dense(1, bias_initializer="ones")
    layer.build((None, 1))
    layer.kernel.assign([[2.0]])
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in layer.trainable_variables])
    assert layer.kernel.numpy().item() == pytest.approx(2.0 * (1 - 0.05))
    assert layer.bias.numpy().item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(epochs=1, warmup_epochs=2.0), "warmup is 20 steps but training has only 10"),
        (dict(lr_decay="step"), "no boundaries"),
        (dict(lr_decay="step", decay_boundaries=(2.0,)), "fractions of the decay phase"),
    ],
)
def test_schedules_that_cannot_fit_are_usage_errors(fields, message):
    with pytest.raises(UsageError, match=message):
        build(**fields)


def test_steps_per_epoch_must_be_positive():
    with pytest.raises(UsageError, match="steps_per_epoch is 0"):
        build(steps_per_epoch=0)


def test_large_batch_config_loads_and_builds():
    config = build_config(load_config_file(LARGE_BATCH_CONFIG))
    assert (config.model, config.optimizer, config.lr_decay) == ("cnn", "lars", "polynomial")
    assert config.global_batch_size >= 16 * config.reference_batch_size
    assert config.warmup_epochs > 0
    steps_per_epoch = config.num_examples // config.global_batch_size
    logger = RecordingLogger()
    optimizer = build_optimizer(config, steps_per_epoch=steps_per_epoch, logger=logger)
    assert isinstance(optimizer, LARS)
    assert "lr_scaling=sqrt" in logger.lines[0]
    assert "peak learning rate 8 " in logger.lines[0]
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    assert isinstance(schedule, WarmupDecay)
    assert schedule.total_steps == config.epochs * steps_per_epoch
