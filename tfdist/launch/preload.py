"""Starting a local cluster's Python tasks from one process that imported TensorFlow once.

A Python task of a `LocalCluster` spends most of its start-up importing
TensorFlow (about 3 s of CPU); a cluster of four tasks restarted twice pays it
twelve times. With preloading, the cluster starts one server process that
imports the given modules once, before TensorFlow's runtime has started, and
forks every task from it: each task is still its own process, in its own
session, with its own environment, working directory, arguments, output,
signals and exit code, and it starts TensorFlow's runtime itself. This is how
TensorFlow tests its own multi-worker strategies (`multi_process_runner` forks
tasks from a forkserver that imported the test module).

    LocalCluster(..., preload=("tensorflow",))
    TFDIST_LAUNCH_PRELOAD=tensorflow python -m tfdist.launch --workers 2 -- python -m trainer.task

Only commands of this interpreter, `python -m MODULE ...` or `python SCRIPT.py
...`, are forked; any other command is started as before. What a preloaded
task does not get: the import of a preloaded module runs with the cluster's
environment, not the task's (the task's own variables, such as `TF_CONFIG`,
are set before its code runs, and TensorFlow reads those when its runtime
starts); `/proc/<pid>/environ` and `cmdline` show the server's. Off by default.
"""

import argparse
import importlib
import json
import os
import queue
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from typing import Mapping, Sequence

from tfdist.errors import UsageError

__all__ = [
    "PRELOAD_VARIABLE",
    "modules_from_environment",
    "forkable",
    "Preloader",
    "PreloaderPool",
    "serve",
    "main",
]

PRELOAD_VARIABLE = "TFDIST_LAUNCH_PRELOAD"
_START_SECONDS = 300.0
_REPLY_SECONDS = 60.0
_MESSAGE_BYTES = 1 << 22


