"""Which role each Ray Train rank plays: chief, workers, parameter servers, evaluator.

Ray Train starts `num_workers` identical workers (ranks 0..n-1) and its own
backend makes every one a `worker`. `layout` lays tfdist's roles over the
ranks in `tfdist.launch.local_cluster`'s start order: rank 0 is the chief (when there
is one), then the workers, then the parameter servers, and the evaluator is
the last rank. `tf_configs` writes each rank's `TF_CONFIG` as
`tfdist.launch.local_cluster` does for local jobs (the evaluator also sees the
training tasks; they do not see it). No Ray, no TensorFlow here.
"""

from tfdist._internal.preconditions import check_whole_number
from tfdist.errors import UsageError
from tfdist.launch import local_cluster

__all__ = ["check_options", "layout", "tf_configs", "task_names"]


def check_options(*, chief: bool, parameter_servers: int, evaluator: bool) -> None:
    """Raises `UsageError` (one line) for options no world size can satisfy."""
    for name, value in (("chief", chief), ("evaluator", evaluator)):
        if not isinstance(value, bool):
            raise UsageError(f"{name} is {value!r}, expected True or False")
    check_whole_number("parameter_servers", parameter_servers, minimum=0)
    if parameter_servers and not chief:
        raise UsageError(
            f"parameter_servers is {parameter_servers} but chief is False, expected a chief "
            f"to coordinate parameter-server training; pass chief=True"
        )


def layout(
    world_size: int, *, chief: bool = False, parameter_servers: int = 0, evaluator: bool = False
) -> local_cluster.ClusterLayout:
    """The roles of `world_size` Ray ranks; the ranks left over are workers.

    Raises:
        UsageError: The options do not fit `world_size` ranks.
    """
    check_options(chief=chief, parameter_servers=parameter_servers, evaluator=evaluator)
    min_workers = 1 if parameter_servers or not chief else 0
    needed = int(chief) + parameter_servers + int(evaluator) + min_workers
    workers = world_size - int(chief) - parameter_servers - int(evaluator)
    if world_size < needed:
        raise UsageError(
            f"Ray Train has {world_size} worker(s), expected at least {needed} for "
            f"chief={chief}, parameter_servers={parameter_servers}, evaluator={evaluator}"
            f"{' and 1 worker' if min_workers else ''}; raise ScalingConfig(num_workers=...)"
        )
    return local_cluster.ClusterLayout(
        num_workers=workers, num_ps=parameter_servers, has_chief=chief, has_evaluator=evaluator
    )


def tf_configs(cluster_layout: local_cluster.ClusterLayout, urls: list[str]) -> list[str]:
    """Each rank's `TF_CONFIG` JSON, given each rank's `host:port` in rank order."""
    names = cluster_layout.task_names()
    if len(names) != len(urls):
        raise ValueError(f"{len(urls)} addresses for {len(names)} tasks")
    configs = local_cluster.tf_configs(cluster_layout, dict(zip(names, urls)))
    return [configs[name] for name in names]


def task_names(cluster_layout: local_cluster.ClusterLayout) -> tuple[str, ...]:
    """`"chief:0"`, `"worker:0"`, ... in rank order."""
    return cluster_layout.task_names()
