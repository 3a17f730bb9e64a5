"""The examples under examples/ run as a user would run them."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.support.logged_process import clean_environment, run_forked

REPO = pathlib.Path(__file__).resolve().parents[2]
CUSTOM_SCRIPT = REPO / "examples" / "custom_script.py"
TIMEOUT = 300  # A backstop against hangs, never a speed assertion.


def run_example(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # Forked from one import of TensorFlow (tests/support/logged_process.py): the
    # script runs as `python SCRIPT` would, in a process of its own.
    return run_forked(
        [sys.executable, str(CUSTOM_SCRIPT), *args],
        cwd=REPO,
        env={**clean_environment(), **(env or {})},
        timeout=TIMEOUT,
    )


def describe(result: subprocess.CompletedProcess) -> str:
    return (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-5000:]}"
    )


@pytest.mark.parametrize(
    "strategy, expected_class",
    [
        ("default", "_DefaultDistributionStrategy"),
        ("multiworker", "CollectiveAllReduceStrategy"),
    ],
    ids=["default", "multiworker-without-cluster"],
)
def test_custom_script_trains_under(strategy, expected_class):
    result = run_example(f"--strategy={strategy}", "--epochs=2", "--steps_per_epoch=15")
    assert result.returncode == 0, describe(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["strategy"] == expected_class
    assert report["num_replicas"] == 1
    assert report["steps_completed"] == 30
    assert report["accuracy"] > 0.6, report  # 3 classes: chance is 1/3.


def test_custom_script_bad_strategy_is_one_line_and_exit_2():
    result = run_example("--strategy=mirored")
    assert result.returncode == 2, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    error_lines = [line for line in lines if line.startswith("error:")]
    assert error_lines == [lines[-1]], describe(result)
    assert "'mirored'" in error_lines[0] and "multiworker" in error_lines[0]
    assert result.stdout == ""
