"""Exit-code contract shared by every command-line entry point.

0 success; 2 usage or configuration error (one line on stderr, no traceback;
also a restart whose settings differ from its backup's); 3 training stopped by
a non-finite loss or variable (one line on stderr; nothing non-finite was
backed up); 4 a crash loop stopped: the job restarted more than
`max_restarts_without_progress` times from one backup without committing a new
one (permanent: fix the cause, see `tfdist.backups.restarts`); 143 after a preemption notice once the state is saved; 137 when
the grace period ran out before the backup committed; 200 another task of the
job was lost (a transient cluster failure: restart the job, it resumes from its
backup; also a task that stopped answering for `--peer_timeout_seconds`, and
a parameter-server worker or ps task whose chief never came up); 201 a task
that keeps no state of its own (a parameter-server worker or ps task, an
evaluator) stopped after SIGTERM: it saved nothing, the job resumes from the
chief's last backup; 74 storage refused a write (a full disk, read-only
storage, a missing bucket, permission denied: one line naming the path and the
cause; the last committed backup is intact; not retried, because a restart on
the same storage fails the same way until someone frees space or fixes it);
anything else a crash.

Restart policies read these codes: Kubeflow's TFJob `restartPolicy: ExitCode`
retries exactly the codes >= 128 (137, 143, 200, 201) and never 2, 3 or 4. 200 lies
above every signal's 128+N (Linux signals end at 64), so it never reads as a
process killed by a signal. Two codes belong to single commands: 1 from
`trainer.submit` when Vertex AI or Cloud Storage fails (5xx, unreachable), 124
from `tfdist.launch` when its `--timeout` expires.

`run` is every entry point's wrapper: absl flags, `--help`, the command after
`--`, and each exception it reports as one `error:` line with its code.
"""

import dataclasses
import functools
import logging
import os
import re
import sys
import threading
from typing import Any, Callable, Iterable, NoReturn, Sequence

from absl import app, flags

from tfdist.errors import (
    CrashLoopError,
    NonFiniteError,
    PeerLostError,
    StoppedWithoutStateError,
    StorageError,
    UsageError,
)

__all__ = [
    "EXIT_OK",
    "EXIT_SERVICE_FAILURE",
    "EXIT_USAGE",
    "EXIT_NON_FINITE",
    "EXIT_CRASH_LOOP",
    "EXIT_TIMEOUT",
    "EXIT_PREEMPTED",
    "EXIT_GRACE_EXPIRED",
    "EXIT_PEER_LOST",
    "EXIT_STORAGE",
    "EXIT_STOPPED_WITHOUT_STATE",
    "RETRYABLE_EXIT_CODES",
    "HELP_FLAGS",
    "shortened",
    "exit_with_error",
    "exit_from_thread",
    "exit_usage_error",
    "JOB_VARIABLES",
    "is_interactive",
    "usage_errors_exit",
    "usage_errors_exit_in_jobs",
    "parse_flags_or_exit",
    "split_command",
    "ErrorExit",
    "describe_lost_peer",
    "describe_storage_fault",
    "STANDARD_EXITS",
    "run",
    "FlagSpec",
    "define_flags",
]

EXIT_OK = 0
EXIT_SERVICE_FAILURE = 1
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_CRASH_LOOP = 4
EXIT_TIMEOUT = 124
EXIT_PREEMPTED = 143
EXIT_GRACE_EXPIRED = 137
EXIT_PEER_LOST = 200
# sysexits' EX_IOERR. Below 128, so TFJob's ExitCode policy does not retry it (see above).
EXIT_STORAGE = 74
EXIT_STOPPED_WITHOUT_STATE = 201
# Codes after which a restart of the job can succeed (TFJob's ExitCode policy: >= 128).
RETRYABLE_EXIT_CODES = (
    EXIT_GRACE_EXPIRED,
    EXIT_PREEMPTED,
    EXIT_PEER_LOST,
    EXIT_STOPPED_WITHOUT_STATE,
)

_LONG_TOKEN = re.compile(r"\S{121,}")
# absl's own --help exits 1; asking for help is not an error. True: the short help.
HELP_FLAGS = {
    "--help": True,
    "-help": True,
    "-h": True,
    "-?": True,
    "--helpshort": True,
    "--helpfull": False,
    "-helpfull": False,
}


def shortened(message: str) -> str:
    """`message` with any overlong unbroken run (a pasted value) cut to 100 characters."""
    return _LONG_TOKEN.sub(
        lambda match: f"{match.group(0)[:100]}... ({len(match.group(0))} characters)", message
    )


def exit_with_error(message: str, code: int) -> NoReturn:
    """Prints `message` as one `error: ...` line on stderr and exits with `code`."""
    one_line = " ".join(shortened(str(message)).split())
    sys.stderr.write(f"error: {one_line}\n")
    sys.stderr.flush()
    sys.exit(code)


