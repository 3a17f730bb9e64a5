"""`python -m trainer.submit`: dry runs of the shipped job shapes, usage errors,
and a real submission through the Vertex AI SDK to a local REST stand-in with
the package staged into gcp-storage-emulator."""

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time

import pytest

from tests.support.vertex_stand_in import running_stand_in

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(REPO, "configs", "jobs")
PROJECT, REGION, BUCKET = "test-project", "us-central1", "tfdist-test-bucket"
SERVICE_ACCOUNT = "trainer@test-project.iam.gserviceaccount.com"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
FAKE_TOKEN = "ya29.FAKE-token-must-never-be-printed-0123456789"
FAKE_KEY = "sk-FAKE-key-must-never-be-printed-9876543210"
COMMON = [
    f"--project={PROJECT}",
    f"--region={REGION}",
    f"--staging_bucket=gs://{BUCKET}",
    f"--service_account={SERVICE_ACCOUNT}",
]


def base_env(**extra):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC", "STORAGE_EMULATOR_HOST")
    }
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TFDIST_TEST_FAKE_TOKEN"] = FAKE_TOKEN
    # Any attempt to use Application Default Credentials fails loudly.
    env["GOOGLE_APPLICATION_CREDENTIALS"] = os.path.join(REPO, "no-such-credentials.json")
    env.update(extra)
    return env


def submit(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "trainer.submit", *args],
        cwd=REPO,
        env=env or base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dry_run(config, *extra_flags, trainer_args=("--epochs=2", "--seed=7")):
    result = submit(
        f"--job_config={os.path.join(JOBS, config)}",
        *COMMON,
        *extra_flags,
        "--dry_run",
        "--",
        *trainer_args,
    )
    assert result.returncode == 0, result.stderr
    assert FAKE_TOKEN not in result.stdout + result.stderr
    return json.loads(result.stdout), result.stderr


def code_of(pool):
    return pool.get("containerSpec") or pool["pythonPackageSpec"]


def our_image(name="trainer"):
    return f"{REGION}-docker.pkg.dev/{PROJECT}/tfdist/{name}:0.1.0"


def test_dry_run_mirrored_one_machine_eight_gpus():
    job, stderr = dry_run("mirrored_1x8_gpu.json")
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert len(pools) == 1
    assert pools[0]["replicaCount"] == 1
    assert pools[0]["machineSpec"] == {
        "machineType": "a2-highgpu-8g",
        "acceleratorType": "NVIDIA_TESLA_A100",
        "acceleratorCount": 8,
    }
    assert pools[0]["containerSpec"] == {
        "imageUri": our_image(),
        "command": ["python", "-m", "trainer.task"],
        "args": [
            "--strategy=mirrored",
            "--max_restarts_without_progress=3",
            "--model=cnn",
            "--global_batch_size=1024",
            "--mixed_precision=mixed_float16",
            "--epochs=2",
            "--seed=7",
        ],
    }
    assert job["jobSpec"]["scheduling"] == {"strategy": "STANDARD"}
    assert job["jobSpec"]["serviceAccount"] == SERVICE_ACCOUNT
    assert SERVICE_ACCOUNT in stderr
    assert "Dry run" in stderr


