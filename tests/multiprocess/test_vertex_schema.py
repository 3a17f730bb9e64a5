"""Every dry-run output parses as the Vertex AI API's own message type, with
unknown fields refused: the real schema (google-cloud-aiplatform), not a copy."""

import json
import os
import subprocess
import sys

import pytest

from tests.unit.test_vertex_schema import (  # shared with the in-process half
    strict_custom_job,
    strict_tuning_job,
)

aiplatform_v1 = pytest.importorskip("google.cloud.aiplatform_v1")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = sorted(
    name for name in os.listdir(os.path.join(REPO, "configs", "jobs")) if name.endswith(".json")
)
STUDIES = sorted(
    name for name in os.listdir(os.path.join(REPO, "configs", "tuning")) if name.endswith(".json")
)
COMMON = [
    "--project=my-project",
    "--region=us-central1",
    "--staging_bucket=gs://my-bucket",
    "--service_account=trainer@my-project.iam.gserviceaccount.com",
]


def dry_run(*flags):
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-m", "trainer.submit", *COMMON, *flags, "--dry_run", "--", "--epochs=1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("config", JOBS)
def test_every_shipped_shape_parses_strictly(config):
    job = dry_run(
        f"--job_config={os.path.join(REPO, 'configs', 'jobs', config)}",
        "--network=projects/123456789/global/networks/vpc",
        "--disable_retries",
        "--restart_job_on_worker_restart=false",
        "--kms_key_name=projects/p/locations/us-central1/keyRings/r/cryptoKeys/k",
    )
    parsed = strict_custom_job(job)
    assert parsed.job_spec.network == "projects/123456789/global/networks/vpc"
    assert parsed.job_spec.scheduling.disable_retries is True
    assert parsed.encryption_spec.kms_key_name.endswith("/cryptoKeys/k")
    assert len(parsed.job_spec.worker_pool_specs) == len(job["jobSpec"]["workerPoolSpecs"])


@pytest.mark.parametrize("study", STUDIES)
def test_every_shipped_study_parses_strictly(study):
    job = dry_run(
        f"--job_config={os.path.join(REPO, 'configs', 'jobs', JOBS[0])}",
        f"--hparam_tuning={os.path.join(REPO, 'configs', 'tuning', study)}",
    )
    parsed = strict_tuning_job(job)
    assert parsed.max_trial_count == job["maxTrialCount"]
    assert len(parsed.study_spec.parameters) == len(job["studySpec"]["parameters"])
