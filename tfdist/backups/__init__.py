"""Atomic, multi-worker-safe training backups with step-exact resume.

`BackupStore` commits backup directories atomically and falls back past torn
ones; `TrainingBackup` decides what a backup holds (model, optimizer, extra
state, counters) and where training resumes; `WorkerSync` keeps the workers of
a synchronous job in agreement; `RunFingerprint` is what a backup must agree
with before it is resumed, using `model_variable_paths` (stable paths that do
not depend on Keras's per-process layer names).
A backup directory belongs to one job: `completion` checks a finished job's
record (fingerprint, outputs) before it is trusted, `lease` keeps one writer at
a time, `restarts` stops a crash loop.
`tfdist.callbacks.BackupAndRestore` wires them into Keras `fit`. See
docs/fault_tolerance.md.
"""

from tfdist.backups.fingerprint import RunFingerprint
from tfdist.backups.paths import model_variable_paths, optimizer_variable_keys
from tfdist.backups.state import FitSegment, ResumePoint, TrainingBackup
from tfdist.backups.store import BackupInfo, BackupStore, CorruptBackupError, has_atomic_rename
from tfdist.backups.sync import WorkerSync

__all__ = [
    "BackupInfo",
    "BackupStore",
    "CorruptBackupError",
    "FitSegment",
    "ResumePoint",
    "RunFingerprint",
    "TrainingBackup",
    "WorkerSync",
    "has_atomic_rename",
    "model_variable_paths",
    "optimizer_variable_keys",
]
