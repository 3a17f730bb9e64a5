"""Every rule a job is checked against before anything is built, uploaded or sent.

Each rule is one `require(...)`: the message names the option, quotes at most
about 100 characters of its value, says what was expected and how to fix it.
The rules are Vertex AI's (documented limits and formats, the API's own value
ranges) and our trainer's (which pools each strategy needs).
"""

import re

from tfdist.distribute import cluster as cluster_lib
from tfdist.distribute.choice import STRATEGIES
from trainer import submission
from trainer.vertex import images, machines, network, option_values
from trainer.vertex.checks import quoted, require
from trainer.vertex.options import SCHEDULING_STRATEGIES
from trainer.vertex.regions import check_region

MAX_REPLICAS = 1000  # per worker pool; beyond it is a typo, not a job
MIN_BOOT_DISK_GB, MAX_BOOT_DISK_GB = 100, 64_000
BOOT_DISK_TYPES = ("", "pd-ssd", "pd-standard", "hyperdisk-balanced")
MAX_FLEX_START_TIMEOUT_SECONDS = 7 * 24 * 3600
# What this command calls the roles' counts (pool 0 is always the one chief).
ROLE_NAMES = cluster_lib.RoleNames(
    chief="", worker="--workers", ps="--parameter_servers", evaluator="--evaluators"
)
# A project ID, optionally domain-scoped (example.com:my-project).
_PROJECT = re.compile(r"^(?:[a-z0-9.-]{1,63}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# A container image reference: [host[:port]/]path[:tag][@sha256:digest].
_IMAGE = re.compile(
    r"^(?:[a-z0-9]([a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,99}@[a-z0-9.-]+\.[a-z]{2,}$")
_GCS_URI = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\s]*)?$")
_TENSORBOARD = re.compile(r"^projects/[^/\s]+/locations/([^/\s]+)/tensorboards/[0-9]+$")
_NETWORK = re.compile(r"^projects/[0-9]{1,20}/global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_NETWORK_ATTACHMENT = re.compile(
    r"^projects/[a-z0-9][-a-z0-9.:]{0,62}/regions/([a-z0-9-]{1,63})/"
    r"networkAttachments/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$"
)
_KMS_KEY = re.compile(
    r"^projects/[^/\s]+/locations/([^/\s]+)/keyRings/[A-Za-z0-9_-]{1,63}/"
    r"cryptoKeys/[A-Za-z0-9_-]{1,63}$"
)
_MAX_IMAGE_URI = 1024
_RESOURCE_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_EXPERIMENT_PATH = re.compile(
    r"^projects/([^/\s]+)/locations/([^/\s]+)/metadataStores/"
    r"default/contexts/([a-z0-9][a-z0-9-]{0,127})$"
)
_EXPERIMENT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
# The variables tfdist sets itself on TPU v5e replicas (TPU_ENV).
TPU_ENV_NAMES = ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


def experiment_resource(experiment: str, project: str, region: str) -> str:
    """The experiment's resource name from a name or a full path ("" for none)."""
    if not experiment:
        return ""
    match = _EXPERIMENT_PATH.match(experiment)
    if match:
        require(
            match.group(2) == region,
            f"--experiment is in {quoted(match.group(2))}, expected the job's region {region}",
        )
        return experiment
    require(
        bool(_EXPERIMENT_NAME.match(experiment)),
        f"--experiment is {quoted(experiment)}, expected a name of lowercase letters, "
        f"digits and hyphens, or projects/P/locations/R/metadataStores/default/contexts/NAME",
    )
    return f"projects/{project}/locations/{region}/metadataStores/default/contexts/{experiment}"


def check_gcs_uri(name: str, value: str) -> str:
    """`value` without a trailing slash, if it is a gs:// URI with a bucket."""
    require(
        len(str(value)) <= 1024 and bool(_GCS_URI.match(str(value))),
        f"--{name} is {quoted(value)}, expected a gs:// URI such as gs://my-bucket",
    )
    return str(value).rstrip("/")


