"""A tiny 2-worker job for the restart checks of issue #10, run as a process.

    python -m tests.jobs.resume_checks_job --backup_dir=DIR [--global_batch_size=N]
        [--nan_at_step=K] [--epochs=E]

Trains under MultiWorkerMirroredStrategy with `BackupAndRestore(run_settings=
{"global_batch_size": N})`, backing up every 2 steps and keeping its backups.
`--nan_at_step=K` puts a NaN into the batch of global step K. Errors are mapped
as a command-line entry point maps them (`tfdist.cli`): a refused restart exits
2, a non-finite stop 3, each with one `error:` line on stderr.
"""

import argparse
import contextlib
import os

import numpy as np

from tfdist import cli
from tfdist.distribute.cluster import resolve_cluster
from tfdist.errors import NonFiniteError, UsageError


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup_dir", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps_per_epoch", type=int, default=6)
    parser.add_argument("--global_batch_size", type=int, default=16)
    parser.add_argument("--nan_at_step", type=int, default=0)
    return parser.parse_args()


def train(args) -> None:
    from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

    strategy = strategy_lib.make_strategy("multiworker", resolve_cluster(os.environ))

    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.callbacks import BackupAndRestore  # pylint: disable=g-import-not-at-top
    from tfdist.data import with_shard_policy  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    batch = args.global_batch_size
    features = np.random.RandomState(0).rand(64 * batch, 8).astype("float32")
    if args.nan_at_step:
        features[(args.nan_at_step - 1) * batch : args.nan_at_step * batch] = np.nan
    targets = features.sum(axis=1, keepdims=True)
    stream = with_shard_policy(
        tf.data.Dataset.from_tensor_slices((features, targets))
        .batch(batch, drop_remainder=True)
        .repeat()
    )
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    backup = BackupAndRestore(
        args.backup_dir,
        save_freq=2,
        delete_checkpoint=False,
        preemption=None,
        strategy=strategy,
        run_settings={"global_batch_size": batch},
    )
    for segment in backup.resume(model, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch):
        model.fit(
            stream.skip(segment.first_step), verbose=0, callbacks=[backup], **segment.fit_kwargs()
        )


def main():
    args = _parse_args()
    try:
        train(args)
    except UsageError as error:
        cli.exit_usage_error(str(error))
    except NonFiniteError as error:
        cli.exit_with_error(str(error), cli.EXIT_NON_FINITE)


if __name__ == "__main__":
    main()
