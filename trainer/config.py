"""The experiment configuration: embedded defaults, config files, flag overrides.

A pure module (no TensorFlow import), so that bad input is rejected before any
task tries to reach another.
"""

import dataclasses
import json
import os
from typing import Any, Mapping

from tfdist.errors import UsageError
from tfdist._internal.preconditions import require
from tfdist.outputs.export import check_export_format
from tfdist.distribute.choice import STRATEGIES

OPTIMIZERS = ("sgd", "adam", "lars", "lamb")
LR_SCALING_RULES = ("none", "linear", "sqrt")
LR_DECAYS = ("constant", "cosine", "polynomial", "step")
ALL_REDUCE = ("auto", "ring", "nccl")
JIT_COMPILE = ("auto", "true", "false")
ALL_REDUCE_DTYPES = ("float32", "bfloat16")
MIXED_PRECISION = ("none", "mixed_float16", "mixed_bfloat16")
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Everything one training run needs, validated on construction.

    The defaults are the embedded default job: a small MLP on the offline
    synthetic dataset that trains on a CPU in well under a minute.
    """

    # Distribution.
    strategy: str = "auto"
    all_reduce: str = "auto"
    tpu: str = ""
    num_cpu_devices: int = 0
    # Model and data: a user's task, or a built-in model on a built-in dataset.
    task: str = ""
    task_config: str = ""
    model: str = "mlp"
    dataset: str = "synthetic"
    data_dir: str = ""
    num_examples: int = 8192
    # Schedule.
    epochs: int = 3
    steps_per_epoch: int = 0
    validation_steps: int = 0
    global_batch_size: int = 64
    # "auto" (tfdist.distribute.execution_tuner measures at the start) or a number of steps.
    steps_per_execution: int | str = AUTO
    jit_compile: str = "auto"
    all_reduce_dtype: str = "float32"
    # Optimization.
    optimizer: str = "sgd"
    learning_rate: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_scaling: str = "none"
    reference_batch_size: int = 0
    warmup_epochs: float = 0.0
    warmup_steps: int = 0
    lr_decay: str = "constant"
    decay_power: float = 2.0
    decay_boundaries: tuple[float, ...] = ()
    decay_rate: float = 0.1
    exclude_from_weight_decay: tuple[str, ...] = ()
    exclude_from_layer_adaptation: tuple[str, ...] = ()
    # Reproducibility and numerics.
    seed: int = 0
    deterministic: bool = False
    mixed_precision: str = "none"
    # Outputs and fault tolerance.
    model_dir: str = ""
    backup_dir: str = ""
    backup_every_steps: int = 0
    keep_backup: bool = False
    preemption_grace_seconds: float = 25.0
    tensorboard_dir: str = ""
    evaluation_checkpoints: bool = False
    export: str = ""
    hparam_metric: str = ""

    def __post_init__(self):
        _one_of("strategy", self.strategy, STRATEGIES)
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        _one_of("lr_scaling", self.lr_scaling, LR_SCALING_RULES)
        _one_of("lr_decay", self.lr_decay, LR_DECAYS)
        _one_of("all_reduce", self.all_reduce, ALL_REDUCE)
        _one_of("mixed_precision", self.mixed_precision, MIXED_PRECISION)
        _one_of("jit_compile", self.jit_compile, JIT_COMPILE)
        _one_of("all_reduce_dtype", self.all_reduce_dtype, ALL_REDUCE_DTYPES)
        for name in ("epochs", "global_batch_size", "num_examples"):
            _positive(name, getattr(self, name))
        spe = self.steps_per_execution
        require(spe == AUTO or (isinstance(spe, int) and not isinstance(spe, bool) and spe > 0),
                f"--steps_per_execution is {spe!r}, expected 'auto' or a positive whole number "
                f"of steps, e.g. --steps_per_execution=16")
        _positive("learning_rate", self.learning_rate)
        for name in ("steps_per_epoch", "validation_steps", "reference_batch_size",
                     "warmup_steps", "num_cpu_devices"):
            _not_negative(name, getattr(self, name))
        _positive("preemption_grace_seconds", self.preemption_grace_seconds)
        for name in ("warmup_epochs", "weight_decay", "momentum", "decay_power"):
            _not_negative(name, getattr(self, name))
        if self.backup_every_steps < 0:
            raise UsageError(
                f"--backup_every_steps is {self.backup_every_steps}, expected a positive "
                f"number of steps; leave it unset to back up once per epoch")
        if self.lr_scaling != "none" and not self.reference_batch_size:
            raise UsageError(
                f"--lr_scaling={self.lr_scaling} needs --reference_batch_size, the batch "
                f"size --learning_rate was tuned for; set it, e.g. --reference_batch_size=256")
        if self.warmup_epochs and self.warmup_steps:
            raise UsageError(
                f"--warmup_epochs ({self.warmup_epochs}) and --warmup_steps "
                f"({self.warmup_steps}) are both set, expected one; keep one of them")
        if self.export:
            check_export_format(self.export)
        if self.hparam_metric.startswith("val_") and not self.validation_steps:
            raise UsageError(
                f"--hparam_metric={self.hparam_metric} is a validation metric but "
                f"--validation_steps is 0, so no epoch validates and nothing would be "
                f"reported; set --validation_steps (e.g. 10) or report a training metric")
        if self.steps_per_epoch and self.steps_per_execution != AUTO:
            check_steps_per_execution(self.steps_per_execution, self.steps_per_epoch)
        if self.strategy != "mirrored" and self.num_cpu_devices:
            raise UsageError(
                f"--num_cpu_devices={self.num_cpu_devices} only applies to "
                f"--strategy=mirrored, got --strategy={self.strategy}; drop the flag")

    def replace(self, **changes: Any) -> "ExperimentConfig":
        return dataclasses.replace(self, **changes)

    def to_json_dict(self) -> dict:
        """The config as a `--config` file holds it; unset optional fields are left out."""
        return {field.name: (list(value) if isinstance(value, tuple) else value)
                for field in dataclasses.fields(self)
                for value in [getattr(self, field.name)]
                if not (field.name in _USER_ZERO_IS_ERROR and value == 0)}


# Fields whose 0 is the "unset" default but which a user may not set to 0.
_USER_ZERO_IS_ERROR = {
    "backup_every_steps": "a positive number of steps; leave it unset to back up once per epoch",
    "steps_per_epoch": "a positive number of steps; leave it unset to use the whole dataset",
}


def check_steps_per_execution(steps_per_execution: int, steps_per_epoch: int) -> None:
    """Raises `UsageError` unless executions tile every epoch exactly.

    Keras runs whole executions, so an execution that crosses the end of an
    epoch would run steps past it (10 steps at 3 per execution run 12).
    """
    if steps_per_epoch % steps_per_execution:
        divisors = [d for d in range(1, steps_per_epoch + 1) if not steps_per_epoch % d]
        nearest = min(divisors, key=lambda d: (abs(d - steps_per_execution), d))
        raise UsageError(
            f"--steps_per_execution={steps_per_execution} does not divide the "
            f"{steps_per_epoch} steps of an epoch, expected a divisor so that no execution "
            f"runs past an epoch end; use --steps_per_execution={nearest} or change "
            f"--steps_per_epoch")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UsageError(f"--{name} is {value!r}, expected one of: {', '.join(allowed)}")


def _positive(name: str, value) -> None:
    if not value > 0:
        raise UsageError(f"--{name} is {value!r}, expected a number > 0")


def _not_negative(name: str, value) -> None:
    if value < 0:
        raise UsageError(f"--{name} is {value!r}, expected a number >= 0")


FIELDS = {field.name: field for field in dataclasses.fields(ExperimentConfig)}


def coerce_steps_per_execution(value: Any, source: str = "flag") -> int | str:
    """`"auto"`, or a positive whole number given as a number or a string of digits."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{source}: steps_per_execution is {value!r}, expected 'auto' or a "
                         f"positive whole number of steps, e.g. --steps_per_execution=16")
    return value


