"""Several `python -m trainer.task` runs side by side, with a way to stop them all early.

results = run_forked_trainers([["--task=...", "--model_dir=..."], ...], cwd=REPO, env=..., timeout=300)

Each result is a `subprocess.CompletedProcess` of one `python -m trainer.task ARGS`
(its own exit code, stdout and stderr), as `logged_process.run_side_by_side`
returns them. Runs start through `logged_process.start`, so with
`TFDIST_LAUNCH_PRELOAD` set (tests/conftest.py) each is forked from a preload
server instead of importing TensorFlow again (about 3 s of CPU a run).
"""

import subprocess
import sys
import tempfile
import time
from typing import Callable, Mapping, Sequence

from tests.support.logged_process import start


def _environment(env: Mapping[str, str], run_env: Mapping[str, str | None]) -> dict:
    merged = dict(env)
    for key, value in run_env.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def run_forked_trainers(
    runs: Sequence[Sequence[str]],
    *,
    cwd,
    env: Mapping[str, str],
    timeout: float,
    run_envs: Sequence[Mapping[str, str | None]] | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> list[subprocess.CompletedProcess]:
    """Runs `python -m trainer.task *args` for each of `runs`; results in order.

    Args:
        runs: Each run's arguments.
        cwd: The working directory of every run.
        env: The environment of every run.
        timeout: Seconds after which the runs still going are killed (their
            returncode is then None).
        run_envs: Per run, variables to set in its environment on top of `env`
            (`None`: to unset).
        stop_when: Called while the runs go on; once it returns True every run
            still going is killed at once, and each result's returncode is None.
    """
    run_envs = run_envs or [{}] * len(runs)
    started = []
    try:
        for args, run_env in zip(runs, run_envs, strict=True):
            command = [sys.executable, "-m", "trainer.task", *args]
            stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            started.append(
                (
                    command,
                    start(
                        command,
                        cwd=cwd,
                        env=_environment(env, run_env),
                        stdout=stdout,
                        stderr=stderr,
                    ),
                    stdout,
                    stderr,
                )
            )
        deadline = time.monotonic() + timeout
        stopped = False
        while any(process.poll() is None for _, process, _, _ in started):
            if stop_when is not None and stop_when():
                stopped = True
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        results = []
        for command, process, stdout, stderr in started:
            if process.poll() is None:
                process.kill()
                process.wait()
                code = None
            else:
                code = None if stopped else process.returncode
            stdout.seek(0)
            stderr.seek(0)
            note = "\n(stopped: stop_when() held)" if stopped else ""
            results.append(
                subprocess.CompletedProcess(
                    command,
                    code,
                    stdout.read().decode(errors="replace"),
                    stderr.read().decode(errors="replace") + note,
                )
            )
        return results
    finally:
        for _, process, stdout, stderr in started:
            if process.poll() is None:
                process.kill()
                process.wait()
            stdout.close()
            stderr.close()
