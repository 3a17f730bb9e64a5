"""Parameter-server training of Keras 3 models: exact steps, failures, sidecar evaluation.

The multi-process tests run `tests/jobs/parameter_server_job.py` as every task of a
loopback cluster (chief + 2 workers + 1 ps, sometimes an evaluator).
"""

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tfdist.launch.testing import poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
JOB = str(REPO / "tests" / "jobs" / "parameter_server_job.py")
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
JOB_TIMEOUT = 150


def _cluster(local_cluster, out, *args, evaluator=False):
    return local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        has_evaluator=evaluator,
        command=[sys.executable, JOB, f"--out={out}", *args],
        env=ENV,
        grace_period=5.0,
    )


def _summary(out: pathlib.Path, cluster) -> dict:
    path = out / "summary.json"
    assert path.exists(), f"no summary.json\n{cluster.format_logs()}"
    return json.loads(path.read_text())


# ------------------------------------------------------------ multi-process jobs


def test_every_step_is_counted_exactly_and_the_evaluator_sees_the_last_checkpoint(
    local_cluster, tmp_path
):
    out = tmp_path / "out"
    cluster = _cluster(
        local_cluster,
        out,
        "--epochs=2",
        "--steps_per_epoch=20",
        "--steps_per_sync=5",
        evaluator=True,
    )
    cluster.start()
    codes = cluster.wait(timeout=JOB_TIMEOUT)
    assert codes["chief:0"] == 0 and codes["evaluator:0"] == 0, cluster.format_logs()
    summary = _summary(out, cluster)
    assert summary["steps_completed"] == 40, summary
    assert summary["iterations"] == 40, summary
    # The loss metric's count at the last epoch's end: all its 20 steps of 16 examples.
    assert summary["examples_counted_at_last_sync"] == 20 * 16, summary
    assert summary["loss"][-1] < 0.5 * summary["loss"][0], summary
    assert len(summary["val_loss"]) == 2 and summary["val_loss"][-1] < summary["val_loss"][0]
    lines = [json.loads(line) for line in (out / "eval" / "metrics.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines]
    assert steps[-1] == 40 and steps == sorted(set(steps)), lines
    assert set(lines[-1]["metrics"]) == {"loss", "mae"}, lines
    assert lines[-1]["metrics"]["loss"] < lines[0]["metrics"]["loss"] or len(lines) == 1, lines
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "eval"))


def test_every_metric_update_path_counts_every_example_exactly(local_cluster, tmp_path):
    """Precision, Recall, AUC, F1Score, IoU and a docstring-style metric (`v.assign(v + x)`).

    Two workers update the same metric variables on the ps at the same time;
    each metric must have counted steps x batch examples, no update lost.
    """
    out = tmp_path / "out"
    cluster = _cluster(local_cluster, out, "--count_metrics", "--epochs=1", "--steps_per_epoch=60")
    cluster.start()
    codes = cluster.wait(timeout=JOB_TIMEOUT)
    assert codes["chief:0"] == 0, cluster.format_logs()
    summary = _summary(out, cluster)
    assert summary["steps_completed"] == 60, summary
    assert summary["examples_counted_at_last_sync"] == 60 * 16, summary
    assert summary["metric_counts"] == {
        name: 60 * 16 for name in ("precision", "recall", "auc", "f1", "iou", "example_count")
    }, summary


def test_a_worker_killed_mid_run_loses_no_step(local_cluster, tmp_path):
    out = tmp_path / "out"
    cluster = _cluster(
        local_cluster,
        out,
        "--epochs=2",
        "--steps_per_epoch=40",
        "--steps_per_sync=20",
        "--hold_after_first_sync",
        "--mark_batches",
    )
    cluster.start()
    poll_until(
        lambda: (out / "underway").exists(),
        timeout=JOB_TIMEOUT,
        what="the chief's first sync point",
    )
    read_before = len(os.listdir(out / "batches"))
    (out / "release").write_text("go")
    # Workers are reading batches for the next 20 steps: kill one in the middle.
    poll_until(
        lambda: len(os.listdir(out / "batches")) >= read_before + 4,
        timeout=JOB_TIMEOUT,
        what="steps running after the release",
    )
    assert cluster.kill("worker:1", signal.SIGKILL)
    codes = cluster.wait(timeout=JOB_TIMEOUT, stop_on_failure=False)
    assert codes["chief:0"] == 0, cluster.format_logs()
    assert codes["worker:1"] == -signal.SIGKILL
    summary = _summary(out, cluster)
    assert summary["steps_completed"] == 80, summary
    assert summary["iterations"] == 80, summary
    assert summary["examples_counted_at_last_sync"] == 40 * 16, summary


