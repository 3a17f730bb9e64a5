"""Preemption: finish the step, agree on it, save, exit 143 within a deadline.

Vertex AI, GKE and spot VMs announce preemption with SIGTERM, then kill the
process when their grace period ends. `PreemptionWatcher` turns the signal into
a flag; the training loop asks `should_stop()` at the end of each step. In a
synchronous multi-worker job one worker may get the signal alone, so the
workers agree on a step and all stop after it, save together, and exit with
code 143. Under `MultiWorkerMirroredStrategy` they agree through the
coordination service (`tfdist.preemption.agreement`): a check is a local read,
and the stop comes one step after the notice. Without that service, every
worker gathers the others' flags at the same checks (one tiny collective each)
and all stop at the step of the notice.

Why not TensorFlow's `PreemptionCheckpointHandler`: on Google Cloud CPU VMs it
turns itself into a no-op, and on GPU VMs it watches the metadata server's
maintenance events instead of SIGTERM, with a one-hour grace period; it also
supports only loops it drives. The agreement here works the same on every
platform and inside Keras `fit`.

A watchdog enforces the grace period: once a notice arrives, the process exits
at the deadline at the latest, with 143 if the backup committed and 137 (what
the platform's SIGKILL would give) if it did not.
"""

import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Callable

from tfdist import cli
from tfdist._internal.preconditions import check_seconds, check_whole_number
from tfdist.backups.sync import WorkerSync
from tfdist.cli import EXIT_GRACE_EXPIRED, EXIT_PREEMPTED
from tfdist.errors import UsageError
from tfdist.preemption import signal_relay
from tfdist.preemption.agreement import CoordinatedStop

__all__ = [
    "signal_relay",
    "CoordinatedStop",
    "PreemptionOptions",
    "Preempted",
    "PreemptionWatcher",
    "exit_without_state_on_sigterm",
]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PreemptionOptions:
    """How to react to a preemption notice.

    Attributes:
        grace_period_seconds: Time from the notice to the latest exit. Keep it
            below the platform's (GKE and Vertex default 30 s).
        check_every_steps: Steps between cross-worker checks of the flag when
            workers agree by collective (no coordination service). 1 stops at
            the very next step; more saves a collective per step. Checks
            through the coordination service are local reads at every step.
        signals: Signals that announce preemption.
    """

    grace_period_seconds: float = 25.0
    check_every_steps: int = 1
    signals: tuple[int, ...] = (signal.SIGTERM,)

    def __post_init__(self):
        check_seconds(
            "grace_period_seconds",
            self.grace_period_seconds,
            hint="keep it below the platform's own grace period (30 s on GKE and Vertex)",
        )
        check_whole_number("check_every_steps", self.check_every_steps, minimum=1)
        if not self.signals:
            raise UsageError("signals is empty, expected at least one, e.g. (signal.SIGTERM,)")


class Preempted(SystemExit):
    """Raised once the state is saved after a notice; exits the process with 143.

    Attributes:
        step: The global step the state was saved at.
    """

    def __init__(self, step: int):
        super().__init__(EXIT_PREEMPTED)
        self.step = step


