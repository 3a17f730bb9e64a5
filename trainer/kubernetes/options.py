"""The flags and `--job_config` keys of `python -m trainer.kubernetes`: two option tables.

    ShapeOptions     the job shape (`trainer.kubernetes.shape.TFJobShape`'s fields): flags
                     and `--job_config` keys
    CommandOptions   the command's own flags (`--job_config`, `--format`, `--api`, `--check`)

Every row is a `trainer.options.Option`, the trainer's own row type. A shape
option's type and default are its `TFJobShape` field's (tests/unit/test_option_tables.py
checks both, and pins the flag set); its help is here. `define_flags` is the
only place the command's absl flags come from.
"""

import dataclasses

from absl import flags

from trainer import options as options_lib
from trainer.kubernetes import shape as shape_lib
from trainer.options import option

__all__ = [
    "ShapeOptions",
    "CommandOptions",
    "SHAPE_OPTIONS",
    "COMMAND_OPTIONS",
    "CONFIG_KEYS",
    "define_flags",
]

# TFJobShape's defaults; `name` and `image` have none (a flag's default is then empty).
_DEFAULT = {
    field.name: field.default
    for field in dataclasses.fields(shape_lib.TFJobShape)
    if field.default is not dataclasses.MISSING
}


@dataclasses.dataclass(frozen=True)
class ShapeOptions:
    """The job shape: each field is a flag and a `--job_config` key (`TFJobShape`'s)."""

    name: str = option("", "The TFJob's name (a DNS-1035 label).")
    image: str = option("", "The trainer image every replica runs (docker/).")
    namespace: str = option(_DEFAULT["namespace"], "Its namespace; default: kubectl's.")
    strategy: str = option(
        _DEFAULT["strategy"], f"trainer.task --strategy: {', '.join(shape_lib.STRATEGIES)}."
    )
    chief: bool = option(
        _DEFAULT["chief"], "A Chief replica (the coordinator under parameter_server)."
    )
    workers: int = option(_DEFAULT["workers"], "Worker replicas.")
    parameter_servers: int = option(
        _DEFAULT["parameter_servers"], "PS replicas (strategy parameter_server)."
    )
    evaluators: int = option(_DEFAULT["evaluators"], "Evaluator replicas, 0 or 1.")
    cpu: str = option(_DEFAULT["cpu"], "CPU of chief, worker and evaluator pods (request = limit).")
    memory: str = option(_DEFAULT["memory"], "Memory of those pods.")
    gpus: int = option(_DEFAULT["gpus"], "GPUs per chief and worker pod.")
    gpu_resource: str = option(
        _DEFAULT["gpu_resource"], "Extended resource the GPUs are counted in."
    )
    ps_cpu: str = option(_DEFAULT["ps_cpu"], "CPU of a parameter-server pod.")
    ps_memory: str = option(_DEFAULT["ps_memory"], "Memory of a parameter-server pod.")
    volume_claim: str = option(
        _DEFAULT["volume_claim"],
        "ReadWriteMany PersistentVolumeClaim for the model and backups.",
    )
    bucket: str = option(
        _DEFAULT["bucket"],
        "Instead of a volume: gs:// or s3:// prefix for the model and backups.",
    )
    mount_path: str = option(_DEFAULT["mount_path"], "Where the volume is mounted.")
    backup_every_steps: int = option(
        _DEFAULT["backup_every_steps"], "trainer.task --backup_every_steps."
    )
    restart_policy: str = option(
        _DEFAULT["restart_policy"],
        "ExitCode (retries tfdist's 137, 143, 200, 201; never 2 or 3), OnFailure, Never or Always.",
    )
    backoff_limit: int = option(
        _DEFAULT["backoff_limit"],
        "TFJob backoffLimit; does not bound ExitCode restarts (the trainer's "
        "--max_restarts_without_progress does).",
    )
    clean_pod_policy: str = option(
        _DEFAULT["clean_pod_policy"],
        "None keeps the evaluator alive; Running or All delete it when the chief ends.",
    )
    termination_grace_seconds: int = option(
        _DEFAULT["termination_grace_seconds"],
        "Pod grace period after SIGTERM; the trainer saves within 5 s less.",
    )
    service_account: str = option(
        _DEFAULT["service_account"], "Kubernetes service account of the pods."
    )
    node_selector: tuple[str, ...] = option(
        _DEFAULT["node_selector"], "Comma-separated key=value pairs for every pod."
    )
    trainer_args: tuple[str, ...] = option(
        _DEFAULT["trainer_args"],
        "More trainer.task flags for every replica (config files; on the command line "
        "they go after --).",
        is_flag=False,
    )
    description: str = option("", "Free text describing a config file.", is_flag=False)


@dataclasses.dataclass(frozen=True)
class CommandOptions:
    """What the command writes or checks: flags only, no `--job_config` keys."""

    job_config: str = option(
        "",
        "JSON job shape (see configs/kubernetes/); flags override it.",
        is_config_key=False,
    )
    format: str = option(
        "json", "Output format: json or yaml (yaml needs PyYAML).", is_config_key=False
    )
    api: str = option(
        "tfjob",
        "What to write: tfjob (Kubeflow training-operator 1.9), jobset (a JobSet, "
        "jobset.x-k8s.io/v1alpha2: restarts counted) or trainjob (Kubeflow Trainer v2: a "
        "TrainingRuntime and a TrainJob running the same JobSet).",
        is_config_key=False,
    )
    check: str = option(
        "",
        "Check this hand-written TFJob manifest (JSON or YAML) instead of writing one.",
        is_config_key=False,
    )


SHAPE_OPTIONS = options_lib.table(ShapeOptions)
COMMAND_OPTIONS = options_lib.table(CommandOptions)
CONFIG_KEYS = options_lib.config_keys(SHAPE_OPTIONS)


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines every flag of `trainer.kubernetes` in `flag_values`, listed under this module.

    The command adopts them as its own (`flags.adopt_module_key_flags`), so its
    `--help` lists them.
    """
    for rows in (COMMAND_OPTIONS, SHAPE_OPTIONS):
        options_lib.define_flags(rows, flag_values, module_name=__name__)
