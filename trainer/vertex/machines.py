"""Which accelerators, how many, and which TPU topologies each machine type takes.

The table (`trainer/vertex/tables/machines.json`, dated, with its sources) is
the part of Vertex AI's compute documentation ("Configure compute resources for
custom training": GPUs, TPUs) the submitter checks before sending a job, so that
an A100 on an n2-standard-4 or a v5e job without a topology is a one-line error
instead of a refusal after upload. Accelerator names are the `AcceleratorType`
values of the Vertex AI v1 API; `tests/unit/test_vertex_spec.py` fails when the
installed SDK gains one that is neither in the table nor in
`NOT_OFFERED_FOR_TRAINING`.

Machines come in two kinds:
    * with their accelerators built in (A2, A3, A4, G2, G4, TPU VMs): the machine
      type fixes the accelerator and the count;
    * N1, to which some older GPUs attach in counts of 1, 2, 4 (or 8).
Machine types not listed are CPU machines and take no accelerators.
"""

import dataclasses
import re

from trainer.vertex import tables
from trainer.vertex.checks import quoted, require


@dataclasses.dataclass(frozen=True)
class BuiltIn:
    """A machine type that comes with `count` × `accelerator`.

    Attributes:
        accelerator: The `AcceleratorType` name.
        count: Accelerators (GPUs, or TPU chips) per machine.
        topologies: TPU topologies this single host forms ("" for GPUs and
            TPU v2/v3, which take none).
    """

    accelerator: str
    count: int
    topologies: tuple[str, ...] = ("",)


_NAMES = tables.ListOf(tables.TEXT)
SHAPE = tables.table(
    {
        "gpu_machines": tables.MapOf(tables.MapOf(tables.POSITIVE_INTEGER)),
        "tpu_machines": tables.MapOf(
            tables.Record(
                {
                    "accelerator": tables.TEXT,
                    "count": tables.POSITIVE_INTEGER,
                    "topologies": _NAMES,
                }
            )
        ),
        "cloud_tpu": tables.Record(
            {"machine_type": tables.TEXT, "cores": tables.MapOf(tables.POSITIVE_INTEGER)}
        ),
        "n1_attachable": tables.MapOf(tables.ListOf(tables.POSITIVE_INTEGER)),
        "not_offered_for_training": tables.MapOf(tables.TEXT),
        "flex_start_accelerators": _NAMES,
        "hyperdisk_only_families": _NAMES,
        "vertex_decides_disk_families": _NAMES,
        "default_disk_type": tables.TEXT,
        "arm_machine_families": _NAMES,
    }
)
_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)+$")


def check_table(table: dict, source: str) -> None:
    """The rules of machines.json its shape cannot say."""
    machine_names = "a machine type such as a2-highgpu-8g"
    seen = set()
    for accelerator, counts in table["gpu_machines"].items():
        where = f"gpu_machines[{accelerator!r}]"
        tables.expect(
            accelerator.startswith("NVIDIA_"),
            source,
            "a key of gpu_machines",
            accelerator,
            "an NVIDIA_ AcceleratorType name",
        )
        for machine in counts:
            tables.expect(
                bool(_MACHINE_TYPE.match(machine)),
                source,
                f"a key of {where}",
                machine,
                machine_names,
            )
            tables.expect(machine not in seen, source, where, machine, "each machine once")
            seen.add(machine)
    for machine, row in table["tpu_machines"].items():
        where = f"tpu_machines[{machine!r}]"
        tables.expect(
            bool(_MACHINE_TYPE.match(machine)) and machine not in seen,
            source,
            "a key of tpu_machines",
            machine,
            f"{machine_names}, each machine once",
        )
        seen.add(machine)
        tables.expect(
            row["accelerator"].startswith("TPU_"),
            source,
            f"{where}.accelerator",
            row["accelerator"],
            "a TPU_ AcceleratorType name",
        )
    for accelerator in (*table["cloud_tpu"]["cores"], *table["n1_attachable"]):
        tables.expect(
            accelerator.startswith(("TPU_", "NVIDIA_")),
            source,
            "a key of cloud_tpu.cores or n1_attachable",
            accelerator,
            "an AcceleratorType name (TPU_..., NVIDIA_...)",
        )
    gpus = {name for counts in (table["gpu_machines"], table["n1_attachable"]) for name in counts}
    for index, accelerator in enumerate(table["flex_start_accelerators"]):
        tables.expect(
            accelerator in gpus,
            source,
            f"flex_start_accelerators[{index}]",
            accelerator,
            "a GPU of gpu_machines or n1_attachable",
        )


