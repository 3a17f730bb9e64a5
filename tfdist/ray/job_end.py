"""The job's actor under Ray Train: when the chief's function ended, and rank 0's Ray calls.

Outside Ray, a worker or ps task of a parameter-server job serves until the
chief's address stops accepting connections (`tfdist.parameter_server.server`).
Under Ray the chief's process is Ray's worker actor, which lives on (and keeps
its TensorFlow server listening) until every rank's training function has
returned, so the servers would wait forever and Ray with them. Instead the
backend creates one small actor per worker-group start; the chief's training
function marks it when it returns (normally or not), and the servers' watch of
the chief (`ChiefWatch`, the same loop) probes that mark instead of the port.

The same actor carries Ray Train's collective calls to the ranks that never
run `fit` (the worker and ps ranks of a parameter-server job, an evaluator).
In Ray 2.60 `ray.train.report` and `ray.train.get_preemption_info` are
barriers of every rank of the group (`SynchronizationActor`; a report is also
consolidated only once every rank has put one in its queue), so every rank
must make each call, the same number of times, in the same order. Rank 0
announces each call here (`lead`) just before it makes it; every following
rank makes the announced calls in order (`Follower`), the servers from their
serving loop, the evaluator from a thread beside its evaluation. A follower's
report carries no checkpoint: rank 0's is the job's.
"""

import asyncio
import logging
import os
import threading
import time
import uuid

import ray
import ray.train

from tfdist.distribute import cluster as cluster_lib
from tfdist.parameter_server import server as server_lib

__all__ = [
    "ACTOR_VARIABLE",
    "FOLLOWED_VARIABLE",
    "POLL_SECONDS",
    "PREEMPTION_INFO",
    "RAY_CALL_TIMEOUT_SECONDS",
    "REPORT",
    "Follower",
    "create",
    "follow_in_thread",
    "lead",
    "mark_ended",
    "preemption_info",
    "report",
    "serve_until_job_end",
]

_log = logging.getLogger(__name__)

ACTOR_VARIABLE = "TFDIST_RAY_JOB_END_ACTOR"
FOLLOWED_VARIABLE = "TFDIST_RAY_FOLLOWED"  # "1": some rank does not run fit and follows rank 0
_NAMESPACE = "tfdist"
POLL_SECONDS = 0.5
RAY_CALL_TIMEOUT_SECONDS = 60.0
REPORT = "report"
PREEMPTION_INFO = "get_preemption_info"


@ray.remote(num_cpus=0)
class _JobEnd:
    def __init__(self):
        self._ended = False
        self._calls = []
        self._changed = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made in the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    async def end(self) -> None:
        async with self._condition():
            self._ended = True
            self._condition().notify_all()

    async def ended(self) -> bool:
        return self._ended

    async def announce(self, call: tuple) -> int:
        async with self._condition():
            self._calls.append(call)
            self._condition().notify_all()
            return len(self._calls)

    async def calls_after(self, done: int, wait_seconds: float) -> tuple:
        """`(ended, calls announced after the first done)`, once there is news or after the wait."""
        condition = self._condition()
        async with condition:
            try:
                await asyncio.wait_for(
                    condition.wait_for(lambda: self._ended or len(self._calls) > done),
                    wait_seconds,
                )
            except asyncio.TimeoutError:
                pass
            return self._ended, list(self._calls[done:])


def create():
    """Creates this worker group's actor; returns `(handle, name)`."""
    name = f"tfdist-job-end-{uuid.uuid4().hex}"
    return _JobEnd.options(name=name, namespace=_NAMESPACE).remote(), name


def _actor():
    name = os.environ.get(ACTOR_VARIABLE)
    return ray.get_actor(name, namespace=_NAMESPACE) if name else None


def mark_ended() -> None:
    """Called by the chief when its training function returns."""
    actor = _actor()
    if actor is not None:
        ray.get(actor.end.remote(), timeout=RAY_CALL_TIMEOUT_SECONDS)


def _rank() -> int:
    return ray.train.get_context().get_world_rank()


