"""Experiment configuration: embedded default < --config file < explicit flags."""

import json
import pathlib

import pytest
from absl import flags
from absl.testing import flagsaver

from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import (
    flags_doc,
    task,  # Defines the trainer's flags on absl's global FLAGS.
)

FLAGS = flags.FLAGS


def write_config(tmp_path, values, name="experiment.json") -> str:
    path = tmp_path / name
    path.write_text(values if isinstance(values, str) else json.dumps(values))
    return str(path)


def config_from_argv(*argv: str) -> config_lib.ExperimentConfig:
    """What `python -m trainer.task ARGV...` would train, parsed in-process."""
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        try:
            FLAGS(["trainer.task", *argv])
            return task.config_from_flags()
        finally:
            FLAGS.unparse_flags()


def test_embedded_default_is_a_small_offline_job():
    config = config_from_argv()
    assert config == config_lib.ExperimentConfig()
    assert (config.model, config.dataset, config.strategy) == ("mlp", "synthetic", "auto")
    assert config.model_dir == ""


def test_config_file_overrides_the_embedded_default(tmp_path):
    path = write_config(
        tmp_path,
        {"epochs": 7, "model": "cnn", "learning_rate": 1, "exclude_from_weight_decay": ["bias"]},
    )
    config = config_from_argv(f"--config={path}")
    assert config.epochs == 7
    assert config.model == "cnn"
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)
    assert config.exclude_from_weight_decay == ("bias",)
    assert config.global_batch_size == config_lib.ExperimentConfig().global_batch_size


def test_explicit_flags_override_the_config_file(tmp_path):
    path = write_config(tmp_path, {"epochs": 7, "model": "cnn", "optimizer": "adam"})
    config = config_from_argv(f"--config={path}", "--model=mlp", "--global_batch_size=32")
    assert config.model == "mlp"
    assert config.global_batch_size == 32
    assert (config.epochs, config.optimizer) == (7, "adam")


def test_a_flag_given_at_its_default_value_still_overrides_the_file(tmp_path):
    default_epochs = config_lib.ExperimentConfig().epochs
    path = write_config(tmp_path, {"epochs": default_epochs + 4, "deterministic": True})
    config = config_from_argv(f"--config={path}", f"--epochs={default_epochs}", "--nodeterministic")
    assert config.epochs == default_epochs
    assert config.deterministic is False


def test_strategy_flags_override_the_file(tmp_path):
    path = write_config(tmp_path, {"strategy": "multiworker", "all_reduce": "ring"})
    config = config_from_argv(f"--config={path}", "--strategy=default")
    assert (config.strategy, config.all_reduce) == ("default", "ring")


def test_build_config_layers_in_order():
    config = config_lib.build_config({"epochs": 5, "seed": 3}, {"seed": 9})
    assert (config.epochs, config.seed) == (5, 9)


def test_to_json_dict_round_trips_through_a_config_file(tmp_path):
    original = config_lib.ExperimentConfig(
        model="cnn", decay_boundaries=(0.5, 0.75), lr_decay="step"
    )
    path = write_config(tmp_path, original.to_json_dict())
    assert config_lib.build_config(config_lib.load_config_file(path)) == original


BAD_FLAGS = {
    "zero epochs": (["--epochs=0"], "--epochs is 0, expected a number > 0"),
    "negative epochs": (["--epochs=-2"], "--epochs is -2"),
    "zero batch": (["--global_batch_size=0"], "--global_batch_size is 0"),
    "negative batch": (["--global_batch_size=-64"], "--global_batch_size is -64"),
    "zero learning rate": (["--learning_rate=0"], "--learning_rate is 0.0"),
    "negative learning rate": (["--learning_rate=-0.1"], "--learning_rate is -0.1"),
    "backup every 0 steps": (["--backup_every_steps=0"], "backup_every_steps is 0"),
    "negative backup interval": (["--backup_every_steps=-5"], "--backup_every_steps is -5"),
    "steps per epoch 0": (["--steps_per_epoch=0"], "steps_per_epoch is 0"),
    "unknown optimizer": (["--optimizer=adagrad"], "--optimizer is 'adagrad', expected one of"),
    "unknown strategy": (["--strategy=mirored"], "--strategy is 'mirored', expected one of"),
    "unknown all_reduce": (["--all_reduce=tree"], "--all_reduce is 'tree'"),
    "num_cpu_devices without mirrored": (["--num_cpu_devices=2"], "only applies to"),
    "lr scaling without reference batch": (["--lr_scaling=linear"], "--reference_batch_size"),
    "both warmups": (["--warmup_epochs=1", "--warmup_steps=10"], "both set"),
    "lars momentum 1": (
        ["--optimizer=lars", "--momentum=1.0"],
        "--optimizer=lars: --momentum is 1.0, expected a number in [0, 1), e.g. --momentum=0.9",
    ),
    "sgd momentum above 1": (
        ["--optimizer=sgd", "--momentum=1.5"],
        "--optimizer=sgd: --momentum is 1.5, expected a number in [0, 1]",
    ),
}


