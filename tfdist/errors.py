"""Exceptions that separate a user's mistake from a crash: every exception type tfdist raises.

Two live elsewhere because they subclass what they must: `tfdist.parameter_server.training.
ParameterServerLostError` is a `tf.errors.UnavailableError` (this module loads no TensorFlow),
and the `SystemExit`s that carry an exit code (`tfdist.preemption.Preempted`,
`tfdist.resumable.StorageFault`, `tfdist.resumable.PeerLost`) are exits, not errors.
"""

__all__ = [
    "UsageError",
    "ClusterConfigError",
    "TaskError",
    "BackupInUseError",
    "CorruptBackupError",
    "BackupMismatchError",
    "NonFiniteError",
    "StorageError",
    "PeerLostError",
    "StoppedWithoutStateError",
    "DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS",
    "CrashLoopError",
]


class UsageError(ValueError):
    """Bad input from the user: flags, config files or cluster variables.

    Command-line entry points print its message as one line on stderr and exit
    with code 2, without a traceback; so does `tfdist.resumable` in a user's
    script when it runs as a task of a job (`TF_CONFIG` or `CLUSTER_SPEC` set,
    not interactive: `tfdist.cli.usage_errors_exit`). The message names what
    was wrong, the value, what was expected and how to fix it.
    """


class ClusterConfigError(UsageError):
    """`TF_CONFIG` or `CLUSTER_SPEC` describes a cluster that cannot run."""


class TaskError(UsageError):
    """The task cannot be loaded or breaks the contract; exit code 2."""


class BackupInUseError(UsageError):
    """Another live job holds the backup directory's lease (exit 2; nothing was touched)."""


class CorruptBackupError(Exception):
    """A backup directory is torn, truncated, uncommitted or altered."""


class BackupMismatchError(UsageError):
    """A restart differs from the run that wrote the backup it would resume.

    Raised before anything is restored or any backup is touched. The message is
    one line naming the field, the backup's value and this run's value.

    Attributes:
        field: What differs, e.g. `"global_batch_size"`, `"optimizer"` or
            `"model variable q/kernel"`.
        backup_value: The value recorded in the backup, as shown.
        run_value: This run's value, as shown.
    """

    def __init__(
        self, message: str, *, field: str = "", backup_value: str = "", run_value: str = ""
    ):
        super().__init__(message)
        self.field = field
        self.backup_value = backup_value
        self.run_value = run_value


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinite loss or variable; nothing non-finite was saved.

    Command-line entry points print its message as one line on stderr and exit
    with `tfdist.cli.EXIT_NON_FINITE`. The last backup holds finite values.
    """


# What the operating system or TensorFlow's filesystems say when storage refuses a write, and
# the cause a user reads. TensorFlow's errors carry the OS message ("<path>; No space left on
# device"), so they are matched by text; OSErrors by errno.
_STORAGE_ERRNOS = {
    28: "no space left on the device (disk full)",  # ENOSPC
    122: "disk quota exceeded",  # EDQUOT
    30: "read-only file system",  # EROFS
    13: "permission denied",  # EACCES
    1: "operation not permitted",  # EPERM
    20: "a parent path is not a directory",  # ENOTDIR
    17: "a file of that name exists where a directory is expected",  # EEXIST
}
_STORAGE_MESSAGES = (
    ("no space left on device", _STORAGE_ERRNOS[28]),
    ("disk quota exceeded", _STORAGE_ERRNOS[122]),
    ("read-only file system", _STORAGE_ERRNOS[30]),
    ("permission denied", _STORAGE_ERRNOS[13]),
    ("operation not permitted", _STORAGE_ERRNOS[1]),
    ("not a directory", _STORAGE_ERRNOS[20]),
    # Cloud Storage's answers (unverified here: TensorFlow's gs:// cannot reach an emulator).
    ("bucket does not exist", "the bucket does not exist"),
    ("nosuchbucket", "the bucket does not exist"),
    ("storage.objects.create", "permission denied (storage.objects.create)"),
    ("storage.objects.delete", "permission denied (storage.objects.delete)"),
)
# TensorFlow errors that can carry a storage cause (others, e.g. an out-of-memory
# ResourceExhaustedError, never name one of the messages above).
_TF_STORAGE_ERRORS = (
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "NotFoundError",
    "FailedPreconditionError",
    "UnknownError",
    "UnavailableError",
    "InternalError",
    "AbortedError",
)


class StorageError(RuntimeError):
    """Storage refused a write: a full disk, read-only storage, a missing bucket, no permission.

    Command-line entry points print its message as one line on stderr and exit
    with `tfdist.cli.EXIT_STORAGE`. Nothing committed before it is lost: a
    backup that failed to write is never committed.

    Attributes:
        path: The path that could not be written.
        cause: Why, in words (e.g. "read-only file system").
    """

    def __init__(self, message: str, *, path: str = "", cause: str = ""):
        super().__init__(message)
        self.path = path
        self.cause = cause

    @staticmethod
    def cause_of(error: BaseException) -> str | None:
        """The storage cause of an `OSError` or TensorFlow error, or None if it is not one."""
        if isinstance(error, StorageError):
            return error.cause
        if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
            return _STORAGE_ERRNOS[error.errno]
        names = {cls.__name__ for cls in type(error).__mro__}
        if isinstance(error, OSError) or names & set(_TF_STORAGE_ERRORS):
            text = str(error).lower()
            for needle, cause in _STORAGE_MESSAGES:
                if needle in text:
                    return cause
        return None


class PeerLostError(RuntimeError):
    """Another task of the job stopped answering, or never came up.

    A transient cluster failure: command-line entry points print its message as
    one line and exit with `tfdist.cli.EXIT_PEER_LOST` (200), a code restart
    policies retry; the restarted job resumes from its last backup.
    """


class StoppedWithoutStateError(RuntimeError):
    """A task that keeps no state of its own stopped after a preemption notice.

    A parameter-server worker or ps task, or an evaluator, saves nothing when
    it gets SIGTERM (the chief owns the backups), so its exit code must not
    claim a save: entry points exit with `tfdist.cli.EXIT_STOPPED_WITHOUT_STATE`
    (201), which restart policies retry.
    """


# Restarts from one backup without committing a new one before a job stops (exit 4).
DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS = 3


class CrashLoopError(RuntimeError):
    """A job restarted too many times from one backup without committing a new one.

    Command-line entry points print its message as one line on stderr and exit
    with `tfdist.cli.EXIT_CRASH_LOOP` (4), which no restart policy retries. The
    message names the step, the count and how to go on.
    """