def check_image_uri(name: str, value: str) -> None:
    require(
        bool(value),
        f"--{name} is empty, expected a container image URI such as "
        f"us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0",
    )
    require(
        len(value) <= _MAX_IMAGE_URI and bool(_IMAGE.match(value)),
        f"--{name} is {quoted(value)}, expected a container image URI such as "
        f"us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0",
    )


def check_project(project: str) -> None:
    require(
        bool(project),
        "--project is not set, expected a Google Cloud project ID such as --project=my-project",
    )
    require(
        bool(_PROJECT.match(project)),
        f"--project is {quoted(project)}, expected a project ID: 6 to 30 lowercase "
        f"letters, digits and hyphens, starting with a letter (the ID, not the name)",
    )


def check_scheduling(scheduling) -> None:
    """Rules of `spec.Scheduling` on its own."""
    require(
        scheduling.strategy in SCHEDULING_STRATEGIES,
        f"--scheduling is {quoted(scheduling.strategy)}, expected one of: "
        f"{', '.join(SCHEDULING_STRATEGIES)}",
    )
    require(
        scheduling.max_wait_seconds is None or scheduling.strategy == "flex_start",
        f"--max_wait_duration applies only with --scheduling=flex_start (Vertex AI "
        f"ignores it otherwise), got --scheduling={scheduling.strategy}; drop it or use "
        f"flex_start",
    )
    require(
        not (scheduling.disable_retries and scheduling.restart_job_on_worker_restart),
        "--disable_retries and --restart_job_on_worker_restart contradict each other "
        "(disabling retries turns whole-job restarts off); keep one",
    )


def check_job(spec) -> None:
    """All rules of a `spec.JobSpec`."""
    _check_where_and_who(spec)
    _check_counts_and_disks(spec)
    _check_strategy(spec)
    _check_code(spec)
    _check_outputs(spec)
    _check_scheduling_with_shape(spec)
    _check_networking_and_encryption(spec)
    _check_resources_and_tracking(spec)
    _check_reducer_capacity(spec)


def _check_where_and_who(spec) -> None:
    check_project(spec.project)
    check_region(spec.region)
    require(
        0 < len(spec.display_name) <= 128,
        f"--display_name is {quoted(spec.display_name)}, expected 1 to 128 characters",
    )
    require(
        not spec.service_account or bool(_SERVICE_ACCOUNT.match(spec.service_account)),
        f"--service_account is {quoted(spec.service_account)}, expected an email such as "
        f"trainer@my-project.iam.gserviceaccount.com",
    )


def _check_counts_and_disks(spec) -> None:
    for name in ("workers", "parameter_servers", "reduction_servers", "evaluators"):
        option_values.integer(name, getattr(spec, name), high=MAX_REPLICAS)
    require(
        spec.boot_disk_type in BOOT_DISK_TYPES,
        f"--boot_disk_type is {quoted(spec.boot_disk_type)}, expected one of: "
        f"{', '.join(BOOT_DISK_TYPES)}",
    )
    option_values.integer(
        "boot_disk_size_gb", spec.boot_disk_size_gb, low=MIN_BOOT_DISK_GB, high=MAX_BOOT_DISK_GB
    )
    # The machines of pools 2 and 3 check themselves when they are built.
    used = {
        "parameter_server_machine": spec.parameter_servers,
        "evaluator_machine": spec.evaluators,
        "reduction_server_machine": spec.reduction_servers,
    }
    for machine, replicas in used.items():
        if replicas:
            getattr(spec, machine)
    for machine in _used_machines(spec):
        machines.check_disk_type(machine.machine_type, spec.boot_disk_type)


def _used_machines(spec, *, ours_only: bool = False) -> list:
    """The machine of every non-empty pool (of those running our code, with `ours_only`)."""
    used = [spec.machine]
    if spec.parameter_servers:
        used.append(spec.parameter_server_machine)
    if spec.evaluators:
        used.append(spec.evaluator_machine)
    if spec.reduction_servers and not ours_only:
        used.append(spec.reduction_server_machine)
    return used


