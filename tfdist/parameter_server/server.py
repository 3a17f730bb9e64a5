"""`serve`: what the worker and ps tasks of a parameter-server job run.

A worker or ps task starts a gRPC `tf.distribute.Server` and executes what the
coordinator (the chief) sends it. It learns that the job has ended by watching
the chief: the coordinator listens on its cluster address for as long as it
runs, so once that address has answered and then refuses connections for
`chief_gone_seconds` in a row, the chief has exited and the task exits 0 too.
This needs no shared file system and is bounded whichever way the chief ends
(success, crash, preemption). A restarted chief that comes back at the same
address within the grace period finds the servers still up.

The probe speaks gRPC's HTTP/2 (`tfdist._internal.liveness`), so a chief that
is frozen (SIGSTOP, a hung host: connections accepted, nothing answered) is
told apart from one that exited: silent for `peer_timeout` seconds, the task
exits 200 (`PeerLostError`), as it does when the chief never comes up within
`chief_start_timeout`. On SIGTERM a worker exits 201 (`StoppedWithoutStateError`:
it saved nothing; the coordinator runs its steps elsewhere); a ps task keeps
serving, so that a chief saving after the same notice can still read the
variables, until the chief has gone or `grace_seconds` have passed, then
exits 201 too.
"""

import dataclasses
import logging
import signal
import threading
import time
from typing import Callable

from tfdist._internal import liveness
from tfdist._internal.preconditions import check_seconds
from tfdist.distribute.cluster import CHIEF, PS, WORKER, Cluster
from tfdist.errors import PeerLostError, StoppedWithoutStateError, UsageError

__all__ = ["is_reachable", "ServeOptions", "ChiefWatch", "chief_address", "start_server", "serve"]

_log = logging.getLogger(__name__)

# Kept for callers that probe a plain TCP port.
is_reachable = liveness.is_reachable


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How long a server task waits for the chief.

    Attributes:
        chief_start_timeout: Seconds to wait for the chief to first answer;
            after that the task exits 200 (`PeerLostError`), a code restart
            policies retry.
        chief_gone_seconds: Seconds the chief must refuse connections before
            the task decides the job has ended and exits 0.
        poll_seconds: Seconds between two probes of the chief's address.
        peer_timeout: Seconds the chief may accept connections without
            answering (frozen, hung) before the task exits 200.
        grace_seconds: After SIGTERM, the longest a ps task keeps serving
            while the chief is still up; then it exits 201 (a worker exits
            201 at once).
    """

    chief_start_timeout: float = 1800.0
    chief_gone_seconds: float = 10.0
    poll_seconds: float = 1.0
    peer_timeout: float = liveness.DEFAULT_TIMEOUT_SECONDS
    grace_seconds: float = 25.0

    def __post_init__(self):
        for name in (
            "chief_start_timeout",
            "chief_gone_seconds",
            "poll_seconds",
            "peer_timeout",
            "grace_seconds",
        ):
            check_seconds(name, getattr(self, name))
        liveness.check_timeout("peer_timeout", self.peer_timeout)


def _as_state(answer) -> str:
    """A probe's answer as a liveness state; `True`/`False` from a yes/no probe."""
    if answer is True:
        return liveness.ANSWERS
    if answer is False:
        return liveness.GONE
    return answer


