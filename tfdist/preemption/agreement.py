"""Agreeing on a preemption stop step without a collective per step.

Under `MultiWorkerMirroredStrategy` all workers must stop after the same step.
Gathering every worker's notice flag with a collective after each step agrees
on it, but costs one cross-worker round trip per step: measured at 30-50% of
the step time of a small model at one step per execution on 2 local workers.

`CoordinatedStop` uses the key-value store of TensorFlow's coordination
service instead, which every `MultiWorkerMirroredStrategy` task already
shares (the habit of `tf.distribute.experimental.PreemptionCheckpointHandler`):

1. A worker that got the notice, at its next check after step `s`, publishes
   "stop at the first check at or after step `s + 1`" (the first worker to
   publish wins; a later one reads the winner's value).
2. A thread on every worker waits for that key, records the target and
   acknowledges it; the publisher waits for every acknowledgement before it
   runs another step. Synchronous workers are at most one execution apart,
   and none can finish the execution after `s` without the publisher, so every
   worker knows the target before it can reach it.
3. Each check compares the step with the target: a local read.

Keys live under a namespace drawn once per `fit` and agreed with one
collective, so a key left by an earlier incarnation of the job is never read.

`exit_together` orders the end of a finished job: TensorFlow's coordination
service runs in worker 0 and every task sends it heartbeats, but a task that
exits does not say goodbye. Whichever task outlives another by more than the
heartbeat timeout (10 s) then prints the other as crashed (`The tasks have
crashed ... CoordinationServiceError` on worker 0, `Failed to send RPC to
coordination service` on the others), though the job succeeded. Every task of
a finished job therefore waits at one barrier of the service when its process
exits, so that all leave within moments of each other; TensorFlow's own log
names that barrier as the way to a synchronized shutdown.

This module is the only one that touches the coordination service; it uses
`tensorflow.python.eager.context` (TensorFlow has no public key-value API) and
`CoordinatedStop.available` turns it off when that is missing, in which case
the watcher falls back to the per-check collective.
"""

import atexit
import logging
import random
import sys
import threading

import tensorflow as tf

__all__ = ["EXIT_BARRIER_SECONDS", "CoordinatedStop", "exit_together"]

_log = logging.getLogger(__name__)

_POLL_MILLISECONDS = 500
_EXIT_BARRIER = "tfdist/exit"
# How long a finished task waits at exit for the others (the chief writing its outputs).
EXIT_BARRIER_SECONDS = 300.0
_exit_registered = False


def _context():
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top

    return context.context()


class CoordinatedStop:
    """One agreed stop target for the workers of a synchronous job.

    Create it on every worker at the same point (its constructor runs one
    collective through `sync`).

    Args:
        strategy: The `MultiWorkerMirroredStrategy` training runs under.
        sync: The job's `WorkerSync`, for the one namespace agreement.
        ack_timeout_seconds: How long a publisher waits for the other workers'
            acknowledgements (the grace period: past it the process is ended
            anyway).
    """

    def __init__(self, strategy, sync, *, ack_timeout_seconds: float):
        resolver = strategy.cluster_resolver
        jobs = resolver.cluster_spec().as_dict()
        self._member = f"{resolver.task_type}-{resolver.task_id}"
        self._members = [
            f"{job}-{index}"
            for job in ("chief", "worker")
            for index in range(len(jobs.get(job, [])))
        ]
        namespace = sync.gather(random.SystemRandom().randrange(1 << 62))[0]
        self._key = f"tfdist/preemption/{namespace}/stop_at"
        self._ack_timeout_ms = max(1, int(ack_timeout_seconds * 1000))
        self._target = None
        self._published = False
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="tfdist-preemption-agreement", daemon=True
        )
        self._thread.start()

    @staticmethod
    def available(strategy) -> bool:
        """Whether `strategy` has a coordination service this class can use."""
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return False
        try:
            service = _context().coordination_service
        except AttributeError:
            return False
        return bool(service) and getattr(strategy, "cluster_resolver", None) is not None

    @property
    def target(self) -> int | None:
        """The agreed first step to stop at, once known on this worker."""
        return self._target

    def publish(self, finished_step: int) -> None:
        """Proposes stopping after the next step; returns once every worker knows the target."""
        if self._published:
            return
        self._published = True
        try:
            _context().set_config_key_value(self._key, str(finished_step + 1))
        except tf.errors.AlreadyExistsError:
            pass  # another worker published first; its target holds for all
        for member in self._members:
            try:
                _context().get_config_key_value(
                    f"{self._key}/ack/{member}", timeout_in_ms=self._ack_timeout_ms
                )
            except tf.errors.OpError as error:
                _log.warning(
                    "No acknowledgement of the stop step from %s (%s); the grace period decides.",
                    member,
                    type(error).__name__,
                )
                return

    def _watch(self) -> None:
        context = _context()
        while not self._closed.is_set():
            try:
                value = context.get_config_key_value(self._key, timeout_in_ms=_POLL_MILLISECONDS)
            except tf.errors.DeadlineExceededError:
                continue
            except tf.errors.OpError as error:
                # The service is gone: the job is ending or a peer failed, and the
                # strategy's own failure reporting says which.
                _log.debug("Stopped watching for a stop step: %s", type(error).__name__)
                return
            self._target = int(value)
            try:
                context.set_config_key_value(f"{self._key}/ack/{self._member}", "1")
            except tf.errors.OpError as error:
                _log.debug("Could not acknowledge the stop step: %s", type(error).__name__)
            return

    def close(self) -> None:
        """Stops watching (within `_POLL_MILLISECONDS`); the thread never blocks exit."""
        self._closed.set()


def _wait_for_the_other_tasks(timeout_ms: int) -> None:
    if getattr(sys, "last_value", None) is not None:
        return  # this process dies of an uncaught exception: no one waits for it
    try:
        _context().wait_at_barrier(_EXIT_BARRIER, timeout_ms)
    except tf.errors.OpError as error:
        # A task crashed or stayed past the timeout; TensorFlow's log says which.
        _log.debug("The exit barrier failed: %s", type(error).__name__)


def exit_together(strategy, *, timeout_seconds: float = EXIT_BARRIER_SECONDS) -> bool:
    """Makes this task's process wait at exit until every task of the job exits.

    Call on every task once the job has finished (each call after the first
    does nothing). A process that ends with an uncaught exception does not
    wait; a barrier that times out or loses a task lets the process go.

    Args:
        strategy: The job's strategy; only a multi-worker one with a
            coordination service waits.
        timeout_seconds: The longest wait.

    Returns:
        Whether the wait is registered.
    """
    global _exit_registered
    if _exit_registered:
        return True
    if not CoordinatedStop.available(strategy):
        return False
    atexit.register(_wait_for_the_other_tasks, max(1, int(timeout_seconds * 1000)))
    _exit_registered = True
    return True
