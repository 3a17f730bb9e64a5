"""`TFJobShape`: the job a TFJob runs, checked before any manifest is written.

The fields are also the keys of a `--job_config` file (configs/kubernetes/) and
the flags of `python -m trainer.kubernetes`. Every rule here is one the training
operator (or the API server, or tfdist itself) would enforce later, once pods
already run: a shape that passes starts.
"""

import dataclasses
import re

from tfdist._internal.preconditions import quoted, require
from tfdist.distribute import choice as strategy_choice
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from trainer import task_flags
from trainer.kubernetes.checks import CLEAN_POD_POLICIES, QUANTITY, REPLICA_RESTART_POLICIES

RESTART_POLICIES = REPLICA_RESTART_POLICIES
# trainer.task's strategies but tpu: a TFJob has no TPU replicas.
STRATEGIES = tuple(name for name in strategy_choice.STRATEGIES if name != "tpu")
DEFAULT_MOUNT_PATH = "/mnt/tfdist"

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TFJobShape:
    """A TFJob for the trainer: replicas, pods and the restart and cleanup policies.

    Attributes:
        name: The TFJob's name, a DNS-1035 label (the operator refuses others).
        namespace: Its namespace; empty leaves it to `kubectl -n`.
        image: The trainer image every replica runs (docker/).
        strategy: `--strategy` of `trainer.task` on every replica.
        chief: Whether the job has a Chief replica (at most one: TFJob refuses more).
        workers: Worker replicas.
        parameter_servers: PS replicas (parameter_server strategy only).
        evaluators: Evaluator replicas, 0 or 1.
        cpu: CPU request and limit of chief, worker and evaluator pods.
        memory: Memory request and limit of those pods.
        gpus: GPUs per chief and worker pod (`gpu_resource`).
        gpu_resource: The extended resource GPUs are counted in.
        ps_cpu: CPU of a parameter-server pod.
        ps_memory: Memory of a parameter-server pod.
        volume_claim: A ReadWriteMany PersistentVolumeClaim every pod mounts at
            `mount_path`; the model and backups go under `<mount_path>/<name>/`.
        bucket: Instead of a volume, a `gs://` or `s3://` prefix for the model
            and backups (the pods' service account needs access).
        mount_path: Where `volume_claim` is mounted.
        backup_every_steps: `--backup_every_steps` of the trainer.
        restart_policy: TFJob's per-replica restart policy. `ExitCode` retries
            exactly the codes >= 128: tfdist's 137, 143, 200 (a lost peer) and 201
            restart the pod, 2 (configuration) and 3 (non-finite) fail the job.
        backoff_limit: TFJob's `backoffLimit`. It does not bound `ExitCode`
            restarts (the operator recreates those pods and does not count them,
            kubeflow/trainer#2045): the trainer's `--max_restarts_without_progress`
            (3 unless `trainer_args` set it) ends a crash loop with exit 4.
        clean_pod_policy: What happens to pods when the job ends. `None` (the
            default here) keeps the evaluator running until it has evaluated
            the last checkpoint; `Running` and `All` delete it when the chief ends.
        termination_grace_seconds: Pod grace period after SIGTERM; the trainer's
            preemption grace is 5 s less.
        service_account: The Kubernetes service account pods run as.
        node_selector: `key=value` pairs every pod is scheduled by (e.g. the GPU type).
        trainer_args: More `trainer.task` flags for every replica.
    """

    name: str
    image: str
    namespace: str = ""
    strategy: str = "multiworker"
    chief: bool = True
    workers: int = 1
    parameter_servers: int = 0
    evaluators: int = 0
    cpu: str = "4"
    memory: str = "16Gi"
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    ps_cpu: str = "4"
    ps_memory: str = "16Gi"
    volume_claim: str = ""
    bucket: str = ""
    mount_path: str = DEFAULT_MOUNT_PATH
    backup_every_steps: int = 100
    restart_policy: str = "ExitCode"
    backoff_limit: int = 6
    clean_pod_policy: str = "None"
    termination_grace_seconds: int = 30
    service_account: str = ""
    node_selector: tuple[str, ...] = ()
    trainer_args: tuple[str, ...] = ()

    def __post_init__(self):
        for field in ("trainer_args", "node_selector"):
            value = getattr(self, field)
            if isinstance(value, str):
                value = tuple(part for part in value.split(",") if part)
            object.__setattr__(self, field, tuple(value))
        _check(self)

    @property
    def output_root(self) -> str:
        """Where the model and backups go: the volume or the bucket, per job name."""
        if self.volume_claim:
            return f"{self.mount_path.rstrip('/')}/{self.name}"
        return f"{self.bucket.rstrip('/')}/{self.name}"

    @property
    def replica_counts(self) -> dict[str, int]:
        """TFJob replica type to count, for the types present."""
        counts = {
            "Chief": int(self.chief),
            "Worker": self.workers,
            "PS": self.parameter_servers,
            "Evaluator": self.evaluators,
        }
        return {kind: count for kind, count in counts.items() if count}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))


