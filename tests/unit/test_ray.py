"""tfdist under Ray Train's own TensorflowTrainer with `tfdist.ray.TensorflowConfig`,
on real local Ray clusters (loopback, CPUs, no dashboard). Ray's start-up dominates, so
the module starts its three jobs at once (`_jobs`) and each test waits for its own:

- a 2-worker `tfdist.resumable` job on a cluster of three one-CPU nodes: at step 4 the
  node of rank 0 is drained for preemption (Ray's own notice), worker 1 is SIGKILLed at
  step 10 and gets a SIGTERM at step 18; each time Ray's FailureConfig restarts the group
  and tfdist resumes from its backups; compared with one uninterrupted process;
- `python -m trainer.ray` running `trainer.task` as a parameter-server job (chief,
  worker, ps, evaluator), which must finish and leave no process behind."""

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
