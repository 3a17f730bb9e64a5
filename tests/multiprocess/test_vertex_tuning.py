"""Hyperparameter tuning: `--hparam_tuning=FILE` or `--hparam*` flags build a
HyperparameterTuningJob over the trainer's flags; bad studies are one line."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(REPO, "configs", "jobs")
TUNING = os.path.join(REPO, "configs", "tuning")
OUR_IMAGE = "us-central1-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"
COMMON = ["--project=my-project", "--region=us-central1", "--staging_bucket=gs://my-bucket"]


def submit(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "trainer.submit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tuning_file_builds_a_study_over_trainer_flags():
    result = submit(
        f"--job_config={os.path.join(JOBS, 'mirrored_1x8_gpu.json')}",
        f"--hparam_tuning={os.path.join(TUNING, 'learning_rate_optimizer.json')}",
        *COMMON,
        "--parallel_trial_count=2",
        "--dry_run",
        "--",
        "--validation_steps=20",
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["studySpec"] == {
        "metrics": [{"metricId": "val_accuracy", "goal": "MAXIMIZE"}],
        "parameters": [
            {
                "parameterId": "learning_rate",
                "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.1},
                "scaleType": "UNIT_LOG_SCALE",
            },
            {
                "parameterId": "optimizer",
                "categoricalValueSpec": {"values": ["sgd", "adam", "lamb"]},
            },
            {
                "parameterId": "global_batch_size",
                "discreteValueSpec": {"values": [256.0, 512.0, 1024.0]},
            },
        ],
    }
    assert (job["maxTrialCount"], job["parallelTrialCount"], job["maxFailedTrialCount"]) == (
        20,
        2,
        3,
    ), "flags override the file"
    (pool,) = job["trialJobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["args"][-2:] == [
        "--validation_steps=20",
        "--hparam_metric=val_accuracy",
    ]
    assert job["trialJobSpec"]["baseOutputDirectory"]["outputUriPrefix"].startswith(
        "gs://my-bucket/tfdist-jobs/"
    ), "Vertex AI adds <trial_id>/ under it for each trial"
    assert "HyperparameterTuningJob" in result.stderr


def test_tuning_from_flags_alone():
    result = submit(
        *COMMON,
        f"--container_uri={OUR_IMAGE}",
        "--hparam_metric=val_loss",
        "--hparam_goal=minimize",
        "--hparam=epochs=integer:1:5",
        "--hparam=learning_rate=double:0.01:0.5",
        "--hparam_algorithm=random",
        "--max_trial_count=6",
        "--dry_run",
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["studySpec"]["algorithm"] == "RANDOM_SEARCH"
    assert job["studySpec"]["parameters"][0] == {
        "parameterId": "epochs",
        "integerValueSpec": {"minValue": "1", "maxValue": "5"},
    }
    assert (job["maxTrialCount"], job["parallelTrialCount"]) == (6, 1)
    assert "maxFailedTrialCount" not in job


METRIC, GOAL = "--hparam_metric=val_loss", "--hparam_goal=minimize"
BAD_STUDIES = {
    "no metric": ([GOAL, "--hparam=epochs=integer:1:3"], "--hparam_metric is not set"),
    "no goal": ([METRIC, "--hparam=epochs=integer:1:3"], "--hparam_goal is ''"),
    "no parameters": ([METRIC, GOAL], "tuning has 0 parameters"),
    "min above max": (
        [METRIC, GOAL, "--hparam=learning_rate=double:0.5:0.1"],
        "min 0.5 >= max 0.1",
    ),
    "log scale from zero": (
        [METRIC, GOAL, "--hparam=learning_rate=double:0:0.1:log"],
        "expected min > 0",
    ),
    "unknown type": ([METRIC, GOAL, "--hparam=learning_rate=float:0:1"], "expected one of double"),
    "not a number": ([METRIC, GOAL, "--hparam=epochs=integer:1:many"], "expected one of double"),
    "grid over a double": (
        [METRIC, GOAL, "--hparam=learning_rate=double:0.1:1", "--hparam_algorithm=grid"],
        "grid needs integer",
    ),
    "more parallel than total": (
        [
            METRIC,
            GOAL,
            "--hparam=epochs=integer:1:3",
            "--max_trial_count=2",
            "--parallel_trial_count=5",
        ],
        "--parallel_trial_count is 5",
    ),
    "a million trials": (
        [METRIC, GOAL, "--hparam=epochs=integer:1:3", "--max_trial_count=1000000"],
        "--max_trial_count is 1000000",
    ),
    "tuning the strategy": (
        [METRIC, GOAL, "--hparam=strategy=categorical:mirrored,default"],
        "set by the submitter",
    ),
    "repeated parameter": (
        [METRIC, GOAL, "--hparam=epochs=integer:1:3", "--hparam=epochs=integer:2:4"],
        "names repeat",
    ),
    "unsorted discrete": (
        [METRIC, GOAL, "--hparam=global_batch_size=discrete:512,256"],
        "increasing",
    ),
}


@pytest.mark.parametrize("flags,expected", BAD_STUDIES.values(), ids=BAD_STUDIES.keys())
def test_bad_studies_are_one_line(flags, expected):
    result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", *flags, "--dry_run")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (
        result.stderr
    )


def test_tuning_file_with_unknown_key_is_refused(tmp_path):
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"hparam_metric": "val_loss", "trials": 3}))
    result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", f"--hparam_tuning={path}", "--dry_run")
    assert result.returncode == 2
    assert "unknown key(s) 'trials'" in result.stderr


def test_serving_commands_point_at_the_exported_model():
    custom = submit(
        *COMMON,
        f"--container_uri={OUR_IMAGE}",
        "--base_output_dir=gs://b-1/run",
        "--serving_commands",
        "--dry_run",
    )
    assert custom.returncode == 0, custom.stderr
    assert (
        "gcloud ai models upload --project=my-project --region=us-central1 "
        "--display-name=tfdist-auto --artifact-uri=gs://b-1/run/model/ "
        "--container-image-uri=us-docker.pkg.dev/vertex-ai/prediction/" in custom.stderr
    )
    assert "gcloud ai endpoints deploy-model ENDPOINT_ID" in custom.stderr
    study = submit(
        *COMMON,
        f"--container_uri={OUR_IMAGE}",
        "--base_output_dir=gs://b-1/hp",
        "--hparam_metric=val_loss",
        "--hparam_goal=minimize",
        "--hparam=epochs=integer:1:3",
        "--serving_commands",
        "--dry_run",
    )
    assert study.returncode == 0, study.stderr
    assert "--artifact-uri=gs://b-1/hp/TRIAL_ID/model/" in study.stderr
    assert "gcloud" not in custom.stdout + study.stdout, "stdout stays the job JSON"


def _study_job(tmp_path, study):
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    result = submit(*COMMON, f"--container_uri={OUR_IMAGE}", f"--hparam_tuning={path}", "--dry_run")
    return result


CONDITIONAL_STUDY = {
    "hparam_metric": "val_loss",
    "hparam_goal": "minimize",
    "hparam_early_stopping": "median",
    "hparam": {
        "optimizer": "categorical:sgd,adam,lamb",
        "weight_decay": {"type": "double", "min": 0.0, "max": 0.1, "when": {"optimizer": ["lamb"]}},
        "epochs": "integer:1:4",
        "warmup_epochs": {"type": "integer", "min": 0, "max": 1, "when": {"epochs": [3, 4]}},
    },
}


def test_early_stopping_and_conditional_parameters_parse_as_the_sdks_study(tmp_path):
    from tests.unit.test_vertex_schema import strict_tuning_job

    result = _study_job(tmp_path, CONDITIONAL_STUDY)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    study = job["studySpec"]
    assert study["medianAutomatedStoppingSpec"] == {"useElapsedDuration": False}
    assert [p["parameterId"] for p in study["parameters"]] == ["optimizer", "epochs"]
    (decay,) = study["parameters"][0]["conditionalParameterSpecs"]
    assert decay["parentCategoricalValues"] == {"values": ["lamb"]}
    assert decay["parameterSpec"]["parameterId"] == "weight_decay"
    (warmup,) = study["parameters"][1]["conditionalParameterSpecs"]
    assert warmup["parentIntValues"] == {"values": ["3", "4"]}
    parsed = strict_tuning_job(job)
    child = parsed.study_spec.parameters[1].conditional_parameter_specs[0]
    assert list(child.parent_int_values.values) == [3, 4]
    decay_curve = _study_job(
        tmp_path, {**CONDITIONAL_STUDY, "hparam_early_stopping": "decay_curve"}
    )
    assert decay_curve.returncode == 0, decay_curve.stderr
    assert json.loads(decay_curve.stdout)["studySpec"]["decayCurveStoppingSpec"] == {
        "useElapsedDuration": False
    }
    decay_study = strict_tuning_job(json.loads(decay_curve.stdout)).study_spec
    assert "decay_curve_stopping_spec" in decay_study
    assert "median_automated_stopping_spec" not in decay_study
    assert "median_automated_stopping_spec" in parsed.study_spec


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"weight_decay": {"type": "double", "min": 0, "max": 0.1, "when": {"lr": ["x"]}}},
            "conditional on 'lr', which is not a tuned parameter",
        ),
        (
            {
                "weight_decay": {
                    "type": "double",
                    "min": 0,
                    "max": 0.1,
                    "when": {"optimizer": ["lars"]},
                }
            },
            "expected some of the values optimizer takes",
        ),
        (
            {"warmup_epochs": {"type": "integer", "min": 0, "max": 1, "when": {"epochs": [9]}}},
            "expected some of the values epochs takes",
        ),
    ],
)
def test_bad_conditions_are_one_line(tmp_path, change, expected):
    study = {**CONDITIONAL_STUDY, "hparam": {**CONDITIONAL_STUDY["hparam"], **change}}
    result = _study_job(tmp_path, study)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_early_stopping_is_refused(tmp_path):
    result = _study_job(tmp_path, {**CONDITIONAL_STUDY, "hparam_early_stopping": "eager"})
    assert result.returncode == 2
    assert (
        "--hparam_early_stopping is 'eager', expected one of: median, decay_curve" in result.stderr
    )


def test_a_trial_value_sent_as_an_integral_float_reaches_the_trainer_as_an_integer(tmp_path):
    """Vertex AI passes discrete values as doubles: --global_batch_size=128.0."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC") and not key.startswith("AIP_")
    }
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")

    def trainer(*flags):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer.task",
                "--epochs=1",
                "--steps_per_epoch=1.0",
                "--num_examples=256",
                f"--model_dir={tmp_path / 'model'}",
                *flags,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    half = trainer("--global_batch_size=128.5")
    assert half.returncode == 2 and "--global_batch_size=128.5" in half.stderr, half.stderr
    result = trainer("--global_batch_size=128.0")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "model" / "summary.json").read_text())
    assert (summary["global_batch_size"], summary["steps_completed"]) == (128, 1)
