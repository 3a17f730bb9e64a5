"""Builds a `tf.distribute.Strategy` from one lowercase name and the cluster.

Call `make_strategy` once, at the start of the program, before any other
TensorFlow operation: logical CPU devices and collective runtimes can only be
configured before TensorFlow initializes its devices.
"""

import dataclasses
import os
import socket

import tensorflow as tf
from absl import logging

from tfdist import cli, keras_compat
from tfdist._internal import liveness
from tfdist.distribute.choice import (
    ALL_REDUCE,
    STRATEGY_DEFAULTS,
    check_strategy_name,
    choose_strategy,
)
from tfdist.distribute.cluster import (
    CHIEF,
    WORKER,
    Cluster,
    check_cluster_for_strategy,
    resolve_cluster_for_strategy,
)
from tfdist.errors import UsageError

__all__ = [
    "StrategyOptions",
    "make_strategy",
    "DEFAULT_GLOBAL_SEED",
    "seed_input_pipelines",
    "strategy_from_environment",
    "set_strategy_from_environment",
    "resolve_strategy_name",
    "expected_num_replicas",
    "split_cpu",
    "cluster_resolver",
]


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """How to build the strategy beyond its name.

    Attributes:
        all_reduce: `auto`, `ring` or `nccl`: the collective implementation for
            `multiworker`, or the cross-device reduction for `mirrored`.
        num_cpu_devices: For `mirrored` on a machine without GPUs, split the CPU
            into this many logical devices (0 keeps one device).
        tpu: TPU name or address for `tpu` (`local` on a TPU VM).
        ps_min_shard_bytes: For `parameter_server`, partition variables into
            shards of at least this many bytes (0 disables partitioning).
        ps_max_shards: For `parameter_server`, the most shards per variable.
        peer_timeout_seconds: A task of a `multiworker` or `parameter_server`
            job that stops answering (frozen, hung) for this long is lost:
            the survivors exit 200. Multiworker: the coordination service's
            heartbeat timeout; parameter servers: the chief's probes of each
            worker and ps (`tfdist.parameter_server.watch_training_tasks`).
    """

    all_reduce: str = STRATEGY_DEFAULTS["all_reduce"]
    num_cpu_devices: int = STRATEGY_DEFAULTS["num_cpu_devices"]
    tpu: str = STRATEGY_DEFAULTS["tpu"]
    ps_min_shard_bytes: int = 0
    ps_max_shards: int = 1
    peer_timeout_seconds: float = STRATEGY_DEFAULTS["peer_timeout_seconds"]

    def __post_init__(self):
        if self.all_reduce not in ALL_REDUCE:
            raise UsageError(
                f"--all_reduce is {self.all_reduce!r}, expected one of: {', '.join(ALL_REDUCE)}"
            )
        if self.num_cpu_devices < 0:
            raise UsageError(f"--num_cpu_devices is {self.num_cpu_devices}, expected a number >= 0")
        liveness.check_timeout("peer_timeout_seconds", self.peer_timeout_seconds)


def make_strategy(
    name: str, cluster: Cluster, options: StrategyOptions = StrategyOptions()
) -> tf.distribute.Strategy:
    """Builds the named strategy for this task of `cluster`.

    Under `multiworker` it also applies `tfdist.keras_compat` so that Keras 3
    `fit`, `evaluate` and `predict` work.

    Args:
        name: One of `tfdist.distribute.choice.STRATEGIES`.
        cluster: The resolved cluster (`tfdist.distribute.cluster.resolve_cluster`).
        options: Implementation choices.

    Returns:
        The strategy. Its `scope()` is not entered.

    Raises:
        UsageError: Unknown name, or a cluster the strategy cannot run on, or
            no TPU where `tpu` was asked for.
    """
    name = resolve_strategy_name(name, cluster, options)
    check_cluster_for_strategy(cluster, name)
    builder = _BUILDERS[name]
    strategy = builder(cluster, options)
    logging.info(
        "Strategy %s with %d replica(s) in sync; %s.",
        name,
        strategy.num_replicas_in_sync,
        cluster.describe(),
    )
    return strategy


