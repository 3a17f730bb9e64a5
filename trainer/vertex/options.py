"""The job's option table (`JobOptions`): one row per job option drives its flag,
its `--job_config` key and its default.

    python -m trainer.submit --workers=2 ...              (flag)
    {"workers": 2, ...}                                   (--job_config key)

Flags override the config file; `trainer_args` and `env` accumulate (file
first, then flags) so the last occurrence of a trainer flag wins, as in absl.
`trainer_args` and `description` exist only in config files (trainer flags go
after `--` on the command line).

The rows are `trainer.options.Option`s, the trainer's own row type; the flags of
`python -m trainer.submit` are this table, `trainer.vertex.tuning.TuningOptions`
and the command's own (`trainer.vertex.command`).
"""

import dataclasses
from typing import Any, Mapping

from tfdist.distribute.choice import STRATEGIES
from tfdist.errors import UsageError
from trainer import options as options_lib
from trainer.options import option
from trainer.vertex import network
from trainer.vertex.checks import quoted
from trainer.vertex.option_values import parse_env

DEFAULT_MACHINE_TYPE = "n2-standard-4"
# The documented Reduction Server image (also published under europe-docker and
# asia-docker) and the machine type Vertex AI recommends for reducers: dated data
# in trainer/vertex/tables/network.json.
DEFAULT_REDUCTION_SERVER_IMAGE = network.REDUCTION_SERVER_IMAGE
DEFAULT_REDUCTION_SERVER_MACHINE_TYPE = network.REDUCTION_SERVER_MACHINE_TYPE
DEFAULT_BOOT_DISK_TYPE = ""  # per machine family: trainer.vertex.machines.default_disk_type
DEFAULT_BOOT_DISK_SIZE_GB = 100
SCHEDULING_STRATEGIES = ("standard", "spot", "flex_start")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """The options of a Vertex AI job: each field is a flag and a `--job_config` key.

    A field's type is what a config file may hold (a flag of a union type is a
    string flag); `JobSpec.from_options` reads the `str` ones as plain strings
    (`TEXT_OPTIONS`) and parses the others (`trainer.vertex.option_values`).
    """

    project: str = option("", "Google Cloud project ID.")
    region: str = option("", "Vertex AI region, e.g. us-central1.")
    staging_bucket: str = option(
        "", "gs:// bucket for staged packages and the default output directory.", templated=True
    )
    display_name: str = option("", "Job name shown by Vertex AI (default tfdist-STRATEGY).")
    strategy: str = option(
        "auto", "trainer.task --strategy for every replica: " + ", ".join(STRATEGIES) + "."
    )
    machine_type: str = option(
        DEFAULT_MACHINE_TYPE,
        "Machine type of the chief and workers (and by default PS and evaluator).",
    )
    accelerator_type: str = option(
        "", "e.g. NVIDIA_TESLA_A100, NVIDIA_H100_80GB, TPU_V5_LITEPOD; empty for none."
    )
    accelerator_count: int = option(0, "Accelerators per machine.")
    tpu_topology: str = option("", "TPU topology (TPU v4/v5e), e.g. 2x2.")
    workers: int = option(0, "Replicas in worker pool 1 (besides the chief).")
    parameter_servers: int = option(0, "Parameter servers in worker pool 2.")
    parameter_server_machine_type: str = option(
        "", "CPU machine type of the parameter servers (default: --machine_type)."
    )
    reduction_servers: int = option(0, "Reduction Server replicas in worker pool 2.")
    reduction_server_machine_type: str = option(
        DEFAULT_REDUCTION_SERVER_MACHINE_TYPE, "Machine type of the Reduction Server replicas."
    )
    reduction_server_image: str = option(
        DEFAULT_REDUCTION_SERVER_IMAGE,
        "Reduction Server image (europe-docker / asia-docker mirrors exist).",
        templated=True,
    )
    evaluators: int = option(0, "Evaluators in worker pool 3 (0 or 1).")
    evaluator_machine_type: str = option(
        "", "CPU machine type of the evaluator (default: the chief's machine)."
    )
    boot_disk_type: str = option(
        DEFAULT_BOOT_DISK_TYPE,
        "Boot disk type of every replica: pd-ssd, pd-standard or hyperdisk-balanced "
        "(default: per machine family: pd-ssd, hyperdisk-balanced on A3 Ultra, none sent "
        "on A4, A4X and G4 so that Vertex AI decides).",
    )
    boot_disk_size_gb: int = option(
        DEFAULT_BOOT_DISK_SIZE_GB, "Boot disk size of every replica, 100 to 64000 GB."
    )
    container_uri: str = option(
        "",
        "Our trainer image, or a Vertex AI prebuilt "
        "training image (then the sdist is built, staged and run from it).",
        templated=True,
    )
    image_architecture: str = option(
        "",
        "CPU architecture of --container_uri: "
        "amd64 (default), arm64 or multi (a multi-arch image); ARM machines (A4X) need "
        "arm64 or multi.",
    )
    allow_ended_image: bool = option(
        False,
        "Accept a Vertex AI prebuilt training "
        "image past its end of availability (Vertex AI may refuse it).",
    )
    allow_fewer_reducers: bool = option(
        False,
        "Send a Reduction Server with fewer reducers than the bandwidth table asks for "
        "(Vertex AI runs it; the all-reduce is slower); the count it asks for is printed.",
    )
    task_package: str = option(
        "",
        "Directory of your own Python project (with "
        "pyproject.toml, setup.cfg or setup.py) holding the --task code: built and "
        "staged next to the trainer package (prebuilt images only).",
    )
    service_account: str = option("", "Service account the replicas run as.", templated=True)
    scheduling: str = option("standard", "standard, spot or flex_start.")
    max_wait_duration: str | int = option(
        "", "flex_start only: longest wait for resources, e.g. 2h (0: no limit)."
    )
    restart_job_on_worker_restart: bool = option(False, "Restart every replica when one restarts.")
    disable_retries: bool = option(False, "Fail the job instead of retrying after internal errors.")
    timeout: str | int = option("", "Longest run time, e.g. 3600s, 12h, 2d.")
    base_output_dir: str = option(
        "",
        "gs:// directory for AIP_MODEL_DIR, "
        "AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR (default: under "
        "--staging_bucket).",
        templated=True,
    )
    tensorboard: str = option(
        "", "Vertex AI TensorBoard: projects/P/locations/R/tensorboards/ID.", templated=True
    )
    enable_web_access: bool = option(False, "Interactive shell access to replicas.")
    enable_dashboard_access: bool = option(
        False,
        "Access to the replicas' own dashboards (e.g. TensorBoard on port 6006) from the console.",
    )
    psc_network_attachment: str = option(
        "",
        "Private Service Connect interface instead of VPC peering: "
        "projects/P/regions/REGION/networkAttachments/NAME, in the job's region.",
        templated=True,
    )
    reserved_ip_ranges: str | list[str] = option(
        "",
        "With --network: names of the reserved IP ranges the job's machines take "
        "addresses from, comma-separated.",
    )
    gpu_partition_size: str = option(
        "",
        "GPU partition (multi-instance GPU) size for the chief's and workers' GPUs, e.g. 1g.10gb.",
    )
    network: str = option(
        "",
        "VPC network peered with Vertex AI: projects/PROJECT_NUMBER/global/networks/NAME.",
        templated=True,
    )
    reservation_affinity: str = option(
        "",
        "Compute Engine reservation for the "
        "chief's and workers' machines: none, any, or "
        "specific:projects/P/zones/Z/reservations/NAME.",
        templated=True,
    )
    kms_key_name: str = option(
        "",
        "Customer-managed encryption key: projects/P/locations/REGION/keyRings/R/cryptoKeys/K.",
        templated=True,
    )
    labels: str | dict[str, str] = option("", "Job labels: key=value,key=value.")
    persistent_resource_id: str = option(
        "",
        "Run on this Vertex AI persistent "
        "resource (its ID, in the job's project and region) instead of new machines.",
    )
    experiment: str = option(
        "",
        "Vertex AI Experiment to associate the job with: "
        "its name or projects/P/locations/R/metadataStores/default/contexts/NAME.",
        templated=True,
    )
    experiment_run: str = option("", "With --experiment: the run's name within it.")
    nfs_mount: tuple[str, ...] = option(
        (),
        "SERVER:/PATH:MOUNT_POINT, mounted at "
        "/mnt/nfs/MOUNT_POINT on every replica of ours (needs --network; repeatable).",
        repeatable=True,
        accumulates=True,
    )
    lustre_mount: tuple[str, ...] = option(
        (),
        "INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT, a Managed Lustre instance mounted "
        "at /mnt/lustre/MOUNT_POINT on every replica of ours (needs --network or "
        "--psc_network_attachment; repeatable).",
        repeatable=True,
        accumulates=True,
    )
    env: tuple[str, ...] = option(
        (), "NAME=VALUE for our replicas (values never printed).", repeatable=True, accumulates=True
    )
    trainer_args: tuple[str, ...] = option(
        (),
        "trainer.task flags (config files; on the command line they go after --).",
        accumulates=True,
        is_flag=False,
    )
    description: str = option("", "Free text describing a config file.", is_flag=False)


