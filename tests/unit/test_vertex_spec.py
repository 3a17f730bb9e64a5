"""The job model (trainer.vertex.spec): impossible shapes refused, and the CustomJob
it becomes (trainer.vertex.rendering)."""

import json

import pytest

from tfdist.errors import UsageError
from trainer import submission
from trainer.vertex import machines, option_values, options, rendering
from trainer.vertex import spec as spec_lib

OUR_IMAGE = "us-central1-docker.pkg.dev/p/tfdist/trainer:0.1.0"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
PACKAGE = "gs://my-bucket/tfdist/packages/tfdist-0.1.0-0123456789abcdef.tar.gz"


def _load(path):
    return submission.read_json_object(
        str(path), flag="--job_config", keys=options.CONFIG_KEYS, example="configs/jobs/x.json"
    )


def make_spec(**values):
    """A JobSpec from flag-style values over a minimal valid CPU job."""
    flag_values = {
        "project": "my-project",
        "region": "us-central1",
        "staging_bucket": "gs://my-bucket",
        "container_uri": OUR_IMAGE,
        **values,
    }
    merged = options.merge_options({}, flag_values)
    return spec_lib.JobSpec.from_options(merged, timestamp="20261130-000000")


GPU = {
    "machine_type": "a2-highgpu-8g",
    "accelerator_type": "NVIDIA_TESLA_A100",
    "accelerator_count": 8,
}

IMPOSSIBLE = {
    "reduction server with parameter servers": (
        dict(
            strategy="parameter_server", workers=2, parameter_servers=1, reduction_servers=2, **GPU
        ),
        "both use worker pool 2",
    ),
    "reduction server without workers": (
        dict(strategy="multiworker", reduction_servers=2, **GPU),
        "needs GPU workers",
    ),
    "reduction server on CPU workers": (
        dict(strategy="multiworker", workers=1, reduction_servers=2),
        "needs GPU workers",
    ),
    "reduction server with auto": (
        dict(strategy="auto", workers=1, reduction_servers=1, **GPU),
        "needs --strategy=multiworker",
    ),
    "reduction server with mirrored": (
        dict(strategy="mirrored", workers=1, reduction_servers=1, **GPU),
        "needs --strategy=multiworker",
    ),
    "parameter_server without parameter servers": (
        dict(strategy="parameter_server", workers=2),
        "--parameter_servers=0; set --parameter_servers=1",
    ),
    "parameter_server without workers": (
        dict(strategy="parameter_server", parameter_servers=2),
        "got --workers=0, --parameter_servers=2; set --workers=1",
    ),
    "parameter servers under multiworker": (
        dict(strategy="multiworker", workers=2, parameter_servers=1),
        "set --strategy=parameter_server, or --parameter_servers=0",
    ),
    "negative workers": (dict(strategy="multiworker", workers=-1), "--workers is -1"),
    "negative evaluators": (dict(evaluators=-2), "--evaluators is -2"),
    "negative accelerator count": (
        dict(accelerator_type="NVIDIA_L4", accelerator_count=-1),
        "--accelerator_count is -1",
    ),
    "unknown strategy": (dict(strategy="horovod"), "--strategy is 'horovod'"),
    "unknown scheduling": (dict(scheduling="preemptible"), "--scheduling is 'preemptible'"),
    "mirrored with workers": (
        dict(strategy="mirrored", workers=3),
        "--strategy=mirrored trains in one process, got --workers=3",
    ),
    "tpu strategy without TPU": (dict(strategy="tpu"), "needs a TPU --accelerator_type"),
    "TPU machine without tpu strategy": (
        dict(
            strategy="mirrored",
            machine_type="ct5lp-hightpu-4t",
            tpu_topology="2x2",
            accelerator_type="TPU_V5_LITEPOD",
            accelerator_count=4,
        ),
        "expected --strategy=tpu",
    ),
    "tpu with workers": (
        dict(
            strategy="tpu",
            workers=1,
            machine_type="ct5lp-hightpu-4t",
            tpu_topology="2x2",
            accelerator_type="TPU_V5_LITEPOD",
            accelerator_count=4,
        ),
        "single TPU VM replica",
    ),
    "unknown accelerator": (
        dict(accelerator_type="NVIDIA_GTX_1080", accelerator_count=1),
        "NVIDIA_GTX_1080",
    ),
    "accelerator type without count": (dict(accelerator_type="NVIDIA_L4"), "--accelerator_count=0"),
    "flex_start on CPU": (dict(scheduling="flex_start"), "needs GPU machines"),
    "flex_start with reduction server": (
        dict(
            strategy="multiworker", workers=1, reduction_servers=2, scheduling="flex_start", **GPU
        ),
        "same machine in every worker pool",
    ),
    "flex_start longer than 7 days": (
        dict(scheduling="flex_start", timeout="8d", **GPU),
        "at most 7 days",
    ),
    "two evaluators": (dict(evaluators=2), "expected 0 or 1"),
    "strategy after --": (dict(trainer_args=("--strategy=mirrored",)), "appears after --"),
    "tensorboard without service account": (
        dict(tensorboard="projects/p/locations/us-central1/tensorboards/1"),
        "needs --service_account",
    ),
    "bad duration": (dict(timeout="ten minutes"), "--timeout is 'ten minutes'"),
    "bad label": (dict(labels="Team=Vision"), "--labels has 'Team=Vision'"),
    "no container": (dict(container_uri=""), "--container_uri is empty"),
    "output dir not on GCS": (dict(base_output_dir="/tmp/out"), "expected a gs:// URI"),
    "env overriding Vertex variables": (dict(env=("TF_CONFIG=x",)), "sets TF_CONFIG"),
}


