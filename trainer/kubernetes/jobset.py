"""The JobSet (jobset.x-k8s.io/v1alpha2) and Kubeflow Trainer v2 objects a job shape describes.

One replicated job per tfdist role (`chief`, `worker`, `ps`, `evaluator`),
each one Indexed Job of as many pods as the role has tasks. No operator
writes `TF_CONFIG` here: every pod resolves its cluster itself from JobSet's
stable DNS names (`tfdist.distribute.cluster`, `TFDIST_JOBSET`), with its
JobSet's name, its replicated job and job index from JobSet's labels
(downward API) and `JOB_COMPLETION_INDEX` from Kubernetes.

Restarts are counted, which TFJob's `ExitCode` policy cannot do
(kubeflow/trainer#2045): a pod that exits with one of tfdist's retryable codes
(137, 143, 200, 201) fails its Job, and the JobSet restarts every Job, at most
`backoff_limit` times (`failurePolicy.maxRestarts`); any other failure
(2 usage, 3 non-finite, 1 a crash) fails its Job through the Job's
`podFailurePolicy`, and the JobSet fails at once (`FailJobSet` on reason
`PodFailurePolicy`). The job succeeds when the chief (or, without one, every
worker) has succeeded.

Trainer v2 (v2.3.0) has no TensorFlow runtime; `build_trainer_v2` wraps the
same JobSet spec in a `TrainingRuntime` without an ML policy and a `TrainJob`
that names it. Trainer v2 names the JobSet after the TrainJob, which the pods
read from the label, so the runtime serves any TrainJob name.
"""

import json

from tfdist import cli
from tfdist._internal.preconditions import quoted, require
from tfdist.distribute import cluster as cluster_lib
from trainer.kubernetes import manifest
from trainer.kubernetes.shape import TFJobShape

API_VERSION = "jobset.x-k8s.io/v1alpha2"
TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
_ROLES = {"Chief": "chief", "Worker": "worker", "PS": "ps", "Evaluator": "evaluator"}
_LABELS = {
    cluster_lib.JOBSET_NAME: "jobset.sigs.k8s.io/jobset-name",
    cluster_lib.JOBSET_REPLICATED_JOB: "jobset.sigs.k8s.io/replicatedjob-name",
    cluster_lib.JOBSET_JOB_INDEX: "jobset.sigs.k8s.io/job-index",
}
PERMANENT_FAILURE_RULE = "tfdist_permanent_exit_code"
_RUNTIME_SUFFIX = "-runtime"


def check_names(shape: TFJobShape, api: str) -> None:
    """Refuses a name whose pods' hostnames (or the runtime's name) exceed 63 characters.

    Raises:
        UsageError: The longest pod hostname, `<name>-<role>-0-<index>`, or the
            Trainer v2 runtime's name would not be a DNS label.
    """
    longest = max(len(f"{shape.name}-{role}-0-{pods - 1}") for role, pods in roles(shape).items())
    if api == "trainjob":
        longest = max(longest, len(shape.name + _RUNTIME_SUFFIX))
    require(
        longest <= 63,
        f"name is {quoted(shape.name)} ({len(shape.name)} characters), which makes "
        f"{longest}-character pod names under --api={api}; expected at most 63 "
        f"(a DNS label): use a name of at most {len(shape.name) - (longest - 63)} characters",
    )


def roles(shape: TFJobShape) -> dict[str, int]:
    """tfdist role (the replicated job's name) to its number of pods."""
    return {_ROLES[kind]: count for kind, count in shape.replica_counts.items()}


def jobset_env(shape: TFJobShape) -> list[dict]:
    """The env entries every pod resolves its cluster from."""
    layout = {
        "replicatedJobs": {role: {"jobs": 1, "pods": pods} for role, pods in roles(shape).items()},
        "port": manifest.PORT,
    }
    env = [{"name": cluster_lib.JOBSET, "value": json.dumps(layout, sort_keys=True)}]
    env.extend(
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
        for name, label in _LABELS.items()
    )
    return env


def _job_template(shape: TFJobShape, kind: str, pods: int) -> dict:
    pod = manifest.pod_template(shape, kind)
    pod["spec"]["restartPolicy"] = "Never"  # the JobSet restarts, counted
    (container,) = pod["spec"]["containers"]
    container["env"] = [*container.get("env", []), *jobset_env(shape)]
    return {
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": manifest.CONTAINER_NAME,
                            "operator": "NotIn",
                            "values": sorted(cli.RETRYABLE_EXIT_CODES),
                        },
                    }
                ]
            },
            "template": pod,
        }
    }


def jobset_spec(shape: TFJobShape) -> dict:
    """The JobSet's `spec`: replicated jobs, network, counted restarts, success."""
    replicated = [
        {"name": _ROLES[kind], "replicas": 1, "template": _job_template(shape, kind, count)}
        for kind, count in shape.replica_counts.items()
    ]
    finishers = ["chief"] if shape.chief else ["worker"]
    return {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": {
            "maxRestarts": shape.backoff_limit,
            "rules": [
                {
                    "name": PERMANENT_FAILURE_RULE,
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
        },
        "successPolicy": {"operator": "All", "targetReplicatedJobs": finishers},
        "replicatedJobs": replicated,
    }


def _metadata(shape: TFJobShape, name: str) -> dict:
    metadata = {"name": name, "labels": {"app.kubernetes.io/name": "tfdist"}}
    if shape.namespace:
        metadata["namespace"] = shape.namespace
    return metadata


def build_jobset(shape: TFJobShape) -> dict:
    """The JobSet manifest, as `kubectl apply -f` takes it."""
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(shape, shape.name),
        "spec": jobset_spec(shape),
    }


def build_trainer_v2(shape: TFJobShape) -> dict:
    """A `List` of a Trainer v2 `TrainingRuntime` and the `TrainJob` that runs it."""
    runtime_name = shape.name + _RUNTIME_SUFFIX
    runtime = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": _metadata(shape, runtime_name),
        "spec": {"template": {"spec": jobset_spec(shape)}},
    }
    train_job = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainJob",
        "metadata": _metadata(shape, shape.name),
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainingRuntime",
                "name": runtime_name,
            }
        },
    }
    return {"apiVersion": "v1", "kind": "List", "items": [runtime, train_job]}
