"""Keras callbacks for distributed, fault-tolerant training."""

from tfdist.callbacks.backup_and_restore import BackupAndRestore, check_save_freq
from tfdist.callbacks.non_finite import NonFiniteGuard
from tfdist.callbacks.tensorboard import EpochTensorBoard

__all__ = ["BackupAndRestore", "EpochTensorBoard", "NonFiniteGuard", "check_save_freq"]