def test_losing_the_parameter_server_fails_the_chief_clearly_and_soon(local_cluster, tmp_path):
    out = tmp_path / "out"
    cluster = _cluster(
        local_cluster,
        out,
        "--epochs=2",
        "--steps_per_epoch=200",
        "--steps_per_sync=5",
        "--hold_after_first_sync",
    )
    cluster.start()
    poll_until(
        lambda: (out / "underway").exists(),
        timeout=JOB_TIMEOUT,
        what="the chief's first sync point",
    )
    assert cluster.kill("ps:0", signal.SIGKILL)
    killed_at = time.monotonic()
    (out / "release").write_text("go")
    codes = cluster.wait(timeout=JOB_TIMEOUT, stop_on_failure=False)
    failed_after = time.monotonic() - killed_at
    log = cluster.log("chief:0")
    assert codes["chief:0"] == 3, cluster.format_logs()
    assert re.search(
        r"parameter-server training stopped: (parameter server ps:0|a parameter "
        r"server or the connection to it) ",
        log,
    ), log[-3000:]
    assert "restart the job to resume from the last backup" in log, log[-3000:]
    assert failed_after < 60, f"the chief took {failed_after:.0f} s to fail"
    assert not (out / "summary.json").exists()


def test_trainer_task_runs_every_role_from_one_command(local_cluster, tmp_path):
    model_dir = tmp_path / "model"
    cluster = local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        env=ENV,
        grace_period=5.0,
        command=[
            sys.executable,
            "-m",
            "trainer.task",
            "--strategy=parameter_server",
            f"--model_dir={model_dir}",
            "--epochs=2",
            "--steps_per_epoch=16",
            "--num_examples=1024",
            "--evaluation_checkpoints",
        ],
    )
    cluster.start()
    codes = cluster.wait(timeout=JOB_TIMEOUT)
    assert codes["chief:0"] == 0, cluster.format_logs()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["strategy"] == "parameter_server" and summary["num_workers"] == 2
    assert summary["steps_completed"] == 32, summary
    # steps_per_execution=auto (the default) under parameter servers: closures of 4 steps,
    # 2 per worker at each 16-step sync point.
    assert (
        "steps_per_execution=auto chose 4 under parameter servers: 4 closures of 4 steps"
        in cluster.log("chief:0")
    ), cluster.format_logs()
    assert summary["examples_per_second"] > 0, summary
    assert (model_dir / "model.keras").exists()
    done = json.loads((model_dir / "checkpoints" / "training_done.json").read_text())
    assert done["step"] == 32, done

    # The evaluator role, as Vertex runs it (CLUSTER_SPEC lists every pool), on
    # the finished run: it evaluates both epoch checkpoints and exits at the marker.
    spec = {
        "cluster": {
            "workerpool0": ["127.0.0.1:1"],
            "workerpool1": ["127.0.0.1:2"],
            "workerpool2": ["127.0.0.1:3"],
            "workerpool3": ["127.0.0.1:4"],
        },
        "task": {"type": "workerpool3", "index": 0},
    }
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    evaluator = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.task",
            "--strategy=parameter_server",
            f"--model_dir={model_dir}",
            "--epochs=2",
            "--steps_per_epoch=16",
            "--num_examples=1024",
        ],
        env={**env, **ENV, "CLUSTER_SPEC": json.dumps(spec)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    assert evaluator.returncode == 0, evaluator.stderr[-3000:]
    lines = [
        json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [line["step"] for line in lines] == [16, 32], lines
    # The last checkpoint holds the final weights: same test metrics as the chief's.
    assert lines[-1]["metrics"]["loss"] == pytest.approx(
        summary["metrics"]["test"]["loss"], rel=1e-4
    ), (lines, summary)


def test_a_server_task_exits_0_once_the_chief_has_come_and_gone(tmp_path):
    import socket
    import threading

    from tfdist.launch.local_cluster import pick_free_ports

    chief_port, worker_port, ps_port = pick_free_ports("127.0.0.1", 3)
    listener = socket.create_server(("127.0.0.1", chief_port))
    listener.settimeout(0.1)
    probes, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            # Answer as a gRPC server does (an empty HTTP/2 SETTINGS frame after the client's
            # preface), so that the task's liveness probe sees a chief that answers.
            with connection:
                connection.settimeout(2)
                with contextlib.suppress(OSError):
                    connection.recv(64)
                    connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            probes.append(time.monotonic())

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    tf_config = {
        "cluster": {
            "chief": [f"127.0.0.1:{chief_port}"],
            "worker": [f"127.0.0.1:{worker_port}"],
            "ps": [f"127.0.0.1:{ps_port}"],
        },
        "task": {"type": "worker", "index": 0},
    }
    env = {**os.environ, **ENV, "TF_CONFIG": json.dumps(tf_config)}
    worker = subprocess.Popen(
        [sys.executable, JOB, f"--out={tmp_path}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        poll_until(
            lambda: probes or worker.poll() is not None,
            timeout=JOB_TIMEOUT,
            what="the worker's first probe of the chief",
        )
        assert worker.poll() is None, worker.communicate()[0][-3000:]
        stop.set()
        thread.join(timeout=5)
        listener.close()
        gone_at = time.monotonic()
        code = worker.wait(timeout=60)
        # The job's tasks give the chief 3 s of grace, probing every 0.2 s.
        assert code == 0, worker.communicate()[0][-3000:]
        assert time.monotonic() - gone_at < 30
    finally:
        stop.set()
        listener.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
