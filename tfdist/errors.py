"""Exceptions that separate a user's mistake from a crash."""


class UsageError(ValueError):
    """Bad input from the user: flags, config files or cluster variables.

    Command-line entry points print its message as one line on stderr and exit
    with code 2, without a traceback. The message names what was wrong, the
    value, what was expected and how to fix it.
    """


class ClusterConfigError(UsageError):
    """`TF_CONFIG` or `CLUSTER_SPEC` describes a cluster that cannot run."""


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


# Restarts from one backup without committing a new one before a job stops (exit 4).
DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS = 3


class CrashLoopError(RuntimeError):
    """A job restarted too many times from one backup without committing a new one.

    Command-line entry points print its message as one line on stderr and exit
    with `tfdist.cli.EXIT_CRASH_LOOP` (4), which no restart policy retries. The
    message names the step, the count and how to go on.
    """
