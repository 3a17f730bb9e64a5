"""The experiment configuration: embedded defaults, config files, flag overrides.

`ExperimentConfig` is the trainer's option table (`trainer.options`): each
field is one option, its flag and its config-file key. A pure module (no
TensorFlow import), so that bad input is rejected before any task tries to
reach another.
"""

import dataclasses
import math
from typing import Any, Mapping

from tfdist._internal.json_input import read_json_file
from tfdist._internal.preconditions import quoted, require
from tfdist.distribute.choice import ALL_REDUCE, STRATEGIES, STRATEGY_DEFAULTS
from tfdist.errors import DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS, UsageError
from tfdist.optimizers import choice as optimizer_choice
from tfdist.outputs.export import EXPORT_FORMATS, check_export_format
from trainer import options as options_lib
from trainer.options import (
    DISTRIBUTION,
    MODEL_AND_DATA,
    NOT_NEGATIVE,
    NUMERICS,
    OPTIMIZATION,
    OUTPUTS,
    POSITIVE,
    SCHEDULE,
    option,
)

OPTIMIZERS = optimizer_choice.OPTIMIZERS
LR_SCALING_RULES = optimizer_choice.SCALING_RULES
LR_DECAYS = optimizer_choice.DECAYS
JIT_COMPILE = ("auto", "true", "false")
ALL_REDUCE_DTYPES = ("float32", "bfloat16")
MIXED_PRECISION = ("none", "mixed_float16", "mixed_bfloat16")
AUTO = "auto"
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**32 - 1  # numpy.random.seed's bound (keras.utils.set_random_seed seeds NumPy)

