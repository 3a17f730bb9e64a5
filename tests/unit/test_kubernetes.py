"""TFJob manifests from `python -m trainer.kubernetes`: valid for the training
operator's own CRD schema (where it is provided, tests/schemas/README.md) and
the kubeflow-training SDK's models, refusing what the operator would refuse."""

import hashlib
import json
import os
import pathlib

import pytest

from tfdist import cli
from tfdist.errors import UsageError
from trainer.kubernetes import checks, manifest
from trainer.kubernetes import shape as shape_lib

pytest.importorskip("kubeflow.training")
from trainer.kubernetes import api_schema  # noqa: E402  (needs the kubernetes extra)

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

REPO = pathlib.Path(__file__).resolve().parents[2]
# Not in the repository (files fetched from other repositories are not committed here): the
# project's shared/ folder beside the checkout holds it, or TFDIST_TFJOB_CRD names it.
CRD = pathlib.Path(
    os.environ.get(
        "TFDIST_TFJOB_CRD", REPO.parent / "shared" / "schemas" / "kubeflow.org_tfjobs.yaml"
    )
)
CRD_SHA256 = "1fea6d2d9d3fec4697db322d4490be67b0d616478f42566e4c48ae865130a8c8"
IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"


def _require_crd() -> None:
    if not CRD.is_file():
        pytest.skip(
            f"the TFJob CRD (training-operator v1.9.0 manifests/base/crds/"
            f"kubeflow.org_tfjobs.yaml, sha256 {CRD_SHA256[:12]}...) is not at {CRD}; "
            f"see tests/schemas/README.md"
        )


@pytest.fixture(scope="module")
def crd_validator():
    _require_crd()
    document = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in document["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"])


def sdk_round_trip(job: dict) -> dict:
    """The manifest read into kubeflow-training's models and written back (unknown fields drop)."""
    training = pytest.importorskip("kubeflow.training")

    class Response:  # what ApiClient.deserialize reads: a body in `.data`
        data = json.dumps(job)

    client = training.ApiClient()
    model = client.deserialize(Response(), "KubeflowOrgV1TFJob")
    assert isinstance(model, training.KubeflowOrgV1TFJob)
    return client.sanitize_for_serialization(model)


def shape(**overrides) -> shape_lib.TFJobShape:
    values = dict(name="tfdist-test", image=IMAGE, workers=2, volume_claim="shared")
    values.update(overrides)
    return shape_lib.TFJobShape(**values)


def test_the_provided_crd_is_the_one_its_readme_names():
    _require_crd()
    assert hashlib.sha256(CRD.read_bytes()).hexdigest() == CRD_SHA256
    assert CRD_SHA256 in (REPO / "tests" / "schemas" / "README.md").read_text()


