"""Trainer runs that fail before training, each its own process forked from one import of TensorFlow.

results = run_forked_trainers([["--task=...", "--model_dir=..."], ...], cwd=REPO, env=..., timeout=300)

Each result is a `subprocess.CompletedProcess` of one `python -m trainer.task ARGS`
(its own exit code, stdout and stderr), as `logged_process.run_side_by_side`
returns them; `tests/jobs/forked_trainer_runs.py` says how. A run costs a fork
and what the trainer does before it fails instead of a TensorFlow import each
(about 4.5 s of CPU).
"""

import json
import pathlib
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

_RUNNER = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "forked_trainer_runs.py"


def run_forked_trainers(
    runs: Sequence[Sequence[str]],
    *,
    cwd,
    env: Mapping[str, str],
    timeout: float,
    run_envs: Sequence[Mapping[str, str | None]] | None = None,
) -> list[subprocess.CompletedProcess]:
    """Runs `python -m trainer.task *args` for each of `runs`; results in order.

    Args:
        runs: Each run's arguments.
        cwd: The working directory of every run.
        env: The environment of every run.
        timeout: Seconds after which a run still going is killed.
        run_envs: Per run, variables to set in its environment on top of `env`
            (`None`: to unset).
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
        runner = subprocess.run(
            [
                sys.executable,
                str(_RUNNER),
                f"--runs={root / 'runs.json'}",
                f"--out={root / 'out'}",
                f"--timeout={timeout}",
            ],
            cwd=cwd,
            env=dict(env),
            capture_output=True,
            text=True,
            # The children's own timeout, plus the runner's import of TensorFlow.
            timeout=timeout + 120,
            check=False,
        )
        assert runner.returncode == 0, (
            f"the runner exited {runner.returncode}\n{runner.stdout[-3000:]}\n"
            f"{runner.stderr[-3000:]}"
        )
        codes = json.loads((root / "out" / "codes.json").read_text())
        return [
            subprocess.CompletedProcess(
                [sys.executable, "-m", "trainer.task", *args],
                code,
                (root / "out" / f"{index}.stdout").read_text(errors="replace"),
                (root / "out" / f"{index}.stderr").read_text(errors="replace"),
            )
            for index, (args, code) in enumerate(zip(runs, codes, strict=True))
        ]
