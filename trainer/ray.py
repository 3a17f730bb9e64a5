"""Runs `trainer.task` under Ray Train: `python -m trainer.ray [flags] -- <trainer.task flags>`.

    python -m trainer.ray --num_workers=2 --max_failures=2 --storage_path=/shared/ray \\
        -- --strategy=multi_worker_mirrored --model_dir=/shared/model --backup_dir=/shared/backup
    python -m trainer.ray --chief --num_workers=1 --num_ps=1 \\
        -- --strategy=parameter_server --model_dir=/shared/model

Builds Ray's own `TensorflowTrainer` with `tfdist.ray.TensorflowConfig` (the
roles laid over Ray's ranks: rank 0 the chief with `--chief`, then the workers,
then `--num_ps` parameter servers, the evaluator last with `--evaluator`) and
a training function that runs `trainer.task`'s main with the flags after `--`
on every rank (under parameter servers, the worker and ps ranks serve until
the chief returns). `--max_failures` goes to Ray's `FailureConfig`, which
restarts the whole group; `trainer.task` resumes from `--backup_dir`. With a
`--backup_dir`, every strategy reports the committed backups to Ray as
checkpoints and acts on Ray's preemption notice (`tfdist.ray`); the last
checkpoint's path is printed at the end (`Ray Train's checkpoint: PATH`). With no
`--address` (or `RAY_ADDRESS`, as `ray job submit` sets it), a local Ray cluster of
its own is started on 127.0.0.1, even when another Ray cluster runs on the machine.

The flags are checked before Ray starts: a bad one is one line on stderr and
exit 2. Exit 1 when the Ray cluster cannot be started or joined, or when Ray
gives up on the run (its error on one line). `--use_gpu` gives each rank GPUs
of its own (`--gpus_per_task`, `--accelerator_type`); without it a rank is
given none (`CUDA_VISIBLE_DEVICES=''`: Ray 2.60 would show it every GPU of its
node). `--help` prints the flags and exits 0.
"""

import dataclasses
import math
import os
import re
import sys

from absl import flags

from tfdist import cli
from tfdist._internal.preconditions import quoted
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from trainer import options as options_lib
from trainer.options import option


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """The flags of `trainer.ray` (flags only: no config file); the trainer's own row type."""

    num_workers: int = option(
        2, "Worker tasks (Ray ranks after the chief).", is_config_key=False, lower_bound=0
    )
    chief: bool = option(
        False, "Rank 0 is the chief (required with --num_ps).", is_config_key=False
    )
    num_ps: int = option(
        0,
        "Parameter servers (the last ranks before the evaluator).",
        is_config_key=False,
        lower_bound=0,
    )
    evaluator: bool = option(False, "The last rank is the evaluator.", is_config_key=False)
    cpus_per_task: int = option(
        1, "CPUs Ray reserves for each rank.", is_config_key=False, lower_bound=1
    )
    use_gpu: bool = option(
        False,
        "Ray ScalingConfig(use_gpu): each rank asks for GPUs (--gpus_per_task, default 1) "
        "and sees only its own; without it ranks are given no GPU (CUDA_VISIBLE_DEVICES='').",
        is_config_key=False,
    )
    gpus_per_task: float = option(
        0.0,
        "With --use_gpu: GPUs Ray reserves for each rank (0: Ray's default, 1).",
        is_config_key=False,
        lower_bound=0,
    )
    resources_per_task: str = option(
        "",
        "More Ray resources each rank asks for, NAME=AMOUNT,... (custom node resources).",
        is_config_key=False,
    )
    accelerator_type: str = option(
        "",
        "Ray ScalingConfig(accelerator_type): place ranks on nodes with this accelerator "
        "(e.g. A100, H100, L4); needs --use_gpu.",
        is_config_key=False,
    )
    max_failures: int = option(
        0,
        "Ray FailureConfig(max_failures): group restarts after a worker error (-1: unlimited).",
        is_config_key=False,
        lower_bound=-1,
    )
    max_preemption_failures: int = option(
        -1,
        "Ray FailureConfig(max_preemption_failures): "
        "restarts after node preemptions (-1: unlimited).",
        is_config_key=False,
        lower_bound=-1,
    )
    storage_path: str = option(
        "",
        "Ray RunConfig(storage_path): where Ray keeps the run (default: Ray's, ~/ray_results).",
        is_config_key=False,
    )
    name: str = option("tfdist-trainer", "Ray RunConfig(name).", is_config_key=False)
    address: str = option(
        "",
        "Ray cluster to join (e.g. auto); empty: RAY_ADDRESS if set, else a new local cluster on"
        " 127.0.0.1.",
        is_config_key=False,
    )


RAY_OPTIONS = options_lib.table(RayOptions)
RAY_FLAGS = flags.FlagValues()
options_lib.define_flags(RAY_OPTIONS, RAY_FLAGS, module_name=__name__)

_TASK = "trainer.task"


