"""The trainer's option table: one row per `ExperimentConfig` field.

Each field of `trainer.config.ExperimentConfig` is declared with `option(...)`,
so one place gives its flag name and config-file key (the field name), its type
and default (the field's), its choices and its help:

    epochs: int = option(3, "Training epochs.", SCHEDULE, check=POSITIVE)

From that table `trainer.task` defines its absl flags, `trainer.config`
checks config files and values, and `trainer.flags_doc` writes docs/flags.md.
No TensorFlow here.
"""

import dataclasses
import types
import typing
from typing import Any, Callable

# Sections of docs/flags.md, in order.
DISTRIBUTION = "Distribution"
MODEL_AND_DATA = "Model and data"
SCHEDULE = "Schedule"
OPTIMIZATION = "Optimization"
NUMERICS = "Reproducibility and numerics"
OUTPUTS = "Outputs and fault tolerance"
SECTIONS = (DISTRIBUTION, MODEL_AND_DATA, SCHEDULE, OPTIMIZATION, NUMERICS, OUTPUTS)

# Range checks.
POSITIVE = "positive"
NOT_NEGATIVE = "not_negative"


@dataclasses.dataclass(frozen=True)
class Option:
    """One trainer option.

    Attributes:
        name: Flag name (`--name`) and config-file key.
        value_type: The field's Python type (`int`, `tuple[str, ...]`, `int | str`, ...).
        default: Value when neither a config file nor a flag sets it.
        help: The flag's help text (plain text; `--helpfull` shows it). Empty
            for options whose flag `tfdist.distribute.flags` defines with its own help.
        section: The docs/flags.md section.
        choices: The values it takes, from the library where the library
            defines them; the default is always accepted too.
        details: Markdown that docs/flags.md adds after `help`.
        doc_default: What docs/flags.md shows as the default, when the value
            alone would mislead (e.g. `$AIP_MODEL_DIR`).
        check: `POSITIVE` or `NOT_NEGATIVE` for numbers, a function that
            raises `UsageError` for a value other than the default, or empty.
        zero_unsets: For a 0 default that means "unset": why a user's 0 is
            refused and what to do instead.
        flag_module: The module that defines the flag: `trainer.task`, or
            `tfdist.distribute.flags` for the strategy flags a user's script shares.
    """

    help: str
    section: str
    choices: tuple[str, ...] = ()
    details: str = ""
    doc_default: str = ""
    check: str | Callable[[Any], Any] = ""
    zero_unsets: str = ""
    flag_module: str = "trainer.task"
    name: str = ""
    value_type: Any = None
    default: Any = None

    @property
    def flag_help(self) -> str:
        """The help absl shows: `help`, then the choices."""
        if not self.choices:
            return self.help
        return f"{self.help} One of: {', '.join(self.choices)}."

    @property
    def element_type(self) -> type | None:
        """For a list option (`tuple[float, ...]`), the type of its elements."""
        if typing.get_origin(self.value_type) is tuple:
            return typing.get_args(self.value_type)[0]
        return None

    @property
    def type_name(self) -> str:
        """The type as docs/flags.md names it, with its range."""
        if self.element_type is not None:
            return {str: "list of strings", float: "list of numbers"}[self.element_type]
        if isinstance(self.value_type, types.UnionType):  # int | str: a number or "auto"
            return f"integer or `{self.default}`"
        check = POSITIVE if self.zero_unsets else self.check
        return _TYPE_NAMES[self.value_type] + _RANGES.get(check, "")


_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_RANGES = {POSITIVE: " > 0", NOT_NEGATIVE: " >= 0"}


def option(default: Any, help_text: str, section: str, **attributes: Any) -> Any:
    """A dataclass field with `default` that is a row of the option table.

    Args:
        default: The field's default.
        help_text: `Option.help`.
        section: `Option.section`.
        **attributes: The other `Option` attributes (`choices`, `details`, ...).
    """
    return dataclasses.field(
        default=default, metadata={"option": Option(help_text, section, **attributes)}
    )


def table(config_class: type) -> tuple[Option, ...]:
    """The rows of a dataclass declared with `option(...)`, in field order."""
    hints = typing.get_type_hints(config_class)
    return tuple(
        dataclasses.replace(
            field.metadata["option"],
            name=field.name,
            value_type=hints[field.name],
            default=field.default,
        )
        for field in dataclasses.fields(config_class)
    )
