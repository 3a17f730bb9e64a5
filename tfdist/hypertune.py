"""Reports a metric to Vertex AI hyperparameter tuning, and keeps trials apart.

Vertex AI's tuning service reads the metric a trial reports the way the
`cloudml-hypertune` package (`hypertune.HyperTune`) writes it: JSON lines in
the file named by `CLOUD_ML_HP_METRIC_FILE` (default
`/tmp/hypertune/output.metrics`), the whole file rewritten on every report with
the newest 100 entries, each entry

    {"checkpoint_path": "", "global_step": "1200", "timestamp": 1796000000.5,
     "trial": "3", "val_accuracy": "0.9140625"}

(keys sorted; the metric value, step and trial as strings; the trial from
`CLOUD_ML_TRIAL_ID`, "0" outside a trial). We write the same format ourselves
instead of depending on that package (a 0.1.0.dev6 pre-release with one
60-line module); `tests/test_hypertune.py` checks our lines against the
package's own when it is installed. Unlike the package, we replace the file
by rename, so the service never reads a half-written file.

    callbacks.append(HypertuneCallback("val_accuracy", is_chief=cluster.is_chief))

Each trial of a tuning job must write its outputs and backups to its own
directory, or trials would resume from each other's backups:
`trial_output_dir(path)` appends the trial id to a directory the user gave.
Vertex AI's own `AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR` and
`AIP_TENSORBOARD_LOG_DIR` already end in `<trial_id>/...` and are kept.

Everything but `HypertuneCallback` imports nothing heavy; the callback (a Keras
callback) imports Keras on first use.
"""

import collections
import json
import os
import tempfile
import time
from typing import Any, Mapping

from tfdist.errors import UsageError

METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
MAX_ENTRIES = 100  # as cloudml-hypertune keeps
_VERTEX_OUTPUT_VARIABLES = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


def trial_id(environ: Mapping[str, str] | None = None) -> str:
    """The tuning trial this process belongs to, or "" outside a tuning job.

    Read from `CLOUD_ML_TRIAL_ID`, else from `CLUSTER_SPEC`'s `task.trial`
    (Vertex AI sets both in a trial; the cluster spec is never logged).
    """
    environ = os.environ if environ is None else environ
    value = str(environ.get(TRIAL_ID_ENV, "")).strip()
    if not value and environ.get("CLUSTER_SPEC"):
        try:
            task = json.loads(environ["CLUSTER_SPEC"]).get("task", {})
            value = str(task.get("trial") or "").strip() if isinstance(task, dict) else ""
        except (ValueError, AttributeError):
            value = ""  # a malformed CLUSTER_SPEC is reported by tfdist.cluster
    if value and not all(char.isalnum() or char in "-_" for char in value):
        raise UsageError(f"{TRIAL_ID_ENV} is {value[:100]!r}, expected a trial id of "
                         f"letters, digits, - and _ such as 3")
    return value


def trial_output_dir(path: str, environ: Mapping[str, str] | None = None) -> str:
    """`path` made per-trial inside a tuning job: `<path>/<trial_id>`.

    Unchanged outside a tuning job, for an empty `path`, and for Vertex AI's
    `AIP_*` output directories, which are per-trial already.
    """
    environ = os.environ if environ is None else environ
    trial = trial_id(environ)
    if not trial or not path:
        return path
    normalized = str(path).rstrip("/")
    if any(normalized == str(environ.get(name, "")).rstrip("/")
           for name in _VERTEX_OUTPUT_VARIABLES if environ.get(name)):
        return path
    return f"{normalized}/{trial}"


class MetricReporter:
    """Writes reports in the cloudml-hypertune format (see the module docstring).

    Args:
        metric_file: Where to write; default `CLOUD_ML_HP_METRIC_FILE`, else
            `/tmp/hypertune/output.metrics`.
        environ: Environment to read those variables from (default `os.environ`).
    """

    def __init__(self, *, metric_file: str | None = None,
                 environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.metric_file = metric_file or environ.get(METRIC_FILE_ENV) or DEFAULT_METRIC_FILE
        self.trial = trial_id(environ) or "0"
        self._entries = collections.deque(maxlen=MAX_ENTRIES)

    def report(self, metric_tag: str, value: float, global_step: int = 0, *,
               checkpoint_path: str = "") -> dict:
        """Adds one measurement and rewrites the metric file.

        Returns:
            The entry written.
        """
        entry = {"timestamp": time.time(), "trial": self.trial, metric_tag: str(float(value)),
                 "global_step": str(int(global_step) if global_step else 0),
                 "checkpoint_path": checkpoint_path}
        self._entries.append(entry)
        directory = os.path.dirname(os.path.abspath(self.metric_file))
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".output.metrics-")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            for item in self._entries:
                stream.write(json.dumps(item, sort_keys=True) + "\n")
        os.replace(temporary, self.metric_file)
        return entry


def _make_callback_class():
    import keras

    class HypertuneCallback(keras.callbacks.Callback):
        """Reports `metric` from the epoch logs to Vertex AI tuning, on the chief.

        Keras evaluates the validation data at the end of an epoch, so each
        epoch end with `metric` in its logs is one report, tagged `metric`
        (give the same name as the tuning job's `metricId`), at the
        optimizer's step count. Epochs without validation (`validation_freq`)
        are skipped; a metric that is in no log is a usage error naming the
        ones that are, and so is a `val_*` metric when training ends without
        a single validation (Vertex AI would see a trial that reported nothing).

        Args:
            metric: Log key to report, e.g. `val_accuracy` or `val_loss`.
            is_chief: Only the chief reports; other replicas do nothing.
            reporter: Where to write; default a `MetricReporter()`.
        """

        def __init__(self, metric: str, *, is_chief: bool, reporter: MetricReporter | None = None):
            super().__init__()
            if not metric or not isinstance(metric, str):
                raise UsageError(f"--hparam_metric is {str(metric)[:100]!r}, expected a "
                                 f"metric name from the epoch logs such as val_accuracy")
            self.metric = metric
            self.is_chief = bool(is_chief)
            self._reporter = reporter
            self.reports = 0

        @property
        def reporter(self) -> MetricReporter:
            if self._reporter is None:
                self._reporter = MetricReporter()
            return self._reporter

        def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None):
            if not self.is_chief:
                return
            logs = logs or {}
            if self.metric not in logs:
                validated = any(key.startswith("val_") for key in logs)
                if self.metric.startswith("val_") and not validated:
                    return  # no validation this epoch
                raise UsageError(f"--hparam_metric={self.metric[:100]} is not in the epoch "
                                 f"logs, expected one of: {', '.join(sorted(logs))}")
            step = int(self.model.optimizer.iterations.numpy()) \
                if self.model is not None else epoch + 1
            self.reporter.report(self.metric, float(logs[self.metric]), step)
            self.reports += 1

        def on_train_end(self, logs: Mapping[str, Any] | None = None):
            if self.is_chief and not self.reports:
                raise UsageError(f"--hparam_metric={self.metric[:100]} was never reported: no "
                                 f"epoch ran a validation; expected validation data (e.g. "
                                 f"--validation_steps > 0) or a training metric such as loss")

    return HypertuneCallback


def __getattr__(name: str):
    if name == "HypertuneCallback":
        callback_class = _make_callback_class()
        globals()[name] = callback_class
        return callback_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
