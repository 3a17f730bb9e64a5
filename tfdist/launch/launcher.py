"""Runs a command as a local multi-process cluster on loopback.

    python -m tfdist.launch --workers 2 -- python -m trainer.task --strategy=multiworker

Every task runs the command after `--` with its own `TF_CONFIG`. Each output
line is copied to the console prefixed with the task's name (`[worker:1] `),
and to `<log_dir>/<role>-<index>.log` with `--log_dir`. SIGINT and SIGTERM are
forwarded to every task; tasks still running `--grace_period` seconds later are
killed.

Exit code: 0 when the job succeeds; else the code of the first task that
failed (a task killed by signal N counts as 128+N, so 143 for SIGTERM); 2 for a
usage error; 124 when `--timeout` expires. With parameter servers, the `ps` and
`worker` tasks serve until the chief finishes, and the chief's code decides.
"""

import signal
import sys
from typing import Sequence

from absl import flags

from tfdist import cli
from tfdist.errors import UsageError
from tfdist.launch.local_cluster import LocalCluster, shell_exit_code

__all__ = ["EXIT_TIMEOUT", "launch_from_argv"]

EXIT_TIMEOUT = cli.EXIT_TIMEOUT

_USAGE_EXAMPLE = "python -m tfdist.launch --workers 2 -- python -m trainer.task"

_FLAGS = cli.define_flags(
    (
        cli.FlagSpec("workers", None, "Number of `worker` tasks.", kind="integer", lower_bound=0),
        cli.FlagSpec(
            "ps", 0, "Number of parameter-server (`ps`) tasks; needs --chief.", lower_bound=0
        ),
        cli.FlagSpec("chief", False, "Run a `chief` task."),
        cli.FlagSpec(
            "evaluator",
            False,
            "Run an `evaluator` task; the launcher waits for it after the chief.",
        ),
        cli.FlagSpec(
            "restart_on_failure",
            0,
            "Restart the whole cluster up to this many times "
            "after a task fails (any non-zero exit, including 143 after a preemption).",
            lower_bound=0,
        ),
        cli.FlagSpec(
            "timeout",
            None,
            "Stop every task and exit 124 after this many seconds.",
            kind="float",
            lower_bound=0,
        ),
        cli.FlagSpec(
            "grace_period",
            10.0,
            "Seconds between SIGTERM and SIGKILL when stopping tasks.",
            lower_bound=0,
        ),
        cli.FlagSpec(
            "port_retries",
            3,
            "Restarts on new ports when a task cannot bind its port.",
            lower_bound=0,
        ),
        cli.FlagSpec("host", "127.0.0.1", "Address every task listens on."),
        cli.FlagSpec(
            "allow_non_loopback",
            False,
            "Accept a non-loopback --host. TensorFlow's "
            "gRPC servers run whatever anyone who can connect sends them: use only on a "
            "trusted, firewalled network.",
        ),
        cli.FlagSpec("quiet", False, "Do not copy task output to the console."),
        cli.FlagSpec(
            "preload",
            None,
            "Modules (comma-separated, e.g. tensorflow) to import once in a server from which "
            "each `python -m MODULE` or `python SCRIPT.py` task is forked; empty: none. "
            "Unset: TFDIST_LAUNCH_PRELOAD. See docs/local_cluster.md.",
            kind="list",
        ),
    )
)
# absl.logging already defines --log_dir ("directory to write logfiles into"); the
# launcher reads that flag as the directory for the tasks' log files.
_LOG_DIR_FLAG = "log_dir"


def _run_cluster(leftover_args: Sequence[str], command: Sequence[str]) -> int:
    if len(leftover_args) > 1:
        raise UsageError(
            f"unexpected argument(s) {' '.join(leftover_args[1:])!r} before '--', expected "
            f"only flags there and the command after '--', e.g. `{_USAGE_EXAMPLE}`"
        )
    if not command:
        raise UsageError(
            f"no command to run, expected `-- CMD...` after the flags, e.g. `{_USAGE_EXAMPLE}`"
        )
    if _FLAGS["workers"].value is None:
        raise UsageError(
            f"--workers is not set, expected the number of worker tasks, e.g. `{_USAGE_EXAMPLE}`"
        )
    cluster = LocalCluster(
        num_workers=_FLAGS["workers"].value,
        num_ps=_FLAGS["ps"].value,
        has_chief=_FLAGS["chief"].value,
        has_evaluator=_FLAGS["evaluator"].value,
        command=command,
        log_dir=flags.FLAGS[_LOG_DIR_FLAG].value or None,
        host=_FLAGS["host"].value,
        allow_non_loopback=_FLAGS["allow_non_loopback"].value,
        console=None if _FLAGS["quiet"].value else sys.stdout,
        events=sys.stderr,
        max_port_retries=_FLAGS["port_retries"].value,
        restart_on_failure=_FLAGS["restart_on_failure"].value,
        grace_period=_FLAGS["grace_period"].value,
        preload=_FLAGS["preload"].value,
    )

    def forward(signum, _frame):
        cluster.interrupt(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        cluster.start()
        try:
            cluster.wait(_FLAGS["timeout"].value)
        except TimeoutError as error:
            sys.stderr.write(f"tfdist.launch: {error}\n")
            return EXIT_TIMEOUT
    finally:
        cluster.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failure = cluster.first_failure
    if failure is None:
        return cli.EXIT_OK
    name, code = failure
    sys.stderr.write(f"tfdist.launch: exiting with {name}'s code {shell_exit_code(code)}\n")
    return shell_exit_code(code)


def launch_from_argv(argv: Sequence[str] | None = None) -> None:
    """Entry point: parses the flags before `--` and runs the command after it."""
    cli.run(_run_cluster, argv, takes_command=True)
