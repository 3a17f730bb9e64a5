"""Jobs that run as asked on today's Vertex AI (2026-12-01): Reduction Server with NCCL and
enough reducers, images Vertex still lists, machine rules, and the bill the submitter prints."""

import datetime

import pytest

from tfdist.errors import UsageError
from trainer.vertex import bill, images, options, rendering, tuning
from trainer.vertex import spec as spec_lib

OUR_IMAGE = "us-central1-docker.pkg.dev/p/tfdist/trainer:0.1.0"
A100X8 = {
    "machine_type": "a2-highgpu-8g",
    "accelerator_type": "NVIDIA_TESLA_A100",
    "accelerator_count": 8,
}
RS = {"strategy": "multiworker", "workers": 1, "reduction_servers": 7, **A100X8}


def make_spec(**values):
    flag_values = {
        "project": "my-project",
        "region": "us-central1",
        "staging_bucket": "gs://my-bucket",
        "container_uri": OUR_IMAGE,
        **values,
    }
    return spec_lib.JobSpec.from_options(
        options.merge_options({}, flag_values), timestamp="20261201-000000"
    )


def pools_of(spec):
    return rendering.build_custom_job(spec)["jobSpec"]["workerPoolSpecs"]


def refused(**values) -> str:
    with pytest.raises(UsageError) as caught:
        make_spec(**values)
    return str(caught.value)


# ------------------------------------------------------------------ Reduction Server


def test_reduction_server_jobs_get_nccl_all_reduce_set_for_them():
    spec = make_spec(**RS, trainer_args=("--epochs=2",))
    for pool in pools_of(spec)[:2]:
        assert pool["containerSpec"]["args"] == [
            "--strategy=multiworker",
            "--all_reduce=nccl",
            "--max_restarts_without_progress=3",  # the crash-loop guard every spec carries
            "--epochs=2",
        ]
    assert any(
        "NCCL (--all_reduce=nccl set by the submitter)" in line for line in bill.bill_lines(spec)
    )


@pytest.mark.parametrize("value", ["ring", "auto"])
def test_reduction_server_with_another_all_reduce_is_refused(value):
    message = refused(**RS, trainer_args=(f"--all_reduce={value}",))
    assert f"--all_reduce={value} after -- with --reduction_servers=7, expected nccl" in message
    assert "reducers are billed and idle" in message


def test_too_few_reducers_for_the_workers_bandwidth_are_refused():
    message = refused(**{**RS, "reduction_servers": 1}, reduction_server_machine_type="e2-small")
    assert "--reduction_servers=1 x 1 Gbps (e2-small) cannot carry 2 x 100 Gbps" in message
    assert "expected at least 200 reducers" in message
    assert "at least 7 reducers" in refused(**{**RS, "reduction_servers": 6})


def test_every_replica_is_told_what_pool_2_runs():
    def markers(spec):
        return [pool.get("containerSpec", {}).get("env") for pool in pools_of(spec)]

    marker = [{"name": "TFDIST_POOL2_ROLE", "value": "reduction_server"}]
    assert markers(make_spec(**RS)) == [marker, marker, None]  # pool 2 runs Vertex's image
    ps = make_spec(strategy="parameter_server", workers=2, parameter_servers=1)
    assert markers(ps) == [[{"name": "TFDIST_POOL2_ROLE", "value": "parameter_server"}]] * 3
    assert markers(make_spec(strategy="multiworker", workers=2)) == [None, None]


def test_users_cannot_set_the_pool_2_marker_themselves():
    assert "TFDIST_POOL2_ROLE" in refused(env=("TFDIST_POOL2_ROLE=ps",))


# ------------------------------------------------------------------------ images


@pytest.mark.parametrize(
    "name, ended", [("tf-gpu.2-17.py310", "2026-07-11"), ("tf-cpu.2-16.py310", "2026-06-28")]
)
def test_prebuilt_images_past_their_end_of_availability_are_refused_with_the_date(name, ended):
    uri = f"us-docker.pkg.dev/vertex-ai/training/{name}:latest"
    message = refused(container_uri=uri)
    assert f"reached its end of availability on {ended}" in message
    assert "docker/cloudbuild.yaml" in message
    # The day before its end it was fine; with the opt-in it is still built.
    day_before = datetime.date.fromisoformat(ended) - datetime.timedelta(days=1)
    assert images.check_training_image(uri, today=day_before).framework_version
    assert make_spec(container_uri=uri, allow_ended_image=True).uses_python_package


