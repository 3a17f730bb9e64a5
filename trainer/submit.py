"""Submits the trainer to Vertex AI as a CustomJob or a HyperparameterTuningJob.

    python -m trainer.submit --project=P --region=us-central1 \\
        --staging_bucket=gs://my-bucket --job_config=configs/jobs/mirrored_1x8_gpu.json \\
        [--hparam_tuning=configs/tuning/learning_rate_optimizer.json] \\
        [--dry_run] [--api_endpoint=URL] -- --epochs=10 --model=cnn

Everything after `--` is passed unchanged to `python -m trainer.task` on every
replica that runs our code, after `--strategy=...`. Flags override the values
of `--job_config` (and of `--hparam_tuning`). The flags are option tables of
`trainer.options.Option` rows (`trainer/vertex/command.py`); the pieces this command
puts together are described in `trainer/vertex/__init__.py`.

`--dry_run` prints the job as JSON on stdout (environment variable values
redacted) and contacts nothing: it imports neither TensorFlow nor
`google.cloud`. A real submission prints the created job's resource name on
stdout; progress goes to stderr. Exit codes: 0 success, 2 a usage error or a
job Vertex AI refused (4xx), 1 Vertex AI or Cloud Storage failing (5xx,
unreachable); every error is one line.

`--wait` then follows the created job to its end (`trainer/vertex/follow.py`):
one stderr line per state change, the console link, the failed job's error;
the exit code is then the job's outcome: 0 succeeded, 1 failed, cancelled or
expired, 130 after Ctrl-C (the job keeps running: `--attach=JOB` follows it
again). `--attach=JOB` follows an existing job, `--cancel=JOB` cancels one.

Credentials: Application Default Credentials, except for a plain `http://`
loopback `--api_endpoint` (an emulator or test stand-in), which gets none.
"""

import datetime
import json
import re
import sys
import tempfile
import urllib.parse

from absl import flags

from tfdist import cli
from tfdist.distribute.cluster import is_loopback_host
from tfdist.errors import UsageError
from trainer import options as options_lib
from trainer import submission

try:  # trainer.vertex loads its dated tables (trainer/vertex/tables/*.json) when imported
    # client imports the Vertex AI library only inside its calls: real submissions only.
    from trainer.vertex import (
        bill,
        client,
        command,
        follow,
        images,
        options,
        serving,
        staging,
        tuning,
    )
    from trainer.vertex.checks import ServiceError, quoted
    from trainer.vertex.dependencies import check_installed, require_module
    from trainer.vertex.rendering import build_custom_job, redact_env
    from trainer.vertex.spec import JobSpec
    from trainer.vertex.validation import check_gcs_uri
except UsageError as broken_table:
    if __name__ != "__main__":
        raise
    # Before `cli.run` can report it: a malformed table is one line and exit 2 here too.
    cli.exit_usage_error(str(broken_table))

FLAGS = flags.FLAGS

command.define_flags(FLAGS)
flags.adopt_module_key_flags(command)  # --help lists the tables' flags as this command's

_ENDPOINT = re.compile(
    r"^(?:https?://)?(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])"
    r"(?::[0-9]{1,5})?/?$"
)


