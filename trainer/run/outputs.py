"""What a run reports and writes: `Outcome`, `summary.json` and the exported model.

`build_summary` turns an `Outcome` into strict JSON; `write_outputs` writes the
model then the summary (the summary last: its presence means the model
beside it is complete); `read_summary` reads it back for a restart after the
end.
"""

import dataclasses
import json
import math
import os
from typing import Mapping

import keras
import tensorflow as tf
from absl import logging

from tfdist._internal.files import replace_atomically, write_json_atomically
from tfdist._internal.storage import storage_faults
from tfdist.callbacks import BackupAndRestore
from tfdist.outputs import export as export_lib
from trainer.config import ExperimentConfig
from trainer.run.directories import OutputDirs

MODEL_FILE = "model.keras"
SUMMARY_FILE = "summary.json"


def epoch_logs(history, backup: BackupAndRestore | None) -> dict:
    """The last epoch's logs: of `history`, else (nothing ran) the backup's record of them."""
    if history is not None and history.history:
        return {name: float(values[-1]) for name, values in history.history.items()}
    return backup.epoch_logs if backup is not None else {}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one run did, as every strategy reports it."""

    strategy: str
    num_replicas: int
    num_workers: int
    steps_per_epoch: int
    steps_completed: int
    train_logs: Mapping[str, float]
    evaluation: Mapping[str, float]
    examples_per_second: float
    wall_seconds: float
    resumed_from_step: int
    num_ps: int = 0


def build_summary(config: ExperimentConfig, outcome: Outcome) -> dict:
    """`summary.json`: strict JSON (a non-finite number becomes null)."""
    final_loss = outcome.train_logs.get("loss", outcome.evaluation.get("loss"))
    summary = {
        "strategy": outcome.strategy,
        "num_replicas": outcome.num_replicas,
        "num_workers": outcome.num_workers,
        "global_batch_size": config.global_batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": outcome.steps_per_epoch,
        "steps_completed": outcome.steps_completed,
        "final_loss": final_loss,
        "metrics": {"train": dict(outcome.train_logs), "test": dict(outcome.evaluation)},
        "examples_per_second": outcome.examples_per_second,
        "wall_seconds": outcome.wall_seconds,
        "resumed_from_step": outcome.resumed_from_step,
    }
    if outcome.strategy == "parameter_server":
        summary["num_ps"] = outcome.num_ps
    return _finite_or_null(summary)


def _finite_or_null(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    return value


def write_outputs(model: keras.Model, summary: dict, dirs: OutputDirs, export_format: str) -> None:
    """Writes the model (`model.keras`, a SavedModel or both), then `summary.json` last.

    Each replaces the old one atomically; `summary.json` appearing means the
    model files beside it are complete.
    """
    if not dirs.model_dir:
        logging.warning(
            "No --model_dir (and no AIP_MODEL_DIR): the model and summary are not saved."
        )
        return
    with storage_faults(dirs.model_dir, "the model and summary.json to"):
        _write_outputs(model, summary, dirs, export_format)


def _write_outputs(model: keras.Model, summary: dict, dirs: OutputDirs, export_format: str) -> None:
    tf.io.gfile.makedirs(dirs.model_dir)
    written = []
    if export_lib.wants_keras(export_format):
        model_path = os.path.join(dirs.model_dir, MODEL_FILE)
        # Keras needs the .keras suffix; the rename keeps a previous model intact
        # until the new one is complete.
        replace_atomically(model_path, model.save, suffix=".keras")
        written.append(model_path)
    if export_lib.wants_saved_model(export_format):
        written.append(export_lib.export_saved_model(model, dirs.model_dir))
    summary_path = os.path.join(dirs.model_dir, SUMMARY_FILE)
    write_json_atomically(summary_path, summary)
    logging.info("Wrote %s.", ", ".join([*written, summary_path]))


def read_summary(dirs: OutputDirs) -> dict | None:
    """The summary a finished run wrote, or None."""
    path = os.path.join(dirs.model_dir, SUMMARY_FILE) if dirs.model_dir else ""
    if not path or not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)
