"""The shape of a Vertex AI CustomJob, validated, and the CustomJob it becomes.

A pure module: no TensorFlow and no `google.cloud` import, so that
`python -m trainer.submit --dry_run` answers fast and impossible shapes are
refused before anything is built, uploaded or sent.

Worker pools, in Vertex AI's order:
    0: exactly one chief (the primary replica), running our trainer;
    1: `workers` replicas running our trainer;
    2: `parameter_servers` replicas running our trainer, or
       `reduction_servers` replicas running Vertex's Reduction Server image;
    3: `evaluators` replicas running our trainer.
An unused pool between used ones is an empty `{}`; trailing unused pools are
left out, as the Vertex AI SDK does.
"""

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Sequence

from tfdist.errors import UsageError
from trainer.config import STRATEGIES

SCHEDULING_STRATEGIES = ("standard", "spot", "flex_start")
TRAINER_MODULE = "trainer.task"

# The documented Reduction Server image (also published under europe-docker
# and asia-docker) and the machine type Vertex recommends for reducers.
DEFAULT_REDUCTION_SERVER_IMAGE = (
    "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest")
DEFAULT_REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
DEFAULT_MACHINE_TYPE = "n2-standard-4"
DEFAULT_BOOT_DISK_TYPE = "pd-ssd"
DEFAULT_BOOT_DISK_SIZE_GB = 100

# `AcceleratorType` values of the Vertex AI v1 API (google-cloud-aiplatform 2.7.0).
GPU_ACCELERATORS = (
    "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_L4",
    "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB", "NVIDIA_B200",
    "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000")
TPU_ACCELERATORS = ("TPU_V2", "TPU_V3", "TPU_V4_POD", "TPU_V5_LITEPOD")
ACCELERATORS = GPU_ACCELERATORS + TPU_ACCELERATORS

# Vertex AI's prebuilt training images run a Python package (python_package_spec);
# any other image is ours and runs as a container (container_spec).
_PREBUILT_IMAGE = re.compile(
    r"^([a-z]+-docker\.pkg\.dev/vertex-ai/training/|gcr\.io/cloud-aiplatform/training/)")