def modules_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The modules `TFDIST_LAUNCH_PRELOAD` names (comma-separated); empty when unset."""
    return tuple(
        name.strip() for name in environ.get(PRELOAD_VARIABLE, "").split(",") if name.strip()
    )


def forkable(command: Sequence[str]) -> bool:
    """Whether `command` runs this interpreter on a module (`-m`) or a `.py` script."""
    if len(command) < 2:
        return False
    program = shutil.which(command[0])
    if program is None or os.path.realpath(program) != os.path.realpath(sys.executable):
        return False
    if command[1] == "-m":
        return len(command) >= 3 and not command[2].startswith("-")
    return command[1].endswith(".py") and os.path.isfile(command[1])


class Preloader:
    """The server process that imported `modules` and forks tasks from itself.

    Tasks may be started from several threads (one at a time: each start waits
    for its pid); exit codes arrive on a thread.
    """

    def __init__(self, modules: Sequence[str], *, env: Mapping[str, str], log_path: os.PathLike):
        """Starts the server and waits until it has imported `modules`.

        Args:
            modules: Module names to import once in the server.
            env: The server's environment: what the tasks share (the imports
                read it).
            log_path: Where the server's own output goes.

        Raises:
            UsageError: A module could not be imported, or importing it
                started TensorFlow's runtime (tasks could not configure it).
        """
        self._client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._replies: queue.Queue = queue.Queue()
        self._exit_codes: dict[int, int] = {}
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._closed = False
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    __name__,
                    f"--socket_fd={server.fileno()}",
                    f"--modules={','.join(modules)}",
                ],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(server.fileno(),),
            )
        server.close()
        self._reader = threading.Thread(target=self._read, name="preload-replies", daemon=True)
        self._reader.start()
        reply = self._reply(_START_SECONDS)
        if "ready" not in reply:
            self.close()
            raise UsageError(
                f"cannot preload {', '.join(modules)}: {reply.get('failed', reply)}; expected "
                f"modules that import without starting TensorFlow's runtime "
                f"(unset {PRELOAD_VARIABLE}, or pass --preload= to tfdist.launch, to start "
                f"tasks without preloading)"
            )

    def spawn(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        stdout_fd: int,
        stderr_fd: int | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> int:
        """Forks a task running `command`; returns its pid (it leads its own session).

        Its stdin is /dev/null, its stdout goes to `stdout_fd` and its stderr
        to `stderr_fd` (None: to `stdout_fd`), in `cwd` (None: this process's).
        """
        request = {"argv": list(command), "env": dict(env), "cwd": os.fspath(cwd or os.getcwd())}
        fds = [stdout_fd] if stderr_fd is None else [stdout_fd, stderr_fd]
        with self._spawn_lock:  # the reply that follows a request is its own
            socket.send_fds(self._client, [json.dumps(request).encode()], fds)
            reply = self._reply(_REPLY_SECONDS)
        if "started" not in reply:
            raise OSError(f"the preload server did not start the task: {reply}")
        return int(reply["started"])

    def exit_code(self, pid: int) -> int | None:
        """The task's `Popen`-style exit code once it has exited, else None.

        When the task's main process has exited, the server has killed what
        was left in its process group and reaped it.
        """
        with self._lock:
            if pid in self._exit_codes:
                return self._exit_codes[pid]
        if self._process.poll() is None:
            return None
        # The server is gone: nobody reaps this task any more, so end it here.
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return -signal.SIGKILL

    def alive(self) -> bool:
        """Whether the server still runs and can start tasks."""
        return not self._closed and self._process.poll() is None

    def close(self) -> None:
        """Ends the server, which kills the tasks still running."""
        if self._closed:
            return
        self._closed = True
        # shutdown, not only close: it wakes the reader's recv and tells the server.
        try:
            self._client.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._client.close()
        try:
            self._process.wait(timeout=_REPLY_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _reply(self, timeout: float) -> dict:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return {"failed": f"no answer from the preload server in {timeout:g} s"}

    def _read(self) -> None:
        while True:
            try:
                message = self._client.recv(_MESSAGE_BYTES)
            except OSError:
                message = b""
            if not message:
                self._replies.put({"failed": "the preload server exited"})
                return
            reply = json.loads(message)
            if "exited" in reply:
                with self._lock:
                    self._exit_codes[int(reply["exited"])] = int(reply["code"])
            else:
                if "started" in reply:  # a reused pid: forget the exit of its earlier task
                    with self._lock:
                        self._exit_codes.pop(int(reply["started"]), None)
                self._replies.put(reply)


# Variables a preloaded import does not read: servers may be shared across them.
_PER_RUN_PREFIXES = ("TF_CONFIG", "CLUSTER_SPEC", "AIP_", "CLOUD_ML_", "TFDIST_", "PYTEST_")


class PreloaderPool:
    """Preload servers kept for reuse: one per module list and environment.

    A test session starts many clusters and runs: with a pool, one import of
    TensorFlow serves every cluster and run whose environment matches (variables a
    preloaded import never reads, such as `TF_CONFIG`, Vertex's `AIP_*`, `TFDIST_*`
    and pytest's `PYTEST_*`, are ignored: each task still gets its own). The pool
    owns its servers: `close()` ends them. Thread-safe.

        pool = PreloaderPool()
        LocalCluster(..., preload_servers=pool.get)
    """

    def __init__(self, log_path: os.PathLike | str = os.devnull):
        self._log_path = log_path
        self._servers: dict[tuple, Preloader] = {}
        self._lock = threading.Lock()

    def get(self, modules: Sequence[str], env: Mapping[str, str]) -> Preloader:
        """The pool's server for `modules` in `env`, started (once) if needed."""
        # The server runs without them too: a test's process tag, say, is not the server's.
        shared = {k: v for k, v in env.items() if not k.startswith(_PER_RUN_PREFIXES)}
        key = (tuple(modules), tuple(sorted(shared.items())))
        with self._lock:
            server = self._servers.get(key)
            if server is None or not server.alive():
                server = Preloader(modules, env=shared, log_path=self._log_path)
                self._servers[key] = server
            return server

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


# ---------------------------------------------------------------- the server


def _become_task(
    request: dict, fds: Sequence[int], connection: socket.socket, in_session: int
) -> None:
    """In the forked child: becomes `python ARGS` and runs its code.

    Writes to `in_session` once it leads its own session, so that its process
    group exists before anyone is told its pid. The code's `SystemExit` or
    exception ends the interpreter as it would end `python ARGS`.
    """
    os.setsid()
    os.write(in_session, b"1")
    os.close(in_session)
    connection.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(fds[0], 1)
    os.dup2(fds[-1], 2)
    for fd in set(fds):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    arguments = request["argv"][1:]
    if arguments[0] == "-m":
        sys.path[0] = os.getcwd()
        sys.argv = ["-m", *arguments[2:]]  # run_module puts the module's file first
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(arguments[0]))
        sys.argv = list(arguments)
        runpy.run_path(arguments[0], run_name="__main__")


def _runtime_started(tensorflow) -> bool:
    """Whether TensorFlow's runtime has started (its thread counts are then fixed)."""
    threads = tensorflow.config.threading
    try:
        threads.set_inter_op_parallelism_threads(threads.get_inter_op_parallelism_threads())
    except RuntimeError:
        return True
    return False


def _preload(modules: Sequence[str]) -> str | None:
    """Imports `modules`; returns what went wrong, or None."""
    from tfdist._internal import startup_logs  # pylint: disable=g-import-not-at-top

    for name in modules:
        try:
            if name == "tensorflow":
                startup_logs.import_tensorflow_quietly()
            else:
                importlib.import_module(name)
        except Exception as error:  # pylint: disable=broad-except  (reported to the client)
            return f"importing {name} failed: {type(error).__name__}: {error}"
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is not None and _runtime_started(tensorflow):
        return "TensorFlow's runtime had started after the imports"
    return None


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.send(json.dumps(message).encode())
    except OSError:
        pass  # the client is gone; the loop ends at its next read


def _reap(connection: socket.socket, live: set[int]) -> None:
    """Reports every task that has exited, after killing what its group left."""
    while live:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        pid = info.si_pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
        live.discard(pid)
        _send(connection, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(connection: socket.socket, modules: Sequence[str]) -> int:
    """The server's loop: forks a task per request until the client closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cluster forwards signals to tasks
    problem = _preload(modules)
    if problem is not None:
        _send(connection, {"failed": problem})
        return 1
    _send(connection, {"ready": True})
    server = os.getpid()
    live: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable:
                message, fds, _, _ = socket.recv_fds(connection, _MESSAGE_BYTES, 2)
                if not message:
                    break
                request = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                ready, in_session = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(ready)
                    _become_task(request, fds, connection, in_session)
                    # The task's code returned: the interpreter exits 0 and
                    # finalizes as `python ARGS` would.
                    return 0
                os.close(in_session)
                os.read(ready, 1)  # b"" if the child died first: then it has no group
                os.close(ready)
                for fd in fds:
                    os.close(fd)
                live.add(pid)
                _send(connection, {"started": pid})
            _reap(connection, live)
    except BaseException:
        if os.getpid() == server:  # not a task's own exit or error
            _end_tasks(live)
        raise
    _end_tasks(live)
    return 0


def _end_tasks(live: set[int]) -> None:
    for pid in live:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in live:
        os.waitpid(pid, 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="tfdist's preload server (started by LocalCluster)"
    )
    parser.add_argument("--socket_fd", type=int, required=True)
    parser.add_argument("--modules", default="")
    options = parser.parse_args(argv)
    connection = socket.socket(fileno=options.socket_fd)
    modules = [name for name in options.modules.split(",") if name]
    return serve(connection, modules)


if __name__ == "__main__":
    sys.exit(main())
