"""Writes the Kubeflow TFJob for a job shape: `python -m trainer.kubernetes`.

    python -m trainer.kubernetes --job_config=configs/kubernetes/multiworker_cpu.json \\
        [--workers=3 ...] [--format=yaml] -- --epochs=10 > tfjob.json
    kubectl apply -f tfjob.json

Everything after `--` goes to `python -m trainer.task` on every replica. Flags
override `--job_config`; both come from the option tables of
`trainer/kubernetes/options.py`. `--api=jobset` writes a JobSet instead
(restarts counted by `failurePolicy.maxRestarts`; `trainer/kubernetes/jobset.py`),
`--api=trainjob` a Kubeflow Trainer v2 TrainingRuntime and TrainJob around it. The
manifest goes to stdout and nothing is contacted (a dry run, always);
`--check=FILE` checks a hand-written TFJob (JSON or YAML) instead. Exit codes: 0
written or accepted; 2 a shape or manifest the operator or tfdist would refuse,
one line on stderr.
"""

import json
import sys

from absl import flags

from tfdist import cli
from tfdist.errors import UsageError
from trainer import options as options_lib
from trainer import submission
from trainer.kubernetes import checks, jobset, manifest, options
from trainer.kubernetes import shape as shape_lib
from trainer.kubernetes.manifest_file import read_manifest

FLAGS = flags.FLAGS
options.define_flags(FLAGS)
flags.adopt_module_key_flags(options)  # --help lists the tables' flags as this command's


def shape_from_flags(trainer_args=()) -> shape_lib.TFJobShape:
    """The `--job_config` values, then the flags passed, then the args after `--`."""
    values = (
        submission.read_json_object(
            FLAGS.job_config,
            flag="--job_config",
            keys=options.CONFIG_KEYS,
            example="configs/kubernetes/multiworker_cpu.json",
        )
        if FLAGS.job_config
        else {}
    )
    values.pop("description", None)
    values.update(options_lib.passed_values(options.SHAPE_OPTIONS, FLAGS))
    if trainer_args:
        from_file = values.get("trainer_args", [])
        shape_lib.check_type("trainer_args", from_file, list[str])
        values["trainer_args"] = (*from_file, *trainer_args)
    return shape_lib.shape_from_options(values)


def render(document: dict, output_format: str) -> str:
    if output_format == "json":
        return json.dumps(document, indent=2)
    if output_format == "yaml":
        try:
            import yaml  # pylint: disable=g-import-not-at-top
        except ImportError:
            raise UsageError(
                "--format=yaml needs PyYAML, which is not installed; run "
                "pip install 'tfdist[kubernetes]' or use --format=json"
            ) from None
        return yaml.safe_dump(document, sort_keys=False)
    raise UsageError(f"--format is {output_format!r}, expected json or yaml")


def check_structure(document: dict) -> str:
    """Refuses fields of the wrong type, missing or unknown; says what was checked."""
    try:
        from trainer.kubernetes import api_schema  # pylint: disable=g-import-not-at-top

        errors = api_schema.schema_errors(document)
    except ImportError:
        return (
            "field types not checked: pip install 'tfdist[kubernetes]' for the "
            "kubeflow-training models"
        )
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UsageError(
            f"--check file {FLAGS.check!r}: {errors[0]}{more}; expected a "
            f"kubeflow.org/v1 TFJob as the training operator's API defines it"
        )
    return "field types and names as in the kubeflow-training models"


def main(argv, trainer_args=()) -> None:
    if len(argv) > 1:
        raise UsageError(
            f"unexpected argument(s) {' '.join(argv[1:])!r} before --, "
            f"expected trainer.task flags after --, e.g. -- --epochs=10"
        )
    if FLAGS.check:
        document = read_manifest(FLAGS.check)
        checks.check_tfjob(document)
        print(
            f"{FLAGS.check}: accepted ({check_structure(document)}, training-operator 1.9 "
            f"webhook rules and tfdist's)",
            file=sys.stderr,
        )
        return
    shape = shape_from_flags(trainer_args)
    if FLAGS.api != "tfjob":
        _write_jobset(shape)
        return
    job = manifest.build_tfjob(shape)
    checks.check_tfjob(job)
    counts = ", ".join(f"{count} {kind}" for kind, count in shape.replica_counts.items())
    print(
        f"Dry run, nothing contacted: TFJob {shape.name!r} ({counts}; restartPolicy "
        f"{shape.restart_policy}, cleanPodPolicy {shape.clean_pod_policy}); outputs under "
        f"{shape.output_root}; pods run as "
        f"{shape.service_account or 'the namespace default service account'}",
        file=sys.stderr,
    )
    print(render(job, FLAGS.format))


APIS = ("tfjob", "jobset", "trainjob")


def _retryable() -> str:
    return ", ".join(str(code) for code in sorted(cli.RETRYABLE_EXIT_CODES))


def _write_jobset(shape: shape_lib.TFJobShape) -> None:
    """--api=jobset or trainjob: the same pods, restarted by JobSet (counted)."""
    if FLAGS.api not in APIS:
        raise UsageError(f"--api is {FLAGS.api!r}, expected one of {', '.join(APIS)}")
    if shape.restart_policy != "ExitCode" or shape.clean_pod_policy != "None":
        raise UsageError(
            f"restart_policy is {shape.restart_policy!r} and clean_pod_policy "
            f"{shape.clean_pod_policy!r}, which are TFJob's; --api={FLAGS.api} restarts the "
            f"whole JobSet on tfdist's retryable exit codes ({_retryable()}), at most "
            f"backoff_limit times, and fails it on any other; expected ExitCode and None"
        )
    jobset.check_names(shape, FLAGS.api)
    document = (
        jobset.build_jobset(shape) if FLAGS.api == "jobset" else jobset.build_trainer_v2(shape)
    )
    counts = ", ".join(f"{pods} {role}" for role, pods in jobset.roles(shape).items())
    what = "JobSet" if FLAGS.api == "jobset" else "Trainer v2 TrainingRuntime + TrainJob"
    print(
        f"Dry run, nothing contacted: {what} {shape.name!r} ({counts}; at most "
        f"{shape.backoff_limit} restarts of the whole set on exit {_retryable()}, any other "
        f"failure ends it); outputs under {shape.output_root}; pods run as "
        f"{shape.service_account or 'the namespace default service account'}",
        file=sys.stderr,
    )
    print(render(document, FLAGS.format))


def main_from_argv(argv=None) -> None:
    """Entry point: the trainer flags after `--` go to every replica, then `main` runs."""
    cli.run(main, argv, takes_command=True)


if __name__ == "__main__":
    main_from_argv()