def main(argv, trainer_args=()):
    """Builds, checks and prints or submits the job."""
    if len(argv) > 1:
        raise UsageError(
            f"unexpected argument(s) {quoted(' '.join(argv[1:]))} before --, "
            f"expected trainer.task flags after --, e.g. -- --epochs=10"
        )
    if FLAGS.upload:
        _upload_model()
        return
    if FLAGS.attach or FLAGS.cancel:
        _existing_job(trainer_args)
        return
    _check_poll_seconds()
    if FLAGS.wait and FLAGS.dry_run:
        raise UsageError(
            "--wait follows a created job, but --dry_run creates none; drop one of them"
        )
    file_values = (
        submission.read_json_object(
            FLAGS.job_config,
            flag="--job_config",
            keys=options.CONFIG_KEYS,
            example="configs/jobs/mirrored_1x8_gpu.json",
        )
        if FLAGS.job_config
        else {}
    )
    flag_values = options_lib.passed_values(options.OPTIONS, FLAGS)
    flag_values["trainer_args"] = tuple(trainer_args)
    merged = options.merge_options(file_values, flag_values)
    timestamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    spec = JobSpec.from_options(merged, timestamp=timestamp)
    study = _tuning_spec()
    tuning.check_trial_flags(spec, study)
    endpoint, is_emulator = parse_api_endpoint(FLAGS.api_endpoint)
    staging_bucket = _sdk_staging_bucket(merged["staging_bucket"], spec)
    if FLAGS.serving_commands:
        images.check_prediction_image(FLAGS.serving_container_uri, today=spec.as_of)
    if not FLAGS.dry_run:
        check_installed(
            "google.auth",
            "requests",
            "google.cloud.aiplatform_v1",
            *(["google.cloud.storage"] if spec.uses_python_package else []),
            purpose="submitting a job to Vertex AI",
        )

    with tempfile.TemporaryDirectory(prefix="tfdist-sdist-") as build_dir:
        packages = _build_packages(spec, merged["staging_bucket"], build_dir)
        package_uris = [package.uri(staging_bucket) for package in packages]
        if study:
            kind, job = (
                client.TUNING_JOB,
                tuning.build_tuning_job(spec, study, package_uris=package_uris),
            )
        else:
            kind, job = client.CUSTOM_JOB, build_custom_job(spec, package_uris=package_uris)
        _describe(spec, kind, packages, package_uris, endpoint, is_emulator, FLAGS.dry_run)
        for line in bill.bill_lines(spec, tuning=study):
            print(line, file=sys.stderr)
        if FLAGS.dry_run:
            print(json.dumps(redact_env(job), indent=2))
            return
        credentials = _anonymous() if is_emulator else _application_default_credentials()
        for package in packages:
            staging.stage(package, staging_bucket)
    created = client.create_job(
        kind,
        job,
        project=spec.project,
        region=spec.region,
        api_endpoint=endpoint,
        credentials=credentials,
    )
    print(created, flush=True)
    if FLAGS.wait:
        name = follow.parse_job_name(created, flag="the created job")
        _follow(name, endpoint, credentials)


def _check_poll_seconds() -> None:
    value = FLAGS.poll_seconds
    if not value > 0 or value == float("inf"):
        raise UsageError(
            f"--poll_seconds is {value}, expected a finite number of seconds > 0 "
            f"between two reads of the job's state, e.g. --poll_seconds=30"
        )


def _existing_job(trainer_args) -> None:
    """--attach / --cancel: a job that exists; nothing is built or created."""
    _check_poll_seconds()
    if FLAGS.attach and FLAGS.cancel:
        raise UsageError(
            "--attach and --cancel are both set, expected one of them; to cancel a job "
            "and follow it until it has stopped, pass --cancel=JOB --wait"
        )
    flag, value = ("--attach", FLAGS.attach) if FLAGS.attach else ("--cancel", FLAGS.cancel)
    given = [
        f"--{other}"
        for other in ("job_config", "hparam_tuning", "dry_run")
        if FLAGS[other].present and FLAGS[other].value
    ]
    if given or trainer_args:
        what = ", ".join(given + (["trainer flags after --"] if trainer_args else []))
        raise UsageError(
            f"{flag} follows or cancels a job that exists, but {what} describe a new one; "
            f"drop them, or drop {flag} to create a job"
        )
    name = follow.parse_job_name(
        value, flag=flag, project=FLAGS.project.strip(), region=FLAGS.region.strip()
    )
    endpoint, is_emulator = parse_api_endpoint(FLAGS.api_endpoint)
    check_installed(
        "google.auth",
        "requests",
        "google.cloud.aiplatform_v1",
        purpose="following a Vertex AI job",
    )
    credentials = _anonymous() if is_emulator else _application_default_credentials()
    client.keep_stdout_for_the_result()
    if FLAGS.cancel:
        follow.cancel(name, api_endpoint=endpoint, credentials=credentials)
        if not FLAGS.wait:
            return
    _follow(name, endpoint, credentials)