def _check_strategy(spec) -> None:
    strategy, machine = spec.strategy, spec.machine
    require(
        strategy in STRATEGIES,
        f"--strategy is {quoted(strategy)}, expected one of: {', '.join(STRATEGIES)}",
    )
    require(
        not (spec.reduction_servers and spec.parameter_servers),
        f"--reduction_servers={spec.reduction_servers} and --parameter_servers="
        f"{spec.parameter_servers} both use worker pool 2, expected one of them; "
        f"Reduction Server serves all-reduce (--strategy=multiworker), parameter servers "
        f"serve --strategy=parameter_server",
    )
    require(
        not spec.reduction_servers or (spec.workers and machine.is_gpu),
        f"--reduction_servers={spec.reduction_servers} needs GPU workers, got "
        f"--workers={spec.workers} on {machine.machine_type} with --accelerator_type="
        f"{machine.accelerator_type or 'none'}; Reduction Server speeds up NCCL "
        f"all-reduce between GPU machines: add --workers and GPUs, or drop "
        f"--reduction_servers",
    )
    # Not `auto` either: a cluster variable listing pool 2 could make the
    # trainer pick parameter_server for the reducers.
    require(
        not spec.reduction_servers or strategy == "multiworker",
        f"--reduction_servers={spec.reduction_servers} needs --strategy=multiworker "
        f"(NCCL all-reduce), got --strategy={strategy}",
    )
    if spec.reduction_servers:
        _check_reduction_server_all_reduce(spec)
    if strategy == "tpu" or machine.is_tpu:
        _check_tpu(spec)
    check_roles(spec)
    require(
        not submission.has_flag(spec.trainer_args, "strategy"),
        "--strategy appears after --, expected it before -- as a trainer.submit flag, "
        "which passes it to every replica",
    )


def check_roles(spec) -> None:
    """The trainer's rule of roles per strategy (`check_cluster_for_strategy`) on the pools.

    Pool 0 is the chief, pool 1 the workers, pool 2 the parameter servers (a
    Reduction Server pool runs no task of ours), pool 3 the evaluators.
    """
    cluster = cluster_lib.cluster_of_shape(
        chief=True,
        workers=spec.workers,
        ps=spec.parameter_servers,
        evaluators=spec.evaluators,
        source="the job's worker pools",
    )
    cluster_lib.check_cluster_for_strategy(cluster, spec.strategy, ROLE_NAMES)


def _check_reduction_server_all_reduce(spec) -> None:
    """Reducers serve NCCL all-reduce only."""
    all_reduce = submission.flag_value(spec.trainer_args, "all_reduce")
    require(
        all_reduce in (None, "nccl"),
        f"--all_reduce={all_reduce} after -- with --reduction_servers="
        f"{spec.reduction_servers}, expected nccl: TensorFlow then runs its own ring over "
        f"gRPC and the {spec.reduction_servers} reducers are billed and idle; drop "
        f"--all_reduce (the submitter sets nccl) or drop --reduction_servers",
    )


def _check_reducer_capacity(spec) -> None:
    """The reducers' combined egress must match the chief's and workers'."""
    if not spec.reduction_servers:
        return
    replicas = 1 + spec.workers
    needed = network.reducers_needed(
        worker_machine=spec.machine.machine_type,
        training_replicas=replicas,
        reducer_machine=spec.reduction_server_machine_type,
    )
    if needed is None:
        return
    worker_gbps = network.egress_gbps(spec.machine.machine_type)
    reducer_gbps = network.egress_gbps(spec.reduction_server_machine_type)
    require(
        spec.reduction_servers >= needed or spec.allow_fewer_reducers,
        f"--reduction_servers={spec.reduction_servers} x {reducer_gbps:g} Gbps "
        f"({spec.reduction_server_machine_type}) cannot carry {replicas} x "
        f"{worker_gbps:g} Gbps ({spec.machine.machine_type}), expected at least {needed} "
        f"reducers (bandwidths as of {network.TABLE_DATE}, docs/vertex.md); set "
        f"--reduction_servers={needed}, or --allow_fewer_reducers to send it as it is "
        f"(Vertex AI runs it; the all-reduce is slower)",
    )


