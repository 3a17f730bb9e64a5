"""`check_tfjob(manifest)`: what the training operator (and tfdist) refuse in a TFJob.

The CRD's schema checks types only. The operator's admission webhook (training-
operator 1.9, `pkg/webhooks/tensorflow/tfjob_webhook.go`) also refuses a name that
is not a DNS-1035 label, more than one Chief/Master, a replica without
containers, a container without an image and replicas without a container named
`tensorflow`. tfdist refuses two shapes the operator accepts but whose
`TF_CONFIG` it cannot run: a `Master` replica (a `master` role) and
`enableDynamicWorker` (a sparse cluster spec). It also refuses a cleanPodPolicy
that deletes the evaluator before it evaluates (`Running` or `All`), and
unknown replica types.
Works on generated and on hand-written manifests (`--check=FILE`).

Beyond types, the CRD's schema has one pattern, Kubernetes' quantity (every
`resources` request and limit, `sizeLimit`, `divisor`), which `check_tfjob`
applies, and the API documents enums that the API server or the pod's creation
enforce: a replica's `restartPolicy` (Always, OnFailure, Never, ExitCode), a
pod's own (Always, OnFailure, Never), `cleanPodPolicy` (None, Running, All).
"""

import re

from tfdist.errors import UsageError

REPLICA_TYPES = ("Chief", "Worker", "PS", "Evaluator")
REPLICA_RESTART_POLICIES = ("ExitCode", "OnFailure", "Never", "Always")
POD_RESTART_POLICIES = ("Always", "OnFailure", "Never")
CLEAN_POD_POLICIES = ("None", "Running", "All")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes resource.Quantity, as the CRD's schema spells it (kubeflow.org_tfjobs.yaml, v1.9.0).
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_MAPS = ("requests", "limits", "overhead")
_QUANTITY_FIELDS = ("sizeLimit", "divisor")


def check_tfjob(manifest) -> None:
    """Raises `UsageError` (one line) for the first thing refused, else returns.

    Raises:
        UsageError: Naming the field, its value and what is expected.
    """
    if not isinstance(manifest, dict) or manifest.get("kind") != "TFJob":
        kind = manifest.get("kind") if isinstance(manifest, dict) else type(manifest).__name__
        raise UsageError(
            f"the manifest's kind is {kind!r}, expected TFJob (apiVersion kubeflow.org/v1)"
        )
    name = _mapping(manifest, "metadata").get("name", "")
    if not (isinstance(name, str) and len(name) <= 63 and _DNS_1035.match(name)):
        raise UsageError(
            f"metadata.name is {name!r}, expected a DNS-1035 label (lower-case "
            f"letters, digits and '-', starting with a letter, at most 63)"
        )
    spec = _mapping(manifest, "spec")
    if spec.get("enableDynamicWorker"):
        raise UsageError(
            "spec.enableDynamicWorker is true, which gives each worker a sparse "
            "TF_CONFIG tfdist cannot run; expected it unset or false"
        )
    replicas = spec.get("tfReplicaSpecs")
    if not isinstance(replicas, dict) or not replicas:
        raise UsageError(
            "spec.tfReplicaSpecs is missing, expected replica types "
            f"({', '.join(REPLICA_TYPES)}) to replica specs"
        )
    if "Master" in replicas:
        raise UsageError(
            "spec.tfReplicaSpecs has a Master replica, whose 'master' role "
            "tfdist does not run; expected Chief instead"
        )
    unknown = sorted(set(replicas) - set(REPLICA_TYPES))
    if unknown:
        raise UsageError(
            f"spec.tfReplicaSpecs has replica type(s) {', '.join(unknown)}, "
            f"expected {', '.join(REPLICA_TYPES)} (case as shown)"
        )
    for replica_type, replica in replicas.items():
        _check_replica(replica_type, replica)
    _check_quantities(spec, "spec")
    if "Chief" in replicas and _count(replicas, "Chief") > 1:
        raise UsageError(
            f"spec.tfReplicaSpecs.Chief.replicas is {_count(replicas, 'Chief')}, "
            f"expected 1: a TFJob has at most one Chief"
        )
    evaluators = _count(replicas, "Evaluator") if "Evaluator" in replicas else 0
    if evaluators > 1:
        raise UsageError(
            f"spec.tfReplicaSpecs.Evaluator.replicas is {evaluators}, "
            f"expected 1: TensorFlow runs a single evaluator"
        )
    # Unset is None in training-operator 1.9 (older releases defaulted to Running).
    clean = _mapping(spec, "runPolicy", "spec.").get("cleanPodPolicy", "None")
    _check_choice("spec.runPolicy.cleanPodPolicy", clean, CLEAN_POD_POLICIES)
    if evaluators and clean != "None":
        raise UsageError(
            f"spec.runPolicy.cleanPodPolicy is {clean!r} with an Evaluator, "
            f"which the operator deletes when the chief ends, before it "
            f"evaluates the last checkpoint; expected None"
        )


