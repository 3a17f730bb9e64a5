"""Peers that fail without dying, and tasks that keep no state: what each exits with.

- A frozen task (SIGSTOP: alive, silent) is a lost task: the others exit 200 within
  `--peer_timeout_seconds` plus a few seconds. One job per strategy, each with a short
  timeout: a parameter-server job (chief, 2 workers, 1 ps) whose worker 1 is frozen after
  the first backup, and a 2-worker multiworker job whose worker 1 is frozen the same way.
  Every frozen task is killed by the cluster at teardown (SIGKILL ends a stopped process).
- Single tasks of a parameter-server job, run side by side against stand-in chiefs: a
  worker whose chief never comes up exits 200 (retried), not 1; a ps task and an evaluator
  that get SIGTERM exit 201 ("stopped, nothing saved here"), not 143 ("state saved").
"""

import concurrent.futures
import json
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.backup_files import committed_steps
from tests.support.fake_peers import AnsweringPeer
from tests.support.logged_process import clean_environment, start
from tfdist.launch.local_cluster import LocalCluster, pick_free_ports
from tfdist.launch.testing import PROCESS_TAG_ENV, poll_until, tagged_processes

REPO = pathlib.Path(__file__).resolve().parents[2]

ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
PEER_TIMEOUT = 10
# The documented bound is the timeout plus a few seconds of probing; the rest is
# slack for a machine shared by many test runs.
BOUND = PEER_TIMEOUT + 30
JOB_TIMEOUT = 240
TAG = uuid.uuid4().hex  # marks this module's processes, to find any left behind


def _trainer(out, *flags):
    return [
        sys.executable,
        "-m",
        "trainer.task",
        "--model=mlp",
        "--num_examples=1024",
        "--global_batch_size=32",
        "--epochs=1",
        "--steps_per_epoch=4000",
        "--backup_every_steps=10",
        "--steps_per_execution=1",
        f"--peer_timeout_seconds={PEER_TIMEOUT}",
        f"--model_dir={out}/model",
        f"--backup_dir={out}/backup",
        *flags,
    ]


def _freeze_after_first_backup(cluster, out, task: str) -> float:
    poll_until(
        lambda: committed_steps(out / "backup") or cluster.first_failure,
        timeout=JOB_TIMEOUT,
        what="the first backup",
    )
    assert committed_steps(out / "backup"), cluster.format_logs()
    assert cluster.kill(task, signal.SIGSTOP), cluster.format_logs()
    return time.monotonic()


# strategy -> (the cluster, the survivor whose exit is the job's verdict, its error line)
FROZEN_CASES = {
    "parameter_server": (
        {"num_workers": 2, "num_ps": 1, "has_chief": True},
        "chief:0",
        "error: lost contact with worker:1 at 127.0.0.1:",
    ),
    "multiworker": ({"num_workers": 2}, "worker:0", "error: lost contact with another task"),
}


def _frozen_run(strategy: str, out: pathlib.Path) -> dict:
    """One job of `strategy` whose worker 1 is frozen after the first backup; what followed."""
    layout, survivor, _ = FROZEN_CASES[strategy]
    cluster = LocalCluster(
        **layout,
        env={**ENV, PROCESS_TAG_ENV: TAG},
        grace_period=5.0,
        log_dir=out / "logs",
        command=_trainer(out, f"--strategy={strategy}"),
    )
    with cluster:  # closing kills every task; SIGKILL ends a stopped one too
        frozen_at = _freeze_after_first_backup(cluster, out, "worker:1")
        codes = cluster.wait(timeout=JOB_TIMEOUT)
        took = time.monotonic() - frozen_at
        return {
            "code": codes[survivor],
            "log": cluster.log(survivor),
            "logs": cluster.format_logs(),
            "took": took,
            "summary_written": (out / "model" / "summary.json").exists(),
            "backups": committed_steps(out / "backup"),
        }


@pytest.fixture(scope="module")
def frozen_runs(tmp_path_factory):
    """Both frozen-worker jobs at once (their waits overlap); strategy -> what followed."""
    out = tmp_path_factory.mktemp("frozen")
    try:
        with concurrent.futures.ThreadPoolExecutor(len(FROZEN_CASES)) as pool:
            futures = {name: pool.submit(_frozen_run, name, out / name) for name in FROZEN_CASES}
            return {name: future.result() for name, future in futures.items()}
    finally:
        leftovers = tagged_processes(TAG)
        assert not leftovers, f"processes left behind: {leftovers}"


