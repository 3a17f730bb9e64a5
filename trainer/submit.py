"""Submits the trainer to Vertex AI as a CustomJob.

    python -m trainer.submit --project=P --region=us-central1 \\
        --staging_bucket=gs://my-bucket --job_config=configs/jobs/mirrored_1x8_gpu.json \\
        [--dry_run] [--api_endpoint=URL] -- --epochs=10 --model=cnn

Everything after `--` is passed unchanged to `python -m trainer.task` on every
replica that runs our code, after `--strategy=...`. Flags override the values
of `--job_config`.

`--dry_run` prints the CustomJob as JSON on stdout (environment variable values
redacted) and contacts nothing: it imports neither TensorFlow nor
`google.cloud`. A real submission prints the created job's resource name on
stdout; progress goes to stderr.

Credentials: Application Default Credentials, except for a plain `http://`
loopback `--api_endpoint` (an emulator or test stand-in), which gets none.
"""

import datetime
import ipaddress
import json
import sys
import tempfile
import urllib.parse

from absl import flags

from tfdist import cli
from tfdist.errors import UsageError
from trainer import job_spec as job_spec_lib
from trainer import packaging

FLAGS = flags.FLAGS

flags.DEFINE_string("job_config", "", "JSON job shape (see configs/jobs/); flags override it.")
flags.DEFINE_string("project", "", "Google Cloud project ID.")
flags.DEFINE_string("region", "", "Vertex AI region, e.g. us-central1.")
flags.DEFINE_string("staging_bucket", "",
                    "gs:// bucket for the staged package and default output directory.")
flags.DEFINE_string("display_name", "", "Job name shown by Vertex AI (default tfdist-STRATEGY).")
flags.DEFINE_string("strategy", "auto", "trainer.task --strategy for every replica: "
                    + ", ".join(job_spec_lib.STRATEGIES) + ".")
flags.DEFINE_string("machine_type", job_spec_lib.DEFAULT_MACHINE_TYPE,
                    "Machine type of the chief, workers (and by default PS and evaluator).")
flags.DEFINE_string("accelerator_type", "", "e.g. NVIDIA_TESLA_A100, NVIDIA_H100_80GB, "
                    "TPU_V5_LITEPOD; empty for none.")
flags.DEFINE_integer("accelerator_count", 0, "Accelerators per machine.")
flags.DEFINE_string("tpu_topology", "", "TPU topology for TPU v5e, e.g. 2x2.")
flags.DEFINE_integer("workers", 0, "Replicas in worker pool 1 (besides the chief).")
flags.DEFINE_integer("parameter_servers", 0, "Parameter servers in worker pool 2.")
flags.DEFINE_string("parameter_server_machine_type", "",
                    "Machine type of the parameter servers (default: --machine_type).")
flags.DEFINE_integer("reduction_servers", 0, "Reduction Server replicas in worker pool 2.")
flags.DEFINE_string("reduction_server_machine_type",
                    job_spec_lib.DEFAULT_REDUCTION_SERVER_MACHINE_TYPE,
                    "Machine type of the Reduction Server replicas.")
flags.DEFINE_string("reduction_server_image", job_spec_lib.DEFAULT_REDUCTION_SERVER_IMAGE,
                    "Reduction Server image (europe-docker / asia-docker mirrors exist).")
flags.DEFINE_integer("evaluators", 0, "Evaluators in worker pool 3 (0 or 1).")
flags.DEFINE_string("evaluator_machine_type", "",
                    "Machine type of the evaluator (default: the chief's machine).")
flags.DEFINE_string("boot_disk_type", job_spec_lib.DEFAULT_BOOT_DISK_TYPE,
                    "Boot disk type of every replica (pd-ssd, pd-standard, hyperdisk-balanced).")
flags.DEFINE_integer("boot_disk_size_gb", job_spec_lib.DEFAULT_BOOT_DISK_SIZE_GB,
                     "Boot disk size of every replica, in GB.")
flags.DEFINE_string("container_uri", "", "Our trainer image, or a Vertex AI prebuilt training "
                    "image (then the sdist is built, staged and run from it).")
flags.DEFINE_string("service_account", "", "Service account the replicas run as.")
flags.DEFINE_string("scheduling", "standard", "standard, spot or flex_start.")
flags.DEFINE_string("max_wait_duration", "", "Longest wait for resources, e.g. 2h (0: no limit).")
flags.DEFINE_boolean("restart_job_on_worker_restart", False,
                     "Restart every replica when one restarts.")
flags.DEFINE_string("timeout", "", "Longest run time, e.g. 3600s, 12h, 2d.")
flags.DEFINE_string("base_output_dir", "", "gs:// directory for AIP_MODEL_DIR, "
                    "AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR (default: under "
                    "--staging_bucket).")
flags.DEFINE_string("tensorboard", "",
                    "Vertex AI TensorBoard: projects/P/locations/R/tensorboards/ID.")
flags.DEFINE_boolean("enable_web_access", False, "Interactive shell access to replicas.")
flags.DEFINE_string("labels", "", "Job labels: key=value,key=value.")
flags.DEFINE_multi_string("env", [], "NAME=VALUE for our replicas (values never printed).")
flags.DEFINE_boolean("dry_run", False, "Print the CustomJob JSON and contact nothing.")
flags.DEFINE_string("api_endpoint", "", "Vertex AI API endpoint (regional, private, or an "
                    "http:// loopback emulator).")

# Flags that describe the job; the rest steer the submission itself.
_JOB_FLAGS = tuple(name for name in job_spec_lib.CONFIG_KEYS
                   if name not in ("trainer_args", "description"))
