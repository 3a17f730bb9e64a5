"""tfdist under Ray Train's own TensorflowTrainer with `tfdist.ray.TensorflowConfig`,
on real local Ray clusters (loopback, CPUs, no dashboard). Ray's start-up dominates, so
the module starts its two jobs side by side (`_jobs`; trainer.ray once the first job's
cluster is up, so that it must start a cluster of its own) and each test waits for its own:

- a 2-worker `tfdist.resumable` job on a cluster of three one-CPU nodes: at step 4 the
  node of rank 0 is drained for preemption (Ray's own notice), worker 1 is SIGKILLed at
  step 10 and gets a SIGTERM at step 18; each time Ray's FailureConfig restarts the group
  and tfdist resumes from its backups; compared with one uninterrupted process;
- `python -m trainer.ray` running `trainer.task` as a parameter-server job (chief,
  worker, ps, evaluator), which must finish, report its backups as Ray checkpoints (the
  worker, ps and evaluator ranks making each of the chief's Ray calls) and leave no
  process behind; it is also the uninterrupted reference of:
- the same parameter-server job (no evaluator) under `trainer.ray --address` on a cluster
  of a head without CPUs and two three-CPU nodes (`tests/jobs/ray_cluster.py`): the node of
  the chief is drained for preemption as its ranks start; the chief reads Ray's notice at
  a sync point, makes the save SIGTERM makes, waits for Ray to end the group, and the
  group Ray restarts (charged to the preemption, `--max_failures=0`) resumes at that step
  and ends with the reference's weights.

The uninterrupted reference runs in the first job's driver once Ray has shut down (the
driver has TensorFlow loaded already): one TensorFlow process fewer than a job of its
own, still one process training every step without Ray."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.jobs import ray_cluster
from tests.jobs.ray_train_job import CLUSTER_UP
from tests.support import model_state
from tests.support.logged_process import clean_environment
from tfdist.launch.testing import poll_until

pytest.importorskip("ray.train")

REPO = pathlib.Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "ray_train_job.py"
CLUSTER = REPO / "tests" / "jobs" / "ray_cluster.py"
TIMEOUT = 400
PS_STEPS = 2 * 10
# Drain deadline: the chief must reach its first sync point and back up inside it (under
# the load of the module's three jobs), and trainer.task's grace period is set above it.
DRAIN_DEADLINE_SECONDS = 40
PS_TRAINING = (
    "--strategy=parameter_server",
    "--epochs=2",
    "--steps_per_epoch=10",
    "--num_examples=512",
    "--backup_every_steps=5",
    "--preemption_grace_seconds=60",
)


def _start(out: pathlib.Path, *args, command=(str(JOB),), **environ) -> subprocess.Popen:
    """Starts a job in its own session (Ray's processes with it), output in `out/log.txt`."""
    out.mkdir(parents=True)
    env = clean_environment()
    env.pop("RAY_ADDRESS", None)
    env.update(environ)
    # Ray swaps 127.0.0.1 for the machine's address unless clusters are off: keep it on
    # loopback. Ray Train's preemption watcher polls drains every 0.5 s instead of 5 s.
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        CUDA_VISIBLE_DEVICES="",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S="0.5",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(REPO),
        RAY_DEDUP_LOGS="0",
    )
    with open(out / "log.txt", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, *command, *args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.out = out
    return process


def _session_processes(session: int) -> list[str]:
    """The processes still in `session` (what a job left behind), as "pid (name)"."""
    left = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session
            left.append(text.split(")", 1)[0] + ")")
    return left


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILLs the job and every process of its session (Ray's own start new groups)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for entry in _session_processes(process.pid):
        try:
            os.kill(int(entry.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _drain_the_chiefs_node(log: pathlib.Path, address: str, drained: dict) -> None:
    """Drains the node of rank 0 (the chief) for preemption once its line is logged, through
    the GCS call Ray's autoscaler makes for a spot reclaim; records what happened."""
    import time  # pylint: disable=g-import-not-at-top

    import ray  # pylint: disable=g-import-not-at-top
    from ray.core.generated import autoscaler_pb2  # pylint: disable=g-import-not-at-top

    try:
        found = []

        def chief_line():
            match = re.search(r"tfdist\.ray: rank 0 is chief:0 on node (\w+)", log.read_text())
            found[:] = [match.group(1)] if match else []
            return bool(found)

        poll_until(chief_line, timeout=TIMEOUT, what="the chief's node", interval=0.2)
        client = ray._raylet.GcsClient(address=address)  # pylint: disable=protected-access
        accepted, rejection = client.drain_node(
            found[0],
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "tfdist test: a spot reclaim",
            int((time.time() + DRAIN_DEADLINE_SECONDS) * 1000),
        )
        drained.update(node=found[0], accepted=accepted, rejection=rejection)
    except Exception as error:  # pylint: disable=broad-except  (the test reports it)
        drained.update(error=repr(error))


@pytest.fixture(scope="module")
def _jobs(tmp_path_factory):
    import threading  # pylint: disable=g-import-not-at-top

    root = tmp_path_factory.mktemp("ray")
    trainer = None
    # Ray Train packs the 3 ranks (chief, worker, ps) on one node; the other takes the group
    # Ray restarts off the drained one. (Fewer nodes than ranks: each raylet costs CPU.)
    cluster = _start(root / "cluster", "--nodes=2", "--cpus_per_node=3", command=(str(CLUSTER),))
    resumable = _start(
        root / "ray",
        f"--out={root / 'ray'}",
        f"--reference_out={root / 'reference'}",
        "--workers=2",
        "--nodes=3",
        "--drain_at_step=4",
        "--kill_rank=1",
        "--kill_at_step=10",
        "--term_at_step=18",
        "--max_failures=2",
    )
    # trainer.ray without --address starts once the first job's cluster is the machine's
    # current one, which plain ray.init() would join (and then refuse the CPU count).
    try:
        poll_until(
            lambda: (
                CLUSTER_UP in (root / "ray" / "log.txt").read_text(errors="replace")
                or resumable.poll() is not None
            ),
            timeout=TIMEOUT,
            what="the first Ray job's cluster",
            interval=0.5,
        )
        trainer = _start(
            root / "trainer",
            "--chief",
            "--num_workers=1",
            "--num_ps=1",
            "--evaluator",
            "--max_failures=0",
            f"--storage_path={root / 'trainer' / 'ray'}",
            "--",
            *PS_TRAINING,
            f"--model_dir={root / 'trainer' / 'model'}",
            f"--backup_dir={root / 'trainer' / 'backup'}",
            "--evaluation_checkpoints",
            command=("-m", "trainer.ray"),
        )
        address = []

        def cluster_up():
            text = (root / "cluster" / "log.txt").read_text(errors="replace")
            address[:] = re.findall(re.escape(ray_cluster.UP) + r"(\S+)", text)
            return bool(address) or cluster.poll() is not None

        poll_until(cluster_up, timeout=TIMEOUT, what="the multi-node Ray cluster", interval=0.5)
        assert address, (root / "cluster" / "log.txt").read_text(errors="replace")[-3000:]
        preempted = _start(
            root / "preempted",
            "--chief",
            "--num_workers=1",
            "--num_ps=1",
            f"--address={address[0]}",
            "--max_failures=0",  # only a restart Ray charges to the preemption is allowed
            f"--storage_path={root / 'preempted' / 'ray'}",
            "--",
            *PS_TRAINING,
            f"--model_dir={root / 'preempted' / 'model'}",
            f"--backup_dir={root / 'preempted' / 'backup'}",
            command=("-m", "trainer.ray"),
        )
    except BaseException:
        for process in (resumable, cluster, trainer):
            if process is not None:
                _kill_session(process)
        raise
    drained = {}
    drainer = threading.Thread(
        target=_drain_the_chiefs_node,
        args=(root / "preempted" / "log.txt", address[0], drained),
        daemon=True,
    )
    drainer.start()
    jobs = {
        "resumable": resumable,
        "trainer": trainer,
        "preempted": preempted,
        "cluster": cluster,
        "drained": drained,
    }
    yield jobs
    for process in (resumable, trainer, preempted):
        _kill_session(process)
    if cluster.poll() is None:
        cluster.terminate()  # it shuts its Ray cluster down
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    _kill_session(cluster)
    drainer.join(timeout=10)


def _finish(*processes: subprocess.Popen) -> list[str]:
    """Waits for each (every one is killed, with its session, on a timeout); their logs."""
    try:
        codes = [process.wait(timeout=TIMEOUT) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                _kill_session(process)
    for process in processes:
        print(f"{' '.join(process.args[1:3])}: log in {process.out / 'log.txt'}")
    logs = [(process.out / "log.txt").read_text(errors="replace") for process in processes]
    for code, log in zip(codes, logs):
        assert code == 0, log[-6000:]
    return logs


def test_a_drained_killed_then_preempted_worker_under_ray_resumes_at_the_exact_steps(_jobs):
    (log,) = _finish(_jobs["resumable"])
    out = _jobs["resumable"].out
    reference_out = out.parent / "reference"

    assert (out / "drained").exists() and (out / "killed").read_text() == "10"
    assert (out / "terminated").read_text() == "18"
    starts = [json.loads(line) for line in (out / "starts.txt").read_text().splitlines()]
    assert sorted(start["rank"] for start in starts) == [0] * 4 + [1] * 4, starts  # 3 restarts
    for start in starts:
        assert start["keras"].startswith("3.") and start["legacy"] == "0", start
        assert start["replicas"] == 2 and start["hosts"] == ["127.0.0.1"], start
    agreed = [
        int(step)
        for step in re.findall(r"Preemption notice agreed: stopping after step (\d+)", log)
    ]
    # Ray's own notice (the drain at step 4, polled every 2 steps) reached every worker;
    # they agreed on one step, backed it up, and Ray's restart resumed exactly there.
    notices = re.findall(r"Ray's preemption notice at step (\d+) \(ranks \[0\]", log)
    assert len(notices) == 2 and len(set(notices)) == 1 and int(notices[0]) >= 4, notices
    assert agreed[0] == agreed[1] and int(notices[0]) <= agreed[0] < 8, agreed
    assert f"Resuming from the backup at step {agreed[0]} " in log, log[-6000:]
    # The workers waited for Ray to end the group at the drain's deadline, so Ray charged
    # that restart to max_preemption_failures; the SIGKILL and the SIGTERM used the two
    # max_failures (one more worker failure would have ended the run).
    assert log.count("waiting for Ray to end the worker group") == 2, log[-6000:]
    assert re.findall(r"Source: (preemption|worker group)", log) == [
        "preemption",
        "worker group",
        "worker group",
    ], log[-6000:]
    # After the SIGKILL: the backup before it (save_freq 4).
    assert "Resuming from the backup at step 8 " in log, log[-6000:]
    # The SIGTERM reached tfdist on Ray's training thread; the same agreement.
    assert "Received SIGTERM" in log, log[-6000:]
    assert len(agreed) == 4 and agreed[2] == agreed[3] and 18 <= agreed[2] < 24, agreed
    assert f"Resuming from the backup at step {agreed[2]} " in log, log[-6000:]

    # Every step ran exactly once, and the weights are those of one uninterrupted process.
    assert json.loads((out / "iterations.json").read_text()) == 24
    ray_weights = np.load(out / "weights.npz")
    reference = np.load(reference_out / "weights.npz")
    difference = max(
        float(np.abs(ray_weights[name] - reference[name]).max()) for name in reference.files
    )
    print(f"max |ray, drained, killed, preempted and resumed - one process| = {difference:.2e}")
    assert difference < 1e-6

    # tfdist's committed backups are Ray's checkpoints, the last one at the last step.
    result = json.loads((out / "result.json").read_text())
    assert result["error"] is None and result["metrics"]["step"] == 24, result
    checkpoint = pathlib.Path(result["checkpoint"])
    assert checkpoint.name == "tfdist-backup-000000000024"
    assert json.loads((checkpoint / "metadata.json").read_text())["step"] == 24
    reported = sorted(path.name for path in checkpoint.parent.glob("tfdist-backup-*"))
    assert reported[-1] == checkpoint.name and len(reported) >= 2, reported


def test_trainer_task_with_every_role_under_ray_finishes_and_leaves_nothing(_jobs):
    process = _jobs["trainer"]
    (log,) = _finish(process)
    out = process.out

    summary = json.loads((out / "model" / "summary.json").read_text())
    assert summary["strategy"] == "parameter_server" and summary["steps_completed"] == PS_STEPS
    assert (out / "model" / "model.keras").exists()
    assert re.search(r"task chief:0 of cluster \[chief=1, worker=1, ps=1\]", log), log[-6000:]
    # The evaluator rank evaluated each epoch's checkpoint and returned at the chief's marker.
    evaluated = [
        json.loads(line)["step"]
        for line in (out / "model" / "eval" / "metrics.jsonl").read_text().splitlines()
    ]
    assert evaluated == [10, PS_STEPS], evaluated
    # The worker and ps ranks served until the chief's training function returned, and
    # made each of the chief's Ray Train calls with it, as did the evaluator: 2 reports
    # (epoch 1's start, the end) and 4 preemption polls (the sync points, every 5 steps).
    for role in ("worker:0", "ps:0"):
        assert (
            f"The chief's training function returned; {role} stops serving (2 Ray Train "
            f"reports and 4 preemption polls made with rank 0)." in log
        ), log[-6000:]
    assert "tfdist.ray: evaluator:0 made 2 Ray Train reports and 4 preemption polls" in log
    # tfdist's last committed backup is Ray's checkpoint, where trainer.ray says.
    checkpoint = _ray_checkpoint(log)
    assert checkpoint.name == f"tfdist-backup-{PS_STEPS:012d}", checkpoint
    assert json.loads((checkpoint / "metadata.json").read_text())["step"] == PS_STEPS
    reported = sorted(path.name for path in checkpoint.parent.glob("tfdist-backup-*"))
    assert reported == [f"tfdist-backup-{step:012d}" for step in (10, PS_STEPS)], reported
    assert _session_processes(process.pid) == [], log[-3000:]


def _ray_checkpoint(log: str) -> pathlib.Path:
    lines = re.findall(r"^Ray Train's checkpoint: (.+)$", log, flags=re.MULTILINE)
    assert len(lines) == 1, log[-3000:]
    return pathlib.Path(lines[0])


def test_a_parameter_server_job_acts_on_rays_preemption_notice_and_resumes_exactly(_jobs):
    (preempted_log,) = _finish(_jobs["preempted"])
    (reference_log,) = _finish(_jobs["trainer"])  # the same training, uninterrupted
    drained = _jobs["drained"]
    assert drained.get("accepted"), drained
    out = _jobs["preempted"].out
    log = preempted_log

    # Ray's notice (the chief's node drained as the ranks started) read by the chief at a
    # sync point, handled as a SIGTERM: the save at the agreed sync point, then the wait.
    notices = [int(step) for step in re.findall(r"Ray's preemption notice at step (\d+)", log)]
    agreed = [
        int(step)
        for step in re.findall(r"Preemption notice agreed: stopping after step (\d+)", log)
    ]
    assert len(notices) == 1 and len(agreed) == 1, (notices, agreed, log[-6000:])
    assert agreed[0] in (5, 10, 15) and notices[0] <= agreed[0], (notices, agreed)
    assert log.count("waiting for Ray to end the worker group") == 1, log[-6000:]
    # Ray restarted the group off the drained node and charged it to the preemption
    # (--max_failures=0: a worker failure would have ended the run).
    assert re.findall(r"Source: (preemption|worker group)", log) == ["preemption"], log[-6000:]
    # (Ray prints a line from a worker's set-up twice: once from its own capture.)
    chief_nodes = list(
        dict.fromkeys(re.findall(r"tfdist\.ray: rank 0 is chief:0 on node (\w+)", log))
    )
    assert len(chief_nodes) == 2 and chief_nodes[0] == drained["node"], (chief_nodes, drained)
    assert f"Resuming from the backup at step {agreed[0]} " in log, log[-6000:]

    # Every step ran once, and the weights are those of the uninterrupted job.
    summary = json.loads((out / "model" / "summary.json").read_text())
    assert summary["steps_completed"] == PS_STEPS, summary
    assert summary["resumed_from_step"] == agreed[0], summary
    reference = model_state.saved_weights(out.parent / "trainer" / "model")
    weights = model_state.saved_weights(out / "model")
    assert sorted(weights) == sorted(reference) and reference
    difference = max(float(np.abs(weights[name] - reference[name]).max()) for name in reference)
    print(f"max |preempted by Ray and resumed - uninterrupted| = {difference:.2e}")
    assert difference == 0.0

    # The backup made for the notice was reported before the wait; the last is step 20.
    checkpoint = _ray_checkpoint(log)
    assert checkpoint.name == f"tfdist-backup-{PS_STEPS:012d}", checkpoint
    assert json.loads((checkpoint / "metadata.json").read_text())["step"] == PS_STEPS
    reported = sorted(path.name for path in checkpoint.parent.glob("tfdist-backup-*"))
    assert f"tfdist-backup-{agreed[0]:012d}" in reported, reported
    assert reported[-1] == checkpoint.name, reported
    del reference_log


def test_a_ray_cluster_that_cannot_start_is_one_line_and_exit_1(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    env = clean_environment()
    env.pop("RAY_ADDRESS", None)
    env.update(RAY_TMPDIR=str(not_a_directory), RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "trainer.ray", "--num_workers=1", "--", "--strategy=default"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: could not start a local Ray cluster (NotADirectoryError: [Errno 20] Not a "
        f"directory: '{not_a_directory}/ray'); check --address, RAY_ADDRESS and RAY_TMPDIR"
    ], result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == errors[0]