def cluster_to_join(address_flag: str, environ) -> str:
    """The Ray cluster to join, or "" to start a local one.

    `--address` first; without it `RAY_ADDRESS` (which `ray job submit` sets for
    its entrypoint), unless that is "local". Never the cluster Ray last started
    on this machine: with neither, the run gets a local cluster of its own.
    """
    address = address_flag or environ.get("RAY_ADDRESS", "")
    return "" if address == "local" else address


_RESOURCE = re.compile(r"^[A-Za-z][A-Za-z0-9_:./-]{0,99}$")


@dataclasses.dataclass(frozen=True)
class RankResources:
    """What each rank asks Ray for (ScalingConfig's use_gpu, resources_per_worker, accelerator_type).

    Attributes:
        use_gpu: Ray gives each rank GPUs of its own and sets its CUDA_VISIBLE_DEVICES.
        per_rank: `resources_per_worker`: CPU, GPU and custom resources.
        accelerator_type: Nodes with this accelerator only; empty for any.
    """

    use_gpu: bool
    per_rank: dict
    accelerator_type: str = ""


def rank_resources(
    *,
    cpus: int,
    use_gpu: bool,
    gpus: float,
    resources: str,
    accelerator_type: str,
) -> RankResources:
    """The resources each rank asks for, from this command's flags.

    Raises:
        UsageError: GPUs or an accelerator type without --use_gpu, or a
            --resources_per_task item that is not NAME=AMOUNT.
    """
    if not use_gpu and (gpus or accelerator_type):
        given = "--gpus_per_task" if gpus else "--accelerator_type"
        raise UsageError(
            f"{given} is set but --use_gpu is off, expected --use_gpu with it (a rank that "
            f"asks for no GPU is given none)"
        )
    if not math.isfinite(gpus):
        raise UsageError(f"--gpus_per_task is {gpus}, expected a finite number of GPUs")
    per_rank = {"CPU": cpus}
    if use_gpu:
        per_rank["GPU"] = gpus or 1
    for item in filter(None, (part.strip() for part in resources.split(","))):
        name, _, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = float("nan")
        if not _RESOURCE.match(name) or not (math.isfinite(value) and value > 0):
            raise UsageError(
                f"--resources_per_task has {quoted(item)}, expected NAME=AMOUNT with a "
                f"positive amount, e.g. --resources_per_task=tpu_host=1,fast_disk=0.5"
            )
        if name in ("CPU", "GPU"):
            raise UsageError(
                f"--resources_per_task sets {name}, expected --cpus_per_task or "
                f"--gpus_per_task for it"
            )
        per_rank[name] = value
    return RankResources(
        use_gpu=use_gpu, per_rank=per_rank, accelerator_type=accelerator_type.strip()
    )


def rank_environment(environ, resources: RankResources) -> dict:
    """The environment Ray's runtime_env gives every rank.

    Without --use_gpu each rank is given no GPU: Ray 2.60 leaves a rank that
    asks for none seeing all of its node's GPUs, so ranks on one node would
    share them unplaced. A CUDA_VISIBLE_DEVICES the user set is kept.
    """
    env_vars = {
        name: environ[name]
        for name in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL")
        if name in environ
    }
    if not resources.use_gpu:
        env_vars.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env_vars


def check_task_flags(task_argv: list[str], world_size: int):
    """Parses `trainer.task`'s flags here and checks the job's roles against its strategy.

    Returns:
        The `tfdist.ray.TensorflowConfig` laying the roles over the ranks.

    Raises:
        UsageError: A flag `trainer.task` would refuse, or a strategy the roles
            do not fit.
    """
    # pylint: disable=g-import-not-at-top
    import tfdist.ray
    from tfdist.ray import roles
    from trainer import task

    flags.FLAGS.unparse_flags()
    try:
        remaining = flags.FLAGS([_TASK, *task_argv])
    except flags.Error as error:
        raise UsageError(
            f"{error} (a trainer.task flag after --; run python -m trainer.task "
            f"--helpfull to list them)"
        ) from None
    if len(remaining) > 1:
        raise UsageError(
            f"unexpected argument {remaining[1]!r} after --, expected only trainer.task --flags"
        )
    config = task.config_from_flags()
    _check_shape(config.strategy)
    tensorflow_config = tfdist.ray.TensorflowConfig(
        chief=RAY_FLAGS.chief, parameter_servers=RAY_FLAGS.num_ps, evaluator=RAY_FLAGS.evaluator
    )
    layout = tensorflow_config.layout(world_size)
    addresses = [f"127.0.0.1:{port}" for port in range(1, world_size + 1)]
    chief_config = roles.tf_configs(layout, addresses)[0]
    cluster = cluster_lib.resolve_cluster_for_strategy(
        {cluster_lib.TF_CONFIG: chief_config}, config.strategy
    )
    if config.strategy != "auto":
        cluster_lib.check_cluster_for_strategy(cluster, config.strategy)
    return tensorflow_config


# What this command calls the roles' counts; the strategy is trainer.task's, after --.
ROLE_NAMES = cluster_lib.RoleNames(
    strategy="trainer.task's --strategy",
    chief="--chief",
    worker="--num_workers",
    ps="--num_ps",
    evaluator="--evaluator",
)


