"""Builds a `ParameterServerStrategy` from a resolved `tfdist.distribute.cluster.Cluster`.

The strategy is built from the cluster description itself, not from the
environment, so it works when Vertex AI sets only `CLUSTER_SPEC`.
"""

import tensorflow as tf

from tfdist import cli
from tfdist._internal import liveness
from tfdist._internal.preconditions import check_whole_number
from tfdist.distribute.cluster import CHIEF, PS, WORKER, Cluster, check_cluster_for_strategy
from tfdist.errors import UsageError

__all__ = [
    "TRAINING_ROLES",
    "training_cluster_spec",
    "variable_partitioner",
    "watch_training_tasks",
    "make_parameter_server_strategy",
]

# The evaluator evaluates checkpoints on its own: it is not part of the cluster
# the coordinator drives, and the servers must not wait for it.
TRAINING_ROLES = (CHIEF, WORKER, PS)


def training_cluster_spec(cluster: Cluster) -> tf.train.ClusterSpec:
    """The chief, worker and ps tasks of `cluster` as a `tf.train.ClusterSpec`."""
    return tf.train.ClusterSpec(
        {role: list(hosts) for role, hosts in cluster.addresses.items() if role in TRAINING_ROLES}
    )


def variable_partitioner(*, min_shard_bytes: int, max_shards: int):
    """A `MinSizePartitioner`, or `None` when partitioning is off.

    Args:
        min_shard_bytes: Smallest shard, in bytes; 0 turns partitioning off.
        max_shards: Most shards per variable (usually the number of ps tasks).

    Raises:
        UsageError: A negative size or fewer than one shard.
    """
    check_whole_number(
        "min_shard_bytes", min_shard_bytes, minimum=0, hint="0 turns variable partitioning off"
    )
    check_whole_number(
        "max_shards",
        max_shards,
        minimum=1,
        hint="use the number of ps tasks to spread large variables over all of them",
    )
    if not min_shard_bytes or max_shards == 1:
        return None
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=max_shards
    )


def _exit_peer_lost(lost: liveness.SilentPeer, timeout_seconds: float) -> None:
    # The main thread may be blocked for good in a remote call to the frozen
    # task (ClusterCoordinator.join never returns): end the process from here.
    # A backup being written is left uncommitted and never read.
    cli.exit_from_thread(lost.describe(timeout_seconds), cli.EXIT_PEER_LOST)


def watch_training_tasks(
    cluster: Cluster, *, timeout_seconds: float = liveness.DEFAULT_TIMEOUT_SECONDS
) -> liveness.PeerWatchdog:
    """Starts the chief's watchdog over every worker and ps task of `cluster`.

    ClusterCoordinator reschedules the steps of a worker that fails, and
    fails itself when a ps does, but a task that is frozen (alive, silent)
    fails nothing: its remote calls never return and `join` waits forever.
    The watchdog probes each task's gRPC server every second; one that
    accepts connections but has not answered for `timeout_seconds` ends the
    process with one `error: lost contact ...` line and exit code 200.
    """
    peers = {
        f"{role}:{index}": address
        for role in (WORKER, PS)
        for index, address in enumerate(cluster.addresses.get(role, ()))
    }
    return liveness.PeerWatchdog(
        peers,
        timeout_seconds=timeout_seconds,
        on_lost=lambda lost: _exit_peer_lost(lost, timeout_seconds),
    ).start()


def make_parameter_server_strategy(
    cluster: Cluster,
    *,
    min_shard_bytes: int = 0,
    max_shards: int = 1,
    peer_timeout_seconds: float | None = liveness.DEFAULT_TIMEOUT_SECONDS,
) -> tf.distribute.ParameterServerStrategy:
    """Builds the strategy for the coordinator (the chief) of `cluster`.

    Args:
        cluster: A cluster with one chief, at least one worker and one ps task;
            this process must be the chief.
        min_shard_bytes: Partition variables larger than this into shards of
            at least this many bytes (0: no partitioning). For large
            embedding tables, so that no single ps holds all of one.
        max_shards: Most shards per partitioned variable.
        peer_timeout_seconds: A worker or ps task that stops answering
            (frozen) for this long ends this process with exit code 200
            (`watch_training_tasks`); None watches nothing.

    Returns:
        The strategy; creating it connects this process to the cluster.

    Raises:
        UsageError: The cluster cannot run parameter-server training, or this
            task is not the chief (workers and ps tasks `serve` instead).
    """
    check_cluster_for_strategy(cluster, "parameter_server")
    if cluster.task_type != CHIEF:
        raise UsageError(
            f"task {cluster.task_type}:{cluster.task_index} cannot build a "
            f"ParameterServerStrategy, expected the chief; worker and ps tasks run "
            f"tfdist.parameter_server.serve(cluster) and the evaluator a SidecarEvaluator"
        )
    partitioner = variable_partitioner(min_shard_bytes=min_shard_bytes, max_shards=max_shards)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        training_cluster_spec(cluster), task_type=CHIEF, task_id=0, rpc_layer="grpc"
    )
    if peer_timeout_seconds is not None:
        watch_training_tasks(cluster, timeout_seconds=peer_timeout_seconds)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