OPTIONS = options_lib.table(JobOptions)

BY_NAME = {option.name: option for option in OPTIONS}
CONFIG_KEYS = options_lib.config_keys(OPTIONS)
DEFAULTS = options_lib.defaults(OPTIONS)
# The options whose value is a plain string (a union type has its own parser).
TEXT_OPTIONS = tuple(row.name for row in OPTIONS if row.is_flag and row.value_type is str)


def merge_options(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> dict:
    """Defaults, then a job config file's values, then the flags the user passed.

    Raises:
        UsageError: An unknown option name, or a placeholder other than
            `{project}` and `{region}`.
    """
    options = dict(DEFAULTS)
    for source in (file_values, flag_values):
        for name, value in source.items():
            if name not in BY_NAME:
                raise UsageError(
                    f"unknown job option {quoted(name)}, expected one of: {', '.join(CONFIG_KEYS)}"
                )
            if BY_NAME[name].accumulates and options[name]:
                options[name] = _concat(name, options[name], value)
            else:
                options[name] = value
    for row in OPTIONS:
        value = options[row.name]
        if row.templated and isinstance(value, str) and "{" in value:
            options[row.name] = expand_placeholders(
                row.name, value, project=str(options["project"]), region=str(options["region"])
            )
    return options


def expand_placeholders(name: str, value: str, *, project: str, region: str) -> str:
    """Fills `{project}` and `{region}` in a config value (e.g. an image URI)."""
    try:
        return value.format(project=project, region=region)
    except (KeyError, IndexError, ValueError, AttributeError):
        raise UsageError(
            f"{name} {quoted(value)} has an unknown placeholder, expected "
            f"only {{project}} and {{region}}"
        ) from None


def _concat(name: str, first, second):
    """The config file's values of an accumulating option, then the flags'."""
    if name == "env" and (isinstance(first, Mapping) or isinstance(second, Mapping)):
        merged = dict(parse_env(first))
        merged.update(parse_env(second))
        return merged
    for value in (first, second):
        if not isinstance(value, (list, tuple)):
            raise UsageError(
                f"{name} is {quoted(value)}, expected a list (the config file's items, then "
                f"the flags')"
                + (
                    ', or an object of NAME to VALUE such as {"DEBUG": "1"}'
                    if name == "env"
                    else ""
                )
            )
    return tuple(first) + tuple(second)
