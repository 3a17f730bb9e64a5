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


def _resources(**overrides):
    from trainer.ray import rank_resources  # pylint: disable=g-import-not-at-top

    values = dict(cpus=2, use_gpu=False, gpus=0.0, resources="", accelerator_type="")
    return rank_resources(**{**values, **overrides})


def test_a_gpu_rank_asks_ray_for_its_gpus_and_placement():
    resources = _resources(use_gpu=True, gpus=2, accelerator_type="A100", resources="fast=0.5")
    assert resources.use_gpu
    assert resources.per_rank == {"CPU": 2, "GPU": 2, "fast": 0.5}
    assert resources.accelerator_type == "A100"
    assert _resources(use_gpu=True).per_rank == {"CPU": 2, "GPU": 1}


def test_a_rank_without_gpus_is_given_none_unless_the_user_chose_devices():
    from trainer.ray import rank_environment  # pylint: disable=g-import-not-at-top

    cpu_only = _resources()
    assert cpu_only.per_rank == {"CPU": 2} and not cpu_only.use_gpu
    assert rank_environment({"PYTHONPATH": "/p"}, cpu_only) == {
        "PYTHONPATH": "/p",
        "CUDA_VISIBLE_DEVICES": "",
    }
    assert rank_environment({"CUDA_VISIBLE_DEVICES": "3"}, cpu_only) == {
        "CUDA_VISIBLE_DEVICES": "3"
    }
    assert rank_environment({}, _resources(use_gpu=True)) == {}  # Ray sets it per rank


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"gpus": 1.0}, "--gpus_per_task is set but --use_gpu is off"),
        ({"accelerator_type": "H100"}, "--accelerator_type is set but --use_gpu is off"),
        ({"resources": "fast"}, "has 'fast', expected NAME=AMOUNT"),
        ({"resources": "fast=-1"}, "has 'fast=-1'"),
        ({"resources": "fast=inf"}, "has 'fast=inf'"),
        ({"resources": "GPU=1"}, "sets GPU, expected --cpus_per_task or --gpus_per_task"),
        ({"use_gpu": True, "gpus": float("inf")}, "--gpus_per_task is inf"),
    ],
)
def test_resources_it_cannot_ask_for_are_one_line(overrides, expected):
    from tfdist.errors import UsageError  # pylint: disable=g-import-not-at-top

    with pytest.raises(UsageError, match=expected):
        _resources(**overrides)