_MOMENTUM_RANGES = ", ".join(
    f"`{name}` {ranges['momentum']}"
    for name, ranges in optimizer_choice.ARGUMENT_RANGES.items()
    if "momentum" in ranges
)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Everything one training run needs, validated on construction.

    Each field is one row of the trainer's option table (`trainer.options`):
    its flag and config-file key, type, default, choices, range and help.
    The defaults are the embedded default job: a small MLP on the offline
    synthetic dataset that trains on a CPU in well under a minute.
    """

    strategy: str = option(
        STRATEGY_DEFAULTS["strategy"],
        "",
        DISTRIBUTION,
        choices=STRATEGIES,
        flag_module="tfdist.distribute.flags",
        details="`auto` picks from the cluster and the machine and logs why: `tpu` if "
        "`--tpu` is set, `parameter_server` if the cluster has ps tasks, "
        "`multiworker` if it has more than one chief/worker task, `mirrored` with "
        "several GPUs, `one_device` with one GPU, else `default`.",
    )
    all_reduce: str = option(
        STRATEGY_DEFAULTS["all_reduce"],
        "",
        DISTRIBUTION,
        choices=ALL_REDUCE,
        flag_module="tfdist.distribute.flags",
        details="For `multiworker` it picks the MultiWorkerMirroredStrategy communication; "
        "for `mirrored` on GPUs, `nccl` is NCCL all-reduce and `ring` hierarchical "
        "copy. On CPUs `mirrored` always reduces on one device.",
    )
    tpu: str = option(
        STRATEGY_DEFAULTS["tpu"],
        "",
        DISTRIBUTION,
        flag_module="tfdist.distribute.flags",
        details="Setting it makes `--strategy=auto` choose `tpu`.",
    )
    num_cpu_devices: int = option(
        STRATEGY_DEFAULTS["num_cpu_devices"],
        "",
        DISTRIBUTION,
        check=NOT_NEGATIVE,
        flag_module="tfdist.distribute.flags",
        details="One replica each, so mirrored training can be tried on a laptop; `0` keeps "
        "one device.",
    )
    peer_timeout_seconds: float = option(
        STRATEGY_DEFAULTS["peer_timeout_seconds"],
        "",
        DISTRIBUTION,
        check=POSITIVE,
        flag_module="tfdist.distribute.flags",
        details="A task that stops answering (frozen by SIGSTOP, a hung host) is detected "
        "within this bound plus a few seconds and the others exit 200. Multiworker: the "
        "coordination service's heartbeat timeout; parameter servers: the chief probes "
        "every worker and ps, and they probe the chief.",
    )
    chief_start_timeout_seconds: float = option(
        1800.0,
        "Worker and ps tasks of a parameter-server job: seconds to wait for the chief to "
        "come up, then exit 200 (restart policies retry it).",
        DISTRIBUTION,
        check=POSITIVE,
    )
    task: str = option(
        "",
        "Your task as MODULE:NAME (a class or zero-argument factory with build_model, "
        "build_inputs, loss and metrics; see docs/tasks.md). Replaces --model, "
        "--dataset, --data_dir and --num_examples.",
        MODEL_AND_DATA,
        details="The contract: [tasks](tasks.md).",
    )
    task_config: str = option(
        "",
        "Keyword arguments for --task: a JSON object, or the path of a JSON file.",
        MODEL_AND_DATA,
        details="E.g. `'{\"units\": 128}'`.",
    )
    model: str = option(
        "mlp",
        "Built-in model when no --task is given: mlp (two hidden layers) or cnn (two conv blocks).",
        MODEL_AND_DATA,
    )
    dataset: str = option(
        "synthetic",
        "'synthetic' (offline: class templates plus noise, deterministic for "
        "--seed, learnable) or the name of a tfds image-classification dataset "
        "with (image, label) supervised keys, e.g. mnist.",
        MODEL_AND_DATA,
        details="A tfds dataset without them is a usage error (exit 2): write a task for it.",
    )
    data_dir: str = option(
        "",
        "tfds data directory; nothing is downloaded.",
        MODEL_AND_DATA,
        details="Prepare the dataset once with `tfds build NAME --data_dir=DIR`.",
    )
    num_examples: int = option(
        8192,
        "Training examples of the synthetic dataset.",
        MODEL_AND_DATA,
        check=POSITIVE,
        details="Its test split has one eighth as many.",
    )
    epochs: int = option(3, "Training epochs.", SCHEDULE, check=POSITIVE)
    steps_per_epoch: int = option(
        0,
        "Optimizer updates per epoch; default: the training examples over the global batch.",
        SCHEDULE,
        doc_default="`0` (unset)",
        zero_unsets="a positive number of steps; leave it unset to use the whole dataset",
        details="Unset, one pass (the remainder is dropped). Each pass over the examples is "
        "its own seeded permutation, whatever the epoch length. Passing `0` is an "
        "error.",
    )
    validation_steps: int = option(
        0,
        "Validation batches after each epoch; 0 skips validation.",
        SCHEDULE,
        check=NOT_NEGATIVE,
        details="The test split is always evaluated once at the end.",
    )
    global_batch_size: int = option(
        64,
        "Examples per step summed over all replicas.",
        SCHEDULE,
        check=POSITIVE,
        details="It must divide evenly among them (e.g. 64 on 3 replicas is an error that "
        "suggests 63 or 66). Each replica computes on "
        "`global_batch_size / num_replicas`.",
    )
    # "auto" (tfdist.distribute.execution_tuner measures at the start) or a number of steps.
    steps_per_execution: int | str = option(
        AUTO,
        "'auto' (measured at the start of training) or the steps run per call into "
        "the compiled training function.",
        SCHEDULE,
        details="`auto` measures a few values at the start of training (probes that are "
        "rolled back exactly, then logs one line: `steps_per_execution=auto chose "
        "N: ...`) and keeps the largest within 5% of the fastest, among divisors of "
        "the epoch, of `--backup_every_steps` and of a resumed partial epoch, with "
        "an execution under ~1 s so a preemption notice is seen quickly. Probing is "
        "bounded: it costs at most 5% of the run's estimated time or 3 s, whichever "
        "is larger (it stops after the execution that reaches the budget and starts "
        "no candidate it cannot afford; the log line gives the steps probed and the "
        "budget) (`tfdist.distribute.execution_tuner`). Under `parameter_server` auto is computed, not "
        "probed: the largest closure (at most 64 steps) that divides the sync point and gives "
        "every worker an equal number of closures, logged as `steps_per_execution=auto chose N "
        "under parameter servers: ...`. "
        "A number must divide the steps of an epoch (Keras would otherwise run whole "
        "executions past the epoch end: 10 steps at 3 per execution would run 12); a "
        "value that does not is a usage error naming the nearest divisor.",
    )
    jit_compile: str = option(
        "auto",
        "XLA for the training step.",
        SCHEDULE,
        choices=JIT_COMPILE,
        details="Under `mirrored` and `multiworker`, XLA compiles each replica's forward and "
        "backward pass while the gradient all-reduce and the update stay outside "
        "(Keras 3 alone turns XLA off under every strategy). `auto` is off on CPUs "
        "(measured: cnn 0.31-0.43x, mlp no faster), on for GPUs and TPUs, off under "
        "parameter servers, and logs why; `true` under parameter servers is a usage "
        "error.",
    )
    all_reduce_dtype: str = option(
        "float32",
        "Dtype of the gradient all-reduce across replicas: bfloat16 sends half "
        "the bytes, each gradient sum rounded to 8 significant bits before the "
        "update.",
        SCHEDULE,
        choices=ALL_REDUCE_DTYPES,
        details="Accuracy cost measured in [benchmarks](benchmarks.md). Changes nothing with "
        "one replica.",
    )
    optimizer: str = option(
        "sgd",
        "Optimizer; lars and lamb are tfdist.optimizers.LARS and LAMB.",
        OPTIMIZATION,
        choices=OPTIMIZERS,
    )
    learning_rate: float = option(
        0.05,
        "Base learning rate; with --lr_scaling, the rate for --reference_batch_size "
        "(the scaled peak is logged).",
        OPTIMIZATION,
        check=POSITIVE,
    )
    momentum: float = option(
        0.9,
        "Momentum for sgd and lars.",
        OPTIMIZATION,
        check=NOT_NEGATIVE,
        details=f"Range: {_MOMENTUM_RANGES} (checked before training starts).",
    )
    weight_decay: float = option(
        0.0,
        "lars/lamb: L2 rate added inside the trust ratio; sgd/adam: Keras decoupled "
        "weight decay; 0 disables.",
        OPTIMIZATION,
        check=NOT_NEGATIVE,
    )
    lr_scaling: str = option(
        "none",
        "Scale the learning rate by global batch: linear (x B/ref) or sqrt "
        "(x sqrt(B/ref)); needs --reference_batch_size.",
        OPTIMIZATION,
        choices=LR_SCALING_RULES,
    )
    reference_batch_size: int = option(
        0, "Batch size --learning_rate was tuned for.", OPTIMIZATION, check=NOT_NEGATIVE
    )
    warmup_epochs: float = option(
        0.0,
        "Linear warmup to the peak over this many epochs; set at most one of "
        "--warmup_epochs and --warmup_steps.",
        OPTIMIZATION,
        check=NOT_NEGATIVE,
    )
    warmup_steps: int = option(
        0, "Linear warmup to the peak over this many steps.", OPTIMIZATION, check=NOT_NEGATIVE
    )
    lr_decay: str = option("constant", "Decay after warmup.", OPTIMIZATION, choices=LR_DECAYS)
    decay_power: float = option(
        2.0, "Power of the polynomial decay.", OPTIMIZATION, check=NOT_NEGATIVE
    )
    decay_boundaries: tuple[float, ...] = option(
        (),
        "Step decay: comma-separated increasing fractions in (0,1) of the post-warmup "
        "steps, e.g. 0.5,0.75.",
        OPTIMIZATION,
        details="At each one the rate is multiplied by `--decay_rate`.",
    )
    decay_rate: float = option(0.1, "Factor applied at each step-decay boundary.", OPTIMIZATION)
    exclude_from_weight_decay: tuple[str, ...] = option(
        (),
        "Comma-separated regexes searched in variable paths that get no weight decay; "
        "lars/lamb default: biases and normalization parameters.",
        OPTIMIZATION,
        details="Matched with `re.search`, e.g. `dense/bias`; for sgd/adam against the "
        "variable's name (its path in the TensorFlow backend).",
    )
    exclude_from_layer_adaptation: tuple[str, ...] = option(
        (),
        "Comma-separated regexes of variable paths that skip the LARS/LAMB trust ratio "
        "(full learning rate); default: none.",
        OPTIMIZATION,
    )
    seed: int = option(
        0,
        "Seed for weights, synthetic data and shuffling.",
        NUMERICS,
        check=lambda value: check_seed(value),
        details=f"From 0 to {MAX_SEED} (NumPy's range).",
    )
    deterministic: bool = option(
        False,
        "Make TensorFlow ops deterministic and turn grappler off (slower).",
        NUMERICS,
        details="`--nodeterministic` turns it off again over a config file.",
    )
    mixed_precision: str = option(
        "none",
        "Mixed precision policy; the models keep float32 logits.",
        NUMERICS,
        choices=MIXED_PRECISION,
    )
    model_dir: str = option(
        "",
        "Where the chief writes model.keras and summary.json; default $AIP_MODEL_DIR.",
        OUTPUTS,
        doc_default="`$AIP_MODEL_DIR`",
        details="With neither set the run saves nothing (and says so).",
    )
    backup_dir: str = option(
        "",
        "Backup-and-restore directory; default $AIP_CHECKPOINT_DIR.",
        OUTPUTS,
        doc_default="`$AIP_CHECKPOINT_DIR`",
        details="A restarted job resumes from the last backup. Unset: no backups.",
    )
    backup_every_steps: int = option(
        0,
        "Back up every N steps (and at each epoch end).",
        OUTPUTS,
        doc_default="`0` (unset)",
        zero_unsets="a positive number of steps; leave it unset to back up once per epoch",
        details="Unset: once per epoch. Passing `0` is an error.",
    )
    max_input_state_mb: int = option(
        128,
        "Largest tf.data iterator state of a task's own dataset saved per worker per backup, "
        "in MiB.",
        OUTPUTS,
        check=NOT_NEGATIVE,
        details="Above it the position is not saved (one warning) and a restart skips the "
        "batches already taken, decoding them again; `0` never saves it.",
    )
    keep_backup: bool = option(
        False,
        "Keep the backup after training completes.",
        OUTPUTS,
        details="By default it is deleted once the outputs exist.",
    )
    preemption_grace_seconds: float = option(
        25.0,
        "After SIGTERM, seconds to finish the step, save and exit 143 (137 if the "
        "backup could not commit in time).",
        OUTPUTS,
        check=POSITIVE,
    )
    max_restarts_without_progress: int = option(
        DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS,
        "Restarts allowed from one backup without committing a new one; one more stops "
        "the job with exit 4.",
        OUTPUTS,
        check=NOT_NEGATIVE,
        details="Counted in the backup directory, so it holds whatever restarts the job "
        "(TFJob's backoffLimit does not count ExitCode restarts). Progress resets it.",
    )
    tensorboard_dir: str = option(
        "",
        "TensorBoard logs, chief only; default $AIP_TENSORBOARD_LOG_DIR or <model_dir>/logs.",
        OUTPUTS,
        doc_default="`$AIP_TENSORBOARD_LOG_DIR`, else `<model_dir>/logs`",
    )
    evaluation_checkpoints: bool = option(
        False,
        "Export a checkpoint per epoch to <model_dir>/checkpoints for an evaluator "
        "task (the newest 3 are kept); on by itself when the cluster lists an "
        "evaluator (Vertex worker pool 3).",
        OUTPUTS,
        details="`tfdist.launch --evaluator` does not tell the chief, so pass it there.",
    )
    export: str = option(
        "",
        "What the chief exports to --model_dir: keras writes model.keras, savedmodel a "
        "SavedModel that Vertex AI Prediction serves; default both on Vertex AI "
        "(AIP_MODEL_DIR set), else keras.",
        OUTPUTS,
        choices=EXPORT_FORMATS,
        check=check_export_format,
        doc_default="`both` on Vertex AI (`AIP_MODEL_DIR` set), else `keras`",
        details="The SavedModel has a `serving_default` signature, which Vertex AI "
        "Prediction's TensorFlow containers serve. `summary.json` is written last, "
        "after the model files.",
    )
    hparam_metric: str = option(
        "",
        "Report this epoch metric (e.g. val_accuracy) to Vertex AI hyperparameter "
        "tuning after every epoch, from the chief.",
        OUTPUTS,
        details="`val_` metrics need `--validation_steps`. Written in the format Vertex AI "
        "hyperparameter tuning reads (`CLOUD_ML_HP_METRIC_FILE`); inside a tuning "
        "trial, `--model_dir` and `--backup_dir` get `/<trial id>` appended.",
    )

    def __post_init__(self):
        for row in OPTIONS:
            _check_finite(row.name, getattr(self, row.name))
            _check_option(row, getattr(self, row.name))
        if self.task_config and not self.task:
            raise UsageError(
                "--task_config is set but --task is not, so nothing would read it, expected "
                "--task=MODULE:NAME with it; add --task or drop --task_config"
            )
        spe = self.steps_per_execution
        require(
            spe == AUTO or (isinstance(spe, int) and not isinstance(spe, bool) and spe > 0),
            f"--steps_per_execution is {spe!r}, expected 'auto' or a positive whole number "
            f"of steps, e.g. --steps_per_execution=16",
        )
        optimizer_choice.check_arguments(
            self.optimizer,
            {"momentum": self.momentum, "weight_decay_rate": self.weight_decay},
            names={"momentum": "--momentum", "weight_decay_rate": "--weight_decay"},
            prefix=f"--optimizer={self.optimizer}:",
        )
        if self.lr_scaling != "none" and not self.reference_batch_size:
            raise UsageError(
                f"--lr_scaling={self.lr_scaling} needs --reference_batch_size, the batch "
                f"size --learning_rate was tuned for; set it, e.g. --reference_batch_size=256"
            )
        if self.warmup_epochs and self.warmup_steps:
            raise UsageError(
                f"--warmup_epochs ({self.warmup_epochs}) and --warmup_steps "
                f"({self.warmup_steps}) are both set, expected one; keep one of them"
            )
        if self.hparam_metric.startswith("val_") and not self.validation_steps:
            raise UsageError(
                f"--hparam_metric={self.hparam_metric} is a validation metric but "
                f"--validation_steps is 0, so no epoch validates and nothing would be "
                f"reported; set --validation_steps (e.g. 10) or report a training metric"
            )
        if self.steps_per_epoch and self.steps_per_execution != AUTO:
            check_steps_per_execution(self.steps_per_execution, self.steps_per_epoch)
        if self.strategy != "mirrored" and self.num_cpu_devices:
            raise UsageError(
                f"--num_cpu_devices={self.num_cpu_devices} only applies to "
                f"--strategy=mirrored, got --strategy={self.strategy}; drop the flag"
            )

    def replace(self, **changes: Any) -> "ExperimentConfig":
        return dataclasses.replace(self, **changes)

    def to_json_dict(self) -> dict:
        """The config as a `--config` file holds it; unset optional fields are left out."""
        return {
            field.name: (list(value) if isinstance(value, tuple) else value)
            for field in dataclasses.fields(self)
            for value in [getattr(self, field.name)]
            if not (OPTION[field.name].zero_unsets and value == 0)
        }


def check_seed(value: int) -> int:
    """Raises `UsageError` unless `value` is a seed NumPy, Python and TensorFlow all take."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise UsageError(f"--seed is {quoted(value)}, expected a whole number from 0 to {MAX_SEED}")
    return value


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
            f"--steps_per_epoch"
        )


