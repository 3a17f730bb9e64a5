"""Hyperparameter tuning: `--hparam_tuning=FILE` or `--hparam*` flags build a
HyperparameterTuningJob over the trainer's flags; bad studies are one line."""

import json
import os

import pytest

from tfdist.errors import UsageError
from trainer.vertex import options, tuning
from trainer.vertex import spec as spec_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUNING = os.path.join(REPO, "configs", "tuning")
OUR_IMAGE = "us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"


def test_parameter_objects_and_strings_mean_the_same():
    as_text = tuning.parse_parameter("learning_rate", "double:1e-4:1e-1:log")
    as_object = tuning.parse_parameter(
        "learning_rate", {"type": "double", "min": 1e-4, "max": 0.1, "scale": "log"}
    )
    assert as_text == as_object
    with pytest.raises(UsageError, match="unknown key"):
        tuning.parse_parameter("learning_rate", {"type": "double", "low": 1})


def test_trial_arguments_keep_an_explicit_metric_flag():
    spec = spec_lib.JobSpec.from_options(
        options.merge_options(
            {},
            {
                "project": "my-project",
                "region": "us-central1",
                "staging_bucket": "gs://my-bucket",
                "container_uri": OUR_IMAGE,
                # trainer.task refuses a val_ metric without validation (checked at submit).
                "trainer_args": ("--validation_steps=5", "--hparam_metric=val_auc"),
            },
        ),
        timestamp="t",
    )
    study = tuning.TuningSpec(
        metric="val_auc",
        goal="maximize",
        parameters=(tuning.parse_parameter("epochs", "integer:1:2"),),
    )
    assert tuning.trial_args(spec, study) == ("--validation_steps=5", "--hparam_metric=val_auc")


@pytest.mark.parametrize("study", sorted(os.listdir(TUNING)))
def test_shipped_studies_tune_real_trainer_flags(study):
    from trainer import config as trainer_config

    with open(os.path.join(TUNING, study), encoding="utf-8") as handle:
        names = set(json.load(handle)["hparam"])
    assert names <= set(trainer_config.FIELDS), names - set(trainer_config.FIELDS)


@pytest.mark.parametrize("name", tuning.TUNING_KEYS)
def test_a_tuning_value_of_any_json_type_is_a_study_or_one_line(name):
    # trainer.submit turns a UsageError into one line and exit 2; anything else is a traceback.
    for value in (5, 2.5, True, None, "", "x", [], ["x", 1], {}, {"a": 1}):
        file_values = {"hparam_metric": "accuracy", "hparam_goal": "maximize", name: value}
        file_values.pop("description", None)
        try:
            tuning.TuningSpec.from_options(
                tuning.merge_tuning_options(file_values, {"hparam": ("epochs=integer:1:3",)})
            )
        except UsageError:
            pass


def test_hparam_given_a_number_is_one_line():
    with pytest.raises(UsageError) as raised:
        tuning.merge_tuning_options({"hparam": 5}, {})
    assert str(raised.value) == (
        "hparam is 5, expected NAME=SPEC items or an object of NAME to SPEC"
    )
