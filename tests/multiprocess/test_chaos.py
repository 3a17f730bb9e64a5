"""Chaos: a local job restarted by `tfdist.launch --restart_on_failure` while tasks are killed.

A 2-worker synchronous job: a random task gets SIGKILL or SIGTERM after each new backup,
five times; the job must still end with exactly the planned steps and the weights of an
uninterrupted run. A parameter-server job (chief, 2 workers, 1 ps): SIGTERM to each role
once; it must still apply exactly the planned steps.
"""

import json
import os
import pathlib
import random
import re
import signal
import sys
import threading

import keras
import numpy as np

from tests.support.backup_files import committed_steps
from tests.support.logged_process import finish, log_tail, start_logged
from tfdist.launch.testing import poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 600
SEED = int(os.environ.get("TFDIST_CHAOS_SEED", "20261130"))


def _launch(tmp_path: pathlib.Path, name: str, launcher_flags: list[str], trainer_flags: list[str]):
    out = tmp_path / name
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "tfdist.launch",
        *launcher_flags,
        f"--log_dir={out}/logs",
        "--quiet",
        "--",
        sys.executable,
        "-m",
        "trainer.task",
        *trainer_flags,
        f"--model_dir={out}/model",
        f"--backup_dir={out}/backup",
    ]
    return start_logged(command, out, cwd=REPO)


_STARTED = re.compile(r"(\w+):(\d+) at [^,;\s]+:(\d+)")


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on `port` (Linux /proc/net)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        path = pathlib.Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            # local_address is HEXADDR:HEXPORT; state 0A is LISTEN.
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes


def _socket_owner(inodes: set[str]) -> int | None:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    return None


def _task_pids(process) -> dict[int, str]:
    """The running tasks of the launcher's latest cluster start, and their roles.

    Each task is the process listening on its port, as the launcher's last
    "started" line gives them (its environment in /proc is not its own when
    the cluster forks tasks from a preload server).
    """
    started = [line for line in log_tail(process, 10**6).splitlines() if "tfdist: started " in line]
    if not started:
        return {}
    pids = {}
    for role, _, port in _STARTED.findall(started[-1]):
        inodes = _listening_inodes(int(port))
        owner = _socket_owner(inodes) if inodes else None
        if owner is not None:
            pids[owner] = role
    return pids


def _weights(model_dir: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True, compile=False)
    return model.get_weights()


def _summary(out: pathlib.Path) -> dict:
    return json.loads((out / "model" / "summary.json").read_text())


def _describe(process) -> str:
    logs = sorted((process.out / "logs").glob("*.log"))
    tails = "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}" for path in logs
    )
    return f"{log_tail(process, 3000)}\n{tails}"


def _kill_after_each_new_backup(process, backup_dir: pathlib.Path, plan: list[tuple]):
    """Sends each (role or None, signal) of `plan` after the next new committed backup.

    Returns:
        What was sent: (step seen, role, signal name) per kill.
    """
    rng = random.Random(SEED)
    sent = []
    last_seen = 0
    for role, signum in plan:
        step = poll_until(
            lambda after=last_seen: (
                process.poll() is not None
                or max(committed_steps(backup_dir) or [0]) > after
                and max(committed_steps(backup_dir))
            ),
            timeout=TIMEOUT,
            what=f"a backup after step {last_seen}",
        )
        assert process.poll() is None, f"the job ended before kill {len(sent) + 1}"
        last_seen = step
        threading.Event().wait(rng.uniform(0.0, 0.2))  # a random moment after the backup

        def kill_one(wanted=role, signum=signum):
            """Signals a random running task (of role `wanted`); None if none is left to."""
            tasks = {
                pid: kind
                for pid, kind in _task_pids(process).items()
                if wanted is None or kind == wanted
            }
            if not tasks:
                return None
            victim = rng.choice(sorted(tasks))
            try:
                os.kill(victim, signum)
            except ProcessLookupError:
                return None  # it exited (a cluster stopping for a restart): look again
            return tasks[victim]

        killed = poll_until(kill_one, timeout=TIMEOUT, what=f"a running {role or 'task'}")
        sent.append((step, killed, signal.Signals(signum).name))
    return sent


def _run_chaos(tmp_path, launcher_flags, trainer_flags, plan) -> list[tuple]:
    """Runs the job under `tfdist.launch`, kills as `plan` says; asserts it still succeeds."""
    chaos = _launch(tmp_path, "chaos", [*launcher_flags, "--timeout=540"], trainer_flags)
    try:
        sent = _kill_after_each_new_backup(chaos, tmp_path / "chaos" / "backup", plan)
        code = finish(chaos, TIMEOUT)
    finally:
        finish(chaos, 1)
    assert code == 0, f"kills {sent}\n{_describe(chaos)}"
    return sent


def test_two_workers_killed_five_times_end_equal_to_an_uninterrupted_run(tmp_path):
    # One step per execution and enough steps to outlast five kill cycles: a cycle moves
    # training on by at most about two backups (40 steps; measured: all five kills sent by
    # step 86), so 300 steps leave a wide margin, and a job that ends first fails the
    # test ("the job ended before kill N"), never passes it.
    flags = [
        "--strategy=multiworker",
        "--model=mlp",
        "--num_examples=2048",
        "--epochs=2",
        "--steps_per_epoch=150",
        "--global_batch_size=32",
        "--backup_every_steps=20",
        "--steps_per_execution=1",
        "--seed=5",
        "--preemption_grace_seconds=20",
    ]
    reference = _launch(tmp_path, "reference", ["--workers=2", "--timeout=300"], flags)
    assert finish(reference, TIMEOUT) == 0, _describe(reference)

    rng = random.Random(SEED)
    plan = [(None, rng.choice([signal.SIGKILL, signal.SIGTERM])) for _ in range(5)]
    sent = _run_chaos(tmp_path, ["--workers=2", "--restart_on_failure=8"], flags, plan)
    assert len(sent) == 5

    summary = _summary(tmp_path / "chaos")
    assert summary["steps_completed"] == 2 * 150, sent
    assert summary["resumed_from_step"] > 0
    for expected, actual in zip(
        _weights(tmp_path / "reference" / "model"),
        _weights(tmp_path / "chaos" / "model"),
        strict=True,
    ):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6, err_msg=str(sent))


def test_parameter_servers_with_each_role_preempted_apply_exactly_the_planned_steps(tmp_path):
    flags = [
        "--strategy=parameter_server",
        "--model=mlp",
        "--num_examples=2048",
        "--epochs=2",
        "--steps_per_epoch=60",
        "--global_batch_size=32",
        "--backup_every_steps=10",
        "--steps_per_execution=1",
        "--seed=5",
        "--preemption_grace_seconds=10",
    ]
    # A ps task given SIGTERM alone serves on through the grace period (its chief
    # might be saving), then exits 201, so this is also the restart after losing
    # the parameter server (resumed from the backup, no step lost or repeated).
    plan = [("chief", signal.SIGTERM), ("worker", signal.SIGTERM), ("ps", signal.SIGTERM)]
    sent = _run_chaos(
        tmp_path, ["--chief", "--workers=2", "--ps=1", "--restart_on_failure=6"], flags, plan
    )
    assert [role for _, role, _ in sent] == ["chief", "worker", "ps"]
    summary = _summary(tmp_path / "chaos")
    assert summary["steps_completed"] == 2 * 60, sent
    assert summary["resumed_from_step"] > 0
