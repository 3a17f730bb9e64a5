"""Trainer runs that fail before training, each its own process forked from one import of TensorFlow.

results = run_forked_trainers([["--task=...", "--model_dir=..."], ...], cwd=REPO, env=..., timeout=300)

Each result is a `subprocess.CompletedProcess` of one `python -m trainer.task ARGS`
(its own exit code, stdout and stderr), as `logged_process.run_side_by_side`
returns them; `tests/jobs/forked_trainer_runs.py` says how. A run costs a fork
and what the trainer does before it fails instead of a TensorFlow import each
(about 4.5 s of CPU).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Mapping, Sequence

_RUNNER = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "forked_trainer_runs.py"


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
        timeout: Seconds after which a run still going is killed.
        run_envs: Per run, variables to set in its environment on top of `env`
            (`None`: to unset).
        stop_when: Called while the runs go on; once it returns True the runner
            and every run are killed at once, and each result's returncode is None.
    """
    run_envs = run_envs or [{}] * len(runs)
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)
        (root / "runs.json").write_text(
            json.dumps(
                [
                    {"args": list(args), "env": dict(run_env)}
                    for args, run_env in zip(runs, run_envs, strict=True)
                ]
            )
        )
        log = open(root / "runner.log", "wb")  # pylint: disable=consider-using-with
        runner = subprocess.Popen(
            [
                sys.executable,
                str(_RUNNER),
                f"--runs={root / 'runs.json'}",
                f"--out={root / 'out'}",
                f"--timeout={timeout}",
            ],
            cwd=cwd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            # The runner and its children, to stop them all at once.
            start_new_session=True,
        )
        # The children's own timeout, plus the runner's import of TensorFlow.
        deadline = time.monotonic() + timeout + 120
        stopped = False
        try:
            while runner.poll() is None and time.monotonic() < deadline:
                if stop_when is not None and stop_when():
                    stopped = True
                    break
                try:
                    runner.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
            log.close()
        output = _read(root / "runner.log")
        if stopped:
            return [
                subprocess.CompletedProcess(
                    [sys.executable, "-m", "trainer.task", *args],
                    None,
                    _read(root / "out" / f"{index}.stdout"),
                    _read(root / "out" / f"{index}.stderr") + "\n(stopped: stop_when() held)",
                )
                for index, args in enumerate(runs)
            ]
        assert runner.returncode == 0, f"the runner exited {runner.returncode}\n{output[-5000:]}"
        codes = json.loads((root / "out" / "codes.json").read_text())
        return [
            subprocess.CompletedProcess(
                [sys.executable, "-m", "trainer.task", *args],
                code,
                _read(root / "out" / f"{index}.stdout"),
                _read(root / "out" / f"{index}.stderr"),
            )
            for index, (args, code) in enumerate(zip(runs, codes, strict=True))
        ]


def _read(path: pathlib.Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
