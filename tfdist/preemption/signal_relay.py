"""Signals for code on other threads, when the main thread is busy in C code.

Python runs signal handlers on the main thread, and only when that thread runs
Python code. Ray Train runs the training function in a thread while the
worker's main thread waits inside Ray's C++ task loop, so a handler installed
there would not run until training ends, and one cannot be installed from the
training thread at all. `install()`, called once from the main thread,
installs handlers for `signals` and a wakeup file descriptor: the C-level
handler writes each signal's number to it from whatever thread the kernel
picked, and a daemon thread reads it and calls the callbacks registered with
`register` (tfdist's `PreemptionWatcher` registers itself when it is installed
off the main thread). With no callback registered, the signal goes to the
handler that was there before (or, for the default action, ends the process
with 128 + the signal number).

TensorFlow's coordination service (MultiWorkerMirroredStrategy) installs its
own C++ SIGTERM handler when the strategy starts, after the relay; Python still
reports its own handler then. `register`, called once the strategy exists,
puts back the C-level action saved at `install` (libc `sigaction`, which any
thread may call), as `signal.signal` does on the main thread outside Ray.
"""

import ctypes
import logging
import os
import signal
import socket
import threading
from typing import Callable

__all__ = ["install", "uninstall", "covers", "register", "unregister", "is_registered"]

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_previous: dict[int, object] = {}  # signal -> the handler the relay replaced
_callbacks: list[Callable[[int], None]] = []
_state = {"reader": None, "sockets": None, "previous_fd": -1}
_actions: dict[int, ctypes.Array] = {}  # signal -> its C `struct sigaction` after install
_SIGACTION_BYTES = 512  # larger than struct sigaction on every Linux ABI


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _read_action(signum: int):
    libc = _libc()
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if libc is None or libc.sigaction(signum, None, action) != 0:
        return None
    return action


def _restore_actions() -> None:
    libc = _libc()
    for signum, action in list(_actions.items()):
        if libc is None or libc.sigaction(signum, action, None) != 0:
            _log.warning(
                "Could not restore the handler of %s; a SIGTERM may go to another handler.",
                signal.Signals(signum).name,
            )


def install(signals=(signal.SIGTERM,)) -> bool:
    """Relays `signals` to registered callbacks; call from the main thread.

    Returns:
        Whether the relay is installed (False off the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        _log.warning("Signal relay not installed: it must be installed from the main thread.")
        return False
    with _lock:
        if _state["sockets"] is None:
            receiver, sender = socket.socketpair()
            sender.setblocking(False)
            _state["previous_fd"] = signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
            _state["sockets"] = (receiver, sender)
            reader = threading.Thread(
                target=_read, args=(receiver,), daemon=True, name="tfdist-signal-relay"
            )
            _state["reader"] = reader
            reader.start()
        for signum in signals:
            if signum not in _previous:
                _previous[signum] = signal.signal(signum, _on_main_thread)
                action = _read_action(signum)
                if action is not None:
                    _actions[signum] = action
    return True


def uninstall() -> None:
    """Restores the previous handlers and wakeup descriptor; from the main thread."""
    with _lock:
        for signum, previous in _previous.items():
            signal.signal(signum, previous)
        _previous.clear()
        _actions.clear()
        if _state["sockets"] is not None:
            signal.set_wakeup_fd(_state["previous_fd"])
            receiver, sender = _state["sockets"]
            sender.close()  # the reader sees end of file and stops
            _state["reader"].join(timeout=5)
            receiver.close()
            _state.update(reader=None, sockets=None, previous_fd=-1)


def covers(signals) -> bool:
    """Whether every one of `signals` is relayed."""
    with _lock:
        return all(signum in _previous for signum in signals)


def register(callback: Callable[[int], None]) -> None:
    """Calls `callback(signum)` (on the relay's thread) for each relayed signal.

    Also puts the relay's handlers back where C++ code replaced them since
    `install` (see the module docstring).
    """
    with _lock:
        if callback not in _callbacks:
            _callbacks.append(callback)
        _restore_actions()


def unregister(callback: Callable[[int], None]) -> None:
    with _lock:
        if callback in _callbacks:
            _callbacks.remove(callback)


def is_registered(callback: Callable[[int], None]) -> bool:
    with _lock:
        return callback in _callbacks


def _on_main_thread(signum, frame) -> None:
    """The Python-level handler: the wakeup descriptor already carried the signal."""
    del signum, frame


def _read(receiver: socket.socket) -> None:
    while True:
        try:
            data = receiver.recv(64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            _dispatch(signum)


def _dispatch(signum: int) -> None:
    with _lock:
        if signum not in _previous:
            return  # a signal another handler owns (the descriptor sees every one)
        callbacks = list(_callbacks)
        previous = _previous[signum]
    for callback in callbacks:
        callback(signum)
    if callbacks:
        return
    if callable(previous):
        previous(signum, None)
    elif previous == signal.SIG_DFL:
        logging.shutdown()
        os._exit(128 + signum)  # pylint: disable=protected-access  (what the default would give)