_SINGLE_MACHINE_STRATEGIES = ("default", "one_device", "mirrored")
_MAX_FLEX_START_TIMEOUT_SECONDS = 7 * 24 * 3600
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")
REDACTED = "<redacted>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MachineSpec:
    """One replica's machine: type, accelerators and (TPU v5) topology."""

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    tpu_topology: str = ""

    def __post_init__(self):
        if not self.machine_type:
            raise UsageError("--machine_type is empty, expected a Vertex AI machine type "
                             "such as n2-standard-8 or a2-highgpu-8g")
        _not_negative("accelerator_count", self.accelerator_count)
        if self.accelerator_type and self.accelerator_type not in ACCELERATORS:
            raise UsageError(f"--accelerator_type is {self.accelerator_type!r}, expected one "
                             f"of: {', '.join(ACCELERATORS)}")
        if self.accelerator_type and not self.accelerator_count:
            raise UsageError(f"--accelerator_type={self.accelerator_type} has "
                             f"--accelerator_count=0, expected the number of accelerators "
                             f"per machine; set e.g. --accelerator_count=8")
        if self.accelerator_count and not self.accelerator_type:
            raise UsageError(f"--accelerator_count={self.accelerator_count} has no "
                             f"--accelerator_type, expected one of: {', '.join(ACCELERATORS)}")
        if self.tpu_topology and not self.is_tpu:
            raise UsageError(f"--tpu_topology={self.tpu_topology} needs a TPU "
                             f"--accelerator_type, got {self.accelerator_type or 'none'}; "
                             f"drop --tpu_topology")

    @property
    def is_gpu(self) -> bool:
        return self.accelerator_type in GPU_ACCELERATORS

    @property
    def is_tpu(self) -> bool:
        return self.accelerator_type in TPU_ACCELERATORS

    def to_json(self) -> dict:
        spec = {"machineType": self.machine_type}
        if self.accelerator_type:
            spec["acceleratorType"] = self.accelerator_type
            spec["acceleratorCount"] = self.accelerator_count
        if self.tpu_topology:
            spec["tpuTopology"] = self.tpu_topology
        return spec


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scheduling:
    """How Vertex AI provisions and restarts the job.

    Attributes:
        strategy: `standard` (on-demand VMs), `spot` (Spot VMs, may be
            preempted) or `flex_start` (Dynamic Workload Scheduler: waits until
            every replica can start together).
        timeout_seconds: Longest run time; 0 leaves Vertex's default (7 days).
        max_wait_seconds: Longest wait for resources; `None` leaves Vertex's
            default (1 day), 0 waits without limit.
        restart_job_on_worker_restart: Restart every replica when one restarts.
    """

    strategy: str = "standard"
    timeout_seconds: int = 0
    max_wait_seconds: int | None = None
    restart_job_on_worker_restart: bool = False

    def __post_init__(self):
        if self.strategy not in SCHEDULING_STRATEGIES:
            raise UsageError(f"--scheduling is {self.strategy!r}, expected one of: "
                             f"{', '.join(SCHEDULING_STRATEGIES)}")
        _not_negative("timeout", self.timeout_seconds)
        if self.max_wait_seconds is not None:
            _not_negative("max_wait_duration", self.max_wait_seconds)

    def to_json(self) -> dict:
        scheduling = {"strategy": self.strategy.upper()}
        if self.timeout_seconds:
            scheduling["timeout"] = f"{self.timeout_seconds}s"
        if self.max_wait_seconds is not None:
            scheduling["maxWaitDuration"] = f"{self.max_wait_seconds}s"
        if self.restart_job_on_worker_restart:
            scheduling["restartJobOnWorkerRestart"] = True
        return scheduling


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A whole CustomJob: cluster shape, code, scheduling and outputs.

    Raises `UsageError` on construction for any shape Vertex AI or our trainer
    cannot run.
    """

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
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    trainer_args: tuple[str, ...] = ()

    def __post_init__(self):
        _check_counts(self)
        _check_strategy(self)
        _check_outputs_and_identity(self)
        _check_scheduling(self)

    @property
    def uses_python_package(self) -> bool:
        """Whether the image is a Vertex prebuilt one that runs our sdist."""
        return is_prebuilt_image(self.container_uri)

    @property
    def task_args(self) -> tuple[str, ...]:
        """The arguments every replica of our trainer gets."""
        extra = ()
        if self.strategy == "tpu" and not _has_flag(self.trainer_args, "tpu"):
            extra = ("--tpu=local",)  # a Vertex TPU job runs on a TPU VM
        return (f"--strategy={self.strategy}",) + extra + tuple(self.trainer_args)


def is_prebuilt_image(image_uri: str) -> bool:
    """Whether `image_uri` is one of Vertex AI's prebuilt training images."""
    return bool(_PREBUILT_IMAGE.match(image_uri))


def build_custom_job(spec: JobSpec, *, package_uri: str = "") -> dict:
    """The CustomJob resource, as the Vertex AI REST API takes it (JSON-able).

    Args:
        spec: The validated job.
        package_uri: `gs://` URI of the staged sdist; required (and only
            allowed) when `spec.container_uri` is a prebuilt training image.

    Raises:
        UsageError: `package_uri` is missing for a prebuilt image, or given for
            our own image.
    """
    if spec.uses_python_package and not package_uri.startswith("gs://"):
        raise UsageError(f"the prebuilt image {spec.container_uri} runs a Python package, "
                         f"got package URI {package_uri!r}; expected a gs:// URI of the "
                         f"staged sdist")
    if package_uri and not spec.uses_python_package:
        raise UsageError(f"--container_uri={spec.container_uri} is our own image, which "
                         f"already holds the trainer; a package URI is not used with it")
    code = _code_spec(spec, package_uri)
    pools = [
        _pool(spec, spec.machine, 1, code),
        _pool(spec, spec.machine, spec.workers, code),
        _server_pool(spec, code),
        _pool(spec, _evaluator_machine(spec), spec.evaluators, code),
    ]
    while not pools[-1]:
        pools.pop()
    job_spec = {"workerPoolSpecs": pools}
    if spec.service_account:
        job_spec["serviceAccount"] = spec.service_account
    job_spec["baseOutputDirectory"] = {"outputUriPrefix": spec.base_output_dir}
    if spec.tensorboard:
        job_spec["tensorboard"] = spec.tensorboard
    if spec.enable_web_access:
        job_spec["enableWebAccess"] = True
    job_spec["scheduling"] = spec.scheduling.to_json()
    job = {"displayName": spec.display_name, "jobSpec": job_spec}
    if spec.labels:
        job["labels"] = dict(spec.labels)
    return job