def _check_finite(name: str, value: Any) -> None:
    """No option takes NaN or an infinity (`--preemption_grace_seconds=inf` would never fire).

    Nor a count past int32 (`--steps_per_epoch=2**63` is no epoch; TensorFlow counts in int64
    and would overflow), the seed excepted (its own range).
    """
    values = value if isinstance(value, tuple) else (value,)
    for item in values:
        if isinstance(item, float) and not math.isfinite(item):
            raise UsageError(f"--{name} is {quoted(value)}, expected a finite number")
        if name != "seed" and isinstance(item, int) and abs(item) > MAX_COUNT:
            raise UsageError(f"--{name} is {quoted(value)}, expected at most {MAX_COUNT}")


def _check_option(row: options_lib.Option, value: Any) -> None:
    """The checks the option table declares: choices, range, a 0 that means unset."""
    if callable(row.check):
        if value != row.default:
            row.check(value)
    elif row.choices and value != row.default:
        _one_of(row.name, value, row.choices)
    elif row.check == POSITIVE:
        _positive(row.name, value)
    elif row.check == NOT_NEGATIVE:
        _not_negative(row.name, value)
    if row.zero_unsets and value < 0:
        raise UsageError(f"--{row.name} is {value!r}, expected {row.zero_unsets}")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UsageError(f"--{name} is {value!r}, expected one of: {', '.join(allowed)}")


