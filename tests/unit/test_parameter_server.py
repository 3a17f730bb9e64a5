"""Parameter-server training of Keras 3 models: exact steps, failures, sidecar evaluation.

The multi-process tests run `tests/jobs/parameter_server_job.py` as every task of a
loopback cluster (chief + 2 workers + 1 ps, sometimes an evaluator).
"""

import json

import pytest

from tfdist.errors import UsageError

# ------------------------------------------------------------ in-process checks


def test_fit_without_steps_per_epoch_is_a_usage_error():
    import keras

    from tfdist import parameter_server

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(UsageError, match=r"steps_per_epoch is missing.*pass steps_per_epoch=N"):
        parameter_server.fit(model, lambda context: None, epochs=2)


def test_trainer_refuses_a_model_built_outside_parameter_server_strategy():
    import keras

    from tfdist import parameter_server

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(UsageError, match="expected a tf.distribute.ParameterServerStrategy"):
        parameter_server.ParameterServerTrainer(model)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps_per_epoch": 0}, "steps_per_epoch is 0"),
        ({"steps_per_epoch": 5, "steps_per_sync": -1}, "steps_per_sync is -1"),
        ({"steps_per_epoch": 5, "initial_epoch": 4, "epochs": 3}, "initial_epoch is 4"),
        ({"steps_per_epoch": 5, "has_validation_data": True}, "validation_steps is None"),
    ],
)
def test_fit_plan_rejects_bad_schedules(kwargs, message):
    from tfdist.parameter_server.training import FitPlan

    with pytest.raises(UsageError, match=message):
        FitPlan(**kwargs)


def test_fit_plan_syncs_once_per_epoch_by_default():
    from tfdist.parameter_server.training import FitPlan

    assert FitPlan(epochs=2, steps_per_epoch=7).steps_per_sync == 7


def test_chief_watch_needs_the_chief_to_come_and_then_stay_away():
    from tfdist.parameter_server import ChiefWatch

    now = [0.0]
    answers = iter([False, False, True, False, False, True, False, False, False])
    watch = ChiefWatch(
        "127.0.0.1:1", gone_seconds=2.0, probe=lambda address: next(answers), clock=lambda: now[0]
    )
    seen = []
    for _ in range(9):
        seen.append(watch.gone())
        now[0] += 1.0
    # Unreachable before it ever came up is not "gone"; coming back resets the clock.
    assert seen == [False, False, False, False, False, False, False, False, True]


def test_partitioner_is_off_unless_asked():
    from tfdist.parameter_server import variable_partitioner

    assert variable_partitioner(min_shard_bytes=0, max_shards=4) is None
    assert variable_partitioner(min_shard_bytes=1024, max_shards=1) is None
    assert variable_partitioner(min_shard_bytes=1024, max_shards=2) is not None
    with pytest.raises(UsageError, match="max_shards is 0"):
        variable_partitioner(min_shard_bytes=1024, max_shards=0)


def test_strategy_refuses_a_worker_task():
    from tfdist.distribute.cluster import Cluster
    from tfdist.parameter_server import make_parameter_server_strategy

    cluster = Cluster(
        task_type="worker",
        task_index=0,
        source="TF_CONFIG",
        addresses={"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
    )
    with pytest.raises(UsageError, match="expected the chief; worker and ps tasks run"):
        make_parameter_server_strategy(cluster)


def _tiny_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def _tiny_data():
    import numpy as np
    import tensorflow as tf

    features = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, features.sum(1, keepdims=True))).batch(16)


def test_sidecar_evaluates_every_exported_checkpoint_then_stops_at_the_marker(tmp_path):
    from tfdist import callbacks
    from tfdist.outputs import evaluation

    trained = _tiny_model()
    exporter = callbacks.CheckpointExporter(str(tmp_path / "ckpt"))
    trained.fit(_tiny_data().repeat(), epochs=3, steps_per_epoch=4, verbose=0, callbacks=[exporter])
    assert evaluation.read_done_marker(str(tmp_path / "ckpt")) is None
    exporter.finish()
    expected = trained.evaluate(_tiny_data(), verbose=0, return_dict=True)

    evaluator = evaluation.SidecarEvaluator(
        _tiny_model(),
        _tiny_data(),
        checkpoint_dir=str(tmp_path / "ckpt"),
        output_dir=str(tmp_path / "eval"),
        poll_seconds=0.01,
    )
    results = evaluator.run()
    assert sorted(results) == [4, 8, 12]
    assert results[12]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    lines = [
        json.loads(line)
        for line in (tmp_path / "eval" / evaluation.METRICS_FILE).read_text().splitlines()
    ]
    assert [line["checkpoint"] for line in lines] == ["ckpt-4", "ckpt-8", "ckpt-12"]


def test_sidecar_gives_up_when_training_is_gone_without_the_marker(tmp_path):
    from tfdist.outputs import evaluation

    evaluator = evaluation.SidecarEvaluator(
        _tiny_model(),
        _tiny_data(),
        checkpoint_dir=str(tmp_path / "ckpt"),
        output_dir=str(tmp_path / "eval"),
        poll_seconds=0.01,
        is_training_alive=lambda: False,
        give_up_seconds=0.2,
    )
    with pytest.raises(RuntimeError, match="training stopped without writing training_done.json"):
        evaluator.run()


def test_sidecar_skips_a_checkpoint_rotated_away_before_it_was_read(tmp_path):
    from tfdist import callbacks
    from tfdist.outputs import evaluation

    trained = _tiny_model()
    exporter = callbacks.CheckpointExporter(str(tmp_path / "ckpt"))
    trained.fit(_tiny_data().repeat(), epochs=2, steps_per_epoch=4, verbose=0, callbacks=[exporter])
    exporter.finish()
    for path in (tmp_path / "ckpt").glob("ckpt-4.*"):
        path.unlink()
    evaluator = evaluation.SidecarEvaluator(
        _tiny_model(),
        _tiny_data(),
        checkpoint_dir=str(tmp_path / "ckpt"),
        output_dir=str(tmp_path / "eval"),
        poll_seconds=0.01,
    )
    assert sorted(evaluator.run()) == [8]