def _follow(name, endpoint: str, credentials) -> None:
    """Follows the job to its end; exits 1 unless it succeeded (Ctrl-C: 130, job left running)."""
    state = follow.follow(
        name, api_endpoint=endpoint, credentials=credentials, poll_seconds=FLAGS.poll_seconds
    )
    follow.exit_for(state)


def _upload_model() -> None:
    """--upload: the exported SavedModel becomes a Vertex AI Model."""
    from trainer.vertex.regions import check_region  # pylint: disable=g-import-not-at-top
    from trainer.vertex.validation import check_project  # pylint: disable=g-import-not-at-top

    check_project(FLAGS.project)
    check_region(FLAGS.region)
    if not FLAGS.artifact_uri:
        raise UsageError(
            "--upload needs --artifact_uri, expected the gs:// directory of the "
            "exported SavedModel, e.g. --artifact_uri=gs://my-bucket/run/model/"
        )
    artifact_uri = check_gcs_uri("artifact_uri", FLAGS.artifact_uri) + "/"
    image = FLAGS.serving_container_uri
    images.check_prediction_image(image, today=datetime.datetime.now(datetime.timezone.utc).date())
    display_name = FLAGS.display_name or "tfdist-model"
    endpoint, is_emulator = parse_api_endpoint(FLAGS.api_endpoint)
    prefix = "Dry run, nothing sent: would upload" if FLAGS.dry_run else "Uploading"
    print(
        f"{prefix} the SavedModel in {artifact_uri} as Model {display_name!r} in "
        f"projects/{FLAGS.project}/locations/{FLAGS.region}, served by {image}",
        file=sys.stderr,
    )
    if FLAGS.dry_run:
        print(
            json.dumps(
                {
                    "displayName": display_name,
                    "artifactUri": artifact_uri,
                    "containerSpec": {"imageUri": image},
                },
                indent=2,
            )
        )
        return
    check_installed(
        "google.auth",
        "requests",
        "google.cloud.aiplatform",
        purpose="uploading a model to Vertex AI",
    )
    credentials = _anonymous() if is_emulator else _application_default_credentials()
    print(
        serving.upload_model(
            project=FLAGS.project,
            region=FLAGS.region,
            display_name=display_name,
            artifact_uri=artifact_uri,
            image=image,
            api_endpoint=endpoint,
            credentials=credentials,
        )
    )


def _tuning_spec() -> tuning.TuningSpec | None:
    """The tuning study, if --hparam_tuning or any tuning flag was given."""
    flag_values = options_lib.passed_values(tuning.TUNING_OPTIONS, FLAGS)
    if not FLAGS.hparam_tuning and not flag_values:
        return None
    file_values = (
        submission.read_json_object(
            FLAGS.hparam_tuning,
            flag="--hparam_tuning",
            keys=tuning.TUNING_KEYS,
            example="configs/tuning/learning_rate_optimizer.json",
        )
        if FLAGS.hparam_tuning
        else {}
    )
    file_values.pop("description", None)
    return tuning.TuningSpec.from_options(tuning.merge_tuning_options(file_values, flag_values))


def _build_packages(spec: JobSpec, staging_bucket: str, build_dir: str) -> list:
    """The trainer's sdist and the user's task package, for a prebuilt image."""
    if not spec.uses_python_package:
        return []
    if not staging_bucket:
        raise UsageError(
            f"--container_uri={spec.container_uri} is a prebuilt image, which "
            f"runs our package from Cloud Storage; set "
            f"--staging_bucket=gs://my-bucket"
        )
    task_root = staging.check_task_package(spec.task_package) if spec.task_package else ""
    packages = [staging.build_sdist(staging.find_project_root(), build_dir)]
    if task_root:
        packages.append(staging.build_sdist(task_root, build_dir, flag="--task_package"))
    return packages