def _count(name: str, value, minimum: int, maximum: int | None = None) -> None:
    require(
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= minimum
        and (maximum is None or value <= maximum),
        f"{name} is {quoted(value)}, expected a whole number "
        f"{f'from {minimum} to {maximum}' if maximum is not None else f'>= {minimum}'}",
    )


def _check(shape: TFJobShape) -> None:
    require(
        len(shape.name) <= 63 and bool(_DNS_1035.match(shape.name)),
        f"name is {quoted(shape.name)}, expected a DNS-1035 label (at most 63 lower-case "
        f"letters, digits and '-', starting with a letter; the training operator refuses "
        f"others), e.g. tfdist-mnist",
    )
    require(
        not shape.namespace or bool(_DNS_1123.match(shape.namespace)),
        f"namespace is {quoted(shape.namespace)}, expected a DNS-1123 label such as "
        f"ml-team, or empty",
    )
    require(
        bool(shape.image.strip()) and not any(c.isspace() for c in shape.image),
        f"image is {quoted(shape.image)}, expected the trainer image every replica runs, "
        f"e.g. us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0 (build it from docker/)",
    )
    require(
        shape.strategy in STRATEGIES,
        f"strategy is {quoted(shape.strategy)}, expected one of {', '.join(STRATEGIES)}",
    )
    require(
        isinstance(shape.chief, bool),
        f"chief is {quoted(shape.chief)}, expected true or false: a TFJob has at most one "
        f"Chief (the operator refuses more)",
    )
    _count("workers", shape.workers, 0)
    _count("parameter_servers", shape.parameter_servers, 0)
    _count("evaluators", shape.evaluators, 0)
    _count("gpus", shape.gpus, 0, 16)
    _count("backup_every_steps", shape.backup_every_steps, 1)
    _count("backoff_limit", shape.backoff_limit, 0)
    _count("termination_grace_seconds", shape.termination_grace_seconds, 10)
    for field in ("cpu", "memory", "ps_cpu", "ps_memory"):
        value = getattr(shape, field)
        require(
            isinstance(value, str) and bool(QUANTITY.match(value)),
            f"{field} is {quoted(value)}, expected a Kubernetes quantity such as 4, 500m, 16Gi",
        )
    require(
        bool(_RESOURCE_NAME.match(shape.gpu_resource)),
        f"gpu_resource is {quoted(shape.gpu_resource)}, expected a resource name such "
        f"as nvidia.com/gpu",
    )
    require(
        shape.restart_policy in RESTART_POLICIES,
        f"restart_policy is {quoted(shape.restart_policy)}, expected one of "
        f"{', '.join(RESTART_POLICIES)} (ExitCode retries tfdist's 137, 143 and 200)",
    )
    require(
        shape.clean_pod_policy in CLEAN_POD_POLICIES,
        f"clean_pod_policy is {quoted(shape.clean_pod_policy)}, expected one of "
        f"{', '.join(CLEAN_POD_POLICIES)}",
    )
    require(
        not (shape.evaluators and shape.clean_pod_policy != "None"),
        f"clean_pod_policy is {quoted(shape.clean_pod_policy)} with an evaluator, which "
        f"the operator deletes when the chief ends, before it evaluates the last "
        f"checkpoint; expected None",
    )
    require(
        bool(shape.volume_claim) != bool(shape.bucket),
        f"volume_claim is {quoted(shape.volume_claim)} and bucket {quoted(shape.bucket)}, "
        f"expected exactly one: every replica restores from the same backups, so they go "
        f"on a shared ReadWriteMany volume or in a bucket",
    )
    require(
        not shape.volume_claim or bool(_DNS_1123.match(shape.volume_claim)),
        f"volume_claim is {quoted(shape.volume_claim)}, expected the name of a "
        f"PersistentVolumeClaim, e.g. tfdist-shared",
    )
    require(
        not shape.bucket
        or bool(re.match(r"^(gs|s3)://[a-z0-9][-_.a-z0-9]*(/\S*)?$", shape.bucket)),
        f"bucket is {quoted(shape.bucket)}, expected gs://BUCKET[/PREFIX] or s3://BUCKET[/PREFIX]",
    )
    require(
        shape.mount_path.startswith("/") and ".." not in shape.mount_path.split("/"),
        f"mount_path is {quoted(shape.mount_path)}, expected an absolute path without "
        f"'..', e.g. {DEFAULT_MOUNT_PATH}",
    )
    for pair in shape.node_selector:
        require(
            pair.count("=") == 1 and all(pair.split("=")),
            f"node_selector has {quoted(pair)}, expected key=value, e.g. "
            f"cloud.google.com/gke-accelerator=nvidia-l4",
        )
    where = "in trainer_args (after --)"
    passed = task_flags.parse_trainer_args(shape.trainer_args, where=where)
    for option, field in _SET_BY_SHAPE.items():
        require(
            option not in passed,
            f"trainer_args set --{option}={quoted(passed.get(option))}, which the job shape "
            f"sets; expected the shape's field instead ({field})",
        )
    task_flags.check_trainer_args(shape.trainer_args, where=where)
    _check_roles(shape)


