"""tfdist.ray and trainer.ray in process: the backend config Ray receives, and which Ray
cluster trainer.ray joins (tests/multiprocess/test_ray.py runs them on real local clusters)."""

import signal

import pytest

pytest.importorskip("ray.train")


def test_the_config_is_rays_own_and_refuses_a_bad_keras_choice():
    import ray.train.tensorflow  # pylint: disable=g-import-not-at-top

    import tfdist.ray  # pylint: disable=g-import-not-at-top
    from tfdist.errors import UsageError  # pylint: disable=g-import-not-at-top

    config = tfdist.ray.TensorflowConfig()
    assert isinstance(config, ray.train.tensorflow.TensorflowConfig)
    assert config.to_dict() == {
        "chief": False,
        "parameter_servers": 0,
        "evaluator": False,
        "preemption_signals": [int(signal.SIGTERM)],
        "legacy_keras": "0",
    }
    with pytest.raises(UsageError, match="legacy_keras is 'yes', expected '0'"):
        tfdist.ray.TensorflowConfig(legacy_keras="yes")


@pytest.mark.parametrize(
    "flag, environ, joined",
    [
        ("", {}, ""),
        ("", {"RAY_ADDRESS": "10.0.0.2:6379"}, "10.0.0.2:6379"),
        ("", {"RAY_ADDRESS": "local"}, ""),
        ("auto", {"RAY_ADDRESS": "10.0.0.2:6379"}, "auto"),
    ],
)
def test_trainer_ray_joins_only_a_cluster_it_is_told_of(flag, environ, joined):
    from trainer.ray import cluster_to_join  # pylint: disable=g-import-not-at-top

    assert cluster_to_join(flag, environ) == joined
