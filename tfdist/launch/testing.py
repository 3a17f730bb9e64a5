"""Test helpers for multi-process tests: the `local_cluster` pytest fixture.

Load this module as a pytest plugin, as tests/conftest.py does for the whole suite:

    pytest_plugins = ("tfdist.launch.testing",)  # in a conftest.py

or import the fixture into one test module:

    from tfdist.launch.testing import local_cluster  # noqa: F401  (pytest fixture)

Then:

    def test_two_workers(local_cluster):
        cluster = local_cluster(num_workers=2, command=[sys.executable, "task.py"])
        cluster.start()
        codes = cluster.wait(timeout=60)
        assert set(codes.values()) == {0}, cluster.format_logs()

Needs pytest, which `tfdist` itself does not depend on.
"""

import atexit
import os
import pathlib
import sys
import time
import uuid
from typing import Callable, TypeVar

import pytest

from tfdist.launch import preload
from tfdist.launch.local_cluster import LocalCluster

__all__ = [
    "PROCESS_TAG_ENV",
    "poll_until",
    "tagged_processes",
    "local_cluster",
    "SHARED_PRELOADERS",
]

# Put in every task's environment by the fixture, so that any process a test
# left behind (grandchildren included) can be found by its environment.
PROCESS_TAG_ENV = "TFDIST_TEST_PROCESS_TAG"

_T = TypeVar("_T")

# One preload server per module list and environment for this whole process (a pytest
# process runs many clusters): the fixture's clusters fork their tasks from it, and so
# may any other caller (`LocalCluster(..., preload_servers=SHARED_PRELOADERS.get)`).
SHARED_PRELOADERS = preload.PreloaderPool()
atexit.register(SHARED_PRELOADERS.close)


def poll_until(
    condition: Callable[[], _T], *, timeout: float, what: str, interval: float = 0.02
) -> _T:
    """Calls `condition` until it returns something truthy, and returns that.

    Raises:
        AssertionError: Still falsy after `timeout` seconds; names `what`.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment has `PROCESS_TAG_ENV=tag` (Linux /proc)."""
    needle = f"{PROCESS_TAG_ENV}={tag}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _print_outside_capture(request, text: str) -> None:
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        sys.stderr.write(text)
        return
    with capture.global_and_fixture_disabled():
        sys.stderr.write(text)
        sys.stderr.flush()


@pytest.fixture
def local_cluster(request, tmp_path):
    """Factory fixture: `local_cluster(**LocalCluster kwargs) -> LocalCluster`.

    Each cluster gets `log_dir` under the test's `tmp_path` (unless given) and
    a tag in its tasks' environment; a preloading cluster forks its tasks from
    `SHARED_PRELOADERS` (unless `preload_servers` is given: None for its own server). At teardown every cluster is closed, the
    test fails if any tagged process is still alive, and when the test failed
    every task's exit code and log tail are printed.
    """
    tag = uuid.uuid4().hex
    failures_before = request.session.testsfailed
    clusters: list[LocalCluster] = []

    def make(**kwargs) -> LocalCluster:
        kwargs.setdefault("log_dir", tmp_path / f"cluster{len(clusters)}-logs")
        env = dict(kwargs.pop("env", None) or {})
        env[PROCESS_TAG_ENV] = tag
        kwargs.setdefault("preload_servers", SHARED_PRELOADERS.get)
        cluster = LocalCluster(env=env, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make

    errors = []
    for cluster in clusters:
        try:
            cluster.close()
        except RuntimeError as error:
            errors.append(str(error))
    if request.session.testsfailed > failures_before:
        for index, cluster in enumerate(clusters):
            _print_outside_capture(
                request,
                f"\n===== local cluster {index} of {request.node.nodeid}: "
                f"logs in {cluster.log_dir} =====\n{cluster.format_logs()}\n",
            )
    leftovers = tagged_processes(tag)
    assert not errors and not leftovers, (
        f"processes left behind by the local cluster: {leftovers} {errors}"
    )
