"""Whether another task of the job still answers: a probe that a frozen process fails.

Every task of a TensorFlow job runs a gRPC server. A TCP connection alone
says little: the kernel of a stopped (SIGSTOP), hung or swapping process
still completes the handshake. So `probe` opens the HTTP/2 connection that
gRPC speaks: it sends the client preface and an empty SETTINGS frame, and a
live server answers with its own SETTINGS frame at once, from its polling
thread, however busy its compute threads are. A stopped process answers
nothing: it is `SILENT`. A refused connection means the process is gone
(`GONE`), which callers tell apart from a silent one: a task that exited is
the normal end of a job or a failure TensorFlow itself reports, while a
silent one never is.

`PeerWatchdog` probes a set of tasks from a thread and calls `on_lost` once
any of them stayed silent for `timeout_seconds` in a row.
"""

import dataclasses
import math
import socket
import threading
import time
from typing import Callable, Mapping

from tfdist._internal.preconditions import check_seconds, require

# Seconds a task may stay silent before its peers take it for lost (`--peer_timeout_seconds`).
DEFAULT_TIMEOUT_SECONDS = 30.0

ANSWERS = "answers"
SILENT = "silent"
GONE = "gone"

# The HTTP/2 client connection preface followed by an empty SETTINGS frame
# (RFC 9113, sections 3.4 and 6.5).
_CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def check_timeout(name: str, value) -> float:
    """`value` if it is a finite number of seconds > 0: an endless timeout would watch nothing."""
    check_seconds(name, value, hint="how long a silent task may go unnoticed, e.g. 30")
    require(
        math.isfinite(value),
        f"{name} is {value!r}, expected a finite number of seconds > 0 (an endless timeout "
        f"would never notice a frozen task); e.g. 30",
    )
    return value


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a (host, port) pair."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def probe(address: str, timeout: float = 2.0) -> str:
    """One probe of the gRPC server at `address`: `ANSWERS`, `SILENT` or `GONE`.

    Args:
        address: `host:port` of a task.
        timeout: Seconds to wait for the connection and for the answer.

    Returns:
        `ANSWERS` when the server sent bytes back (or closed the
        connection itself: a frozen process can do neither); `SILENT` when it accepted
        nothing within `timeout` (no SYN answered) or accepted and then said
        nothing; `GONE` when the connection was refused or reset.
    """
    try:
        connection = socket.create_connection(split_address(address), timeout=timeout)
    except TimeoutError:
        return SILENT
    except OSError:
        return GONE
    with connection:
        try:
            connection.sendall(_CLIENT_PREFACE)
            connection.recv(9)  # bytes, or the end of a connection it closed: alive either way
        except TimeoutError:
            return SILENT
        except OSError:
            return GONE
    return ANSWERS


def is_reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at `host:port`."""
    try:
        with socket.create_connection(split_address(address), timeout=timeout):
            return True
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class SilentPeer:
    """A task that stopped answering.

    Attributes:
        task: Its name, e.g. `worker:1`.
        address: Its `host:port`.
        silent_seconds: How long it has not answered.
    """

    task: str
    address: str
    silent_seconds: float

    def describe(self, timeout_seconds: float) -> str:
        """One line: who, where, for how long, and the setting that bounds it."""
        return (
            f"lost contact with {self.task} at {self.address}: it accepts connections but has "
            f"not answered for {self.silent_seconds:.0f} s (--peer_timeout_seconds="
            f"{timeout_seconds:g}), so it is frozen or hung; exiting so that the job can "
            f"restart from its last backup"
        )


class SilenceTracker:
    """How long each task has gone without answering, from probe results.

    Args:
        timeout_seconds: Silent this long in a row means lost.
        clock: Monotonic seconds.
    """

    def __init__(self, timeout_seconds: float, *, clock: Callable[[], float] = time.monotonic):
        self.timeout_seconds = check_timeout("peer_timeout_seconds", timeout_seconds)
        self._clock = clock
        self._silent_since: dict[str, float] = {}
        self._answered: set[str] = set()

    def record(self, task: str, result: str) -> float:
        """Records one probe of `task`; returns the seconds it has been silent (0 if not).

        Silence counts only once the task has answered: before that it may
        not have started yet (a host that is not up drops the connection as a
        frozen one does), which is the startup's business, not this bound's.
        """
        now = self._clock()
        if result == ANSWERS:
            self._answered.add(task)
        if result != SILENT or task not in self._answered:
            self._silent_since.pop(task, None)
            return 0.0
        since = self._silent_since.setdefault(task, now)
        return now - since

    def lost(self, silent_seconds: float) -> bool:
        return silent_seconds >= self.timeout_seconds


class PeerWatchdog:
    """Probes tasks from a daemon thread; calls `on_lost` once one stays silent too long.

    A task that is `GONE` does not count: TensorFlow reports a dead task
    itself (a refused connection fails the next call), and a restarted one
    comes back at its address. Nor does one that never answered yet (not up).

    Args:
        peers: Task name (`worker:1`) to `host:port`.
        timeout_seconds: Silent this long in a row means lost.
        on_lost: Called once, from the watchdog's thread, with the `SilentPeer`.
        poll_seconds: Seconds between two rounds of probes.
        probe_fn: `(address, timeout) -> ANSWERS | SILENT | GONE`.
    """

    def __init__(
        self,
        peers: Mapping[str, str],
        *,
        timeout_seconds: float,
        on_lost: Callable[[SilentPeer], None],
        poll_seconds: float = 1.0,
        probe_fn: Callable[[str, float], str] = probe,
    ):
        self.peers = dict(peers)
        self._tracker = SilenceTracker(timeout_seconds)
        self.timeout_seconds = self._tracker.timeout_seconds
        self._on_lost = on_lost
        self._poll_seconds = check_seconds("poll_seconds", poll_seconds)
        self._probe_timeout = min(2.0, self.timeout_seconds / 2)
        self._probe = probe_fn
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfdist-peer-watchdog", daemon=True)

    def start(self) -> "PeerWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def check_once(self) -> SilentPeer | None:
        """One round of probes; the first task silent for too long, if any."""
        for task, address in self.peers.items():
            silent = self._tracker.record(task, self._probe(address, self._probe_timeout))
            if self._tracker.lost(silent):
                return SilentPeer(task, address, silent)
        return None

    def _run(self) -> None:
        while not self._stopped.wait(self._poll_seconds):
            lost = self.check_once()
            if lost is not None and not self._stopped.is_set():
                self._on_lost(lost)
                return