def _positive(name: str, value) -> None:
    if not value > 0:
        raise UsageError(f"--{name} is {value!r}, expected a number > 0")


def _not_negative(name: str, value) -> None:
    if value < 0:
        raise UsageError(f"--{name} is {value!r}, expected a number >= 0")


OPTIONS = options_lib.table(ExperimentConfig)
OPTION = {row.name: row for row in OPTIONS}
FIELDS = {field.name: field for field in dataclasses.fields(ExperimentConfig)}


def coerce_steps_per_execution(value: Any, source: str = "flag") -> int | str:
    """`"auto"`, or a positive whole number given as a number or a string of digits."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(
            f"{source}: steps_per_execution is {value!r}, expected 'auto' or a "
            f"positive whole number of steps, e.g. --steps_per_execution=16"
        )
    return value


def _coerce(name: str, value: Any, source: str) -> Any:
    if name == "steps_per_execution":
        return coerce_steps_per_execution(value, source)
    row = OPTION[name]
    element = row.element_type
    if element is not None:
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{source}: {name} is {quoted(value)}, expected a list")
        try:
            return tuple(_element(element, v) for v in value)
        except (TypeError, ValueError):
            raise UsageError(
                f"{source}: {name} is {value!r}, expected a list of {element.__name__} values"
            ) from None
    expected = row.value_type
    if expected is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{source}: {name} is {value!r}, expected true or false")
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise UsageError(f"{source}: {name} is {value!r}, expected a {expected.__name__}")
    if row.zero_unsets and value == 0:
        raise UsageError(f"{source}: {name} is 0, expected {row.zero_unsets}")
    return value


def _element(element: type, value: Any) -> Any:
    """One list item: a string stays one, a number must be one (never `null` or `true`)."""
    if element is str:
        if not isinstance(value, str):
            raise TypeError(value)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(value)
    return element(value)


def load_config_file(path: str) -> dict:
    """Reads a JSON config file into field overrides.

    Raises:
        UsageError: The file is missing, a directory, unreadable, too large, not
            JSON, not an object, or names unknown fields.
    """
    source = f"--config file {quoted(path)}"
    raw = read_json_file(
        path,
        source=source,
        hint="expected a JSON object of field names to values",
        missing_hint="check the path (e.g. configs/default.json)",
    )
    if not isinstance(raw, dict):
        raise UsageError(
            f"{source} holds a JSON {type(raw).__name__}, "
            f"expected an object of field names to values"
        )
    return _overrides(raw, source)


def _overrides(raw: Mapping[str, Any], source: str) -> dict:
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise UsageError(
            f"{source} has unknown field(s) {', '.join(unknown)}, expected "
            f"names from: {', '.join(FIELDS)}"
        )
    return {name: _coerce(name, value, source) for name, value in raw.items()}


def check_option_value(name: str, value: Any) -> Any:
    """One option's value checked alone (type, range, choices), as a flag; returns it coerced.

    For a command line whose `--config` file cannot be read here: the rules
    between options wait for the file.
    """
    coerced = _overrides({name: value}, "flag")[name]
    if name != "steps_per_execution":
        _check_finite(name, coerced)
        _check_option(OPTION[name], coerced)
    return coerced


def build_config(
    file_values: Mapping[str, Any] | None = None, flag_values: Mapping[str, Any] | None = None
) -> ExperimentConfig:
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
