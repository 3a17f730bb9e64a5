"""A checked `JobSpec` as the CustomJob JSON the Vertex AI REST API takes.

An unused pool between used ones is an empty `{}`; trailing unused pools are
left out, as the Vertex AI SDK does. What `--dry_run` prints is what a real
submission sends (environment variable values aside, which are redacted).
"""

import copy
import json
from typing import Any, Mapping, Sequence

from tfdist.distribute.cluster import POOL2_ROLE
from trainer.vertex import machines, option_values
from trainer.vertex.checks import require
from trainer.vertex.spec import JobSpec, MachineSpec

TRAINER_MODULE = "trainer.task"
_OURS = (POOL2_ROLE, "NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
REDACTED = "<redacted>"


def build_custom_job(spec: JobSpec, *, package_uris: Sequence[str] = ()) -> dict:
    """The CustomJob resource (JSON-able).

    Args:
        spec: The checked job.
        package_uris: `gs://` URIs of the staged packages (the trainer's sdist
            first, then the user's task package); required, and only allowed,
            when `spec.container_uri` is a prebuilt training image.

    Raises:
        UsageError: Packages missing for a prebuilt image, or given for ours.
    """
    job = {"displayName": spec.display_name, "jobSpec": build_job_spec(spec, package_uris)}
    return with_labels_and_encryption(job, spec)


def with_labels_and_encryption(job: dict, spec: JobSpec) -> dict:
    """`job` with the spec's labels and CMEK key, as a CustomJob or a tuning job takes them."""
    if spec.labels:
        job["labels"] = dict(spec.labels)
    if spec.kms_key_name:
        job["encryptionSpec"] = {"kmsKeyName": spec.kms_key_name}
    return job


def build_job_spec(spec: JobSpec, package_uris: Sequence[str] = ()) -> dict:
    """The `jobSpec` (CustomJobSpec) part, also a tuning job's `trialJobSpec`."""
    require(
        not spec.uses_python_package
        or (bool(package_uris) and all(uri.startswith("gs://") for uri in package_uris)),
        f"the prebuilt image {spec.container_uri} runs a Python package, got package URIs "
        f"{list(package_uris)!r:.100}; expected gs:// URIs of the staged sdist",
    )
    require(
        not package_uris or spec.uses_python_package,
        f"--container_uri={spec.container_uri} is our own image, which already holds the "
        f"trainer; a package URI is not used with it",
    )
    code = _code_spec(spec, package_uris)
    reservation = option_values.parse_reservation_affinity(spec.reservation_affinity)
    pools = [
        _pool(spec, spec.machine, 1, code, reservation),
        _pool(spec, spec.machine, spec.workers, code, reservation),
        _server_pool(spec, code, reservation),
        _pool(spec, spec.evaluator_machine, spec.evaluators, code, reservation),
    ]
    while not pools[-1]:
        pools.pop()
    job_spec = {"workerPoolSpecs": pools}
    if spec.persistent_resource_id:
        job_spec["persistentResourceId"] = spec.persistent_resource_id
    if spec.experiment:
        job_spec["experiment"] = spec.experiment_name
        if spec.experiment_run:
            job_spec["experimentRun"] = f"{spec.experiment_name}-{spec.experiment_run}"
    if spec.service_account:
        job_spec["serviceAccount"] = spec.service_account
    if spec.network:
        job_spec["network"] = spec.network
    if spec.reserved_ip_ranges:
        job_spec["reservedIpRanges"] = list(spec.reserved_ip_ranges)
    if spec.psc_network_attachment:
        job_spec["pscInterfaceConfig"] = {"networkAttachment": spec.psc_network_attachment}
    job_spec["baseOutputDirectory"] = {"outputUriPrefix": spec.base_output_dir}
    if spec.tensorboard:
        job_spec["tensorboard"] = spec.tensorboard
    if spec.enable_web_access:
        job_spec["enableWebAccess"] = True
    if spec.enable_dashboard_access:
        job_spec["enableDashboardAccess"] = True
    job_spec["scheduling"] = _scheduling(spec)
    return job_spec


def redact_env(resource: Mapping[str, Any]) -> dict:
    """A copy of a CustomJob or tuning job whose environment variable values are hidden."""
    job = copy.deepcopy(dict(resource))
    job_spec = job.get("jobSpec") or job.get("trialJobSpec") or {}
    for pool in job_spec.get("workerPoolSpecs", []):
        for key in ("containerSpec", "pythonPackageSpec"):
            for variable in pool.get(key, {}).get("env", []):
                if variable["name"] not in _OURS:  # ours, not secrets
                    variable["value"] = REDACTED
    return job


def _code_spec(spec: JobSpec, package_uris: Sequence[str]) -> tuple[str, dict]:
    env = [{"name": name, "value": value} for name, value in spec.env]
    if spec.pool2_role:
        env.append({"name": POOL2_ROLE, "value": spec.pool2_role})
    env.extend({"name": name, "value": value} for name, value in spec.tpu_env)
    if spec.uses_python_package:
        code = {
            "executorImageUri": spec.container_uri,
            "packageUris": list(package_uris),
            "pythonModule": TRAINER_MODULE,
            "args": list(spec.task_args),
        }
        key = "pythonPackageSpec"
    else:
        code = {
            "imageUri": spec.container_uri,
            "command": ["python", "-m", TRAINER_MODULE],
            "args": list(spec.task_args),
        }
        key = "containerSpec"
    if env:
        code["env"] = env
    return key, code


def _machine_json(machine: MachineSpec, reservation: Mapping[str, Any]) -> dict:
    body = {"machineType": machine.machine_type}
    if machine.accelerator_type:
        body["acceleratorType"] = machine.accelerator_type
        body["acceleratorCount"] = machine.accelerator_count
    if machine.tpu_topology:
        body["tpuTopology"] = machine.tpu_topology
    if machine.gpu_partition_size:
        body["gpuPartitionSize"] = machine.gpu_partition_size
    if reservation:
        body["reservationAffinity"] = dict(reservation)
    return body


def _pool(
    spec: JobSpec,
    machine: MachineSpec,
    replicas: int,
    code: tuple[str, dict],
    reservation: Mapping[str, Any],
) -> dict:
    if not replicas:
        return {}
    key, body = code
    # The reservation is for the chief's and workers' machine type only.
    reserved = reservation if machine == spec.machine else {}
    pool = {
        "machineSpec": _machine_json(machine, reserved),
        "replicaCount": replicas,
        "diskSpec": _disk(spec, machine),
        key: json.loads(json.dumps(body)),
    }
    if spec.nfs_mounts:
        pool["nfsMounts"] = [
            {"server": server, "path": path, "mountPoint": point}
            for server, path, point in spec.nfs_mounts
        ]
    if spec.lustre_mounts:
        pool["lustreMounts"] = [
            {
                "instanceIp": ip,
                "volumeHandle": volume,
                "filesystem": filesystem,
                "mountPoint": point,
            }
            for ip, volume, filesystem, point in spec.lustre_mounts
        ]
    return pool


def _server_pool(spec: JobSpec, code: tuple[str, dict], reservation) -> dict:
    if spec.reduction_servers:
        return {
            "machineSpec": _machine_json(spec.reduction_server_machine, {}),
            "replicaCount": spec.reduction_servers,
            "diskSpec": _disk(spec, spec.reduction_server_machine),
            "containerSpec": {"imageUri": spec.reduction_server_image},
        }
    return _pool(spec, spec.parameter_server_machine, spec.parameter_servers, code, reservation)


def disk_type_for(spec: JobSpec, machine: MachineSpec) -> str:
    """The boot disk type sent for `machine`: the one asked for, else its family's ("" none)."""
    return spec.boot_disk_type or machines.default_disk_type(machine.machine_type)


def _disk(spec: JobSpec, machine: MachineSpec) -> dict:
    disk_type = disk_type_for(spec, machine)
    body = {"bootDiskType": disk_type} if disk_type else {}
    body["bootDiskSizeGb"] = spec.boot_disk_size_gb
    return body


def _scheduling(spec: JobSpec) -> dict:
    scheduling = spec.scheduling
    body = {"strategy": scheduling.strategy.upper()}
    if scheduling.timeout_seconds:
        body["timeout"] = f"{scheduling.timeout_seconds}s"
    if scheduling.max_wait_seconds is not None:
        body["maxWaitDuration"] = f"{scheduling.max_wait_seconds}s"
    if scheduling.restart_job_on_worker_restart:
        body["restartJobOnWorkerRestart"] = True
    if scheduling.disable_retries:
        body["disableRetries"] = True
    return body