def test_a_job_shape_becomes_the_replicas_resources_and_volume_it_names(crd_validator):
    job = manifest.build_tfjob(
        shape(
            strategy="parameter_server",
            workers=3,
            parameter_servers=2,
            evaluators=1,
            gpus=2,
            cpu="6",
            memory="24Gi",
            ps_memory="64Gi",
            service_account="trainer",
            node_selector=("cloud.google.com/gke-accelerator=nvidia-l4",),
            termination_grace_seconds=60,
            trainer_args=("--model=mlp",),
        )
    )
    assert not list(crd_validator.iter_errors(job))
    assert sdk_round_trip(job) == job
    replicas = job["spec"]["tfReplicaSpecs"]
    assert {kind: spec["replicas"] for kind, spec in replicas.items()} == {
        "Chief": 1,
        "Worker": 3,
        "PS": 2,
        "Evaluator": 1,
    }
    pods = {kind: spec["template"]["spec"] for kind, spec in replicas.items()}
    limits = {kind: pod["containers"][0]["resources"]["limits"] for kind, pod in pods.items()}
    assert limits["Worker"] == {"cpu": "6", "memory": "24Gi", "nvidia.com/gpu": "2"}
    assert limits["Chief"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in limits["PS"] and limits["PS"]["memory"] == "64Gi"
    assert "nvidia.com/gpu" not in limits["Evaluator"]
    for pod in pods.values():
        assert pod["volumes"] == [
            {"name": "tfdist-shared", "persistentVolumeClaim": {"claimName": "shared"}}
        ]
        assert pod["serviceAccountName"] == "trainer"
        assert pod["terminationGracePeriodSeconds"] == 60
        command = pod["containers"][0]["command"]
        assert "--model_dir=/mnt/tfdist/tfdist-test/model" in command
        assert "--backup_dir=/mnt/tfdist/tfdist-test/backup" in command
        assert "--preemption_grace_seconds=55" in command
        assert (
            "--max_restarts_without_progress=3" in command
        )  # backoffLimit does not bound ExitCode


def test_the_crash_loop_guard_in_trainer_args_is_not_doubled():
    job = manifest.build_tfjob(shape(trainer_args=("--max_restarts_without_progress=5",)))
    command = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert [arg for arg in command if "max_restarts" in arg] == [
        "--max_restarts_without_progress=5"
    ]


def test_a_bucket_instead_of_a_volume():
    job = manifest.build_tfjob(shape(volume_claim="", bucket="gs://my-bucket/runs"))
    pod = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "volumes" not in pod
    assert "--backup_dir=gs://my-bucket/runs/tfdist-test/backup" in pod["containers"][0]["command"]


def test_negative_control_the_crd_refuses_a_malformed_tfjob(crd_validator):
    job = manifest.build_tfjob(shape())
    assert not list(crd_validator.iter_errors(job))
    job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    del job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["name"]
    messages = sorted(error.message for error in crd_validator.iter_errors(job))
    assert messages == ["'name' is a required property", "'two' is not of type 'integer'"]


def test_the_sdk_schema_has_the_operators_required_fields():
    definitions = api_schema.tfjob_schema()["definitions"]
    assert definitions["V1Container"]["required"] == ["name"]
    assert definitions["KubeflowOrgV1TFJobSpec"]["required"] == ["runPolicy", "tfReplicaSpecs"]
    assert definitions["KubeflowOrgV1ReplicaSpec"]["properties"]["replicas"] == {"type": "integer"}


def test_negative_control_the_sdk_schema_refuses_a_malformed_tfjob():
    job = manifest.build_tfjob(shape())
    assert api_schema.schema_errors(job) == []
    job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    del job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["name"]
    job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicyy"] = "ExitCode"
    assert api_schema.schema_errors(job) == [
        "spec.tfReplicaSpecs.Chief.template.spec.containers.0: 'name' is a required property",
        "spec.tfReplicaSpecs.Worker: Additional properties are not allowed "
        "('restartPolicyy' was unexpected)",
        "spec.tfReplicaSpecs.Worker.replicas: 'two' is not of type 'integer'",
    ]


def test_quantities_may_be_numbers_as_in_the_api():
    job = manifest.build_tfjob(shape())
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["cpu"] = 6
    assert api_schema.schema_errors(job) == []


def test_negative_control_the_sdk_drops_a_misspelt_field():
    job = manifest.build_tfjob(shape())
    job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicyy"] = "ExitCode"
    assert sdk_round_trip(job) != job


def test_exit_code_restart_policy_retries_exactly_tfdists_transient_codes():
    # training-operator 1.9 pkg/util/train/train_util.go: IsRetryableExitCode is code >= 128.
    def operator_retries(code):
        return code >= 128

    assert cli.EXIT_PEER_LOST == 200
    assert all(operator_retries(code) for code in cli.RETRYABLE_EXIT_CODES)
    assert {cli.EXIT_PREEMPTED, cli.EXIT_GRACE_EXPIRED, cli.EXIT_PEER_LOST} <= set(
        cli.RETRYABLE_EXIT_CODES
    )
    assert not any(
        operator_retries(code) for code in (cli.EXIT_OK, cli.EXIT_USAGE, cli.EXIT_NON_FINITE)
    )


def _edited(edit) -> dict:
    job = manifest.build_tfjob(shape(evaluators=1))
    edit(job["spec"])
    return job


def _two_chiefs(spec):
    spec["tfReplicaSpecs"]["Chief"]["replicas"] = 2


def _master(spec):
    spec["tfReplicaSpecs"]["Master"] = spec["tfReplicaSpecs"].pop("Chief")


def _renamed_container(spec):
    spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"


def _no_image(spec):
    del spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"]


def _dynamic(spec):
    spec["enableDynamicWorker"] = True


def _running(spec):
    spec["runPolicy"]["cleanPodPolicy"] = "Running"


def _string_count(spec):
    spec["tfReplicaSpecs"]["Worker"]["replicas"] = "2"


def _lower_case(spec):
    spec["tfReplicaSpecs"]["worker"] = spec["tfReplicaSpecs"].pop("Worker")


def _memory_with_a_space(spec):
    resources = spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]
    resources["limits"]["memory"] = "32 GB"


def _sometimes(spec):
    spec["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "Sometimes"


def _pod_exit_code(spec):
    spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]["restartPolicy"] = "ExitCode"


def _clean_some(spec):
    spec["runPolicy"]["cleanPodPolicy"] = "Some"


def _volume_size(spec):
    pod = spec["tfReplicaSpecs"]["Chief"]["template"]["spec"]
    pod["volumes"] = [{"name": "scratch", "emptyDir": {"sizeLimit": "1 Gi"}}]


@pytest.mark.parametrize(
    "edit,expected",
    [
        (
            _memory_with_a_space,
            "containers[0].resources.limits.memory is '32 GB', expected a Kubernetes quantity",
        ),
        (_sometimes, "Worker.restartPolicy is 'Sometimes', expected one of ExitCode, OnFailure"),
        (_pod_exit_code, "template.spec.restartPolicy is 'ExitCode', expected one of Always"),
        (_clean_some, "cleanPodPolicy is 'Some', expected one of None, Running, All"),
        (_volume_size, "emptyDir.sizeLimit is '1 Gi'"),
        (_two_chiefs, "Chief.replicas is 2, expected 1"),
        (_master, "has a Master replica"),
        (_renamed_container, "expected one named tensorflow"),
        (_no_image, "containers[0].image is missing"),
        (_dynamic, "enableDynamicWorker is true"),
        (_running, "cleanPodPolicy is 'Running' with an Evaluator"),
        (_lower_case, "replica type(s) worker"),
        (_string_count, "Worker.replicas is '2', expected a whole number"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_refuses_what_the_operator_or_tfdist_refuses(edit, expected):
    with pytest.raises(UsageError) as raised:
        checks.check_tfjob(_edited(edit))
    assert expected in str(raised.value)
