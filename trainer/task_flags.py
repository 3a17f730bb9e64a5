"""The flags of `python -m trainer.task`, and the check of a command line for it.

`trainer.task` defines its flags here; `trainer.submit` and `trainer.kubernetes`
check the trainer flags after `--` with the same table (`check_trainer_args`)
before a job is written or submitted, so `-- --epochs=-1 --bogus` is one line
on the submitter's terminal, not an exit 2 on every replica once its machine
has started. A pure module: no TensorFlow.
"""

import copy
from typing import Sequence

from absl import flags

from tfdist._internal.preconditions import quoted
from tfdist.distribute import flags as tfdist_flags
from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import options as options_lib

# The one trainer.task flag that is no config key: the config file itself.
CONFIG_FLAG = options_lib.Option(
    "JSON file of experiment settings (see configs/).",
    name="config",
    value_type=str,
    default=None,
    is_config_key=False,
)
# The options whose flags trainer.task defines; tfdist.distribute.flags defines the strategy flags.
TRAINER_OPTIONS = tuple(row for row in config_lib.OPTIONS if row.flag_module == "trainer.task")
# absl's own flags, which every absl program takes (--verbosity, --logtostderr, ...).
_ABSL_MODULES = ("absl.logging", "absl.flags")


def define_task_flags(flag_values: flags.FlagValues = flags.FLAGS, *, module_name: str) -> None:
    """Defines every flag of `trainer.task` in `flag_values`."""
    tfdist_flags.define_strategy_flags(flag_values)
    options_lib.define_flags((CONFIG_FLAG, *TRAINER_OPTIONS), flag_values, module_name=module_name)


def passed_values(flag_values: flags.FlagValues) -> dict:
    """The option values of the flags given on the command line."""
    return {
        row.name: flag_values[row.name].value
        for row in config_lib.OPTIONS
        if flag_values[row.name].present
    }


def parse_trainer_args(args: Sequence[str], *, where: str = "after --") -> dict:
    """The option values trainer flags set, parsed by `trainer.task`'s own flag table.

    What the job writers read of the trainer flags (`trainer.submission.has_flag`)
    comes from here, never from matching the arguments' text: `-strategy=x`,
    `--strategy x` and `--strategy=x` are the same flag, as absl reads them.

    Returns:
        Option name to value, for the options the flags set (as `trainer.task` reads them).

    Raises:
        UsageError: An unknown flag, a malformed value, `--flagfile` or a positional
            argument (each flag's own rules and those between flags are
            `check_trainer_args`').
    """
    for arg in args:
        if not isinstance(arg, str):
            raise UsageError(
                f"trainer argument {quoted(arg)} {where} is not a string, expected "
                f"trainer.task flags such as --epochs=10"
            )
        if arg.lstrip("-").split("=", 1)[0] == "flagfile" and arg.startswith("-"):
            raise UsageError(
                f"trainer argument {quoted(arg)} {where}: --flagfile names a file on the "
                f"replicas, which cannot be checked here; expected the flags themselves "
                f"or --config"
            )
    flag_values = _trainer_flag_values()
    try:
        remaining = flag_values(["trainer.task", *args])
    except flags.Error as error:
        raise UsageError(
            f"trainer flag {where}: {' '.join(str(error).split())} (trainer.task would exit "
            f"2 on every replica); fix it before submitting"
        ) from None
    if len(remaining) > 1:
        raise UsageError(
            f"trainer argument {quoted(remaining[1])} {where} is not a --flag, expected only "
            f"trainer.task flags such as --epochs=10"
        )
    passed = passed_values(flag_values)
    if flag_values["config"].present:
        passed["config"] = flag_values["config"].value
    return passed


def _trainer_flag_values() -> flags.FlagValues:
    """A fresh copy of `trainer.task`'s flags, absl's own (--verbosity, ...) included."""
    flag_values = flags.FlagValues()
    define_task_flags(flag_values, module_name="trainer.task")
    for module in _ABSL_MODULES:
        for flag in flags.FLAGS.get_flags_for_module(module):
            if flag.name not in flag_values:
                flag_values[flag.name] = copy.deepcopy(flag)
    return flag_values


def check_trainer_args(args: Sequence[str], *, where: str = "after --") -> dict:
    """Refuses trainer flags `trainer.task` would refuse, with its own option table.

    With `--config`, the file is read on the replicas (its path is theirs), so
    each flag is checked alone; without it, the whole configuration is built
    as `trainer.task` builds it, cross-field rules included.

    Returns:
        The option values the flags set, by option name (as `trainer.task` reads them).

    Raises:
        UsageError: An unknown flag, a malformed or out-of-range value, a
            positional argument, or a combination the trainer refuses.
    """
    passed = parse_trainer_args(args, where=where)
    config_file = passed.pop("config", None)
    try:
        if config_file:
            for name, value in passed.items():
                config_lib.check_option_value(name, value)
        else:
            config_lib.build_config(flag_values=passed)
    except UsageError as error:
        raise UsageError(
            f"trainer flags {where}: {error} (trainer.task would exit 2 on every replica)"
        ) from None
    return passed
