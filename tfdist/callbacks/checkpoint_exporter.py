"""`CheckpointExporter`: the chief's side of sidecar evaluation (`tfdist.outputs.evaluation`)."""

import logging
import os

import keras
import tensorflow as tf

from tfdist._internal.files import write_json_atomically
from tfdist._internal.preconditions import check_whole_number
from tfdist.errors import UsageError
from tfdist.outputs.evaluation import (
    CHECKPOINT_NAME,
    DONE_MARKER,
    _position_checkpoint,
    checkpoint_step,
)

__all__ = ["CheckpointExporter"]

_log = logging.getLogger(__name__)


class CheckpointExporter(keras.callbacks.Callback):
    """Saves the model's variables for a sidecar evaluator (run it on the chief only).

    Args:
        directory: Where checkpoints go; the evaluator reads the same place.
        max_to_keep: Checkpoints kept; older ones are deleted.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 5):
        super().__init__()
        if not directory:
            raise UsageError(
                "directory is empty, expected where to export checkpoints for "
                "the evaluator, e.g. <model_dir>/checkpoints"
            )
        check_whole_number("max_to_keep", max_to_keep, minimum=1)
        self.directory = directory
        self.max_to_keep = max_to_keep
        self._manager = None
        self.last_path = None

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        tf.io.gfile.makedirs(self.directory)
        marker = os.path.join(self.directory, DONE_MARKER)
        if tf.io.gfile.exists(marker):
            tf.io.gfile.remove(marker)
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                _position_checkpoint(self.model),
                self.directory,
                max_to_keep=self.max_to_keep,
                checkpoint_name=CHECKPOINT_NAME,
            )

    def export(self) -> str:
        """Saves now, at the optimizer's current step; returns the path."""
        step = self._step()
        if self.last_path and checkpoint_step(self.last_path) == step:
            return self.last_path
        self.last_path = self._manager.save(checkpoint_number=step)
        _log.info("Exported %s for evaluation.", self.last_path)
        return self.last_path

    def on_epoch_end(self, epoch, logs=None):
        self.export()

    def on_train_end(self, logs=None):
        self.export()

    def finish(self) -> str:
        """Exports the final state and marks training done; call once, after the last `fit`.

        Separate from `on_train_end` because a resumed job may train in
        several `fit` calls, and the evaluator stops at the marker.
        """
        path = self.export()
        write_json_atomically(
            os.path.join(self.directory, DONE_MARKER),
            {"last_checkpoint": os.path.basename(path), "step": checkpoint_step(path)},
        )
        return path