def test_dry_run_two_machines_with_reduction_server():
    job, _ = dry_run("multiworker_2x8_gpu_reduction_server.json")
    chief, workers, reducers = job["jobSpec"]["workerPoolSpecs"]
    assert (chief["replicaCount"], workers["replicaCount"], reducers["replicaCount"]) == (1, 1, 7)
    for pool in (chief, workers):
        assert pool["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_A100"
        assert pool["machineSpec"]["acceleratorCount"] == 8
        assert pool["containerSpec"]["imageUri"] == our_image()
        assert pool["containerSpec"]["args"][0] == "--strategy=multiworker"
        assert pool["containerSpec"]["args"][-2:] == ["--epochs=2", "--seed=7"]
    assert reducers["machineSpec"] == {"machineType": "n1-highcpu-16"}
    assert reducers["containerSpec"] == {
        "imageUri": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    }
    assert job["jobSpec"]["scheduling"] == {
        "strategy": "STANDARD",
        "restartJobOnWorkerRestart": True,
    }


def test_dry_run_cpu_parameter_servers_with_evaluator_on_spot():
    job, _ = dry_run("parameter_server_cpu_evaluator.json")
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert [pool["replicaCount"] for pool in pools] == [1, 4, 2, 1]
    assert [pool["machineSpec"] for pool in pools] == [
        {"machineType": "n2-standard-8"},
        {"machineType": "n2-standard-8"},
        {"machineType": "n2-highmem-8"},
        {"machineType": "n2-standard-8"},
    ]
    for pool in pools:  # every pool runs our trainer, ps and evaluator included
        assert pool["containerSpec"]["imageUri"] == our_image()
        assert pool["containerSpec"]["command"] == ["python", "-m", "trainer.task"]
        assert pool["containerSpec"]["args"] == [
            "--strategy=parameter_server",
            "--max_restarts_without_progress=3",
            "--model=mlp",
            "--global_batch_size=512",
            "--epochs=2",
            "--seed=7",
        ]
    assert job["jobSpec"]["scheduling"] == {"strategy": "SPOT"}


def test_dry_run_tpu_v5e():
    job, _ = dry_run("tpu_v5e_2x2.json")
    (pool,) = job["jobSpec"]["workerPoolSpecs"]
    assert pool["replicaCount"] == 1
    assert pool["machineSpec"] == {
        "machineType": "ct5lp-hightpu-4t",
        "acceleratorType": "TPU_V5_LITEPOD",
        "acceleratorCount": 4,
        "tpuTopology": "2x2",
    }
    assert pool["containerSpec"]["imageUri"] == our_image("trainer-tpu")
    assert pool["containerSpec"]["args"][:2] == ["--strategy=tpu", "--tpu=local"]


def test_flags_override_the_job_config():
    job, _ = dry_run(
        "parameter_server_cpu_evaluator.json",
        "--workers=2",
        "--scheduling=standard",
        "--timeout=12h",
        "--labels=team=vision",
        "--display_name=override",
    )
    assert [pool["replicaCount"] for pool in job["jobSpec"]["workerPoolSpecs"]] == [1, 2, 2, 1]
    assert job["jobSpec"]["scheduling"] == {"strategy": "STANDARD", "timeout": "43200s"}
    assert job["labels"] == {"team": "vision"}
    assert job["displayName"] == "override"


def test_dry_run_with_prebuilt_image_names_the_package_it_would_stage():
    job, stderr = dry_run(
        "parameter_server_cpu_evaluator.json", f"--container_uri={PREBUILT}", "--allow_ended_image"
    )
    uris = {
        tuple(pool["pythonPackageSpec"]["packageUris"])
        for pool in job["jobSpec"]["workerPoolSpecs"]
    }
    assert len(uris) == 1, "every pool runs the same package"
    (uri,) = uris.pop()
    assert re.fullmatch(
        rf"gs://{BUCKET}/tfdist/packages/tfdist-0\.1\.0-[0-9a-f]{{16}}\.tar\.gz", uri
    )
    assert f"would upload {uri.rsplit('/', 1)[1]}" in stderr and uri in stderr
    for pool in job["jobSpec"]["workerPoolSpecs"]:
        assert pool["pythonPackageSpec"]["pythonModule"] == "trainer.task"
        assert pool["pythonPackageSpec"]["executorImageUri"] == PREBUILT


IMPORT_CHECKS = {
    "our image": [],
    "prebuilt image, task package, tuning, serving lines": [
        f"--container_uri={PREBUILT}",
        "--allow_ended_image",
        "--task_package={user_project}",
        f"--hparam_tuning={os.path.join(REPO, 'configs', 'tuning', 'warmup_grid.json')}",
        "--serving_commands",
        "--network=projects/1/global/networks/vpc",
        "--kms_key_name=projects/p/locations/us-central1/keyRings/r/cryptoKeys/k",
    ],
}


@pytest.mark.parametrize("extra", IMPORT_CHECKS.values(), ids=IMPORT_CHECKS.keys())
def test_dry_run_imports_neither_tensorflow_nor_google_cloud(tmp_path, extra):
    from tests.unit.test_vertex_staging import make_user_project

    user_project = make_user_project(tmp_path / "user")
    extra = [flag.format(user_project=user_project) for flag in extra]
    report = tmp_path / "modules.json"
    wrapper = (
        "import json, runpy, sys\n"
        "try:\n"
        "    runpy.run_module('trainer.submit', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as done:\n"
        "    code = done.code or 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')\n"
        "               or m.startswith(('google.cloud.', 'google.auth', 'grpc')))\n"
        f"open({str(report)!r}, 'w').write(json.dumps({{'code': code, 'heavy': heavy}}))\n"
    )
    config = os.path.join(JOBS, "mirrored_1x8_gpu.json")
    result = subprocess.run(
        [sys.executable, "-c", wrapper, f"--job_config={config}", *COMMON, *extra, "--dry_run"],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcome = json.loads(report.read_text())
    assert outcome == {"code": 0, "heavy": []}, result.stderr
    assert json.loads(result.stdout)["displayName"] == "tfdist-mirrored-1x8-a100"


IMPOSSIBLE_FLAGS = {
    "reduction server with parameter servers": [
        "--strategy=parameter_server",
        "--workers=2",
        "--parameter_servers=1",
        "--reduction_servers=2",
        "--accelerator_type=NVIDIA_L4",
        "--accelerator_count=1",
        "--machine_type=g2-standard-8",
    ],
    "reduction server without GPU workers": [
        "--strategy=multiworker",
        "--workers=2",
        "--reduction_servers=2",
    ],
    "parameter_server without parameter servers": ["--strategy=parameter_server", "--workers=2"],
    "parameter_server without workers": ["--strategy=parameter_server", "--parameter_servers=1"],
    "negative count": ["--strategy=multiworker", "--workers=-3"],
    "unknown strategy": ["--strategy=allreduce"],
    "unknown scheduling": ["--scheduling=cheap"],
    "non-loopback plain http endpoint": ["--api_endpoint=http://vertex.example.com:8080"],
    "stray positional argument": ["epochs=3"],
    "unknown flag": ["--wrokers=2"],
}


@pytest.mark.parametrize("flags", IMPOSSIBLE_FLAGS.values(), ids=IMPOSSIBLE_FLAGS.keys())
def test_impossible_shapes_exit_2_with_one_line(flags):
    result = submit(*COMMON, f"--container_uri={our_image()}", *flags, "--dry_run")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr


# --- A real submission: Vertex-shaped REST stand-in + Cloud Storage emulator. ---


@pytest.fixture
def vertex_stand_in():
    with running_stand_in() as server:
        yield server


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def storage_emulator(tmp_path):
    """gcp-storage-emulator on loopback, in memory, with the test bucket."""
    log_path = tmp_path / "storage-emulator.log"
    for _ in range(3):  # a port picked free can be taken before the emulator binds it
        port = _free_port()
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gcp_storage_emulator",
                    "start",
                    "--host=127.0.0.1",
                    f"--port={port}",
                    "--in-memory",
                    f"--default-bucket={BUCKET}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        if process.poll() is None and time.monotonic() < deadline:
            break
        process.kill()
        process.wait(timeout=10)
    else:
        pytest.fail(f"gcp-storage-emulator did not start:\n{log_path.read_text()}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _download(emulator_url, uri):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    bucket, _, name = uri[len("gs://") :].partition("/")
    client = storage.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": emulator_url},
    )
    return client.bucket(bucket).blob(name).download_as_bytes()


def _normalized(job_json):
    from google.cloud.aiplatform_v1.types import custom_job

    return custom_job.CustomJob.from_json(json.dumps(job_json))


def test_real_submission_reaches_vertex_stand_in_and_stages_package(
    vertex_stand_in, storage_emulator, tmp_path
):
    config = tmp_path / "job.json"
    config.write_text(
        json.dumps(
            {
                "strategy": "parameter_server",
                "machine_type": "n2-standard-4",
                "workers": 2,
                "parameter_servers": 1,
                "evaluators": 1,
                "container_uri": PREBUILT,
                "allow_ended_image": True,
                "scheduling": "spot",
                "labels": "app=tfdist",
                "env": {"API_KEY": FAKE_KEY},
            }
        )
    )
    flags = [
        f"--job_config={config}",
        *COMMON,
        f"--base_output_dir=gs://{BUCKET}/runs/r1",
        "--timeout=1h",
        "--restart_job_on_worker_restart",
    ]
    env = base_env(STORAGE_EMULATOR_HOST=storage_emulator)
    preview = submit(*flags, "--dry_run", "--", "--epochs=3", env=env)
    assert preview.returncode == 0, preview.stderr

    result = submit(
        *flags, f"--api_endpoint={vertex_stand_in.url}", "--", "--epochs=3", env=env, timeout=180
    )
    logs = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, logs
    assert result.stdout == f"projects/{PROJECT}/locations/{REGION}/customJobs/4242\n", logs

    (request,) = vertex_stand_in.requests
    assert request["path"] == f"/v1/projects/{PROJECT}/locations/{REGION}/customJobs"
    assert "authorization" not in {key.lower() for key in request["headers"]}, (
        "a loopback emulator must get no credentials"
    )
    sent = request["body"]
    pools = sent["jobSpec"]["workerPoolSpecs"]
    package_uris = {uri for pool in pools for uri in pool["pythonPackageSpec"]["packageUris"]}
    (package_uri,) = package_uris
    assert package_uri.startswith(f"gs://{BUCKET}/tfdist/packages/tfdist-0.1.0-")
    assert package_uri in result.stderr, "what is uploaded, and where, is printed"
    assert {
        (var["name"], var["value"]) for pool in pools for var in pool["pythonPackageSpec"]["env"]
    } == {("API_KEY", FAKE_KEY), ("TFDIST_POOL2_ROLE", "parameter_server")}, (
        "the job's env is sent, only its printing is redacted; every replica is told pool 2's role"
    )

    # What was sent is exactly what the dry run showed (env values aside).
    shown = json.loads(preview.stdout)
    for pool in sent["jobSpec"]["workerPoolSpecs"]:
        for var in pool["pythonPackageSpec"]["env"]:
            if var["name"] != "TFDIST_POOL2_ROLE":
                var["value"] = "<redacted>"
    assert _normalized(sent) == _normalized(shown)

    with tarfile.open(fileobj=io.BytesIO(_download(storage_emulator, package_uri))) as archive:
        names = archive.getnames()
    assert any(name.startswith("tfdist-0.1.0/trainer/") for name in names), names
    assert any(name.startswith("tfdist-0.1.0/tfdist/") for name in names), names

    for output in (preview.stdout, preview.stderr, result.stdout, result.stderr):
        assert FAKE_KEY not in output
        assert FAKE_TOKEN not in output


def test_real_submission_with_our_image_sends_a_container_spec(vertex_stand_in):
    flags = [
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        f"--base_output_dir=gs://{BUCKET}/runs/r2",
        "--env",
        f"API_KEY={FAKE_KEY}",
    ]
    preview = submit(*flags, "--dry_run", "--", "--epochs=1")
    assert preview.returncode == 0, preview.stderr
    result = submit(
        *flags, f"--api_endpoint={vertex_stand_in.url}", "--", "--epochs=1", timeout=180
    )
    logs = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, logs
    (request,) = vertex_stand_in.requests
    sent = request["body"]
    (pool,) = sent["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == our_image()
    assert pool["containerSpec"]["args"][-1] == "--epochs=1"
    assert pool["containerSpec"]["env"] == [{"name": "API_KEY", "value": FAKE_KEY}]
    assert sent["jobSpec"]["serviceAccount"] == SERVICE_ACCOUNT
    pool["containerSpec"]["env"][0]["value"] = "<redacted>"
    assert _normalized(sent) == _normalized(json.loads(preview.stdout))
    assert "Uploading" not in result.stderr, "our own image needs no package"
    assert "  pool 0 chief      1 x a2-highgpu-8g, 8 x NVIDIA_TESLA_A100 each" in result.stderr, (
        "the bill is printed before a real submission too"
    )
    for output in (preview.stdout, preview.stderr, result.stdout, result.stderr):
        assert FAKE_KEY not in output
        assert FAKE_TOKEN not in output


def test_job_refused_by_vertex_exits_2_with_one_line(vertex_stand_in):
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        "--display_name=refuse-me",
        f"--api_endpoint={vertex_stand_in.url}",
        timeout=180,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and "400" in error_lines[0], result.stderr
    assert "a9-huge is not supported" in error_lines[0]
    assert "Traceback" not in result.stderr


def test_vertex_failing_exits_1_with_one_line(vertex_stand_in):
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        "--display_name=fail-me",
        f"--api_endpoint={vertex_stand_in.url}",
        timeout=180,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and "503" in error_lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_vertex_exits_1_with_one_line():
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        f"--api_endpoint=http://127.0.0.1:{_free_port()}",
        timeout=180,
    )
    assert result.returncode == 1, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and "could not be reached" in error_lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_real_tuning_submission_sends_what_the_dry_run_shows(vertex_stand_in):
    from google.cloud.aiplatform_v1 import HyperparameterTuningJob

    flags = [
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        "--hparam_tuning="
        + os.path.join(REPO, "configs", "tuning", "learning_rate_optimizer.json"),
        f"--base_output_dir=gs://{BUCKET}/runs/hp1",
        "--env",
        f"API_KEY={FAKE_KEY}",
    ]
    preview = submit(*flags, "--dry_run", "--", "--validation_steps=4")
    assert preview.returncode == 0, preview.stderr
    result = submit(
        *flags, f"--api_endpoint={vertex_stand_in.url}", "--", "--validation_steps=4", timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"projects/{PROJECT}/locations/{REGION}/hyperparameterTuningJobs/4242\n"
    (request,) = vertex_stand_in.requests
    assert request["path"] == f"/v1/projects/{PROJECT}/locations/{REGION}/hyperparameterTuningJobs"
    sent = request["body"]
    (pool,) = sent["trialJobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["env"] == [{"name": "API_KEY", "value": FAKE_KEY}]
    pool["containerSpec"]["env"][0]["value"] = "<redacted>"

    def normalized(job):
        return HyperparameterTuningJob.from_json(json.dumps(job), ignore_unknown_fields=False)

    assert normalized(sent) == normalized(json.loads(preview.stdout))
    for output in (preview.stdout, preview.stderr, result.stdout, result.stderr):
        assert FAKE_KEY not in output


def test_real_submission_stages_the_task_package_too(vertex_stand_in, storage_emulator, tmp_path):
    from tests.unit.test_vertex_staging import make_user_project

    project = make_user_project(tmp_path / "user")
    env = base_env(STORAGE_EMULATOR_HOST=storage_emulator)
    result = submit(
        *COMMON,
        f"--container_uri={PREBUILT}",
        "--allow_ended_image",
        f"--task_package={project}",
        f"--base_output_dir=gs://{BUCKET}/runs/r3",
        f"--api_endpoint={vertex_stand_in.url}",
        "--",
        "--task=my_pkg.mod:MyTask",
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (request,) = vertex_stand_in.requests
    (pool,) = request["body"]["jobSpec"]["workerPoolSpecs"]
    trainer_uri, task_uri = pool["pythonPackageSpec"]["packageUris"]
    with tarfile.open(fileobj=io.BytesIO(_download(storage_emulator, task_uri))) as archive:
        assert "my_task-1.2.0/my_pkg/mod.py" in archive.getnames()
    with tarfile.open(fileobj=io.BytesIO(_download(storage_emulator, trainer_uri))) as archive:
        assert "tfdist-0.1.0/trainer/task.py" in archive.getnames()


def test_without_an_emulator_credentials_come_from_adc():
    # A non-emulator endpoint that leads nowhere: the missing ADC stops it first.
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        "--api_endpoint=https://127.0.0.1:9",
        timeout=180,
    )
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: no Application Default Credentials found")
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_help_exits_0_and_lists_the_job_flags():
    result = submit("--help")
    assert result.returncode == 0, result.stderr
    assert "--machine_type" in result.stdout and "--image_architecture" in result.stdout


def test_every_dry_run_prints_the_bill_on_stderr():
    _, stderr = dry_run(
        "multiworker_2x8_gpu_reduction_server.json",
        "--hparam_tuning="
        + os.path.join(REPO, "configs", "tuning", "learning_rate_optimizer.json"),
    )
    assert "Will run (per trial):" in stderr
    assert "  pool 2 reducers   7 x n1-highcpu-16, pd-ssd 100 GB, Reduction Server" in stderr
    assert "  in all: 9 machines, 16 x NVIDIA_TESLA_A100, 7 reducers" in stderr
    assert (
        "  tuning: 20 trials, 4 at once: peak 36 machines, 64 x NVIDIA_TESLA_A100, 28 reducers"
    ) in stderr


def test_upload_sends_the_saved_model_through_the_sdk(vertex_stand_in):
    flags = [
        f"--project={PROJECT}",
        f"--region={REGION}",
        "--upload",
        f"--artifact_uri=gs://{BUCKET}/runs/r1/model",
        "--display_name=my-model",
    ]
    preview = submit(*flags, "--dry_run")
    assert preview.returncode == 0, preview.stderr
    assert "Dry run, nothing sent: would upload" in preview.stderr
    result = submit(*flags, f"--api_endpoint={vertex_stand_in.url}", timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"projects/{PROJECT}/locations/{REGION}/models/77\n", result.stdout
    upload, fetch = vertex_stand_in.requests
    assert upload["path"] == f"/v1/projects/{PROJECT}/locations/{REGION}/models:upload"
    assert upload["body"]["model"]["artifactUri"] == f"gs://{BUCKET}/runs/r1/model/"
    assert (
        upload["body"]["model"]["containerSpec"]["imageUri"]
        == "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    )
    assert upload["body"]["model"]["displayName"] == "my-model"
    assert fetch["path"] == f"/v1/projects/{PROJECT}/locations/{REGION}/models/77"
    assert "authorization" not in {key.lower() for key in upload["headers"]}
    assert json.loads(preview.stdout)["containerSpec"] == upload["body"]["model"]["containerSpec"]


def test_upload_refuses_a_serving_image_vertex_does_not_list():
    result = submit(
        f"--project={PROJECT}",
        f"--region={REGION}",
        "--upload",
        f"--artifact_uri=gs://{BUCKET}/m",
        "--dry_run",
        "--serving_container_uri=us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-17:latest",
    )
    assert result.returncode == 2, result.stderr
    assert "is not a TensorFlow image Vertex AI lists" in result.stderr


# --- Following a job: --wait, --attach, --cancel (the stand-in moves jobs through states). ---

FOLLOW = ["--poll_seconds=0.05"]


def _states_followed(stderr):
    return [line.split(" is ")[1].split()[0] for line in stderr.splitlines() if " is JOB_" in line]


@pytest.mark.parametrize(
    "display_name, code, states",
    [
        (
            "ends-well",
            0,
            ["JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"],
        ),
        ("fail-later", 1, ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_FAILED"]),
    ],
)
def test_wait_follows_the_created_job_and_exits_with_its_outcome(
    vertex_stand_in, display_name, code, states
):
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        *COMMON,
        f"--display_name={display_name}",
        f"--api_endpoint={vertex_stand_in.url}",
        "--wait",
        *FOLLOW,
        "--",
        "--epochs=1",
        timeout=180,
    )
    logs = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == code, logs
    name = f"projects/{PROJECT}/locations/{REGION}/customJobs/4242"
    assert result.stdout == f"{name}\n", "stdout stays the created job's name alone"
    assert _states_followed(result.stderr) == states, logs
    assert f"https://console.cloud.google.com/agent-platform/locations/{REGION}/training/4242" in (
        result.stderr
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if code:
        from tests.support.vertex_stand_in import FAILED_JOB_ERROR

        assert errors == [f"error: CustomJob {name} ended JOB_STATE_FAILED: {FAILED_JOB_ERROR!r}"]
    else:
        assert errors == []
    assert "Traceback" not in result.stderr


def test_attach_by_id_and_cancel_with_wait(vertex_stand_in):
    running = vertex_stand_in.add_job(
        f"projects/{PROJECT}/locations/{REGION}/customJobs/77", ("JOB_STATE_RUNNING",)
    )
    where = [f"--project={PROJECT}", f"--region={REGION}", f"--api_endpoint={vertex_stand_in.url}"]
    cancelled = submit(*where, "--cancel=77", "--wait", *FOLLOW, timeout=180)
    assert cancelled.returncode == 1, cancelled.stderr
    assert f"Asked Vertex AI to cancel {running}" in cancelled.stderr
    assert _states_followed(cancelled.stderr) == ["JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"]
    assert f"/v1/{running}:cancel" in [request["path"] for request in vertex_stand_in.requests]
    again = submit(*where, f"--attach={running}", *FOLLOW, timeout=180)
    assert again.returncode == 1, again.stderr
    assert _states_followed(again.stderr) == ["JOB_STATE_CANCELLED"]


def test_ctrl_c_while_waiting_leaves_the_job_running_and_says_how_to_attach(vertex_stand_in):
    import signal

    running = vertex_stand_in.add_job(
        f"projects/{PROJECT}/locations/{REGION}/customJobs/78",
        ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING"),
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.submit",
            f"--attach={running}",
            f"--api_endpoint={vertex_stand_in.url}",
            *FOLLOW,
        ],
        cwd=REPO,
        env=base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        deadline = time.monotonic() + 120
        for line in process.stderr:  # the lines arrive as the job moves; EOF ends the loop
            seen.append(line)
            if " is JOB_STATE_RUNNING" in line or time.monotonic() > deadline:
                break
        assert any(" is JOB_STATE_RUNNING" in line for line in seen), "".join(seen)
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 130, "".join(seen) + rest
    assert f"--attach={running}" in rest and "keeps running" in rest
    assert "Traceback" not in rest
    assert vertex_stand_in.state_of(running) == "JOB_STATE_RUNNING"
    assert f"/v1/{running}:cancel" not in [r["path"] for r in vertex_stand_in.requests]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--attach=1", "--cancel=1"], "--attach and --cancel are both set"),
        (["--attach=77"], "needs --project and --region"),
        (["--attach=77", f"--project={PROJECT}", f"--region={REGION}", "--dry_run"], "--dry_run"),
        (["--job_config=x.json", "--cancel=projects/p/locations/r/customJobs/1"], "--job_config"),
        ([*COMMON, "--dry_run", "--wait"], "--dry_run creates none"),
        (["--attach=projects/p/locations/r/customJobs/1", "--poll_seconds=0"], "--poll_seconds"),
    ],
)
def test_following_usage_errors_are_one_line(flags, expected):
    result = submit(*flags, timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and expected in line