@pytest.mark.parametrize("values,expected", IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
def test_impossible_shapes_are_refused_with_one_line(values, expected):
    with pytest.raises(UsageError) as caught:
        make_spec(**values)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message


def test_parameter_server_pools_and_empty_pool_between():
    job = rendering.build_custom_job(
        make_spec(strategy="parameter_server", parameter_servers=2, workers=3)
    )
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert [pool["replicaCount"] for pool in pools] == [1, 3, 2]
    job = rendering.build_custom_job(make_spec(strategy="auto", evaluators=1))
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert pools[1] == {} and pools[2] == {}, "unused pools before the evaluator are {}"
    assert pools[3]["replicaCount"] == 1
    assert pools[3]["containerSpec"]["args"] == [
        "--strategy=auto",
        "--max_restarts_without_progress=3",
    ]


def test_single_replica_job_has_only_pool_zero():
    job = rendering.build_custom_job(make_spec(strategy="default"))
    assert len(job["jobSpec"]["workerPoolSpecs"]) == 1


def test_reduction_server_pool_runs_the_configured_image_not_our_code():
    spec = make_spec(
        strategy="multiworker",
        workers=1,
        reduction_servers=7,
        reduction_server_image="europe-docker.pkg.dev/vertex-ai-restricted/"
        "training/reductionserver:latest",
        **GPU,
    )
    pools = rendering.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"]
    assert pools[2] == {
        "machineSpec": {"machineType": "n1-highcpu-16"},
        "replicaCount": 7,
        "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100},
        "containerSpec": {
            "imageUri": "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
        },
    }


def test_default_reduction_server_image_is_the_documented_one():
    assert (
        options.DEFAULT_REDUCTION_SERVER_IMAGE
        == "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    )


def test_prebuilt_image_runs_the_staged_package_in_every_pool_of_ours():
    spec = make_spec(
        strategy="parameter_server",
        workers=2,
        parameter_servers=1,
        evaluators=1,
        container_uri=PREBUILT,
        allow_ended_image=True,
        trainer_args=("--epochs=3",),
    )
    assert spec.uses_python_package
    pools = rendering.build_custom_job(spec, package_uris=[PACKAGE])["jobSpec"]["workerPoolSpecs"]
    for pool in pools:
        assert pool["pythonPackageSpec"] == {
            "executorImageUri": PREBUILT,
            "packageUris": [PACKAGE],
            "pythonModule": "trainer.task",
            "args": [
                "--strategy=parameter_server",
                "--max_restarts_without_progress=3",
                "--epochs=3",
            ],
            "env": [{"name": "TFDIST_POOL2_ROLE", "value": "parameter_server"}],
        }
    with pytest.raises(UsageError, match="runs a Python package"):
        rendering.build_custom_job(spec)


def test_our_image_gets_a_container_spec_and_refuses_a_package():
    spec = make_spec(strategy="multiworker", workers=1)
    pool = rendering.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"][1]
    assert pool["containerSpec"] == {
        "imageUri": OUR_IMAGE,
        "command": ["python", "-m", "trainer.task"],
        "args": ["--strategy=multiworker", "--max_restarts_without_progress=3"],
    }
    with pytest.raises(UsageError, match="our own image"):
        rendering.build_custom_job(spec, package_uris=[PACKAGE])


@pytest.mark.parametrize(
    "image,prebuilt",
    [
        ("us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest", True),
        ("europe-docker.pkg.dev/vertex-ai/training/tf-cpu.2-16.py310:latest", True),
        ("us-central1-docker.pkg.dev/p/tfdist/trainer:0.1.0", False),
        ("tensorflow/tensorflow:2.21.0-gpu", False),
        ("us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest", False),
    ],
)
def test_prebuilt_image_detection(image, prebuilt):
    assert spec_lib.is_prebuilt_image(image) is prebuilt


def test_scheduling_and_identity_fields():
    spec = make_spec(
        scheduling="spot",
        timeout="2h",
        restart_job_on_worker_restart=True,
        service_account="trainer@p.iam.gserviceaccount.com",
        tensorboard="projects/p/locations/us-central1/tensorboards/7",
        labels="team=vision,run=exp-1",
        enable_web_access=True,
    )
    job = rendering.build_custom_job(spec)
    assert job["jobSpec"]["scheduling"] == {
        "strategy": "SPOT",
        "timeout": "7200s",
        "restartJobOnWorkerRestart": True,
    }
    assert job["jobSpec"]["serviceAccount"] == "trainer@p.iam.gserviceaccount.com"
    assert job["jobSpec"]["tensorboard"] == "projects/p/locations/us-central1/tensorboards/7"
    assert job["jobSpec"]["enableWebAccess"] is True
    assert job["labels"] == {"run": "exp-1", "team": "vision"}


def test_flex_start_wait_zero_means_no_limit():
    spec = make_spec(scheduling="flex_start", max_wait_duration="0", **GPU)
    job = rendering.build_custom_job(spec)
    assert job["jobSpec"]["scheduling"] == {"strategy": "FLEX_START", "maxWaitDuration": "0s"}


@pytest.mark.parametrize(
    "text,seconds",
    [("3600", 3600), ("3600s", 3600), ("90m", 5400), ("2h", 7200), ("1d12h", 129600), ("", None)],
)
def test_durations(text, seconds):
    assert option_values.parse_duration("timeout", text) == seconds


def test_default_output_dir_is_under_the_staging_bucket():
    spec = make_spec(display_name="my run")
    assert spec.base_output_dir == "gs://my-bucket/tfdist-jobs/my-run-20261130-000000"
    job = rendering.build_custom_job(spec)
    assert job["jobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": spec.base_output_dir}


def test_config_file_values_are_overridden_by_flags(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(
        json.dumps(
            {
                "strategy": "multiworker",
                "workers": 4,
                "container_uri": "{region}-docker.pkg.dev/{project}/tfdist/trainer:0.1.0",
                "trainer_args": ["--epochs=1", "--model=cnn"],
                "env": {"A": "1"},
            }
        )
    )
    merged = options.merge_options(
        _load(path),
        {
            "project": "my-proj",
            "region": "europe-west4",
            "workers": 2,
            "staging_bucket": "gs://my-bucket",
            "trainer_args": ("--epochs=5",),
            "env": ["B=2"],
        },
    )
    spec = spec_lib.JobSpec.from_options(merged, timestamp="t")
    assert spec.workers == 2
    assert spec.container_uri == "europe-west4-docker.pkg.dev/my-proj/tfdist/trainer:0.1.0"
    assert spec.task_args == (
        "--strategy=multiworker",
        "--max_restarts_without_progress=3",
        "--epochs=1",
        "--model=cnn",
        "--epochs=5",
    )
    assert spec.env == (("A", "1"), ("B", "2"))


def test_unknown_config_key_is_refused(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"worker_count": 2}))
    with pytest.raises(UsageError, match="unknown key.*worker_count"):
        _load(path)


def test_env_values_are_redacted_for_printing_but_kept_for_sending():
    spec = make_spec(env=("API_KEY=sk-live-123",), workers=1, strategy="multiworker")
    job = rendering.build_custom_job(spec)
    shown = rendering.redact_env(job)
    assert "sk-live-123" not in json.dumps(shown)
    assert shown["jobSpec"]["workerPoolSpecs"][1]["containerSpec"]["env"] == [
        {"name": "API_KEY", "value": rendering.REDACTED}
    ]
    assert job["jobSpec"]["workerPoolSpecs"][1]["containerSpec"]["env"] == [
        {"name": "API_KEY", "value": "sk-live-123"}
    ]


def test_tpu_job_gets_local_tpu_flag_unless_given():
    values = dict(
        strategy="tpu",
        machine_type="ct5lp-hightpu-4t",
        accelerator_type="TPU_V5_LITEPOD",
        accelerator_count=4,
        tpu_topology="2x2",
    )
    assert make_spec(**values).task_args == (
        "--strategy=tpu",
        "--tpu=local",
        "--max_restarts_without_progress=3",
    )
    assert make_spec(**values, trainer_args=("--tpu=my-tpu",)).task_args == (
        "--strategy=tpu",
        "--max_restarts_without_progress=3",
        "--tpu=my-tpu",
    )


def test_accelerator_names_match_the_installed_sdk():
    types = pytest.importorskip("google.cloud.aiplatform_v1.types.accelerator_type")
    names = {item.name for item in types.AcceleratorType} - {"ACCELERATOR_TYPE_UNSPECIFIED"}
    assert set(machines.ACCELERATORS) | set(machines.NOT_OFFERED_FOR_TRAINING) == names


def test_the_crash_loop_guard_is_written_into_the_job_unless_the_trainer_args_set_it():
    assert "--max_restarts_without_progress=3" in make_spec().task_args
    own = make_spec(trainer_args=("--max_restarts_without_progress=7",)).task_args
    assert [arg for arg in own if "max_restarts" in arg] == ["--max_restarts_without_progress=7"]


_WRONG_JSON_TYPES = (5, 2.5, True, None, "", "x", [], ["x", 1], {}, {"a": 1})


@pytest.mark.parametrize("name", options.CONFIG_KEYS)
def test_a_job_config_value_of_any_json_type_is_a_job_or_one_line(tmp_path, name):
    # trainer.submit turns a UsageError into one line and exit 2; anything else is a traceback.
    for value in _WRONG_JSON_TYPES:
        path = tmp_path / "job.json"
        path.write_text(json.dumps({name: value}))
        try:
            make_spec(**_load(path))
        except UsageError:
            pass


@pytest.mark.parametrize(
    "values, expected",
    [
        (
            {"reserved_ip_ranges": 5, "network": "projects/1/global/networks/n"},
            "--reserved_ip_ranges is 5, expected the names of reserved IP ranges "
            "(lowercase letters, digits, hyphens), comma-separated or a list",
        ),
        (
            {"lustre_mount": 5, "network": "projects/1/global/networks/n"},
            "lustre_mount is 5, expected a list of "
            "INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT items",
        ),
    ],
)
def test_a_list_option_given_a_number_is_one_line(tmp_path, values, expected):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(values))
    with pytest.raises(UsageError) as raised:
        make_spec(**_load(path))
    assert str(raised.value) == expected


@pytest.mark.parametrize(
    "name, file_value, flag_value",
    [
        ("nfs_mount", 5, ("10.0.0.2:/share:data",)),
        ("nfs_mount", {"a": "b"}, ("10.0.0.2:/share:data",)),
        ("lustre_mount", "10.90.1.4:v:lfs:data", ("10.90.1.4:v:lfs:other",)),
        ("trainer_args", "--epochs=2", ("--epochs=3",)),
    ],
)
def test_an_accumulating_option_of_the_wrong_type_in_the_file_is_named(
    tmp_path, name, file_value, flag_value
):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({name: file_value}))
    with pytest.raises(UsageError) as raised:
        options.merge_options(_load(path), {name: flag_value})
    assert str(raised.value) == (
        f"{name} is {file_value!r}, expected a list (the config file's items, then the flags')"
    )