# The trainer's options the manifest sets from the shape, to the shape's field.
_SET_BY_SHAPE = {
    "strategy": "strategy",
    "model_dir": "volume_claim or bucket",
    "backup_dir": "volume_claim or bucket",
    "backup_every_steps": "backup_every_steps",
    "preemption_grace_seconds": "termination_grace_seconds",
}


# What this command calls the roles' counts: job-config keys, and flags with `--`.
ROLE_NAMES = cluster_lib.RoleNames(
    strategy="strategy",
    chief="chief",
    worker="workers",
    ps="parameter_servers",
    evaluator="evaluators",
)


def _check_roles(shape: TFJobShape) -> None:
    """The trainer's rule of roles per strategy (`check_cluster_for_strategy`) on the replicas."""
    cluster = cluster_lib.cluster_of_shape(
        chief=shape.chief,
        workers=shape.workers,
        ps=shape.parameter_servers,
        evaluators=shape.evaluators,
        source="the job shape",
    )
    cluster_lib.check_cluster_for_strategy(cluster, shape.strategy, ROLE_NAMES)


_TYPE_NAMES = {
    str: "a string",
    bool: "true or false",
    int: "a whole number",
    tuple[str, ...]: "a list of strings (or one comma-separated string)",
    list[str]: "a list of strings",
}


def check_type(name: str, value, expected) -> None:
    """A job-config value of its field's JSON type (never coerced: `5` is no name)."""
    if expected == list[str]:
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    elif expected == tuple[str, ...]:
        ok = isinstance(value, str) or (
            isinstance(value, tuple) and all(isinstance(item, str) for item in value)
        )
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    require(ok, f"{name} is {quoted(value)}, expected {_TYPE_NAMES[expected]}")


def shape_from_options(values: dict) -> TFJobShape:
    """A shape from `--job_config` keys and flag values (JSON types)."""
    unknown = sorted(set(values) - set(TFJobShape.field_names()))
    if unknown:
        raise UsageError(
            f"unknown job shape key(s) {', '.join(unknown)}, expected names "
            f"from: {', '.join(TFJobShape.field_names())}"
        )
    values = dict(values)
    for field in ("trainer_args", "node_selector"):
        if isinstance(values.get(field), list):
            values[field] = tuple(values[field])
    for field in dataclasses.fields(TFJobShape):
        if field.name in values:
            check_type(field.name, values[field.name], field.type)
    for field in ("name", "image"):
        values.setdefault(field, "")
    return TFJobShape(**values)
