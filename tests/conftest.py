"""Shared pytest setup: the `local_cluster` fixture and the test tiers.

The tiers are directories: tests/unit/ runs in this process (the fast tier,
`python -m pytest -q tests/unit`); tests/multiprocess/ starts TensorFlow
processes, clusters or the command-line tools, and every test there is marked
`slow`, so `-m "not slow"` selects the same fast tier. Job scripts and the task
modules they run live in tests/jobs/, helpers the tests import in tests/support/.

Local clusters here fork their Python tasks from one import of TensorFlow
(`TFDIST_LAUNCH_PRELOAD=tensorflow,keras`, tfdist.launch.preload; one server per
environment for the whole pytest process, tfdist.launch.testing.SHARED_PRELOADERS), as TensorFlow's own
multi-worker tests do: a task then costs about 3 s less CPU. The tests of the
cluster itself (test_local_cluster.py, test_launch.py) run each case both ways
(the `task_start` fixture); tests/multiprocess/test_preload.py checks what a
forked task shares with a fresh one.
"""

import os
import pathlib

import pytest

from tfdist.launch import preload

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault(preload.PRELOAD_VARIABLE, "tensorflow,keras")

# `local_cluster` (tfdist.launch.testing) for every test module, without an import in each.
pytest_plugins = ("tfdist.launch.testing",)

_MULTIPROCESS = pathlib.Path(__file__).resolve().parent / "multiprocess"


# The modules that take longest (their shared runs, several minutes each on 2 cores), run first so
# that `-n 3 --dist loadfile` does not end on one of them while the other processes idle; the rest
# keep their order, the many short unit modules last to fill the gaps. xdist's own reordering (by
# the number of tests in a module) would put these last; setup.cfg turns it off.
LONGEST_FIRST = (
    "test_ray.py",
    "test_own_pipelines.py",
    "test_trainer_fault_tolerance.py",
    "test_resume_pipelines.py",
    "test_keras_compat.py",
    "test_example_tasks.py",
    "test_upgraded_scripts.py",
    "test_chaos.py",
    "test_data_multiworker.py",
    "test_multiworker.py",
    "test_resumable_callbacks.py",
    "test_peer_faults.py",
)


def _run_order(item) -> tuple[int, int]:
    path = pathlib.Path(str(item.path)).resolve()
    if _MULTIPROCESS not in path.parents:
        return (2, 0)
    if path.name in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path.name))
    return (1, 0)


def pytest_collection_modifyitems(items):
    for item in items:
        if _MULTIPROCESS in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slow)
    items.sort(key=_run_order)  # stable: each module's tests stay together and in order


@pytest.fixture(params=["fresh", "forked"])
def task_start(request, monkeypatch):
    """A test's local-cluster tasks as fresh processes, then forked from a preload server.

    The server preloads `json`, not TensorFlow (the cluster tests' tasks never
    import it): what is tested is the forking, the same whatever was imported.
    """
    monkeypatch.setenv(preload.PRELOAD_VARIABLE, "" if request.param == "fresh" else "json")
    return request.param
