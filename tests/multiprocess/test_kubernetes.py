"""TFJob manifests from `python -m trainer.kubernetes`: valid for the training
operator's own CRD schema (where it is provided, tests/schemas/README.md) and
the kubeflow-training SDK's models, refusing what the operator would refuse."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from trainer.kubernetes import checks, manifest

pytest.importorskip("kubeflow.training")
from tests.unit.test_kubernetes import (  # shared with the in-process half
    CRD,
    _edited,
    _master,
    _require_crd,
    sdk_round_trip,
    shape,
)
from trainer.kubernetes import api_schema  # noqa: E402  (needs the kubernetes extra)

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

REPO = pathlib.Path(__file__).resolve().parents[2]
SHAPES = sorted((REPO / "configs" / "kubernetes").glob("*.json"))
IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"


@pytest.fixture(scope="module")
def crd_validator():
    _require_crd()
    document = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in document["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"])


def run_cli(*args, check=True):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "trainer.kubernetes", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("config", SHAPES, ids=lambda path: path.stem)
def test_every_shipped_shape_is_a_tfjob_the_crd_and_the_sdk_accept(config, crd_validator):
    result = run_cli(f"--job_config={config}", "--", "--epochs=3")
    job = json.loads(result.stdout)
    errors = [error.message for error in crd_validator.iter_errors(job)]
    assert not errors, errors
    assert sdk_round_trip(job) == job
    checks.check_tfjob(job)
    assert "Dry run, nothing contacted" in result.stderr
    spec = job["spec"]
    assert spec["runPolicy"]["cleanPodPolicy"] == "None"
    for replica in spec["tfReplicaSpecs"].values():
        assert replica["restartPolicy"] == "ExitCode"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["command"][:3] == ["python", "-m", "trainer.task"]
        assert container["command"][-1] == "--epochs=3"


def test_yaml_output_is_the_same_manifest():
    config = REPO / "configs" / "kubernetes" / "parameter_server_cpu.json"
    as_json = json.loads(run_cli(f"--job_config={config}").stdout)
    as_yaml = yaml.safe_load(run_cli(f"--job_config={config}", "--format=yaml").stdout)
    assert as_yaml == as_json
    assert set(as_json["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "PS", "Evaluator"}


@pytest.mark.parametrize("config", SHAPES, ids=lambda path: path.stem)
def test_every_shipped_shape_fits_the_api_structure_from_the_sdk_models(config):
    job = json.loads(run_cli(f"--job_config={config}", "--", "--epochs=3").stdout)
    assert api_schema.schema_errors(job) == []


def test_check_refuses_a_hand_written_manifest_of_the_wrong_types(tmp_path):
    job = manifest.build_tfjob(shape())
    job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] = [
        {"containerPort": "2222", "name": "tfjob-port"}
    ]
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(job))
    result = run_cli(f"--check={path}", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: --check file {str(path)!r}: spec.tfReplicaSpecs.Worker.template.spec."
        f"containers.0.ports.0.containerPort: '2222' is not of type 'integer'; expected a "
        f"kubeflow.org/v1 TFJob as the training operator's API defines it"
    ]


def test_check_of_a_hand_written_yaml_manifest(tmp_path):
    job = _edited(_master)
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(job))
    result = run_cli(f"--check={path}", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error: spec.tfReplicaSpecs has a Master replica")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    path.write_text(yaml.safe_dump(manifest.build_tfjob(shape())))
    assert "accepted" in run_cli(f"--check={path}").stderr


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--name=Tfdist_Job"], "name is 'Tfdist_Job', expected a DNS-1035 label"),
        (
            ["--evaluators=1", "--clean_pod_policy=Running"],
            "clean_pod_policy is 'Running' with an evaluator",
        ),
        (["--evaluators=2"], "the job has evaluators=2, expected 0 or 1"),
        (
            ["--parameter_servers=1"],
            "strategy=multiworker has no use for ps tasks, got parameter_servers=1",
        ),
        (
            ["--strategy=parameter_server", "--parameter_servers=0"],
            "strategy=parameter_server needs a chief to coordinate",
        ),
        (["--bucket=gs://b"], "expected exactly one"),
        (["--restart_policy=Sometimes"], "restart_policy is 'Sometimes', expected one of"),
        (["--memory=16 GB"], "memory is '16 GB', expected a Kubernetes quantity"),
        (["--", "--backup_dir=/elsewhere"], "which the job shape sets"),
        (["--", "-strategy=mirrored"], "which the job shape sets"),
        (["--", "--bogus=1"], "Unknown command line flag 'bogus'"),
        (["--", "--epochs=x"], "epochs"),
    ],
)
def test_a_bad_shape_is_one_line_and_exit_2(args, expected):
    config = REPO / "configs" / "kubernetes" / "multiworker_cpu.json"
    result = run_cli(f"--job_config={config}", "--evaluators=0", *args, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and expected in result.stderr, result.stderr


@pytest.mark.parametrize("api, kinds", [("jobset", ["JobSet"]), ("trainjob", ["List"])])
def test_jobset_and_trainer_v2_manifests_come_from_the_same_command(api, kinds):
    config = REPO / "configs" / "kubernetes" / "parameter_server_cpu.json"
    result = run_cli(f"--job_config={config}", f"--api={api}", "--format=yaml", "--", "--epochs=3")
    document = yaml.safe_load(result.stdout)
    assert [document["kind"]] == kinds
    assert "restarts of the whole set on exit 137, 143, 200, 201" in result.stderr
    spec = document["spec"] if api == "jobset" else document["items"][0]["spec"]["template"]["spec"]
    (chief,) = [job for job in spec["replicatedJobs"] if job["name"] == "chief"]
    (container,) = chief["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][-1] == "--epochs=3"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--api=kubeflow"], "--api is 'kubeflow', expected one of tfjob, jobset, trainjob"),
        (["--api=jobset", "--restart_policy=OnFailure"], "which are TFJob's"),
    ],
)
def test_a_jobset_shape_it_cannot_write_is_one_line(args, expected):
    config = REPO / "configs" / "kubernetes" / "multiworker_cpu.json"
    result = run_cli(f"--job_config={config}", *args, check=False)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and expected in line
