"""The dated Vertex AI tables are data files (trainer/vertex/tables/*.json): dated,
sourced, loaded once at import and checked, so that a malformed one is one error
naming the file, the key and the shape expected there.

tests/multiprocess/test_vertex_staging.py checks that a wheel built from the sdist
carries them and that an installed copy runs from them."""

import json
import shutil

import pytest

from tfdist.errors import UsageError
from trainer.vertex import images, machines, network, options, serving, tables

MODULES = {"machines.json": machines, "images.json": images, "network.json": network}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_table_is_a_packaged_file_with_its_date_and_sources(name):
    with tables.packaged(name).open("rb") as handle:
        raw = json.load(handle)
    assert raw["table_date"] == "2026-12-01"
    assert raw["sources"] and all(url.startswith("https://") for url in raw["sources"])
    module = MODULES[name]
    assert module.TABLE == raw  # what the module uses is the file, loaded at import
    assert module.TABLE_DATE == raw["table_date"]
    assert module.SOURCES == tuple(raw["sources"])


def test_the_modules_values_come_from_the_files():
    machines_table = machines.TABLE
    assert machines.BUILT_IN["a2-highgpu-8g"] == machines.BuiltIn("NVIDIA_TESLA_A100", 8)
    assert machines.BUILT_IN["ct5lp-hightpu-4t"].topologies == ("2x2",)
    assert set(machines.FLEX_START_ACCELERATORS) == set(machines_table["flex_start_accelerators"])
    assert (
        images.TRAINING_IMAGES["tf-gpu.2-17.py310"].end_of_availability.isoformat()
        == (images.TABLE["training_images"]["tf-gpu.2-17.py310"]["end_of_availability"])
    )
    assert serving.DEFAULT_SERVING_IMAGE == images.TABLE["default_prediction_image"]
    assert options.DEFAULT_REDUCTION_SERVER_IMAGE == network.TABLE["reduction_server"]["image"]
    assert network.egress_gbps("n2-standard-4") == 8.0  # 2 Gbps per vCPU, from per_vcpu


def _broken_copy(tmp_path, name, change):
    path = tmp_path / name
    shutil.copy2(tables.packaged(name), path)
    text = path.read_text()
    if callable(change):
        table = json.loads(text)
        change(table)
        text = json.dumps(table, indent=2)
    else:
        old, new = change
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)
    return path


def _set(*keys, value):
    def change(table):
        for key in keys[:-1]:
            table = table[key]
        table[keys[-1]] = value

    return change


def _drop(*keys):
    def change(table):
        for key in keys[:-1]:
            table = table[key]
        del table[keys[-1]]

    return change


BROKEN = [
    (
        "machines.json",
        _set("gpu_machines", "NVIDIA_TESLA_A100", "a2-highgpu-8g", value="8"),
        "gpu_machines['NVIDIA_TESLA_A100']['a2-highgpu-8g'] is '8', expected a whole number > 0",
    ),
    (
        "machines.json",
        _drop("tpu_machines", "ct5lp-hightpu-4t", "count"),
        "tpu_machines['ct5lp-hightpu-4t'] has no key count, expected an object with the keys "
        "accelerator, count, topologies",
    ),
    (
        "machines.json",
        _set("tpu_machines", "ct5lp-hightpu-4t", "topology", value="2x2"),
        "tpu_machines['ct5lp-hightpu-4t'] has the unknown key 'topology', expected an object "
        "with the keys accelerator, count, topologies",
    ),
    (
        "machines.json",
        _set("flex_start_accelerators", value=["NVIDIA_L4", "NVIDIA_L40"]),
        "flex_start_accelerators[1] is 'NVIDIA_L40', expected a GPU of gpu_machines or "
        "n1_attachable",
    ),
    (
        "machines.json",
        _set("n1_attachable", "NVIDIA_TESLA_T4", value=[]),
        "n1_attachable['NVIDIA_TESLA_T4'] is [], expected a non-empty list of (a whole number > 0)",
    ),
    (
        "machines.json",
        ('"a2-highgpu-2g": 2,', '"a2-highgpu-2g": 2, "a2-highgpu-1g": 1,'),
        "key 'a2-highgpu-1g' appears twice",
    ),
    (
        "images.json",
        _set("training_images", "tf-gpu.2-17.py310", "end_of_availability", value="2026-07-32"),
        "training_images['tf-gpu.2-17.py310'].end_of_availability is '2026-07-32', expected a "
        "date YYYY-MM-DD",
    ),
    (
        "images.json",
        _set("default_prediction_image", value="us-docker.pkg.dev/vertex-ai/prediction/x:1"),
        "default_prediction_image is 'us-docker.pkg.dev/vertex-ai/prediction/x:1', expected the "
        "URI of an image of prediction_images",
    ),
    (
        "images.json",
        _drop("table_date"),
        "the top level has no key table_date, expected an object with the keys about, "
        "table_date, sources",
    ),
    (
        "network.json",
        _set("sources", value=["cloud.google.com/compute/docs/network-bandwidth"]),
        "sources[0] is 'cloud.google.com/compute/docs/network-bandwidth', expected an https:// URL",
    ),
    (
        "network.json",
        _set("per_vcpu", "n2", value={"gbps_per_vcpu": 2, "cap_gbps": True}),
        "per_vcpu['n2'].cap_gbps is True, expected a number > 0",
    ),
    ("network.json", ('"shared_core": {', '"shared_core": {,'), "is not valid JSON"),
]


@pytest.mark.parametrize(("name", "change", "expected"), BROKEN)
def test_a_broken_copy_is_one_error_naming_the_file_key_and_shape(tmp_path, name, change, expected):
    path = _broken_copy(tmp_path, name, change)
    module = MODULES[name]
    with pytest.raises(UsageError) as caught:
        tables.read(path, module.SHAPE, module.check_table)
    message = str(caught.value)
    assert message.startswith(f"Vertex AI table {path}"), message
    assert expected in message
    assert "\n" not in message and len(message) < 400, message


def test_an_unchanged_copy_reads_as_the_packaged_table(tmp_path):
    for name, module in MODULES.items():
        path = tmp_path / name
        shutil.copy2(tables.packaged(name), path)
        assert tables.read(path, module.SHAPE, module.check_table) == module.TABLE


def test_a_missing_table_says_to_reinstall(tmp_path):
    with pytest.raises(UsageError, match="machines.json does not exist, .* reinstall tfdist"):
        tables.read(tmp_path / "machines.json", machines.SHAPE)
