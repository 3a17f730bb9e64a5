"""Machines' network bandwidth, for sizing Reduction Server (worker pool 2).

Vertex AI's Reduction Server guidance: a VM's machine type fixes its maximum
egress bandwidth, and the reducers' combined bandwidth should match the
workers'. The submitter refuses a Reduction Server whose reducers cannot carry
what the chief and workers send, and names the count that would.

Maximum per-VM egress in Gbps, as Compute Engine documents it ("Network
bandwidth", and the accelerator-optimized machine family pages), checked
2026-12-01. General-purpose machines get 2 Gbps per vCPU up to a cap; the
GPU machines' figures are the total of their NICs. Machine types not listed
here are not checked (the dry run says so).
"""

import math
import re

TABLE_DATE = "2026-12-01"
SOURCES = (
    "https://cloud.google.com/compute/docs/network-bandwidth",
    "https://cloud.google.com/compute/docs/accelerator-optimized-machines",
    "https://cloud.google.com/vertex-ai/docs/training/distributed-training#reduce_training_time_with_reduction_server",
)
# Per-vCPU rule: (Gbps per vCPU, cap in Gbps) for the general-purpose series.
_PER_VCPU = {"n1": (2, 32), "n2": (2, 32), "n2d": (2, 32), "e2": (2, 16), "c2": (2, 32)}
_SHARED_CORE = {"e2-micro": 1, "e2-small": 1, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}
GPU_MACHINES = {
    "a2-highgpu-1g": 24,
    "a2-highgpu-2g": 32,
    "a2-highgpu-4g": 50,
    "a2-highgpu-8g": 100,
    "a2-megagpu-16g": 100,
    "a2-ultragpu-1g": 24,
    "a2-ultragpu-2g": 32,
    "a2-ultragpu-4g": 50,
    "a2-ultragpu-8g": 100,
    "a3-highgpu-8g": 1000,
    "a3-megagpu-8g": 1800,
    "a3-ultragpu-8g": 3600,
    "a4-highgpu-8g": 3600,
    "g2-standard-4": 10,
    "g2-standard-8": 16,
    "g2-standard-12": 16,
    "g2-standard-16": 32,
    "g2-standard-24": 32,
    "g2-standard-32": 32,
    "g2-standard-48": 50,
    "g2-standard-96": 100,
}
_GENERAL = re.compile(r"^(n1|n2|n2d|e2|c2)-(?:standard|highmem|highcpu)-([0-9]+)$")


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
