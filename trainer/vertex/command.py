"""The flags of `python -m trainer.submit`: three option tables, one row type.

    JobOptions       the job (`trainer.vertex.options`): flags and `--job_config` keys
    TuningOptions    a tuning study (`trainer.vertex.tuning`): flags and `--hparam_tuning` keys
    SubmitOptions    the command's own flags (`--dry_run`, `--wait`, ...): no config file

Every row is a `trainer.options.Option`, the trainer's own row type, and
`define_flags` is the only place the command's absl flags come from
(tests/unit/test_option_tables.py pins them).
"""

import dataclasses

from absl import flags

from trainer import options as options_lib
from trainer.options import option
from trainer.vertex import follow, options, serving, tuning

__all__ = ["SubmitOptions", "COMMAND_OPTIONS", "TABLES", "define_flags"]


@dataclasses.dataclass(frozen=True)
class SubmitOptions:
    """What `trainer.submit` does with the job: flags only, no config-file keys."""

    job_config: str = option(
        "", "JSON job shape (see configs/jobs/); flags override it.", is_config_key=False
    )
    hparam_tuning: str = option(
        "",
        "JSON tuning study (see configs/tuning/): submit a "
        "HyperparameterTuningJob; the --hparam* flags override it.",
        is_config_key=False,
    )
    dry_run: bool = option(False, "Print the job JSON and contact nothing.", is_config_key=False)
    wait: bool = option(
        False,
        "After creating the job (or with --attach/--cancel), follow it to its end: one "
        "line per state change; exit 0 if it succeeded, 1 if it failed, was cancelled "
        "or expired.",
        is_config_key=False,
    )
    attach: str = option(
        "",
        "Follow an existing job instead of creating one: its resource name, or a "
        "CustomJob ID with --project and --region. Exit code as for --wait.",
        is_config_key=False,
    )
    cancel: str = option(
        "",
        "Cancel an existing job (resource name, or CustomJob ID with --project and "
        "--region); add --wait to follow it until it has stopped.",
        is_config_key=False,
    )
    poll_seconds: float = option(
        follow.DEFAULT_POLL_SECONDS,
        "Seconds between two reads of a followed job's state.",
        is_config_key=False,
    )
    api_endpoint: str = option(
        "",
        "Vertex AI API endpoint (regional, private, or an http:// loopback emulator).",
        is_config_key=False,
    )
    serving_commands: bool = option(
        False,
        "Also print the gcloud/SDK lines that upload and deploy the exported SavedModel.",
        is_config_key=False,
    )
    serving_container_uri: str = option(
        serving.DEFAULT_SERVING_IMAGE,
        "Prediction image for --serving_commands and --upload.",
        is_config_key=False,
    )
    upload: bool = option(
        False,
        "Instead of a job: upload the SavedModel at --artifact_uri "
        "as a Vertex AI Model (aiplatform.Model.upload); prints its resource name.",
        is_config_key=False,
    )
    artifact_uri: str = option(
        "",
        "With --upload: the gs:// directory of the exported "
        "SavedModel, e.g. BASE_OUTPUT_DIR/model/.",
        is_config_key=False,
    )


COMMAND_OPTIONS = options_lib.table(SubmitOptions)
TABLES = (options.OPTIONS, tuning.TUNING_OPTIONS, COMMAND_OPTIONS)


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines every flag of `trainer.submit` in `flag_values`, listed under this module.

    `trainer.submit` adopts them as its own (`flags.adopt_module_key_flags`), so
    its `--help` lists them.
    """
    for rows in TABLES:
        options_lib.define_flags(rows, flag_values, module_name=__name__)
