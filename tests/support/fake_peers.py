"""Stand-ins for another task of a job: one that answers, one that is frozen (not a test module)."""

import os
import signal
import socket
import subprocess
import sys
import threading

# What a gRPC server's first frame looks like: an empty HTTP/2 SETTINGS frame.
_SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# A process that answers every connection as `AnsweringPeer` does, until it is stopped.
_ANSWERING_PROCESS = (
    "import socket\n"
    "s = socket.create_server(('127.0.0.1', 0))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    with c:\n"
    "        c.settimeout(2.0)\n"
    "        try:\n"
    "            c.recv(64)\n"
    f"            c.sendall({_SETTINGS_FRAME!r})\n"
    "        except OSError:\n"
    "            pass\n"
)


class AnsweringPeer:
    """A loopback server that answers every connection as a gRPC server would; counts them.

    Use as a context manager; `address` is its `host:port`.
    """

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                continue
            with connection:
                connection.settimeout(2.0)
                try:
                    connection.recv(64)
                    connection.sendall(_SETTINGS_FRAME)
                except OSError:
                    pass
            self.connections += 1

    def __enter__(self) -> "AnsweringPeer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()


class FrozenPeer:
    """A process that answers on a loopback port like a gRPC server until `freeze()` stops it.

    `freeze()` sends SIGSTOP: the process stays alive and its kernel still
    completes TCP handshakes, but nothing answers. Use as a context manager;
    `address` is its `host:port`. Closing kills it (SIGKILL ends a stopped
    process too), so none is left behind.

    Args:
        frozen: Freeze it at once.
    """

    def __init__(self, *, frozen: bool = True):
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ANSWERING_PROCESS], stdout=subprocess.PIPE, text=True
        )
        try:
            port = int(self._process.stdout.readline())
            if frozen:
                self.freeze()
        except BaseException:
            self.close()
            raise
        self.address = f"127.0.0.1:{port}"

    def freeze(self) -> None:
        os.kill(self._process.pid, signal.SIGSTOP)

    def close(self) -> None:
        self._process.kill()
        self._process.wait(timeout=10)

    def __enter__(self) -> "FrozenPeer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
