"""Keras callbacks for distributed, fault-tolerant training."""

from tfdist.callbacks.backup_and_restore import BackupAndRestore, check_save_freq
from tfdist.callbacks.tensorboard import EpochTensorBoard

__all__ = ["BackupAndRestore", "EpochTensorBoard", "check_save_freq"]
