"""Ray Train's own preemption notice, handled as tfdist handles a SIGTERM.

Ray Train (V2, the default in Ray 2.60) watches its nodes: when one hosting a
worker is drained for preemption (a spot reclaim; the autoscaler's
`DrainNode` with reason `DRAIN_NODE_REASON_PREEMPTION` and a deadline), it
marks every worker, and `ray.train.get_preemption_info()` returns the notice.
That call is a collective: every worker must make it, the same number of
times. `PreemptionNotice` makes it from Keras each time the optimizer step
passes a multiple of `every_steps`, so all workers call it at the same steps,
and on the first notice sends this process the signal the backend relays
(SIGTERM). From there it is tfdist's own path: the preemption watcher of
`tfdist.resumable.fit` takes the notice, the workers agree on a stop step, back
it up and end the training function with `Preempted`. Under parameter servers
only the chief runs `fit` (`tfdist.parameter_server.fit`, whose callbacks run at
its sync points): it polls there, and the worker, ps and evaluator ranks make
the same call after it (`tfdist.ray.job_end`); on a notice the chief makes the
save a SIGTERM makes, at the next sync point, and exits with `Preempted` (143).

Which Ray budget the restart uses: Ray's controller (`_handle_preempting_state`
in Ray 2.60) counts an error raised by a training function during a preemption
as a worker failure (`FailureConfig.max_failures`); only a worker that dies
with its node, or the drain deadline passing, counts against
`max_preemption_failures`. So `tfdist.ray.train_function` does not hand
`Preempted` to Ray at once after Ray's notice: the backup is committed, and the
function waits (`wait_for_ray`) until Ray ends the group, at the node's death
or the deadline, as Ray expects; Ray then restarts the group, charged to
`max_preemption_failures`, and it resumes at the agreed step. The wait ends
anyway `WAIT_MARGIN_SECONDS` after the deadline (Ray's
`DEFAULT_PREEMPTION_DEADLINE_S`, 120 s after the notice, without one), or when
tfdist's grace period ends first: then the restart counts as a worker failure.
Keep `grace_period_seconds` above the drain window to avoid that.
"""

import logging
import os
import signal
import time

import keras

from tfdist._internal.preconditions import check_whole_number
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from tfdist.preemption import signal_relay
from tfdist.ray import job_end

__all__ = [
    "WAIT_MARGIN_SECONDS",
    "NO_DEADLINE_SECONDS",
    "handled_notice",
    "wait_for_ray",
    "check_followed",
    "PreemptionNotice",
]

_log = logging.getLogger(__name__)

WAIT_MARGIN_SECONDS = 30.0
NO_DEADLINE_SECONDS = 120.0  # Ray's DEFAULT_PREEMPTION_DEADLINE_S
_handled = {"info": None, "at": None}  # the notice this process handed on, and when


def handled_notice():
    """Ray's `PreemptionInfo` this process handed to tfdist, or None."""
    return _handled["info"]


def check_followed(name: str, environ=os.environ) -> None:
    """Raises `UsageError` when ranks that never run fit would miss Ray's collective calls.

    Parameter-server workers and ps tasks and an evaluator make rank 0's calls
    only when `tfdist.ray.TensorflowConfig` set the job up (and its training
    function is `tfdist.ray.train_function`).
    """
    cluster = cluster_lib.resolve_cluster(environ)
    if not (cluster.addresses.get(cluster_lib.PS) or cluster_lib.has_evaluator(cluster, environ)):
        return
    if environ.get(job_end.FOLLOWED_VARIABLE) != "1":
        raise UsageError(
            f"{name} is in a job with parameter servers or an evaluator that "
            f"tfdist.ray.TensorflowConfig did not set up, expected its backend: Ray Train's "
            f"calls need every Ray rank, and those ranks never run fit; pass "
            f"tensorflow_config=tfdist.ray.TensorflowConfig(...) and wrap the training "
            f"function in tfdist.ray.train_function"
        )


def wait_for_ray(info, *, clock=time.time, sleep=time.sleep) -> None:
    """Waits for Ray to end the worker group after its notice; returns at the latest
    `WAIT_MARGIN_SECONDS` after the notice's deadline."""
    deadline = (
        info.deadline_ms / 1000
        if info.deadline_ms
        else (_handled["at"] or clock()) + NO_DEADLINE_SECONDS
    )
    _log.warning(
        "Backed up for Ray's preemption notice; waiting for Ray to end the worker "
        "group (deadline in %.0f s).",
        max(deadline - clock(), 0.0),
    )
    while clock() < deadline + WAIT_MARGIN_SECONDS:
        sleep(0.5)


class PreemptionNotice(keras.callbacks.Callback):
    """Polls `ray.train.get_preemption_info()` and turns a notice into a relayed SIGTERM.

    Pass it in `callbacks=` of `tfdist.resumable.fit` on every worker of a
    synchronous (MultiWorkerMirrored) job under `tfdist.ray.TensorflowConfig`,
    or of the chief's `tfdist.parameter_server.fit` (the other ranks follow
    through `tfdist.ray.train_function`).

    Args:
        every_steps: Polls when the optimizer step passes a multiple of this
            (each poll is one round trip through Ray's controller); under
            parameter servers callbacks run at sync points only, so 1 polls at
            every sync point. Keep `every_steps` times the step time well
            inside the notice's deadline.
        signum: The signal to hand the notice to; it must be one of the
            backend's `preemption_signals`.
    """

    def __init__(self, every_steps: int = 8, *, signum: int = signal.SIGTERM):
        super().__init__()
        check_whole_number("every_steps", every_steps, minimum=1)
        self.every_steps = every_steps
        self.signum = int(signum)
        self.notice = None  # Ray's PreemptionInfo, once seen
        self._last_step = None

    def get_state(self) -> dict:
        """Nothing to keep across a resume: the restarted group polls afresh."""
        return {}

    def set_state(self, state: dict) -> None:
        del state

    def on_train_begin(self, logs=None):
        check_followed("PreemptionNotice")
        self._last_step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        last, self._last_step = self._last_step, step
        if last is not None and step // self.every_steps <= last // self.every_steps:
            return
        if last is None and step % self.every_steps:
            return
        info = job_end.preemption_info()
        if info is None or self.notice is not None:
            return
        self.notice = info
        _handled.update(info=info, at=time.time())
        seconds = (
            f"{info.deadline_ms / 1000 - time.time():.0f} s" if info.deadline_ms else "no deadline"
        )
        if not signal_relay.covers((self.signum,)):
            _log.warning(
                "Ray's preemption notice (ranks %s, %s) is ignored: %s is not relayed; "
                "use tfdist.ray.TensorflowConfig",
                info.preempted_ranks,
                seconds,
                signal.Signals(self.signum).name,
            )
            return
        _log.warning(
            "Ray's preemption notice at step %d (ranks %s, deadline in %s): handled as a %s.",
            step,
            info.preempted_ranks,
            seconds,
            signal.Signals(self.signum).name,
        )
        os.kill(os.getpid(), self.signum)
