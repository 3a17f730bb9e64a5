"""What every job writer shares: `python -m trainer.submit` (Vertex AI) and
`python -m trainer.kubernetes` (TFJob, JobSet, TrainJob) own this module together;
neither imports the other.

- `read_json_object`: their JSON files (`--job_config`, `--hparam_tuning`,
  `--check`). Every read is capped (`MAX_CONFIG_BYTES`): a config file is a few
  hundred bytes, and a mistaken path to a large file must not be read into memory.
- `has_flag`, `flag_value`, `crash_loop_guard_args`: the trainer flags (after
  `--`) a job spec carries, read as `trainer.task` reads them (its own flag
  table, `trainer.task_flags.parse_trainer_args`), and the crash-loop guard
  every spec writes.

Configuration only: nothing here imports TensorFlow.
"""

import functools
import types
from typing import Iterable, Mapping, Sequence

from tfdist._internal.json_input import read_json_file
from tfdist._internal.preconditions import quoted, require
from tfdist.errors import DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS
from trainer import task_flags

MAX_CONFIG_BYTES = 1 << 20


def read_json_object(path: str, *, flag: str, keys: Iterable[str], example: str) -> dict:
    """The JSON object in the file at `path`, whose keys must be in `keys`.

    Args:
        path: The file.
        flag: The flag that named it, for messages (e.g. `--job_config`).
        keys: Allowed keys.
        example: A shipped example file, for messages.

    Raises:
        UsageError: Missing, a directory, unreadable, larger than `MAX_CONFIG_BYTES`, not
            UTF-8 JSON, not an object, or with unknown keys.
    """
    shown = quoted(path)
    raw = read_json_file(
        path,
        source=f"{flag} file {shown}",
        hint=f"expected a small JSON object of option names to values such as {example}",
        missing_hint=f"check the path (e.g. {example})",
        max_bytes=MAX_CONFIG_BYTES,
    )
    require(
        isinstance(raw, dict),
        f"{flag} file {shown} holds a JSON {type(raw).__name__}, "
        f"expected an object of option names to values",
    )
    nulls = sorted(key for key, value in raw.items() if value is None)
    require(
        not nulls,
        f"{flag} file {shown} has null for {quoted(', '.join(nulls))}, expected a value; "
        f"leave the key out to keep its default",
    )
    allowed = tuple(keys)
    unknown = sorted(set(raw) - set(allowed))
    require(
        not unknown,
        f"{flag} file {shown} has unknown key(s) "
        f"{quoted(', '.join(unknown))}, expected names from: "
        f"{', '.join(allowed)}",
    )
    return raw


def has_flag(args: Sequence[str], name: str) -> bool:
    """Whether the trainer flags `args` set the option `name` (`trainer.task`'s parse).

    Raises:
        UsageError: `args` are not flags `trainer.task` parses (an unknown flag, a
            malformed value, a positional argument), in one line.
    """
    return name in _parsed(args)


def flag_value(args: Sequence[str], name: str):
    """The value `trainer.task` reads for the option `name` from `args`, else None.

    Raises:
        UsageError: As `has_flag`.
    """
    return _parsed(args).get(name)


def _parsed(args: Sequence[str]) -> Mapping:
    args = tuple(args)
    if not all(isinstance(arg, str) for arg in args):
        return task_flags.parse_trainer_args(args)  # refuses them, in one line
    return _parsed_strings(args)


@functools.lru_cache(maxsize=16)
def _parsed_strings(args: tuple[str, ...]) -> Mapping:
    # A job spec asks several questions of the same arguments: one parse answers them.
    return types.MappingProxyType(task_flags.parse_trainer_args(args))


def crash_loop_guard_args(trainer_args: Sequence[str]) -> tuple[str, ...]:
    """`--max_restarts_without_progress=3` unless `trainer_args` set it.

    Every job spec the submitters write carries the trainer's crash-loop guard
    explicitly: restart policies that do not count restarts (TFJob's `ExitCode`,
    kubeflow/trainer#2045) then still end a crash loop (exit 4).
    """
    if has_flag(trainer_args, "max_restarts_without_progress"):
        return ()
    return (f"--max_restarts_without_progress={DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS}",)