def redact_env(custom_job: Mapping[str, Any]) -> dict:
    """A copy of `custom_job` whose environment variable values are hidden."""
    job = json.loads(json.dumps(custom_job))
    for pool in job.get("jobSpec", {}).get("workerPoolSpecs", []):
        for key in ("containerSpec", "pythonPackageSpec"):
            for variable in pool.get(key, {}).get("env", []):
                variable["value"] = REDACTED
    return job


def _code_spec(spec: JobSpec, package_uri: str) -> tuple[str, dict]:
    env = [{"name": name, "value": value} for name, value in spec.env]
    if spec.uses_python_package:
        code = {"executorImageUri": spec.container_uri, "packageUris": [package_uri],
                "pythonModule": TRAINER_MODULE, "args": list(spec.task_args)}
        key = "pythonPackageSpec"
    else:
        code = {"imageUri": spec.container_uri,
                "command": ["python", "-m", TRAINER_MODULE], "args": list(spec.task_args)}
        key = "containerSpec"
    if env:
        code["env"] = env
    return key, code


def _pool(spec: JobSpec, machine: MachineSpec, replicas: int, code: tuple[str, dict]) -> dict:
    if not replicas:
        return {}
    key, body = code
    return {"machineSpec": machine.to_json(), "replicaCount": replicas,
            "diskSpec": _disk(spec), key: json.loads(json.dumps(body))}


def _server_pool(spec: JobSpec, code: tuple[str, dict]) -> dict:
    if spec.reduction_servers:
        machine = MachineSpec(machine_type=spec.reduction_server_machine_type)
        return {"machineSpec": machine.to_json(), "replicaCount": spec.reduction_servers,
                "diskSpec": _disk(spec),
                "containerSpec": {"imageUri": spec.reduction_server_image}}
    machine = spec.machine
    if spec.parameter_server_machine_type:
        machine = MachineSpec(machine_type=spec.parameter_server_machine_type)
    return _pool(spec, machine, spec.parameter_servers, code)


def _evaluator_machine(spec: JobSpec) -> MachineSpec:
    if spec.evaluator_machine_type:
        return MachineSpec(machine_type=spec.evaluator_machine_type)
    return spec.machine


def _disk(spec: JobSpec) -> dict:
    return {"bootDiskType": spec.boot_disk_type, "bootDiskSizeGb": spec.boot_disk_size_gb}


def _check_counts(spec: JobSpec) -> None:
    for name in ("workers", "parameter_servers", "reduction_servers", "evaluators"):
        _not_negative(name, getattr(spec, name))
    if spec.boot_disk_size_gb <= 0:
        raise UsageError(f"boot_disk_size_gb is {spec.boot_disk_size_gb}, expected a "
                         f"positive size in GB such as 100")


