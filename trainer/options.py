"""The option tables of every trainer command: one `Option` row per option.

A command's options are the fields of one frozen dataclass, each declared with
`option(...)`, so one place gives an option's flag name and config-file key
(the field name), its type and default (the field's), its choices and its help:

    epochs: int = option(3, "Training epochs.", SCHEDULE, check=POSITIVE)

`table(cls)` reads the rows. From them each command defines its absl flags
(`flag_specs`, `define_flags`), knows its config-file keys (`config_keys`) and
defaults (`defaults`), and its docs are written or checked:

| command | table | config file | docs |
|---|---|---|---|
| `trainer.task` | `trainer.config.ExperimentConfig` | `--config` | docs/flags.md, written by `trainer.flags_doc` |
| `trainer.submit` | `trainer.vertex.options.JobOptions`, `trainer.vertex.tuning.TuningOptions`, `trainer.vertex.command.SubmitOptions` | `--job_config`, `--hparam_tuning` | docs/vertex.md |
| `trainer.kubernetes` | `trainer.kubernetes.options.ShapeOptions`, `trainer.kubernetes.options.CommandOptions` | `--job_config` | docs/engines.md |
| `trainer.ray` | `trainer.ray.RayOptions` | none | docs/engines.md |

tests/unit/test_option_tables.py pins each command's flag set (names, kinds and
defaults). `tfdist.cli.FlagSpec` stays the library's own way to define a flag
(`tfdist.distribute.flags`, `tfdist.launch`: tfdist never imports the trainer);
a row becomes one (`Option.flag_spec`). A pure module: no TensorFlow.
"""

import dataclasses
import types
import typing
from typing import Any, Callable, Iterable

from absl import flags

from tfdist import cli

__all__ = [
    "DISTRIBUTION",
    "MODEL_AND_DATA",
    "SCHEDULE",
    "OPTIMIZATION",
    "NUMERICS",
    "OUTPUTS",
    "SECTIONS",
    "POSITIVE",
    "NOT_NEGATIVE",
    "Option",
    "option",
    "table",
    "flag_specs",
    "define_flags",
    "config_keys",
    "defaults",
    "passed_values",
]

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
    """One option of a command: its flag, its config-file key, its checks and its docs.

    Attributes:
        name: Flag name (`--name`) and config-file key.
        value_type: The field's Python type (`int`, `tuple[str, ...]`, `int | str`, ...);
            it gives the flag's kind (`flag_kind`).
        default: Value when neither a config file nor a flag sets it.
        help: The flag's help text (plain text; `--helpfull` shows it). Empty
            for options whose flag `tfdist.distribute.flags` defines with its own help.
        section: The docs/flags.md section (trainer options only).
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
            `tfdist.distribute.flags` for the strategy flags a user's script shares
            (trainer options only).
        repeatable: The flag may be given several times (`--env=A=1 --env=B=2`);
            a list in a config file.
        accumulates: Config-file values and flag values add up (file first)
            instead of the flag replacing the file's.
        templated: The command fills placeholders in the value (`trainer.submit`:
            `{project}` and `{region}`).
        is_flag: A command-line flag (else a config-file key only).
        is_config_key: A config-file key (else a flag only, e.g. `--job_config`).
        lower_bound: The smallest value its number flag takes (absl refuses less
            while parsing); `None` for none.
    """

    help: str
    section: str = ""
    choices: tuple[str, ...] = ()
    details: str = ""
    doc_default: str = ""
    check: str | Callable[[Any], Any] = ""
    zero_unsets: str = ""
    flag_module: str = "trainer.task"
    repeatable: bool = False
    accumulates: bool = False
    templated: bool = False
    is_flag: bool = True
    is_config_key: bool = True
    lower_bound: float | None = None
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
    def flag_kind(self) -> str:
        """The `tfdist.cli.FlagSpec` kind of its flag, from `value_type`."""
        if self.repeatable:
            return "multi_string"
        if self.element_type is not None:
            return "list"
        return _FLAG_KINDS.get(self.value_type, "string")  # int | str ("auto") is a string

    @property
    def flag_spec(self) -> cli.FlagSpec:
        """Its absl flag."""
        return cli.FlagSpec(
            self.name,
            self.default,
            self.flag_help,
            kind=self.flag_kind,
            lower_bound=self.lower_bound,
        )

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


_FLAG_KINDS = {str: "string", int: "integer", float: "float", bool: "boolean"}
_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_RANGES = {POSITIVE: " > 0", NOT_NEGATIVE: " >= 0"}


def option(default: Any, help_text: str, section: str = "", **attributes: Any) -> Any:
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


def flag_specs(rows: Iterable[Option]) -> tuple[cli.FlagSpec, ...]:
    """The absl flags of the rows that are flags, in table order."""
    return tuple(row.flag_spec for row in rows if row.is_flag)


def define_flags(
    rows: Iterable[Option], flag_values: flags.FlagValues, *, module_name: str
) -> dict[str, flags.FlagHolder]:
    """Defines the flags of `rows` in `flag_values`, listed under `module_name`."""
    return cli.define_flags(flag_specs(rows), flag_values, module_name=module_name)


def config_keys(rows: Iterable[Option]) -> tuple[str, ...]:
    """The names a config file may hold, in table order."""
    return tuple(row.name for row in rows if row.is_config_key)


def defaults(rows: Iterable[Option]) -> dict[str, Any]:
    """Each row's default, by name."""
    return {row.name: row.default for row in rows}


def passed_values(rows: Iterable[Option], flag_values: flags.FlagValues) -> dict[str, Any]:
    """The values of the rows' flags given on the command line, by name."""
    return {
        row.name: flag_values[row.name].value
        for row in rows
        if row.is_flag and flag_values[row.name].present
    }