@pytest.mark.parametrize(
    "uri",
    [
        "us-docker.pkg.dev/vertex-ai/training/tf-gpu.9-99.py310:latest",
        "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
        "gcr.io/cloud-aiplatform/training/tf-cpu.2-1:latest",
    ],
)
def test_unknown_prebuilt_images_are_refused(uri):
    assert "is not a TensorFlow image Vertex AI lists (as of 2026-12-01" in refused(
        container_uri=uri, allow_ended_image=True
    )


def test_arm_machines_need_an_arm64_image():
    a4x = {
        "machine_type": "a4x-highgpu-4g",
        "accelerator_type": "NVIDIA_GB200",
        "accelerator_count": 4,
        "strategy": "mirrored",
    }
    assert "runs arm64 images only, got an amd64 image" in refused(**a4x)
    assert make_spec(**a4x, image_architecture="multi").machine.machine_type == "a4x-highgpu-4g"
    assert make_spec(**a4x, image_architecture="arm64")
    assert "--image_architecture is 'riscv'" in refused(image_architecture="riscv")


# ---------------------------------------------------------------------- machines


def disk_types(spec):
    return [pool["diskSpec"].get("bootDiskType") for pool in pools_of(spec)]


def test_a3_ultra_boots_from_hyperdisk_and_refuses_persistent_disk():
    a3u = {
        "machine_type": "a3-ultragpu-8g",
        "accelerator_type": "NVIDIA_H200_141GB",
        "accelerator_count": 8,
        "strategy": "mirrored",
    }
    assert disk_types(make_spec(**a3u)) == ["hyperdisk-balanced"]
    assert "boots from Hyperdisk only" in refused(**a3u, boot_disk_type="pd-ssd")


@pytest.mark.parametrize(
    "machine, accelerator, count",
    [
        ("a4-highgpu-8g", "NVIDIA_B200", 8),
        ("g4-standard-48", "NVIDIA_RTX_PRO_6000", 1),
        ("a4x-highgpu-4g", "NVIDIA_GB200", 4),
    ],
)
def test_families_without_a_known_default_disk_let_vertex_decide(machine, accelerator, count):
    spec = make_spec(
        machine_type=machine,
        accelerator_type=accelerator,
        accelerator_count=count,
        strategy="mirrored",
        image_architecture="multi",
    )
    assert disk_types(spec) == [None]
    assert pools_of(spec)[0]["diskSpec"] == {"bootDiskSizeGb": 100}


def test_other_machines_keep_pd_ssd_and_an_explicit_type_is_sent_as_asked():
    assert disk_types(make_spec(**RS)) == ["pd-ssd"] * 3
    assert disk_types(make_spec(boot_disk_type="pd-standard")) == ["pd-standard"]


def test_k80_is_refused():
    message = refused(
        machine_type="n1-standard-8", accelerator_type="NVIDIA_TESLA_K80", accelerator_count=1
    )
    assert "NVIDIA_TESLA_K80 is deprecated" in message and "no kernels" in message


@pytest.mark.parametrize(
    "machine, accelerator, count",
    [
        ("n1-standard-8", "NVIDIA_TESLA_T4", 1),
        ("n1-standard-8", "NVIDIA_TESLA_V100", 1),
        ("g4-standard-48", "NVIDIA_RTX_PRO_6000", 1),
    ],
)
def test_flex_start_is_refused_on_gpus_dws_does_not_list(machine, accelerator, count):
    message = refused(
        machine_type=machine,
        accelerator_type=accelerator,
        accelerator_count=count,
        scheduling="flex_start",
    )
    assert f"--accelerator_type={accelerator}, which Dynamic Workload Scheduler" in message


def test_flex_start_on_gb200_is_refused_and_on_l4_accepted():
    assert "Dynamic Workload Scheduler" in refused(
        machine_type="a4x-highgpu-4g",
        accelerator_type="NVIDIA_GB200",
        accelerator_count=4,
        image_architecture="multi",
        scheduling="flex_start",
    )
    spec = make_spec(
        machine_type="g2-standard-8",
        accelerator_type="NVIDIA_L4",
        accelerator_count=1,
        scheduling="flex_start",
    )
    assert pools_of(spec)[0]["machineSpec"]["acceleratorType"] == "NVIDIA_L4"


# -------------------------------------------------------------------------- bill


