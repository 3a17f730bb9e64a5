"""`python -m trainer.submit` refuses, as Vertex AI would, before anything is
built or sent: one `error:` line, exit 2, at most ~100 characters of the value.

Every case here was accepted by the dry run (or crashed) before these checks."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(REPO, "configs", "jobs")
OUR_IMAGE = "us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
COMMON = ["--project=my-project", "--region=us-central1", "--staging_bucket=gs://my-bucket"]
A100X8 = [
    "--machine_type=a2-highgpu-8g",
    "--accelerator_type=NVIDIA_TESLA_A100",
    "--accelerator_count=8",
]
V5E = [
    "--strategy=tpu",
    "--machine_type=ct5lp-hightpu-4t",
    "--accelerator_type=TPU_V5_LITEPOD",
    "--accelerator_count=4",
]


def submit(*args, env=None, timeout=120):
    env = env or dict(
        os.environ,
        PYTHONPATH=REPO,
        GOOGLE_APPLICATION_CREDENTIALS=os.path.join(REPO, "no-such-file.json"),
    )
    return subprocess.run(
        [sys.executable, "-m", "trainer.submit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_usage_error(result, *expected):
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert len(lines[0]) < 700, f"the error line is {len(lines[0])} characters"
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


REFUSED = {
    "unknown region": (["--region=moon-east1"], "moon-east1"),
    "A100 on a CPU machine": (
        [
            "--machine_type=n2-standard-4",
            "--accelerator_type=NVIDIA_TESLA_A100",
            "--accelerator_count=1",
        ],
        "not offered on n2-standard-4",
    ),
    "H100 on an A100 machine": (
        [
            "--machine_type=a2-highgpu-8g",
            "--accelerator_type=NVIDIA_H100_80GB",
            "--accelerator_count=8",
        ],
        "comes with NVIDIA_TESLA_A100",
    ),
    "3 A100s on an 8-GPU machine": (
        [
            "--machine_type=a2-highgpu-8g",
            "--accelerator_type=NVIDIA_TESLA_A100",
            "--accelerator_count=3",
        ],
        "--accelerator_count is 3, expected 8",
    ),
    "GPU machine without its GPUs": (
        ["--machine_type=a2-highgpu-8g"],
        "comes with 8 x NVIDIA_TESLA_A100",
    ),
    "GPU machine for the evaluator": (
        ["--evaluators=1", "--evaluator_machine_type=a2-highgpu-1g"],
        "expected a CPU machine type",
    ),
    "3 T4s on N1": (
        [
            "--machine_type=n1-standard-8",
            "--accelerator_type=NVIDIA_TESLA_T4",
            "--accelerator_count=3",
        ],
        "expected 1 or 2 or 4",
    ),
    "TPU v5e without topology": (V5E, "--tpu_topology is not set"),
    "TPU v5e with a nonsense topology": (V5E + ["--tpu_topology=banana"], "'banana'"),
    "TPU v5e with more chips than the machine has": (
        V5E[:-1] + ["--accelerator_count=8", "--tpu_topology=2x4"],
        "--accelerator_count is 8, expected 4",
    ),
    "topology on a GPU machine": (A100X8 + ["--tpu_topology=2x2"], "needs a TPU machine"),
    "a million workers": (
        ["--strategy=multiworker", "--workers=1000000"],
        "--workers is 1000000, expected a whole number from 0 to 1000",
    ),
    "a count past int32": (
        ["--strategy=multiworker", "--workers=99999999999"],
        "--workers is 99999999999",
    ),
    "accelerator count past int32": (
        [
            "--machine_type=n1-standard-8",
            "--accelerator_type=NVIDIA_TESLA_T4",
            "--accelerator_count=4294967297",
        ],
        "--accelerator_count is 4294967297",
    ),
    "10 GB boot disk": (
        ["--boot_disk_size_gb=10"],
        "--boot_disk_size_gb is 10, expected a whole number from 100 to 64000",
    ),
    "unknown disk type": (["--boot_disk_type=floppy"], "--boot_disk_type is 'floppy'"),
    "empty reduction server image": (
        [
            "--strategy=multiworker",
            "--workers=1",
            "--reduction_servers=2",
            "--reduction_server_image=",
        ]
        + A100X8,
        "--reduction_server_image is empty",
    ),
    "not an image": (["--container_uri=not an image"], "--container_uri is 'not an image'"),
    "project name instead of id": (["--project=My Project!"], "--project is 'My Project!'"),
    "max wait without flex start": (
        ["--max_wait_duration=2h"],
        "applies only with --scheduling=flex_start",
    ),
    "disable retries with whole-job restarts": (
        ["--disable_retries", "--restart_job_on_worker_restart"],
        "contradict",
    ),
    "network by project id": (
        ["--network=projects/my-project/global/networks/vpc"],
        "PROJECT_NUMBER",
    ),
    "reservation without a name": (
        ["--reservation_affinity=specific:"],
        "--reservation_affinity is 'specific:'",
    ),
    "reservation with flex start": (
        A100X8 + ["--scheduling=flex_start", "--reservation_affinity=any"],
        "does not apply with --scheduling=flex_start",
    ),
    "kms key in another region": (
        ["--kms_key_name=projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k"],
        "expected a key in the job's region us-central1",
    ),
    "kms key malformed": (["--kms_key_name=my-key"], "--kms_key_name is 'my-key'"),
    "task package with our image": (["--task_package=/tmp"], "needs a Vertex AI prebuilt"),
    "malformed endpoint": (
        ["--api_endpoint=http://127.0.0.1:abc"],
        "--api_endpoint is 'http://127.0.0.1:abc'",
    ),
    "service account without a domain": (
        ["--service_account=trainer@"],
        "--service_account is 'trainer@'",
    ),
}


@pytest.mark.parametrize("flags,expected", REFUSED.values(), ids=REFUSED.keys())
def test_refused_before_anything_is_built(flags, expected):
    result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", *flags, "--dry_run")
    assert_one_line_usage_error(result, expected)


@pytest.mark.parametrize(
    "trainer_args, expected",
    [
        (["--epochs=x"], "epochs"),
        (["--bogus=1"], "Unknown command line flag 'bogus'"),
        (["-strategy=mirrored"], "--strategy appears after --"),
    ],
)
def test_trainer_flags_after_dashdash_are_refused_with_the_trainers_table(trainer_args, expected):
    result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", "--dry_run", "--", *trainer_args)
    assert_one_line_usage_error(result, expected)


def test_the_shipped_tpu_shape_and_valid_machines_still_pass():
    for flags in (
        V5E + ["--tpu_topology=2x2"],
        A100X8,
        ["--machine_type=g2-standard-24", "--accelerator_type=NVIDIA_L4", "--accelerator_count=2"],
        [
            "--machine_type=n1-highmem-16",
            "--accelerator_type=NVIDIA_TESLA_V100",
            "--accelerator_count=8",
        ],
        [
            "--machine_type=cloud-tpu",
            "--accelerator_type=TPU_V3",
            "--accelerator_count=8",
            "--strategy=tpu",
        ],
    ):
        result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", *flags, "--dry_run")
        assert result.returncode == 0, (flags, result.stderr)


def test_a_long_value_is_quoted_short():
    value = "x" * 100_000  # near the kernel's limit for one argument
    for flag in ("--region", "--project", "--container_uri", "--network", "--labels"):
        line = assert_one_line_usage_error(
            submit(*COMMON, f"--container_uri={OUR_IMAGE}", f"{flag}={value}", "--dry_run")
        )
        assert "x" * 101 not in line, flag


def test_a_long_value_in_a_config_file_is_quoted_short(tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"container_uri": "y" * 900_000}))
    line = assert_one_line_usage_error(
        submit(*COMMON, f"--job_config={config}", "--dry_run"), "--container_uri is"
    )
    assert "y" * 101 not in line


def test_a_huge_int_flag_value_is_quoted_short():
    line = assert_one_line_usage_error(
        submit(
            *COMMON, f"--container_uri={OUR_IMAGE}", "--workers=" + "9" * 50_000 + "x", "--dry_run"
        )
    )
    assert "9" * 101 not in line


def test_a_huge_job_config_is_not_read(tmp_path):
    config = tmp_path / "huge.json"
    with open(config, "wb") as handle:
        handle.write(b'{"workers": 1, "description": "')
        handle.truncate(200 << 20)  # 200 MB (sparse: costs no disk)
    report = tmp_path / "peak_kb"
    # VmHWM, not ru_maxrss: Linux carries the parent's peak into ru_maxrss across
    # fork and exec, so under a large pytest process it reports pytest's memory.
    wrapper = (
        "import runpy, sys\n"
        "try:\n"
        "    runpy.run_module('trainer.submit', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        "    peak = [line.split()[1] for line in open('/proc/self/status')\n"
        "            if line.startswith('VmHWM:')][0]\n"
        f"    open({str(report)!r}, 'w').write(peak)\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            *COMMON,
            f"--container_uri={OUR_IMAGE}",
            f"--job_config={config}",
            "--dry_run",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_usage_error(result, "is larger than 1048576 bytes")
    peak_kb = int(report.read_text())
    assert peak_kb < 150_000, f"the submitter peaked at {peak_kb} kB reading a 200 MB file"


def test_a_directory_as_job_config_is_called_a_directory(tmp_path):
    assert_one_line_usage_error(
        submit(*COMMON, f"--job_config={tmp_path}", "--dry_run"), "is a directory"
    )


def test_missing_build_names_the_extra(tmp_path):
    """Without the vertex extra's `build`, a prebuilt-image job says what to install."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "build.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'build'\", name='build')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), REPO]))
    for extra in (["--dry_run"], ["--api_endpoint=http://127.0.0.1:9"]):
        result = submit(
            *COMMON, f"--container_uri={PREBUILT}", "--allow_ended_image", *extra, env=env
        )
        assert_one_line_usage_error(result, "'build'", "pip install 'tfdist[vertex]'")


def test_missing_client_library_names_the_extra():
    """Without google-cloud-aiplatform, a real submission says what to install."""
    wrapper = (
        "import runpy, sys\n"
        "sys.modules['google.cloud.aiplatform_v1'] = None  # as if not installed\n"
        "runpy.run_module('trainer.submit', run_name='__main__', alter_sys=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            *COMMON,
            f"--container_uri={OUR_IMAGE}",
            "--api_endpoint=http://127.0.0.1:9",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_usage_error(
        result, "google.cloud.aiplatform_v1", "pip install 'tfdist[vertex]'"
    )
