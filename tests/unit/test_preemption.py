"""Preemption and kills of a real training process, then resume.

The process tests run tests/jobs/fault_tolerance_job.py (one TensorFlow process at a
time): SIGKILL after a backup exists, and SIGTERM, each followed by a restart
that must end with the weights of an uninterrupted run, every step applied once.
The 2-worker versions run it under `tfdist.launch.local_cluster` with MWMS.
"""

import os
import signal

import pytest

from tfdist.cli import EXIT_PREEMPTED
from tfdist.errors import UsageError
from tfdist.launch.testing import poll_until
from tfdist.preemption import EXIT_GRACE_EXPIRED, Preempted, PreemptionOptions, PreemptionWatcher

# ------------------------------------------------------------------ in process


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"grace_period_seconds": 0}, "grace_period_seconds is 0"),
        ({"grace_period_seconds": -5}, "grace_period_seconds is -5"),
        ({"grace_period_seconds": "30"}, "grace_period_seconds is '30'"),
        ({"grace_period_seconds": True}, "grace_period_seconds is True"),
        ({"check_every_steps": 0}, "check_every_steps is 0"),
        ({"check_every_steps": 2.0}, "check_every_steps is 2.0"),
        ({"signals": ()}, "signals is empty"),
    ],
)
def test_bad_options_are_one_line_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message) as error:
        PreemptionOptions(**kwargs)
    assert "\n" not in str(error.value)


@pytest.fixture
def watcher():
    exits = []
    made = []

    def make(**options):
        created = PreemptionWatcher(PreemptionOptions(**options), exit_fn=exits.append)
        created.exits = exits
        made.append(created)
        return created

    yield make
    for created in made:
        created.close()


def test_signal_sets_the_notice_and_stops_at_the_next_check(watcher):
    previous = signal.getsignal(signal.SIGTERM)
    handler = watcher(check_every_steps=3)
    handler.install()
    assert handler.should_stop(1) is False
    os.kill(os.getpid(), signal.SIGTERM)
    poll_until(lambda: handler.notice_received, timeout=10, what="the SIGTERM notice")
    assert handler.should_stop(2) is False  # not a checking step
    assert handler.should_stop(3) is True
    assert handler.stop_step == 3
    preempted = handler.finish()
    assert isinstance(preempted, Preempted) and isinstance(preempted, SystemExit)
    assert preempted.code == EXIT_PREEMPTED == 143 and preempted.step == 3
    handler.close()
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize("saved, code", [(False, EXIT_GRACE_EXPIRED), (True, EXIT_PREEMPTED)])
def test_grace_period_end_exits_with_the_code_for_what_was_saved(watcher, saved, code):
    handler = watcher(grace_period_seconds=0.3)
    handler.install()
    if saved:
        handler.saved()
    os.kill(os.getpid(), signal.SIGTERM)
    poll_until(lambda: handler.exits, timeout=10, what="the grace-period exit")
    assert handler.exits == [code]


def test_normal_end_cancels_the_deadline(watcher):
    handler = watcher(grace_period_seconds=0.3)
    handler.install()
    os.kill(os.getpid(), signal.SIGTERM)
    poll_until(lambda: handler.notice_received, timeout=10, what="the SIGTERM notice")
    assert handler.deadline_pending
    handler.close()
    poll_until(lambda: not handler.deadline_pending, timeout=10, what="the deadline to end")
    assert handler.exits == []