TABLE = tables.load("machines.json", SHAPE, check_table)
TABLE_DATE = TABLE["table_date"]
SOURCES = tuple(TABLE["sources"])

BUILT_IN = {
    **{
        machine: BuiltIn(accelerator, count)
        for accelerator, counts in TABLE["gpu_machines"].items()
        for machine, count in counts.items()
    },
    # TPU VMs. Single-host slices only: our trainer runs a TPU job as one
    # replica with --tpu=local, which cannot drive a multi-host slice.
    **{
        machine: BuiltIn(row["accelerator"], row["count"], tuple(row["topologies"]))
        for machine, row in TABLE["tpu_machines"].items()
    },
}

# TPU v2 and v3 on Vertex AI: machine type `cloud-tpu` with 8 cores, no topology.
CLOUD_TPU_MACHINE = TABLE["cloud_tpu"]["machine_type"]
CLOUD_TPU = dict(TABLE["cloud_tpu"]["cores"])

# GPUs that attach to N1 machines (n1-standard-*, n1-highmem-*, n1-highcpu-*).
N1_ATTACHABLE = {name: tuple(counts) for name, counts in TABLE["n1_attachable"].items()}
_N1 = re.compile(r"^n1-(standard|highmem|highcpu)-[0-9]+$")

# In the API's enum but not offered for custom training on the machines above,
# or not usable by our trainer: the reason is the error message.
NOT_OFFERED_FOR_TRAINING = dict(TABLE["not_offered_for_training"])

# GPUs the Dynamic Workload Scheduler (--scheduling=flex_start) provisions.
FLEX_START_ACCELERATORS = tuple(TABLE["flex_start_accelerators"])

# Boot disks by machine family (prefix of the machine type). Vertex AI's
# DiskSpec: "For non-A3U machines, the default value is pd-ssd, for A3U
# machines hyperdisk-balanced". A3 Ultra takes Hyperdisk only. For A4, A4X and
# G4 we found no documented default: no disk type is sent, Vertex AI decides.
HYPERDISK_ONLY_FAMILIES = tuple(TABLE["hyperdisk_only_families"])
VERTEX_DECIDES_DISK_FAMILIES = tuple(TABLE["vertex_decides_disk_families"])
DEFAULT_DISK_TYPE = TABLE["default_disk_type"]

# Machines with ARM (aarch64) host CPUs: they run arm64 images only.
ARM_MACHINE_FAMILIES = tuple(TABLE["arm_machine_families"])

GPU_ACCELERATORS = tuple(
    sorted(
        {
            machine.accelerator
            for machine in BUILT_IN.values()
            if machine.accelerator.startswith("NVIDIA_")
        }
        | set(N1_ATTACHABLE)
    )
)
TPU_ACCELERATORS = tuple(
    sorted(
        {
            machine.accelerator
            for machine in BUILT_IN.values()
            if machine.accelerator.startswith("TPU_")
        }
        | set(CLOUD_TPU)
    )
)
ACCELERATORS = GPU_ACCELERATORS + TPU_ACCELERATORS


def machines_for(accelerator: str) -> list[str]:
    """Human-readable list of where `accelerator` is offered, for error messages."""
    if accelerator in N1_ATTACHABLE:
        counts = "/".join(str(count) for count in N1_ATTACHABLE[accelerator])
        return [f"n1-standard-*, n1-highmem-*, n1-highcpu-* with {counts}"]
    if accelerator in CLOUD_TPU:
        return [f"{CLOUD_TPU_MACHINE} with {CLOUD_TPU[accelerator]}"]
    return [
        f"{machine} with {spec.count}"
        for machine, spec in BUILT_IN.items()
        if spec.accelerator == accelerator
    ]


