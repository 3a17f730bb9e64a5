"""One process of a test job, its output kept in a log file (not a test module).

process = start_logged([sys.executable, "-m", "trainer.task", ...], out_dir, cwd=REPO)
code = finish(process, timeout=120)   # kills it if the timeout passes
print(log_tail(process))
"""

import os
import pathlib
import subprocess
import tempfile
from typing import Mapping, Sequence

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


def start_logged(command: list[str], out_dir: pathlib.Path, *, cwd) -> subprocess.Popen:
    """Starts `command` with stdout and stderr in `<out_dir>/log.txt`."""
    log = open(out_dir / LOG_NAME, "wb")  # pylint: disable=consider-using-with
    process = subprocess.Popen(
        command, cwd=cwd, env=clean_environment(), stdout=log, stderr=subprocess.STDOUT
    )
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
                    subprocess.Popen(
                        list(command), cwd=cwd, env=dict(environ), stdout=stdout, stderr=stderr
                    ),
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
