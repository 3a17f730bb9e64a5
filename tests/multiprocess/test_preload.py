"""Tasks forked from a preload server that imported TensorFlow (tfdist.launch.preload).

The local-cluster tests (test_local_cluster.py, test_launch.py) run each case with
fresh and with forked tasks; here the server imports TensorFlow itself, and each
task must still start TensorFlow's runtime on its own: a collective across the
workers needs TF_CONFIG read at that start.
"""

import json
import os
import pathlib
import sys

import pytest

from tfdist.errors import UsageError
from tfdist.launch import preload
from tfdist.launch.local_cluster import LocalCluster

REPO = pathlib.Path(__file__).resolve().parents[2]
TASK = str(REPO / "tests" / "jobs" / "preloaded_task.py")
WAIT_SECONDS = 120
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("preloaded", [True, False], ids=["forked", "fresh"])
def test_each_task_starts_its_own_runtime_and_keeps_its_exit_code(
    local_cluster, tmp_path, preloaded
):
    cluster = local_cluster(
        num_workers=2,
        command=[sys.executable, TASK, str(tmp_path)],
        env=ENV,
        preload=("tensorflow",) if preloaded else (),
    )
    cluster.start()
    codes = cluster.wait(timeout=WAIT_SECONDS, stop_on_failure=False)
    assert codes == {"worker:0": 0, "worker:1": 3}, cluster.format_logs()
    records = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in (0, 1)]
    for record in records:
        assert record["preloaded"] is preloaded, record
        assert (record["sum"], record["replicas"]) == (3.0, 2), record
        assert record["cwd"] == os.getcwd() and record["argv"] == [TASK, str(tmp_path)]
    parents = {record["ppid"] for record in records}
    # Forked tasks share their server as parent; fresh ones are this process's children.
    assert (parents != {os.getpid()}) is preloaded and len(parents) == 1, records


def test_a_module_that_cannot_be_preloaded_is_one_clear_error(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=1,
        command=[sys.executable, TASK, str(tmp_path)],
        env=ENV,
        preload=("tfdist_no_such_module",),
    )
    with pytest.raises(UsageError) as raised:
        cluster.start()
    message = str(raised.value)
    assert "cannot preload tfdist_no_such_module: importing tfdist_no_such_module failed" in message
    assert "TFDIST_LAUNCH_PRELOAD" in message and "\n" not in message
    assert not list(tmp_path.glob("*.json"))


def test_a_module_that_starts_the_runtime_is_refused(local_cluster, tmp_path):
    (tmp_path / "starts_runtime.py").write_text("import tensorflow as tf\ntf.constant(1.0) + 1\n")
    cluster = local_cluster(
        num_workers=1,
        command=[sys.executable, TASK, str(tmp_path)],
        env={**ENV, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
        preload=("starts_runtime",),
    )
    with pytest.raises(UsageError, match="TensorFlow's runtime had started after the imports"):
        cluster.start()


PARENT_SCRIPT = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getppid()))\n"


def test_clusters_given_a_pool_fork_from_one_server_that_outlives_each_of_them(tmp_path):
    """`preload_servers=PreloaderPool().get`: one import for many clusters (the suite's
    `local_cluster` fixture shares `tfdist.launch.testing.SHARED_PRELOADERS` so)."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    pool = preload.PreloaderPool()
    try:
        for name in ("first", "second"):  # the second starts after the first has closed
            with LocalCluster(
                num_workers=2,
                command=[sys.executable, str(script), str(tmp_path / name)],
                env={**ENV, "TFDIST_TEST_PROCESS_TAG": name},
                log_dir=tmp_path / f"{name}-logs",
                preload=("json",),
                preload_servers=pool.get,
            ) as cluster:
                codes = cluster.wait(timeout=WAIT_SECONDS)
                assert set(codes.values()) == {0}, cluster.format_logs()
        parents = {(tmp_path / name).read_text() for name in ("first", "second")}
        assert len(parents) == 1 and parents != {str(os.getpid())}, parents
        # Variables the imports never read do not make another server; others do.
        env = dict(os.environ, PYTHONPATH=str(REPO))
        server = pool.get(("json",), env)
        assert pool.get(("json",), {**env, "TF_CONFIG": "{}", "TFDIST_TEST_PROCESS_TAG": "x"}) is (
            server
        )
        assert pool.get(("json",), {**env, "TF_CPP_MIN_LOG_LEVEL": "1"}) is not server
    finally:
        pool.close()
    assert not server.alive()