_GPU_PARTITION = re.compile(r"^[1-7]g\.[0-9]{1,3}gb$")


def check_gpu_partition(accelerator_type: str, partition_size: str) -> None:
    """A multi-instance GPU partition size such as `1g.10gb`, on GPU machines only."""
    require(
        is_gpu(accelerator_type),
        f"--gpu_partition_size={quoted(partition_size)} partitions GPUs, but "
        f"--accelerator_type is {quoted(accelerator_type or 'none')}; set a GPU that "
        f"supports multi-instance GPU (e.g. NVIDIA_TESLA_A100, NVIDIA_H100_80GB) or drop it",
    )
    require(
        bool(_GPU_PARTITION.match(partition_size)),
        f"--gpu_partition_size is {quoted(partition_size)}, expected a multi-instance GPU "
        f"profile such as 1g.5gb, 1g.10gb, 2g.20gb or 3g.40gb",
    )


def check_machine(
    *,
    flag: str,
    machine_type: str,
    accelerator_type: str = "",
    accelerator_count: int = 0,
    tpu_topology: str = "",
) -> None:
    """Checks one replica's machine the way Vertex AI would.

    Args:
        flag: The flag that named the machine type, for messages
            (`--machine_type`, `--evaluator_machine_type`, ...).
        machine_type: e.g. `a2-highgpu-8g`.
        accelerator_type: `AcceleratorType` name, "" for none.
        accelerator_count: Accelerators per machine.
        tpu_topology: e.g. `2x2` for TPU v5e.

    Raises:
        UsageError: The combination is one Vertex AI refuses.
    """
    require(
        bool(machine_type),
        f"{flag} is empty, expected a Vertex AI machine type such as "
        f"n2-standard-8 or a2-highgpu-8g",
    )
    require(
        len(machine_type) <= 63 and bool(_MACHINE_TYPE.match(machine_type)),
        f"{flag} is {quoted(machine_type)}, expected a machine type such as n2-standard-8",
    )
    require(
        accelerator_type not in NOT_OFFERED_FOR_TRAINING,
        f"--accelerator_type={accelerator_type} "
        f"{NOT_OFFERED_FOR_TRAINING.get(accelerator_type, '')}",
    )
    require(
        not accelerator_type or accelerator_type in ACCELERATORS,
        f"--accelerator_type is {quoted(accelerator_type)}, expected one of: "
        f"{', '.join(ACCELERATORS)}",
    )
    require(
        not (accelerator_type and not accelerator_count),
        f"--accelerator_type={accelerator_type} has --accelerator_count=0, expected the "
        f"number per machine: {'; '.join(machines_for(accelerator_type))}",
    )
    require(
        not (accelerator_count and not accelerator_type),
        f"--accelerator_count={accelerator_count} has no --accelerator_type, expected "
        f"one of: {', '.join(ACCELERATORS)}",
    )
    built_in = BUILT_IN.get(machine_type)
    if built_in:
        _check_built_in(
            flag, machine_type, built_in, accelerator_type, accelerator_count, tpu_topology
        )
    elif machine_type == CLOUD_TPU_MACHINE:
        require(
            accelerator_type in CLOUD_TPU,
            f"{flag}={CLOUD_TPU_MACHINE} runs TPU v2 or v3, got --accelerator_type="
            f"{accelerator_type or 'none'}; set --accelerator_type=TPU_V3 "
            f"--accelerator_count=8",
        )
        _check_count(
            machine_type, accelerator_type, accelerator_count, (CLOUD_TPU[accelerator_type],)
        )
        require(
            not tpu_topology,
            f"--tpu_topology={quoted(tpu_topology)} does not apply to "
            f"{accelerator_type} on {CLOUD_TPU_MACHINE}; drop it",
        )
    elif accelerator_type:
        require(
            accelerator_type in N1_ATTACHABLE and bool(_N1.match(machine_type)),
            f"--accelerator_type={accelerator_type} is not offered on {machine_type}, "
            f"expected: {'; '.join(machines_for(accelerator_type))}",
        )
        _check_count(
            machine_type, accelerator_type, accelerator_count, N1_ATTACHABLE[accelerator_type]
        )
        require(
            not tpu_topology,
            f"--tpu_topology={quoted(tpu_topology)} needs a TPU "
            f"machine, got {machine_type}; drop --tpu_topology",
        )
    else:
        require(
            not tpu_topology,
            f"--tpu_topology={quoted(tpu_topology)} needs a TPU "
            f"machine, got {machine_type}; drop --tpu_topology",
        )


