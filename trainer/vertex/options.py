"""The option table: one row per job option drives its flag, its `--job_config`
key and its default.

    python -m trainer.submit --workers=2 ...              (flag)
    {"workers": 2, ...}                                   (--job_config key)

Flags override the config file; `trainer_args` and `env` accumulate (file
first, then flags) so the last occurrence of a trainer flag wins, as in absl.
`trainer_args` and `description` exist only in config files (trainer flags go
after `--` on the command line).
"""

import dataclasses
from typing import Any, Mapping

from tfdist.distribute.choice import STRATEGIES
from tfdist.errors import UsageError
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
class Option:
    """One job option.

    Attributes:
        name: Flag name and config key.
        kind: `string`, `integer`, `boolean`, `multi_string` (repeatable flag;
            a list or object in a config file) or `list`.
        default: Value when neither the file nor a flag sets it.
        help: The flag's help text.
        templated: `{project}` and `{region}` in the value are filled in.
        accumulates: File values and flag values add up instead of replacing.
        is_flag: Also a command-line flag (else config files only).
    """

    name: str
    kind: str
    default: Any
    help: str
    templated: bool = False
    accumulates: bool = False
    is_flag: bool = True


OPTIONS = (
    Option("project", "string", "", "Google Cloud project ID."),
    Option("region", "string", "", "Vertex AI region, e.g. us-central1."),
    Option(
        "staging_bucket",
        "string",
        "",
        "gs:// bucket for staged packages and the default output directory.",
        templated=True,
    ),
    Option("display_name", "string", "", "Job name shown by Vertex AI (default tfdist-STRATEGY)."),
    Option(
        "strategy",
        "string",
        "auto",
        "trainer.task --strategy for every replica: " + ", ".join(STRATEGIES) + ".",
    ),
    Option(
        "machine_type",
        "string",
        DEFAULT_MACHINE_TYPE,
        "Machine type of the chief and workers (and by default PS and evaluator).",
    ),
    Option(
        "accelerator_type",
        "string",
        "",
        "e.g. NVIDIA_TESLA_A100, NVIDIA_H100_80GB, TPU_V5_LITEPOD; empty for none.",
    ),
    Option("accelerator_count", "integer", 0, "Accelerators per machine."),
    Option("tpu_topology", "string", "", "TPU topology (TPU v4/v5e), e.g. 2x2."),
    Option("workers", "integer", 0, "Replicas in worker pool 1 (besides the chief)."),
    Option("parameter_servers", "integer", 0, "Parameter servers in worker pool 2."),
    Option(
        "parameter_server_machine_type",
        "string",
        "",
        "CPU machine type of the parameter servers (default: --machine_type).",
    ),
    Option("reduction_servers", "integer", 0, "Reduction Server replicas in worker pool 2."),
    Option(
        "reduction_server_machine_type",
        "string",
        DEFAULT_REDUCTION_SERVER_MACHINE_TYPE,
        "Machine type of the Reduction Server replicas.",
    ),
    Option(
        "reduction_server_image",
        "string",
        DEFAULT_REDUCTION_SERVER_IMAGE,
        "Reduction Server image (europe-docker / asia-docker mirrors exist).",
        templated=True,
    ),
    Option("evaluators", "integer", 0, "Evaluators in worker pool 3 (0 or 1)."),
    Option(
        "evaluator_machine_type",
        "string",
        "",
        "CPU machine type of the evaluator (default: the chief's machine).",
    ),
    Option(
        "boot_disk_type",
        "string",
        DEFAULT_BOOT_DISK_TYPE,
        "Boot disk type of every replica: pd-ssd, pd-standard or hyperdisk-balanced "
        "(default: per machine family: pd-ssd, hyperdisk-balanced on A3 Ultra, none sent "
        "on A4, A4X and G4 so that Vertex AI decides).",
    ),
    Option(
        "boot_disk_size_gb",
        "integer",
        DEFAULT_BOOT_DISK_SIZE_GB,
        "Boot disk size of every replica, 100 to 64000 GB.",
    ),
    Option(
        "container_uri",
        "string",
        "",
        "Our trainer image, or a Vertex AI prebuilt "
        "training image (then the sdist is built, staged and run from it).",
        templated=True,
    ),
    Option(
        "image_architecture",
        "string",
        "",
        "CPU architecture of --container_uri: "
        "amd64 (default), arm64 or multi (a multi-arch image); ARM machines (A4X) need "
        "arm64 or multi.",
    ),
    Option(
        "allow_ended_image",
        "boolean",
        False,
        "Accept a Vertex AI prebuilt training "
        "image past its end of availability (Vertex AI may refuse it).",
    ),
    Option(
        "allow_fewer_reducers",
        "boolean",
        False,
        "Send a Reduction Server with fewer reducers than the bandwidth table asks for "
        "(Vertex AI runs it; the all-reduce is slower); the count it asks for is printed.",
    ),
    Option(
        "task_package",
        "string",
        "",
        "Directory of your own Python project (with "
        "pyproject.toml, setup.cfg or setup.py) holding the --task code: built and "
        "staged next to the trainer package (prebuilt images only).",
    ),
    Option("service_account", "string", "", "Service account the replicas run as.", templated=True),
    Option("scheduling", "string", "standard", "standard, spot or flex_start."),
    Option(
        "max_wait_duration",
        "string",
        "",
        "flex_start only: longest wait for resources, e.g. 2h (0: no limit).",
    ),
    Option(
        "restart_job_on_worker_restart",
        "boolean",
        False,
        "Restart every replica when one restarts.",
    ),
    Option(
        "disable_retries",
        "boolean",
        False,
        "Fail the job instead of retrying after internal errors.",
    ),
    Option("timeout", "string", "", "Longest run time, e.g. 3600s, 12h, 2d."),
    Option(
        "base_output_dir",
        "string",
        "",
        "gs:// directory for AIP_MODEL_DIR, "
        "AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR (default: under "
        "--staging_bucket).",
        templated=True,
    ),
    Option(
        "tensorboard",
        "string",
        "",
        "Vertex AI TensorBoard: projects/P/locations/R/tensorboards/ID.",
        templated=True,
    ),
    Option("enable_web_access", "boolean", False, "Interactive shell access to replicas."),
    Option(
        "enable_dashboard_access",
        "boolean",
        False,
        "Access to the replicas' own dashboards (e.g. TensorBoard on port 6006) from the console.",
    ),
    Option(
        "psc_network_attachment",
        "string",
        "",
        "Private Service Connect interface instead of VPC peering: "
        "projects/P/regions/REGION/networkAttachments/NAME, in the job's region.",
        templated=True,
    ),
    Option(
        "reserved_ip_ranges",
        "string",
        "",
        "With --network: names of the reserved IP ranges the job's machines take "
        "addresses from, comma-separated.",
    ),
    Option(
        "gpu_partition_size",
        "string",
        "",
        "GPU partition (multi-instance GPU) size for the chief's and workers' GPUs, e.g. 1g.10gb.",
    ),
    Option(
        "network",
        "string",
        "",
        "VPC network peered with Vertex AI: projects/PROJECT_NUMBER/global/networks/NAME.",
        templated=True,
    ),
    Option(
        "reservation_affinity",
        "string",
        "",
        "Compute Engine reservation for the "
        "chief's and workers' machines: none, any, or "
        "specific:projects/P/zones/Z/reservations/NAME.",
        templated=True,
    ),
    Option(
        "kms_key_name",
        "string",
        "",
        "Customer-managed encryption key: projects/P/locations/REGION/keyRings/R/cryptoKeys/K.",
        templated=True,
    ),
    Option("labels", "string", "", "Job labels: key=value,key=value."),
    Option(
        "persistent_resource_id",
        "string",
        "",
        "Run on this Vertex AI persistent "
        "resource (its ID, in the job's project and region) instead of new machines.",
    ),
    Option(
        "experiment",
        "string",
        "",
        "Vertex AI Experiment to associate the job with: "
        "its name or projects/P/locations/R/metadataStores/default/contexts/NAME.",
        templated=True,
    ),
    Option("experiment_run", "string", "", "With --experiment: the run's name within it."),
    Option(
        "nfs_mount",
        "multi_string",
        (),
        "SERVER:/PATH:MOUNT_POINT, mounted at "
        "/mnt/nfs/MOUNT_POINT on every replica of ours (needs --network; repeatable).",
        accumulates=True,
    ),
    Option(
        "lustre_mount",
        "multi_string",
        (),
        "INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT, a Managed Lustre instance mounted "
        "at /mnt/lustre/MOUNT_POINT on every replica of ours (needs --network or "
        "--psc_network_attachment; repeatable).",
        accumulates=True,
    ),
    Option(
        "env",
        "multi_string",
        (),
        "NAME=VALUE for our replicas (values never printed).",
        accumulates=True,
    ),
    Option(
        "trainer_args",
        "list",
        (),
        "trainer.task flags (config files; on the command line they go after --).",
        accumulates=True,
        is_flag=False,
    ),
    Option("description", "string", "", "Free text describing a config file.", is_flag=False),
)

