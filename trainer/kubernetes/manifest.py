"""`build_tfjob(shape)`: the TFJob (kubeflow.org/v1) a `TFJobShape` describes.

Every replica runs the same command, `python -m trainer.task --strategy=...`,
in a container named `tensorflow` (the operator requires that name and reads
the port named `tfjob-port`). The operator writes each pod's `TF_CONFIG` with
lower-case roles (`chief`, `worker`, `ps`, `evaluator`), which tfdist reads.
"""

from trainer.kubernetes.shape import TFJobShape
from trainer.submission import crash_loop_guard_args

API_VERSION = "kubeflow.org/v1"
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"
PORT = 2222
_VOLUME = "tfdist-shared"


def trainer_command(shape: TFJobShape) -> list[str]:
    """The command of every replica."""
    root = shape.output_root
    return [
        "python",
        "-m",
        "trainer.task",
        f"--strategy={shape.strategy}",
        f"--model_dir={root}/model",
        f"--backup_dir={root}/backup",
        f"--backup_every_steps={shape.backup_every_steps}",
        f"--preemption_grace_seconds={shape.termination_grace_seconds - 5}",
        *crash_loop_guard_args(shape.trainer_args),
        *shape.trainer_args,
    ]


def _resources(cpu: str, memory: str, gpus: int, gpu_resource: str) -> dict:
    amounts = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[gpu_resource] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def pod_template(shape: TFJobShape, replica_type: str) -> dict:
    """The pod of a replica type (`Chief`, `Worker`, `PS`, `Evaluator`): the trainer's container."""
    if replica_type == "PS":
        resources = _resources(shape.ps_cpu, shape.ps_memory, 0, shape.gpu_resource)
    else:
        gpus = shape.gpus if replica_type in ("Chief", "Worker") else 0
        resources = _resources(shape.cpu, shape.memory, gpus, shape.gpu_resource)
    container = {
        "name": CONTAINER_NAME,
        "image": shape.image,
        "command": trainer_command(shape),
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        "resources": resources,
    }
    spec = {
        "containers": [container],
        "terminationGracePeriodSeconds": shape.termination_grace_seconds,
    }
    if shape.volume_claim:
        container["volumeMounts"] = [{"name": _VOLUME, "mountPath": shape.mount_path}]
        spec["volumes"] = [
            {"name": _VOLUME, "persistentVolumeClaim": {"claimName": shape.volume_claim}}
        ]
    if shape.service_account:
        spec["serviceAccountName"] = shape.service_account
    if shape.node_selector:
        spec["nodeSelector"] = dict(pair.split("=", 1) for pair in shape.node_selector)
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": "tfdist", "tfdist/job": shape.name}},
        "spec": spec,
    }


def build_tfjob(shape: TFJobShape) -> dict:
    """The TFJob manifest, as `kubectl apply -f` takes it (JSON or YAML)."""
    metadata = {"name": shape.name, "labels": {"app.kubernetes.io/name": "tfdist"}}
    if shape.namespace:
        metadata["namespace"] = shape.namespace
    replica_specs = {
        replica_type: {
            "replicas": count,
            "restartPolicy": shape.restart_policy,
            "template": pod_template(shape, replica_type),
        }
        for replica_type, count in shape.replica_counts.items()
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {
            "runPolicy": {
                "cleanPodPolicy": shape.clean_pod_policy,
                "backoffLimit": shape.backoff_limit,
            },
            "tfReplicaSpecs": replica_specs,
        },
    }
