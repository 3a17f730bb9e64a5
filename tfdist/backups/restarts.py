"""Crash loops end: a job that keeps restarting from one backup without making a new one stops.

A job that crashes at the same step on every start (an OOM kill, a bad record,
a bug past the last backup) is restarted forever by a restart policy that does
not count (TFJob's `restartPolicy: ExitCode` recreates pods, and `backoffLimit`
does not count those; kubeflow/trainer#2045). So the job counts itself:

    backup_dir/backup-000000000150/STARTS.json   {"step": 150, "starts": 2}
    backup_dir/STARTS.json                       {"step": 0, "starts": 1}  (no backup yet)

Each start from a backup adds one to the count kept beside it (inside the
committed backup directory, not among its checksummed files; the backup itself
is never rewritten); a start with no backup counts in `backup_dir/STARTS.json`,
where the first start is not a restart. A newly committed backup is progress:
it has no count yet (and the no-backup count is removed), so the count starts
again. A start that would be restart number `max_restarts + 1` without progress
raises `CrashLoopError` (exit `tfdist.cli.EXIT_CRASH_LOOP`, 4: permanent, no
policy retries it) before training, and leaves the count as it is, so every
further restart stops too until someone looks. The count is written atomically
(`tfdist._internal.files`) by the chief only; it survives the process.
"""

import json
import logging

import tensorflow as tf

from tfdist._internal.files import write_json_atomically
from tfdist._internal.preconditions import check_whole_number
from tfdist.errors import DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS, CrashLoopError

__all__ = ["STARTS_NAME", "DEFAULT_MAX_RESTARTS", "check_max_restarts", "RestartCount"]

STARTS_NAME = "STARTS.json"
DEFAULT_MAX_RESTARTS = DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS

_log = logging.getLogger(__name__)


def check_max_restarts(value) -> int | None:
    """`value` if it is None (no limit) or a whole number >= 0."""
    if value is None:
        return None
    return check_whole_number("max_restarts_without_progress", value, minimum=0)


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def _read_starts(path: str, step: int) -> int:
    if not tf.io.gfile.exists(path):
        return 0
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            record = json.loads(handle.read())
    except (ValueError, tf.errors.OpError) as error:
        _log.warning("Ignoring the unreadable restart count %s (%s).", path, error)
        return 0
    if not isinstance(record, dict):
        record = {}
    starts = record.get("starts")
    if record.get("step") != step or not isinstance(starts, int) or starts < 0:
        _log.warning("Ignoring the restart count %s: it is not for step %d.", path, step)
        return 0
    return starts


class RestartCount:
    """Counts the starts of a job from its newest backup; stops a crash loop.

    Args:
        backup_dir: The job's backup directory.
        max_restarts: Restarts allowed from one backup without a new one;
            `None` for no limit.
        is_chief: Only the chief writes the count.
    """

    def __init__(self, backup_dir: str, *, max_restarts: int | None, is_chief: bool):
        self.backup_dir = backup_dir.rstrip("/") or "/"
        self.max_restarts = check_max_restarts(max_restarts)
        self.is_chief = bool(is_chief)
        self._fresh_count_pending = False

    def _path(self, backup_path: str | None) -> str:
        return _join(backup_path or self.backup_dir, STARTS_NAME)

    def restarts(self, step: int, backup_path: str | None) -> int:
        """How many restarts from `step` this start would be (reads only)."""
        starts = _read_starts(self._path(backup_path), step) + 1
        return starts if backup_path else starts - 1

    def check(self, step: int, backup_path: str | None, restarts: int) -> None:
        """Raises `CrashLoopError` when `restarts` exceeds the limit; else counts this start.

        Args:
            step: The step this start resumes from (0 without a backup).
            backup_path: The backup it resumes from; `None` without one.
            restarts: `restarts(...)`, as the workers agreed on it.
        """
        if self.max_restarts is not None and restarts > self.max_restarts:
            where = f"the backup at step {step}" if backup_path else "the start (no backup yet)"
            raise CrashLoopError(
                f"the job restarted {restarts} times from {where} in {self.backup_dir} "
                f"without committing a new backup (max_restarts_without_progress="
                f"{self.max_restarts}); stopping for good, since it fails before its next "
                f"backup every time: read the log of the first failure and fix its cause, then "
                f"delete {self._path(backup_path)} (or raise the limit) and rerun"
            )
        if not self.is_chief:
            return
        starts = restarts if backup_path else restarts + 1
        if backup_path is None:
            tf.io.gfile.makedirs(self.backup_dir)
        write_json_atomically(self._path(backup_path), {"step": step, "starts": starts})
        self._fresh_count_pending = backup_path is None
        if restarts:
            _log.info(
                "Restart %d from step %d without a new backup (the job stops after %s).",
                restarts,
                step,
                "no limit" if self.max_restarts is None else self.max_restarts,
            )

    def progress(self) -> None:
        """A new backup committed: the count starts again (the chief removes the no-backup count)."""
        if self.is_chief and self._fresh_count_pending:
            path = self._path(None)
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
            self._fresh_count_pending = False

    def clear(self) -> None:
        """The job completed: no count is left in `backup_dir` itself."""
        self.progress()
