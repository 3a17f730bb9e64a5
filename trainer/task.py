"""The trainer's entry point: `python -m trainer.task [--flags]`.

Every task of a job runs this same command. Flags override the `--config` file,
which overrides the embedded defaults (`trainer.config.ExperimentConfig`).
Exit codes (`tfdist.cli`): 0 done, 2 usage or configuration error, 3 stopped
by a non-finite loss or variable, 143 preempted and saved, 137 the preemption
grace period ran out first, 200 another task of the job was lost (died, froze or,
for a parameter-server worker or ps, the chief never came up), 201 a task that
keeps no state (parameter-server worker or ps, evaluator) stopped by SIGTERM, 74
storage refused a write (full, read-only, a missing bucket, permission denied; not retried).
"""

import json
import os
import sys

from absl import flags, logging

from tfdist import cli
from tfdist._internal import startup_logs
from tfdist.distribute.cluster import check_cluster_for_strategy, resolve_cluster_for_strategy
from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import task_flags

FLAGS = flags.FLAGS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

CONFIG_FLAG = task_flags.CONFIG_FLAG
TRAINER_OPTIONS = task_flags.TRAINER_OPTIONS

task_flags.define_task_flags(FLAGS, module_name=__name__ if __name__ != "__main__" else sys.argv[0])


def config_from_flags() -> config_lib.ExperimentConfig:
    """The embedded defaults, then `--config`, then the flags the user passed."""
    file_values = config_lib.load_config_file(FLAGS.config) if FLAGS.config else {}
    return config_lib.build_config(file_values, task_flags.passed_values(FLAGS))


def main(argv) -> None:
    if len(argv) > 1:
        raise UsageError(
            f"unexpected argument {argv[1]!r}, expected only --flags; "
            f"run with --helpfull to list them"
        )
    config = config_from_flags()
    cluster = resolve_cluster_for_strategy(os.environ, config.strategy)
    if config.strategy != "auto":
        check_cluster_for_strategy(cluster, config.strategy)
    if not cluster.is_chief:
        logging.set_verbosity(logging.WARNING)
    logging.info("Config: %s", json.dumps(config.to_json_dict(), sort_keys=True))
    tf = startup_logs.import_tensorflow_quietly()
    if logging.get_verbosity() <= logging.INFO:  # --verbosity=1 shows TensorFlow's INFO too
        startup_logs.quiet_tensorflow_info(tf)

    from trainer import run  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

    summary = run.run(config, cluster)
    if cluster.is_chief and summary is not None:
        print(
            json.dumps(
                {
                    key: summary[key]
                    for key in (
                        "strategy",
                        "num_replicas",
                        "steps_completed",
                        "final_loss",
                        "examples_per_second",
                    )
                }
            ),
            flush=True,
        )


def _peer_failures() -> tuple:
    """`trainer.run.PEER_FAILURES` once `main` has imported it (and TensorFlow); none before."""
    run_module = sys.modules.get("trainer.run")
    return run_module.PEER_FAILURES if run_module is not None else ()


if __name__ == "__main__":
    cli.run(main, exits=[cli.ErrorExit(_peer_failures, cli.EXIT_PEER_LOST, cli.describe_lost_peer)])
