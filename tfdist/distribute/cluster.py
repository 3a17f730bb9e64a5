"""Reads the cluster from `TF_CONFIG`, Vertex AI's `CLUSTER_SPEC`, or a JobSet pod's names.

A pod of a JobSet (Kubernetes, also what Kubeflow Trainer v2 runs) that
`python -m trainer.kubernetes --api=jobset` wrote gets no `TF_CONFIG`: its
cluster follows from JobSet's stable pod names,
`<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`, with one
replicated job per role (`chief`, `worker`, `ps`, `evaluator`). The pod
template carries `TFDIST_JOBSET` (the roles' job and pod counts, the port),
and the downward API gives the pod its JobSet's name, its replicated job and
job index (JobSet's labels); Kubernetes sets `JOB_COMPLETION_INDEX`.

A pure module: it does not import TensorFlow, so flag validation and job
building can use it without paying for TensorFlow's import.

Both variables can carry the whole job specification, which may hold secrets,
so no error message or log line here ever repeats them verbatim: messages quote
only the single field that was wrong.
"""

import dataclasses
import ipaddress
import logging
import re
import types
from typing import Mapping

from tfdist._internal.json_input import load_json
from tfdist._internal.preconditions import check_whole_number, quoted
from tfdist.errors import ClusterConfigError, UsageError

__all__ = [
    "CHIEF",
    "WORKER",
    "PS",
    "EVALUATOR",
    "HAS_EVALUATOR",
    "ROLES",
    "TF_CONFIG",
    "CLUSTER_SPEC",
    "JOBSET",
    "JOBSET_NAME",
    "JOBSET_REPLICATED_JOB",
    "JOBSET_JOB_INDEX",
    "JOB_COMPLETION_INDEX",
    "POOL2_ROLE",
    "POOL2_PARAMETER_SERVERS",
    "POOL2_REDUCTION_SERVER",
    "POOL2_ROLES",
    "VERTEX_POOLS",
    "Cluster",
    "resolve_cluster",
    "pool2_is_reduction_server",
    "resolve_cluster_for_strategy",
    "jobset_hosts",
    "check_cluster_for_strategy",
    "cluster_of_shape",
    "RoleNames",
    "CLUSTER_TASKS",
    "ONE_PROCESS_STRATEGIES",
    "has_evaluator",
    "is_loopback_host",
]

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
# Set to "1" by `tfdist.launch --evaluator` for every task: TF_CONFIG leaves
# the evaluator out of the training tasks' cluster, so this is how the chief
# learns that someone will read its evaluation checkpoints.
HAS_EVALUATOR = "TFDIST_HAS_EVALUATOR"
ROLES = (CHIEF, WORKER, PS, EVALUATOR)

TF_CONFIG = "TF_CONFIG"
CLUSTER_SPEC = "CLUSTER_SPEC"
# A JobSet pod's cluster (module docstring): the shape, then what the downward API
# and Kubernetes give each pod.
JOBSET = "TFDIST_JOBSET"
JOBSET_NAME = "TFDIST_JOBSET_NAME"
JOBSET_REPLICATED_JOB = "TFDIST_JOBSET_REPLICATED_JOB"
JOBSET_JOB_INDEX = "TFDIST_JOBSET_JOB_INDEX"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Set by `trainer.submit` on every replica that runs our code, when the job has
# a worker pool 2: what that pool runs. `pool2_is_reduction_server` reads it.
POOL2_ROLE = "TFDIST_POOL2_ROLE"
POOL2_PARAMETER_SERVERS = "parameter_server"
POOL2_REDUCTION_SERVER = "reduction_server"
POOL2_ROLES = (POOL2_PARAMETER_SERVERS, POOL2_REDUCTION_SERVER)
# Vertex's Reduction Server image path ends in this name (any registry mirror).
_REDUCTION_SERVER_IMAGE = re.compile(r"/reductionserver(?::[^/]*)?(?:@sha256:[0-9a-f]+)?$")

# Vertex AI worker pools, in order: primary replica, workers, parameter
# servers (or Reduction Server), evaluators.
VERTEX_POOLS = ("workerpool0", "workerpool1", "workerpool2", "workerpool3")
_POOL_ROLES = {
    "workerpool0": CHIEF,
    "workerpool1": WORKER,
    "workerpool2": PS,
    "workerpool3": EVALUATOR,
}

