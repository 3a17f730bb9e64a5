"""One process of a test job, its output kept in a log file (not a test module).

process = start_logged([sys.executable, "-m", "trainer.task", ...], out_dir, cwd=REPO)
code = finish(process, timeout=120)   # kills it if the timeout passes
print(log_tail(process))

With `TFDIST_LAUNCH_PRELOAD` set (tests/conftest.py sets it), a command of this
interpreter on a module or a script is forked from a preload server of this
pytest process (`tfdist.launch.preload`, one per distinct environment), as local
clusters fork their tasks: still its own process, pid, session, environment,
output and exit code, without importing TensorFlow again.
"""

import os
import pathlib
import signal
import subprocess
import tempfile
import time
from typing import Mapping, Sequence

from tfdist.launch import preload
from tfdist.launch.testing import SHARED_PRELOADERS

LOG_NAME = "log.txt"
_REPO = pathlib.Path(__file__).resolve().parents[2]


def clean_environment() -> dict:
    """This process's environment without cluster variables or Vertex directories.

    The repository goes first on `PYTHONPATH`, so scripts started by path
    import this checkout's `tfdist` whether or not it is installed.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC") and not key.startswith("AIP_")
    }
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")])),
    )
    return env


class ForkedProcess:
    """A process forked by a preload server, with the `Popen` methods tests use."""

    def __init__(self, preloader: preload.Preloader, command: Sequence[str], pid: int):
        self.args = list(command)
        self.pid = pid
        self.returncode: int | None = None
        self._preloader = preloader

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._preloader.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _preloader(env: Mapping[str, str]) -> preload.Preloader | None:
    """The shared server of this pytest process for `env` (tfdist.launch.testing)."""
    modules = preload.modules_from_environment(env)
    return SHARED_PRELOADERS.get(modules, env) if modules else None


def start(
    command: Sequence[str], *, cwd, env: Mapping[str, str], stdout, stderr
) -> subprocess.Popen | ForkedProcess:
    """`subprocess.Popen(command, ...)`, or the same run forked from a preload server.

    `stdout` and `stderr` are open files (`stderr` may be `subprocess.STDOUT`).
    """
    server = _preloader(env) if preload.forkable(command) else None
    if server is None:
        return subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr)
    err = None if stderr == subprocess.STDOUT else stderr.fileno()
    pid = server.spawn(command, env=env, stdout_fd=stdout.fileno(), stderr_fd=err, cwd=cwd)
    return ForkedProcess(server, command, pid)


def start_logged(command: list[str], out_dir: pathlib.Path, *, cwd) -> subprocess.Popen:
    """Starts `command` with stdout and stderr in `<out_dir>/log.txt`."""
    log = open(out_dir / LOG_NAME, "wb")  # pylint: disable=consider-using-with
    process = start(command, cwd=cwd, env=clean_environment(), stdout=log, stderr=subprocess.STDOUT)
    process.out, process.log = out_dir, log
    return process


def finish(process: subprocess.Popen, timeout: float) -> int:
    """Waits for the exit code; kills the process if it outlives `timeout`."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log.close()


def log_tail(process: subprocess.Popen, chars: int = 6000) -> str:
    return (process.out / LOG_NAME).read_text(errors="replace")[-chars:]


def run_side_by_side(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], *, cwd, timeout: float
) -> list[subprocess.CompletedProcess]:
    """Runs independent `(command, environment)` pairs all at once; results in order.

    Output goes to temporary files, not pipes, so that none blocks on a full
    pipe while another is waited for; every process still running when a wait
    times out (or fails) is killed.
    """
    started = []
    try:
        for command, environ in commands:
            stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            started.append(
                (
                    start(command, cwd=cwd, env=environ, stdout=stdout, stderr=stderr),
                    stdout,
                    stderr,
                )
            )
        results = []
        for process, stdout, stderr in started:
            code = process.wait(timeout=timeout)
            stdout.seek(0)
            stderr.seek(0)
            results.append(
                subprocess.CompletedProcess(
                    process.args,
                    code,
                    stdout.read().decode(errors="replace"),
                    stderr.read().decode(errors="replace"),
                )
            )
        return results
    finally:
        for process, stdout, stderr in started:
            if process.poll() is None:
                process.kill()
                process.wait()
            stdout.close()
            stderr.close()


def run_forked(
    command: Sequence[str], *, cwd, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, timeout=...)` through `start`.

    Forked from a preload server when `TFDIST_LAUNCH_PRELOAD` is set (about 3 s of CPU
    less than a fresh import of TensorFlow; the server is shared by every run of this
    pytest process with the same environment, `clean_environment()` for most). For
    runs whose start-up is not what is tested.
    """
    return run_side_by_side([(command, env)], cwd=cwd, timeout=timeout)[0]