def _check_shape(strategy: str) -> None:
    """The trainer's rule of roles per strategy (`check_cluster_for_strategy`), in our flags."""
    cluster = cluster_lib.cluster_of_shape(
        chief=RAY_FLAGS.chief,
        workers=RAY_FLAGS.num_workers,
        ps=RAY_FLAGS.num_ps,
        evaluators=int(RAY_FLAGS.evaluator),
        source="the Ray job's ranks",
    )
    cluster_lib.check_cluster_for_strategy(cluster, strategy, ROLE_NAMES)


def train_loop(config: dict) -> None:
    """Every rank's training function: `trainer.task`'s main with `config["argv"]`."""
    # pylint: disable=g-import-not-at-top
    from trainer import task

    flags.FLAGS([_TASK, *config["argv"]])
    task.main([_TASK])


def _print_help_if_asked(argv: list[str]) -> None:
    """`--help` (before `--`) prints this command's flags and exits 0, as every entry point does."""
    own, _ = cli.split_command(argv)
    if any(arg in cli.HELP_FLAGS for arg in own[1:]):
        print(__doc__.strip(), end="\n\n")
        print(RAY_FLAGS.get_help())
        sys.exit(cli.EXIT_OK)


def main(argv: list[str]) -> int:
    _print_help_if_asked(argv)
    RAY_FLAGS.unparse_flags()  # a second call in one process starts from the defaults
    try:
        task_argv = RAY_FLAGS(argv)[1:]
    except flags.Error as error:
        cli.exit_usage_error(f"{error} (run python -m trainer.ray --helpfull to list the flags)")
    # pylint: disable=g-import-not-at-top
    from tfdist._internal import startup_logs

    startup_logs.import_tensorflow_quietly()  # ray.train.tensorflow imports it, banners and all
    try:
        import ray
        import ray.train
        from ray.train.tensorflow import TensorflowTrainer

        import tfdist.ray
    except ImportError as error:
        cli.exit_usage_error(
            f"trainer.ray needs Ray Train ({error}); install it with pip install 'tfdist[ray]'"
        )
    try:
        world_size = (
            int(RAY_FLAGS.chief)
            + RAY_FLAGS.num_workers
            + RAY_FLAGS.num_ps
            + int(RAY_FLAGS.evaluator)
        )
        backend = check_task_flags(task_argv, world_size)
        resources = rank_resources(
            cpus=RAY_FLAGS.cpus_per_task,
            use_gpu=RAY_FLAGS.use_gpu,
            gpus=RAY_FLAGS.gpus_per_task,
            resources=RAY_FLAGS.resources_per_task,
            accelerator_type=RAY_FLAGS.accelerator_type,
        )
    except UsageError as error:
        cli.exit_usage_error(str(error))

    env_vars = rank_environment(os.environ, resources)
    address = cluster_to_join(RAY_FLAGS.address, os.environ)
    try:
        if address:
            ray.init(address=address, runtime_env={"env_vars": env_vars})
        else:
            # "local": a new cluster even when another one is the machine's current
            # (/tmp/ray/ray_current_cluster), which ray.init() without an address would join.
            ray.init(
                address="local",
                num_cpus=world_size * RAY_FLAGS.cpus_per_task,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                runtime_env={"env_vars": env_vars},
            )
    except Exception as error:  # pylint: disable=broad-except  (Ray raises many kinds here)
        where = (
            f"join the Ray cluster at {quoted(address)}" if address else "start a local Ray cluster"
        )
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        cli.exit_with_error(
            f"could not {where} ({type(error).__name__}: {first_line}); check --address, "
            f"RAY_ADDRESS and RAY_TMPDIR",
            cli.EXIT_SERVICE_FAILURE,
        )
    try:
        trainer = TensorflowTrainer(
            tfdist.ray.train_function(train_loop),
            train_loop_config={"argv": task_argv},
            tensorflow_config=backend,
            scaling_config=ray.train.ScalingConfig(
                num_workers=world_size,
                use_gpu=resources.use_gpu,
                resources_per_worker=resources.per_rank,
                accelerator_type=resources.accelerator_type or None,
            ),
            run_config=ray.train.RunConfig(
                name=RAY_FLAGS.name,
                storage_path=RAY_FLAGS.storage_path or None,
                failure_config=ray.train.FailureConfig(
                    max_failures=RAY_FLAGS.max_failures,
                    max_preemption_failures=RAY_FLAGS.max_preemption_failures,
                ),
            ),
        )
        try:
            result = trainer.fit()
        except Exception as error:  # pylint: disable=broad-except  (Ray's TrainingFailedError)
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            cli.exit_with_error(
                f"the Ray Train run failed: {type(error).__name__}: {first_line}", 1
            )
        if result.error:
            cli.exit_with_error(f"the Ray Train run failed: {result.error!r}"[:400], 1)
        # tfdist's committed backups are Ray's checkpoints (tfdist.ray.ReportBackups).
        print(
            f"Ray Train's checkpoint: {result.checkpoint.path}"
            if result.checkpoint is not None
            else "Ray Train kept no checkpoint (trainer.task had no --backup_dir)",
            flush=True,
        )
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
