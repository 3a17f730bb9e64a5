"""`tfdist.distribute.execution_tuner`: probes roll back exactly; auto trains like its explicit choice."""

import json
import pathlib
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import data as data_lib
from tfdist.distribute import execution_tuner
from tests.logged_process import finish, log_tail, start_logged

REPO = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT = 600
NUM_EXAMPLES, BATCH, STEPS_PER_EPOCH = 1024, 32, 32
_CHOSE = re.compile(r"steps_per_execution=auto chose (\d+)")


def test_granularity_is_the_gcd_of_epoch_backup_and_resumed_offset():
    assert execution_tuner.step_granularity(steps_per_epoch=300) == 300
    assert execution_tuner.step_granularity(steps_per_epoch=300, backup_every_steps=500) == 100
    assert execution_tuner.step_granularity(steps_per_epoch=300, backup_every_steps=500,
                                            first_step=340) == 20
    assert execution_tuner.step_granularity(steps_per_epoch=128, first_step=3 * 128) == 128
    # fit(validation_steps=6) runs whole executions too.
    assert execution_tuner.step_granularity(steps_per_epoch=128, other_step_counts=[6]) == 2


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
    return data_lib.training_batches(_examples(), global_batch_size=BATCH, seed=1,
                                     num_examples=NUM_EXAMPLES, first_step=first_step)


def _model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2),  # seed-generator state must roll back
                              keras.layers.BatchNormalization(),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def _state(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v) for v in model.variables] + [np.array(v)
                                                      for v in model.optimizer.variables]


def _train(model: keras.Model, epochs: int = 2, first_step: int = 0, initial_epoch: int = 0,
           steps_per_epoch: int = STEPS_PER_EPOCH) -> None:
    model.fit(_stream(first_step), epochs=epochs, initial_epoch=initial_epoch,
              steps_per_epoch=steps_per_epoch, verbose=0, shuffle=False)


def test_probing_leaves_every_variable_as_it_was_and_sets_the_choice():
    model = _model()
    model.optimizer.build(model.trainable_variables)
    before = _state(model)
    result = execution_tuner.tune_steps_per_execution(model, _stream(),
                                                      steps_per_epoch=STEPS_PER_EPOCH)
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
        tuned, _stream(), steps_per_epoch=STEPS_PER_EPOCH).steps_per_execution
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
    first_part.fit(_stream(), epochs=1, steps_per_epoch=STEPS_PER_EPOCH + 12, verbose=0,
                   shuffle=False)  # stop at step 44: 12 steps into epoch 1
    resumed = _model()
    resumed.optimizer.build(resumed.trainable_variables)
    for target, source in zip(list(resumed.variables) + list(resumed.optimizer.variables),
                              list(first_part.variables) + list(first_part.optimizer.variables),
                              strict=True):
        target.assign(source)  # what a backup restores
    result = execution_tuner.tune_steps_per_execution(
        resumed, _stream(STEPS_PER_EPOCH + 12), steps_per_epoch=STEPS_PER_EPOCH,
        first_step=STEPS_PER_EPOCH + 12)
    assert result.granularity == 4 and max(result.candidates) == 4
    _train(resumed, first_step=STEPS_PER_EPOCH + 12, epochs=1,
           steps_per_epoch=STEPS_PER_EPOCH - 12)
    assert int(resumed.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    for want, got in zip(reference.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


TRAINER_FLAGS = ["--model=mlp", "--dataset=synthetic", "--num_examples=2048",
                 "--global_batch_size=32", "--epochs=2", "--seed=2"]


def _start_trainer(tmp_path: pathlib.Path, name: str, *extra: str):
    out = tmp_path / name
    out.mkdir()
    return start_logged([sys.executable, "-m", "trainer.task", *TRAINER_FLAGS,
                         f"--model_dir={out}", *extra], out, cwd=REPO)


def _finish_trainer(process):
    code = finish(process, TIMEOUT)
    assert code == 0, f"{process.out.name} exited {code}:\n{log_tail(process)}"
    return process


def _weights(out: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(out / "model.keras", safe_mode=True, compile=False)
    return model.get_weights()


@pytest.fixture(scope="module")
def single_process_runs(tmp_path_factory):
    """One process trained three ways: auto (the default), auto's choice, and 1.

    Shared by both trainer tests below, so each process starts once. The auto
    run goes alone (its choice is timed); the two explicit runs time nothing
    and run side by side.
    """
    tmp_path = tmp_path_factory.mktemp("single-process")
    auto = _finish_trainer(_start_trainer(tmp_path, "auto"))
    found = _CHOSE.findall(log_tail(auto, 100_000))
    assert len(found) == 1, log_tail(auto)
    chosen = int(found[0])
    started = [_start_trainer(tmp_path, "explicit", f"--steps_per_execution={chosen}"),
               _start_trainer(tmp_path, "one", "--steps_per_execution=1")]
    try:
        explicit, one = [_finish_trainer(process) for process in started]
    finally:
        for process in started:
            finish(process, 1)
    return chosen, {"auto": auto.out, "explicit": explicit.out, "one": one.out}


@pytest.mark.slow
def test_the_trainer_defaults_to_auto_and_matches_the_explicit_choice(single_process_runs):
    _, outs = single_process_runs
    for name, out in outs.items():
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps_completed"] == 2 * 64
        for want, got in zip(_weights(outs["auto"]), _weights(out), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.slow
def test_two_workers_choose_the_same_value_and_train_like_one_process(local_cluster, tmp_path,
                                                                      single_process_runs):
    common = ["-m", "trainer.task", *TRAINER_FLAGS]
    cluster = local_cluster(num_workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                            command=[sys.executable, *common, "--strategy=multiworker",
                                     f"--model_dir={tmp_path / 'two'}",
                                     f"--backup_dir={tmp_path / 'backup'}"])
    cluster.start()
    codes = cluster.wait(timeout=TIMEOUT)
    assert set(codes.values()) == {0}, cluster.format_logs()
    # Non-chief workers log warnings only. A worker that chose another value would run
    # another number of per-execution preemption all-gathers, and the job would hang.
    chosen = _CHOSE.findall(cluster.log("worker:0"))
    assert len(chosen) == 1, cluster.format_logs()
    assert set(_CHOSE.findall(cluster.log("worker:1"))) <= set(chosen)

    # One process on the default strategy; the test above shows that every
    # steps_per_execution gives it the same weights bit for bit, so it stands
    # for one process at the workers' choice too.
    _, outs = single_process_runs
    one = json.loads((outs["one"] / "summary.json").read_text())
    assert one["strategy"] == "default", one
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (summary["num_workers"], summary["steps_completed"]) == (2, 2 * 64)
    for want, got in zip(_weights(outs["one"]), _weights(tmp_path / "two"), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
