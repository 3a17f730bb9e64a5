"""Every experiment file shipped in configs/ loads into a valid config."""

import pathlib

import pytest

from trainer import config as config_lib

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[2] / "configs").glob("*.json"))


def test_configs_are_shipped():
    assert {path.name for path in CONFIGS} >= {"default.json", "cnn_large_batch_lars.json"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_file_builds(path):
    config = config_lib.build_config(config_lib.load_config_file(str(path)))
    assert config.epochs > 0 and config.global_batch_size > 0


def test_default_file_matches_the_embedded_default():
    from_file = config_lib.build_config(
        config_lib.load_config_file(str(CONFIGS[0].parent / "default.json"))
    )
    assert from_file == config_lib.ExperimentConfig()
