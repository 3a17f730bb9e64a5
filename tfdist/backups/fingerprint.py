"""The run fingerprint: what a backup must agree with before it is resumed.

Everything that decides what the next step computes goes in: each model
variable's stable path, shape and dtype in the order saved; the optimizer's
class and its variables; the model's mixed-precision policy; and the run
settings the caller adds (global batch, seed, dataset, steps per epoch, ...).
On restart every difference is a `BackupMismatchError` naming the field, the
backup's value and this run's, unless the caller marked the field changeable,
in which case it is logged and allowed.
"""

import dataclasses
import json
import logging
from typing import Mapping, Sequence

import keras

from tfdist.backups.paths import model_variable_paths, optimizer_class_name, optimizer_variable_keys
from tfdist.errors import BackupMismatchError, UsageError

__all__ = [
    "VERSION",
    "VariableEntry",
    "check_run_settings",
    "check_changeable",
    "RunFingerprint",
    "fingerprint_of",
    "variable_order",
    "compare_tracked",
    "compare",
]

_log = logging.getLogger(__name__)
VERSION = 1
_NOT_SET = "(not set)"
_NO_VARIABLE = "(none)"
_SAME_VALUE = "restart with the same value or use a new backup directory"
_SAME_MODEL = "it belongs to another model: build the same model or use a new backup directory"

# (stable path or None, shape, dtype)
VariableEntry = tuple[str | None, list[int], str]


def _json_value(value, name: str):
    try:
        return json.loads(json.dumps(value, allow_nan=False, sort_keys=True))
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"{name} is {value!r}, expected a JSON value (numbers, strings, "
            f"booleans, None, lists, string-keyed dicts; no NaN): {error}"
        ) from None


def check_run_settings(run_settings: Mapping | None) -> dict:
    """Validates the caller's run settings; returns them as plain JSON values.

    Raises:
        UsageError: Not a mapping of string keys to JSON values.
    """
    if run_settings is None:
        return {}
    if not isinstance(run_settings, Mapping) or not all(isinstance(k, str) for k in run_settings):
        raise UsageError(
            f"run_settings is {run_settings!r}, expected a mapping of setting "
            f"names (str) to JSON values, e.g. {{'global_batch_size': 64}}"
        )
    return {
        key: _json_value(value, f"run_settings[{key!r}]") for key, value in run_settings.items()
    }


def check_changeable(changeable: Mapping | None) -> dict[str, str]:
    """Validates `changeable`: field name -> why changing it is safe.

    Raises:
        UsageError: Not a mapping of strings to strings.
    """
    if changeable is None:
        return {}
    if not isinstance(changeable, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in changeable.items()
    ):
        raise UsageError(
            f"changeable is {changeable!r}, expected a mapping of field names "
            f"to the reason a change is safe, e.g. {{'epochs': 'constant "
            f"learning rate'}}"
        )
    return dict(changeable)