class ChiefWatch:
    """Tracks whether the chief at `address` has come up and then gone away.

    Args:
        address: The chief's `host:port`.
        gone_seconds: Refusing connections for this long (after having
            answered) means gone.
        probe: `address -> bool` (reachable) or `address -> state`
            (`tfdist._internal.liveness.ANSWERS`, `SILENT` or `GONE`);
            the gRPC probe `liveness.probe` by default.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        address: str,
        *,
        gone_seconds: float,
        probe: Callable[[str], object] = liveness.probe,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.address = address
        self._gone_seconds = gone_seconds
        self._probe = probe
        self._clock = clock
        self.seen = False
        self.state = None
        self._unreachable_since = None
        self._silent_since = None

    def gone(self) -> bool:
        """Probes once; True once the chief was seen and has stayed away long enough."""
        self.state = _as_state(self._probe(self.address))
        now = self._clock()
        if self.state == liveness.SILENT:
            if self.seen and self._silent_since is None:  # before: not up yet
                self._silent_since = now
            return False
        self._silent_since = None
        if self.state == liveness.ANSWERS:
            self.seen = True
            self._unreachable_since = None
            return False
        if not self.seen:
            return False
        if self._unreachable_since is None:
            self._unreachable_since = now
        return now - self._unreachable_since >= self._gone_seconds

    @property
    def silent_seconds(self) -> float:
        """Seconds the chief, once seen, has not answered (0 if it answers or was never seen)."""
        return 0.0 if self._silent_since is None else self._clock() - self._silent_since

    def check_answering(self, timeout_seconds: float) -> None:
        """Raises `PeerLostError` once the chief has been silent for `timeout_seconds`."""
        silent = self.silent_seconds
        if silent >= timeout_seconds:
            raise PeerLostError(
                liveness.SilentPeer("the chief", self.address, silent).describe(timeout_seconds)
            )


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


class _StopNotice:
    """SIGTERM as a flag and the time it came; installed from the main thread only."""

    def __init__(self):
        self.received_at = None
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        del signum, frame
        if self.received_at is None:
            self.received_at = time.monotonic()
            _log.warning(
                "Received SIGTERM: exiting with 201 (a ps task first serves on while the "
                "chief is up: it may be saving)."
            )

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def serve(cluster: Cluster, options: ServeOptions = ServeOptions()) -> None:
    """Serves as this worker or ps task until the chief has come and gone.

    Returns normally (the caller exits 0) once the chief, after having
    answered, refuses connections for `options.chief_gone_seconds`.

    Raises:
        UsageError: This task is not a worker or ps task.
        PeerLostError: The chief did not answer within
            `options.chief_start_timeout` seconds, or stopped answering
            (frozen) for `options.peer_timeout` seconds (exit 200).
        StoppedWithoutStateError: SIGTERM arrived; raised at once on a
            worker, and on a ps task once the chief has gone or
            `options.grace_seconds` have passed (exit 201).
    """
    if cluster.task_type not in (WORKER, PS):
        raise UsageError(
            f"task type {cluster.task_type!r} cannot serve in a parameter-server job, "
            f"expected 'worker' or 'ps'; the chief trains and the evaluator evaluates"
        )
    watch = ChiefWatch(chief_address(cluster), gone_seconds=options.chief_gone_seconds)
    server = start_server(cluster)
    task = f"{cluster.task_type}:{cluster.task_index}"
    _log.info("Serving as %s at %s until the chief finishes.", task, cluster.task_address)
    notice = _StopNotice()
    started = time.monotonic()
    try:
        while not watch.gone():
            _check_chief(watch, options, started)
            if notice.received_at is not None and (
                cluster.task_type == WORKER  # holds no variables: nothing to wait for
                or watch.state != liveness.ANSWERS
                or time.monotonic() - notice.received_at >= options.grace_seconds
            ):
                raise StoppedWithoutStateError(
                    f"{task} received SIGTERM and stopped serving after "
                    f"{time.monotonic() - notice.received_at:.0f} s (the chief "
                    f"{'still answered' if watch.state == liveness.ANSWERS else 'was gone'}); "
                    f"it keeps no state, so nothing was saved here: the job resumes from the "
                    f"chief's last backup"
                )
            time.sleep(options.poll_seconds)
    finally:
        notice.restore()
    _log.info("The chief at %s is gone; %s stops serving.", watch.address, task)
    del server


def _check_chief(watch: ChiefWatch, options: ServeOptions, started: float) -> None:
    """Raises `PeerLostError` for a chief that never came up or stopped answering."""
    watch.check_answering(options.peer_timeout)
    waited = time.monotonic() - started
    if not watch.seen and waited > options.chief_start_timeout:
        raise PeerLostError(
            f"the chief at {watch.address} did not answer within "
            f"{options.chief_start_timeout:g} s (--chief_start_timeout_seconds); "
            f"exiting so that the job can restart once it is scheduled (check that "
            f"the chief task started)"
        )
