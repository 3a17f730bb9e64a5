"""Hyperparameter tuning: its options (`TuningOptions`), its model, and the HyperparameterTuningJob JSON.

    python -m trainer.submit --job_config=... --hparam_tuning=configs/tuning/learning_rate_optimizer.json
    python -m trainer.submit ... --hparam_metric=val_accuracy --hparam_goal=maximize \\
        --hparam=learning_rate=double:1e-4:1e-1:log --hparam=optimizer=categorical:sgd,adam \\
        --max_trial_count=20 --parallel_trial_count=4

Vertex AI runs up to `max_trial_count` trials of the job, `parallel_trial_count`
at a time, each with the job's trainer arguments followed by `--NAME=VALUE` for
every parameter (absl keeps the last occurrence, so trial values win). The
trainer reports `--hparam_metric` at each evaluation from the chief
(`tfdist.outputs.hypertune`); the submitter adds `--hparam_metric=METRIC` to the
trainer's arguments. Each trial's outputs go to `<base_output_dir>/<trial_id>/`.

Parameter specs (flag `--hparam=NAME=SPEC`, or `"hparam": {NAME: SPEC}` in a file):
    double:MIN:MAX[:SCALE]      a float in [MIN, MAX]
    integer:MIN:MAX[:SCALE]     a whole number in [MIN, MAX]
    discrete:V1,V2,...[:SCALE]  one of these numbers
    categorical:A,B,...         one of these strings
SCALE is linear (default), log or reverse_log. In a file a SPEC may also be an
object: {"type": "double", "min": 1e-4, "max": 0.1, "scale": "log"},
{"type": "categorical", "values": ["sgd", "adam"]}.

Conditional parameters (files only): an object with "when": {PARENT: [VALUES]}
is tuned only in trials whose PARENT (a categorical, integer or discrete
parameter) takes one of VALUES, e.g. "weight_decay": {"type": "double", "min": 0,
"max": 0.1, "when": {"optimizer": ["lamb", "lars"]}}. It is sent nested under its
parent (`conditionalParameterSpecs`); other trials get the flag's default.

Automated early stopping (`--hparam_early_stopping`): `median` stops a trial
whose metric falls below the median of earlier trials at the same step;
`decay_curve` stops one whose predicted final metric is worse than the best so
far. Both read the metric the trainer reports at each evaluation, by step.
"""

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

from tfdist.errors import UsageError
from trainer import options as options_lib
from trainer import submission, task_flags
from trainer.options import option
from trainer.vertex import option_values, rendering
from trainer.vertex.checks import quoted, require
from trainer.vertex.spec import JobSpec

GOALS = ("maximize", "minimize")
ALGORITHMS = {"bayesian": None, "grid": "GRID_SEARCH", "random": "RANDOM_SEARCH"}
SCALES = {
    "linear": "UNIT_LINEAR_SCALE",
    "log": "UNIT_LOG_SCALE",
    "reverse_log": "UNIT_REVERSE_LOG_SCALE",
}
KINDS = ("double", "integer", "discrete", "categorical")
EARLY_STOPPING = {"median": "medianAutomatedStoppingSpec", "decay_curve": "decayCurveStoppingSpec"}
_PARENT_VALUES = {
    "categorical": "parentCategoricalValues",
    "integer": "parentIntValues",
    "discrete": "parentDiscreteValues",
}
MAX_TRIALS = 1000
MAX_PARAMETERS = 100
MAX_VALUES = 1000
_PARAMETER_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_METRIC = re.compile(r"^[A-Za-z0-9_./-]{1,128}$")
# Flags the submitter itself sets on every replica: a trial must not change them.
_RESERVED_PARAMETERS = ("strategy", "hparam_metric", "tpu")


