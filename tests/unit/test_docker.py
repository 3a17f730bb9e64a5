"""The training container, as far as it can be checked without a Docker engine:
the base image is TensorFlow at the version setup.cfg allows and this machine
tests, pip installs our package without replacing TensorFlow, and the entry
point is the trainer that the submitter's container_spec names."""

import configparser
import fnmatch
import importlib.metadata
import json
import os
import re

import pytest
from packaging.requirements import Requirement

from trainer.vertex import options, rendering
from trainer.vertex import spec as spec_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dockerfile_instructions():
    """(INSTRUCTION, argument) pairs, continuation lines joined, comments dropped."""
    with open(os.path.join(REPO, "docker", "Dockerfile"), encoding="utf-8") as handle:
        text = handle.read()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [tuple(line.strip().split(None, 1)) for line in joined.splitlines() if line.strip()]


def build_args(instructions):
    return dict(arg.split("=", 1) for name, arg in instructions if name == "ARG" and "=" in arg)


def expand(text, values):
    return re.sub(r"\$\{(\w+)\}", lambda match: values[match[1]], text)


def tensorflow_requirement():
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    requirements = [
        Requirement(line) for line in config["options"]["install_requires"].strip().splitlines()
    ]
    (tensorflow,) = [req for req in requirements if req.name == "tensorflow"]
    return tensorflow


