"""Keras callbacks for distributed, fault-tolerant training."""

from tfdist.callbacks.backup_and_restore import BackupAndRestore, check_save_freq

__all__ = ["BackupAndRestore", "check_save_freq"]