def exit_from_thread(message: str, code: int) -> NoReturn:
    """`exit_with_error` from a thread other than the main one: ends the process at once.

    For watchdogs whose main thread may be blocked in a call that never
    returns (a remote call to a frozen task): `sys.exit` there would end only
    the watchdog's thread.
    """
    one_line = " ".join(shortened(str(message)).split())
    sys.stderr.write(f"error: {one_line}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    logging.shutdown()
    os._exit(code)  # pylint: disable=protected-access


def exit_usage_error(message: str) -> NoReturn:
    """Prints `message` as one line on stderr and exits with code 2."""
    exit_with_error(message, EXIT_USAGE)


# The variables that make a process a task of a job (tfdist.launch, Vertex AI, Kubeflow, Ray).
JOB_VARIABLES = ("TF_CONFIG", "CLUSTER_SPEC")


def is_interactive() -> bool:
    """Whether Python runs an interactive session (a REPL, `python -i`, a Jupyter kernel)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules


def usage_errors_exit(environ=None) -> bool:
    """Whether a `UsageError` in a user's script ends the process with one line and code 2.

    True in the main thread of a task of a job (`TF_CONFIG` or `CLUSTER_SPEC`
    set) that is not an interactive session: there a traceback per worker
    helps nobody, and the code tells the restart policy not to retry.
    Elsewhere the script gets the exception, to catch or to see; so does a
    framework that runs the training function in a thread of its own (Ray
    Train), where `sys.exit` would end only that thread.
    """
    environ = os.environ if environ is None else environ
    return (
        any(environ.get(name) for name in JOB_VARIABLES)
        and threading.current_thread() is threading.main_thread()
        and not is_interactive()
    )


def usage_errors_exit_in_jobs(function: Callable) -> Callable:
    """Decorates a library entry point: in a job, its `UsageError` is one `error:` line, exit 2.

    See `usage_errors_exit`; outside a job the exception is raised as it is.
    """

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except UsageError as error:
            if not usage_errors_exit():
                raise
            exit_usage_error(str(error))

    return wrapper


def parse_flags_or_exit(argv: Sequence[str]) -> list:
    """absl flags parser for `app.run`: help exits 0, a flag error exits 2 in one line."""
    for arg in argv[1:]:
        if arg in HELP_FLAGS:
            app.usage(shorthelp=HELP_FLAGS[arg], writeto_stdout=True, exitcode=EXIT_OK)
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as error:
        exit_usage_error(f"{error} (run with --helpfull to list the flags)")


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits argv at the first `--` into the program's own part and the command after it."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


@dataclasses.dataclass(frozen=True)
class ErrorExit:
    """An exception an entry point reports as one `error:` line and an exit code.

    Attributes:
        errors: The exception types; or a function that returns them, called
            only once an exception arrives (so that naming TensorFlow's errors
            does not import TensorFlow).
        code: The exit code.
        describe: The line's text, from the exception.
    """

    errors: tuple[type[BaseException], ...] | Callable[[], tuple[type[BaseException], ...]]
    code: int
    describe: Callable[[BaseException], str] = str
    when: Callable[[BaseException], bool] | None = None

    def matches(self, error: BaseException) -> bool:
        errors = self.errors if isinstance(self.errors, tuple) else self.errors()
        return isinstance(error, errors) and (self.when is None or self.when(error))


def describe_lost_peer(error: BaseException) -> str:
    """The line for a collective or remote call that failed because another task is gone."""
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    return (
        f"lost contact with another task of the job ({type(error).__name__}: "
        f"{first_line}); exiting so that the job can restart from its last backup"
    )


def describe_storage_fault(error: BaseException) -> str:
    """The line for a write that storage refused (a full disk, read-only, no permission)."""
    if isinstance(error, StorageError):
        return str(error)
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    return (
        f"storage refused a write ({StorageError.cause_of(error)}): {type(error).__name__}: "
        f"{first_line}; the last committed backup is kept: free space or fix the storage, "
        f"then run the job again"
    )


# What every entry point reports without a traceback.
STANDARD_EXITS = (
    ErrorExit((UsageError,), EXIT_USAGE),
    ErrorExit((NonFiniteError,), EXIT_NON_FINITE),
    ErrorExit((CrashLoopError,), EXIT_CRASH_LOOP),
    ErrorExit((PeerLostError,), EXIT_PEER_LOST),
    ErrorExit((StoppedWithoutStateError,), EXIT_STOPPED_WITHOUT_STATE),
    ErrorExit((StorageError,), EXIT_STORAGE),
    # A write refused where no `storage_faults` block named the path.
    ErrorExit(
        (Exception,),
        EXIT_STORAGE,
        describe_storage_fault,
        when=lambda error: StorageError.cause_of(error) is not None,
    ),
)


def run(
    main: Callable[..., Any],
    argv: Sequence[str] | None = None,
    *,
    takes_command: bool = False,
    exits: Sequence[ErrorExit] = (),
) -> NoReturn:
    """Runs an absl `main` as a command-line entry point, and exits.

    Flag errors exit 2 in one line, `--help` exits 0, and an exception matched
    by `exits` or `STANDARD_EXITS` (`UsageError` 2, `NonFiniteError` 3,
    `CrashLoopError` 4, `PeerLostError` 200, `StoppedWithoutStateError` 201) becomes
    one `error:` line and its code; anything else is a crash with a traceback.

    Args:
        main: Called with the arguments absl left after the flags; with
            `takes_command`, also with the tuple of arguments after `--`.
        argv: The command line, program name first; default `sys.argv`.
        takes_command: Split `argv` at the first `--`: flags before it, a
            command (or another program's flags) after it.
        exits: More exceptions to report, checked before the standard ones.
    """
    argv = list(sys.argv if argv is None else argv)
    command = ()
    if takes_command:
        argv, rest = split_command(argv)
        command = tuple(rest)
    reported = (*exits, *STANDARD_EXITS)

    def guarded_main(remaining_argv):
        try:
            return main(remaining_argv, command) if takes_command else main(remaining_argv)
        except Exception as error:  # pylint: disable=broad-except  (re-raised unless reported)
            for exit_spec in reported:
                if exit_spec.matches(error):
                    exit_with_error(exit_spec.describe(error), exit_spec.code)
            raise

    app.run(guarded_main, argv=argv, flags_parser=parse_flags_or_exit)


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One command-line flag; every tfdist and trainer CLI defines its flags from these.

    Attributes:
        name: The flag name, without dashes.
        default: Its default value.
        help: One line of help.
        kind: `string`, `integer`, `float`, `boolean`, `list` (comma-separated)
            or `multi_string` (repeatable); empty infers it from `default`.
        lower_bound: The smallest value a number flag takes.
    """

    name: str
    default: Any
    help: str
    kind: str = ""
    lower_bound: float | None = None

    @property
    def flag_kind(self) -> str:
        if self.kind:
            return self.kind
        for python_type, kind in (
            (bool, "boolean"),
            (int, "integer"),
            (float, "float"),
            ((tuple, list), "list"),
        ):
            if isinstance(self.default, python_type):
                return kind
        return "string"


class _WholeNumberParser(flags.IntegerParser):
    """absl's integer parser, also taking integral floats such as "128.0".

    A Vertex AI tuning study passes discrete values as doubles
    (`--global_batch_size=128.0`); "128.5" is still refused.
    """

    def convert(self, argument):
        try:
            return super().convert(argument)
        except ValueError:
            if isinstance(argument, str):
                try:
                    value = float(argument)
                except ValueError:
                    value = None
                if value is not None and value.is_integer():
                    return int(value)
            raise


def _define_whole_number(name, default, help, *, flag_values, module_name, lower_bound=None):  # pylint: disable=redefined-builtin
    return flags.DEFINE(
        _WholeNumberParser(lower_bound=lower_bound),
        name,
        default,
        help,
        flag_values,
        flags.ArgumentSerializer(),
        module_name=module_name,
    )


_DEFINERS = {
    "string": flags.DEFINE_string,
    "integer": _define_whole_number,
    "float": flags.DEFINE_float,
    "boolean": flags.DEFINE_boolean,
    "list": flags.DEFINE_list,
    "multi_string": flags.DEFINE_multi_string,
}


def define_flags(
    specs: Iterable[FlagSpec],
    flag_values: flags.FlagValues = flags.FLAGS,
    *,
    module_name: str | None = None,
) -> dict[str, flags.FlagHolder]:
    """Defines one absl flag per spec; returns their holders by name.

    Args:
        specs: The flags.
        flag_values: Where to define them.
        module_name: The module absl lists them under (what `--help` shows for
            a program's main module); default: the caller's.
    """
    if module_name is None:
        module_name = sys._getframe(1).f_globals["__name__"]  # pylint: disable=protected-access
        if module_name == "__main__":  # as absl names a program's main module
            module_name = sys.argv[0]
    holders = {}
    for spec in specs:
        kind = spec.flag_kind
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        bounds = (
            {"lower_bound": spec.lower_bound}
            if spec.lower_bound is not None and kind in ("integer", "float")
            else {}
        )
        holders[spec.name] = _DEFINERS[kind](
            spec.name,
            default,
            spec.help,
            flag_values=flag_values,
            module_name=module_name,
            **bounds,
        )
    return holders