@dataclasses.dataclass(frozen=True)
class RunFingerprint:
    """What a backup was made with.

    Attributes:
        run: The caller's run settings (JSON values).
        dtype_policy: The model's dtype policy name (`"mixed_float16"`, ...).
        optimizer: The optimizer class (`"Adam"`, `"LossScaleOptimizer(Adam)"`).
        model_variables: `(path, shape, dtype)` of each model variable, in
            the order saved; `path` is `None` where no stable path exists.
        optimizer_variables: The same for the optimizer's variables, keyed
            like `momentum@q/kernel`.
        tracked: The same for the rest of what the model tracks (its other
            optimizers, metrics, random generators: `tracked.tracked_state`),
            keyed like `d_optimizer/momentum@discriminator/layers/dense/kernel`;
            `None` in backups written before tfdist saved them.
    """

    run: Mapping
    dtype_policy: str | None
    optimizer: str | None
    model_variables: tuple[VariableEntry, ...]
    optimizer_variables: tuple[VariableEntry, ...]
    tracked: tuple[VariableEntry, ...] | None = None

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            "run": dict(self.run),
            "dtype_policy": self.dtype_policy,
            "optimizer": self.optimizer,
            "model_variables": [list(entry) for entry in self.model_variables],
            "optimizer_variables": [list(entry) for entry in self.optimizer_variables],
            **(
                {"tracked": [list(entry) for entry in self.tracked]}
                if self.tracked is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, record, *, where: str) -> "RunFingerprint":
        """Parses a recorded fingerprint.

        Raises:
            BackupMismatchError: It is of an unknown version or malformed.
        """
        if not isinstance(record, dict) or record.get("version") != VERSION:
            version = record.get("version") if isinstance(record, dict) else None
            raise BackupMismatchError(
                f"the backup {where} has a run fingerprint of version {version!r}, this "
                f"tfdist reads version {VERSION}; resume it with the tfdist that wrote it or "
                f"use a new backup directory",
                field="fingerprint version",
                backup_value=repr(version),
                run_value=str(VERSION),
            )

        def entries(name):
            return tuple((path, list(shape), dtype) for path, shape, dtype in record[name])

        try:
            return cls(
                run=dict(record.get("run") or {}),
                dtype_policy=record.get("dtype_policy"),
                optimizer=record.get("optimizer"),
                model_variables=entries("model_variables"),
                optimizer_variables=entries("optimizer_variables"),
                tracked=entries("tracked") if "tracked" in record else None,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise BackupMismatchError(
                f"the backup {where} has a malformed run fingerprint ({error!r}); resume it "
                f"with the tfdist that wrote it or use a new backup directory",
                field="fingerprint",
            ) from None


def _entries(variables: Sequence, paths: Sequence) -> tuple[VariableEntry, ...]:
    return tuple(
        (path, [int(d) for d in variable.shape], str(variable.dtype))
        for variable, path in zip(variables, paths)
    )


def fingerprint_of(model, *, run_settings: Mapping) -> RunFingerprint:
    """The fingerprint of a built model and its (built) optimizer."""
    optimizer = getattr(model, "optimizer", None)
    optimizer_entries = ()
    if optimizer is not None:
        optimizer_entries = _entries(optimizer.variables, optimizer_variable_keys(optimizer, model))
    policy = getattr(model, "dtype_policy", None)
    return RunFingerprint(
        run=dict(run_settings),
        dtype_policy=getattr(policy, "name", None) or keras.config.dtype_policy().name,
        optimizer=optimizer_class_name(optimizer),
        model_variables=_entries(model.variables, model_variable_paths(model)),
        optimizer_variables=optimizer_entries,
    )


def _show(value) -> str:
    if value is _NOT_SET:
        return _NOT_SET
    return json.dumps(value, sort_keys=True)


def _mismatch(backup_dir: str, field: str, old: str, new: str, hint: str = _SAME_VALUE):
    return BackupMismatchError(
        f"the backup in {backup_dir} was made with {field}={old}, this run has {new}; {hint}",
        field=field,
        backup_value=old,
        run_value=new,
    )


def _describe(entry: VariableEntry | None) -> str:
    if entry is None:
        return _NO_VARIABLE
    return f"{entry[1]} {entry[2]}"


def variable_order(
    saved: Sequence[VariableEntry], current: Sequence[VariableEntry], *, what: str, backup_dir: str
) -> tuple[list[int], bool]:
    """Which current variable restores each saved one, in saved order.

    By stable path when both sides have a unique path for every variable;
    otherwise by position, with a warning.

    Returns:
        `(order, by_path)`: `order[i]` indexes `current` for saved entry `i`.

    Raises:
        BackupMismatchError: A variable is missing on one side, or its shape
            or dtype differs.
    """
    hint = _SAME_MODEL if what == "model variable" else _SAME_VALUE
    saved_paths = [entry[0] for entry in saved]
    current_paths = [entry[0] for entry in current]

    def unique(paths):
        return None not in paths and len(set(paths)) == len(paths)

    if unique(saved_paths) and unique(current_paths):
        index = {path: i for i, path in enumerate(current_paths)}
        for entry in saved:
            other = current[index[entry[0]]] if entry[0] in index else None
            if other is None or list(other[1:]) != list(entry[1:]):
                raise _mismatch(
                    backup_dir, f"{what} {entry[0]}", _describe(entry), _describe(other), hint
                )
        known = set(saved_paths)
        for entry in current:
            if entry[0] not in known:
                raise _mismatch(
                    backup_dir, f"{what} {entry[0]}", _NO_VARIABLE, _describe(entry), hint
                )
        return [index[path] for path in saved_paths], True
    side = "the backup" if not unique(saved_paths) else "this run"
    _log.warning(
        "Restoring the %ss by position: %s has %s without a unique stable path; "
        "a reordering of same-shape variables would go unnoticed.",
        what,
        side,
        what,
    )
    if len(saved) != len(current):
        raise _mismatch(backup_dir, f"number of {what}s", str(len(saved)), str(len(current)), hint)
    for position, (old, new) in enumerate(zip(saved, current)):
        if list(old[1:]) != list(new[1:]):
            raise _mismatch(
                backup_dir,
                f"{what} #{position} ({old[0] or new[0] or '?'})",
                _describe(old),
                _describe(new),
                hint,
            )
    return list(range(len(current))), False


def compare_tracked(
    saved: Sequence[VariableEntry], current: Sequence[VariableEntry], *, backup_dir: str
) -> None:
    """Checks that the backup's tracked state has the same keys, shapes and dtypes as this run's.

    Raises:
        BackupMismatchError: The first key missing on one side or different.
    """
    now = {entry[0]: entry for entry in current}
    for entry in saved:
        other = now.get(entry[0])
        if other is None or list(other[1:]) != list(entry[1:]):
            raise _mismatch(
                backup_dir, f"tracked {entry[0]}", _describe(entry), _describe(other), _SAME_MODEL
            )
    known = {entry[0] for entry in saved}
    for entry in current:
        if entry[0] not in known:
            raise _mismatch(
                backup_dir, f"tracked {entry[0]}", _NO_VARIABLE, _describe(entry), _SAME_MODEL
            )


def compare(
    saved: RunFingerprint,
    current: RunFingerprint,
    *,
    backup_dir: str,
    changeable: Mapping[str, str],
) -> tuple[list[int], list[int]]:
    """Checks that `current` may resume a backup made with `saved`.

    Fields in `changeable` (run settings, `dtype_policy`, `optimizer`) may
    differ; the differences are logged in one line.

    Returns:
        The restore order of the model and of the optimizer variables (see
        `variable_order`).

    Raises:
        BackupMismatchError: The first difference, in one line.
    """
    fields = [
        (key, saved.run.get(key, _NOT_SET), current.run.get(key, _NOT_SET))
        for key in [*saved.run, *sorted(set(current.run) - set(saved.run))]
    ]
    fields += [
        ("dtype_policy", saved.dtype_policy, current.dtype_policy),
        ("optimizer", saved.optimizer, current.optimizer),
    ]
    allowed = []
    for field, old, new in fields:
        if old == new and isinstance(old, bool) == isinstance(new, bool):
            continue
        if field in changeable:
            allowed.append(f"{field}={_show(old)} -> {_show(new)} ({changeable[field]})")
            continue
        raise _mismatch(backup_dir, field, _show(old), _show(new))
    model_order, _ = variable_order(
        saved.model_variables, current.model_variables, what="model variable", backup_dir=backup_dir
    )
    optimizer_order, _ = variable_order(
        saved.optimizer_variables,
        current.optimizer_variables,
        what="optimizer variable",
        backup_dir=backup_dir,
    )
    if allowed:
        _log.info(
            "Resuming %s with changed settings the caller allows: %s",
            backup_dir,
            "; ".join(allowed),
        )
    return model_order, optimizer_order
