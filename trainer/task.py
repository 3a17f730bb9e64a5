"""The trainer's entry point: `python -m trainer.task [--flags]`.

Every task of a job runs this same command. Flags override the `--config` file,
which overrides the embedded defaults (`trainer.config.ExperimentConfig`).
Exit codes (`tfdist.cli`): 0 done, 2 usage or configuration error, 3 stopped
by a non-finite loss or variable, 143 preempted and saved, 137 the preemption
grace period ran out first, 200 another task of the job was lost (died, froze or,
for a parameter-server worker or ps, the chief never came up), 201 a task that
keeps no state (parameter-server worker or ps, evaluator) stopped by SIGTERM.
"""

import json
import os
import sys

from absl import flags, logging

from tfdist import cli
from tfdist._internal import startup_logs
from tfdist.distribute import flags as tfdist_flags
from tfdist.distribute.cluster import check_cluster_for_strategy, resolve_cluster_for_strategy
from tfdist.errors import UsageError
from trainer import config as config_lib

FLAGS = flags.FLAGS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

CONFIG_FLAG = cli.FlagSpec(
    "config", None, "JSON file of experiment settings (see configs/).", kind="string"
)
# The options whose flags this module defines; tfdist.distribute.flags defines the strategy flags.
TRAINER_OPTIONS = tuple(row for row in config_lib.OPTIONS if row.flag_module == "trainer.task")

tfdist_flags.define_strategy_flags()
cli.define_flags(
    [CONFIG_FLAG, *(cli.FlagSpec(row.name, row.default, row.flag_help) for row in TRAINER_OPTIONS)]
)


def config_from_flags() -> config_lib.ExperimentConfig:
    """The embedded defaults, then `--config`, then the flags the user passed."""
    file_values = config_lib.load_config_file(FLAGS.config) if FLAGS.config else {}
    passed = {
        row.name: FLAGS[row.name].value for row in config_lib.OPTIONS if FLAGS[row.name].present
    }
    return config_lib.build_config(file_values, passed)


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