def _check_built_in(
    flag, machine_type, built_in, accelerator_type, accelerator_count, tpu_topology
):
    require(
        flag == "--machine_type",
        f"{flag}={machine_type} comes with {built_in.count} x {built_in.accelerator}, "
        f"expected a CPU machine type such as n2-standard-8 ({flag} takes no "
        f"accelerators)",
    )
    wanted = f"--accelerator_type={built_in.accelerator} --accelerator_count={built_in.count}"
    require(
        bool(accelerator_type),
        f"{flag}={machine_type} comes with {built_in.count} x {built_in.accelerator}, "
        f"got no --accelerator_type; set {wanted}",
    )
    require(
        accelerator_type == built_in.accelerator,
        f"--accelerator_type={accelerator_type} is not offered on {machine_type}, which "
        f"comes with {built_in.accelerator}; set {wanted}, or pick a machine from: "
        f"{'; '.join(machines_for(accelerator_type))}",
    )
    _check_count(machine_type, accelerator_type, accelerator_count, (built_in.count,))
    if built_in.topologies == ("",):
        require(
            not tpu_topology,
            f"--tpu_topology={quoted(tpu_topology)} needs a TPU "
            f"machine, got {machine_type}; drop --tpu_topology",
        )
        return
    require(
        bool(tpu_topology),
        f"--tpu_topology is not set, expected the topology of {machine_type}'s "
        f"{built_in.count} chips: --tpu_topology={built_in.topologies[0]}",
    )
    require(
        tpu_topology in built_in.topologies,
        f"--tpu_topology is {quoted(tpu_topology)}, expected {' or '.join(built_in.topologies)}"
        f" for {machine_type} (one host; multi-host slices are not supported by our "
        f"trainer)",
    )


def _check_count(machine_type, accelerator_type, count, allowed):
    require(
        count in allowed,
        f"--accelerator_count is {count}, expected {' or '.join(map(str, allowed))} "
        f"{accelerator_type} on {machine_type}",
    )


def default_disk_type(machine_type: str) -> str:
    """The boot disk type to send when none was asked for; "" sends none (Vertex AI decides)."""
    if machine_type.startswith(HYPERDISK_ONLY_FAMILIES):
        return "hyperdisk-balanced"
    if machine_type.startswith(VERTEX_DECIDES_DISK_FAMILIES):
        return ""
    return DEFAULT_DISK_TYPE


def check_disk_type(machine_type: str, disk_type: str) -> None:
    """Refuses a Persistent Disk boot disk on a machine that takes Hyperdisk only."""
    require(
        not (disk_type.startswith("pd-") and machine_type.startswith(HYPERDISK_ONLY_FAMILIES)),
        f"--boot_disk_type={disk_type} on {machine_type} (A3 Ultra), which boots from "
        f"Hyperdisk only, expected hyperdisk-balanced; drop --boot_disk_type (Vertex AI's "
        f"default there is hyperdisk-balanced)",
    )


def is_arm(machine_type: str) -> bool:
    """Whether the machine's host CPU is ARM (it runs arm64 images only)."""
    return machine_type.startswith(ARM_MACHINE_FAMILIES)


def is_gpu(accelerator_type: str) -> bool:
    return accelerator_type in GPU_ACCELERATORS


def is_tpu(accelerator_type: str) -> bool:
    return accelerator_type in TPU_ACCELERATORS
