"""Exceptions that separate a user's mistake from a crash."""


class UsageError(ValueError):
    """Bad input from the user: flags, config files or cluster variables.

    Command-line entry points print its message as one line on stderr and exit
    with code 2, without a traceback. The message names what was wrong, the
    value, what was expected and how to fix it.
    """


class ClusterConfigError(UsageError):
    """`TF_CONFIG` or `CLUSTER_SPEC` describes a cluster that cannot run."""