def installed_tensorflow_version():
    for name in ("tensorflow", "tensorflow-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("tensorflow is not installed")


def test_base_image_is_official_tensorflow_gpu_at_the_pinned_version():
    instructions = dockerfile_instructions()
    args = build_args(instructions)
    (base,) = [expand(arg, args) for name, arg in instructions if name == "FROM"]
    version = args["TF_VERSION"]
    assert base == f"tensorflow/tensorflow:{version}-gpu"
    assert tensorflow_requirement().specifier.contains(version), (
        f"setup.cfg's {tensorflow_requirement()} must allow the image's TensorFlow {version}"
    )
    assert version == installed_tensorflow_version(), (
        "the image pins the TensorFlow version the test suite runs on"
    )


def test_pip_installs_our_package_without_replacing_tensorflow():
    instructions = dockerfile_instructions()
    runs = [arg for name, arg in instructions if name == "RUN"]
    (install,) = [run for run in runs if "pip install" in run]
    assert 'echo "tensorflow==${TF_VERSION}" > /tmp/constraints.txt' in install
    assert re.search(r"python -m pip install -c /tmp/constraints\.txt /opt/tfdist", install)
    assert "assert tf.__version__ == '${TF_VERSION}'" in install
    copies = {source for name, arg in instructions if name == "COPY" for source in arg.split()[:-1]}
    assert {"tfdist", "trainer", "setup.cfg", "pyproject.toml"} <= copies


def test_entry_point_is_the_trainer_the_submitter_runs():
    instructions = dockerfile_instructions()
    (entrypoint,) = [json.loads(arg) for name, arg in instructions if name == "ENTRYPOINT"]
    assert entrypoint == ["python", "-m", rendering.TRAINER_MODULE]
    spec = spec_lib.JobSpec.from_options(
        options.merge_options(
            {},
            {
                "container_uri": "us-central1-docker.pkg.dev/p/r/t:1",
                "project": "my-project",
                "region": "us-central1",
                "staging_bucket": "gs://my-bucket",
            },
        ),
        timestamp="t",
    )
    pool = rendering.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"][0]
    assert pool["containerSpec"]["command"] == entrypoint


def _ignored(path, patterns):
    """Approximates Docker's .dockerignore matching for the paths checked here."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        anywhere = pattern.startswith("**/")  # any number of directories, none included
        for prefix in prefixes:
            name = prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatch(prefix, pattern) or (
                anywhere and fnmatch.fnmatch(name, pattern[3:])
            ):
                return True
    return False


def test_dockerignore_keeps_sources_and_drops_secrets_and_git():
    with open(os.path.join(REPO, ".dockerignore"), encoding="utf-8") as handle:
        patterns = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    for needed in (
        "setup.cfg",
        "pyproject.toml",
        "README.md",
        "tfdist/distribute/cluster.py",
        "trainer/task.py",
        "configs/jobs/mirrored_1x8_gpu.json",
    ):
        assert not _ignored(needed, patterns), needed
    for dropped in (
        ".git/config",
        "tests/multiprocess/test_submit.py",
        "trainer/__pycache__/x.pyc",
        "my-sa-key.json",
        "keys/service-account.json",
        ".env",
    ):
        assert _ignored(dropped, patterns), dropped


def test_cloud_build_pushes_the_image_the_job_configs_name():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO, "docker", "cloudbuild.yaml"), encoding="utf-8") as handle:
        build = yaml.safe_load(handle)
    (step,) = build["steps"]
    assert "--file=docker/Dockerfile" in step["args"]
    values = {key.lstrip("_"): value for key, value in build["substitutions"].items()}
    assert values["TF_VERSION"] == build_args(dockerfile_instructions())["TF_VERSION"]
    pushed = (
        build["images"][0]
        .replace("$PROJECT_ID", "{project}")
        .replace("${_REGION}", "{region}")
        .replace("${_REPOSITORY}", values["REPOSITORY"])
        .replace("${_TAG}", values["TAG"])
    )
    with open(os.path.join(REPO, "configs", "jobs", "mirrored_1x8_gpu.json")) as handle:
        assert json.load(handle)["container_uri"] == pushed


def _build_config(name):
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO, "docker", name), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _instructions(name):
    with open(os.path.join(REPO, "docker", name), encoding="utf-8") as handle:
        text = handle.read()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return re.sub(r"\\\n", " ", "\n".join(lines))


def test_the_tpu_image_the_tpu_job_names_is_built_by_our_build_config():
    build = _build_config("cloudbuild-tpu.yaml")
    (step,) = build["steps"]
    assert "--file=docker/Dockerfile.tpu" in step["args"]
    values = {key.lstrip("_"): value for key, value in build["substitutions"].items()}
    pushed = (
        build["images"][0]
        .replace("$PROJECT_ID", "{project}")
        .replace("${_REGION}", "{region}")
        .replace("${_REPOSITORY}", values["REPOSITORY"])
        .replace("${_TAG}", values["TAG"])
    )
    with open(os.path.join(REPO, "configs", "jobs", "tpu_v5e_2x2.json")) as handle:
        assert json.load(handle)["container_uri"] == pushed
    text = _instructions("Dockerfile.tpu")
    assert values["TF_VERSION"] == build_args(dockerfile_instructions())["TF_VERSION"]
    assert "tensorflow-tpu==${TF_VERSION}" in text and "ARG TF_VERSION=2.21.0" in text
    # The PJRT variables Vertex AI documents for TensorFlow on TPU v5e, as the submitter sets them.
    spec = spec_lib.JobSpec.from_options(
        options.merge_options(
            {},
            {
                "project": "p-123456",
                "region": "us-central1",
                "staging_bucket": "gs://my-bucket",
                "strategy": "tpu",
                "machine_type": "ct5lp-hightpu-4t",
                "accelerator_type": "TPU_V5_LITEPOD",
                "accelerator_count": 4,
                "tpu_topology": "2x2",
                "container_uri": "us-central1-docker.pkg.dev/p/tfdist/trainer-tpu:0.1.0",
            },
        ),
        timestamp="t",
    )
    for name, value in spec.tpu_env:
        assert f"{name}={value}" in text
    assert "/lib/libtpu.so" in text and "--no-deps /opt/tfdist" in text


def test_the_multiarch_build_makes_amd64_and_arm64():
    build = _build_config("cloudbuild-multiarch.yaml")
    args = build["steps"][-1]["args"]
    assert "--platform=linux/amd64,linux/arm64" in args and "--push" in args
    assert "--file=docker/Dockerfile.multiarch" in args
    text = _instructions("Dockerfile.multiarch")
    assert "FROM python:3.11-slim" in text  # a base image published for both architectures
    assert "TARGETARCH" in text and "tensorflow[and-cuda]==${TF_VERSION}" in text
