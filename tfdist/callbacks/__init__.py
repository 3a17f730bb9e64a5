"""Every Keras callback tfdist ships, for distributed, fault-tolerant training.

- `BackupAndRestore` (`backup_and_restore`, with `callback_state` for the
  state of the user's own callbacks): atomic multi-worker backups, step-exact resume.
- `NonFiniteGuard` (`non_finite`): stops a run whose loss or weights are not finite.
- `EpochTensorBoard` (`tensorboard`): TensorBoard that writes per epoch only.
- `CheckpointExporter` (`checkpoint_exporter`): checkpoints for a sidecar evaluator.
- `HypertuneCallback` (`hypertune`): the metric a Vertex AI tuning trial reports.

(`tfdist.ray.ReportBackups` lives with the Ray integration, which needs Ray.)
"""

from tfdist.callbacks.backup_and_restore import BackupAndRestore, check_save_freq
from tfdist.callbacks.checkpoint_exporter import CheckpointExporter
from tfdist.callbacks.hypertune import HypertuneCallback
from tfdist.callbacks.non_finite import NonFiniteGuard
from tfdist.callbacks.tensorboard import EpochTensorBoard

__all__ = [
    "BackupAndRestore",
    "CheckpointExporter",
    "EpochTensorBoard",
    "HypertuneCallback",
    "NonFiniteGuard",
    "check_save_freq",
]
