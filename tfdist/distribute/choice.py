"""Strategy names, the strategy options' defaults and the `auto` choice, free of TensorFlow."""

from tfdist._internal import liveness
from tfdist.distribute.cluster import Cluster
from tfdist.errors import UsageError

__all__ = [
    "STRATEGIES",
    "ALL_REDUCE",
    "STRATEGY_DEFAULTS",
    "check_strategy_name",
    "choose_strategy",
]

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multiworker", "parameter_server", "tpu")
# Collective implementations (`--all_reduce`, `tfdist.distribute.strategy.StrategyOptions`).
ALL_REDUCE = ("auto", "ring", "nccl")
# The one place the strategy options' defaults are written: `tfdist.distribute.flags`,
# `StrategyOptions` and the trainer's option table (trainer/config.py) all read them here.
STRATEGY_DEFAULTS = {
    "strategy": "auto",
    "all_reduce": "auto",
    "num_cpu_devices": 0,
    "tpu": "",
    "peer_timeout_seconds": liveness.DEFAULT_TIMEOUT_SECONDS,
}


def check_strategy_name(name: str) -> str:
    """Returns `name` lowercased, or raises a `UsageError` listing valid names."""
    normalized = str(name).strip().lower()
    if normalized not in STRATEGIES:
        raise UsageError(
            f"Unrecognized strategy {name!r}, expected one of: {', '.join(STRATEGIES)}"
        )
    return normalized


def choose_strategy(cluster: Cluster, *, num_gpus: int, tpu: str = "") -> tuple[str, str]:
    """What `--strategy=auto` picks, and why.

    Args:
        cluster: The resolved cluster.
        num_gpus: GPUs visible to this process.
        tpu: The `--tpu` flag's value ("" when unset).

    Returns:
        The strategy name and a sentence explaining the choice.
    """
    if tpu:
        return "tpu", f"--tpu={tpu!r} is set"
    if cluster.num_ps:
        return "parameter_server", f"the cluster has {cluster.num_ps} ps task(s)"
    if cluster.num_workers > 1:
        return "multiworker", (
            f"the cluster has {cluster.num_workers} training tasks (chief and workers)"
        )
    if num_gpus > 1:
        return "mirrored", f"this machine has {num_gpus} GPUs"
    if num_gpus == 1:
        return "one_device", "this machine has 1 GPU"
    return "default", "single process with no GPU"
