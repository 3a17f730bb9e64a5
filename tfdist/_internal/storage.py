"""Storage faults as one line: `check_writable` at start, `storage_faults` around every write.

A full disk, read-only storage, a bucket that does not exist or a permission
refused surfaces as `tfdist.errors.StorageError` naming the path and the cause
(`trainer.task` and `tfdist.resumable.fit` exit `tfdist.cli.EXIT_STORAGE`).
Local paths use `os` (no TensorFlow import); a path with a scheme (`gs://`,
`ram://`) goes through `tf.io.gfile`, loaded on first use.
"""

import contextlib
import os
import re
from typing import Iterator

from tfdist.errors import StorageError

_PATH_BEFORE_CAUSE = re.compile(r"(\S+?);\s")


def _gfile():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.io.gfile


def _failed_path(error: BaseException, default: str) -> str:
    """The path the error names (an OSError's filename, TensorFlow's "<path>; cause"), else `default`."""
    filename = getattr(error, "filename", None)
    if isinstance(filename, str) and filename:
        return filename
    match = _PATH_BEFORE_CAUSE.search(" ".join(str(error).split()))
    return match.group(1) if match and "/" in match.group(1) else default


def storage_error(
    error: BaseException, *, path: str, what: str, needed: int | None = None
) -> StorageError | None:
    """`error` as a one-line `StorageError` about `what` at `path`, or None if it is no storage fault.

    Args:
        error: What the write raised.
        path: The directory the user named.
        what: What was being written, for the line ("the backup of step 20 to").
        needed: Bytes the last committed copy takes, when known (what the write needs).
    """
    if isinstance(error, StorageError):
        return error
    cause = StorageError.cause_of(error)
    if cause is None:
        return None
    failed = _failed_path(error, path)
    inside = failed == path or failed.startswith(path.rstrip("/") + "/")
    where = f"{path!r}" if inside else f"{path!r} (at {failed!r})"
    return StorageError(
        f"cannot write {what} {where}: {cause}{_free_space(path, cause, needed)}; the last "
        f"committed backup is kept: free space, fix the permissions or point the flag at "
        f"writable storage, then run the job again",
        path=path,
        cause=cause,
    )


def _free_space(path: str, cause: str, needed: int | None = None) -> str:
    """How full a local filesystem is, for a full-disk message; empty elsewhere.

    Measured after the partial write was removed: what the user has to work with.
    """
    if ("space" not in cause and "quota" not in cause) or "://" in path:
        return ""
    existing = os.path.abspath(path)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        stats = os.statvfs(existing)
    except OSError:
        return ""
    need = f"; the last committed one takes {_size(needed)}" if needed else ""
    return (
        f" ({_size(stats.f_bavail * stats.f_frsize)} free of "
        f"{_size(stats.f_blocks * stats.f_frsize)} once the partial write was removed{need})"
    )


def _size(count: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


@contextlib.contextmanager
def storage_faults(path: str, what: str) -> Iterator[None]:
    """Turns a storage fault raised inside the block into a `StorageError` about `path`."""
    try:
        yield
    except Exception as error:  # pylint: disable=broad-except  (re-raised unless storage)
        converted = storage_error(error, path=path, what=what)
        if converted is None or converted is error:
            raise
        raise converted from None


def check_writable(directory: str, what: str) -> None:
    """Creates `directory` if needed and writes, then removes, a small probe file in it.

    Run at start, before training and before any peer is contacted, so that
    read-only storage or a full disk is found in the first second rather than at
    the first backup.

    Raises:
        StorageError: The directory cannot be created or written.
    """
    probe_name = f".tfdist-write-check-{os.getpid()}-{os.urandom(4).hex()}"
    with storage_faults(directory, what):
        if "://" in directory:
            gfile = _gfile()
            probe = f"{directory.rstrip('/')}/{probe_name}"
            gfile.makedirs(directory)
            with gfile.GFile(probe, "wb") as handle:
                handle.write(b"ok\n")
            gfile.remove(probe)
        else:
            _check_local(directory, probe_name)


def _check_local(directory: str, probe_name: str) -> None:
    """The local probe; directories it had to create are removed again (nothing is left)."""
    missing = []
    parent = os.path.abspath(directory)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        missing.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(directory, exist_ok=True)
    try:
        probe = os.path.join(directory, probe_name)
        with open(probe, "wb") as handle:
            handle.write(b"ok\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.remove(probe)
    finally:
        for created in missing:
            with contextlib.suppress(OSError):
                os.rmdir(created)