def _check_strategy(spec: JobSpec) -> None:
    strategy = spec.strategy
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy is {strategy!r}, expected one of: {', '.join(STRATEGIES)}")
    if spec.reduction_servers and spec.parameter_servers:
        raise UsageError(
            f"--reduction_servers={spec.reduction_servers} and --parameter_servers="
            f"{spec.parameter_servers} both use worker pool 2, expected one of them; "
            f"Reduction Server serves all-reduce (--strategy=multiworker), parameter "
            f"servers serve --strategy=parameter_server")
    if spec.reduction_servers and not (spec.workers and spec.machine.is_gpu):
        raise UsageError(
            f"--reduction_servers={spec.reduction_servers} needs GPU workers, got "
            f"--workers={spec.workers} on {spec.machine.machine_type} with "
            f"--accelerator_type={spec.machine.accelerator_type or 'none'}; Reduction Server "
            f"speeds up NCCL all-reduce between GPU machines: add --workers and GPUs, or "
            f"drop --reduction_servers")
    if spec.reduction_servers and strategy != "multiworker":
        # Not `auto` either: a cluster variable listing pool 2 could make the
        # trainer pick parameter_server for the reducers.
        raise UsageError(f"--reduction_servers={spec.reduction_servers} needs "
                         f"--strategy=multiworker (NCCL all-reduce), got --strategy={strategy}")
    if strategy == "parameter_server" and not (spec.parameter_servers and spec.workers):
        raise UsageError(
            f"--strategy=parameter_server needs parameter servers and workers, got "
            f"--parameter_servers={spec.parameter_servers} --workers={spec.workers}; set "
            f"both, e.g. --parameter_servers=2 --workers=4")
    if spec.parameter_servers and strategy == "auto" and not spec.workers:
        raise UsageError(f"--parameter_servers={spec.parameter_servers} needs workers to "
                         f"train, got --workers=0; set e.g. --workers=4")
    if spec.parameter_servers and strategy not in ("parameter_server", "auto"):
        raise UsageError(f"--parameter_servers={spec.parameter_servers} needs "
                         f"--strategy=parameter_server, got --strategy={strategy}; change "
                         f"the strategy or drop --parameter_servers")
    if strategy in _SINGLE_MACHINE_STRATEGIES and spec.workers:
        raise UsageError(f"--strategy={strategy} trains on one machine, got "
                         f"--workers={spec.workers}; use --strategy=multiworker for several "
                         f"machines, or drop --workers")
    if strategy == "tpu" or spec.machine.is_tpu:
        _check_tpu(spec)
    if spec.evaluators > 1:
        raise UsageError(f"--evaluators is {spec.evaluators}, expected 0 or 1: one "
                         f"evaluator evaluates every checkpoint the chief writes")
    if _has_flag(spec.trainer_args, "strategy"):
        raise UsageError("--strategy appears after --, expected it before -- as a "
                         "trainer.submit flag, which passes it to every replica")


def _check_tpu(spec: JobSpec) -> None:
    if spec.strategy != "tpu":
        raise UsageError(f"--accelerator_type={spec.machine.accelerator_type} is a TPU, "
                         f"expected --strategy=tpu, got --strategy={spec.strategy}")
    if not spec.machine.is_tpu:
        raise UsageError(f"--strategy=tpu needs a TPU --accelerator_type (one of "
                         f"{', '.join(TPU_ACCELERATORS)}), got "
                         f"{spec.machine.accelerator_type or 'none'}")
    extra = {name: getattr(spec, name) for name in
             ("workers", "parameter_servers", "reduction_servers", "evaluators")
             if getattr(spec, name)}
    if extra:
        shown = " ".join(f"--{name}={count}" for name, count in extra.items())
        raise UsageError(f"--strategy=tpu runs as a single TPU VM replica, got {shown}; "
                         f"drop them")


def _check_outputs_and_identity(spec: JobSpec) -> None:
    if not spec.display_name or len(spec.display_name) > 128:
        raise UsageError(f"--display_name is {spec.display_name!r}, expected 1 to 128 "
                         f"characters")
    if not spec.container_uri:
        raise UsageError("--container_uri is empty, expected our trainer image (see "
                         "docker/README.md) or a Vertex AI prebuilt training image")
    if not spec.base_output_dir.startswith("gs://"):
        raise UsageError(f"--base_output_dir is {spec.base_output_dir!r}, expected a gs:// "
                         f"URI such as gs://my-bucket/runs/job1")
    if spec.service_account and "@" not in spec.service_account:
        raise UsageError(f"--service_account is {spec.service_account!r}, expected an "
                         f"email such as trainer@my-project.iam.gserviceaccount.com")
    if spec.tensorboard and not spec.service_account:
        raise UsageError("--tensorboard needs --service_account (Vertex AI uploads "
                         "TensorBoard logs as that account); set --service_account")
    if spec.tensorboard and not re.match(
            r"^projects/[^/]+/locations/[^/]+/tensorboards/[^/]+$", spec.tensorboard):
        raise UsageError(f"--tensorboard is {spec.tensorboard!r}, expected "
                         f"projects/PROJECT/locations/REGION/tensorboards/ID")


