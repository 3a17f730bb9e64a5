"""A local multi-process cluster on loopback, for users and tests.

`LocalCluster` starts one subprocess per task (chief, workers, parameter
servers, evaluator), each with its own `TF_CONFIG`, supervises them and cleans
up after them. `python -m tfdist.launch` is its command-line face.

This module does not import TensorFlow: it only launches processes, and the
tasks import TensorFlow themselves.

With `preload=("tensorflow",)` (or `TFDIST_LAUNCH_PRELOAD=tensorflow`), Python
tasks are forked from one process that imported TensorFlow once
(`tfdist.launch.preload`); otherwise each task is a fresh process.

Every task runs in its own session (and so its own process group), so a task
and everything it started are signalled and killed together. A task's stdout
and stderr go, merged, to `<log_dir>/<role>-<index>.log`, and optionally to a
console with each line prefixed by the task's name, such as `[worker:1] `.

TensorFlow's gRPC servers execute whatever anyone who can connect sends them,
so the cluster's addresses are loopback addresses unless the caller opts in.
`TF_CONFIG` is never logged; the roles and ports are.
"""

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Callable, Mapping, Sequence, TextIO

from tfdist._internal.preconditions import check_seconds, check_whole_number
from tfdist.distribute import cluster as cluster_lib
from tfdist.distribute.cluster import is_loopback_host
from tfdist.errors import UsageError
from tfdist.launch import preload as preload_lib

__all__ = [
    "PortPicker",
    "BIND_FAILURE_MARKERS",
    "PRELOAD_LOG_NAME",
    "pick_free_ports",
    "shell_exit_code",
    "task_name",
    "ClusterLayout",
    "tf_configs",
    "LocalCluster",
]

PortPicker = Callable[[str, int], Sequence[int]]

# Phrases in a task's log that mean it could not listen on its port: Python's
# OSError, gRPC's add_port.cc and TensorFlow's grpc_server_lib.cc.
BIND_FAILURE_MARKERS = (
    "address already in use",
    "failed to add port",
    "could not bind",
    "could not start grpc server",
)

# The preload server's own output (its imports), beside the tasks' logs.
PRELOAD_LOG_NAME = "preload-server.log"
_POLL_SECONDS = 0.02
_OUTPUT_DRAIN_SECONDS = 5.0
_LEFTOVER_CHECK_SECONDS = 10.0
_ROLE_ORDER = (cluster_lib.CHIEF, cluster_lib.WORKER, cluster_lib.PS, cluster_lib.EVALUATOR)

_log = logging.getLogger(__name__)


def pick_free_ports(host: str, count: int) -> list[int]:
    """Asks the kernel for `count` distinct free TCP ports on `host`.

    The sockets are bound together, so the ports differ, then closed. Another
    process may take a port before the task binds it; `LocalCluster` detects
    that and starts again on new ports.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(probe)
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def shell_exit_code(returncode: int) -> int:
    """A `Popen.returncode` as a shell reports it: killed by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def task_name(role: str, index: int) -> str:
    """The name tasks go by in this module's API and logs, e.g. `"worker:1"`."""
    return f"{role}:{index}"


