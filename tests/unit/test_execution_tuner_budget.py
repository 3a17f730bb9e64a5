"""`--steps_per_execution=auto` probing is bounded: 5% of the run or 3 s, whichever is larger.

Counted in probes and steps, not time: a run far too short to pay for probing
gets one traced and one timed execution at 1 step; a run long enough probes
every candidate in full.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from tfdist import data as data_lib
from tfdist.distribute import execution_tuner

NUM_EXAMPLES, BATCH, STEPS_PER_EPOCH = 1024, 32, 32


def _stream():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    return data_lib.training_batches(
        tf.data.Dataset.from_tensor_slices((x, y)),
        global_batch_size=BATCH,
        seed=1,
        num_examples=NUM_EXAMPLES,
    )


def _model() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_run_too_short_to_pay_for_probing_gets_one_timed_execution():
    model = _model()
    before = [np.array(v) for v in model.variables]
    # 5% of 20 steps is one step's time, already spent by the traced execution.
    result = execution_tuner.tune_steps_per_execution(
        model,
        _stream(),
        steps_per_epoch=STEPS_PER_EPOCH,
        run_steps=20,
        min_probe_budget_seconds=0.0,
    )
    assert list(result.step_seconds) == [1], result.reason
    assert result.probed_steps == 2, result.reason  # the traced execution and one timed
    assert result.steps_per_execution == 1 and model.steps_per_execution == 1
    assert "budget" in result.reason and "2 steps" in result.reason
    for want, got in zip(before, model.variables, strict=True):
        np.testing.assert_array_equal(np.array(got), want)


def test_a_long_run_probes_every_candidate_in_full():
    model = _model()
    result = execution_tuner.tune_steps_per_execution(
        model,
        _stream(),
        steps_per_epoch=STEPS_PER_EPOCH,
        run_steps=10**9,
        min_probe_budget_seconds=0.0,
    )
    probed = [c for c in result.candidates if c in result.step_seconds]
    expected = sum(
        (
            1
            + max(
                execution_tuner.MIN_TIMED_EXECUTIONS, math.ceil(execution_tuner.MIN_TIMED_STEPS / c)
            )
        )
        * c
        for c in probed
    )
    assert result.probed_steps == expected
    assert len(probed) >= 2, result.reason
