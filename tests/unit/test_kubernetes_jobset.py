"""JobSets and Kubeflow Trainer v2 jobs from `trainer.kubernetes --api=jobset|trainjob`:
valid for the JobSet v0.12.0 and Trainer v2.3.0 CRDs (strictly: unknown fields refused), and
every pod's cluster, resolved by tfdist from the environment JobSet gives it, is the job's."""

import copy
import hashlib
import json
import os
import pathlib

import pytest

from tfdist import cli
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import ClusterConfigError, UsageError
from trainer.kubernetes import jobset
from trainer.kubernetes import shape as shape_lib

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

REPO = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = pathlib.Path(os.environ.get("TFDIST_ENGINE_SCHEMAS", REPO.parent / "shared" / "schemas"))
# shared/schemas/README.md: tag v0.12.0 of kubernetes-sigs/jobset, v2.3.0 of kubeflow/trainer.
CRDS = {
    "JobSet": (
        "jobset.x-k8s.io_jobsets.yaml",
        "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe",
    ),
    "TrainJob": (
        "trainer.kubeflow.org_trainjobs.yaml",
        "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416",
    ),
    "TrainingRuntime": (
        "trainer.kubeflow.org_trainingruntimes.yaml",
        "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
    ),
}
IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"
SHAPES = sorted((REPO / "configs" / "kubernetes").glob("*.json"))


def _strict(schema):
    """The schema with unknown fields refused, as `kubectl apply --validate=strict` does."""
    schema = copy.deepcopy(schema)

    def tighten(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return schema


@pytest.fixture(scope="module")
def validators():
    found = {}
    for kind, (file_name, sha256) in CRDS.items():
        path = SCHEMAS / file_name
        if not path.is_file():
            pytest.skip(f"the {kind} CRD is not at {path}; see ../shared/schemas/README.md")
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, (
            f"{path} is not the file its README names"
        )
        document = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        (version,) = document["spec"]["versions"]
        found[kind] = jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))
    return found


def _errors(validator, document):
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def _shape(path=None, **overrides):
    values = json.loads(path.read_text()) if path else {"workers": 2, "volume_claim": "shared"}
    values.pop("description", None)
    values.setdefault("name", "tfdist-test")
    values.update(image=IMAGE, **overrides)
    return shape_lib.shape_from_options(values)


def _pod_environments(spec, jobset_name):
    """(role, pod index, environ) of every pod, as JobSet and Kubernetes would start them."""
    for replicated in spec["replicatedJobs"]:
        job = replicated["template"]["spec"]
        (container,) = job["template"]["spec"]["containers"]
        labels = {
            "jobset.sigs.k8s.io/jobset-name": jobset_name,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
            "jobset.sigs.k8s.io/job-index": "0",
        }
        for pod in range(job["completions"]):
            environ = {"JOB_COMPLETION_INDEX": str(pod)}
            for entry in container["env"]:
                if "value" in entry:
                    environ[entry["name"]] = entry["value"]
                else:
                    path = entry["valueFrom"]["fieldRef"]["fieldPath"]
                    label = path[len("metadata.labels['") : -len("']")]
                    environ[entry["name"]] = labels[label]
            yield replicated["name"], pod, environ


@pytest.mark.parametrize("config", SHAPES, ids=lambda path: path.stem)
def test_every_shipped_shape_is_a_jobset_the_crd_accepts(config, validators):
    document = jobset.build_jobset(_shape(config))
    assert _errors(validators["JobSet"], document) == []


@pytest.mark.parametrize("config", SHAPES, ids=lambda path: path.stem)
def test_every_shipped_shape_is_a_trainer_v2_runtime_and_trainjob_the_crds_accept(
    config, validators
):
    runtime, train_job = jobset.build_trainer_v2(_shape(config))["items"]
    assert _errors(validators["TrainingRuntime"], runtime) == []
    assert _errors(validators["TrainJob"], train_job) == []
    assert train_job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert runtime["spec"]["template"]["spec"] == jobset.build_jobset(_shape(config))["spec"]


