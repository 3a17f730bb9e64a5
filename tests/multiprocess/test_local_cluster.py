"""LocalCluster: TF_CONFIG per task, failure handling, port retries, cleanup.

The tasks are tiny Python scripts (tests/jobs/cluster_task.py), not TensorFlow.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from tfdist.launch.local_cluster import LocalCluster, pick_free_ports
from tfdist.launch.testing import poll_until

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = str(REPO_ROOT / "tests" / "jobs" / "cluster_task.py")
WAIT_SECONDS = 30
GRACE_SECONDS = 2.0


# Every test twice: with fresh tasks and with tasks forked from a preload server (conftest).
pytestmark = pytest.mark.usefixtures("task_start")


def task_command(mode, out_dir):
    return [sys.executable, TASK, mode, str(out_dir)]


def read_tf_config(out_dir, name):
    return json.loads((out_dir / f"{name.replace(':', '-')}.tf_config").read_text())


def pid_alive(pid):
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_each_task_sees_its_own_tf_config(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        has_evaluator=True,
        command=task_command("exit0", tmp_path),
        grace_period=GRACE_SECONDS,
    )
    cluster.start()
    codes = cluster.wait(WAIT_SECONDS)
    assert codes["chief:0"] == 0, cluster.format_logs()

    addresses = cluster.addresses
    assert cluster.tasks == ("chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0")
    assert all(address.startswith("127.0.0.1:") for address in addresses.values())
    assert len(set(addresses.values())) == 5
    training_cluster = {
        "chief": [addresses["chief:0"]],
        "worker": [addresses["worker:0"], addresses["worker:1"]],
        "ps": [addresses["ps:0"]],
    }
    for name in ("chief:0", "worker:0", "worker:1", "ps:0"):
        role, index = name.split(":")
        assert read_tf_config(tmp_path, name) == {
            "cluster": training_cluster,
            "task": {"type": role, "index": int(index)},
        }
    # Training tasks keep TensorFlow's convention (no evaluator in their cluster);
    # the evaluator also sees the training tasks, to tell when the chief is gone.
    assert read_tf_config(tmp_path, "evaluator:0") == {
        "cluster": {**training_cluster, "evaluator": [addresses["evaluator:0"]]},
        "task": {"type": "evaluator", "index": 0},
    }
    # And tfdist's own resolver reads every one of them.
    worker1 = cluster_lib.resolve_cluster(
        {"TF_CONFIG": (tmp_path / "worker-1.tf_config").read_text()}
    )
    assert (worker1.task_type, worker1.task_index, worker1.num_workers, worker1.num_ps) == (
        "worker",
        1,
        3,
        1,
    )


def test_a_failing_task_stops_the_others(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2,
        has_chief=True,
        command=task_command("worker1_exits_3", tmp_path),
        grace_period=GRACE_SECONDS,
    )
    cluster.start()
    codes = cluster.wait(WAIT_SECONDS)
    assert cluster.first_failure == ("worker:1", 3), cluster.format_logs()
    assert codes["chief:0"] == -signal.SIGTERM and codes["worker:0"] == -signal.SIGTERM, codes
    for name in ("chief-0", "worker-0"):
        assert not pid_alive(int((tmp_path / f"{name}.pid").read_text()))


def test_without_stop_on_failure_each_task_runs_to_its_end(local_cluster, tmp_path):
    cluster = local_cluster(num_workers=2, command=task_command("fail_once_4", tmp_path))
    cluster.start()
    codes = cluster.wait(WAIT_SECONDS, stop_on_failure=False)
    assert codes == {"worker:0": 0, "worker:1": 4}, cluster.format_logs()
    assert cluster.first_failure == ("worker:1", 4)


def test_parameter_server_job_ends_with_the_chief(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        command=task_command("ps_job", tmp_path),
        grace_period=GRACE_SECONDS,
    )
    cluster.start()
    codes = cluster.wait(WAIT_SECONDS)
    assert codes["chief:0"] == 0 and cluster.first_failure is None, cluster.format_logs()
    # The servers were stopped by the cluster, not failed.
    assert {codes["worker:0"], codes["worker:1"], codes["ps:0"]} == {-signal.SIGTERM}


def test_a_signal_sent_right_after_the_start_reaches_the_task(local_cluster, tmp_path):
    # A forked task must lead its own process group before its pid is known: a
    # signal to the group sent at once was lost before (SIGKILL after the grace period).
    cluster = local_cluster(num_workers=1, command=task_command("block", tmp_path))
    cluster.start()
    assert cluster.kill("worker:0", signal.SIGTERM)
    codes = cluster.wait(WAIT_SECONDS, stop_on_failure=False)
    assert codes == {"worker:0": -signal.SIGTERM}, cluster.format_logs()


def test_port_conflict_restarts_the_cluster_on_new_ports(local_cluster, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken_port = squatter.getsockname()[1]
        picks = []

        def picker(host, count):
            ports = pick_free_ports(host, count)
            if not picks:
                ports[0] = taken_port
            picks.append(ports)
            return ports

        cluster = local_cluster(
            num_workers=2,
            command=task_command("bind", tmp_path),
            port_picker=picker,
            grace_period=GRACE_SECONDS,
        )
        cluster.start()
        codes = cluster.wait(WAIT_SECONDS)

    assert codes == {"worker:0": 0, "worker:1": 0}, cluster.format_logs()
    assert cluster.port_retries == 1 and len(picks) == 2
    assert cluster.addresses["worker:0"] != f"127.0.0.1:{taken_port}"
    first_run, second_run = cluster.log("worker:0").split("==== tfdist: cluster start 2")
    assert "Address already in use" in first_run
    assert f"listening on port {cluster.addresses['worker:0'].rsplit(':', 1)[1]}" in second_run


def test_port_conflict_retries_are_bounded(local_cluster, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken_port = squatter.getsockname()[1]

        def picker(host, count):
            return [taken_port] + pick_free_ports(host, count - 1)

        cluster = local_cluster(
            num_workers=2,
            command=task_command("bind", tmp_path),
            port_picker=picker,
            max_port_retries=2,
            grace_period=GRACE_SECONDS,
        )
        cluster.start()
        cluster.wait(WAIT_SECONDS)

    assert cluster.port_retries == 2
    assert cluster.first_failure == ("worker:0", 1), cluster.format_logs()


def test_timeout_names_the_running_tasks_and_stops_them(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2, command=task_command("block", tmp_path), grace_period=GRACE_SECONDS
    )
    cluster.start()
    with pytest.raises(TimeoutError, match=r"after 0\.5 s: worker:0, worker:1"):
        cluster.wait(0.5)
    assert all(code is not None for code in cluster.exit_codes.values())


def test_kill_and_restart_one_task(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2, command=task_command("block", tmp_path), grace_period=GRACE_SECONDS
    )
    cluster.start()
    pid_file = tmp_path / "worker-1.pid"
    # The task writes its pid file after its greeting; the log is copied by a
    # thread, so either can come first here.
    poll_until(
        lambda: pid_file.exists() and "hello from worker-1" in cluster.log("worker:1"),
        timeout=WAIT_SECONDS,
        what="worker:1's pid file and greeting",
    )
    first_pid = int(pid_file.read_text())
    first_config = read_tf_config(tmp_path, "worker:1")

    cluster.restart("worker:1")
    poll_until(
        lambda: pid_file.exists() and int(pid_file.read_text()) != first_pid,
        timeout=WAIT_SECONDS,
        what="the restarted worker:1 to record its pid",
    )
    assert not pid_alive(first_pid)
    assert read_tf_config(tmp_path, "worker:1") == first_config
    poll_until(
        lambda: cluster.log("worker:1").count("hello from worker-1") == 2,
        timeout=WAIT_SECONDS,
        what="the second greeting in worker:1's log",
    )
    assert "restarted by LocalCluster.restart()" in cluster.log("worker:1")

    assert cluster.kill("worker:0", signal.SIGKILL)
    codes = cluster.wait(WAIT_SECONDS)
    assert cluster.first_failure == ("worker:0", -signal.SIGKILL), cluster.format_logs()
    assert codes["worker:1"] == -signal.SIGTERM


def test_grandchildren_are_killed_with_their_task(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=2, command=task_command("grandchild", tmp_path), grace_period=GRACE_SECONDS
    )
    cluster.start()
    cluster.wait(WAIT_SECONDS)
    assert cluster.first_failure == ("worker:1", 3), cluster.format_logs()
    cluster.close()
    for name in ("worker-0", "worker-1"):
        assert not pid_alive(int((tmp_path / f"{name}.grandchild").read_text())), name


def test_a_temporary_log_dir_is_removed_on_close(tmp_path):
    with LocalCluster(num_workers=1, command=task_command("exit0", tmp_path)) as cluster:
        cluster.wait(WAIT_SECONDS)
        assert "hello from worker-0" in cluster.log("worker:0")
        log_dir = cluster.log_dir
    assert log_dir is not None and not log_dir.exists()


@pytest.mark.parametrize("host", ["10.1.2.3", "0.0.0.0", "example.com", "192.168.0.1"])
def test_non_loopback_hosts_are_refused_unless_allowed(host):
    with pytest.raises(UsageError, match="not a loopback address"):
        LocalCluster(num_workers=1, command=["true"], host=host)
    LocalCluster(num_workers=1, command=["true"], host=host, allow_non_loopback=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts_are_accepted(host):
    assert LocalCluster(num_workers=1, command=["true"], host=host).tasks == ("worker:0",)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_workers=0), "at least one training task"),
        (dict(num_workers=1, num_ps=1), "no chief"),
        (dict(num_workers=-1), "num_workers is -1"),
        (dict(num_workers=1, command=[]), "non-empty list"),
        (dict(num_workers=1, env={"TF_CONFIG": "{}"}), "env sets TF_CONFIG"),
        (dict(num_workers=1, restart_on_failure=-1), "restart_on_failure is -1"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, message):
    kwargs.setdefault("command", ["true"])
    with pytest.raises(UsageError, match=message):
        LocalCluster(**kwargs)


def test_fixture_prints_task_logs_when_a_test_fails(tmp_path):
    test_file = tmp_path / "test_uses_fixture.py"
    test_file.write_text(
        textwrap.dedent(f"""
        import sys
        from tfdist.launch.testing import local_cluster

        def test_fails(local_cluster, tmp_path):
            cluster = local_cluster(num_workers=1, command=[
                sys.executable, "-c", "print('unique-marker-4711')"])
            cluster.start()
            cluster.wait({WAIT_SECONDS})
            assert False, "failing on purpose"
    """)
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={tmp_path}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "local cluster 0 of" in output and "unique-marker-4711" in output, output
