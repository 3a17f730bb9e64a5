"""A tiny deterministic training job for fault-tolerance tests, run as a process.

    python tests/jobs/fault_tolerance_job.py --backup_dir=DIR --out=DIR [--strategy=multiworker]

Trains a small model (dense + batch norm + dropout, Adam) on a deterministic
repeated stream with `tfdist.callbacks.BackupAndRestore`, resuming from the
backup when there is one. At the end the chief writes `<out>/weights.npz` and
`<out>/summary.json` (`resumed_from_step`, `global_step`, `iterations`, ...).

`--pause_after_step=K` makes each task in `--pause_tasks` (default: all) of a
fresh run (not a resumed one) write `<out>/paused-<task>-<K>` after step K and
then wait: `--pause_until=kill` waits to be killed, `--pause_until=notice`
until its preemption notice arrives (then training goes on, so the step of the
notice is K). A restarted run resumes past the pause.
"""

import argparse
import contextlib
import json
import os
import pathlib
import time

import numpy as np

from tfdist.distribute.cluster import resolve_cluster

PAUSE_TIMEOUT_SECONDS = 120


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup_dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="none", choices=("none", "multiworker"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=10)
    parser.add_argument("--save_freq", type=int, default=4)
    parser.add_argument("--global_batch_size", type=int, default=16)
    parser.add_argument("--pause_after_step", type=int, default=0)
    parser.add_argument("--pause_until", default="kill", choices=("kill", "notice"))
    parser.add_argument("--pause_tasks", default="")
    parser.add_argument("--grace_period", type=float, default=25.0)
    parser.add_argument("--keep_backup", action="store_true")
    return parser.parse_args()


def main():
    args = _parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = resolve_cluster(os.environ)
    task = f"{cluster.task_type or 'single'}-{cluster.task_index}"
    strategy = None
    if args.strategy == "multiworker":
        from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

        strategy = strategy_lib.make_strategy("multiworker", cluster)

    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.callbacks import BackupAndRestore  # pylint: disable=g-import-not-at-top
    from tfdist.data import with_shard_policy  # pylint: disable=g-import-not-at-top
    from tfdist.preemption import PreemptionOptions  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    features = np.random.RandomState(0).rand(512, 8).astype("float32")
    targets = np.sin(features.sum(axis=1, keepdims=True))

    def stream() -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((features, targets))
        dataset = dataset.shuffle(512, seed=5, reshuffle_each_iteration=True).repeat()
        return with_shard_policy(dataset.batch(args.global_batch_size, drop_remainder=True))

    scope = strategy.scope() if strategy else contextlib.nullcontext()
    with scope:
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.2, seed=1),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.Adam(0.01), "mse")

    backup = BackupAndRestore(
        args.backup_dir,
        save_freq=args.save_freq,
        delete_checkpoint=not args.keep_backup,
        preemption=PreemptionOptions(grace_period_seconds=args.grace_period),
    )

    class Pause(keras.callbacks.Callback):
        """Stops this task after a step until the test acts on it."""

        def on_train_batch_end(self, batch, logs=None):
            pausing = (not args.pause_tasks or task in args.pause_tasks.split(",")) and (
                backup.resumed_from_step == 0
            )
            if not pausing or backup.global_step + 1 != args.pause_after_step:
                return
            (out / f"paused-{task}-{args.pause_after_step}").write_text("paused")
            deadline = time.monotonic() + PAUSE_TIMEOUT_SECONDS
            while time.monotonic() < deadline:
                if args.pause_until == "notice" and backup.preemption.notice_received:
                    return
                time.sleep(0.01)
            raise SystemExit(f"{task}: nobody acted on the pause within {PAUSE_TIMEOUT_SECONDS} s")

    segments = backup.resume(model, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
    steps_run = 0
    for segment in segments:
        # Pause runs before the backup's hook, so the global step it sees is
        # the one before this batch.
        model.fit(
            stream().skip(segment.first_step),
            verbose=0,
            shuffle=False,
            callbacks=[Pause(), backup],
            **segment.fit_kwargs(),
        )
        steps_run += segment.steps_per_epoch * (segment.epochs - segment.initial_epoch)
    if cluster.is_chief:
        np.savez(out / "weights.npz", *[np.asarray(v) for v in model.get_weights()])
        summary = {
            "resumed_from_step": backup.resumed_from_step,
            "global_step": backup.global_step,
            "iterations": int(model.optimizer.iterations.numpy()),
            "steps_run": steps_run,
            "completed": backup.completed,
            "segments": [segment.fit_kwargs() for segment in segments],
        }
        (out / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
