"""`python -m tfdist.launch`: exit codes, signals, restarts, timeouts, logs.

The tasks are tiny Python scripts (tests/jobs/cluster_task.py), not TensorFlow.
Every launcher run carries a tag in its environment, and each test checks
that no tagged process (task or grandchild) is left afterwards.
"""

import os
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

from tfdist.launch import preload
from tfdist.launch.testing import PROCESS_TAG_ENV, poll_until, tagged_processes

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = str(REPO_ROOT / "tests" / "jobs" / "cluster_task.py")
WAIT_SECONDS = 30


# Every test twice: with fresh tasks and with tasks forked from a preload server (conftest).
pytestmark = pytest.mark.usefixtures("task_start")


class Launch:
    """One launcher process, tagged so its leftovers can be found."""

    def __init__(self, launcher_args, mode, out_dir):
        self.tag = uuid.uuid4().hex
        command = [
            sys.executable,
            "-m",
            "tfdist.launch",
            "--grace_period=2",
            *launcher_args,
            "--",
            sys.executable,
            TASK,
            mode,
            str(out_dir),
        ]
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, PROCESS_TAG_ENV: self.tag, "PYTHONPATH": str(REPO_ROOT)},
        )
        self.stdout = self.stderr = ""

    def finish(self):
        """Waits for the launcher, then checks that nothing it started is left."""
        try:
            self.stdout, self.stderr = self.process.communicate(timeout=WAIT_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        poll_until(
            lambda: not tagged_processes(self.tag),
            timeout=5,
            what=f"the launcher's processes to be gone:\n{self.output}",
        )
        return self.process.returncode

    @property
    def output(self):
        return f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def run_launch(launcher_args, mode, out_dir):
    launch = Launch(launcher_args, mode, out_dir)
    return launch.finish(), launch


def test_success_prefixes_output_and_writes_per_task_logs(tmp_path):
    log_dir = tmp_path / "logs"
    code, launch = run_launch(["--workers=2", "--chief", f"--log_dir={log_dir}"], "exit0", tmp_path)
    assert code == 0, launch.output
    for task, stem in (("chief:0", "chief-0"), ("worker:0", "worker-0"), ("worker:1", "worker-1")):
        assert f"[{task}] hello from {stem}\n" in launch.stdout, launch.output
        assert (log_dir / f"{stem}.log").read_text() == f"hello from {stem}\n"
    # Roles and ports are announced; TF_CONFIG itself never is.
    assert "worker:1 at 127.0.0.1:" in launch.stderr
    assert '"cluster"' not in launch.stdout + launch.stderr


@pytest.mark.parametrize("failing_code", [3, 143])
def test_exit_code_of_the_first_failing_task_and_others_stopped(tmp_path, failing_code):
    code, launch = run_launch(["--workers=2", "--chief"], f"worker1_exits_{failing_code}", tmp_path)
    assert code == failing_code, launch.output
    assert f"worker:1 exited with code {failing_code}; stopping the other tasks" in launch.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_the_launcher_reach_every_task(tmp_path, sig):
    launch = Launch(["--workers=2", "--chief"], "preempt", tmp_path)
    stems = ("chief-0", "worker-0", "worker-1")
    try:
        poll_until(
            lambda: all((tmp_path / f"{stem}.ready").exists() for stem in stems),
            timeout=WAIT_SECONDS,
            what="every task to install its signal handler",
        )
    finally:
        launch.process.send_signal(sig)
    code = launch.finish()
    assert code == 128 + sig, launch.output
    for stem in stems:
        assert (tmp_path / f"{stem}.signal").read_text() == str(int(sig)), stem


def test_no_orphans_including_grandchildren(tmp_path):
    code, launch = run_launch(["--workers=2"], "grandchild", tmp_path)
    assert code == 3, launch.output
    # finish() already found no tagged process; check the grandchildren by pid too.
    for stem in ("worker-0", "worker-1"):
        pid = int((tmp_path / f"{stem}.grandchild").read_text())
        assert (
            not pathlib.Path(f"/proc/{pid}").exists()
            or " Z " in pathlib.Path(f"/proc/{pid}/stat").read_text()
        ), stem


@pytest.mark.parametrize("failing_code", [5, 143])
def test_restart_on_failure_restarts_the_whole_cluster(tmp_path, failing_code):
    code, launch = run_launch(
        ["--workers=2", "--restart_on_failure=1"], f"fail_once_{failing_code}", tmp_path
    )
    assert code == 0, launch.output
    assert (
        f"worker:1 exited with code {failing_code}; restarting the whole cluster (restart 1 of 1)"
    ) in launch.stderr
    assert launch.stdout.count("[worker:0] hello from worker-0") == 2, launch.output


def test_without_restarts_the_failure_is_final(tmp_path):
    code, launch = run_launch(["--workers=2", "--restart_on_failure=0"], "fail_once_5", tmp_path)
    assert code == 5, launch.output
    assert "restarting" not in launch.stderr


def test_timeout_stops_every_task(tmp_path):
    code, launch = run_launch(["--workers=2", "--timeout=1"], "block", tmp_path)
    assert code == 124, launch.output
    assert "still running after 1 s: worker:0, worker:1" in launch.stderr


def test_parameter_server_job_is_done_when_the_chief_is(tmp_path):
    # The ps and worker tasks would serve for a minute: finish() shows they
    # were stopped once the chief exited 0.
    code, launch = run_launch(["--workers=2", "--ps=1", "--chief"], "ps_job", tmp_path)
    assert code == 0, launch.output
    assert (tmp_path / "chief.done").exists()
    assert "exited with code" not in launch.stderr, launch.output


def test_the_evaluator_is_waited_for_after_the_chief(tmp_path):
    # The evaluator exits 7 only after the chief has finished: the launcher
    # reports 7 only if it waited for the evaluator instead of stopping it.
    code, launch = run_launch(
        ["--workers=1", "--ps=1", "--chief", "--evaluator"], "ps_job_7", tmp_path
    )
    assert code == 7, launch.output
    assert "evaluator:0 exited with code 7" in launch.stderr


def test_the_preload_flag_wins_over_the_variable(tmp_path, task_start, monkeypatch):
    # The variable names a module that does not exist: only the flag can make this run.
    monkeypatch.setenv(preload.PRELOAD_VARIABLE, "tfdist_no_such_module")
    flag = "--preload=" if task_start == "fresh" else "--preload=json"
    code, launch = run_launch(["--workers=2", flag], "exit0", tmp_path)
    assert code == 0, launch.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers=2", "python", "task.py"], "expected only flags there"),
        (["--workers=2", "--"], "no command to run"),
        (["--", "python", "task.py"], "--workers is not set"),
        (["--workers=1", "--host=10.1.2.3", "--", "python", "task.py"], "not a loopback address"),
        (["--workers=1", "--ps=1", "--", "python", "task.py"], "no chief"),
        (["--workers=1", "--", "no-such-program-tfdist"], "cannot run command"),
        (["--workers=x", "--", "python", "task.py"], "--workers"),
        (
            [
                "--workers=1",
                "--preload=tfdist_no_such_module",
                "--",
                sys.executable,
                TASK,
                "exit0",
                ".",
            ],
            "cannot preload tfdist_no_such_module: importing tfdist_no_such_module failed",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.launch", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
