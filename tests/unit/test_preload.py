"""Which commands a local cluster forks from its preload server, and from which setting."""

import sys

import pytest

from tfdist.errors import UsageError
from tfdist.launch import preload
from tfdist.launch.local_cluster import LocalCluster


def test_the_variable_names_modules_separated_by_commas():
    assert preload.modules_from_environment({}) == ()
    assert preload.modules_from_environment({preload.PRELOAD_VARIABLE: ""}) == ()
    assert preload.modules_from_environment({preload.PRELOAD_VARIABLE: " tensorflow, keras ,"}) == (
        "tensorflow",
        "keras",
    )


def test_only_this_interpreter_on_a_module_or_a_script_is_forked(tmp_path):
    script = tmp_path / "task.py"
    script.write_text("print('hi')\n")
    assert preload.forkable([sys.executable, "-m", "trainer.task", "--steps=1"])
    assert preload.forkable([sys.executable, str(script), "arg"])
    assert not preload.forkable([sys.executable, "-m"])
    assert not preload.forkable([sys.executable, "-u", "-m", "trainer.task"])
    assert not preload.forkable([sys.executable, "-c", "print(1)"])
    assert not preload.forkable([sys.executable, str(tmp_path / "missing.py")])
    assert not preload.forkable(["sh", "-c", "true"])
    assert not preload.forkable([sys.executable])


@pytest.mark.parametrize("value", ["tensorflow", ["tensorflow", ""], [3]])
def test_a_bad_preload_is_a_usage_error(value):
    with pytest.raises(UsageError, match="preload is .*expected a sequence of module names"):
        LocalCluster(num_workers=1, command=[sys.executable, "-m", "json.tool"], preload=value)


def test_a_pid_reused_for_a_new_task_does_not_read_as_that_task_s_exit():
    """A long-lived server (a PreloaderPool's) forks so many tasks that pids come round
    again (pid_max is 32768 here, and every thread takes one): the exit of an earlier task
    with the same pid must not be taken for the new one's. The server's own messages, in
    the order it sends them, on the socket the client reads."""
    import json  # pylint: disable=g-import-not-at-top
    import queue  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    class Running:  # the server process, still up
        @staticmethod
        def poll():
            return None

    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    preloader = object.__new__(preload.Preloader)
    preloader._client, preloader._process = client, Running()  # pylint: disable=protected-access
    preloader._replies, preloader._exit_codes = queue.Queue(), {}  # pylint: disable=protected-access
    preloader._lock = threading.Lock()  # pylint: disable=protected-access
    reader = threading.Thread(target=preloader._read, daemon=True)  # pylint: disable=protected-access
    reader.start()
    for message in ({"started": 4242}, {"exited": 4242, "code": 3}, {"started": 4242}):
        server.send(json.dumps(message).encode())
    assert preloader._reply(10) == {"started": 4242}  # pylint: disable=protected-access
    assert preloader._reply(10) == {"started": 4242}  # pylint: disable=protected-access
    assert preloader.exit_code(4242) is None  # the new task runs
    server.send(json.dumps({"exited": 4242, "code": 0}).encode())
    server.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert preloader.exit_code(4242) == 0
    client.close()