@pytest.mark.parametrize("argv, fragment", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flags_are_usage_errors(argv, fragment):
    with pytest.raises(UsageError) as raised:
        config_from_argv(*argv)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


BAD_FILES = {
    "unknown field": (
        {"epochs": 2, "epoch": 3, "lr": 0.1},
        ("unknown field(s) epoch, lr", "expected names from"),
    ),
    "zero epochs": ({"epochs": 0}, ("--epochs is 0",)),
    "negative batch": ({"global_batch_size": -1}, ("--global_batch_size is -1",)),
    "backup every 0 steps": ({"backup_every_steps": 0}, ("backup_every_steps is 0",)),
    "wrong type": ({"epochs": "three"}, ("epochs is 'three'", "expected a int")),
    "float for an int": ({"epochs": 2.5}, ("epochs is 2.5",)),
    "bool for an int": ({"epochs": True}, ("epochs is True",)),
    "string for a bool": ({"deterministic": "yes"}, ("deterministic is 'yes'", "true or false")),
    "not JSON": ("{epochs: 2}", ("is not valid JSON",)),
    "a JSON list": ("[1, 2]", ("holds a JSON list", "expected an object")),
    "lars momentum 1": (
        {"optimizer": "lars", "momentum": 1},
        ("--optimizer=lars: --momentum is 1.0, expected a number in [0, 1)",),
    ),
}


@pytest.mark.parametrize("values, fragments", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_config_files_are_usage_errors(tmp_path, values, fragments):
    path = write_config(tmp_path, values)
    with pytest.raises(UsageError) as raised:
        config_lib.build_config(config_lib.load_config_file(path))
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(UsageError) as raised:
        config_from_argv(f"--config={missing}")
    assert f"--config file {str(missing)!r} does not exist" in str(raised.value)


def test_config_is_frozen():
    config = config_lib.ExperimentConfig()
    with pytest.raises(AttributeError):
        config.epochs = 10
    assert config.replace(epochs=10).epochs == 10


# --- One option table drives the flags, the config keys and docs/flags.md ------

FLAGS_DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "flags.md"


def test_docs_flags_md_is_generated_from_the_option_table():
    assert FLAGS_DOC.read_text() == flags_doc.render(), (
        f"docs/flags.md differs from the option table in trainer/config.py; regenerate it "
        f"with: {flags_doc.REGENERATE}"
    )


def test_every_option_is_a_flag_and_a_config_key_and_nothing_else_is():
    by_module = FLAGS.flags_by_module_dict()
    defined = {
        module: {flag.name for flag in by_module.get(module, [])}
        for module in ("tfdist.distribute.flags", "trainer.task")
    }
    rows = {
        module: {row.name for row in config_lib.OPTIONS if row.flag_module == module}
        for module in defined
    }
    assert defined["tfdist.distribute.flags"] == rows["tfdist.distribute.flags"]
    assert defined["trainer.task"] == rows["trainer.task"] | {"config"}
    assert set(config_lib.FIELDS) == rows["tfdist.distribute.flags"] | rows["trainer.task"]
    for row in config_lib.OPTIONS:
        assert FLAGS[row.name].default == (
            list(row.default) if row.default == () else row.default
        ), row.name


def test_choices_come_from_the_library():
    from tfdist.distribute import choice as strategy_choice  # pylint: disable=g-import-not-at-top
    from tfdist.optimizers import choice as optimizer_choice  # pylint: disable=g-import-not-at-top

    choices = {row.name: row.choices for row in config_lib.OPTIONS}
    assert choices["strategy"] is strategy_choice.STRATEGIES
    assert choices["all_reduce"] is strategy_choice.ALL_REDUCE
    assert choices["optimizer"] is optimizer_choice.OPTIMIZERS
    assert choices["lr_decay"] is optimizer_choice.DECAYS
    assert choices["lr_scaling"] is optimizer_choice.SCALING_RULES