def _anonymous():
    require_module("google.auth", purpose="submitting to an emulator")
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


def _application_default_credentials():
    """ADC, looked up before anything is built, uploaded or sent."""
    google_auth = require_module("google.auth", purpose="submitting a job to Vertex AI")
    from google.auth import exceptions as auth_exceptions

    try:
        credentials, _ = google_auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(client.NO_CREDENTIALS) from None
    return credentials


def parse_api_endpoint(value: str) -> tuple[str, bool]:
    """The endpoint for the client library and whether it is a credential-less emulator.

    Raises:
        UsageError: A plain http:// endpoint that is not on loopback (it would
            carry credentials unencrypted).
    """
    value = value.strip()
    if not value:
        return "", False
    if not _ENDPOINT.match(value):
        raise UsageError(
            f"--api_endpoint is {quoted(value)}, expected host[:port] (e.g. "
            f"us-central1-aiplatform.googleapis.com), an https:// URL, or "
            f"http://127.0.0.1:PORT for a local emulator"
        )
    if value.startswith("http://"):
        host = urllib.parse.urlsplit(value).hostname or ""
        if not is_loopback_host(host):
            raise UsageError(
                f"--api_endpoint={quoted(value)} is plain http:// on a "
                f"non-loopback host, expected https:// (or host[:port]) for a "
                f"real endpoint; plain http:// is only for a local emulator on "
                f"127.0.0.1"
            )
        return value.rstrip("/"), True
    return value.rstrip("/"), False


def _sdk_staging_bucket(staging_bucket: str, spec: JobSpec) -> str:
    """The staging bucket, or the output directory's bucket when none was given."""
    if staging_bucket:
        return check_gcs_uri("staging_bucket", staging_bucket)
    return "gs://" + spec.base_output_dir[len("gs://") :].split("/", 1)[0]


def _describe(spec, kind, packages, package_uris, endpoint, is_emulator, dry_run):
    """Says on stderr what will be uploaded and created, where, and as whom."""
    prefix = "Dry run, nothing sent: would " if dry_run else ""
    for package, uri in zip(packages, package_uris) if dry_run else ():
        print(
            f"{prefix}upload {package.staged_name} ({package.size} bytes, the sdist built "
            f"from {package.source}) to {uri}",
            file=sys.stderr,
        )
    target = endpoint or "the regional Vertex AI endpoint"
    credentials = (
        "no credentials (loopback emulator)" if is_emulator else "Application Default Credentials"
    )
    verb = "create" if dry_run else "Creating"
    what = "HyperparameterTuningJob" if kind == client.TUNING_JOB else "CustomJob"
    print(
        f"{prefix}{verb} {what} {spec.display_name!r} in projects/{spec.project}/"
        f"locations/{spec.region} via {target} with {credentials}",
        file=sys.stderr,
    )
    account = spec.service_account or (
        "the project's default Vertex AI service agent (no --service_account)"
    )
    print(f"Replicas run as {account}; outputs under {spec.base_output_dir}", file=sys.stderr)
    if FLAGS.serving_commands:
        print("To serve the exported SavedModel once the job has finished:", file=sys.stderr)
        for line in serving.serving_commands(
            project=spec.project,
            region=spec.region,
            display_name=spec.display_name,
            base_output_dir=spec.base_output_dir,
            image=FLAGS.serving_container_uri,
            tuning=kind == client.TUNING_JOB,
        ):
            print(f"  {line}", file=sys.stderr)


def submit_from_argv(argv=None):
    """Entry point: the trainer flags after `--` go to every replica, then `main` runs."""
    cli.run(
        main,
        argv,
        takes_command=True,
        exits=[cli.ErrorExit((ServiceError,), cli.EXIT_SERVICE_FAILURE)],
    )


if __name__ == "__main__":
    submit_from_argv()
