"""Exit-code contract shared by every command-line entry point.

0 success; 2 usage or configuration error (one line on stderr, no traceback;
also a restart whose settings differ from its backup's); 3 training stopped by
a non-finite loss or variable (one line on stderr; nothing non-finite was
backed up); 143 after a preemption notice once the state is saved; 137 when
the grace period ran out before the backup committed; anything else a crash.
"""

import sys
from typing import Callable, NoReturn, Sequence

from absl import app
from absl import flags

from tfdist.errors import NonFiniteError, UsageError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_PREEMPTED = 143
EXIT_GRACE_EXPIRED = 137


def exit_with_error(message: str, code: int) -> NoReturn:
    """Prints `message` as one `error: ...` line on stderr and exits with `code`."""
    one_line = " ".join(str(message).split())
    sys.stderr.write(f"error: {one_line}\n")
    sys.stderr.flush()
    sys.exit(code)


def exit_usage_error(message: str) -> NoReturn:
    """Prints `message` as one line on stderr and exits with code 2."""
    exit_with_error(message, EXIT_USAGE)


def parse_flags_or_exit(argv: Sequence[str]) -> list:
    """absl flags parser for `app.run` that turns flag errors into exit code 2."""
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as error:
        exit_usage_error(f"{error} (run with --helpfull to list the flags)")


def run(main: Callable[[list], None], argv: Sequence[str] | None = None) -> None:
    """Runs an absl `main`: `UsageError` -> one line, exit 2; `NonFiniteError` -> exit 3."""

    def guarded_main(remaining_argv):
        try:
            return main(remaining_argv)
        except UsageError as error:
            exit_usage_error(str(error))
        except NonFiniteError as error:
            exit_with_error(str(error), EXIT_NON_FINITE)

    app.run(guarded_main, argv=argv, flags_parser=parse_flags_or_exit)
