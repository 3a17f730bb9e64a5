"""A PreemptionWatcher on a non-main thread (Ray Train's training thread) gets
SIGTERM through `tfdist.preemption.signal_relay`, installed from the main thread."""

import ctypes
import os
import signal
import threading

import pytest

from tfdist import preemption
from tfdist.launch.testing import poll_until
from tfdist.preemption import signal_relay


def _install_on_a_thread(watcher):
    thread = threading.Thread(target=watcher.install)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.fixture
def relay():
    before = signal.getsignal(signal.SIGUSR1)
    assert signal_relay.install((signal.SIGUSR1,))
    yield
    signal_relay.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == before


def _options():
    return preemption.PreemptionOptions(signals=(signal.SIGUSR1,), grace_period_seconds=20)


def test_without_the_relay_a_watcher_on_a_thread_is_off():
    watcher = preemption.PreemptionWatcher(_options())
    _install_on_a_thread(watcher)
    assert not watcher.installed


def test_with_the_relay_a_watcher_on_a_thread_receives_the_signal(relay):
    watcher = preemption.PreemptionWatcher(_options(), exit_fn=lambda code: None)
    _install_on_a_thread(watcher)
    assert watcher.installed
    os.kill(os.getpid(), signal.SIGUSR1)
    poll_until(lambda: watcher.notice_received, timeout=10, what="the relayed notice")
    assert watcher.should_stop(7) and watcher.stop_step == 7
    watcher.close()
    assert not watcher.installed


def test_with_no_watcher_the_relay_calls_the_previous_handler():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        assert signal_relay.install((signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        poll_until(lambda: received, timeout=10, what="the previous handler")
        assert received == [signal.SIGUSR1]
    finally:
        signal_relay.uninstall()
        signal.signal(signal.SIGUSR1, previous)


def test_a_handler_c_code_installed_after_the_relay_is_replaced_on_register(relay):
    # As TensorFlow's coordination service does for SIGTERM when MWMS starts: a C-level
    # handler (here SIG_IGN) that Python's signal.getsignal does not see.
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal(int(signal.SIGUSR1), ctypes.c_void_p(1))  # SIG_IGN
    watcher = preemption.PreemptionWatcher(_options(), exit_fn=lambda code: None)
    _install_on_a_thread(watcher)
    os.kill(os.getpid(), signal.SIGUSR1)
    poll_until(lambda: watcher.notice_received, timeout=10, what="the relayed notice")
    watcher.close()
