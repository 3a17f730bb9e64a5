"""What a job will run, in a few lines: the bill printed before every submission.

    Will run (per trial):
      pool 0 chief       1 x a2-highgpu-8g, 8 x NVIDIA_TESLA_A100 each, pd-ssd 100 GB, our trainer
      pool 1 workers     1 x a2-highgpu-8g, 8 x NVIDIA_TESLA_A100 each, pd-ssd 100 GB, our trainer
      pool 2 reducers    7 x n1-highcpu-16, pd-ssd 100 GB, Reduction Server
      scheduling STANDARD (on-demand VMs); all-reduce NCCL (--all_reduce=nccl set by the submitter)
      in all: 9 machines, 16 x NVIDIA_TESLA_A100, 7 reducers
      tuning: 20 trials, 4 at once: peak 36 machines, 64 x NVIDIA_TESLA_A100, 28 reducers

`python -m trainer.submit` prints it on stderr in every dry run and before
every real submission, so what is billed is read before it is sent.
"""

import dataclasses

from trainer import submission
from trainer.vertex import network, rendering
from trainer.vertex.spec import JobSpec, MachineSpec

_SCHEDULING = {
    "standard": "STANDARD (on-demand VMs)",
    "spot": "SPOT (Spot VMs: cheaper, may be preempted)",
    "flex_start": "FLEX_START (Dynamic Workload Scheduler: waits until every "
    "replica can start together)",
}


@dataclasses.dataclass(frozen=True)
class Pool:
    """One worker pool as billed."""

    index: int
    role: str
    replicas: int
    machine: MachineSpec
    runs: str


def pools(spec: JobSpec) -> list[Pool]:
    """The job's non-empty worker pools, in Vertex AI's order."""
    listed = [Pool(0, "chief", 1, spec.machine, "our trainer")]
    if spec.workers:
        listed.append(Pool(1, "workers", spec.workers, spec.machine, "our trainer"))
    if spec.reduction_servers:
        listed.append(
            Pool(
                2,
                "reducers",
                spec.reduction_servers,
                spec.reduction_server_machine,
                "Reduction Server",
            )
        )
    elif spec.parameter_servers:
        listed.append(
            Pool(2, "ps", spec.parameter_servers, spec.parameter_server_machine, "our trainer")
        )
    if spec.evaluators:
        listed.append(Pool(3, "evaluator", spec.evaluators, spec.evaluator_machine, "our trainer"))
    return listed


def totals(spec: JobSpec) -> tuple[int, dict[str, int], int]:
    """(machines, accelerator type -> count, reducers) of one run of the job."""
    machines, accelerators = 0, {}
    for pool in pools(spec):
        machines += pool.replicas
        if pool.machine.accelerator_type:
            accelerators[pool.machine.accelerator_type] = (
                accelerators.get(pool.machine.accelerator_type, 0)
                + pool.replicas * pool.machine.accelerator_count
            )
    return machines, accelerators, spec.reduction_servers


def _accelerators(accelerators: dict[str, int]) -> str:
    return (
        ", ".join(f"{count} x {name}" for name, count in accelerators.items()) or "no accelerators"
    )


def _machines(count: int) -> str:
    return f"{count} machine{'' if count == 1 else 's'}"


def bill_lines(spec: JobSpec, *, tuning=None) -> list[str]:
    """The bill, one line per pool and a few summary lines.

    Args:
        spec: The checked job.
        tuning: A `trainer.vertex.tuning.TuningSpec`, for the peak over parallel trials.
    """
    lines = ["Will run" + (" (per trial):" if tuning else ":")]
    for pool in pools(spec):
        machine = pool.machine
        parts = [f"{pool.replicas} x {machine.machine_type}"]
        if machine.accelerator_type:
            parts.append(f"{machine.accelerator_count} x {machine.accelerator_type} each")
        if machine.tpu_topology:
            parts.append(f"topology {machine.tpu_topology}")
        disk = rendering.disk_type_for(spec, machine)
        parts.append(f"{disk or 'Vertex default disk'} {spec.boot_disk_size_gb} GB")
        parts.append(pool.runs)
        lines.append(f"  pool {pool.index} {pool.role:<10} {', '.join(parts)}")
    extra = []
    if spec.reduction_servers:
        given = submission.flag_value(spec.trainer_args, "all_reduce")
        extra.append(
            "all-reduce NCCL" + ("" if given else " (--all_reduce=nccl set by the submitter)")
        )
        needed = network.reducers_needed(
            worker_machine=spec.machine.machine_type,
            training_replicas=1 + spec.workers,
            reducer_machine=spec.reduction_server_machine_type,
        )
        if needed and spec.reduction_servers < needed:
            extra.append(
                f"{spec.reduction_servers} reducers where the bandwidth table asks for "
                f"{needed} (--allow_fewer_reducers): the all-reduce is slower"
            )
    if spec.persistent_resource_id:
        extra.append(
            f"on persistent resource {spec.persistent_resource_id} (its machines, not new ones)"
        )
    if spec.nfs_mounts:
        extra.append(
            "NFS "
            + ", ".join(
                f"{server}:{path} at /mnt/nfs/{point}" for server, path, point in spec.nfs_mounts
            )
        )
    if spec.lustre_mounts:
        extra.append(
            "Lustre "
            + ", ".join(
                f"{ip} ({fs}) at /mnt/lustre/{point}" for ip, _, fs, point in spec.lustre_mounts
            )
        )
    lines.append(
        f"  scheduling {_SCHEDULING.get(spec.scheduling.strategy, spec.scheduling.strategy)}"
        + "".join(f"; {item}" for item in extra)
    )
    machines, accelerators, reducers = totals(spec)
    summary = f"  in all: {_machines(machines)}, {_accelerators(accelerators)}"
    if reducers:
        summary += f", {reducers} reducers"
    lines.append(summary)
    if tuning:
        parallel = tuning.parallel_trial_count
        peak = {name: count * parallel for name, count in accelerators.items()}
        line = (
            f"  tuning: {tuning.max_trial_count} trials, {parallel} at once: peak "
            f"{_machines(machines * parallel)}, {_accelerators(peak)}"
        )
        if reducers:
            line += f", {reducers * parallel} reducers"
        lines.append(line)
    return lines
