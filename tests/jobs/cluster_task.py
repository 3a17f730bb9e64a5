"""A tiny stand-in for a training task, run by the local-cluster tests.

    python tests/jobs/cluster_task.py MODE OUT_DIR

It records its `TF_CONFIG` and pid in OUT_DIR as `<role>-<index>.*` files,
prints a greeting, then behaves as MODE says. It never imports TensorFlow.
Tasks that wait give up after a minute, so a broken test cannot leave them
running for ever.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

GIVE_UP_SECONDS = 60


def _write(out_dir, name, text):
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as file:
        file.write(text)
    os.replace(path + ".tmp", path)


def _block():
    """Runs like a server: until a signal ends it."""
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return 99


def _wait_for_file(path):
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for_peers(config, out_dir, suffix):
    """Waits until every task of the cluster has written its `<name><suffix>` file."""
    for role, addresses in config["cluster"].items():
        for index in range(len(addresses)):
            if not _wait_for_file(os.path.join(out_dir, f"{role}-{index}{suffix}")):
                return False
    return True


def main(mode, out_dir):
    config = json.loads(os.environ["TF_CONFIG"])
    role, index = config["task"]["type"], config["task"]["index"]
    me = f"{role}-{index}"
    _write(out_dir, f"{me}.tf_config", os.environ["TF_CONFIG"])
    print(f"hello from {me}", flush=True)
    # Written after the greeting: once it exists, the greeting is in the log.
    _write(out_dir, f"{me}.pid", str(os.getpid()))

    if mode == "exit0":
        # Succeeds once every task of its cluster has started.
        return 0 if _wait_for_peers(config, out_dir, ".pid") else 97
    if mode == "block":
        return _block()
    if mode.startswith("worker1_exits_"):
        # Once every task runs, worker 1 fails with the given code; the others
        # run until stopped.
        if me != "worker-1":
            return _block()
        _wait_for_peers(config, out_dir, ".pid")
        return int(mode.rsplit("_", 1)[1])
    if mode.startswith("fail_once_"):
        # worker 1 fails on its first run only; a marker file remembers the run.
        marker = os.path.join(out_dir, f"{me}.failed_once")
        if me == "worker-1" and not os.path.exists(marker):
            _wait_for_peers(config, out_dir, ".pid")
            _write(out_dir, f"{me}.failed_once", "")
            return int(mode.rsplit("_", 1)[1])
        return 0
    if mode == "bind":
        # Listen on the task's own address, as a TensorFlow server does.
        host, port = config["cluster"][role][index].rsplit(":", 1)
        with socket.socket() as server:
            server.bind((host, int(port)))
            server.listen()
            print(f"listening on port {port}")
        return 0
    if mode == "grandchild":
        child = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({GIVE_UP_SECONDS})"]
        )
        _write(out_dir, f"{me}.grandchild", str(child.pid))
        if me != "worker-1":
            return _block()
        _wait_for_peers(config, out_dir, ".grandchild")
        return 3
    if mode == "preempt":

        def on_signal(signum, _frame):
            _write(out_dir, f"{me}.signal", str(signum))
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        _write(out_dir, f"{me}.ready", "")
        return _block()
    if mode.startswith("ps_job"):
        # Parameter-server layout: ps and workers serve, the chief finishes, and
        # the evaluator finishes after the chief with the code in the mode.
        if role in ("ps", "worker"):
            return _block()
        if role == "chief":
            _write(out_dir, "chief.done", "")
            return 0
        if not _wait_for_file(os.path.join(out_dir, "chief.done")):
            return 98
        return int(mode.rsplit("_", 1)[1])
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
