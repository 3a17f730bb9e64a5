"""Puts tfdist's one-line lost-peer error before TensorFlow's C++ lines about it.

When a peer of a multi-worker job dies, TensorFlow's C++ runtime logs the
aborted collective on stderr (file descriptor 2) before Python sees the error:

    E0000 ... base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: ...
    /job:worker/replica:0/task:1
    The tasks have crashed. Check the task logs for an earlier error, ...
    E0000 ... ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: ...

so the line that says what happened and what follows (`error: lost contact ...
(exit 200)`) came fifth. `HeldPeerNoise` sends descriptor 2 through a pipe
while training runs; a thread copies every line through at once, except those
C++ log records (and their continuation lines), which it holds back. When the
lost peer is reported (`write_first`, inside the block or right after it ends
with the error), the report is written to the real stderr and the held lines
after it; held lines that no report follows within `hold_seconds` are written
as they came, as are those held when the block ends without an error (with
one: at the report, or at the latest when the process exits). Nothing is
dropped.
"""

import atexit
import os
import re
import select
import sys
import threading
import time

# C++ log records of an aborted collective or a lost coordination service.
_NOISE_START = re.compile(
    r"^[EW]\d{4} [\d:.]+ +\d+ (base_collective_executor|ring_alg|collective_\w+|"
    r"coordination_service\w*|hierarchical_tree_broadcaster|grpc_\w+|rpc_\w+)\.cc:\d+\]"
)
# The lines such a record goes on with (its status message has line breaks).
_CONTINUATION = re.compile(
    r"^(/job:|The tasks have crashed|The following tasks|The error could be|"
    r"Additional GRPC error|:\w+:Error received from peer|\s)"
)
_active: "HeldPeerNoise | None" = None
_deferred: list[bytes] = []  # held when a block ended with an error, until its report


class HeldPeerNoise:
    """While active, holds TensorFlow's C++ lines about a lost peer until it is reported.

    Use as a context manager around training; `write_first(text)` inside it.

    Args:
        hold_seconds: How long a held line waits for a report before it is
            written anyway.
    """

    def __init__(self, *, hold_seconds: float = 10.0):
        self._hold_seconds = hold_seconds
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._held_since: float | None = None
        self._holding_block = False
        self._reported = False
        self._saved_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._read_fd: int | None = None
        self._stopping = threading.Event()
        self._reports: dict[bytes, tuple[bytes, threading.Event]] = {}

    def __enter__(self) -> "HeldPeerNoise":
        global _active
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._copy, name="tfdist-stderr", daemon=True)
        self._thread.start()
        _active = self
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        global _active
        _active = None
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)
        # The thread drains the pipe, then stops (a child process may hold its other end).
        self._stopping.set()
        self._thread.join(timeout=10)
        with self._lock:
            if exc_type is not None and self._held and not self._reported:
                if not _deferred:
                    atexit.register(_write_deferred)
                _deferred.extend(self._held)
                self._held = []
            self._release()
        os.close(self._saved_fd)

    def write_first(self, text: str) -> None:
        """Writes `text` after every line written before it, then the lines held so far.

        The text travels through the pipe as a marker, so that it keeps its
        place among the lines before it.
        """
        sys.stderr.flush()
        done = threading.Event()
        marker = f"\0tfdist-report-{id(done)}\n".encode()
        with self._lock:
            self._reports[marker] = (text.encode(), done)
        os.write(2, marker)
        if not done.wait(timeout=5):
            with self._lock:
                if self._reports.pop(marker, None) is not None:
                    self._report(text.encode())

    def _report(self, data: bytes) -> None:
        self._reported = True
        os.write(self._saved_fd, data)
        self._release()

    # ------------------------------------------------------------- internal

    def _release(self) -> None:
        for line in self._held:
            os.write(self._saved_fd, line)
        self._held = []
        self._held_since = None

    def _line(self, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        with self._lock:
            report = self._reports.pop(line, None)
            if report is not None:
                self._report(report[0])
                report[1].set()
                return
            if self._reported:
                os.write(self._saved_fd, line)
                return
            if _NOISE_START.match(text):
                self._holding_block = True
            elif not _CONTINUATION.match(text):
                self._holding_block = False
            if self._holding_block:
                self._held.append(line)
                self._held_since = self._held_since or time.monotonic()
            else:
                os.write(self._saved_fd, line)

    def _copy(self) -> None:
        pending = b""
        while True:
            stopping = self._stopping.is_set()
            ready, _, _ = select.select([self._read_fd], [], [], 0 if stopping else 0.5)
            if not ready and stopping:
                break
            if ready:
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line + b"\n")
            with self._lock:
                since = self._held_since
                if since is not None and time.monotonic() - since > self._hold_seconds:
                    self._release()
        if pending:
            self._line(pending)
        os.close(self._read_fd)


def _write_deferred() -> None:
    lines = b"".join(_deferred)
    _deferred.clear()
    if lines:
        sys.stderr.flush()
        os.write(2, lines)


def write_first(text: str) -> None:
    """`text` to stderr, before any held TensorFlow lines (`HeldPeerNoise`), or as usual."""
    hold = _active
    if hold is not None:
        hold.write_first(text)
        return
    sys.stderr.write(text)
    sys.stderr.flush()
    _write_deferred()