@dataclasses.dataclass(frozen=True)
class ClusterLayout:
    """Which tasks a local cluster has.

    Attributes:
        num_workers: Tasks of role `worker`.
        num_ps: Parameter servers. With any, the job is a parameter-server job:
            `ps` and `worker` tasks are servers that run until stopped, and
            the chief, which coordinates, decides when the job is done.
        has_chief: Whether there is a `chief` task.
        has_evaluator: Whether there is an `evaluator` task. Following
            TensorFlow, it sees only itself in its `TF_CONFIG` cluster, and
            the training tasks do not see it.
    """

    num_workers: int
    num_ps: int = 0
    has_chief: bool = False
    has_evaluator: bool = False

    def __post_init__(self):
        for field, value in (("num_workers", self.num_workers), ("num_ps", self.num_ps)):
            check_whole_number(field, value, minimum=0)
        if not self.num_workers and not self.has_chief:
            raise UsageError(
                "the cluster has 0 workers and no chief, expected at least one training "
                "task; pass --workers N (num_workers=N) or --chief (has_chief=True)"
            )
        if self.num_ps and not self.has_chief:
            raise UsageError(
                f"the cluster has {self.num_ps} ps task(s) but no chief, expected a chief "
                f"to coordinate parameter-server training; add --chief (has_chief=True)"
            )
        if self.num_ps and not self.num_workers:
            raise UsageError(
                f"the cluster has {self.num_ps} ps task(s) but 0 workers, expected at "
                f"least 1 worker for the chief to schedule steps on; pass --workers N"
            )

    @property
    def uses_parameter_servers(self) -> bool:
        return self.num_ps > 0

    def roles(self) -> dict[str, int]:
        """Role to task count, in start order, roles without tasks left out."""
        counts = {
            cluster_lib.CHIEF: int(self.has_chief),
            cluster_lib.WORKER: self.num_workers,
            cluster_lib.PS: self.num_ps,
            cluster_lib.EVALUATOR: int(self.has_evaluator),
        }
        return {role: counts[role] for role in _ROLE_ORDER if counts[role]}

    def task_names(self) -> tuple[str, ...]:
        return tuple(
            task_name(role, index) for role, count in self.roles().items() for index in range(count)
        )

    def is_server(self, name: str) -> bool:
        """Whether the task serves until stopped rather than finishing the job."""
        role = name.split(":")[0]
        return self.uses_parameter_servers and role in (cluster_lib.PS, cluster_lib.WORKER)


