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
60-line module); `tests/multiprocess/test_hypertune.py` checks our lines against the
package's own when it is installed. Unlike the package, we replace the file
by rename, so the service never reads a half-written file.

    callbacks.append(HypertuneCallback("val_accuracy", is_chief=cluster.is_chief))

Each trial of a tuning job must write its outputs and backups to its own
directory, or trials would resume from each other's backups:
`trial_output_dir(path)` appends the trial id to a directory the user gave.
Vertex AI's own `AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR` and
`AIP_TENSORBOARD_LOG_DIR` already end in `<trial_id>/...` and are kept.

This module imports nothing heavy; the Keras callback is
`tfdist.callbacks.HypertuneCallback` (also importable from here, loaded on first use).
"""

import collections
import json
import os
import time
from typing import Mapping

from tfdist._internal.files import write_atomically
from tfdist._internal.json_input import load_json
from tfdist.errors import UsageError

__all__ = [
    "METRIC_FILE_ENV",
    "DEFAULT_METRIC_FILE",
    "TRIAL_ID_ENV",
    "MAX_ENTRIES",
    "trial_id",
    "trial_output_dir",
    "MetricReporter",
]

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
            spec = load_json(environ["CLUSTER_SPEC"], source="CLUSTER_SPEC")
            task = spec.get("task", {}) if isinstance(spec, dict) else {}
            trial = task.get("trial") if isinstance(task, dict) else None
            value = str(trial or "").strip() if not isinstance(trial, (bool, dict, list)) else ""
        except UsageError:
            value = ""  # a malformed CLUSTER_SPEC is reported by tfdist.distribute.cluster
    if value and not all(char.isalnum() or char in "-_" for char in value):
        raise UsageError(
            f"{TRIAL_ID_ENV} is {value[:100]!r}, expected a trial id of "
            f"letters, digits, - and _ such as 3"
        )
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
    if any(
        normalized == str(environ.get(name, "")).rstrip("/")
        for name in _VERTEX_OUTPUT_VARIABLES
        if environ.get(name)
    ):
        return path
    return f"{normalized}/{trial}"


class MetricReporter:
    """Writes reports in the cloudml-hypertune format (see the module docstring).

    Args:
        metric_file: Where to write; default `CLOUD_ML_HP_METRIC_FILE`, else
            `/tmp/hypertune/output.metrics`.
        environ: Environment to read those variables from (default `os.environ`).
    """

    def __init__(self, *, metric_file: str | None = None, environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.metric_file = metric_file or environ.get(METRIC_FILE_ENV) or DEFAULT_METRIC_FILE
        self.trial = trial_id(environ) or "0"
        self._entries = collections.deque(maxlen=MAX_ENTRIES)

    def report(
        self, metric_tag: str, value: float, global_step: int = 0, *, checkpoint_path: str = ""
    ) -> dict:
        """Adds one measurement and rewrites the metric file.

        Returns:
            The entry written.
        """
        entry = {
            "timestamp": time.time(),
            "trial": self.trial,
            metric_tag: str(float(value)),
            "global_step": str(int(global_step) if global_step else 0),
            "checkpoint_path": checkpoint_path,
        }
        self._entries.append(entry)
        os.makedirs(os.path.dirname(os.path.abspath(self.metric_file)), exist_ok=True)
        write_atomically(
            self.metric_file,
            "".join(json.dumps(item, sort_keys=True) + "\n" for item in self._entries),
        )
        return entry
