"""Staging: the trainer's sdist is what setup.cfg decides, and a user's task
package (`--task_package`) is built, named by content and staged next to it so
`--task=my_pkg.mod:MyTask` imports on Vertex AI's prebuilt images."""

import json
import os
import subprocess
import sys
import tarfile

import pytest

from tests.unit.test_vertex_staging import (  # shared with the in-process half
    make_user_project,
)
from trainer.vertex import staging

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
COMMON = ["--project=my-project", "--region=us-central1", "--staging_bucket=gs://my-bucket"]


def submit(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "trainer.submit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_stages_the_task_package_next_to_the_trainer(tmp_path):
    project = make_user_project(tmp_path / "user")
    result = submit(
        *COMMON,
        f"--container_uri={PREBUILT}",
        "--allow_ended_image",
        f"--task_package={project}",
        "--dry_run",
        "--",
        "--task=my_pkg.mod:MyTask",
    )
    assert result.returncode == 0, result.stderr
    (pool,) = json.loads(result.stdout)["jobSpec"]["workerPoolSpecs"]
    trainer_uri, task_uri = pool["pythonPackageSpec"]["packageUris"]
    assert trainer_uri.startswith("gs://my-bucket/tfdist/packages/tfdist-0.1.0-")
    assert task_uri.startswith("gs://my-bucket/tfdist/packages/my_task-1.2.0-")
    assert pool["pythonPackageSpec"]["args"][-1] == "--task=my_pkg.mod:MyTask"
    assert f"would upload {task_uri.rsplit('/', 1)[1]}" in result.stderr
    assert not (project / "my_task.egg-info").exists(), "nothing is written into the project"


def test_the_staged_task_package_installs_and_imports(tmp_path):
    project = make_user_project(tmp_path / "user")
    package = staging.build_sdist(str(project), str(tmp_path / "out"), flag="--task_package")
    with tarfile.open(package.path) as archive:
        names = archive.getnames()
    assert "my_task-1.2.0/my_pkg/mod.py" in names
    assert not [name for name in names if "junk.txt" in name]
    # What a prebuilt training image does with each package URI: pip install it.
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            package.path,
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    code = (
        "import importlib; module = importlib.import_module('my_pkg.mod'); "
        "print(module.MyTask(units=7).units)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(target)),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "7", result.stderr


@pytest.mark.parametrize(
    "layout,expected", [("empty", "has none of pyproject.toml"), ("file", "is not a directory")]
)
def test_a_task_package_must_be_a_project_directory(tmp_path, layout, expected):
    path = tmp_path / "thing"
    if layout == "empty":
        path.mkdir()
    else:
        path.write_text("x")
    result = submit(
        *COMMON,
        f"--container_uri={PREBUILT}",
        "--allow_ended_image",
        f"--task_package={path}",
        "--dry_run",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