# A host name (DNS labels, as Kubernetes and Vertex AI name pods) or an IPv4 address.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?")

_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'
)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """An immutable description of the cluster and of this task's place in it.

    Attributes:
        task_type: `"chief"`, `"worker"`, `"ps"` or `"evaluator"`; `None` when
            no cluster variable is set (a single process).
        task_index: Index of this task among the tasks of its type.
        addresses: Role name to the `host:port` addresses of its tasks. Roles
            without tasks are absent.
        source: Where the description came from: `"TF_CONFIG"`,
            `"CLUSTER_SPEC"`, `"TFDIST_JOBSET"` or `"none"`.
        num_reduction_servers: Replicas of a Reduction Server pool. They run
            Vertex's reducer, not our code, and are not part of `addresses`.
    """

    task_type: str | None = None
    task_index: int = 0
    addresses: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    source: str = "none"
    num_reduction_servers: int = 0

    def __post_init__(self):
        frozen = {role: tuple(hosts) for role, hosts in self.addresses.items() if hosts}
        object.__setattr__(self, "addresses", types.MappingProxyType(frozen))

    def count(self, role: str) -> int:
        """Number of tasks of `role` in the cluster."""
        return len(self.addresses.get(role, ()))

    @property
    def is_distributed(self) -> bool:
        """Whether any task besides this process is described."""
        return self.task_type is not None

    @property
    def num_workers(self) -> int:
        """Tasks that train in a synchronous job: the chief plus the workers.

        A single process counts as one worker.
        """
        if not self.is_distributed:
            return 1
        return self.count(CHIEF) + self.count(WORKER)

    @property
    def num_ps(self) -> int:
        return self.count(PS)

    @property
    def is_chief(self) -> bool:
        """Whether this task writes the job's outputs.

        The chief task if there is one, else worker 0, else a single process.
        """
        if self.task_type is None:
            return True
        if self.task_type == CHIEF:
            return True
        return self.task_type == WORKER and self.task_index == 0 and not self.count(CHIEF)

    @property
    def task_address(self) -> str | None:
        """This task's own `host:port`, when the cluster lists it."""
        hosts = self.addresses.get(self.task_type or "", ())
        return hosts[self.task_index] if self.task_index < len(hosts) else None

    def cluster_dict(self) -> dict[str, list[str]]:
        """The cluster as `tf.train.ClusterSpec` accepts it."""
        return {role: list(hosts) for role, hosts in self.addresses.items()}

    def tf_config(self) -> dict:
        """This task's `TF_CONFIG`, as TensorFlow reads it."""
        return {
            "cluster": self.cluster_dict(),
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def describe(self) -> str:
        """A one-line summary safe to log: roles, counts and this task."""
        if not self.is_distributed:
            return "single process (no TF_CONFIG or CLUSTER_SPEC)"
        counts = ", ".join(f"{role}={self.count(role)}" for role in ROLES if self.count(role))
        extra = (
            f", reduction_server={self.num_reduction_servers}" if self.num_reduction_servers else ""
        )
        return (
            f"task {self.task_type}:{self.task_index} of cluster "
            f"[{counts}{extra}] from {self.source}"
        )


def resolve_cluster(
    environ: Mapping[str, str], *, pool2_is_reduction_server: bool = False
) -> Cluster:
    """Reads the cluster from `TF_CONFIG`, `CLUSTER_SPEC` or `TFDIST_JOBSET` in `environ`.

    When both are set, `TF_CONFIG` wins: TensorFlow's own cluster resolvers read
    it, so tfdist and TensorFlow then agree on the cluster. Vertex AI sets both
    for TensorFlow jobs, describing the same cluster. `TFDIST_JOBSET` (a JobSet
    pod, module docstring) is read only when neither is set.

    Args:
        environ: The environment, usually `os.environ`.
        pool2_is_reduction_server: Whether Vertex's worker pool 2 runs Reduction
            Server (which runs no task of ours) rather than parameter servers.
            Read for `CLUSTER_SPEC`, and for a `TF_CONFIG` set beside it (a
            Vertex job), whose "ps" tasks are then the reducers.

    Returns:
        The cluster, or a single-process `Cluster` when neither is set.

    Raises:
        ClusterConfigError: The variable is malformed; the message names the
            field, the value, what was expected and how to fix it.
    """
    tf_config = (environ.get(TF_CONFIG) or "").strip()
    cluster_spec = (environ.get(CLUSTER_SPEC) or "").strip()
    if tf_config:
        if not cluster_spec:
            return _parse_tf_config(tf_config)
        _log.info(
            "Both TF_CONFIG and CLUSTER_SPEC are set; using TF_CONFIG because "
            "TensorFlow's own resolvers read it."
        )
        cluster = _parse_tf_config(tf_config)
        if pool2_is_reduction_server and cluster.num_ps:
            # Vertex may list a Reduction Server pool as "ps" in TF_CONFIG; it runs
            # Vertex's reducer, not a parameter server of ours.
            addresses = {role: hosts for role, hosts in cluster.addresses.items() if role != PS}
            return dataclasses.replace(
                cluster, addresses=addresses, num_reduction_servers=cluster.num_ps
            )
        return cluster
    if cluster_spec:
        return _parse_cluster_spec(cluster_spec, pool2_is_reduction_server)
    jobset = (environ.get(JOBSET) or "").strip()
    if jobset:
        return _parse_jobset(jobset, environ)
    return Cluster()


def pool2_is_reduction_server(environ: Mapping[str, str], strategy: str) -> bool:
    """The one policy for what Vertex AI's worker pool 2 runs, for every entry point.

    Pool 2 holds either parameter servers (our trainer) or Vertex's Reduction
    Server (not our code). Every replica must reach the same answer, so the
    policy looks, in order, at:

    1. `TFDIST_POOL2_ROLE` (`parameter_server` or `reduction_server`), which
       `python -m trainer.submit` sets on every replica that runs our code;
    2. the strategy asked for: `parameter_server` means parameter servers, any
       other named strategy means Reduction Server (the only other use of
       pool 2 with our trainer);
    3. for `auto`: this replica itself running in pool 2 (so pool 2 runs our
       code), else the job spec Vertex passes in `CLUSTER_SPEC["job"]`
       (pool 2's image is Vertex's `reductionserver` or something else).

    When none of these decides, `auto` would be a guess that trains as the
    wrong strategy, so it is refused.

    Args:
        environ: The environment, usually `os.environ`.
        strategy: The strategy name the user asked for (`auto` included).

    Returns:
        The `pool2_is_reduction_server` argument of `resolve_cluster`.

    Raises:
        ClusterConfigError: `TFDIST_POOL2_ROLE` has another value, or `auto`
            cannot tell what pool 2 runs.
    """
    strategy = str(strategy).strip().lower()
    role = (environ.get(POOL2_ROLE) or "").strip().lower()
    if role:
        if role not in POOL2_ROLES:
            raise ClusterConfigError(
                f"{POOL2_ROLE} is {role[:40]!r}, expected {' or '.join(POOL2_ROLES)}; "
                f"fix or unset it (trainer.submit sets it)"
            )
        return role == POOL2_REDUCTION_SERVER
    if strategy == "parameter_server":
        return False
    if strategy != "auto":
        return True
    spec = _json_or_none(environ.get(CLUSTER_SPEC))
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not isinstance(cluster.get("workerpool2"), list):
        return True  # No pool 2 (or no CLUSTER_SPEC, or one resolve_cluster refuses).
    if not cluster["workerpool2"]:
        return True
    task = spec.get("task") if isinstance(spec.get("task"), dict) else {}
    tf_task = _json_or_none(environ.get(TF_CONFIG)) or {}
    tf_task = tf_task.get("task") if isinstance(tf_task, dict) else None
    if task.get("type") == "workerpool2" or (
        isinstance(tf_task, dict) and tf_task.get("type") == PS
    ):
        return False  # This replica runs our code in pool 2: a parameter server.
    from_job = _pool2_image_is_reduction_server(spec.get("job"))
    if from_job is not None:
        return from_job
    raise ClusterConfigError(
        f"--strategy=auto found {len(cluster['workerpool2'])} replica(s) in CLUSTER_SPEC's "
        f"workerpool2 and nothing saying whether they are parameter servers or Reduction "
        f"Server, expected {POOL2_ROLE}=parameter_server or reduction_server (trainer.submit "
        f"sets it); pass --strategy=parameter_server or --strategy=multiworker"
    )


def resolve_cluster_for_strategy(environ: Mapping[str, str], strategy: str) -> Cluster:
    """`resolve_cluster` with pool 2 read by `pool2_is_reduction_server`."""
    return resolve_cluster(
        environ, pool2_is_reduction_server=pool2_is_reduction_server(environ, strategy)
    )


def _json_or_none(text):
    try:
        return load_json(text, source="variable") if text and text.strip() else None
    except UsageError:
        return None  # resolve_cluster reports malformed variables.


def _pool2_image_is_reduction_server(job) -> bool | None:
    """From Vertex's job spec in CLUSTER_SPEC: whether pool 2 runs Reduction Server."""
    if not isinstance(job, dict):
        return None
    pools = job.get("worker_pool_specs", job.get("workerPoolSpecs"))
    if not isinstance(pools, list) or len(pools) < 3 or not isinstance(pools[2], dict):
        return None
    pool = pools[2]
    if isinstance(pool.get("python_package_spec", pool.get("pythonPackageSpec")), dict):
        return False
    container = pool.get("container_spec", pool.get("containerSpec"))
    image = (
        container.get("image_uri", container.get("imageUri"))
        if isinstance(container, dict)
        else None
    )
    if not isinstance(image, str) or not image:
        return None
    return bool(_REDUCTION_SERVER_IMAGE.search(image))


def _load_json_object(text: str, variable: str) -> dict:
    value = load_json(
        text,
        source=variable,
        error=ClusterConfigError,
        hint=f"expected a JSON object such as {_TF_CONFIG_EXAMPLE}; fix the variable or "
        f"unset it to train in one process",
    )
    if not isinstance(value, dict):
        raise ClusterConfigError(
            f"{variable} holds a JSON {type(value).__name__}, expected a JSON object "
            f"with 'cluster' and 'task' keys such as {_TF_CONFIG_EXAMPLE}"
        )
    return value


def _require_mapping(parent: dict, key: str, variable: str) -> dict:
    value = parent.get(key)
    if not isinstance(value, dict):
        found = "missing" if value is None else f"a {type(value).__name__}"
        raise ClusterConfigError(
            f"{variable}['{key}'] is {found}, expected a JSON object; see {_TF_CONFIG_EXAMPLE}"
        )
    return value


def _check_index(value, field: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        value = int(value)
    return check_whole_number(
        field,
        value,
        minimum=0,
        error=ClusterConfigError,
        hint="set it to the task's position in its role's address list",
    )


def _valid_host(host: str) -> bool:
    """A host name or IPv4 address, or an IPv6 address in brackets."""
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return bool(_HOST.fullmatch(host))


def _check_address(address, field: str) -> str:
    if not isinstance(address, str):
        raise ClusterConfigError(
            f"{field} is {quoted(address)}, expected a 'host:port' string such as 'localhost:2222'"
        )
    host, sep, port = address.rpartition(":")
    if address.startswith("[") and "]" in address:
        host = address[: address.index("]") + 1]
        sep, port = (
            (":", address[len(host) + 1 :]) if address[len(host) :].startswith(":") else ("", "")
        )
    if not sep or not host or not port or not _valid_host(host):
        raise ClusterConfigError(
            f"{field} is {quoted(address)}, expected 'host:port' such as 'localhost:2222' "
            f"(a host name or IPv4 address, IPv6 as '[::1]:2222'); add the port the task "
            f"listens on"
        )
    if not re.fullmatch(r"[0-9]+", port) or not 1 <= int(port) <= 65535:
        raise ClusterConfigError(
            f"{field} has port {quoted(port)} in {quoted(address)}, expected a port from 1 to 65535"
        )
    return address


def _check_addresses(hosts, field: str) -> tuple[str, ...]:
    if not isinstance(hosts, list):
        raise ClusterConfigError(
            f"{field} is a {type(hosts).__name__}, expected a list of 'host:port' strings"
        )
    return tuple(_check_address(host, f"{field}[{i}]") for i, host in enumerate(hosts))


def _check_unique(addresses: Mapping[str, tuple[str, ...]], variable: str) -> None:
    seen: dict[str, str] = {}
    for role, hosts in addresses.items():
        for index, host in enumerate(hosts):
            here = f"{role}[{index}]"
            if host in seen:
                raise ClusterConfigError(
                    f"{variable} lists address {host!r} for both {seen[host]} and {here}, "
                    f"expected one address per task; give each task its own port"
                )
            seen[host] = here


def _check_task(task_type: str, task_index: int, addresses, variable: str) -> None:
    hosts = addresses.get(task_type, ())
    # TensorFlow's evaluator is allowed outside the cluster it evaluates.
    if task_type == EVALUATOR and not hosts:
        return
    if task_index >= len(hosts):
        raise ClusterConfigError(
            f"{variable}['task']['index'] is {task_index} but the cluster lists "
            f"{len(hosts)} '{task_type}' task(s), expected an index from 0 to "
            f"{max(len(hosts) - 1, 0)}; fix the index or add the task's address"
        )


def _parse_tf_config(text: str) -> Cluster:
    config = _load_json_object(text, TF_CONFIG)
    raw_cluster = _require_mapping(config, "cluster", TF_CONFIG)
    addresses = {}
    for role, hosts in raw_cluster.items():
        if role not in ROLES:
            raise ClusterConfigError(
                f"TF_CONFIG['cluster'] has unknown role {role!r}, expected one of "
                f"{', '.join(ROLES)}; rename it (the legacy 'master' is 'chief')"
            )
        addresses[role] = _check_addresses(hosts, f"TF_CONFIG['cluster']['{role}']")
    if len(addresses.get(CHIEF, ())) > 1:
        raise ClusterConfigError(
            f"TF_CONFIG lists {len(addresses[CHIEF])} chief tasks, expected at most 1; "
            f"make the others 'worker' tasks"
        )
    _check_unique(addresses, TF_CONFIG)
    task = _require_mapping(config, "task", TF_CONFIG)
    task_type = task.get("type")
    if not isinstance(task_type, str) or task_type not in ROLES:
        raise ClusterConfigError(
            f"TF_CONFIG['task']['type'] is {task_type!r}, expected one of {', '.join(ROLES)}"
        )
    task_index = _check_index(task.get("index", 0), "TF_CONFIG['task']['index']")
    _check_task(task_type, task_index, addresses, TF_CONFIG)
    return Cluster(
        task_type=task_type, task_index=task_index, addresses=addresses, source=TF_CONFIG
    )


def _parse_cluster_spec(text: str, pool2_is_reduction_server: bool) -> Cluster:
    spec = _load_json_object(text, CLUSTER_SPEC)
    raw_cluster = _require_mapping(spec, "cluster", CLUSTER_SPEC)
    pools = {}
    for pool, hosts in raw_cluster.items():
        if pool not in _POOL_ROLES:
            raise ClusterConfigError(
                f"CLUSTER_SPEC['cluster'] has unknown pool {pool!r}, expected one of "
                f"{', '.join(VERTEX_POOLS)}"
            )
        pools[pool] = _check_addresses(hosts, f"CLUSTER_SPEC['cluster']['{pool}']")
    if len(pools.get("workerpool0", ())) != 1:
        raise ClusterConfigError(
            f"CLUSTER_SPEC['cluster']['workerpool0'] lists "
            f"{len(pools.get('workerpool0', ()))} replicas, expected exactly 1 primary "
            f"replica; set replica_count=1 on worker pool 0"
        )
    num_reduction_servers = 0
    if pool2_is_reduction_server:
        num_reduction_servers = len(pools.pop("workerpool2", ()))
    addresses = {_POOL_ROLES[pool]: hosts for pool, hosts in pools.items()}
    _check_unique(addresses, CLUSTER_SPEC)
    task = _require_mapping(spec, "task", CLUSTER_SPEC)
    pool = task.get("type")
    if not isinstance(pool, str) or pool not in _POOL_ROLES:
        raise ClusterConfigError(
            f"CLUSTER_SPEC['task']['type'] is {pool!r}, expected one of {', '.join(VERTEX_POOLS)}"
        )
    if pool == "workerpool2" and pool2_is_reduction_server:
        raise ClusterConfigError(
            "CLUSTER_SPEC['task']['type'] is 'workerpool2', which runs Reduction Server "
            "in this job, expected our trainer only in pools 0, 1 and 3; run the "
            "Reduction Server image in pool 2"
        )
    task_type = _POOL_ROLES[pool]
    task_index = _check_index(task.get("index", 0), "CLUSTER_SPEC['task']['index']")
    _check_task(task_type, task_index, addresses, CLUSTER_SPEC)
    return Cluster(
        task_type=task_type,
        task_index=task_index,
        addresses=addresses,
        source=CLUSTER_SPEC,
        num_reduction_servers=num_reduction_servers,
    )


def _jobset_field(environ: Mapping[str, str], name: str, expected: str) -> str:
    value = (environ.get(name) or "").strip()
    if not value:
        raise ClusterConfigError(
            f"{JOBSET} is set but {name} is not, expected {expected}; give the pod "
            f"the env entries python -m trainer.kubernetes --api=jobset writes"
        )
    return value


def _bounded_count(field: str, value, maximum: int) -> int:
    check_whole_number(field, value, error=ClusterConfigError)
    if value > maximum:
        raise ClusterConfigError(f"{field} is {value}, expected at most {maximum}")
    return value


def jobset_hosts(
    jobset_name: str, role: str, *, jobs: int, pods: int, subdomain: str, port: int
) -> tuple[str, ...]:
    """The addresses of one role's pods: JobSet's stable DNS names, job by job."""
    return tuple(
        f"{jobset_name}-{role}-{job}-{pod}.{subdomain}:{port}"
        for job in range(jobs)
        for pod in range(pods)
    )


def _parse_jobset(text: str, environ: Mapping[str, str]) -> Cluster:
    shape = _load_json_object(text, JOBSET)
    roles = _require_mapping(shape, "replicatedJobs", JOBSET)
    port = _bounded_count(f"{JOBSET}['port']", shape.get("port", 2222), 65535)
    name = _jobset_field(environ, JOBSET_NAME, "the JobSet's name (its jobset-name label)")
    subdomain = shape.get("subdomain") or name
    for field, value in (("the JobSet's name", name), (f"{JOBSET}['subdomain']", subdomain)):
        if not isinstance(value, str) or not _DNS_LABEL.match(value):
            raise ClusterConfigError(
                f"{field} is {value!r}, expected a DNS label (lowercase letters, digits, '-')"
            )
    addresses = {}
    for role, counts in roles.items():
        if role not in ROLES:
            raise ClusterConfigError(
                f"{JOBSET}['replicatedJobs'] has {role!r}, expected replicated jobs named "
                f"after tfdist's roles: {', '.join(ROLES)}"
            )
        field = f"{JOBSET}['replicatedJobs']['{role}']"
        if not isinstance(counts, dict):
            raise ClusterConfigError(f"{field} is {counts!r}, expected {{'jobs': J, 'pods': P}}")
        jobs, pods = (
            _bounded_count(f"{field}['{key}']", counts.get(key, 1), 10_000)
            for key in ("jobs", "pods")
        )
        addresses[role] = jobset_hosts(
            name, role, jobs=jobs, pods=pods, subdomain=subdomain, port=port
        )
    if len(addresses.get(CHIEF, ())) > 1:
        raise ClusterConfigError(
            f"{JOBSET} gives the chief {len(addresses[CHIEF])} pods, expected 1 (one job of "
            f"one pod); make the others workers"
        )
    task_type = _jobset_field(environ, JOBSET_REPLICATED_JOB, "the pod's replicated job")
    if task_type not in addresses:
        raise ClusterConfigError(
            f"{JOBSET_REPLICATED_JOB} is {task_type!r}, expected one of the replicated jobs "
            f"{JOBSET} names: {', '.join(addresses)}"
        )
    job_index = _check_index(
        _jobset_field(environ, JOBSET_JOB_INDEX, "the pod's job index (its job-index label)"),
        JOBSET_JOB_INDEX,
    )
    pod_index = _check_index(
        _jobset_field(environ, JOB_COMPLETION_INDEX, "the pod's index (an Indexed Job sets it)"),
        JOB_COMPLETION_INDEX,
    )
    pods = roles[task_type].get("pods", 1)
    task_index = job_index * pods + pod_index
    if pod_index >= pods:
        raise ClusterConfigError(
            f"{JOB_COMPLETION_INDEX} is {pod_index}, expected below the {pods} pods of "
            f"replicated job {task_type!r} in {JOBSET}"
        )
    _check_task(task_type, task_index, addresses, JOBSET)
    return Cluster(task_type=task_type, task_index=task_index, addresses=addresses, source=JOBSET)


# Strategies that train in one process: each of several training tasks would train alone.
ONE_PROCESS_STRATEGIES = ("default", "one_device", "mirrored")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoleNames:
    """What a caller calls the strategy and each role's count, for `check_cluster_for_strategy`.

    Each rule's message names the caller's own options, so the user reads which
    of *their* flags to change. A role's name is shown as `NAME=COUNT` (the
    chief's as `NAME=true`/`false`: every submitter has a switch for it);
    `None` counts the role's tasks in the cluster's source instead (the
    trainer, reading `TF_CONFIG`); `""` means the caller gives no choice (Vertex
    AI's worker pool 0 is always the chief), so it is never shown.

    Attributes:
        strategy: The strategy's option, e.g. `--strategy`.
        chief: The chief's switch.
        worker: The workers' count.
        ps: The parameter servers' count.
        evaluator: The evaluators' count.
    """

    strategy: str = "--strategy"
    chief: str | None = None
    worker: str | None = None
    ps: str | None = None
    evaluator: str | None = None

    def name(self, role: str) -> str | None:
        return {CHIEF: self.chief, WORKER: self.worker, PS: self.ps, EVALUATOR: self.evaluator}[
            role
        ]

    def _value(self, role: str, count: int) -> str:
        return f"{self.name(role)}={('true' if count else 'false') if role == CHIEF else count}"

    def got(self, cluster: Cluster, roles: tuple[str, ...]) -> str:
        """How many tasks of each of `roles` the cluster has, in the caller's words."""
        named = [self._value(role, cluster.count(role)) for role in roles if self.name(role)]
        counted = [f"{cluster.count(role)} {role}" for role in roles if self.name(role) is None]
        if counted:
            named.append(f"{', '.join(counted)} task(s) in {cluster.source}")
        return ", ".join(named)

    def fix(self, cluster: Cluster, counts: Mapping[str, int]) -> str:
        """What to set (or add) so that each role of `counts` has that many tasks."""
        counts = {role: n for role, n in counts.items() if cluster.count(role) != n}
        named = [self._value(role, n) for role, n in counts.items() if self.name(role)]
        added = [role for role in counts if not self.name(role)]
        parts = [f"set {' and '.join(named)}"] if named else []
        if added:
            parts.append(f"add {' and '.join(added)} tasks to {cluster.source}")
        return " and ".join(parts)


# The trainer's names: it reads the cluster, so it counts tasks where they are listed.
CLUSTER_TASKS = RoleNames()


def cluster_of_shape(
    *, chief: bool | int, workers: int, ps: int = 0, evaluators: int = 0, source: str
) -> Cluster:
    """The cluster a submitter's job shape will give its tasks, for `check_cluster_for_strategy`.

    Addresses are placeholders (`chief-0.shape.invalid:2222`, ...): only the roles'
    counts matter. The cluster is seen from its first training task, the chief
    (else worker 0, named even when the shape has none, so that the check, not a
    missing task, reports it).

    Args:
        chief: Whether the job has a chief (or the number of chiefs, 0 or 1).
        workers: Worker tasks.
        ps: Parameter-server tasks (not Vertex AI's Reduction Server, which runs no
            task of ours).
        evaluators: Evaluator tasks.
        source: What described the shape, for messages (e.g. `the TFJob shape`).

    Returns:
        The cluster, with `source` as given.
    """
    counts = {CHIEF: int(chief), WORKER: workers, PS: ps, EVALUATOR: evaluators}
    addresses = {
        role: tuple(f"{role}-{index}.shape.invalid:2222" for index in range(count))
        for role, count in counts.items()
    }
    return Cluster(
        task_type=CHIEF if counts[CHIEF] else WORKER,
        task_index=0,
        addresses=addresses,
        source=source,
    )


def check_cluster_for_strategy(
    cluster: Cluster, strategy: str, names: RoleNames = CLUSTER_TASKS
) -> None:
    """Rejects clusters the named strategy cannot run on: the one rule of roles per strategy.

    The trainer calls it with the cluster it resolved; every submitter
    (`trainer.submit`, `trainer.kubernetes`, `trainer.ray`) with the cluster its
    job shape will give (`cluster_of_shape`) and its own flag names, so a shape
    a submitter accepts is one the trainer runs. The rules:

    - a cluster has a training task (a chief or a worker) and at most 1 evaluator;
    - `parameter_server` (and `auto` when there are ps tasks, which `auto` then
      picks) needs a chief to coordinate, at least 1 worker and at least 1 ps;
    - ps tasks only under `parameter_server` (or `auto`);
    - `default`, `one_device` and `mirrored` train in one process: one training task.

    Rules of one engine (Vertex AI's Reduction Server, TPU VMs) stay with its submitter.

    Args:
        cluster: The resolved cluster, or `cluster_of_shape`'s.
        strategy: A strategy name as `tfdist.distribute.choice.STRATEGIES` lists.
        names: What the caller calls the strategy and the roles' counts (`RoleNames`);
            by default, tasks counted in `cluster.source`.

    Raises:
        ClusterConfigError: The combination cannot run; one line naming the
            caller's options, their values and what to set.
    """
    if cluster.task_type == EVALUATOR:
        return  # It evaluates checkpoints on its own; its TF_CONFIG may list only itself.
    if not cluster.is_distributed:
        if strategy == "parameter_server":
            raise ClusterConfigError(
                "strategy 'parameter_server' needs a cluster, but neither TF_CONFIG nor "
                "CLUSTER_SPEC is set; expected a chief, workers and ps tasks; run under "
                "`python -m tfdist.launch --chief --workers 2 --ps 1 -- ...` or set TF_CONFIG"
            )
        return
    training = cluster.count(CHIEF) + cluster.count(WORKER)
    if not training:
        raise ClusterConfigError(
            f"the job has no training task, got {names.got(cluster, (CHIEF, WORKER))}, "
            f"expected a chief or at least 1 worker; {names.fix(cluster, {WORKER: 1})}"
        )
    if cluster.count(EVALUATOR) > 1:
        raise ClusterConfigError(
            f"the job has {names.got(cluster, (EVALUATOR,))}, expected 0 or 1: one evaluator "
            f"evaluates every checkpoint the chief writes; "
            + (
                names.fix(cluster, {EVALUATOR: 1})
                if names.evaluator
                else f"list one evaluator in {cluster.source}"
            )
        )
    shown = f"{names.strategy}={strategy}"
    if strategy == "parameter_server" or (strategy == "auto" and cluster.num_ps):
        if strategy == "auto":
            shown += " (which picks parameter_server for the ps tasks)"
        needed = {CHIEF: 1, WORKER: 1, PS: 1}
        missing = {role: count for role, count in needed.items() if not cluster.count(role)}
        if missing:
            raise ClusterConfigError(
                f"{shown} needs a chief to coordinate, at least 1 worker and at least 1 ps "
                f"task, got {names.got(cluster, tuple(needed))}; {names.fix(cluster, missing)}"
            )
        return
    if cluster.num_ps:
        raise ClusterConfigError(
            f"{shown} has no use for ps tasks, got {names.got(cluster, (PS,))}, expected none; "
            f"set {names.strategy}=parameter_server, or "
            + (f"{names.ps}=0" if names.ps else f"remove the ps tasks from {cluster.source}")
        )
    if strategy in ONE_PROCESS_STRATEGIES and training > 1:
        got = names.got(cluster, (CHIEF, WORKER))
        if names.worker is None:
            keep = f"list one training task in {cluster.source}"
        else:
            keep = names.fix(cluster, {WORKER: 0 if cluster.count(CHIEF) else 1})
        raise ClusterConfigError(
            f"{shown} trains in one process, got {got} ({training} training tasks), "
            f"expected 1; set {names.strategy}=multiworker for several, or {keep}"
        )


def has_evaluator(cluster: Cluster, environ: Mapping[str, str]) -> bool:
    """Whether the job has an evaluator task: listed in the cluster, or announced by the launcher."""
    return bool(cluster.addresses.get(EVALUATOR)) or environ.get(HAS_EVALUATOR) == "1"


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name, an IP address, or `[IPv6]`) names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