def test_negative_control_the_strict_crd_refuses_a_malformed_jobset(validators):
    document = jobset.build_jobset(_shape())
    document["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartSometimes"
    document["spec"]["replicatedJobs"][0]["replicaz"] = 1
    errors = _errors(validators["JobSet"], document)
    assert any("RestartSometimes" in error for error in errors), errors
    assert any("replicaz" in error for error in errors), errors


@pytest.mark.parametrize("config", SHAPES, ids=lambda path: path.stem)
@pytest.mark.parametrize("api", ["jobset", "trainjob"])
def test_every_pod_resolves_the_jobs_cluster_from_jobsets_names(config, api):
    shape = _shape(config)
    spec = (
        jobset.build_jobset(shape)["spec"]
        if api == "jobset"
        else jobset.build_trainer_v2(shape)["items"][0]["spec"]["template"]["spec"]
    )
    # Trainer v2 names the JobSet after the TrainJob: the pods read it from the label.
    name = "my-train-job" if api == "trainjob" else shape.name
    expected = {
        role: tuple(f"{name}-{role}-0-{pod}.{name}:2222" for pod in range(pods))
        for role, pods in jobset.roles(shape).items()
    }
    seen = []
    for role, pod, environ in _pod_environments(spec, name):
        cluster = cluster_lib.resolve_cluster(environ)
        assert (cluster.task_type, cluster.task_index) == (role, pod)
        assert dict(cluster.addresses) == expected
        assert cluster.source == cluster_lib.JOBSET
        cluster_lib.check_cluster_for_strategy(cluster, shape.strategy)
        seen.append((role, pod))
    assert len(seen) == sum(jobset.roles(shape).values())


def test_restarts_are_counted_and_only_tfdists_retryable_codes_restart():
    spec = jobset.build_jobset(_shape(backoff_limit=3))["spec"]
    assert spec["failurePolicy"]["maxRestarts"] == 3
    (rule,) = spec["failurePolicy"]["rules"]
    assert (rule["action"], rule["onJobFailureReasons"]) == ("FailJobSet", ["PodFailurePolicy"])
    for replicated in spec["replicatedJobs"]:
        job = replicated["template"]["spec"]
        assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"
        (pod_rule,) = job["podFailurePolicy"]["rules"]
        codes = pod_rule["onExitCodes"]
        assert (pod_rule["action"], codes["operator"]) == ("FailJob", "NotIn")
        # A failed pod fails its Job at once (FailJob, then FailJobSet) unless NotIn's values
        # hold its code; then the Job fails by its backoffLimit and the JobSet restarts.
        restarting = [code for code in range(1, 256) if code in codes["values"]]
        assert restarting == sorted(cli.RETRYABLE_EXIT_CODES)


def test_the_chief_finishing_ends_a_job_with_a_chief_and_the_workers_one_without():
    with_chief = jobset.build_jobset(_shape(chief=True))["spec"]
    assert with_chief["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    without = jobset.build_jobset(_shape(chief=False))["spec"]
    assert without["successPolicy"]["targetReplicatedJobs"] == ["worker"]


def test_a_name_that_makes_pod_names_longer_than_a_dns_label_is_one_line():
    shape = _shape(name="a" * 52, workers=12)
    with pytest.raises(UsageError, match=r"makes 64-character pod names under --api=jobset"):
        jobset.check_names(shape, "jobset")
    jobset.check_names(_shape(name="a" * 51, workers=12), "jobset")
    with pytest.raises(UsageError, match="--api=trainjob"):
        jobset.check_names(_shape(name="a" * 56), "trainjob")


JOBSET_ENV = json.dumps({"replicatedJobs": {"worker": {"jobs": 1, "pods": 2}}, "port": 2222})
POD = {
    cluster_lib.JOBSET: JOBSET_ENV,
    cluster_lib.JOBSET_NAME: "job",
    cluster_lib.JOBSET_REPLICATED_JOB: "worker",
    cluster_lib.JOBSET_JOB_INDEX: "0",
    cluster_lib.JOB_COMPLETION_INDEX: "1",
}


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({cluster_lib.JOBSET_NAME: None}, "TFDIST_JOBSET_NAME is not"),
        ({cluster_lib.JOB_COMPLETION_INDEX: None}, "JOB_COMPLETION_INDEX is not"),
        ({cluster_lib.JOB_COMPLETION_INDEX: "2"}, "expected below the 2 pods"),
        ({cluster_lib.JOBSET_REPLICATED_JOB: "launcher"}, "is 'launcher', expected one of"),
        ({cluster_lib.JOBSET_NAME: "Job_1"}, "expected a DNS label"),
        ({cluster_lib.JOBSET: '{"replicatedJobs": {"node": {}}}'}, "has 'node', expected"),
        ({cluster_lib.JOBSET: '{"replicatedJobs": {"worker": 2}}'}, "expected {'jobs'"),
        ({cluster_lib.JOBSET: '{"replicatedJobs": {}, "port": 0}'}, "['port'] is 0"),
        ({cluster_lib.JOBSET: "[1]"}, "TFDIST_JOBSET holds a JSON list"),
    ],
)
def test_a_jobset_pod_environment_it_cannot_use_is_one_line(changes, expected):
    environ = {**POD, **changes}
    environ = {key: value for key, value in environ.items() if value is not None}
    with pytest.raises(ClusterConfigError) as raised:
        cluster_lib.resolve_cluster(environ)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_tf_config_wins_over_the_jobset_environment():
    tf_config = json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})
    cluster = cluster_lib.resolve_cluster({**POD, "TF_CONFIG": tf_config})
    assert cluster.source == "TF_CONFIG" and dict(cluster.addresses) == {"worker": ("a:1",)}