def _coerce(name: str, value: Any, source: str) -> Any:
    if name == "steps_per_execution":
        return coerce_steps_per_execution(value, source)
    default = FIELDS[name].default
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{source}: {name} is {value!r}, expected a list")
        element = float if name == "decay_boundaries" else str
        try:
            return tuple(element(v) for v in value)
        except (TypeError, ValueError):
            raise UsageError(f"{source}: {name} is {value!r}, expected a list of "
                             f"{element.__name__} values") from None
    expected = type(default)
    if expected is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{source}: {name} is {value!r}, expected true or false")
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise UsageError(f"{source}: {name} is {value!r}, expected a "
                         f"{expected.__name__}")
    if name in _USER_ZERO_IS_ERROR and value == 0:
        raise UsageError(f"{source}: {name} is 0, expected {_USER_ZERO_IS_ERROR[name]}")
    return value


def load_config_file(path: str) -> dict:
    """Reads a JSON config file into field overrides.

    Raises:
        UsageError: The file is missing, is not JSON, or names unknown fields.
    """
    if not os.path.isfile(path):
        raise UsageError(f"--config file {path!r} does not exist, expected a JSON file "
                         f"such as configs/default.json; check the path")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"--config file {path!r} is not valid JSON ({error}); "
                         f"expected a JSON object of field names to values") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--config file {path!r} holds a JSON {type(raw).__name__}, "
                         f"expected an object of field names to values")
    return _overrides(raw, f"--config file {path!r}")


def _overrides(raw: Mapping[str, Any], source: str) -> dict:
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise UsageError(f"{source} has unknown field(s) {', '.join(unknown)}, expected "
                         f"names from: {', '.join(FIELDS)}")
    return {name: _coerce(name, value, source) for name, value in raw.items()}


def build_config(file_values: Mapping[str, Any] | None = None,
                 flag_values: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """Embedded defaults, then a config file's values, then explicit flags.

    Args:
        file_values: Overrides read by `load_config_file`.
        flag_values: Values of the flags the user actually passed.

    Raises:
        UsageError: Any value is malformed or out of range.
    """
    values = dict(file_values or {})
    values.update(_overrides(flag_values or {}, "flag"))
    return ExperimentConfig(**values)