class PreemptionWatcher:
    """Turns preemption signals into an agreed stop step and a bounded exit.

    Args:
        options: Grace period, check interval and signals.
        sync: Cross-worker agreement; `None` for one process.
        exit_fn: Called with the exit code when the grace period ends first
            (tests may pass their own; the default ends the process at once).
    """

    def __init__(
        self,
        options: PreemptionOptions = PreemptionOptions(),
        *,
        sync: WorkerSync | None = None,
        exit_fn: Callable[[int], None] = os._exit,
    ):  # pylint: disable=protected-access
        self.options = options
        self.sync = sync or WorkerSync(None)
        self._exit_fn = exit_fn
        self._notice = threading.Event()
        self._saved = threading.Event()
        self._done = threading.Event()
        self._deadline_thread = None
        self._previous_handlers = {}
        self.stop_step = None
        self._last_check_step = 0
        self._agreement = None  # CoordinatedStop, or False when not usable

    @property
    def notice_received(self) -> bool:
        """Whether this process received a preemption signal."""
        return self._notice.is_set()

    @property
    def deadline_pending(self) -> bool:
        """Whether a grace-period deadline is running."""
        return self._deadline_thread is not None and self._deadline_thread.is_alive()

    @property
    def installed(self) -> bool:
        return bool(self._previous_handlers) or signal_relay.is_registered(self._on_relayed)

    def install(self) -> None:
        """Installs the signal handlers; call from the main thread (or after
        `tfdist.preemption.signal_relay.install` from any thread)."""
        if self.installed:
            return
        if threading.current_thread() is not threading.main_thread():
            if signal_relay.covers(self.options.signals):
                signal_relay.register(self._on_relayed)
                return
            _log.warning(
                "Preemption handling is off: signal handlers can only be "
                "installed from the main thread."
            )
            return
        for signum in self.options.signals:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Restores the handlers that were in place before `install`."""
        signal_relay.unregister(self._on_relayed)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def _on_relayed(self, signum: int) -> None:
        self._on_signal(signum, None)

    def _on_signal(self, signum, frame) -> None:
        del frame
        if not self._notice.is_set():
            _log.warning(
                "Received %s: finishing the current step, then saving and exiting with %d.",
                signal.Signals(signum).name,
                EXIT_PREEMPTED,
            )
        self._notice.set()
        self._start_deadline()

    def _start_deadline(self) -> None:
        if self._deadline_thread is not None:
            return
        self._deadline_thread = threading.Thread(
            target=self._enforce_deadline,
            args=(time.monotonic(),),
            name="tfdist-preemption-deadline",
            daemon=True,
        )
        self._deadline_thread.start()

    def _enforce_deadline(self, started: float) -> None:
        remaining = self.options.grace_period_seconds - (time.monotonic() - started)
        if self._done.wait(max(remaining, 0.0)):
            return
        code = EXIT_PREEMPTED if self._saved.is_set() else EXIT_GRACE_EXPIRED
        _log.error(
            "Grace period of %.1f s ended %s; exiting with %d.",
            self.options.grace_period_seconds,
            "after the backup committed"
            if code == EXIT_PREEMPTED
            else "before the backup committed",
            code,
        )
        logging.shutdown()
        self._exit_fn(code)

    def should_stop(self, global_step: int) -> bool:
        """Whether every worker stops after `global_step`; a collective call.

        Call at the end of every step on every worker, with the same step.
        """
        if self.stop_step is not None:
            return True
        agreement = self._coordinated_stop()
        if agreement is not None:
            if self._notice.is_set():
                agreement.publish(global_step)
            if agreement.target is None or global_step < agreement.target:
                return False
        else:
            interval = self.options.check_every_steps
            if global_step // interval <= self._last_check_step // interval:
                return False
            self._last_check_step = global_step
            if not self.sync.any(self._notice.is_set()):
                return False
        self.stop_step = global_step
        self._start_deadline()
        _log.warning("Preemption notice agreed: stopping after step %d.", global_step)
        return True

    def _coordinated_stop(self) -> CoordinatedStop | None:
        """The coordination-service agreement of a multi-worker job, made at its first check."""
        if self._agreement is None:
            strategy = self.sync.strategy
            usable = self.sync.is_multi_worker and CoordinatedStop.available(strategy)
            self._agreement = (
                CoordinatedStop(
                    strategy, self.sync, ack_timeout_seconds=self.options.grace_period_seconds
                )
                if usable
                else False
            )
        return self._agreement or None

    def saved(self) -> None:
        """Marks the state as saved: the deadline now exits with 143."""
        self._saved.set()

    def finish(self) -> Preempted:
        """The exception that exits with 143; raise it once the state is saved."""
        self.saved()
        return Preempted(self.stop_step if self.stop_step is not None else -1)

    def close(self) -> None:
        """Stops the deadline (training ended normally) and restores handlers."""
        self._done.set()
        if self._agreement:
            self._agreement.close()
            self._agreement = None  # a later fit agrees anew
        self.uninstall()


def exit_without_state_on_sigterm(task: str) -> bool:
    """Makes SIGTERM end this task at once with exit code 201, which claims no save.

    For tasks that keep no state of their own (an evaluator): 143 would say
    "state saved", and a default SIGTERM death reads as 143 too. Prints one
    `error:` line. Call from the main thread.

    Args:
        task: The task, as the line names it (`evaluator:0`).

    Returns:
        Whether the handler was installed (False off the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return False

    def on_sigterm(signum, frame):
        del signum, frame
        cli.exit_from_thread(
            f"{task} received SIGTERM and stopped; it keeps no state, so nothing was "
            f"saved here (exit {cli.EXIT_STOPPED_WITHOUT_STATE}): the job resumes from "
            f"the chief's last backup",
            cli.EXIT_STOPPED_WITHOUT_STATE,
        )

    signal.signal(signal.SIGTERM, on_sigterm)
    return True