# The TensorFlow seed `strategy_from_environment` sets when the script has set none.
DEFAULT_GLOBAL_SEED = 1_847_301


def seed_input_pipelines() -> None:
    """Sets TensorFlow's global seed when the script has set none, and says so.

    An unseeded `shuffle(buffer)` (and `tf.random` ops in a `map`) draws its
    seeds from the operating system: a restarted process reshuffles every
    epoch after the interrupted one differently, which no saved iterator state
    restores (measured on TF 2.21). With a global seed the same script builds
    the same seeds in every run. `strategy_from_environment` calls it, before
    the script builds its dataset.
    """
    if keras_compat.global_seed_is_set():
        return
    tf.random.set_seed(DEFAULT_GLOBAL_SEED)
    logging.info(
        "No TensorFlow random seed is set: set tf.random.set_seed(%d) so that unseeded "
        "shuffles resume exactly after a restart; call tf.random.set_seed(n) (or "
        "keras.utils.set_random_seed(n)) after this call to choose another.",
        DEFAULT_GLOBAL_SEED,
    )


@cli.usage_errors_exit_in_jobs
def strategy_from_environment(name: str = "auto", *, options: StrategyOptions | None = None):
    """The strategy for the cluster `TF_CONFIG` or `CLUSTER_SPEC` describes.

    Call it before any other TensorFlow operation (a multi-worker strategy
    must be configured at program start).

    Args:
        name: A strategy name (`tfdist.distribute.choice.STRATEGIES`); `auto`
            chooses from the cluster and the machine, and logs why.
        options: Implementation choices.
    """
    options = options or StrategyOptions()
    cluster = resolve_cluster_for_strategy(os.environ, name)
    strategy = make_strategy(name, cluster, options)
    seed_input_pipelines()
    return strategy


@cli.usage_errors_exit_in_jobs
def set_strategy_from_environment(name: str = "auto", *, options: StrategyOptions | None = None):
    """`strategy_from_environment()`, made the strategy of the rest of the program.

    The upgrade of a script that has no strategy, without re-indenting it:
    every model, optimizer and variable built after this call is built in the
    strategy's scope, as if the rest of the script were inside `with
    strategy.scope():` (`tf.distribute.experimental_set_strategy`). Call it
    at the top of the script, before any other TensorFlow operation.

        import tfdist.resumable
        tfdist.resumable.set_strategy_from_environment()
        model = keras.Sequential([...]); model.compile(...)  # unchanged
        tfdist.resumable.fit(model, x, y, batch_size=64, epochs=5, backup_dir=DIR)

    Returns:
        The strategy.
    """
    strategy = strategy_from_environment(name, options=options)
    tf.distribute.experimental_set_strategy(strategy)
    return strategy


def resolve_strategy_name(name: str, cluster: Cluster, options: StrategyOptions) -> str:
    """The concrete strategy name: `name` itself, or what `auto` infers."""
    name = check_strategy_name(name)
    if name != "auto":
        return name
    chosen, reason = choose_strategy(
        cluster, num_gpus=len(tf.config.list_physical_devices("GPU")), tpu=options.tpu
    )
    logging.info("--strategy=auto chose %r because %s.", chosen, reason)
    return chosen


def expected_num_replicas(name: str, cluster: Cluster, options: StrategyOptions) -> int | None:
    """Replicas the named strategy will have, known before any task is contacted.

    Lets callers validate batch sizes before a typo can turn into a hang while
    waiting for other tasks. `None` when only the strategy itself can tell (TPU).
    """
    name = resolve_strategy_name(name, cluster, options)
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    if name == "multiworker":
        return cluster.num_workers * max(num_gpus, 1)
    if name == "mirrored":
        return num_gpus or max(options.num_cpu_devices, 1)
    if name == "tpu":
        return None
    return 1


