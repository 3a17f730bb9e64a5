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
from trainer.vertex import machines, staging

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


_IMPORT_TABLES = (
    "import json, trainer.vertex.machines as m, trainer.vertex.images as i, "
    "trainer.vertex.network as n, trainer.vertex.serving as s; "
    "print(json.dumps([m.__file__, m.TABLE_DATE, i.TABLE_DATE, n.TABLE_DATE, "
    "s.DEFAULT_SERVING_IMAGE, len(m.BUILT_IN)]))"
)


def test_an_installed_wheel_carries_the_vertex_tables_and_runs_from_them(tmp_path):
    """The sdist (what Vertex installs) and the wheel pip builds from it hold the tables:
    an installed copy imports from them, takes a table edit as data, and names a broken one."""
    import zipfile

    import build

    sdist = staging.build_sdist(REPO, str(tmp_path / "sdist"))
    with tarfile.open(sdist.path) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "src", filter="data")
    for table in ("machines.json", "images.json", "network.json"):
        assert f"tfdist-0.1.0/trainer/vertex/tables/{table}" in names
    wheel = build.ProjectBuilder(
        str(tmp_path / "src" / "tfdist-0.1.0"), python_executable=sys.executable
    ).build("wheel", str(tmp_path / "wheel"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        assert "trainer/vertex/tables/machines.json" in archive.namelist()
        archive.extractall(site)

    def run(*argv):
        # The installed copy only: the checkout is neither the cwd nor on the path.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run(
            [sys.executable, *argv],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(site)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    result = run("-c", _IMPORT_TABLES)
    assert result.returncode == 0, result.stderr[-2000:]
    module_file, *dates, serving_image, machine_count = json.loads(result.stdout)
    assert machine_count == len(machines.BUILT_IN)  # the same table as this checkout's
    assert module_file.startswith(str(site)), module_file
    assert dates == ["2026-12-01"] * 3 and serving_image.endswith("tf2-cpu.2-15:latest")

    # A table update is a data change: a machine added to the file is one the submitter takes.
    table_path = site / "trainer" / "vertex" / "tables" / "machines.json"
    table = json.loads(table_path.read_text())
    table["gpu_machines"]["NVIDIA_L4"]["g9-standard-8"] = 1
    table_path.write_text(json.dumps(table))
    flags = [
        "-m",
        "trainer.submit",
        *COMMON,
        "--container_uri=us-central1-docker.pkg.dev/p/tfdist/trainer:0.1.0",
        "--strategy=mirrored",
        "--machine_type=g9-standard-8",
        "--accelerator_type=NVIDIA_L4",
        "--accelerator_count=1",
        "--dry_run",
    ]
    result = run(*flags)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] == {
        "machineType": "g9-standard-8",
        "acceleratorType": "NVIDIA_L4",
        "acceleratorCount": 1,
    }

    # A broken table: one error line naming the file, the key and the shape expected; exit 2.
    table["gpu_machines"]["NVIDIA_L4"]["g9-standard-8"] = "one"
    table_path.write_text(json.dumps(table))
    result = run(*flags)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"error: Vertex AI table {table_path}: gpu_machines['NVIDIA_L4']['g9-standard-8'] is "
        f"'one', expected a whole number > 0; fix the file (trainer/vertex/tables/__init__.py "
        f"describes the tables)"
    ], result.stderr[-2000:]