@dataclasses.dataclass(frozen=True)
class TuningOptions:
    """The options of a tuning study: each field is a flag and an `--hparam_tuning` key."""

    hparam_metric: str = option(
        "",
        "Tuning: the metric the trainer reports at each "
        "evaluation (an epoch-log key such as val_accuracy).",
    )
    hparam_goal: str = option("", "Tuning: maximize or minimize the metric.")
    hparam: tuple[str, ...] = option(
        (),
        "Tuning: NAME=SPEC for a trainer flag, SPEC one of "
        "double:MIN:MAX[:SCALE], integer:MIN:MAX[:SCALE], discrete:V1,V2[:SCALE], "
        "categorical:A,B (repeatable).",
        repeatable=True,
        accumulates=True,
    )
    hparam_algorithm: str = option(
        "bayesian", "Tuning: bayesian (Vertex's default), grid or random."
    )
    max_trial_count: int = option(10, "Tuning: trials in all.")
    parallel_trial_count: int = option(1, "Tuning: trials running at once.")
    max_failed_trial_count: int = option(
        0, "Tuning: failed trials before the job fails (0: Vertex AI decides)."
    )
    hparam_early_stopping: str = option(
        "", "Tuning: automated early stopping of trials: median or decay_curve (empty: none)."
    )
    description: str = option("", "Free text describing a config file.", is_flag=False)