def lead(call: tuple) -> None:
    """On rank 0 of a job with following ranks: announces `call` before rank 0 makes it."""
    if os.environ.get(FOLLOWED_VARIABLE) != "1" or _rank() != 0:
        return
    actor = _actor()
    if actor is not None:
        ray.get(actor.announce.remote(call), timeout=RAY_CALL_TIMEOUT_SECONDS)


def report(metrics: dict, checkpoint=None, checkpoint_dir_name: str | None = None) -> None:
    """`ray.train.report`, which the ranks that do not run fit make too."""
    lead((REPORT, dict(metrics), checkpoint_dir_name))
    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_dir_name)


def preemption_info():
    """`ray.train.get_preemption_info()`, which the ranks that do not run fit make too."""
    lead((PREEMPTION_INFO,))
    return ray.train.get_preemption_info()


class Follower:
    """Makes rank 0's announced Ray Train calls on this rank, in order.

    Args:
        actor: The job's actor (default: the one the backend named).
    """

    def __init__(self, actor=None):
        self._actor = actor or _actor()
        if self._actor is None:
            raise RuntimeError(
                f"{ACTOR_VARIABLE} is not set; start the job with tfdist.ray.TensorflowConfig"
            )
        self.done = 0
        self.reports = 0
        self.polls = 0

    def poll(self, wait_seconds: float = POLL_SECONDS) -> bool:
        """Makes the calls announced so far (waiting up to `wait_seconds` for one);
        returns whether the chief's training function has returned."""
        try:
            ended, calls = ray.get(
                self._actor.calls_after.remote(self.done, wait_seconds),
                timeout=wait_seconds + RAY_CALL_TIMEOUT_SECONDS,
            )
        except ray.exceptions.RayActorError:
            # The backend kills it when Ray shuts the worker group down (a restart, the end).
            _log.warning("The job's actor is gone: Ray is ending this worker group.")
            return True
        for call in calls:
            if call[0] == REPORT:
                ray.train.report(call[1], checkpoint=None, checkpoint_dir_name=call[2])
                self.reports += 1
            elif call[0] == PREEMPTION_INFO:
                ray.train.get_preemption_info()  # rank 0's answer; the chief acts on it
                self.polls += 1
            else:
                raise RuntimeError(f"unknown Ray Train call {call[0]!r} announced by rank 0")
            self.done += 1
        return ended

    def follow_until_job_end(self, stop: threading.Event | None = None) -> None:
        """Polls until the chief's training function returns (or `stop` is set)."""
        while not self.poll():
            if stop is not None and stop.is_set():
                return


def follow_in_thread() -> tuple[threading.Thread, threading.Event]:
    """Starts a daemon thread that follows rank 0's calls; returns it and its stop event."""
    follower = Follower()
    stop = threading.Event()
    errors = []

    def run():
        try:
            follower.follow_until_job_end(stop)
        except BaseException as error:  # pylint: disable=broad-except  (reported by the owner)
            errors.append(error)
            _log.error("Following rank 0's Ray Train calls failed: %r", error)

    thread = threading.Thread(target=run, name="tfdist-ray-follower", daemon=True)
    thread.follower, thread.errors = follower, errors
    thread.start()
    return thread, stop


def serve_until_job_end(
    cluster: cluster_lib.Cluster, start_timeout_seconds: float = 1800.0
) -> None:
    """Serves as this worker or ps task until the chief's training function returns,
    making rank 0's announced Ray Train calls meanwhile."""
    follower = Follower()
    watch = server_lib.ChiefWatch(
        "the chief's training function",
        gone_seconds=0.0,
        probe=lambda _: not follower.poll(),  # waits up to POLL_SECONDS for news
    )
    server = server_lib.start_server(cluster)
    _log.info(
        "Serving as %s:%d at %s until the chief's training function returns.",
        cluster.task_type,
        cluster.task_index,
        cluster.task_address,
    )
    started = time.monotonic()
    while not watch.gone():
        if not watch.seen and time.monotonic() - started > start_timeout_seconds:
            raise TimeoutError(f"the chief did not start within {start_timeout_seconds:g} s")
    _log.info(
        "The chief's training function returned; %s:%d stops serving "
        "(%d Ray Train reports and %d preemption polls made with rank 0).",
        cluster.task_type,
        cluster.task_index,
        follower.reports,
        follower.polls,
    )
    del server
