"""Ending parameter servers with the job under Ray Train.

Outside Ray, a worker or ps task of a parameter-server job serves until the
chief's address stops accepting connections (`tfdist.parameter_server.server`).
Under Ray the chief's process is Ray's worker actor, which lives on (and keeps
its TensorFlow server listening) until every rank's training function has
returned, so the servers would wait forever and Ray with them. Instead the
backend creates one small actor per worker-group start; the chief's training
function marks it when it returns (normally or not), and the servers' watch of
the chief (`ChiefWatch`, the same loop) probes that mark instead of the port.
"""

import logging
import os
import time
import uuid

import ray

from tfdist.distribute import cluster as cluster_lib
from tfdist.parameter_server import server as server_lib

__all__ = ["ACTOR_VARIABLE", "POLL_SECONDS", "create", "mark_ended", "serve_until_job_end"]

_log = logging.getLogger(__name__)

ACTOR_VARIABLE = "TFDIST_RAY_JOB_END_ACTOR"
_NAMESPACE = "tfdist"
POLL_SECONDS = 0.5


@ray.remote(num_cpus=0)
class _JobEnd:
    def __init__(self):
        self._ended = False

    def end(self) -> None:
        self._ended = True

    def ended(self) -> bool:
        return self._ended


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
        ray.get(actor.end.remote(), timeout=60)


def serve_until_job_end(
    cluster: cluster_lib.Cluster, start_timeout_seconds: float = 1800.0
) -> None:
    """Serves as this worker or ps task until the chief's training function returns."""
    actor = _actor()
    if actor is None:
        raise RuntimeError(
            f"{ACTOR_VARIABLE} is not set; start the job with tfdist.ray.TensorflowConfig"
        )
    watch = server_lib.ChiefWatch(
        "the chief's training function",
        gone_seconds=0.0,
        probe=lambda _: not ray.get(actor.ended.remote(), timeout=60),
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
        time.sleep(POLL_SECONDS)
    _log.info(
        "The chief's training function returned; %s:%d stops serving.",
        cluster.task_type,
        cluster.task_index,
    )
    del server