TUNING_OPTIONS = options_lib.table(TuningOptions)
TUNING_KEYS = options_lib.config_keys(TUNING_OPTIONS)
TUNING_DEFAULTS = options_lib.defaults(TUNING_OPTIONS)
_ACCUMULATING = {row.name for row in TUNING_OPTIONS if row.accumulates}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParameterSpec:
    """One tuned trainer flag."""

    parameter_id: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    values: tuple = ()
    scale: str = ""
    # Conditional parameters: (parent parameter id, the parent's values that enable it).
    parent: str = ""
    parent_values: tuple = ()

    def __post_init__(self):
        name = self.parameter_id
        require(
            bool(_PARAMETER_ID.match(name)),
            f"--hparam name {quoted(name)}, expected a trainer.task flag name such as "
            f"learning_rate",
        )
        require(
            name not in _RESERVED_PARAMETERS,
            f"--hparam {name} is set by the submitter on every replica, expected another "
            f"trainer flag",
        )
        require(
            self.kind in KINDS,
            f"--hparam {name} has type {quoted(self.kind)}, expected one of: {', '.join(KINDS)}",
        )
        require(
            not self.scale or (self.scale in SCALES and self.kind != "categorical"),
            f"--hparam {name} has scale {quoted(self.scale)}, expected one of: "
            f"{', '.join(SCALES)} (and none for categorical)",
        )
        if self.kind in ("double", "integer"):
            self._check_range()
        else:
            self._check_values()

    def _check_range(self):
        name, low, high = self.parameter_id, self.low, self.high
        number = int if self.kind == "integer" else (int, float)
        for value in (low, high):
            require(
                isinstance(value, number)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and abs(value) < 2**63,
                f"--hparam {name} bound {quoted(value)} is not a finite "
                f"{'whole number' if self.kind == 'integer' else 'number'}",
            )
        require(low < high, f"--hparam {name} has min {low} >= max {high}, expected min < max")
        require(
            self.scale not in ("log", "reverse_log") or low > 0,
            f"--hparam {name} uses a {self.scale} scale from {low}, expected min > 0",
        )

    def _check_values(self):
        name, values = self.parameter_id, self.values
        require(
            0 < len(values) <= MAX_VALUES and len(set(values)) == len(values),
            f"--hparam {name} has {len(values)} values, expected 1 to {MAX_VALUES} distinct ones",
        )
        if self.kind == "categorical":
            require(
                all(isinstance(value, str) and value and len(value) <= 256 for value in values),
                f"--hparam {name} values {quoted(list(values))}, expected non-empty strings",
            )
            return
        require(
            all(
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                for value in values
            ),
            f"--hparam {name} values {quoted(list(values))}, expected numbers",
        )
        require(
            list(values) == sorted(values),
            f"--hparam {name} values {quoted(list(values))}, expected increasing numbers",
        )
        require(
            self.scale not in ("log", "reverse_log") or min(values) > 0,
            f"--hparam {name} uses a {self.scale} scale, expected values > 0",
        )

    def to_json(self, children: Sequence["ParameterSpec"] = ()) -> dict:
        """The API's ParameterSpec, with `children` nested as conditional parameters."""
        body = {"parameterId": self.parameter_id}
        if self.kind == "double":
            body["doubleValueSpec"] = {"minValue": float(self.low), "maxValue": float(self.high)}
        elif self.kind == "integer":
            body["integerValueSpec"] = {"minValue": str(self.low), "maxValue": str(self.high)}
        elif self.kind == "discrete":
            body["discreteValueSpec"] = {"values": [float(value) for value in self.values]}
        else:
            body["categoricalValueSpec"] = {"values": list(self.values)}
        if self.scale:
            body["scaleType"] = SCALES[self.scale]
        if children:
            body["conditionalParameterSpecs"] = [child.conditional_json(self) for child in children]
        return body

    def conditional_json(self, parent: "ParameterSpec") -> dict:
        values = list(self.parent_values)
        if parent.kind == "integer":
            values = [str(value) for value in values]
        elif parent.kind == "discrete":
            values = [float(value) for value in values]
        return {_PARENT_VALUES[parent.kind]: {"values": values}, "parameterSpec": self.to_json()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningSpec:
    """A hyperparameter tuning study over the trainer's flags."""

    metric: str
    goal: str
    parameters: tuple[ParameterSpec, ...]
    algorithm: str = "bayesian"
    max_trial_count: int = 10
    parallel_trial_count: int = 1
    max_failed_trial_count: int = 0
    early_stopping: str = ""

    def __post_init__(self):
        require(
            bool(self.metric),
            "--hparam_metric is not set, expected the metric the "
            "trainer reports, e.g. --hparam_metric=val_accuracy",
        )
        require(
            bool(_METRIC.match(self.metric)),
            f"--hparam_metric is {quoted(self.metric)}, expected an epoch-log key such as "
            f"val_accuracy",
        )
        require(
            self.goal in GOALS,
            f"--hparam_goal is {quoted(self.goal)}, expected maximize or minimize",
        )
        require(
            self.algorithm in ALGORITHMS,
            f"--hparam_algorithm is {quoted(self.algorithm)}, expected one of: "
            f"{', '.join(ALGORITHMS)}",
        )
        require(
            0 < len(self.parameters) <= MAX_PARAMETERS,
            f"tuning has {len(self.parameters)} parameters, expected 1 to {MAX_PARAMETERS}"
            f"; add e.g. --hparam=learning_rate=double:1e-4:1e-1:log",
        )
        names = [parameter.parameter_id for parameter in self.parameters]
        require(
            len(set(names)) == len(names),
            f"--hparam names repeat in {quoted(names)}, expected each flag once",
        )
        require(
            self.algorithm != "grid"
            or all(parameter.kind != "double" for parameter in self.parameters),
            "--hparam_algorithm=grid needs integer, discrete or categorical parameters, got a "
            "double; use discrete values or another algorithm",
        )
        require(
            not self.early_stopping or self.early_stopping in EARLY_STOPPING,
            f"--hparam_early_stopping is {quoted(self.early_stopping)}, expected one of: "
            f"{', '.join(EARLY_STOPPING)} (or empty for none)",
        )
        self._check_conditions()
        option_values.integer("max_trial_count", self.max_trial_count, low=1, high=MAX_TRIALS)
        option_values.integer(
            "parallel_trial_count", self.parallel_trial_count, low=1, high=self.max_trial_count
        )
        option_values.integer(
            "max_failed_trial_count", self.max_failed_trial_count, low=0, high=self.max_trial_count
        )

    def _check_conditions(self) -> None:
        by_id = {parameter.parameter_id: parameter for parameter in self.parameters}
        for child in self.parameters:
            if not child.parent:
                continue
            name, parent = child.parameter_id, by_id.get(child.parent)
            require(
                parent is not None and parent is not child,
                f"--hparam {name} is conditional on {quoted(child.parent)}, which is not a "
                f"tuned parameter, expected one of: {', '.join(sorted(by_id))}",
            )
            require(
                not parent.parent,
                f"--hparam {name} is conditional on {parent.parameter_id}, itself "
                f"conditional, expected a parent that is always tuned",
            )
            require(
                parent.kind in _PARENT_VALUES,
                f"--hparam {name} is conditional on {parent.parameter_id}, a "
                f"{parent.kind} parameter, expected a categorical, integer or discrete one",
            )
            allowed = (
                range(parent.low, parent.high + 1) if parent.kind == "integer" else parent.values
            )
            require(
                bool(child.parent_values)
                and all(
                    value in allowed and not isinstance(value, bool)
                    for value in child.parent_values
                ),
                f"--hparam {name} is enabled by {parent.parameter_id} values "
                f"{quoted(list(child.parent_values))}, expected some of the values "
                f"{parent.parameter_id} takes",
            )

    def parameters_json(self) -> list[dict]:
        """The study's parameters: conditional ones nested under their parents."""
        children: dict[str, list[ParameterSpec]] = {}
        for parameter in self.parameters:
            if parameter.parent:
                children.setdefault(parameter.parent, []).append(parameter)
        return [
            parameter.to_json(children.get(parameter.parameter_id, ()))
            for parameter in self.parameters
            if not parameter.parent
        ]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "TuningSpec":
        """From merged tuning options (defaults, then `--hparam_tuning`, then flags)."""
        parameters = tuple(
            parse_parameter(name, spec) for name, spec in _parameter_items(options["hparam"])
        )
        return cls(
            metric=option_values.string("hparam_metric", options["hparam_metric"]),
            goal=option_values.string("hparam_goal", options["hparam_goal"]).lower(),
            algorithm=option_values.string("hparam_algorithm", options["hparam_algorithm"]).lower(),
            parameters=parameters,
            max_trial_count=option_values.integer(
                "max_trial_count", options["max_trial_count"], low=1, high=MAX_TRIALS
            ),
            parallel_trial_count=option_values.integer(
                "parallel_trial_count", options["parallel_trial_count"], low=1, high=MAX_TRIALS
            ),
            max_failed_trial_count=option_values.integer(
                "max_failed_trial_count", options["max_failed_trial_count"], high=MAX_TRIALS
            ),
            early_stopping=option_values.string(
                "hparam_early_stopping", options["hparam_early_stopping"]
            ).lower(),
        )


def merge_tuning_options(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> dict:
    """Defaults, then the `--hparam_tuning` file, then flags (`hparam` adds up)."""
    options = dict(TUNING_DEFAULTS)
    for source in (file_values, flag_values):
        for name, value in source.items():
            if name in _ACCUMULATING:
                options[name] = tuple(_parameter_items(options[name])) + tuple(
                    _parameter_items(value)
                )
            else:
                options[name] = value
    return options


def _parameter_items(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [(str(name), spec) for name, spec in value.items()]
    require(
        isinstance(value, (list, tuple)),
        f"hparam is {quoted(value)}, expected NAME=SPEC items or an object of NAME to SPEC",
    )
    items = []
    for item in value:
        if isinstance(item, tuple):
            items.append(item)
            continue
        name, sep, spec = str(item).partition("=")
        require(
            bool(sep),
            f"--hparam item {quoted(item)} has no '=', expected NAME=SPEC such "
            f"as learning_rate=double:1e-4:1e-1:log",
        )
        items.append((name.strip(), spec.strip()))
    return items


def parse_parameter(name: str, spec: Any) -> ParameterSpec:
    """A `ParameterSpec` from `double:MIN:MAX[:SCALE]`-style text or a JSON object."""
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - {"type", "min", "max", "values", "scale", "when"})
        require(
            not unknown,
            f"--hparam {quoted(name)} has unknown key(s) {quoted(unknown)}, "
            f"expected type, min, max, values, scale, when",
        )
        kind = str(spec.get("type", ""))
        parent, parent_values = _condition(name, spec.get("when"))
        return ParameterSpec(
            parameter_id=name,
            kind=kind,
            low=spec.get("min"),
            high=spec.get("max"),
            values=tuple(spec.get("values") or ()),
            scale=str(spec.get("scale", "")),
            parent=parent,
            parent_values=parent_values,
        )
    require(
        isinstance(spec, str) and len(spec) <= 10_000,
        f"--hparam {quoted(name)} spec {quoted(spec)}, expected e.g. double:1e-4:1e-1:log",
    )
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    scale = ""
    if kind in ("double", "integer") and len(parts) == 3 or kind == "discrete" and len(parts) == 2:
        scale = parts.pop()
    if kind in ("double", "integer"):
        require(len(parts) == 2, f"--hparam {name}={quoted(spec)}, expected {kind}:MIN:MAX[:SCALE]")
        low, high = (
            _number(name, spec, part, int if kind == "integer" else float) for part in parts
        )
        return ParameterSpec(parameter_id=name, kind=kind, low=low, high=high, scale=scale)
    if kind in ("discrete", "categorical"):
        require(len(parts) == 1, f"--hparam {name}={quoted(spec)}, expected {kind}:V1,V2,...")
        values = [value.strip() for value in parts[0].split(",")]
        if kind == "discrete":
            values = [_number(name, spec, value, float) for value in values]
        return ParameterSpec(parameter_id=name, kind=kind, values=tuple(values), scale=scale)
    _spec_error(name, spec)


def _condition(name: str, when: Any) -> tuple[str, tuple]:
    """`(parent, values)` from a parameter object's `"when": {PARENT: [VALUES]}`."""
    if when is None:
        return "", ()
    require(
        isinstance(when, Mapping)
        and len(when) == 1
        and all(isinstance(values, list) for values in when.values()),
        f"--hparam {quoted(name)} has when {quoted(when)}, expected one parent and its "
        f'values, e.g. {{"optimizer": ["lamb"]}}',
    )
    ((parent, values),) = when.items()
    return str(parent), tuple(values)


def _number(name: str, spec: str, text: str, convert) -> float | int:
    try:
        return convert(text)
    except ValueError:
        _spec_error(name, spec)


def _spec_error(name: str, spec: Any):
    raise UsageError(
        f"--hparam {name}={quoted(spec)}, expected one of double:MIN:MAX[:SCALE], "
        f"integer:MIN:MAX[:SCALE], discrete:V1,V2,...[:SCALE], "
        f"categorical:A,B,... with SCALE linear, log or reverse_log"
    )


def trial_args(spec: JobSpec, tuning: TuningSpec) -> tuple[str, ...]:
    """The job's trainer arguments plus `--hparam_metric` (unless already given)."""
    if submission.has_flag(spec.trainer_args, "hparam_metric"):
        return spec.trainer_args
    return spec.trainer_args + (f"--hparam_metric={tuning.metric}",)


def _sample_value(parameter: ParameterSpec):
    """A value a trial of `parameter` can get: the middle of a double range, else the first."""
    if parameter.kind == "double":
        return (parameter.low + parameter.high) / 2
    if parameter.kind == "integer":
        return parameter.low
    return parameter.values[0]


def check_trial_flags(spec: JobSpec, tuning: TuningSpec | None) -> None:
    """Refuses trainer flags `trainer.task` would refuse on every replica (or every trial).

    Without a study, `spec.trainer_args` as they are; with one, also each tuned flag at a
    value a trial can give it (conditional parameters left out), so that rules between
    flags see the tuned ones. (`--hparam_metric`, which `trial_args` adds, is left out:
    its rule that a `val_` metric needs `--validation_steps` is not enforced at submit yet.)

    Raises:
        UsageError: One line naming the flag and what `trainer.task` expects.
    """
    if tuning is None:
        task_flags.check_trainer_args(spec.trainer_args)
        return
    tuned = tuple(
        f"--{parameter.parameter_id}={_sample_value(parameter)}"
        for parameter in tuning.parameters
        if not parameter.parent
    )
    task_flags.check_trainer_args(
        (*spec.trainer_args, *tuned), where="after -- (with the tuned flags of a trial)"
    )


def build_tuning_job(
    spec: JobSpec, tuning: TuningSpec, *, package_uris: Sequence[str] = ()
) -> dict:
    """The HyperparameterTuningJob resource (JSON-able) for the REST API."""
    trial_spec = dataclasses.replace(spec, trainer_args=trial_args(spec, tuning))
    study = {
        "metrics": [{"metricId": tuning.metric, "goal": tuning.goal.upper()}],
        "parameters": tuning.parameters_json(),
    }
    if ALGORITHMS[tuning.algorithm]:
        study["algorithm"] = ALGORITHMS[tuning.algorithm]
    if tuning.early_stopping:
        study[EARLY_STOPPING[tuning.early_stopping]] = {"useElapsedDuration": False}
    job = {
        "displayName": spec.display_name,
        "studySpec": study,
        "maxTrialCount": tuning.max_trial_count,
        "parallelTrialCount": tuning.parallel_trial_count,
    }
    if tuning.max_failed_trial_count:
        job["maxFailedTrialCount"] = tuning.max_failed_trial_count
    job["trialJobSpec"] = rendering.build_job_spec(trial_spec, package_uris)
    return rendering.with_labels_and_encryption(job, spec)