def _check_tpu(spec) -> None:
    machine = spec.machine
    require(
        spec.strategy == "tpu",
        f"--accelerator_type={machine.accelerator_type} is a TPU, expected "
        f"--strategy=tpu, got --strategy={spec.strategy}",
    )
    require(
        machine.is_tpu,
        f"--strategy=tpu needs a TPU --accelerator_type (one of "
        f"{', '.join(machines.TPU_ACCELERATORS)}), got "
        f"{machine.accelerator_type or 'none'}",
    )
    extra = {
        name: getattr(spec, name)
        for name in ("workers", "parameter_servers", "reduction_servers", "evaluators")
        if getattr(spec, name)
    }
    shown = " ".join(f"--{name}={count}" for name, count in extra.items())
    require(not extra, f"--strategy=tpu runs as a single TPU VM replica, got {shown}; drop them")


def _check_code(spec) -> None:
    check_image_uri("container_uri", spec.container_uri)
    images.check_training_image(
        spec.container_uri, today=spec.as_of, allow_ended=spec.allow_ended_image
    )
    architecture = images.image_architecture(spec.container_uri, spec.image_architecture)
    for machine in _used_machines(spec, ours_only=True):
        images.check_architecture(
            flag=machine.flag, machine_type=machine.machine_type, architecture=architecture
        )
    if spec.reduction_servers:
        check_image_uri("reduction_server_image", spec.reduction_server_image)
    require(
        not spec.task_package or spec.uses_python_package,
        f"--task_package={quoted(spec.task_package)} needs a Vertex AI prebuilt training "
        f"image, which installs staged packages, got our image {quoted(spec.container_uri)}; "
        f"with our image, build an image FROM it that pip-installs your package (see "
        f"docs/vertex.md, 'Your own task code') and drop --task_package",
    )


def _check_outputs(spec) -> None:
    check_gcs_uri("base_output_dir", spec.base_output_dir)
    if spec.tensorboard:
        require(
            bool(spec.service_account),
            "--tensorboard needs --service_account (Vertex AI uploads TensorBoard logs "
            "as that account); set --service_account",
        )
        match = _TENSORBOARD.match(spec.tensorboard)
        require(
            bool(match),
            f"--tensorboard is {quoted(spec.tensorboard)}, expected "
            f"projects/PROJECT/locations/REGION/tensorboards/ID",
        )


def _check_scheduling_with_shape(spec) -> None:
    scheduling = spec.scheduling
    if scheduling.strategy == "flex_start":
        require(
            spec.machine.is_gpu,
            f"--scheduling=flex_start needs GPU machines, got --accelerator_type="
            f"{spec.machine.accelerator_type or 'none'}; use --scheduling=standard or spot",
        )
        require(
            spec.machine.accelerator_type in machines.FLEX_START_ACCELERATORS,
            f"--scheduling=flex_start with --accelerator_type="
            f"{spec.machine.accelerator_type}, which Dynamic Workload Scheduler does not "
            f"provision, expected one of: {', '.join(machines.FLEX_START_ACCELERATORS)}; "
            f"use --scheduling=standard or spot, or one of those GPUs",
        )
        require(
            not (
                spec.reduction_servers
                or spec.parameter_server_machine_type
                or spec.evaluator_machine_type
            ),
            "--scheduling=flex_start needs the same machine in every worker pool, got a "
            "Reduction Server or a separate parameter-server or evaluator machine type; "
            "drop them or use --scheduling=standard",
        )
        require(
            scheduling.timeout_seconds <= MAX_FLEX_START_TIMEOUT_SECONDS,
            f"--timeout is {scheduling.timeout_seconds}s, expected at most 7 days "
            f"(604800s) with --scheduling=flex_start",
        )
        require(
            not spec.reservation_affinity,
            "--reservation_affinity does not apply with --scheduling=flex_start (Dynamic "
            "Workload Scheduler provisions on demand); drop one of them",
        )