def tf_configs(layout: ClusterLayout, addresses: Mapping[str, str]) -> dict[str, str]:
    """Each task's `TF_CONFIG` JSON, given each task's `host:port`."""
    training = {}
    for name in layout.task_names():
        role = name.split(":")[0]
        if role != cluster_lib.EVALUATOR:
            training.setdefault(role, []).append(addresses[name])
    configs = {}
    for name in layout.task_names():
        role, index = name.split(":")
        # The evaluator also learns the training tasks (to tell when the chief is
        # gone); training tasks keep TensorFlow's convention of a cluster without it.
        members = (
            {**training, cluster_lib.EVALUATOR: [addresses[name]]}
            if role == cluster_lib.EVALUATOR
            else training
        )
        configs[name] = json.dumps(
            {"cluster": members, "task": {"type": role, "index": int(index)}}
        )
    return configs


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _processes_in_group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    proc = pathlib.Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class _TaskProcess:
    """One run of one task: its process group, output pump and log file."""

    def __init__(
        self,
        *,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: pathlib.Path,
        console: TextIO | None,
        console_lock: threading.Lock,
        header: str | None,
        preloader: preload_lib.Preloader | None = None,
    ):
        self.name = name
        self._console = console
        self._console_lock = console_lock
        self._preloader = preloader
        self._popen: subprocess.Popen | None = None
        self._log_file = open(log_path, "ab")
        if header:
            self._log_file.write(f"==== {header} ====\n".encode())
            self._log_file.flush()
        self.log_offset = self._log_file.tell()
        try:
            if preloader is None:
                self._popen = subprocess.Popen(
                    list(command),
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.pid = self._popen.pid
                self._output = self._popen.stdout
            else:
                read_end, write_end = os.pipe()
                try:
                    self.pid = preloader.spawn(command, env=env, stdout_fd=write_end)
                except BaseException:
                    os.close(read_end)
                    raise
                finally:
                    os.close(write_end)
                self._output = os.fdopen(read_end, "rb")
        except BaseException:
            self._log_file.close()
            raise
        self.returncode: int | None = None
        self._pump = threading.Thread(target=self._copy_output, name=f"output-{name}", daemon=True)
        self._pump.start()

    def _copy_output(self) -> None:
        prefix = f"[{self.name}] "
        console = self._console
        try:
            for line in iter(self._output.readline, b""):
                self._log_file.write(line)
                self._log_file.flush()
                if console is None:
                    continue
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                try:
                    with self._console_lock:
                        console.write(f"{prefix}{text}\n")
                        console.flush()
                except (OSError, ValueError):
                    # A closed console (e.g. `| head` exited) must not stop the log.
                    console = None
        finally:
            self._output.close()
            self._log_file.close()

    def signal_group(self, sig: int) -> None:
        """Sends `sig` to the task and everything in its process group."""
        if self.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def collect(self) -> int | None:
        """The exit code if the task has exited, else None.

        Once the task's main process has exited, whatever it left in its
        process group is killed, the process is reaped and its output drained.
        """
        if self.returncode is not None:
            return self.returncode
        if self._popen is None:
            # A preloaded task: its server reaps it, after killing its group's leftovers.
            code = self._preloader.exit_code(self.pid)
            if code is None:
                return None
            self.returncode = code
            self._pump.join(_OUTPUT_DRAIN_SECONDS)
            return self.returncode
        if hasattr(os, "waitid"):
            # WNOWAIT keeps the exited leader unreaped, so its process group id
            # cannot be reused before the leftovers are killed.
            try:
                status = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                status = True
            if status is None:
                return None
        elif self._popen.poll() is None:
            return None
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.returncode = self._popen.wait()
        self._pump.join(_OUTPUT_DRAIN_SECONDS)
        return self.returncode


class LocalCluster:
    """Runs one command as every task of a cluster on this machine.

    Use it as a context manager, which starts the tasks and on exit stops
    them and checks that no process of theirs is left:

        with LocalCluster(num_workers=2, command=["python", "task.py"],
                          log_dir="/tmp/logs") as cluster:
            exit_codes = cluster.wait(timeout=60)

    Exit codes are `Popen` return codes: negative means killed by that signal.
    Task names are `"<role>:<index>"`, e.g. `"chief:0"`, `"worker:1"`.

    The job is done when every task that finishes a job has exited: the chief,
    the workers (unless there are parameter servers: then workers and ps
    tasks are servers, and are stopped once the chief is done) and the
    evaluator. A task that exits non-zero fails the job: unless a restart is
    left, the other tasks are stopped (SIGTERM, then SIGKILL after
    `grace_period`). A task whose log shows it could not bind its port makes
    the whole cluster start again on new ports, up to `max_port_retries` times.

    Not thread-safe: call it from one thread. `interrupt()` is the exception:
    it may be called from a signal handler.
    """

    def __init__(
        self,
        *,
        num_workers: int,
        num_ps: int = 0,
        has_chief: bool = False,
        has_evaluator: bool = False,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        allow_non_loopback: bool = False,
        console: TextIO | None = None,
        events: TextIO | None = None,
        port_picker: PortPicker = pick_free_ports,
        max_port_retries: int = 3,
        restart_on_failure: int = 0,
        grace_period: float = 10.0,
        preload: Sequence[str] | None = None,
        preload_servers: Callable[[tuple[str, ...], dict[str, str]], preload_lib.Preloader]
        | None = None,
    ):
        """Describes the cluster; nothing starts until `start()`.

        Args:
            num_workers: Tasks of role `worker`.
            num_ps: Parameter-server tasks; needs `has_chief`.
            has_chief: Whether to run a `chief` task.
            has_evaluator: Whether to run an `evaluator` task.
            command: The program and its arguments, run once per task.
            env: Variables set for every task on top of this process's
                environment. `TF_CONFIG` is set per task; an inherited
                `CLUSTER_SPEC` is removed (it would describe another cluster).
                `PYTHONUNBUFFERED=1` is set unless given here, so output
                reaches the logs as it is printed.
            log_dir: Where `<role>-<index>.log` files go. None: a temporary
                directory, removed by `close()`.
            host: Address every task listens on. Loopback only, unless
                `allow_non_loopback`.
            allow_non_loopback: Accept a non-loopback `host`. TensorFlow's
                gRPC servers run whatever anyone who can connect sends them.
            console: Where to copy each task's output, lines prefixed with
                `[<task>] `. None copies nothing.
            events: Where to write one-line lifecycle messages (start,
                failures, restarts, stops). None: the `tfdist.launch.local_cluster`
                logger at INFO.
            port_picker: `(host, count) -> ports`, called for every (re)start
                of the whole cluster.
            max_port_retries: Whole-cluster restarts allowed for port conflicts.
            restart_on_failure: Whole-cluster restarts allowed after a task
                fails (any non-zero exit, including 143), like Vertex AI's
                `restart_job_on_worker_restart`.
            grace_period: Seconds between SIGTERM and SIGKILL when stopping.
            preload: Modules to import once in a server process from which
                every task whose command is `python -m MODULE` or `python
                SCRIPT.py` (this interpreter) is forked, such as
                `("tensorflow",)`: each task then skips that import
                (`tfdist.launch.preload` says what else differs). None: the
                comma-separated names in `TFDIST_LAUNCH_PRELOAD` (of `env`,
                else of this process), none when it is unset.
            preload_servers: `(modules, env) -> Preloader`: where the preload
                server comes from, owned by the caller and not closed with the
                cluster (`preload.PreloaderPool().get` shares one among the
                clusters whose tasks' environment matches, as the test suite
                does). None: the cluster starts its own and closes it.

        Raises:
            UsageError: A bad argument, including a non-loopback `host`.
        """
        self._layout = ClusterLayout(
            num_workers=num_workers, num_ps=num_ps, has_chief=has_chief, has_evaluator=has_evaluator
        )
        if (
            isinstance(command, str)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise UsageError(
                f"command is {command!r}, expected a non-empty list of strings such as "
                f"['python', '-m', 'trainer.task']"
            )
        if not is_loopback_host(host) and not allow_non_loopback:
            raise UsageError(
                f"host {host!r} is not a loopback address, expected 127.0.0.1, ::1 or "
                f"localhost because TensorFlow's gRPC servers run whatever anyone who can "
                f"connect sends them; use a loopback host, or opt in with "
                f"allow_non_loopback=True (--allow_non_loopback) on a trusted network"
            )
        for field, value in (
            ("max_port_retries", max_port_retries),
            ("restart_on_failure", restart_on_failure),
        ):
            check_whole_number(field, value, minimum=0)
        check_seconds("grace_period", grace_period, allow_zero=True)
        overrides = dict(env or {})
        if cluster_lib.TF_CONFIG in overrides:
            raise UsageError(
                "env sets TF_CONFIG, expected the cluster to set it for each task; "
                "remove TF_CONFIG from env"
            )
        self._command = tuple(command)
        self._env_overrides = overrides
        self._host = host
        self._console = console
        self._events = events
        self._port_picker = port_picker
        self._max_port_retries = max_port_retries
        self._restart_on_failure = restart_on_failure
        self._grace_period = float(grace_period)
        self._owns_log_dir = log_dir is None
        self._log_dir = pathlib.Path(log_dir) if log_dir is not None else None
        self._console_lock = threading.Lock()
        if preload is None:
            preload = preload_lib.modules_from_environment({**os.environ, **overrides})
        if isinstance(preload, str) or not all(
            isinstance(name, str) and name.strip() for name in preload
        ):
            raise UsageError(
                f"preload is {preload!r}, expected a sequence of module names such as "
                f"('tensorflow',)"
            )
        self._preload = tuple(preload) if preload_lib.forkable(self._command) else ()
        self._preloader: preload_lib.Preloader | None = None
        self._preload_servers = preload_servers

        self._names = self._layout.task_names()
        self._addresses: dict[str, str] = {}
        self._processes: dict[str, _TaskProcess] = {}
        self._exit_codes: dict[str, int | None] = {name: None for name in self._names}
        self._stopped_by_us: set[str] = set()
        self._process_groups: list[int] = []
        self._first_failure: tuple[str, int] | None = None
        self._restarts = 0
        self._port_retries = 0
        self._starts = 0
        self._interrupt_signal: int | None = None
        self._interrupt_deadline: float | None = None
        self._interrupted: set[str] = set()
        self._started = False
        self._finished = False
        self._closed = False

    # ----------------------------------------------------------------- facts
    @property
    def tasks(self) -> tuple[str, ...]:
        """Task names in start order, e.g. `("chief:0", "worker:0", "ps:0")`."""
        return self._names

    @property
    def layout(self) -> ClusterLayout:
        return self._layout

    @property
    def addresses(self) -> dict[str, str]:
        """Task name to the `host:port` of the current run (empty before start)."""
        return dict(self._addresses)

    @property
    def log_dir(self) -> pathlib.Path | None:
        return self._log_dir

    @property
    def exit_codes(self) -> dict[str, int | None]:
        """Task name to its latest exit code; None while running or not started."""
        return dict(self._exit_codes)

    @property
    def first_failure(self) -> tuple[str, int] | None:
        """`(task, exit code)` of the first task seen failing in the final run."""
        return self._first_failure

    @property
    def restarts(self) -> int:
        """Whole-cluster restarts made after a task failed."""
        return self._restarts

    @property
    def port_retries(self) -> int:
        """Whole-cluster restarts made after a port conflict."""
        return self._port_retries

    def describe(self) -> str:
        """Roles and addresses, one line, safe to log (no `TF_CONFIG`)."""
        return ", ".join(f"{name} at {self._addresses.get(name, '?')}" for name in self._names)

    def log_path(self, task: str) -> pathlib.Path:
        """The file holding `task`'s output (all of its runs)."""
        self._check_task(task)
        if self._log_dir is None:
            raise RuntimeError("the cluster has no log directory until start()")
        return self._log_dir / (task.replace(":", "-") + ".log")

    def log(self, task: str) -> str:
        """Everything `task` printed so far, in all its runs."""
        path = self.log_path(task)
        return path.read_text(errors="replace") if path.exists() else ""

    def format_logs(self, max_chars_per_task: int = 4000) -> str:
        """Every task's exit code and the tail of its log, for failure messages."""
        parts = []
        for name in self._names:
            text = self.log(name) if self._log_dir is not None else ""
            if len(text) > max_chars_per_task:
                text = "[...]\n" + text[-max_chars_per_task:]
            parts.append(f"----- {name} (exit code {self._exit_codes[name]}) -----\n{text}")
        return "\n".join(parts)

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close()

    def start(self) -> None:
        """Picks ports, writes each task's `TF_CONFIG` and starts every task.

        Raises:
            UsageError: The command cannot be run (not found, not executable).
        """
        if self._started:
            raise RuntimeError("LocalCluster.start() was already called")
        self._started = True
        if self._log_dir is None:
            self._log_dir = pathlib.Path(tempfile.mkdtemp(prefix="tfdist-cluster-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._launch_all(reason=None)

    def wait(self, timeout: float | None, *, stop_on_failure: bool = True) -> dict[str, int | None]:
        """Supervises the tasks until the job is done.

        Args:
            timeout: Seconds to wait in all, restarts included; None waits
                for ever.
            stop_on_failure: Stop the other tasks when one fails (and no
                restart is left). False lets each task run to its own end.

        Returns:
            Task name to exit code. Tasks stopped by the cluster have the code
            they exited with then (e.g. -15); see `first_failure`.

        Raises:
            TimeoutError: Tasks were still running after `timeout` seconds;
                the message names them. They are stopped before it is raised.
        """
        self._require_started()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished:
            self._deliver_interrupt()
            self._poll_tasks(stop_on_failure)
            if self._finished:
                break
            if self._interrupt_signal is None and self._job_done():
                self._stop([name for name in self._running() if self._layout.is_server(name)])
                self._finished = True
                break
            if self._interrupt_signal is not None and not self._running():
                self._finished = True
                break
            if deadline is not None and time.monotonic() > deadline:
                running = self._running()
                self._emit(f"timed out after {timeout:g} s; stopping {', '.join(running)}")
                self._stop(running)
                self._finished = True
                raise TimeoutError(
                    f"local cluster still running after {timeout:g} s: "
                    f"{', '.join(running)} (stopped now); logs in {self._log_dir}"
                )
            time.sleep(_POLL_SECONDS)
        return self.exit_codes

    def interrupt(self, sig: int = signal.SIGTERM) -> None:
        """Forwards `sig` to every task and ends the job without restarts.

        Safe to call from a signal handler: it only records the request, and
        `wait()` delivers it at its next poll. Tasks still running
        `grace_period` seconds later are killed. A second call kills at once.
        """
        now = time.monotonic()
        if self._interrupt_signal is None:
            self._interrupt_signal = int(sig)
            self._interrupt_deadline = now + self._grace_period
        else:
            self._interrupt_deadline = now

    def kill(self, task: str, sig: int = signal.SIGKILL) -> bool:
        """Sends `sig` to `task`'s process group, as a failure would.

        The task's exit counts like any other: a non-zero exit fails the job
        (or triggers a restart). Use `restart()` to replace a task on purpose.

        Returns:
            Whether the task was running.
        """
        self._check_task(task)
        self._require_started()
        process = self._processes.get(task)
        if process is None or process.collect() is not None:
            return False
        process.signal_group(sig)
        return True

    def restart(self, task: str) -> None:
        """Stops `task` (if running) and starts it again at the same address.

        Its exit is not counted as a failure; its log gets a header line.
        """
        self._check_task(task)
        self._require_started()
        if self._finished:
            raise RuntimeError("the job has finished; start a new LocalCluster")
        self._stop([task])
        self._stopped_by_us.discard(task)
        self._launch(task, header=f"tfdist: {task} restarted by LocalCluster.restart()")
        self._emit(f"restarted {task} at {self._addresses[task]}")

    def stop(self) -> None:
        """Stops every task: SIGTERM, then SIGKILL after `grace_period` seconds."""
        if not self._started:
            return
        self._stop(self._running())
        self._finished = True

    def close(self) -> None:
        """Stops every task and checks that none of their processes is left.

        Removes the log directory if the cluster made a temporary one.

        Raises:
            RuntimeError: A process of a task's group survived SIGKILL.
        """
        if self._closed:
            return
        self._closed = True
        self.stop()
        if self._preloader is not None and self._preload_servers is None:
            self._preloader.close()
        leftovers = self._leftover_processes()
        if self._owns_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
        if leftovers:
            raise RuntimeError(
                f"processes {leftovers} of the local cluster's tasks survived SIGKILL"
            )

    # ------------------------------------------------------------- internals
    def _check_task(self, task: str) -> None:
        if task not in self._names:
            raise UsageError(
                f"task {task!r} is not in this cluster, expected one of {', '.join(self._names)}"
            )

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("call LocalCluster.start() (or use it in a `with` block) first")

    def _emit(self, message: str) -> None:
        if self._events is None:
            _log.info("local cluster: %s", message)
        else:
            self._events.write(f"tfdist: {message}\n")
            self._events.flush()

    def _running(self) -> list[str]:
        return [
            name
            for name in self._names
            if name in self._processes and self._exit_codes[name] is None
        ]

    def _pick_addresses(self) -> dict[str, str]:
        ports = [int(port) for port in self._port_picker(self._host, len(self._names))]
        if len(set(ports)) != len(self._names) or not all(0 < port < 65536 for port in ports):
            raise UsageError(
                f"port_picker returned {ports}, expected {len(self._names)} distinct ports "
                f"from 1 to 65535"
            )
        return {name: _format_address(self._host, port) for name, port in zip(self._names, ports)}

    def _task_env(self, tf_config: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key
            not in (cluster_lib.TF_CONFIG, cluster_lib.CLUSTER_SPEC, cluster_lib.HAS_EVALUATOR)
        }
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self._env_overrides)
        env[cluster_lib.TF_CONFIG] = tf_config
        if self._layout.has_evaluator:
            env[cluster_lib.HAS_EVALUATOR] = "1"
        return env

    def _start_preloader(self) -> preload_lib.Preloader | None:
        """The preload server, started at the first task (None: no preloading)."""
        if self._preload and self._preloader is None:
            shared = self._task_env("")
            for key in (cluster_lib.TF_CONFIG, cluster_lib.HAS_EVALUATOR):
                shared.pop(key, None)
            try:
                if self._preload_servers is not None:
                    self._preloader = self._preload_servers(self._preload, shared)
                else:
                    self._preloader = preload_lib.Preloader(
                        self._preload, env=shared, log_path=self._log_dir / PRELOAD_LOG_NAME
                    )
            except UsageError:
                self._finished = True
                raise
            whose = "a shared server" if self._preload_servers is not None else "it"
            self._emit(f"preloaded {', '.join(self._preload)}; tasks are forked from {whose}")
        return self._preloader

    def _launch(self, name: str, header: str | None) -> None:
        tf_config = tf_configs(self._layout, self._addresses)[name]
        preloader = self._start_preloader()
        try:
            process = _TaskProcess(
                name=name,
                command=self._command,
                env=self._task_env(tf_config),
                log_path=self.log_path(name),
                console=self._console,
                console_lock=self._console_lock,
                header=header,
                preloader=preloader,
            )
        except OSError as error:
            self._stop(self._running())
            self._finished = True
            raise UsageError(
                f"cannot run command {self._command[0]!r} for {name}: {error.strerror}; "
                f"expected an executable program (check the command after `--` and PATH)"
            ) from None
        self._processes[name] = process
        self._process_groups.append(process.pid)
        self._exit_codes[name] = None

    def _launch_all(self, reason: str | None) -> None:
        self._starts += 1
        self._addresses = self._pick_addresses()
        self._first_failure = None
        self._stopped_by_us.clear()
        self._interrupted.clear()
        header = None if reason is None else f"tfdist: cluster start {self._starts} ({reason})"
        for name in self._names:
            self._launch(name, header)
        where = "" if self._owns_log_dir else f"; logs in {self._log_dir}"
        self._emit(f"started {self.describe()}{where}")

    def _poll_tasks(self, stop_on_failure: bool) -> None:
        for name in self._running():
            code = self._processes[name].collect()
            if code is None:
                continue
            self._exit_codes[name] = code
            if code != 0 and name not in self._stopped_by_us:
                self._on_failure(name, code, stop_on_failure)
                return

    def _on_failure(self, name: str, code: int, stop_on_failure: bool) -> None:
        what = f"{name} exited with code {shell_exit_code(code)}"
        if self._interrupt_signal is None:
            if self._port_retries < self._max_port_retries and self._failed_to_bind(name):
                self._port_retries += 1
                self._restart_all(
                    f"{what}: its port was taken; restarting the cluster on new ports "
                    f"(port retry {self._port_retries} of {self._max_port_retries})"
                )
                return
            if self._restarts < self._restart_on_failure:
                self._restarts += 1
                self._restart_all(
                    f"{what}; restarting the whole cluster "
                    f"(restart {self._restarts} of {self._restart_on_failure})"
                )
                return
        if self._first_failure is None:
            self._first_failure = (name, code)
        if self._interrupt_signal is not None or not stop_on_failure:
            self._emit(what)
            return
        self._emit(f"{what}; stopping the other tasks")
        self._stop(self._running())
        self._finished = True

    def _restart_all(self, message: str) -> None:
        self._emit(message)
        self._stop(self._running())
        self._launch_all(reason=message)

    def _failed_to_bind(self, name: str) -> bool:
        process = self._processes[name]
        with open(self.log_path(name), "rb") as log_file:
            log_file.seek(process.log_offset)
            text = log_file.read().decode("utf-8", "replace").lower()
        return any(marker in text for marker in BIND_FAILURE_MARKERS)

    def _job_done(self) -> bool:
        return all(
            self._exit_codes[name] is not None
            for name in self._names
            if not self._layout.is_server(name)
        )

    def _deliver_interrupt(self) -> None:
        if self._interrupt_signal is None:
            return
        if time.monotonic() >= self._interrupt_deadline:
            for name in self._running():
                self._processes[name].signal_group(signal.SIGKILL)
            return
        for name in self._running():
            if name not in self._interrupted:
                self._interrupted.add(name)
                self._processes[name].signal_group(self._interrupt_signal)

    def _stop(self, names: Sequence[str]) -> None:
        """SIGTERM, wait up to the grace period, SIGKILL; records exit codes."""
        names = [name for name in names if name in self._processes]
        for name in names:
            self._stopped_by_us.add(name)
            self._processes[name].signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self._grace_period
        pending = list(names)
        while pending:
            pending = [name for name in pending if self._processes[name].collect() is None]
            if not pending:
                break
            if time.monotonic() >= deadline:
                for name in pending:
                    self._processes[name].signal_group(signal.SIGKILL)
                deadline = float("inf")
            time.sleep(_POLL_SECONDS)
        for name in names:
            self._exit_codes[name] = self._processes[name].returncode

    def _leftover_processes(self) -> list[int]:
        deadline = time.monotonic() + _LEFTOVER_CHECK_SECONDS
        while True:
            leftovers = [pid for pgid in self._process_groups for pid in _processes_in_group(pgid)]
            if not leftovers or time.monotonic() >= deadline:
                return leftovers
            for pgid in self._process_groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(_POLL_SECONDS)
