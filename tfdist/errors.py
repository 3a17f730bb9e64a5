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
