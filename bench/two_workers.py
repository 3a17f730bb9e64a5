"""Runs one benchmark script as a 2-worker local cluster and reads the chief's result."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def child_environ() -> dict:
    """This environment without cluster variables, with the repository importable."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC") and not key.startswith("AIP_")
    }
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return environ


def run_two_workers(script: str, *args: str, what: str, timeout: float = 1000) -> dict:
    """Runs `python SCRIPT --side=worker --result=FILE ARGS` on 2 workers (`tfdist.launch`).

    Returns:
        The JSON the chief wrote to FILE.

    Raises:
        RuntimeError: A task failed; the message holds the tail of every task's log.
    """
    with tempfile.TemporaryDirectory() as scratch:
        result = pathlib.Path(scratch) / "result.json"
        command = [
            sys.executable,
            "-m",
            "tfdist.launch",
            "--workers=2",
            "--quiet",
            f"--log_dir={scratch}/logs",
            f"--timeout={int(timeout) - 100}",
            "--",
            sys.executable,
            script,
            "--side=worker",
            f"--result={result}",
            *args,
        ]
        completed = subprocess.run(
            command,
            cwd=REPO,
            env=child_environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if completed.returncode != 0:
            logs = "".join(
                path.read_text()[-2000:]
                for path in sorted(pathlib.Path(scratch, "logs").glob("*.log"))
            )
            raise RuntimeError(f"{what} exited {completed.returncode}:\n{logs}")
        return json.loads(result.read_text())