def _check_choice(field: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{field} is {value!r}, expected one of {', '.join(choices)}")


def _check_quantity(field: str, value) -> None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number or (isinstance(value, str) and QUANTITY.match(value))):
        raise UsageError(
            f"{field} is {value!r}, expected a Kubernetes quantity such as 4, 500m, 16Gi or 32G "
            f"(no space, binary suffixes Ki Mi Gi Ti, decimal k M G T)"
        )


def _check_quantities(node, where: str) -> None:
    """Every quantity in the manifest: resources' requests, limits and overhead, sizeLimit, divisor."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            _check_quantities(item, f"{where}[{index}]")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        field = f"{where}.{key}"
        if key in _QUANTITY_MAPS and isinstance(value, dict):
            for name, amount in value.items():
                _check_quantity(f"{field}.{name}", amount)
        elif key in _QUANTITY_FIELDS and not isinstance(value, (dict, list)):
            _check_quantity(field, value)
        else:
            _check_quantities(value, field)


def _mapping(parent: dict, key: str, where: str = "") -> dict:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{where}{key} is a {type(value).__name__}, expected a mapping")
    return value


def _count(replicas: dict, replica_type: str) -> int:
    """`replicas` of a replica spec (1 when unset, as the operator defaults it)."""
    count = (replicas.get(replica_type) or {}).get("replicas", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise UsageError(
            f"spec.tfReplicaSpecs.{replica_type}.replicas is {count!r}, expected a whole number"
        )
    return count


def _check_replica(replica_type: str, replica) -> None:
    where = f"spec.tfReplicaSpecs.{replica_type}"
    if not isinstance(replica, dict):
        raise UsageError(
            f"{where} is {type(replica).__name__}, expected a replica spec "
            f"(replicas, restartPolicy, template)"
        )
    _count({replica_type: replica}, replica_type)
    if "restartPolicy" in replica:
        _check_choice(f"{where}.restartPolicy", replica["restartPolicy"], REPLICA_RESTART_POLICIES)
    template = _mapping(replica, "template", f"{where}.")
    pod_policy = _mapping(template, "spec", f"{where}.template.").get("restartPolicy")
    if pod_policy is not None:
        _check_choice(f"{where}.template.spec.restartPolicy", pod_policy, POD_RESTART_POLICIES)
    containers = _mapping(template, "spec", f"{where}.template.").get("containers")
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        containers = []
    if not containers:
        raise UsageError(
            f"{where}.template.spec.containers is empty, expected a container named tensorflow"
        )
    for index, container in enumerate(containers):
        if not container.get("image"):
            raise UsageError(
                f"{where}.template.spec.containers[{index}].image is missing, "
                f"expected the trainer image"
            )
    if not any(container.get("name") == "tensorflow" for container in containers):
        names = [container.get("name") for container in containers]
        raise UsageError(
            f"{where} has containers {names}, expected one named tensorflow "
            f"(the operator sets TF_CONFIG and the port there)"
        )
