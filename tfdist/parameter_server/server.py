"""`serve`: what the worker and ps tasks of a parameter-server job run.

A worker or ps task starts a gRPC `tf.distribute.Server` and executes what the
coordinator (the chief) sends it. It learns that the job has ended by watching
the chief: the coordinator listens on its cluster address for as long as it
runs, so once that address has accepted connections and then refuses them for
`chief_gone_seconds` in a row, the chief has exited and the task exits 0 too.
This needs no shared file system and is bounded whichever way the chief ends
(success, crash, preemption). A restarted chief that comes back at the same
address within the grace period finds the servers still up.
"""

import dataclasses
import logging
import socket
import time
from typing import Callable

from tfdist._internal.preconditions import check_seconds
from tfdist.distribute.cluster import CHIEF, PS, WORKER, Cluster
from tfdist.errors import UsageError

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How long a server task waits for the chief.

    Attributes:
        chief_start_timeout: Seconds to wait for the chief to first accept a
            connection; the task fails (non-zero exit) after that.
        chief_gone_seconds: Seconds the chief must stay unreachable before
            the task decides the job has ended and exits 0.
        poll_seconds: Seconds between two probes of the chief's address.
    """

    chief_start_timeout: float = 1800.0
    chief_gone_seconds: float = 10.0
    poll_seconds: float = 1.0

    def __post_init__(self):
        for name in ("chief_start_timeout", "chief_gone_seconds", "poll_seconds"):
            check_seconds(name, getattr(self, name))


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def is_reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at `host:port`."""
    try:
        with socket.create_connection(_split_address(address), timeout=timeout):
            return True
    except OSError:
        return False


class ChiefWatch:
    """Tracks whether the chief at `address` has come up and then gone away.

    Args:
        address: The chief's `host:port`.
        gone_seconds: Unreachable for this long (after having been reached)
            means gone.
        probe: `address -> bool`; `is_reachable` by default.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        address: str,
        *,
        gone_seconds: float,
        probe: Callable[[str], bool] = is_reachable,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.address = address
        self._gone_seconds = gone_seconds
        self._probe = probe
        self._clock = clock
        self.seen = False
        self._unreachable_since = None

    def gone(self) -> bool:
        """Probes once; True once the chief was seen and has stayed away long enough."""
        if self._probe(self.address):
            self.seen = True
            self._unreachable_since = None
            return False
        if not self.seen:
            return False
        now = self._clock()
        if self._unreachable_since is None:
            self._unreachable_since = now
        return now - self._unreachable_since >= self._gone_seconds


def chief_address(cluster: Cluster) -> str:
    """The chief's `host:port`.

    Raises:
        UsageError: The cluster has no chief.
    """
    hosts = cluster.addresses.get(CHIEF, ())
    if not hosts:
        raise UsageError(
            f"the cluster from {cluster.source} has no chief task, expected one chief to "
            f"coordinate parameter-server training; add a chief (Vertex: worker pool 0)"
        )
    return hosts[0]


def start_server(cluster: Cluster):
    """Starts this worker or ps task's gRPC server and returns it."""
    # pylint: disable=g-import-not-at-top
    import tensorflow as tf

    from tfdist.parameter_server.strategy import training_cluster_spec

    return tf.distribute.Server(
        training_cluster_spec(cluster),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        start=True,
    )


def serve(cluster: Cluster, options: ServeOptions = ServeOptions()) -> None:
    """Serves as this worker or ps task until the chief has come and gone.

    Returns normally (the caller exits 0) once the chief, after having been
    reachable, stays unreachable for `options.chief_gone_seconds`.

    Raises:
        UsageError: This task is not a worker or ps task.
        TimeoutError: The chief never became reachable within
            `options.chief_start_timeout` seconds.
    """
    if cluster.task_type not in (WORKER, PS):
        raise UsageError(
            f"task type {cluster.task_type!r} cannot serve in a parameter-server job, "
            f"expected 'worker' or 'ps'; the chief trains and the evaluator evaluates"
        )
    watch = ChiefWatch(chief_address(cluster), gone_seconds=options.chief_gone_seconds)
    server = start_server(cluster)
    _log.info(
        "Serving as %s:%d at %s until the chief finishes.",
        cluster.task_type,
        cluster.task_index,
        cluster.task_address,
    )
    started = time.monotonic()
    while not watch.gone():
        if not watch.seen and time.monotonic() - started > options.chief_start_timeout:
            raise TimeoutError(
                f"the chief at {watch.address} did not become reachable within "
                f"{options.chief_start_timeout:g} s; check that the chief task started"
            )
        time.sleep(options.poll_seconds)
    _log.info(
        "The chief at %s is gone; %s:%d stops serving.",
        watch.address,
        cluster.task_type,
        cluster.task_index,
    )
    del server