def test_the_bill_counts_machines_accelerators_and_the_tuning_peak():
    spec = make_spec(**RS, scheduling="spot")
    study = tuning.TuningSpec(
        metric="val_loss",
        goal="minimize",
        max_trial_count=20,
        parallel_trial_count=4,
        parameters=(tuning.parse_parameter("seed", "integer:1:9"),),
    )
    lines = bill.bill_lines(spec, tuning=study)
    assert lines[1:4] == [
        "  pool 0 chief      1 x a2-highgpu-8g, 8 x NVIDIA_TESLA_A100 each, pd-ssd 100 GB, "
        "our trainer",
        "  pool 1 workers    1 x a2-highgpu-8g, 8 x NVIDIA_TESLA_A100 each, pd-ssd 100 GB, "
        "our trainer",
        "  pool 2 reducers   7 x n1-highcpu-16, pd-ssd 100 GB, Reduction Server",
    ]
    assert lines[4].startswith("  scheduling SPOT")
    assert lines[5] == "  in all: 9 machines, 16 x NVIDIA_TESLA_A100, 7 reducers"
    assert lines[6] == (
        "  tuning: 20 trials, 4 at once: peak 36 machines, 64 x NVIDIA_TESLA_A100, 28 reducers"
    )


# ----------------------------------------------------------------------- serving


def test_the_default_serving_image_is_one_vertex_lists():
    from trainer.vertex import serving

    today = datetime.date(2026, 12, 1)
    images.check_prediction_image(serving.DEFAULT_SERVING_IMAGE, today=today)
    assert "tf2-cpu.2-15" in serving.DEFAULT_SERVING_IMAGE
    with pytest.raises(UsageError, match="is not a TensorFlow image Vertex AI lists"):
        images.check_prediction_image(
            "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-17:latest", today=today
        )
    with pytest.raises(UsageError, match="end of availability on 2027-01-14"):
        images.check_prediction_image(
            serving.DEFAULT_SERVING_IMAGE, today=datetime.date(2027, 1, 15)
        )


# ------------------------------------------------- job options users reach for

NETWORK = "projects/42/global/networks/peered"


def test_persistent_resource_experiment_and_nfs_reach_the_job_spec():
    spec = make_spec(
        persistent_resource_id="pool-1",
        experiment="exp-1",
        experiment_run="run-1",
        network=NETWORK,
        nfs_mount=("10.0.0.2:/share:data",),
    )
    job_spec = rendering.build_custom_job(spec)["jobSpec"]
    assert job_spec["persistentResourceId"] == "pool-1"
    contexts = "projects/my-project/locations/us-central1/metadataStores/default/contexts"
    assert job_spec["experiment"] == f"{contexts}/exp-1"
    assert job_spec["experimentRun"] == f"{contexts}/exp-1-run-1"
    assert job_spec["workerPoolSpecs"][0]["nfsMounts"] == [
        {"server": "10.0.0.2", "path": "/share", "mountPoint": "data"}
    ]
    assert any(
        "on persistent resource pool-1" in line and "/mnt/nfs/data" in line
        for line in bill.bill_lines(spec)
    )


@pytest.mark.parametrize(
    "values, expected",
    [
        (
            {"persistent_resource_id": "projects/p/locations/l/persistentResources/x"},
            "expected the resource's ID",
        ),
        ({"experiment_run": "run-1"}, "--experiment_run='run-1' needs --experiment"),
        ({"experiment": "Exp 1"}, "--experiment is 'Exp 1'"),
        ({"nfs_mount": ("10.0.0.2:/share:data",)}, "--nfs_mount needs --network"),
        (
            {"nfs_mount": ("10.0.0.2/share",), "network": NETWORK},
            "expected SERVER:/PATH:MOUNT_POINT",
        ),
    ],
)
def test_bad_job_options_are_one_line(values, expected):
    assert expected in refused(**values)


