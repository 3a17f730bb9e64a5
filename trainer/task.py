"""The trainer's entry point: `python -m trainer.task [--flags]`.

Every task of a job runs this same command. Flags override the `--config` file,
which overrides the embedded defaults (`trainer.config.ExperimentConfig`).
Exit codes: 0 done, 2 usage or configuration error, 143 preempted and saved,
200 another task of the job was lost (`tfdist.cli`).
"""

import json
import os
import sys

from absl import flags
from absl import logging

from tfdist import cli
from tfdist._internal import startup_logs
from tfdist.errors import UsageError
from tfdist.distribute import flags as tfdist_flags
from tfdist.distribute.cluster import check_cluster_for_strategy, resolve_cluster_for_strategy
from trainer import config as config_lib

FLAGS = flags.FLAGS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

_HELP = {
    "task": "Your task as MODULE:NAME (a class or zero-argument factory with build_model, "
            "build_inputs, loss and metrics; see docs/tasks.md). Replaces --model and "
            "--dataset.",
    "task_config": "Keyword arguments for --task: a JSON object, or the path of a JSON file.",
    "model": "Built-in model: mlp or cnn (when no --task is given).",
    "dataset": "'synthetic' (offline) or a tfds dataset name, read from --data_dir.",
    "data_dir": "tfds data directory; nothing is downloaded.",
    "num_examples": "Training examples of the synthetic dataset.",
    "epochs": "Training epochs.",
    "steps_per_epoch": "Steps per epoch; default: the training split over the global batch.",
    "validation_steps": "Validation batches after each epoch; 0 skips validation.",
    "global_batch_size": "Examples per step summed over all replicas.",
    "all_reduce_dtype": "Dtype of the gradient all-reduce across replicas: float32, or bfloat16 "
                        "(half the bytes; each gradient sum rounded to 8 significant bits).",
    "jit_compile": "XLA for the training step: auto, true or false. Under mirrored and "
                   "multiworker XLA compiles each replica's forward and backward pass (the "
                   "all-reduce and update stay outside); auto is off on CPUs, where it was "
                   "measured slower, and on parameter servers, on for TPUs.",
    "steps_per_execution": "'auto' (measured at the start of training) or the steps run per "
                           "call into the compiled training function.",
    "optimizer": f"Optimizer: {', '.join(config_lib.OPTIMIZERS)}.",
    "learning_rate": "Base learning rate; with --lr_scaling, the rate for "
                     "--reference_batch_size (the scaled peak is logged).",
    "momentum": "Momentum for sgd and lars.",
    "weight_decay": "lars/lamb: L2 rate added inside the trust ratio; sgd/adam: Keras "
                    "decoupled weight decay; 0 disables.",
    "lr_scaling": "Scale the learning rate by global batch: none, linear (x B/ref) or "
                  "sqrt (x sqrt(B/ref)).",
    "reference_batch_size": "Batch size --learning_rate was tuned for.",
    "warmup_epochs": "Linear warmup to the peak over this many epochs; set at most one "
                     "of --warmup_epochs and --warmup_steps.",
    "warmup_steps": "Linear warmup to the peak over this many steps.",
    "lr_decay": f"Decay after warmup: {', '.join(config_lib.LR_DECAYS)}.",
    "decay_power": "Power of the polynomial decay.",
    "decay_boundaries": "Step decay: comma-separated increasing fractions in (0,1) of the "
                        "post-warmup steps, e.g. 0.5,0.75.",
    "decay_rate": "Factor applied at each step-decay boundary.",
    "exclude_from_weight_decay": "Comma-separated regexes searched in variable paths that "
                                 "get no weight decay; lars/lamb default: biases and "
                                 "normalization parameters.",
    "exclude_from_layer_adaptation": "Comma-separated regexes of variable paths that skip "
                                     "the LARS/LAMB trust ratio (full learning rate); "
                                     "default: none.",
    "seed": "Seed for weights, synthetic data and shuffling.",
    "deterministic": "Make TensorFlow ops deterministic (slower).",
    "mixed_precision": f"Mixed precision: {', '.join(config_lib.MIXED_PRECISION)}.",
    "model_dir": "Where the chief writes model.keras and summary.json; "
                 "default $AIP_MODEL_DIR.",
    "backup_dir": "Backup-and-restore directory; default $AIP_CHECKPOINT_DIR.",
    "backup_every_steps": "Back up every N steps (and at each epoch end).",
    "keep_backup": "Keep the backup after training completes.",
    "preemption_grace_seconds": "After SIGTERM, seconds to finish the step, save and exit 143 "
                                "(137 if the backup could not commit in time).",
    "tensorboard_dir": "TensorBoard logs; default $AIP_TENSORBOARD_LOG_DIR or "
                       "<model_dir>/logs.",
    "export": "What the chief exports to --model_dir: keras (model.keras), savedmodel (a "
              "SavedModel Vertex AI Prediction serves) or both; default both on Vertex AI "
              "(AIP_MODEL_DIR set), else keras.",
    "hparam_metric": "Report this epoch metric (e.g. val_accuracy) to Vertex AI "
                     "hyperparameter tuning after every epoch, from the chief.",
    "evaluation_checkpoints": "Export a checkpoint per epoch to <model_dir>/checkpoints for "
                              "an evaluator task (the newest few are kept); on by itself "
                              "when the cluster lists an evaluator (Vertex worker pool 3).",
}
_DISTRIBUTION_FLAGS = ("strategy", "all_reduce", "num_cpu_devices", "tpu")


tfdist_flags.define_strategy_flags()
cli.define_flags([cli.FlagSpec("config", None, "JSON file of experiment settings (see configs/).",
                               kind="string"),
                  *(cli.FlagSpec(name, config_lib.FIELDS[name].default, help_text)
                    for name, help_text in _HELP.items())])


def config_from_flags() -> config_lib.ExperimentConfig:
    """The embedded defaults, then `--config`, then the flags the user passed."""
    file_values = config_lib.load_config_file(FLAGS.config) if FLAGS.config else {}
    passed = {name: FLAGS[name].value for name in (*_DISTRIBUTION_FLAGS, *_HELP)
              if FLAGS[name].present}
    return config_lib.build_config(file_values, passed)


def main(argv) -> None:
    if len(argv) > 1:
        raise UsageError(f"unexpected argument {argv[1]!r}, expected only --flags; "
                             f"run with --helpfull to list them")
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

    try:
        summary = run.run(config, cluster)
    except run.PEER_FAILURES as error:
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        sys.stderr.write(
            f"error: lost contact with another task of the job ({type(error).__name__}: "
            f"{first_line}); exiting so that the job can restart from its last backup\n")
        sys.exit(cli.EXIT_PEER_LOST)
    if cluster.is_chief and summary is not None:
        print(json.dumps({key: summary[key] for key in
                          ("strategy", "num_replicas", "steps_completed", "final_loss",
                           "examples_per_second")}), flush=True)


if __name__ == "__main__":
    cli.run(main)
