"""The job model: what a Vertex AI CustomJob of our trainer is made of.

Frozen dataclasses that check themselves on construction (`trainer.vertex.
validation` holds the rules), so a `JobSpec` that exists is one Vertex AI and
our trainer can run. `JobSpec.from_options` builds one from merged options
(`trainer.vertex.options.merge_options`).

Worker pools, in Vertex AI's order:
    0: exactly one chief (the primary replica), running our trainer;
    1: `workers` replicas running our trainer;
    2: `parameter_servers` replicas running our trainer, or
       `reduction_servers` replicas running Vertex's Reduction Server image;
    3: `evaluators` replicas running our trainer.
"""

import dataclasses
import datetime
import re
from typing import Any, Mapping

from tfdist.distribute import cluster
from trainer import submission
from trainer.vertex import images, machines, option_values, validation
from trainer.vertex.checks import require
from trainer.vertex.options import (
    DEFAULT_BOOT_DISK_SIZE_GB,
    DEFAULT_BOOT_DISK_TYPE,
    DEFAULT_REDUCTION_SERVER_IMAGE,
    DEFAULT_REDUCTION_SERVER_MACHINE_TYPE,
    TEXT_OPTIONS,
)


def is_prebuilt_image(image_uri: str) -> bool:
    """Whether `image_uri` is one of Vertex AI's prebuilt training images.

    Those run a Python package (python_package_spec); any other image is ours
    and runs as a container (container_spec).
    """
    return images.is_prebuilt_training_uri(image_uri)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MachineSpec:
    """One replica's machine: type, accelerators and (TPU) topology.

    Raises `UsageError` on construction for a combination Vertex AI refuses.
    """

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    tpu_topology: str = ""
    gpu_partition_size: str = ""
    flag: str = dataclasses.field(default="--machine_type", compare=False)

    def __post_init__(self):
        machines.check_machine(
            flag=self.flag,
            machine_type=self.machine_type,
            accelerator_type=self.accelerator_type,
            accelerator_count=self.accelerator_count,
            tpu_topology=self.tpu_topology,
        )
        if self.gpu_partition_size:
            machines.check_gpu_partition(self.accelerator_type, self.gpu_partition_size)

    @property
    def is_gpu(self) -> bool:
        return machines.is_gpu(self.accelerator_type)

    @property
    def is_tpu(self) -> bool:
        return machines.is_tpu(self.accelerator_type)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scheduling:
    """How Vertex AI provisions and restarts the job.

    Attributes:
        strategy: `standard` (on-demand VMs), `spot` (Spot VMs, may be
            preempted) or `flex_start` (Dynamic Workload Scheduler: waits until
            every replica can start together).
        timeout_seconds: Longest run time; 0 leaves Vertex's default (7 days).
        max_wait_seconds: flex_start only: longest wait for resources; `None`
            leaves Vertex's default (1 day), 0 waits without limit.
        restart_job_on_worker_restart: Restart every replica when one restarts.
        disable_retries: Fail instead of retrying after internal errors.
    """

    strategy: str = "standard"
    timeout_seconds: int = 0
    max_wait_seconds: int | None = None
    restart_job_on_worker_restart: bool = False
    disable_retries: bool = False

    def __post_init__(self):
        validation.check_scheduling(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A whole CustomJob: where, cluster shape, code, scheduling and outputs.

    Raises `UsageError` on construction for any shape Vertex AI or our trainer
    cannot run.
    """

    project: str
    region: str
    display_name: str
    strategy: str
    machine: MachineSpec
    container_uri: str
    base_output_dir: str
    workers: int = 0
    parameter_servers: int = 0
    parameter_server_machine_type: str = ""
    reduction_servers: int = 0
    reduction_server_machine_type: str = DEFAULT_REDUCTION_SERVER_MACHINE_TYPE
    reduction_server_image: str = DEFAULT_REDUCTION_SERVER_IMAGE
    evaluators: int = 0
    evaluator_machine_type: str = ""
    boot_disk_type: str = DEFAULT_BOOT_DISK_TYPE
    boot_disk_size_gb: int = DEFAULT_BOOT_DISK_SIZE_GB
    service_account: str = ""
    scheduling: Scheduling = dataclasses.field(default_factory=Scheduling)
    tensorboard: str = ""
    enable_web_access: bool = False
    network: str = ""
    reservation_affinity: str = ""
    kms_key_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    trainer_args: tuple[str, ...] = ()
    task_package: str = ""
    image_architecture: str = ""
    allow_ended_image: bool = False
    persistent_resource_id: str = ""
    experiment: str = ""
    experiment_run: str = ""
    nfs_mounts: tuple[tuple[str, str, str], ...] = ()
    lustre_mounts: tuple[tuple[str, str, str, str], ...] = ()
    enable_dashboard_access: bool = False
    psc_network_attachment: str = ""
    reserved_ip_ranges: tuple[str, ...] = ()
    allow_fewer_reducers: bool = False
    # The day the image table is read for (today, UTC, unless a test fixes it).
    as_of: datetime.date = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).date(), compare=False
    )

    def __post_init__(self):
        validation.check_job(self)

    @property
    def uses_python_package(self) -> bool:
        """Whether the image is a Vertex prebuilt one that runs our sdist."""
        return is_prebuilt_image(self.container_uri)

    @property
    def parameter_server_machine(self) -> MachineSpec:
        if not self.parameter_server_machine_type:
            return self.machine
        return MachineSpec(
            machine_type=self.parameter_server_machine_type, flag="--parameter_server_machine_type"
        )

    @property
    def evaluator_machine(self) -> MachineSpec:
        if not self.evaluator_machine_type:
            return self.machine
        return MachineSpec(
            machine_type=self.evaluator_machine_type, flag="--evaluator_machine_type"
        )

    @property
    def reduction_server_machine(self) -> MachineSpec:
        return MachineSpec(
            machine_type=self.reduction_server_machine_type, flag="--reduction_server_machine_type"
        )

    @property
    def task_args(self) -> tuple[str, ...]:
        """The arguments every replica of our trainer gets."""
        extra = ()
        if self.strategy == "tpu" and not submission.has_flag(self.trainer_args, "tpu"):
            extra = ("--tpu=local",)  # a Vertex TPU job runs on a TPU VM
        if (
            self.reduction_servers
            and submission.flag_value(self.trainer_args, "all_reduce") is None
        ):
            extra += ("--all_reduce=nccl",)  # reducers serve NCCL only (validation refuses ring)
        extra += submission.crash_loop_guard_args(self.trainer_args)
        return (f"--strategy={self.strategy}",) + extra + tuple(self.trainer_args)

    @property
    def tpu_env(self) -> tuple[tuple[str, str], ...]:
        """What TensorFlow needs on a TPU VM without a prebuilt image (TPU v5e): PJRT's C API."""
        if self.machine.accelerator_type != "TPU_V5_LITEPOD":
            return ()
        return (
            ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true"),
            ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "/lib/libtpu.so"),
        )

    @property
    def experiment_name(self) -> str:
        """`--experiment` as the resource name the API takes, "" for none."""
        return validation.experiment_resource(self.experiment, self.project, self.region)

    @property
    def pool2_role(self) -> str:
        """What worker pool 2 runs, told to every replica (`tfdist.distribute.cluster.POOL2_ROLE`); "" for none."""
        if self.reduction_servers:
            return cluster.POOL2_REDUCTION_SERVER
        return cluster.POOL2_PARAMETER_SERVERS if self.parameter_servers else ""

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, timestamp: str) -> "JobSpec":
        """Builds the checked `JobSpec` from merged options.

        Args:
            options: The result of `trainer.vertex.options.merge_options`.
            timestamp: Suffix for the default output directory, e.g. 20261130-101500.

        Raises:
            UsageError: Any value is malformed or the shape is impossible.
        """
        text = {name: option_values.string(name, options[name]) for name in TEXT_OPTIONS}
        strategy = text["strategy"].lower()
        display_name = text["display_name"] or f"tfdist-{strategy}"
        base_output_dir = text["base_output_dir"]
        if not base_output_dir:
            bucket = text["staging_bucket"]
            require(
                bool(bucket),
                "--staging_bucket is not set, expected a gs:// bucket for "
                "the job's outputs and staged package, e.g. gs://my-bucket; "
                "or set --base_output_dir",
            )
            base_output_dir = (
                f"{validation.check_gcs_uri('staging_bucket', bucket)}/"
                f"tfdist-jobs/{_slug(display_name)}-{timestamp}"
            )
        counts = {
            name: option_values.integer(name, options[name], high=validation.MAX_REPLICAS)
            for name in ("workers", "parameter_servers", "reduction_servers", "evaluators")
        }
        machine = MachineSpec(
            machine_type=text["machine_type"],
            accelerator_type=text["accelerator_type"],
            accelerator_count=option_values.integer(
                "accelerator_count", options["accelerator_count"], high=64
            ),
            tpu_topology=text["tpu_topology"],
            gpu_partition_size=text["gpu_partition_size"],
        )
        scheduling = Scheduling(
            strategy=text["scheduling"].lower(),
            timeout_seconds=option_values.parse_duration("timeout", options["timeout"]) or 0,
            max_wait_seconds=option_values.parse_duration(
                "max_wait_duration", options["max_wait_duration"]
            ),
            restart_job_on_worker_restart=option_values.boolean(
                "restart_job_on_worker_restart", options["restart_job_on_worker_restart"]
            ),
            disable_retries=option_values.boolean("disable_retries", options["disable_retries"]),
        )
        return cls(
            project=text["project"],
            region=text["region"],
            display_name=display_name,
            strategy=strategy,
            machine=machine,
            container_uri=text["container_uri"],
            base_output_dir=base_output_dir.rstrip("/"),
            **counts,
            parameter_server_machine_type=text["parameter_server_machine_type"],
            reduction_server_machine_type=text["reduction_server_machine_type"],
            reduction_server_image=text["reduction_server_image"],
            evaluator_machine_type=text["evaluator_machine_type"],
            boot_disk_type=text["boot_disk_type"],
            boot_disk_size_gb=option_values.integer(
                "boot_disk_size_gb", options["boot_disk_size_gb"], low=0, high=2**31 - 1
            ),
            service_account=text["service_account"],
            scheduling=scheduling,
            tensorboard=text["tensorboard"],
            enable_web_access=option_values.boolean(
                "enable_web_access", options["enable_web_access"]
            ),
            network=text["network"],
            reservation_affinity=text["reservation_affinity"],
            kms_key_name=text["kms_key_name"],
            labels=option_values.parse_labels(options["labels"]),
            env=option_values.parse_env(options["env"]),
            trainer_args=option_values.trainer_args(options["trainer_args"]),
            task_package=text["task_package"],
            image_architecture=text["image_architecture"].lower(),
            persistent_resource_id=text["persistent_resource_id"],
            experiment=text["experiment"],
            experiment_run=text["experiment_run"],
            nfs_mounts=option_values.parse_nfs_mounts(options["nfs_mount"]),
            lustre_mounts=option_values.parse_lustre_mounts(options["lustre_mount"]),
            enable_dashboard_access=option_values.boolean(
                "enable_dashboard_access", options["enable_dashboard_access"]
            ),
            psc_network_attachment=text["psc_network_attachment"],
            reserved_ip_ranges=option_values.parse_reserved_ip_ranges(
                options["reserved_ip_ranges"]
            ),
            allow_fewer_reducers=option_values.boolean(
                "allow_fewer_reducers", options["allow_fewer_reducers"]
            ),
            allow_ended_image=option_values.boolean(
                "allow_ended_image", options["allow_ended_image"]
            ),
        )


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-")[:100] or "job"