def _check_scheduling(spec: JobSpec) -> None:
    if spec.scheduling.strategy != "flex_start":
        return
    if not spec.machine.is_gpu:
        raise UsageError(f"--scheduling=flex_start needs GPU machines, got "
                         f"--accelerator_type={spec.machine.accelerator_type or 'none'}; "
                         f"use --scheduling=standard or spot")
    if spec.reduction_servers or spec.parameter_server_machine_type or \
            spec.evaluator_machine_type:
        raise UsageError("--scheduling=flex_start needs the same machine in every worker "
                         "pool, got a Reduction Server or a separate parameter-server or "
                         "evaluator machine type; drop them or use --scheduling=standard")
    if spec.scheduling.timeout_seconds > _MAX_FLEX_START_TIMEOUT_SECONDS:
        raise UsageError(f"--timeout is {spec.scheduling.timeout_seconds}s, expected at "
                         f"most 7 days (604800s) with --scheduling=flex_start")


def _has_flag(args: Sequence[str], name: str) -> bool:
    return any(re.match(rf"^--?{name}(=|$)", arg) for arg in args)


def _not_negative(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageError(f"--{name} is {value!r}, expected a whole number >= 0")


def parse_duration(name: str, text: str | int | None) -> int | None:
    """Seconds in `3600`, `3600s`, `90m`, `2h`, `1d12h`; `None` for empty.

    Raises:
        UsageError: `text` is not such a duration.
    """
    if text is None or text == "":
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _DURATION.match(str(text).strip())
        if not match or not any(match.groups()):
            raise UsageError(f"--{name} is {text!r}, expected a duration such as 3600, "
                             f"3600s, 90m, 2h or 1d")
        days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
        value = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if value < 0:
        raise UsageError(f"--{name} is {text!r}, expected a duration >= 0")
    return value


def parse_labels(value: str | Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Labels from `key=value,key=value` (or a JSON object), checked.

    Raises:
        UsageError: A pair is malformed or breaks Vertex AI's label rules.
    """
    if not value:
        return ()
    if isinstance(value, Mapping):
        pairs = [(str(key), str(label)) for key, label in value.items()]
    else:
        pairs = []
        for item in (part.strip() for part in str(value).split(",")):
            if not item:
                continue
            if "=" not in item:
                raise UsageError(f"--labels item {item!r} has no '=', expected "
                                 f"key=value,key=value such as team=vision,run=exp1")
            key, label = item.split("=", 1)
            pairs.append((key.strip(), label.strip()))
    for key, label in pairs:
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(label):
            raise UsageError(f"--labels has {key}={label}, expected lowercase letters, "
                             f"digits, _ and - (keys start with a letter, at most 63 "
                             f"characters each)")
    return tuple(sorted(dict(pairs).items()))


def parse_env(value: Sequence[str] | Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Environment variables for our replicas from `NAME=VALUE` items or a mapping.

    Error messages name the variable, never its value.
    """
    if not value:
        return ()
    if isinstance(value, Mapping):
        pairs = [(str(name), str(text)) for name, text in value.items()]
    else:
        pairs = []
        for item in value:
            name, sep, text = str(item).partition("=")
            if not sep:
                raise UsageError(f"--env item for {name!r} has no '=', expected NAME=VALUE")
            pairs.append((name, text))
    for name, _ in pairs:
        if not _ENV_NAME.match(name):
            raise UsageError(f"--env name {name!r} is not a valid environment variable "
                             f"name, expected letters, digits and _")
        if name in ("TF_CONFIG", "CLUSTER_SPEC") or name.startswith("AIP_"):
            raise UsageError(f"--env sets {name}, which Vertex AI sets on every replica; "
                             f"drop it")
    return tuple(pairs)


# Job config files (configs/jobs/*.json) use the flag names as keys.
CONFIG_KEYS = (
    "project", "region", "staging_bucket", "display_name", "strategy", "machine_type",
    "accelerator_type", "accelerator_count", "tpu_topology", "workers",
    "parameter_servers", "parameter_server_machine_type", "reduction_servers",
    "reduction_server_machine_type", "reduction_server_image", "evaluators",
    "evaluator_machine_type", "boot_disk_type", "boot_disk_size_gb", "container_uri",
    "service_account", "scheduling", "max_wait_duration", "restart_job_on_worker_restart",
    "timeout", "base_output_dir", "tensorboard", "enable_web_access", "labels", "env",
    "trainer_args", "description")


def load_job_config(path: str) -> dict:
    """Reads a job config file (JSON object keyed by flag names).

    Raises:
        UsageError: The file is missing, not a JSON object, or has unknown keys.
    """
    if not os.path.isfile(path):
        raise UsageError(f"--job_config file {path!r} does not exist, expected a JSON file "
                         f"such as configs/jobs/mirrored_1x8_gpu.json")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"--job_config file {path!r} is not valid JSON ({error}); "
                         f"expected an object of flag names to values") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--job_config file {path!r} holds a JSON {type(raw).__name__}, "
                         f"expected an object of flag names to values")
    unknown = sorted(set(raw) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(f"--job_config file {path!r} has unknown key(s) "
                         f"{', '.join(unknown)}, expected names from: {', '.join(CONFIG_KEYS)}")
    return raw


def expand_placeholders(name: str, value: str, *, project: str, region: str) -> str:
    """Fills `{project}` and `{region}` in a config value (e.g. an image URI)."""
    try:
        return value.format(project=project, region=region)
    except (KeyError, IndexError, ValueError):
        raise UsageError(f"{name} {value!r} has an unknown placeholder, expected only "
                         f"{{project}} and {{region}}") from None


DEFAULTS = {
    "project": "", "region": "", "staging_bucket": "", "display_name": "",
    "strategy": "auto", "machine_type": DEFAULT_MACHINE_TYPE, "accelerator_type": "",
    "accelerator_count": 0, "tpu_topology": "", "workers": 0, "parameter_servers": 0,
    "parameter_server_machine_type": "", "reduction_servers": 0,
    "reduction_server_machine_type": DEFAULT_REDUCTION_SERVER_MACHINE_TYPE,
    "reduction_server_image": DEFAULT_REDUCTION_SERVER_IMAGE, "evaluators": 0,
    "evaluator_machine_type": "", "boot_disk_type": DEFAULT_BOOT_DISK_TYPE,
    "boot_disk_size_gb": DEFAULT_BOOT_DISK_SIZE_GB, "container_uri": "",
    "service_account": "", "scheduling": "standard", "max_wait_duration": "",
    "restart_job_on_worker_restart": False, "timeout": "", "base_output_dir": "",
    "tensorboard": "", "enable_web_access": False, "labels": "", "env": (),
    "trainer_args": (), "description": "",
}
_TEMPLATED = ("container_uri", "reduction_server_image", "base_output_dir", "service_account",
              "tensorboard", "staging_bucket")


def merge_options(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> dict:
    """Defaults, then a job config file's values, then the flags the user passed.

    `trainer_args` and `env` accumulate (file first, flags after), so flags
    after `--` override a config file's trainer flags the way absl does: the
    last occurrence wins.
    """
    options = dict(DEFAULTS)
    for source in (file_values, flag_values):
        for name, value in source.items():
            if name in ("trainer_args", "env") and options[name]:
                options[name] = _concat(options[name], value)
            else:
                options[name] = value
    for name in _TEMPLATED:
        if isinstance(options[name], str) and "{" in options[name]:
            options[name] = expand_placeholders(name, options[name],
                                                project=options["project"],
                                                region=options["region"])
    return options


def _concat(first, second):
    if isinstance(first, Mapping) or isinstance(second, Mapping):
        merged = dict(parse_env(first))
        merged.update(parse_env(second))
        return merged
    return tuple(first) + tuple(second)


def job_spec_from_options(options: Mapping[str, Any], *, timestamp: str) -> JobSpec:
    """Builds the validated `JobSpec` from merged options.

    Args:
        options: The result of `merge_options`.
        timestamp: Suffix for the default output directory, e.g. 20261130-101500.

    Raises:
        UsageError: Any value is malformed or the shape is impossible.
    """
    strategy = str(options["strategy"]).strip().lower()
    display_name = options["display_name"] or f"tfdist-{strategy}"
    base_output_dir = options["base_output_dir"]
    if not base_output_dir:
        bucket = options["staging_bucket"]
        if not bucket:
            raise UsageError("--staging_bucket is not set, expected a gs:// bucket for the "
                             "job's outputs and staged package, e.g. gs://my-bucket; or set "
                             "--base_output_dir")
        base_output_dir = f"{check_gcs_uri('staging_bucket', bucket)}/tfdist-jobs/" \
                          f"{_slug(display_name)}-{timestamp}"
    machine = MachineSpec(
        machine_type=options["machine_type"], accelerator_type=options["accelerator_type"],
        accelerator_count=_integer("accelerator_count", options["accelerator_count"]),
        tpu_topology=options["tpu_topology"])
    scheduling = Scheduling(
        strategy=str(options["scheduling"]).strip().lower(),
        timeout_seconds=parse_duration("timeout", options["timeout"]) or 0,
        max_wait_seconds=parse_duration("max_wait_duration", options["max_wait_duration"]),
        restart_job_on_worker_restart=_boolean("restart_job_on_worker_restart",
                                               options["restart_job_on_worker_restart"]))
    trainer_args = options["trainer_args"]
    if isinstance(trainer_args, str) or not all(isinstance(a, str) for a in trainer_args):
        raise UsageError(f"trainer_args is {trainer_args!r}, expected a list of trainer.task "
                         f"flags such as [\"--epochs=10\"]")
    return JobSpec(
        display_name=display_name, strategy=strategy, machine=machine,
        container_uri=options["container_uri"], base_output_dir=base_output_dir.rstrip("/"),
        workers=_integer("workers", options["workers"]),
        parameter_servers=_integer("parameter_servers", options["parameter_servers"]),
        parameter_server_machine_type=options["parameter_server_machine_type"],
        reduction_servers=_integer("reduction_servers", options["reduction_servers"]),
        reduction_server_machine_type=options["reduction_server_machine_type"],
        reduction_server_image=options["reduction_server_image"],
        evaluators=_integer("evaluators", options["evaluators"]),
        evaluator_machine_type=options["evaluator_machine_type"],
        boot_disk_type=options["boot_disk_type"],
        boot_disk_size_gb=_integer("boot_disk_size_gb", options["boot_disk_size_gb"]),
        service_account=options["service_account"], scheduling=scheduling,
        tensorboard=options["tensorboard"],
        enable_web_access=_boolean("enable_web_access", options["enable_web_access"]),
        labels=parse_labels(options["labels"]), env=parse_env(options["env"]),
        trainer_args=tuple(trainer_args))


def check_gcs_uri(name: str, value: str) -> str:
    """`value` without a trailing slash, if it is a gs:// URI with a bucket."""
    if not re.match(r"^gs://[a-z0-9][a-z0-9._-]{1,220}(/.*)?$", str(value)):
        raise UsageError(f"--{name} is {value!r}, expected a gs:// URI such as gs://my-bucket")
    return str(value).rstrip("/")


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-") or "job"


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"--{name} is {value!r}, expected a whole number >= 0")
    _not_negative(name, value)
    return value


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"--{name} is {value!r}, expected true or false")
    return value