def test_tpu_v5e_replicas_get_the_pjrt_variables():
    tpu = {
        "strategy": "tpu",
        "machine_type": "ct5lp-hightpu-4t",
        "accelerator_type": "TPU_V5_LITEPOD",
        "accelerator_count": 4,
        "tpu_topology": "2x2",
    }
    (pool,) = pools_of(make_spec(**tpu))
    assert pool["containerSpec"]["env"] == [
        {"name": "NEXT_PLUGGABLE_DEVICE_USE_C_API", "value": "true"},
        {"name": "TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "value": "/lib/libtpu.so"},
    ]
    shown = rendering.redact_env(rendering.build_custom_job(make_spec(**tpu)))
    assert (
        shown["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]
        == pool["containerSpec"]["env"]
    ), "ours, not secrets: the dry run shows them"
    assert "which the submitter sets for TPU v5e" in refused(
        **tpu, env=("TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/x.so",)
    )


def test_fewer_reducers_go_when_asked_and_the_bill_says_how_many_were_asked_for():
    # 3 x a2-highgpu-4g (50 Gbps each) over n1-highcpu-32 reducers (32 Gbps): the table asks for 5.
    shape = {
        "strategy": "multiworker",
        "workers": 2,
        "reduction_servers": 3,
        "machine_type": "a2-highgpu-4g",
        "accelerator_type": "NVIDIA_TESLA_A100",
        "accelerator_count": 4,
        "reduction_server_machine_type": "n1-highcpu-32",
    }
    message = refused(**shape)
    assert "expected at least 5 reducers" in message and "--allow_fewer_reducers" in message
    spec = make_spec(**shape, allow_fewer_reducers=True)
    assert pools_of(spec)[2]["replicaCount"] == 3
    assert any(
        "3 reducers where the bandwidth table asks for 5 (--allow_fewer_reducers)" in line
        for line in bill.bill_lines(spec)
    )


# ------------------------------------------------------------------ more CustomJob fields

NETWORK = "projects/123456789/global/networks/vpc-1"
ATTACHMENT = "projects/my-project/regions/us-central1/networkAttachments/att-1"
LUSTRE = "10.90.1.4:my-project/us-central1-a/lustre1:lfs:data"


def _sdk_job(spec):
    """The job as the SDK's own message type parses it (unknown fields refused)."""
    import json

    from google.cloud.aiplatform_v1.types import custom_job

    body = rendering.build_custom_job(spec)
    return body, custom_job.CustomJob.from_json(json.dumps(body), ignore_unknown_fields=False)


def test_dashboard_access_psc_interface_and_gpu_partitions_reach_the_job():
    spec = make_spec(
        **A100X8,
        strategy="mirrored",
        enable_dashboard_access=True,
        psc_network_attachment=ATTACHMENT,
        gpu_partition_size="1g.10gb",
        lustre_mount=(LUSTRE,),
    )
    body, job = _sdk_job(spec)
    assert job.job_spec.enable_dashboard_access is True
    assert job.job_spec.psc_interface_config.network_attachment == ATTACHMENT
    (pool,) = job.job_spec.worker_pool_specs
    assert pool.machine_spec.gpu_partition_size == "1g.10gb"
    (mount,) = pool.lustre_mounts
    assert (mount.instance_ip, mount.volume_handle, mount.filesystem, mount.mount_point) == (
        "10.90.1.4",
        "my-project/us-central1-a/lustre1",
        "lfs",
        "data",
    )
    assert "network" not in body["jobSpec"]
    assert any(
        "Lustre 10.90.1.4 (lfs) at /mnt/lustre/data" in line for line in bill.bill_lines(spec)
    )


def test_reserved_ip_ranges_reach_the_job_with_a_network():
    _, job = _sdk_job(make_spec(network=NETWORK, reserved_ip_ranges="range-a, range-b"))
    assert list(job.job_spec.reserved_ip_ranges) == ["range-a", "range-b"]
    assert job.job_spec.network == NETWORK


def test_without_the_flags_none_of_the_new_fields_is_sent():
    body = rendering.build_custom_job(make_spec())
    for key in ("enableDashboardAccess", "pscInterfaceConfig", "reservedIpRanges"):
        assert key not in body["jobSpec"]
    (pool,) = body["jobSpec"]["workerPoolSpecs"]
    assert "lustreMounts" not in pool and "gpuPartitionSize" not in pool["machineSpec"]


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"psc_network_attachment": ATTACHMENT, "network": NETWORK}, "both set, expected one"),
        (
            {"psc_network_attachment": ATTACHMENT.replace("us-central1", "europe-west4")},
            "expected an attachment in the job's region us-central1",
        ),
        ({"psc_network_attachment": "att-1"}, "expected projects/P/regions/REGION/"),
        ({"reserved_ip_ranges": "range-a"}, "need --network"),
        ({"network": NETWORK, "reserved_ip_ranges": "Range_A"}, "has 'Range_A'"),
        ({"lustre_mount": (LUSTRE,)}, "--lustre_mount needs --network"),
        ({"network": NETWORK, "lustre_mount": ("10.0.0.1:lfs:data",)}, "--lustre_mount is"),
        (
            {"network": NETWORK, "lustre_mount": (LUSTRE, LUSTRE)},
            "mount points repeat",
        ),
        ({"gpu_partition_size": "1g.10gb"}, "partitions GPUs, but --accelerator_type"),
        ({**A100X8, "strategy": "mirrored", "gpu_partition_size": "half"}, "is 'half'"),
    ],
)
def test_the_new_fields_refuse_what_vertex_would_refuse_in_one_line(values, expected):
    message = refused(**values)
    assert expected in message and "\n" not in message
