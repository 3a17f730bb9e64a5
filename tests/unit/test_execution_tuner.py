"""`tfdist.distribute.execution_tuner`: probes roll back exactly; auto trains like its explicit choice."""

import keras
import numpy as np
import tensorflow as tf

from tfdist import data as data_lib
from tfdist.distribute import execution_tuner

NUM_EXAMPLES, BATCH, STEPS_PER_EPOCH = 1024, 32, 32


def test_granularity_is_the_gcd_of_epoch_backup_and_resumed_offset():
    assert execution_tuner.step_granularity(steps_per_epoch=300) == 300
    assert execution_tuner.step_granularity(steps_per_epoch=300, backup_every_steps=500) == 100
    assert (
        execution_tuner.step_granularity(
            steps_per_epoch=300, backup_every_steps=500, first_step=340
        )
        == 20
    )
    assert execution_tuner.step_granularity(steps_per_epoch=128, first_step=3 * 128) == 128
    # fit(validation_steps=6) runs whole executions too.
    assert execution_tuner.step_granularity(steps_per_epoch=128, other_step_counts=[6]) == 2


def test_parameter_servers_get_the_largest_closures_that_share_evenly():
    choose = execution_tuner.parameter_server_steps_per_execution
    # 150 steps per sync point, 2 workers: 6 closures of 25, 3 per worker (50 would give 3).
    assert choose(150, 2)[0] == 25
    assert choose(150, 1)[0] == 50
    assert choose(1000, 4)[0] == 50  # capped by MAX_PARAMETER_SERVER_STEPS
    assert choose(60, 3)[0] == 10
    assert choose(6, 3)[0] == 1  # 2 per worker: closures of 1 step
    assert choose(3, 3)[0] == 1
    assert choose(7, 2) == (
        1,
        "steps_per_execution=auto chose 1 under parameter servers: 7 steps per sync point "
        "cannot be split evenly among 2 worker(s)",
    )
    for granularity in range(1, 130):
        for workers in (1, 2, 3, 5):
            chosen, _ = choose(granularity, workers)
            assert granularity % chosen == 0
            assert chosen <= execution_tuner.MAX_PARAMETER_SERVER_STEPS
            closures = granularity // chosen
            assert chosen == 1 or closures % workers == 0


def test_candidates_are_the_largest_divisors_under_each_target():
    assert execution_tuner.candidate_values(300) == (1, 4, 15, 60)
    assert execution_tuner.candidate_values(128) == (1, 4, 16, 64)
    assert execution_tuner.candidate_values(7) == (1, 7)
    assert execution_tuner.candidate_values(1) == (1,)


def _examples():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y))


def _stream(first_step: int = 0):
    return data_lib.training_batches(
        _examples(),
        global_batch_size=BATCH,
        seed=1,
        num_examples=NUM_EXAMPLES,
        first_step=first_step,
    )


def _model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2),  # seed-generator state must roll back
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def _state(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v) for v in model.variables] + [np.array(v) for v in model.optimizer.variables]


def _train(
    model: keras.Model,
    epochs: int = 2,
    first_step: int = 0,
    initial_epoch: int = 0,
    steps_per_epoch: int = STEPS_PER_EPOCH,
) -> None:
    model.fit(
        _stream(first_step),
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
        shuffle=False,
    )


def test_probing_leaves_every_variable_as_it_was_and_sets_the_choice():
    model = _model()
    model.optimizer.build(model.trainable_variables)
    before = _state(model)
    result = execution_tuner.tune_steps_per_execution(
        model, _stream(), steps_per_epoch=STEPS_PER_EPOCH
    )
    after = _state(model)
    assert len(before) == len(after)
    for want, got in zip(before, after):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert model.steps_per_execution == result.steps_per_execution
    assert result.steps_per_execution in result.candidates
    assert set(result.step_seconds) <= set(result.candidates)
    assert "steps_per_execution=auto chose" in result.reason


def test_auto_trains_to_the_same_weights_as_its_choice_and_as_one_step_per_execution():
    tuned = _model()
    chosen = execution_tuner.tune_steps_per_execution(
        tuned, _stream(), steps_per_epoch=STEPS_PER_EPOCH
    ).steps_per_execution
    _train(tuned)
    for explicit in sorted({chosen, 1}):
        reference = _model(explicit)
        _train(reference)
        assert int(tuned.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
        assert int(reference.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
        for want, got in zip(reference.get_weights(), tuned.get_weights(), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=f"against spe={explicit}")


def test_a_resume_inside_an_epoch_only_allows_values_that_tile_its_rest():
    reference = _model()
    _train(reference)

    first_part = _model()
    first_part.fit(
        _stream(), epochs=1, steps_per_epoch=STEPS_PER_EPOCH + 12, verbose=0, shuffle=False
    )  # stop at step 44: 12 steps into epoch 1
    resumed = _model()
    resumed.optimizer.build(resumed.trainable_variables)
    for target, source in zip(
        list(resumed.variables) + list(resumed.optimizer.variables),
        list(first_part.variables) + list(first_part.optimizer.variables),
        strict=True,
    ):
        target.assign(source)  # what a backup restores
    result = execution_tuner.tune_steps_per_execution(
        resumed,
        _stream(STEPS_PER_EPOCH + 12),
        steps_per_epoch=STEPS_PER_EPOCH,
        first_step=STEPS_PER_EPOCH + 12,
    )
    assert result.granularity == 4 and max(result.candidates) == 4
    _train(resumed, first_step=STEPS_PER_EPOCH + 12, epochs=1, steps_per_epoch=STEPS_PER_EPOCH - 12)
    assert int(resumed.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    for want, got in zip(reference.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
