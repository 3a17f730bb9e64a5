"""Peers that fail without dying, and tasks that keep no state: what each exits with.

Three jobs side by side (their waits overlap), each stopped after its first backup:

- a parameter-server job (chief, 2 workers, 1 ps) and a 2-worker multiworker job whose
  worker 1 is frozen (SIGSTOP: alive, silent): the survivors exit 200 within
  `--peer_timeout_seconds` (short here) plus a few seconds. Every frozen task is killed
  when its cluster closes (SIGKILL ends a stopped process);
- a parameter-server job given SIGTERM on every task, as a preemption: the chief saves and
  exits 143, because the ps serves on until the chief is gone, then exits 201.

And single tasks of a parameter-server job, run side by side against stand-in chiefs: a
worker whose chief never comes up exits 200 (retried), not 1; a ps task and an evaluator
that get SIGTERM exit 201 ("stopped, nothing saved here"), not 143 ("state saved").
"""

import concurrent.futures
import json
import pathlib
import re
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
from tfdist.launch.testing import PROCESS_TAG_ENV, SHARED_PRELOADERS, poll_until, tagged_processes

REPO = pathlib.Path(__file__).resolve().parents[2]

ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
PEER_TIMEOUT = 10
PREEMPTION_GRACE = 20
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
        f"--preemption_grace_seconds={PREEMPTION_GRACE}",
        f"--model_dir={out}/model",
        f"--backup_dir={out}/backup",
        *flags,
    ]


PS_JOB = {"num_workers": 2, "num_ps": 1, "has_chief": True}
# job -> (strategy, the cluster, what is done after the first backup)
JOBS = {
    "parameter_server_frozen": ("parameter_server", PS_JOB, "freeze worker:1"),
    "multiworker_frozen": ("multiworker", {"num_workers": 2}, "freeze worker:1"),
    "parameter_server_preempted": ("parameter_server", PS_JOB, "SIGTERM to every task"),
}
# frozen job -> (the survivor whose exit is the job's verdict, its error line)
FROZEN = {
    "parameter_server_frozen": ("chief:0", "error: lost contact with worker:1 at 127.0.0.1:"),
    "multiworker_frozen": ("worker:0", "error: lost contact with another task"),
}


def _job(name: str, out: pathlib.Path) -> dict:
    """Runs job `name` until its first backup, does its fault, and returns what followed."""
    strategy, layout, fault = JOBS[name]
    cluster = LocalCluster(
        preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
        **layout,
        env={**ENV, PROCESS_TAG_ENV: TAG},
        # How long the cluster waits after SIGTERM before SIGKILL: beyond the
        # trainer's own grace for the preempted job; short where a task is frozen.
        grace_period=PREEMPTION_GRACE + 5.0 if fault.startswith("SIGTERM") else 5.0,
        log_dir=out / "logs",
        command=_trainer(out, f"--strategy={strategy}"),
    )
    with cluster:  # closing kills every task; SIGKILL ends a stopped one too
        poll_until(
            lambda: committed_steps(out / "backup") or cluster.first_failure,
            timeout=JOB_TIMEOUT,
            what="the first backup",
        )
        backups_before = committed_steps(out / "backup")
        assert backups_before, cluster.format_logs()
        if fault == "freeze worker:1":
            assert cluster.kill("worker:1", signal.SIGSTOP), cluster.format_logs()
        else:
            cluster.interrupt(signal.SIGTERM)  # as a preemption of the whole job
        started = time.monotonic()
        codes = cluster.wait(timeout=JOB_TIMEOUT)
        return {
            "codes": codes,
            "logs": {task: cluster.log(task) for task in codes},
            "all_logs": cluster.format_logs(),
            "took": time.monotonic() - started,
            "summary_written": (out / "model" / "summary.json").exists(),
            "backups_before": backups_before,
            "backups": committed_steps(out / "backup"),
        }


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job at once (their waits overlap); job name -> what followed its fault."""
    out = tmp_path_factory.mktemp("jobs")
    try:
        with concurrent.futures.ThreadPoolExecutor(len(JOBS)) as pool:
            futures = {name: pool.submit(_job, name, out / name) for name in JOBS}
            return {name: future.result() for name, future in futures.items()}
    finally:
        leftovers = tagged_processes(TAG)
        assert not leftovers, f"processes left behind: {leftovers}"


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_a_frozen_worker_makes_the_survivors_exit_200_within_the_bound(jobs, name):
    survivor, error_line = FROZEN[name]
    run = jobs[name]
    assert run["codes"][survivor] == 200, run["all_logs"]
    assert error_line in run["logs"][survivor], run["logs"][survivor][-3000:]
    assert run["took"] < BOUND, f"{survivor} took {run['took']:.0f} s\n{run['all_logs']}"
    assert not run["summary_written"]
    assert run["backups"]  # what the restarted job resumes from


def test_a_preempted_parameter_server_job_saves_because_its_ps_outlives_the_chief(jobs):
    """SIGTERM to every task: the ps serves on while the chief saves, then exits 201.

    Before, the ps died of the signal at once, the chief could not read the
    variables it was saving, and it exited 137 at the end of its grace period
    with no new backup.
    """
    run = jobs["parameter_server_preempted"]
    codes = run["codes"]
    assert codes["chief:0"] == 143, run["all_logs"]
    # The step the chief stopped at is backed up: a new backup, or the one just committed
    # when the notice came right after it (seen: SIGTERM 2 ms after step 10's backup).
    stopped = re.search(r"notice agreed: stopping after step (\d+)", run["logs"]["chief:0"])
    assert stopped, run["all_logs"]
    assert max(run["backups"]) >= max(int(stopped.group(1)), *run["backups_before"]), run[
        "all_logs"
    ]
    assert {codes["ps:0"], codes["worker:0"], codes["worker:1"]} == {201}, run["all_logs"]
    assert "error: ps:0 received SIGTERM and stopped serving" in run["logs"]["ps:0"]


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