_LOOPBACK_NAMES = ("localhost",)


def main(argv, trainer_args=()):
    """Builds, checks and prints or submits the job."""
    if len(argv) > 1:
        raise UsageError(f"unexpected argument(s) {' '.join(argv[1:])!r} before --, "
                         f"expected trainer.task flags after --, e.g. -- --epochs=10")
    file_values = job_spec_lib.load_job_config(FLAGS.job_config) if FLAGS.job_config else {}
    flag_values = {name: FLAGS[name].value for name in _JOB_FLAGS if FLAGS[name].present}
    flag_values["trainer_args"] = tuple(trainer_args)
    options = job_spec_lib.merge_options(file_values, flag_values)
    for name, example in (("project", "my-project"), ("region", "us-central1")):
        if not options[name]:
            raise UsageError(f"--{name} is not set, expected e.g. --{name}={example}")
    timestamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    spec = job_spec_lib.job_spec_from_options(options, timestamp=timestamp)
    endpoint, is_emulator = parse_api_endpoint(FLAGS.api_endpoint)
    staging_bucket = _sdk_staging_bucket(options["staging_bucket"], spec)
    parent = f"projects/{options['project']}/locations/{options['region']}"

    with tempfile.TemporaryDirectory(prefix="tfdist-sdist-") as build_dir:
        package, package_uri = None, ""
        if spec.uses_python_package:
            if not options["staging_bucket"]:
                raise UsageError(f"--container_uri={spec.container_uri} is a prebuilt image, "
                                 f"which runs our package from Cloud Storage; set "
                                 f"--staging_bucket=gs://my-bucket")
            package = packaging.build_sdist(packaging.find_project_root(), build_dir)
            package_uri = package.uri(staging_bucket)
        custom_job = job_spec_lib.build_custom_job(spec, package_uri=package_uri)
        _describe(spec, parent, package, package_uri, endpoint, is_emulator, FLAGS.dry_run)
        if FLAGS.dry_run:
            print(json.dumps(job_spec_lib.redact_env(custom_job), indent=2))
            return
        credentials = _anonymous() if is_emulator else _application_default_credentials()
        if package:
            packaging.stage(package, staging_bucket)
    from trainer import vertex  # Imports google.cloud.aiplatform: real submissions only.

    resource_name = vertex.create_custom_job(
        custom_job, spec, project=options["project"], region=options["region"],
        staging_bucket=staging_bucket, api_endpoint=endpoint, credentials=credentials)
    print(resource_name)


def _anonymous():
    from google.auth.credentials import AnonymousCredentials
    return AnonymousCredentials()


def _application_default_credentials():
    """ADC, looked up before anything is built, uploaded or sent."""
    import google.auth
    from google.auth import exceptions as auth_exceptions

    try:
        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(
            "no Application Default Credentials found, expected credentials to call Vertex "
            "AI; run `gcloud auth application-default login` or point "
            "GOOGLE_APPLICATION_CREDENTIALS at a key file") from None
    return credentials


def parse_api_endpoint(value: str) -> tuple[str, bool]:
    """The endpoint for the SDK and whether it is a credential-less emulator.

    Raises:
        UsageError: A plain http:// endpoint that is not on loopback (it would
            carry credentials unencrypted).
    """
    value = value.strip()
    if not value:
        return "", False
    if value.startswith("http://"):
        host = urllib.parse.urlsplit(value).hostname or ""
        if not _is_loopback(host):
            raise UsageError(f"--api_endpoint={value} is plain http:// on a non-loopback "
                             f"host, expected https:// (or host[:port]) for a real "
                             f"endpoint; plain http:// is only for a local emulator on "
                             f"127.0.0.1")
        return value.rstrip("/"), True
    return value.rstrip("/"), False


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sdk_staging_bucket(staging_bucket: str, spec: job_spec_lib.JobSpec) -> str:
    """The staging bucket, or the output directory's bucket when none was given."""
    if staging_bucket:
        return job_spec_lib.check_gcs_uri("staging_bucket", staging_bucket)
    return "gs://" + spec.base_output_dir[len("gs://"):].split("/", 1)[0]


def _describe(spec, parent, package, package_uri, endpoint, is_emulator, dry_run):
    """Says on stderr what will be uploaded and created, where, and as whom."""
    prefix = "Dry run, nothing sent: would " if dry_run else ""
    if package and dry_run:
        print(f"{prefix}upload {package.staged_name} ({package.size} bytes, the sdist built "
              f"from setup.cfg) to {package_uri}", file=sys.stderr)
    target = endpoint or "the regional Vertex AI endpoint"
    credentials = ("no credentials (loopback emulator)" if is_emulator
                   else "Application Default Credentials")
    verb = "create" if dry_run else "Creating"
    print(f"{prefix}{verb} CustomJob {spec.display_name!r} in {parent} via {target} with "
          f"{credentials}", file=sys.stderr)
    account = spec.service_account or (
        "the project's default Vertex AI service agent (no --service_account)")
    print(f"Replicas run as {account}; outputs under {spec.base_output_dir}", file=sys.stderr)


def run():
    """Entry point: splits off the trainer flags after `--`, then runs `main`."""
    argv = list(sys.argv)
    trainer_args = ()
    if "--" in argv:
        split = argv.index("--")
        argv, trainer_args = argv[:split], tuple(argv[split + 1:])
    cli.run(lambda remaining: main(remaining, trainer_args), argv=argv)


if __name__ == "__main__":
    run()
