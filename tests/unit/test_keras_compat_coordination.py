"""`keras_compat.configure_peer_heartbeats`: the heartbeat bound MWMS gives nobody a way to set.

The upstream gap, still there: neither `MultiWorkerMirroredStrategy` nor its
`CommunicationOptions` takes a heartbeat timeout, so without tfdist a frozen peer
is noticed within the coordination service's built-in default only.
"""

import inspect

import pytest
import tensorflow as tf
from tensorflow.python.eager import context as eager_context

from tfdist import keras_compat


def test_upstream_multiworker_strategy_still_has_no_heartbeat_option():
    for api in (
        tf.distribute.MultiWorkerMirroredStrategy,
        tf.distribute.experimental.CommunicationOptions,
    ):
        parameters = inspect.signature(api).parameters
        assert not [name for name in parameters if "heartbeat" in name], parameters


@pytest.fixture
def unconfigured_service():
    context = eager_context.context()
    previous = context._coordination_service_config  # pylint: disable=protected-access
    context._coordination_service_config = None  # pylint: disable=protected-access
    yield
    context._coordination_service_config = previous  # pylint: disable=protected-access


def test_the_service_is_configured_as_the_strategy_would_with_the_bound(unconfigured_service):
    del unconfigured_service
    spec = tf.train.ClusterSpec({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    assert keras_compat.configure_peer_heartbeats(spec, "worker", timeout_seconds=12.5)
    assert keras_compat.heartbeat_timeout_ms() == 12500
    config = eager_context.context().coordination_service
    assert config.service_type == "standalone"
    assert config.service_leader == "/job:chief/replica:0/task:0"
    assert {(job.name, job.num_tasks) for job in config.coordinated_job_list} == {
        ("chief", 1),
        ("worker", 1),
    }
    # Configured once: the strategy (and a second call) leave it as it is.
    assert not keras_compat.configure_peer_heartbeats(spec, "worker", timeout_seconds=99)
    assert keras_compat.heartbeat_timeout_ms() == 12500


def test_an_evaluator_is_not_coordinated(unconfigured_service):
    del unconfigured_service
    spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]})
    assert not keras_compat.configure_peer_heartbeats(spec, "evaluator", timeout_seconds=10)
    assert keras_compat.heartbeat_timeout_ms() is None
