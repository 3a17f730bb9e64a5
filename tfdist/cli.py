"""Exit-code contract shared by every command-line entry point.

0 success; 2 usage or configuration error (one line on stderr, no traceback;
also a restart whose settings differ from its backup's); 3 training stopped by
a non-finite loss or variable (one line on stderr; nothing non-finite was
backed up); 143 after a preemption notice once the state is saved; 137 when
the grace period ran out before the backup committed; 200 another task of the
job was lost (a transient cluster failure: restart the job, it resumes from its
backup); anything else a crash.

Restart policies read these codes: Kubeflow's TFJob `restartPolicy: ExitCode`
retries exactly the codes >= 128 (137, 143, 200) and never 2 or 3. 200 lies
above every signal's 128+N (Linux signals end at 64), so it never reads as a
process killed by a signal.
"""

import dataclasses
import sys
from typing import Any, Callable, Iterable, NoReturn, Sequence

from absl import app
from absl import flags

from tfdist.errors import NonFiniteError, UsageError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_PREEMPTED = 143
EXIT_GRACE_EXPIRED = 137
EXIT_PEER_LOST = 200
# Codes after which a restart of the job can succeed (TFJob's ExitCode policy: >= 128).
RETRYABLE_EXIT_CODES = (EXIT_GRACE_EXPIRED, EXIT_PREEMPTED, EXIT_PEER_LOST)


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
        for python_type, kind in ((bool, "boolean"), (int, "integer"), (float, "float"),
                                  ((tuple, list), "list")):
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
    return flags.DEFINE(_WholeNumberParser(lower_bound=lower_bound), name, default, help,
                        flag_values, flags.ArgumentSerializer(), module_name=module_name)


_DEFINERS = {"string": flags.DEFINE_string, "integer": _define_whole_number,
             "float": flags.DEFINE_float, "boolean": flags.DEFINE_boolean,
             "list": flags.DEFINE_list, "multi_string": flags.DEFINE_multi_string}


def define_flags(specs: Iterable[FlagSpec], flag_values: flags.FlagValues = flags.FLAGS, *,
                 module_name: str | None = None) -> dict[str, flags.FlagHolder]:
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
        bounds = ({"lower_bound": spec.lower_bound}
                  if spec.lower_bound is not None and kind in ("integer", "float") else {})
        holders[spec.name] = _DEFINERS[kind](spec.name, default, spec.help,
                                             flag_values=flag_values, module_name=module_name,
                                             **bounds)
    return holders
