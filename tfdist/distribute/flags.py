"""absl flags for the strategy, for a user's own training script.

from absl import app
from tfdist.distribute import flags as tfdist_flags

tfdist_flags.define_strategy_flags()

def main(argv):
    strategy = tfdist_flags.strategy_from_flags()
    with strategy.scope():
        model = ...

if __name__ == "__main__":
    tfdist_flags.run(main)
"""

import os

from absl import flags

from tfdist.cli import (
    FlagSpec,
    define_flags,
    run,  # re-exported: exit code 2 on usage errors  # noqa: F401
)
from tfdist.distribute.choice import ALL_REDUCE, STRATEGIES, STRATEGY_DEFAULTS
from tfdist.distribute.cluster import resolve_cluster_for_strategy

__all__ = ["STRATEGY_FLAGS", "define_strategy_flags", "strategy_from_flags", "run"]


STRATEGY_FLAGS = (
    FlagSpec(
        "strategy",
        STRATEGY_DEFAULTS["strategy"],
        f"Distribution strategy: {', '.join(STRATEGIES)}.",
    ),
    FlagSpec(
        "all_reduce",
        STRATEGY_DEFAULTS["all_reduce"],
        f"Collective implementation: {', '.join(ALL_REDUCE)}.",
    ),
    FlagSpec(
        "num_cpu_devices",
        STRATEGY_DEFAULTS["num_cpu_devices"],
        "For --strategy=mirrored without GPUs: split the CPU into this many logical devices.",
    ),
    FlagSpec("tpu", STRATEGY_DEFAULTS["tpu"], "TPU name or grpc:// address; 'local' on a TPU VM."),
    FlagSpec(
        "peer_timeout_seconds",
        STRATEGY_DEFAULTS["peer_timeout_seconds"],
        "A task of a multiworker or parameter-server job that stops answering (frozen, "
        "hung) for this many seconds is lost: the others exit 200.",
    ),
)


def define_strategy_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines --strategy, --all_reduce, --num_cpu_devices, --tpu and --peer_timeout_seconds."""
    define_flags(STRATEGY_FLAGS, flag_values, module_name=__name__)


def strategy_from_flags(flag_values: flags.FlagValues = flags.FLAGS):
    """Builds the strategy the flags ask for, on the cluster the environment describes.

    Raises:
        UsageError: Bad flags or cluster variables (`run` turns it into exit code 2).
    """
    from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

    cluster = resolve_cluster_for_strategy(os.environ, flag_values.strategy)
    options = strategy_lib.StrategyOptions(
        all_reduce=flag_values.all_reduce,
        num_cpu_devices=flag_values.num_cpu_devices,
        tpu=flag_values.tpu,
        peer_timeout_seconds=flag_values.peer_timeout_seconds,
    )
    return strategy_lib.make_strategy(flag_values.strategy, cluster, options)
