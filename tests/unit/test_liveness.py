"""The gRPC liveness probe: a frozen process (SIGSTOP) is silent, an exited one is gone.

The frozen peer here is a real stopped process holding a listening socket: the kernel
still completes its TCP handshakes, which is why a plain connect cannot tell.
"""

import threading
import time

import pytest

from tests.support.fake_peers import AnsweringPeer, FrozenPeer
from tfdist._internal import liveness
from tfdist.errors import PeerLostError
from tfdist.launch.local_cluster import pick_free_ports
from tfdist.parameter_server import server as server_lib


@pytest.fixture
def frozen_address():
    """The address of a process that listens, then is stopped (SIGSTOP) for good."""
    with FrozenPeer() as peer:
        yield peer.address


@pytest.fixture
def answering_address():
    with AnsweringPeer() as peer:
        yield peer.address


def test_a_stopped_process_accepts_connections_but_is_silent(frozen_address):
    assert liveness.is_reachable(frozen_address)  # why a TCP probe cannot tell
    assert liveness.probe(frozen_address, timeout=0.5) == liveness.SILENT


def test_a_live_server_answers_and_a_closed_port_is_gone(answering_address):
    assert liveness.probe(answering_address) == liveness.ANSWERS
    (free,) = pick_free_ports("127.0.0.1", 1)
    assert liveness.probe(f"127.0.0.1:{free}") == liveness.GONE


def test_the_watchdog_reports_a_task_that_answered_then_froze_once_silent_long_enough(
    answering_address,
):
    lost, reported, answered = [], threading.Event(), threading.Event()

    def probe(address, timeout):
        result = liveness.probe(address, timeout)
        if address == peer.address and result == liveness.ANSWERS:
            answered.set()
        return result

    with FrozenPeer(frozen=False) as peer:
        watchdog = liveness.PeerWatchdog(
            {"worker:0": answering_address, "worker:1": peer.address},
            timeout_seconds=1.0,
            poll_seconds=0.2,
            on_lost=lambda silent: (lost.append(silent), reported.set()),
            probe_fn=probe,
        )
        watchdog.start()
        try:
            assert answered.wait(timeout=30)
            assert not reported.is_set()
            peer.freeze()
            frozen_at = time.monotonic()
            assert reported.wait(timeout=30)
        finally:
            watchdog.stop()
        assert time.monotonic() - frozen_at >= 1.0
        (silent,) = lost
        assert (silent.task, silent.address) == ("worker:1", peer.address)
        line = silent.describe(1.0)
        assert line.startswith(f"lost contact with worker:1 at {peer.address}: ")
        assert "--peer_timeout_seconds=1" in line


def test_silence_counts_only_in_a_row_and_gone_is_not_silence():
    now = [0.0]
    tracker = liveness.SilenceTracker(10.0, clock=lambda: now[0])
    seen = []
    for result in [liveness.SILENT] * 3 + [liveness.ANSWERS] + [liveness.SILENT] * 12:
        seen.append(tracker.lost(tracker.record("worker:1", result)))
        now[0] += 1.0
    assert seen.index(True) == 4 + 10  # restarted at the answer, lost 10 s after
    assert tracker.record("ps:0", liveness.GONE) == 0.0
    # A task that never answered may not be up yet: its silence is the startup's business.
    for _ in range(30):
        assert tracker.record("worker:2", liveness.SILENT) == 0.0
        now[0] += 1.0


def _watch(states, now):
    answers = iter(states)
    return server_lib.ChiefWatch(
        "127.0.0.1:1", gone_seconds=5.0, probe=lambda address: next(answers), clock=lambda: now[0]
    )


def test_a_server_task_takes_a_silent_chief_for_lost():
    now = [0.0]
    watch = _watch([liveness.ANSWERS] + [liveness.SILENT] * 40, now)
    options = server_lib.ServeOptions(peer_timeout=30.0)
    started = time.monotonic()
    for _ in range(31):
        assert not watch.gone()  # silent is never "gone": the job did not end
        server_lib._check_chief(watch, options, started)
        now[0] += 1.0
    assert not watch.gone()
    with pytest.raises(PeerLostError, match=r"^lost contact with the chief at 127\.0\.0\.1:1: "):
        server_lib._check_chief(watch, options, started)


def test_a_chief_silent_before_it_ever_answered_is_left_to_the_start_timeout():
    now = [0.0]
    watch = _watch([liveness.SILENT] * 40, now)
    for _ in range(40):
        watch.gone()
        server_lib._check_chief(watch, server_lib.ServeOptions(peer_timeout=30.0), time.monotonic())
        now[0] += 1.0
    assert watch.silent_seconds == 0.0


def test_a_chief_that_never_comes_is_a_lost_peer_not_a_crash():
    now = [0.0]
    watch = _watch([liveness.GONE] * 2, now)
    options = server_lib.ServeOptions(chief_start_timeout=60.0)
    watch.gone()
    server_lib._check_chief(watch, options, started=time.monotonic())
    watch.gone()
    with pytest.raises(PeerLostError, match=r"did not answer within 60 s"):
        server_lib._check_chief(watch, options, started=time.monotonic() - 61.0)


def test_bad_timeouts_are_refused():
    from tfdist.errors import UsageError

    with pytest.raises(UsageError, match="peer_timeout_seconds"):
        liveness.SilenceTracker(0.0)
    with pytest.raises(UsageError, match="peer_timeout"):
        server_lib.ServeOptions(peer_timeout=-1.0)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -5, "30"])
def test_a_peer_timeout_that_would_watch_nothing_is_refused(value):
    from tfdist.distribute.strategy import StrategyOptions
    from tfdist.errors import UsageError

    with pytest.raises(UsageError, match=r"peer_timeout_seconds is .*expected a"):
        StrategyOptions(peer_timeout_seconds=value)
