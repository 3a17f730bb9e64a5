"""An atomic store of training backups over `tf.io.gfile`.

Layout of `backup_dir`:

    backup-000000000150/        a committed backup
        ckpt.index, ckpt.data-00000-of-00001
        metadata.json           step, counters, size and CRC-32 of every file
        COMMITTED               written last; holds the CRC-32 of metadata.json
    .tmp-backup-000000000200-1a2b3c4d/   being written (local filesystems only)
    quarantine-000000000250-20261130T101500Z-1a2b/   a damaged backup, set aside
    COMPLETED.json              training finished; a restart does not retrain

A backup becomes visible only when complete. On filesystems with an atomic
directory rename (local paths) it is written under a `.tmp-` name and renamed;
on object stores (`gs://`, `s3://`, `ram://`, anything with a scheme) and on
Cloud Storage FUSE mounts (`/gcs/...`), which have none, it is written in place
and the `COMMITTED` marker is written last. Readers ignore directories without
a marker, validate the marker, the metadata and every file's size and checksum,
and fall back to the previous backup when the newest is damaged. The previous
backups stay until a new one has committed.

Only a failed check of a backup's own files (marker, metadata, size, CRC-32,
or TensorFlow's per-tensor checksum) counts as damage. A damaged backup is
quarantined (renamed `quarantine-<step>-<time>-<random>`), never deleted, and
never read again. Any other error while reading a backup (a dtype or shape
mismatch, a missing key, permissions, the network) propagates and leaves every
backup as it was.

Only the chief writes here. Other workers must still take part in every save,
because saving distributed variables can run collectives, so they write the
same checkpoint to a per-task scratch directory on their local disk, removed
right after.
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import uuid
import zlib
from typing import Callable, Mapping

import tensorflow as tf

from tfdist._internal.files import write_atomically
from tfdist._internal.preconditions import check_whole_number
from tfdist._internal.storage import check_writable, storage_error, storage_faults
from tfdist.errors import CorruptBackupError, UsageError

__all__ = [
    "FORMAT",
    "CHECKPOINT_NAME",
    "METADATA_NAME",
    "MARKER_NAME",
    "COMPLETED_NAME",
    "QUARANTINE_PREFIX",
    "FUSE_MOUNT_PREFIXES",
    "BackupInfo",
    "has_atomic_rename",
    "BackupStore",
]

FORMAT = "tfdist-backup/1"
CHECKPOINT_NAME = "ckpt"
METADATA_NAME = "metadata.json"
MARKER_NAME = "COMMITTED"
COMPLETED_NAME = "COMPLETED.json"
_BACKUP_PATTERN = re.compile(r"^backup-(\d+)$")
_TMP_PREFIX = ".tmp-"
QUARANTINE_PREFIX = "quarantine-"
_CHUNK_BYTES = 4 << 20
# Cloud Storage FUSE mounts: local paths without an atomic directory rename
# (gcsfuse copies then deletes every object). Vertex AI mounts buckets at /gcs/.
FUSE_MOUNT_PREFIXES: tuple[str, ...] = ("/gcs/",)
# What TensorFlow raises when a tensor fails its own checksum: damage. Other
# read errors (a dtype or shape mismatch, a missing key, permission, network)
# are not, so they never cost a good backup.
_CORRUPT_DATA_ERRORS = (tf.errors.DataLossError,)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BackupInfo:
    """A committed, validated backup.

    Attributes:
        step: The global step the backup was taken after.
        path: Its directory.
        metadata: The caller's metadata as saved (counters and the like).
    """

    step: int
    path: str
    metadata: Mapping

    @property
    def checkpoint_prefix(self) -> str:
        """The prefix to pass to `tf.train.Checkpoint.read`."""
        return _join(self.path, CHECKPOINT_NAME)


def has_atomic_rename(path: str) -> bool:
    """Whether `path` is on a filesystem whose directory rename is atomic.

    Local paths are, except Cloud Storage FUSE mounts (`FUSE_MOUNT_PREFIXES`);
    object stores and any other scheme are treated as not.
    """
    scheme, _, local = path.partition("://") if "://" in path else ("", "", path)
    if scheme not in ("", "file"):
        return False
    local = local.rstrip("/") + "/"
    return not any(local.startswith(prefix) for prefix in FUSE_MOUNT_PREFIXES)


def _join(*parts: str) -> str:
    return "/".join(part.rstrip("/") for part in parts[:-1]) + "/" + parts[-1]


def _backup_name(step: int) -> str:
    return f"backup-{step:012d}"


def _file_crc32(path: str) -> int:
    crc = 0
    with tf.io.gfile.GFile(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def _read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read()


def _write_bytes(path: str, data: bytes) -> None:
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(data)


def _check_step(step) -> int:
    return check_whole_number("backup step", step, minimum=0)


class BackupStore:
    """Writes, validates, restores and prunes backups in one directory.

    Args:
        backup_dir: Where the chief keeps backups (local path or `gs://...`).
            Every worker must be able to read it: on several hosts use shared
            storage such as `gs://`.
        is_chief: Whether this task writes to `backup_dir`. Other tasks write
            to scratch and never modify `backup_dir`.
        task_name: Names this task's scratch directory, e.g. `"worker-1"`.
        keep: Committed backups to keep (>= 2, so that a torn newest backup
            can fall back to the one before).
        commit: `"auto"` (rename on local paths, marker elsewhere), `"rename"`
            or `"marker"`.
        verify_checksums: Compute a CRC-32 of every file at save and check it
            at restore. Sizes are always checked.
        scratch_root: Parent of the non-chief scratch directory; defaults to
            the local temporary directory.
    """

    def __init__(
        self,
        backup_dir: str,
        *,
        is_chief: bool = True,
        task_name: str = "chief-0",
        keep: int = 2,
        commit: str = "auto",
        verify_checksums: bool = True,
        scratch_root: str | None = None,
    ):
        if not isinstance(backup_dir, str) or not backup_dir.strip():
            raise UsageError(
                f"backup_dir is {backup_dir!r}, expected a directory path such as "
                f"/tmp/backups or gs://bucket/backups; pass where backups should go"
            )
        check_whole_number(
            "keep", keep, minimum=2, hint="a torn newest backup falls back to the previous one"
        )
        if commit not in ("auto", "rename", "marker"):
            raise UsageError(f"commit is {commit!r}, expected one of: auto, rename, marker")
        if commit == "rename" and not has_atomic_rename(backup_dir):
            raise UsageError(
                f"commit='rename' needs a local backup_dir, got {backup_dir!r}; object "
                f"stores and Cloud Storage FUSE mounts have no atomic rename, use "
                f"commit='auto' or 'marker'"
            )
        self.backup_dir = backup_dir.rstrip("/") or "/"
        self.is_chief = is_chief
        self.task_name = re.sub(r"[^A-Za-z0-9_.-]", "_", task_name)
        self.keep = keep
        self.atomic_rename = commit == "rename" or (
            commit == "auto" and has_atomic_rename(backup_dir)
        )
        self.verify_checksums = verify_checksums
        self.scratch_root = scratch_root or tempfile.gettempdir()

    # ----------------------------------------------------------------- paths

    def _path(self, name: str) -> str:
        return _join(self.backup_dir, name)

    @property
    def scratch_dir(self) -> str:
        """This task's scratch directory (non-chief tasks only).

        Named after the task and `backup_dir`, not the process, so that a
        restarted task removes what its killed predecessor left.
        """
        job = hashlib.sha256(self.backup_dir.encode()).hexdigest()[:12]
        return os.path.join(self.scratch_root, f"tfdist-scratch-{job}-{self.task_name}")

    def _names(self) -> list[str]:
        if not tf.io.gfile.isdir(self.backup_dir):
            return []
        try:
            names = tf.io.gfile.listdir(self.backup_dir)
        except tf.errors.NotFoundError:  # removed since: the chief's write check of a fresh start
            return []
        return [name.rstrip("/") for name in names]

    def _step_dirs(self) -> dict[int, str]:
        steps = {}
        for name in self._names():
            match = _BACKUP_PATTERN.match(name)
            if match:
                steps[int(match.group(1))] = self._path(name)
        return steps

    def committed_steps(self) -> list[int]:
        """Steps of backups whose commit marker exists, oldest first.

        A listed backup may still fail validation; `restore` checks.
        """
        return sorted(
            step
            for step, path in self._step_dirs().items()
            if tf.io.gfile.exists(_join(path, MARKER_NAME))
        )

    def check_writable(self) -> None:
        """Raises `StorageError` unless this task can write where it saves; call at start.

        The chief writes `backup_dir`, other tasks their scratch directory's parent.
        """
        if self.is_chief:
            check_writable(self.backup_dir, "the backup directory")
        else:
            check_writable(self.scratch_root, "the backup scratch directory")

    # --------------------------------------------------------------- cleanup

    def clean_leftovers(self) -> list[str]:
        """Removes what an interrupted save left behind; the chief only.

        Call at start, before any task of this job saves: temporary
        directories and backup directories without a commit marker.

        Returns:
            The removed paths.
        """
        if not self.is_chief:
            self._remove_scratch()
            return []
        removed = []
        for name in self._names():
            path = self._path(name)
            uncommitted = _BACKUP_PATTERN.match(name) and not tf.io.gfile.exists(
                _join(path, MARKER_NAME)
            )
            if name.startswith(_TMP_PREFIX) or uncommitted:
                _log.warning("Removing leftover of an interrupted backup: %s", path)
                self._remove(path)
                removed.append(path)
        return removed

    def _remove(self, path: str) -> None:
        """Deletes a backup directory, its commit marker first."""
        marker = _join(path, MARKER_NAME)
        if tf.io.gfile.exists(marker):
            tf.io.gfile.remove(marker)
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        elif tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)

    def _remove_scratch(self) -> None:
        if tf.io.gfile.exists(self.scratch_dir):
            tf.io.gfile.rmtree(self.scratch_dir)

    # ------------------------------------------------------------------ save

    def save(
        self, write_fn: Callable[[str], object], *, step: int, metadata: Mapping
    ) -> BackupInfo | None:
        """Writes and commits one backup; every task calls it at the same step.

        Args:
            write_fn: Writes the checkpoint at the prefix it is given, e.g.
                `checkpoint.write`.
            step: The global step the state is at.
            metadata: JSON-serializable counters saved beside the checkpoint.

        Returns:
            The committed backup on the chief; `None` on other tasks.
        """
        step = _check_step(step)
        if not self.is_chief:
            with storage_faults(self.scratch_dir, "this task's backup scratch directory"):
                self._remove_scratch()
                tf.io.gfile.makedirs(self.scratch_dir)
                try:
                    write_fn(os.path.join(self.scratch_dir, CHECKPOINT_NAME))
                finally:
                    self._remove_scratch()
            return None
        with storage_faults(self.backup_dir, f"the backup of step {step} to"):
            return self._save_on_chief(write_fn, step=step, metadata=metadata)

    def _save_on_chief(self, write_fn, *, step: int, metadata: Mapping) -> BackupInfo:
        tf.io.gfile.makedirs(self.backup_dir)
        final_path = self._path(_backup_name(step))
        if self.atomic_rename:
            work_path = self._path(f"{_TMP_PREFIX}{_backup_name(step)}-{uuid.uuid4().hex[:8]}")
        else:
            work_path = final_path
            if tf.io.gfile.exists(final_path):
                self._remove(final_path)
        try:
            tf.io.gfile.makedirs(work_path)
            self._write_uncommitted(write_fn, work_path, step=step, metadata=metadata)
        except Exception as error:
            # Never committed; removing it now gives a full disk its space back.
            with contextlib.suppress(Exception):
                self._remove(work_path)
            converted = storage_error(
                error,
                path=self.backup_dir,
                what=f"the backup of step {step} to",
                needed=self._newest_backup_bytes(),
            )
            if converted is not None and converted is not error:
                raise converted from None
            raise
        if self.atomic_rename:
            if tf.io.gfile.exists(final_path):
                self._remove(final_path)
            tf.io.gfile.rename(work_path, final_path)
        self._prune(step)
        return BackupInfo(step=step, path=final_path, metadata=dict(metadata))

    def _newest_backup_bytes(self) -> int | None:
        """The size of the newest committed backup (what the next one needs), if any."""
        with contextlib.suppress(Exception):
            steps = self.committed_steps()
            if steps:
                root = self._path(_backup_name(steps[-1]))
                return sum(
                    tf.io.gfile.stat(_join(directory, name)).length
                    for directory, _, names in tf.io.gfile.walk(root)
                    for name in names
                )
        return None

    def _write_uncommitted(self, write_fn, work_path: str, *, step: int, metadata: Mapping) -> None:
        """The checkpoint, its metadata and the commit marker, in `work_path`."""
        write_fn(_join(work_path, CHECKPOINT_NAME))
        record = {
            "format": FORMAT,
            "step": step,
            "saved_at": time.time(),
            "files": self._describe_files(work_path),
            "user": dict(metadata),
        }
        metadata_bytes = json.dumps(record, indent=1, sort_keys=True).encode()
        _write_bytes(_join(work_path, METADATA_NAME), metadata_bytes)
        marker = {
            "format": FORMAT,
            "step": step,
            "metadata_size": len(metadata_bytes),
            "metadata_crc32": zlib.crc32(metadata_bytes),
        }
        _write_bytes(_join(work_path, MARKER_NAME), json.dumps(marker).encode())

    def _describe_files(self, root: str) -> dict:
        files = {}
        for directory, _, names in tf.io.gfile.walk(root):
            for name in names:
                path = _join(directory, name)
                relative = path[len(root) :].lstrip("/")
                entry = {"size": tf.io.gfile.stat(path).length}
                if self.verify_checksums:
                    entry["crc32"] = _file_crc32(path)
                files[relative] = entry
        return files

    def _prune(self, newest_step: int) -> None:
        """Keeps the newest `keep` backups up to `newest_step`, drops older ones.

        A committed backup after `newest_step` belongs to a run that did not
        resume from it (restoring never leaves one: damaged ones are
        quarantined): it is quarantined too, never deleted.
        """
        steps = self.committed_steps()
        for step in steps:
            if step > newest_step:
                self._quarantine(
                    step, f"it is newer than the backup just saved at step {newest_step}"
                )
        older = [step for step in steps if step <= newest_step]
        for step in older[: -self.keep]:
            self._remove(self._path(_backup_name(step)))

    def _quarantine(self, step: int, reason: str) -> str:
        """Moves a backup out of the way without deleting it; returns where to."""
        source = self._path(_backup_name(step))
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self._path(f"{QUARANTINE_PREFIX}{step:012d}-{stamp}-{uuid.uuid4().hex[:4]}")
        if self.atomic_rename:
            tf.io.gfile.rename(source, target)
        else:
            # No atomic directory rename: copy every file, then delete the
            # original, marker first (an interruption leaves a readable copy).
            for directory, _, names in tf.io.gfile.walk(source):
                relative = directory[len(source) :].strip("/")
                destination = _join(target, relative) if relative else target
                tf.io.gfile.makedirs(destination)
                for name in names:
                    tf.io.gfile.copy(
                        _join(directory, name), _join(destination, name), overwrite=True
                    )
            self._remove(source)
        _log.warning(
            "Quarantined the backup at step %d as %s (%s); it is kept, not read "
            "again: inspect or delete it yourself.",
            step,
            target,
            reason,
        )
        return target

    # ------------------------------------------------------------ validation

    def validate(self, step: int) -> BackupInfo:
        """Checks one backup without loading it.

        Raises:
            CorruptBackupError: The marker, metadata or a file is missing,
                unparseable, of the wrong size or checksum.
        """
        path = self._path(_backup_name(step))
        marker_path = _join(path, MARKER_NAME)
        if not tf.io.gfile.exists(marker_path):
            raise CorruptBackupError(f"{path} has no {MARKER_NAME} marker (uncommitted)")
        try:
            marker = json.loads(_read_bytes(marker_path))
            metadata_bytes = _read_bytes(_join(path, METADATA_NAME))
        except (ValueError, tf.errors.NotFoundError) as error:
            raise CorruptBackupError(f"{path}: unreadable marker or metadata ({error})") from None
        if not isinstance(marker, dict) or marker.get("format") != FORMAT:
            raise CorruptBackupError(f"{path}: marker is not a {FORMAT} marker")
        if len(metadata_bytes) != marker.get("metadata_size") or zlib.crc32(
            metadata_bytes
        ) != marker.get("metadata_crc32"):
            raise CorruptBackupError(f"{path}: {METADATA_NAME} does not match its marker")
        try:
            record = json.loads(metadata_bytes)
        except ValueError as error:
            raise CorruptBackupError(f"{path}: {METADATA_NAME} is not JSON ({error})") from None
        if record.get("step") != step or not isinstance(record.get("files"), dict):
            raise CorruptBackupError(f"{path}: {METADATA_NAME} is for another step")
        for relative, expected in record["files"].items():
            file_path = _join(path, relative)
            if not tf.io.gfile.exists(file_path):
                raise CorruptBackupError(f"{path}: {relative} is missing")
            size = tf.io.gfile.stat(file_path).length
            if size != expected.get("size"):
                raise CorruptBackupError(
                    f"{path}: {relative} has {size} bytes, expected {expected.get('size')}"
                )
            if "crc32" in expected and self.verify_checksums:
                if _file_crc32(file_path) != expected["crc32"]:
                    raise CorruptBackupError(f"{path}: {relative} fails its checksum")
        return BackupInfo(step=step, path=path, metadata=record.get("user") or {})

    # --------------------------------------------------------------- restore

    def restore(self, read_fn: Callable[[BackupInfo], object]) -> BackupInfo | None:
        """Loads the newest valid backup, falling back past torn ones.

        Args:
            read_fn: Loads the validated backup it is given, e.g. by
                `tf.train.Checkpoint.read(info.checkpoint_prefix)`. The TensorFlow errors of
                damaged data it raises (`DataLossError`: a tensor failed its
                checksum) make the restore fall back; any other exception
                propagates and leaves every backup as it was.

        Returns:
            The backup loaded, or `None` when there is none. Damaged backups
            newer than it are quarantined (chief only), never deleted.
        """
        invalid = []
        for step in reversed(self.committed_steps()):
            try:
                info = self.validate(step)
                read_fn(info)
            except (CorruptBackupError, *_CORRUPT_DATA_ERRORS) as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                _log.warning(
                    "Backup at step %d is unusable, falling back to the previous one: %s",
                    step,
                    reason,
                )
                invalid.append(step)
                continue
            if invalid:
                _log.warning(
                    "Restored the backup at step %d instead of the newer, unusable "
                    "one(s) at step(s) %s",
                    step,
                    invalid,
                )
                self._quarantine_all(invalid)
            return info
        if invalid:
            _log.warning(
                "No usable backup in %s (all of steps %s are unusable); starting "
                "from the beginning",
                self.backup_dir,
                invalid,
            )
            self._quarantine_all(invalid)
        return None

    def _quarantine_all(self, steps: list[int]) -> None:
        if self.is_chief:
            for step in steps:
                self._quarantine(step, "it is damaged")

    # ------------------------------------------------------------ completion

    def mark_completed(self, *, step: int, metadata: Mapping | None = None) -> None:
        """Records that training finished at `step`; the chief only."""
        if not self.is_chief:
            return
        record = {
            "format": FORMAT,
            "step": _check_step(step),
            "finished_at": time.time(),
            "user": dict(metadata or {}),
        }
        data = json.dumps(record, indent=1, sort_keys=True).encode()
        with storage_faults(self.backup_dir, "the completion record to"):
            self._write_completion(data)

    def _write_completion(self, data: bytes) -> None:
        tf.io.gfile.makedirs(self.backup_dir)
        target = self._path(COMPLETED_NAME)
        if self.atomic_rename:
            write_atomically(
                target,
                data,
                temporary=self._path(f"{_TMP_PREFIX}{COMPLETED_NAME}-{uuid.uuid4().hex[:8]}"),
            )
        else:
            # An object store makes a single object visible only once complete.
            # Remove first: some filesystems (ram://) append to existing files.
            if tf.io.gfile.exists(target):
                tf.io.gfile.remove(target)
            _write_bytes(target, data)

    def completion(self) -> Mapping | None:
        """The completion record, or `None` if training has not finished."""
        path = self._path(COMPLETED_NAME)
        if not tf.io.gfile.exists(path):
            return None
        try:
            record = json.loads(_read_bytes(path))
        except ValueError:
            _log.warning("Ignoring unreadable %s", path)
            return None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            _log.warning("Ignoring malformed %s", path)
            return None
        return record

    def delete_backups(self) -> None:
        """Deletes every backup, keeping the completion record; the chief only."""
        if not self.is_chief:
            return
        # Oldest first: an interrupted deletion leaves the final backup beside the
        # completion record (consistent), never only older ones.
        for _, path in sorted(self._step_dirs().items()):
            self._remove(path)
