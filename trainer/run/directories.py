"""Where a run's outputs go: the model, backup and TensorBoard directories.

`OutputDirs.from_config` reads `--model_dir`, `--backup_dir` and
`--tensorboard_dir`, with Vertex AI's `AIP_*` variables as defaults and a
tuning trial's own subdirectory.
"""

import dataclasses
import os
from typing import Mapping

from tfdist._internal.storage import check_writable
from tfdist.outputs import hypertune
from trainer.config import ExperimentConfig

CHECKPOINTS_SUBDIR = "checkpoints"
EVAL_SUBDIR = "eval"


@dataclasses.dataclass(frozen=True)
class OutputDirs:
    """Model, backup and TensorBoard directories; Vertex's `AIP_*` are defaults."""

    model_dir: str
    backup_dir: str
    tensorboard_dir: str

    @classmethod
    def from_config(cls, config: ExperimentConfig, environ: Mapping[str, str]) -> "OutputDirs":
        """The directories; inside a tuning trial, `--model_dir`/`--backup_dir` get `/<trial>`.

        (Vertex's own `AIP_*` directories are already per trial.)
        """
        model_dir = hypertune.trial_output_dir(config.model_dir, environ) or environ.get(
            "AIP_MODEL_DIR", ""
        )
        backup_dir = hypertune.trial_output_dir(config.backup_dir, environ) or environ.get(
            "AIP_CHECKPOINT_DIR", ""
        )
        tensorboard_dir = (
            config.tensorboard_dir
            or environ.get("AIP_TENSORBOARD_LOG_DIR", "")
            or (os.path.join(model_dir, "logs") if model_dir else "")
        )
        return cls(model_dir=model_dir, backup_dir=backup_dir, tensorboard_dir=tensorboard_dir)

    @property
    def checkpoints_dir(self) -> str:
        """Where the chief exports checkpoints for an evaluator task."""
        return os.path.join(self.model_dir, CHECKPOINTS_SUBDIR) if self.model_dir else ""

    @property
    def eval_dir(self) -> str:
        return os.path.join(self.model_dir, EVAL_SUBDIR) if self.model_dir else ""

    def check_writable(self, *, is_chief: bool) -> None:
        """Raises `StorageError` unless the chief can write its directories; at start.

        Before training and before any peer is contacted. Only the chief writes
        here (other tasks write their scratch copies to local temporary storage).
        """
        if not is_chief:
            return
        for directory, what in (
            (self.backup_dir, "the backup directory (--backup_dir)"),
            (self.model_dir, "the model directory (--model_dir)"),
            (self.tensorboard_dir, "the TensorBoard directory"),
        ):
            if directory:
                check_writable(directory, what)