def _default(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    del cluster, options
    return tf.distribute.get_strategy()


def _one_device(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    del cluster, options
    device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


def split_cpu(num_devices: int) -> list[str]:
    """Splits the CPU into `num_devices` logical devices and names them.

    Raises:
        UsageError: TensorFlow has already initialized its devices.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration()] * num_devices
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError:
        existing = tf.config.list_logical_devices("CPU")
        if len(existing) != num_devices:
            raise UsageError(
                f"--num_cpu_devices={num_devices} cannot be applied: TensorFlow already "
                f"initialized {len(existing)} CPU device(s); build the strategy before any "
                f"other TensorFlow operation"
            ) from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def _mirrored(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    del cluster
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        cross_device_ops = {
            "auto": None,
            "nccl": tf.distribute.NcclAllReduce(),
            "ring": tf.distribute.HierarchicalCopyAllReduce(),
        }[options.all_reduce]
        keras_compat.apply()  # fused executions over collectives, XLA per replica
        return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)
    keras_compat.apply()  # XLA per replica (compile(jit_compile=True)) under mirrored too
    devices = split_cpu(options.num_cpu_devices) if options.num_cpu_devices else ["/cpu:0"]
    if options.all_reduce == "nccl":
        logging.warning("--all_reduce=nccl needs GPUs; reducing on the CPU instead.")
    return tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def cluster_resolver(cluster: Cluster, roles: tuple[str, ...]):
    """A TensorFlow cluster resolver for `cluster`, limited to `roles`.

    Built from the resolved description rather than the environment, so it
    works from `CLUSTER_SPEC` as well as `TF_CONFIG`.
    """
    spec = {role: list(hosts) for role, hosts in cluster.addresses.items() if role in roles}
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        rpc_layer="grpc",
    )


_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def _multiworker(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    keras_compat.apply()
    communication = tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[options.all_reduce]
    )
    if not cluster.is_distributed:
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    if cluster.task_type not in (CHIEF, WORKER):
        raise UsageError(
            f"task type {cluster.task_type!r} cannot join a multiworker strategy, expected "
            f"'chief' or 'worker'; evaluators evaluate checkpoints instead of training"
        )
    resolver = cluster_resolver(cluster, (CHIEF, WORKER))
    keras_compat.configure_peer_heartbeats(
        resolver.cluster_spec(), cluster.task_type, timeout_seconds=options.peer_timeout_seconds
    )
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=communication
    )


def _parameter_server(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    from tfdist import parameter_server  # pylint: disable=g-import-not-at-top

    return parameter_server.make_parameter_server_strategy(
        cluster,
        min_shard_bytes=options.ps_min_shard_bytes,
        max_shards=options.ps_max_shards,
        peer_timeout_seconds=options.peer_timeout_seconds,
    )


_TPU_CONNECT_SECONDS = 10.0


def _check_tpu_address_answers(tpu: str) -> None:
    # Connecting to a grpc:// address nobody listens on blocks without a bound.
    host, _, port = tpu[len("grpc://") :].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_TPU_CONNECT_SECONDS):
            pass
    except (OSError, ValueError) as error:
        raise UsageError(
            f"--strategy=tpu cannot reach --tpu={tpu!r} ({type(error).__name__}: {error}); "
            f"expected a TPU worker listening there; check the address or use the TPU's "
            f"name"
        ) from None


def _tpu(cluster: Cluster, options: StrategyOptions) -> tf.distribute.Strategy:
    del cluster
    if options.tpu.startswith("grpc://"):
        _check_tpu_address_answers(options.tpu)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=options.tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, OSError, tf.errors.OpError) as error:  # OSError: no GCE metadata
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        raise UsageError(
            f"--strategy=tpu found no TPU for --tpu={options.tpu!r} ({first_line}); expected "
            f"a TPU VM (--tpu=local) or a TPU name or grpc:// address; run on a TPU or pick "
            f"another --strategy"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


_BUILDERS = {
    "default": _default,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "multiworker": _multiworker,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}
