"""The coordination service's heartbeat bound for MultiWorkerMirroredStrategy.

Not Keras: TensorFlow's `MultiWorkerMirroredStrategy` configures the
coordination service itself (`CollectiveAllReduceExtended._initialize_multi_worker`)
without a heartbeat timeout, so the service's built-in default applies, and
neither the strategy nor `CommunicationOptions` lets a caller choose it. The
service is what notices a peer that is alive but silent (SIGSTOP, a hung
host): a peer whose heartbeats stop for the timeout is marked failed and the
error reaches every task's next collective. The strategy configures the
service only when nothing has yet (`context.coordination_service is None`),
so configuring it first, with the same jobs and leader, sets the bound.
Needs the private `tensorflow.python.eager.context` (no public API in TF
2.21); `tests/unit/test_keras_compat_coordination.py` shows the strategy still has no
such option. Not gated on a version: no TensorFlow release has the option yet;
that test fails once one does, which is the time to use it instead.
"""

from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context as eager_context

# The jobs MultiWorkerMirroredStrategy coordinates.
_COORDINATED_JOBS = ("chief", "worker")


def configure_peer_heartbeats(cluster_spec, task_type: str, *, timeout_seconds: float) -> bool:
    """Configures the coordination service as the strategy would, with a heartbeat bound.

    Call before `MultiWorkerMirroredStrategy(...)` and before any other
    TensorFlow operation.

    Args:
        cluster_spec: The `tf.train.ClusterSpec` the strategy will get.
        task_type: This task's type.
        timeout_seconds: A task whose heartbeats stop this long is failed.

    Returns:
        Whether the service was configured here (False: this task is not
        coordinated, or the service was configured already).
    """
    context = eager_context.context()
    if task_type not in _COORDINATED_JOBS or context.coordination_service is not None:
        return False
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in _COORDINATED_JOBS
        if job in cluster_spec.jobs
    ]
    timeout_ms = max(int(timeout_seconds * 1000), 1000)
    context.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=timeout_ms,
    )
    return True


def heartbeat_timeout_ms() -> int | None:
    """The configured heartbeat timeout (0: the service's default), None if unconfigured."""
    config = eager_context.context().coordination_service
    return None if config is None else int(config.heartbeat_timeout_in_ms)