@pytest.mark.parametrize("strategy", sorted(FROZEN_CASES))
def test_a_frozen_worker_makes_the_survivors_exit_200_within_the_bound(frozen_runs, strategy):
    _, survivor, error_line = FROZEN_CASES[strategy]
    run = frozen_runs[strategy]
    assert run["code"] == 200, run["logs"]
    assert error_line in run["log"], run["log"][-3000:]
    assert run["took"] < BOUND, f"{survivor} took {run['took']:.0f} s\n{run['logs']}"
    assert not run["summary_written"]
    assert run["backups"]  # what the restarted job resumes from


# ------------------------------------------------------- single tasks, side by side

GRACE = 3


def _role(out: pathlib.Path, task: str, chief: str, *flags):
    """Starts `trainer.task` as `task` (`ps:0`) of a parameter-server job whose chief is at `chief`."""
    role, index = task.split(":")
    worker, ps, evaluator = (f"127.0.0.1:{port}" for port in pick_free_ports("127.0.0.1", 3))
    tf_config = {
        "cluster": {"chief": [chief], "worker": [worker], "ps": [ps], "evaluator": [evaluator]},
        "task": {"type": role, "index": int(index)},
    }
    out.mkdir(parents=True)
    log = open(out / "log.txt", "wb")  # pylint: disable=consider-using-with
    command = [
        sys.executable,
        "-m",
        "trainer.task",
        "--strategy=parameter_server",
        "--model=mlp",
        "--num_examples=256",
        "--steps_per_epoch=5",
        f"--model_dir={out}/model",
        f"--preemption_grace_seconds={GRACE}",
        *flags,
    ]
    env = {**clean_environment(), "TF_CONFIG": json.dumps(tf_config)}
    process = start(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    process.out, process.log_file = out, log
    return process


def _log(process) -> str:
    return (process.out / "log.txt").read_text(errors="replace")


@pytest.fixture(scope="module")
def single_tasks(tmp_path_factory):
    """Runs the three single-task cases at once; returns name -> (exit code, log, seconds)."""
    out = tmp_path_factory.mktemp("single_tasks")
    (late_chief,) = pick_free_ports("127.0.0.1", 1)  # nothing ever listens there
    with AnsweringPeer() as ps_chief, AnsweringPeer() as evaluator_chief:
        processes = {
            "late_chief": _role(
                out / "late",
                "worker:0",
                f"127.0.0.1:{late_chief}",
                "--chief_start_timeout_seconds=3",
            ),
            "ps_sigterm": _role(out / "ps", "ps:0", ps_chief.address),
            "evaluator_sigterm": _role(out / "evaluator", "evaluator:0", evaluator_chief.address),
        }
        signalled = {}
        try:
            # Each task probes its chief once it is serving (ps) or waiting for
            # checkpoints (evaluator): then its SIGTERM handling is in place.
            for name, chief in (("ps_sigterm", ps_chief), ("evaluator_sigterm", evaluator_chief)):
                process = processes[name]
                poll_until(
                    lambda chief=chief, process=process: (
                        chief.connections > 0 or process.poll() is not None
                    ),
                    timeout=180,
                    what=f"{name}: the first probe of its chief",
                )
                process.send_signal(signal.SIGTERM)
                signalled[name] = time.monotonic()
            results = {}
            for name, process in processes.items():
                code = process.wait(timeout=180)
                took = time.monotonic() - signalled[name] if name in signalled else None
                results[name] = (code, _log(process), took)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=30)
                process.log_file.close()
    return results


def test_a_worker_whose_chief_never_comes_up_exits_200_which_restart_policies_retry(
    single_tasks,
):
    code, log, _ = single_tasks["late_chief"]
    assert code == 200, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer within 3 s" in errors[0], log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_a_ps_task_given_sigterm_serves_on_through_the_grace_period_then_exits_201(
    single_tasks,
):
    code, log, took = single_tasks["ps_sigterm"]
    assert code == 201, log[-3000:]  # not 143: the ps saved nothing
    assert "error: ps:0 received SIGTERM and stopped serving" in log, log[-3000:]
    assert "nothing was saved here" in log, log[-3000:]
    # It kept serving while the chief answered, so a chief saving after the same
    # notice could still read its variables.
    assert took >= GRACE, took


def test_an_evaluator_given_sigterm_exits_201_not_143(single_tasks):
    code, log, _ = single_tasks["evaluator_sigterm"]
    assert code == 201, log[-3000:]
    assert "error: evaluator:0 received SIGTERM and stopped; it keeps no state" in log, log[-3000:]