BY_NAME = {option.name: option for option in OPTIONS}
CONFIG_KEYS = tuple(BY_NAME)
DEFAULTS = {option.name: option.default for option in OPTIONS}


def define_flags(flag_values, table: tuple[Option, ...] = OPTIONS) -> None:
    """Defines one absl flag per option of `table` (those that are flags) in `flag_values`."""
    from tfdist import cli  # pylint: disable=g-import-not-at-top

    cli.define_flags(
        (
            cli.FlagSpec(option.name, option.default, option.help, kind=option.kind)
            for option in table
            if option.is_flag
        ),
        flag_values,
    )


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
                options[name] = _concat(options[name], value)
            else:
                options[name] = value
    for option in OPTIONS:
        value = options[option.name]
        if option.templated and isinstance(value, str) and "{" in value:
            options[option.name] = expand_placeholders(
                option.name, value, project=str(options["project"]), region=str(options["region"])
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


def _concat(first, second):
    if isinstance(first, Mapping) or isinstance(second, Mapping):
        merged = dict(parse_env(first))
        merged.update(parse_env(second))
        return merged
    if not isinstance(first, (list, tuple)) or not isinstance(second, (list, tuple)):
        raise UsageError(
            f"trainer_args/env must be lists, got {quoted(first)} and {quoted(second)}"
        )
    return tuple(first) + tuple(second)
