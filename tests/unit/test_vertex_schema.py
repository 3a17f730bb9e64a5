"""Every dry-run output parses as the Vertex AI API's own message type, with
unknown fields refused: the real schema (google-cloud-aiplatform), not a copy."""

import itertools
import json

import pytest

from tfdist.errors import UsageError
from trainer.vertex import options, rendering, tuning
from trainer.vertex import spec as spec_lib

aiplatform_v1 = pytest.importorskip("google.cloud.aiplatform_v1")
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
OUR_IMAGE = "us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"
PACKAGES = [
    "gs://my-bucket/tfdist/packages/tfdist-0.1.0-0123456789abcdef.tar.gz",
    "gs://my-bucket/tfdist/packages/my_task-1.0-fedcba9876543210.tar.gz",
]


def strict_custom_job(job: dict):
    return aiplatform_v1.CustomJob.from_json(json.dumps(job), ignore_unknown_fields=False)


def strict_tuning_job(job: dict):
    return aiplatform_v1.HyperparameterTuningJob.from_json(
        json.dumps(job), ignore_unknown_fields=False
    )


A100 = {
    "machine_type": "a2-highgpu-8g",
    "accelerator_type": "NVIDIA_TESLA_A100",
    "accelerator_count": 8,
}
SHAPES = {
    "default cpu": {"strategy": "default"},
    "mirrored a100": {"strategy": "mirrored", **A100},
    "multiworker reduction server": {
        "strategy": "multiworker",
        "workers": 2,
        "reduction_servers": 10,
        **A100,
    },
    "parameter servers + evaluator": {
        "strategy": "parameter_server",
        "workers": 3,
        "parameter_servers": 2,
        "evaluators": 1,
        "parameter_server_machine_type": "n2-highmem-8",
        "evaluator_machine_type": "n2-standard-8",
    },
    "auto evaluator only": {"strategy": "auto", "evaluators": 1},
    "tpu v5e": {
        "strategy": "tpu",
        "machine_type": "ct5lp-hightpu-4t",
        "accelerator_type": "TPU_V5_LITEPOD",
        "accelerator_count": 4,
        "tpu_topology": "2x2",
    },
    "tpu v3": {
        "strategy": "tpu",
        "machine_type": "cloud-tpu",
        "accelerator_type": "TPU_V3",
        "accelerator_count": 8,
    },
    "l4 multiworker": {
        "strategy": "multiworker",
        "workers": 1,
        "machine_type": "g2-standard-24",
        "accelerator_type": "NVIDIA_L4",
        "accelerator_count": 2,
    },
    "a4x multi-arch image, no disk type sent": {
        "strategy": "mirrored",
        "machine_type": "a4x-highgpu-4g",
        "accelerator_type": "NVIDIA_GB200",
        "accelerator_count": 4,
        "image_architecture": "multi",
    },
}
EXTRAS = {
    "plain": {},
    "spot with timeout": {"scheduling": "spot", "timeout": "1h"},
    "flex start": {"scheduling": "flex_start", "max_wait_duration": "2h", "timeout": "1d"},
    "no retries": {"disable_retries": True},
    "whole-job restarts": {"restart_job_on_worker_restart": True},
    "vpc and any reservation": {
        "network": "projects/42/global/networks/peered",
        "reservation_affinity": "any",
    },
    "specific reservation": {
        "reservation_affinity": "specific:projects/my-project/zones/us-central1-a/"
        "reservations/res-1"
    },
    "no reservation": {"reservation_affinity": "none"},
    "cmek": {
        "kms_key_name": "projects/kms-proj/locations/us-central1/keyRings/ring/cryptoKeys/key"
    },
    "tensorboard, env, labels, web access": {
        "tensorboard": "projects/my-project/locations/us-central1/tensorboards/12",
        "service_account": "trainer@my-project.iam.gserviceaccount.com",
        "env": ("API_KEY=secret",),
        "labels": "team=vision",
        "enable_web_access": True,
    },
    "hyperdisk": {"boot_disk_type": "hyperdisk-balanced", "boot_disk_size_gb": 500},
    "persistent resource, experiment, nfs": {
        "persistent_resource_id": "pool-1",
        "experiment": "exp-1",
        "experiment_run": "run-1",
        "network": "projects/42/global/networks/peered",
        "nfs_mount": ("10.0.0.2:/share:data", "nfs.example.com:/x/y:more"),
    },
    "prebuilt image with a task package": {"container_uri": PREBUILT, "allow_ended_image": True},
}
STUDY = tuning.TuningSpec(
    metric="val_accuracy",
    goal="maximize",
    max_trial_count=8,
    parallel_trial_count=2,
    parameters=(
        tuning.parse_parameter("learning_rate", "double:1e-4:1e-1:log"),
        tuning.parse_parameter("epochs", "integer:1:4"),
        tuning.parse_parameter("global_batch_size", "discrete:64,128"),
        tuning.parse_parameter("optimizer", "categorical:sgd,adam"),
    ),
)


def _spec(values):
    merged = options.merge_options(
        {},
        {
            "project": "my-project",
            "region": "us-central1",
            "staging_bucket": "gs://my-bucket",
            "container_uri": OUR_IMAGE,
            "trainer_args": ("--epochs=2",),
            **values,
        },
    )
    return spec_lib.JobSpec.from_options(merged, timestamp="20261130-000000")


def test_a_matrix_of_flag_combinations_parses_strictly():
    """What the dry run prints (rendering + redaction) for shapes x options."""
    rendered, refused = 0, []
    for (shape_name, shape), (extra_name, extra) in itertools.product(
        SHAPES.items(), EXTRAS.items()
    ):
        try:
            spec = _spec({**shape, **extra})
        except UsageError as error:
            refused.append((shape_name, extra_name, str(error)))
            continue
        uris = PACKAGES if spec.uses_python_package else ()
        custom = rendering.redact_env(rendering.build_custom_job(spec, package_uris=uris))
        parsed = strict_custom_job(custom)
        assert parsed.display_name == spec.display_name
        study = rendering.redact_env(tuning.build_tuning_job(spec, STUDY, package_uris=uris))
        strict_tuning_job(study)
        rendered += 1
    # Only flex_start is refused, where the documented rule says so (GPUs, one machine type).
    assert rendered == len(SHAPES) * len(EXTRAS) - len(refused) >= 85, refused
    # ... and the ARM machine with a prebuilt (amd64-only) image.
    assert {
        extra_name for shape_name, extra_name, _ in refused if not shape_name.startswith("a4x")
    } == {"flex start"}, refused
    assert {
        extra_name
        for shape_name, extra_name, message in refused
        if shape_name.startswith("a4x") and "amd64" in message
    } == {"prebuilt image with a task package"}, refused