def _check_resources_and_tracking(spec) -> None:
    require(
        not spec.persistent_resource_id or bool(_RESOURCE_ID.match(spec.persistent_resource_id)),
        f"--persistent_resource_id is {quoted(spec.persistent_resource_id)}, expected the "
        f"resource's ID (lowercase letters, digits, hyphens), not its full name",
    )
    require(
        not (spec.persistent_resource_id and spec.scheduling.strategy == "flex_start"),
        "--persistent_resource_id runs on machines already provisioned, so "
        "--scheduling=flex_start does not apply; drop one of them",
    )
    experiment_resource(spec.experiment, spec.project, spec.region)
    require(
        not spec.experiment_run or bool(spec.experiment),
        f"--experiment_run={quoted(spec.experiment_run)} needs --experiment; set it",
    )
    require(
        not spec.experiment_run or bool(_EXPERIMENT_NAME.match(spec.experiment_run)),
        f"--experiment_run is {quoted(spec.experiment_run)}, expected lowercase letters, "
        f"digits and hyphens",
    )
    require(
        not spec.lustre_mounts or bool(spec.network or spec.psc_network_attachment),
        "--lustre_mount needs --network or --psc_network_attachment (Vertex AI reaches "
        "Managed Lustre over your VPC), expected "
        "--network=projects/PROJECT_NUMBER/global/networks/NAME",
    )
    require(
        not spec.nfs_mounts or bool(spec.network),
        "--nfs_mount needs --network (Vertex AI reaches NFS servers over a peered VPC), "
        "expected --network=projects/PROJECT_NUMBER/global/networks/NAME",
    )
    names = {name for name, _ in spec.env}
    clash = (
        sorted(names & set(TPU_ENV_NAMES))
        if spec.machine.accelerator_type == "TPU_V5_LITEPOD"
        else []
    )
    require(
        not clash,
        f"--env sets {', '.join(clash)}, which the submitter sets for TPU v5e (PJRT); drop it",
    )


def _check_networking_and_encryption(spec) -> None:
    require(
        not spec.network or bool(_NETWORK.match(spec.network)),
        f"--network is {quoted(spec.network)}, expected projects/PROJECT_NUMBER/global/"
        f"networks/NAME (the project number, digits, of the network's host project)",
    )
    option_values.parse_reservation_affinity(spec.reservation_affinity)
    require(
        not spec.reserved_ip_ranges or bool(spec.network),
        "--reserved_ip_ranges are ranges of a peered network, so they need --network; "
        "set --network=projects/PROJECT_NUMBER/global/networks/NAME",
    )
    if spec.psc_network_attachment:
        match = _NETWORK_ATTACHMENT.match(spec.psc_network_attachment)
        require(
            bool(match),
            f"--psc_network_attachment is {quoted(spec.psc_network_attachment)}, expected "
            f"projects/P/regions/REGION/networkAttachments/NAME",
        )
        require(
            match.group(1) == spec.region,
            f"--psc_network_attachment is in {quoted(match.group(1))}, expected an attachment "
            f"in the job's region {spec.region}",
        )
        require(
            not spec.network,
            "--psc_network_attachment and --network are both set, expected one: a job "
            "reaches your VPC through a Private Service Connect interface or through VPC "
            "peering, not both",
        )
    if spec.kms_key_name:
        match = _KMS_KEY.match(spec.kms_key_name)
        require(
            bool(match),
            f"--kms_key_name is {quoted(spec.kms_key_name)}, expected "
            f"projects/P/locations/REGION/keyRings/R/cryptoKeys/K",
        )
        require(
            match.group(1) == spec.region,
            f"--kms_key_name is in {quoted(match.group(1))}, expected a key in the job's "
            f"region {spec.region} (Vertex AI needs a key in the same region)",
        )
