"""Machines' network bandwidth, for sizing Reduction Server (worker pool 2).

Vertex AI's Reduction Server guidance: a VM's machine type fixes its maximum
egress bandwidth, and the reducers' combined bandwidth should match the
workers'. The submitter refuses a Reduction Server whose reducers cannot carry
what the chief and workers send, and names the count that would.

Maximum per-VM egress in Gbps, as Compute Engine documents it ("Network
bandwidth", and the accelerator-optimized machine family pages), checked on
`TABLE_DATE` (`trainer/vertex/tables/network.json`, with its sources).
General-purpose machines get 2 Gbps per vCPU up to a cap; the GPU machines'
figures are the total of their NICs. Machine types not listed there are not
checked (the dry run says so).
"""

import math
import re

from trainer.vertex import tables

SHAPE = tables.table(
    {
        "per_vcpu": tables.MapOf(
            tables.Record(
                {"gbps_per_vcpu": tables.POSITIVE_NUMBER, "cap_gbps": tables.POSITIVE_NUMBER}
            )
        ),
        "shared_core": tables.MapOf(tables.POSITIVE_NUMBER),
        "gpu_machines": tables.MapOf(tables.POSITIVE_NUMBER),
        "reduction_server": tables.Record({"image": tables.TEXT, "machine_type": tables.TEXT}),
    }
)


def check_table(table: dict, source: str) -> None:
    """The rules of network.json its shape cannot say."""
    for series in table["per_vcpu"]:
        tables.expect(
            bool(re.fullmatch(r"[a-z][a-z0-9]*", series)),
            source,
            "a key of per_vcpu",
            series,
            "a machine series such as n2 (machine types SERIES-standard-N)",
        )


TABLE = tables.load("network.json", SHAPE, check_table)
TABLE_DATE = TABLE["table_date"]
SOURCES = tuple(TABLE["sources"])
# Per-vCPU rule: (Gbps per vCPU, cap in Gbps) for the general-purpose series.
_PER_VCPU = {
    series: (row["gbps_per_vcpu"], row["cap_gbps"]) for series, row in TABLE["per_vcpu"].items()
}
_SHARED_CORE = dict(TABLE["shared_core"])
GPU_MACHINES = dict(TABLE["gpu_machines"])
_GENERAL = re.compile(
    rf"^({'|'.join(map(re.escape, _PER_VCPU))})-(?:standard|highmem|highcpu)-([0-9]+)$"
)
# The documented Reduction Server image (also published under europe-docker and
# asia-docker) and the machine type Vertex AI recommends for reducers.
REDUCTION_SERVER_IMAGE = TABLE["reduction_server"]["image"]
REDUCTION_SERVER_MACHINE_TYPE = TABLE["reduction_server"]["machine_type"]


def egress_gbps(machine_type: str) -> float | None:
    """The machine's maximum egress bandwidth in Gbps, or None when not in the table."""
    if machine_type in GPU_MACHINES:
        return float(GPU_MACHINES[machine_type])
    if machine_type in _SHARED_CORE:
        return float(_SHARED_CORE[machine_type])
    match = _GENERAL.match(machine_type)
    if not match:
        return None
    per_vcpu, cap = _PER_VCPU[match.group(1)]
    return float(min(per_vcpu * int(match.group(2)), cap))


def reducers_needed(
    *, worker_machine: str, training_replicas: int, reducer_machine: str
) -> int | None:
    """Reducers whose combined egress matches the chief's and workers', or None if unknown."""
    worker, reducer = egress_gbps(worker_machine), egress_gbps(reducer_machine)
    if worker is None or reducer is None:
        return None
    return max(1, math.ceil(training_replicas * worker / reducer))
