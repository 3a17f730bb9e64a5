"""A Keras script on `tfdist.resumable.fit` with Keras's four stateful callbacks.

    python tests/jobs/callbacks_script.py OUT [--kill_after_batches=N] [--finite] [--multiworker]

Trains on an endless (or, with `--steps_per_epoch=none`, a finite) dataset
whose validation labels are noise, so that `ReduceLROnPlateau` lowers the
learning rate, `ModelCheckpoint(save_best_only=True)` keeps an early epoch and
`EarlyStopping(restore_best_weights=True)` stops before the last epoch. Writes
OUT/model.keras, OUT/best.keras, OUT/log.csv and OUT/result.json (the final
learning rate, the callbacks' state, the history). `--kill_after_batches`
SIGKILLs the process after that many batches of this run
(tests/support/fault_injection.py); `--multiworker` builds the model under
`tfdist.resumable.strategy_from_environment()` and appends to the CSV log.
Tests also call `run` in their own process (`crash_after_batches` raises).
"""

import argparse
import json
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import tfdist.resumable  # noqa: E402  pylint: disable=wrong-import-position
from tests.support.fault_injection import CrashAfterBatches, KillAfterBatches  # noqa: E402  pylint: disable=wrong-import-position

EPOCHS = 12
STEPS_PER_EPOCH = 8
BATCH = 32


def datasets(finite: bool):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(STEPS_PER_EPOCH * BATCH, 8)).astype(np.float32)
    labels = np.argmax(features[:, :3], axis=1).astype(np.int32)
    train = tf.data.Dataset.from_tensor_slices((features, labels))
    train = (train if finite else train.repeat()).batch(BATCH, drop_remainder=True)
    val_x = rng.normal(size=(128, 8)).astype(np.float32)
    val_y = np.argmax(val_x[:, :3], axis=1).astype(np.int32)
    val_y[::2] = rng.integers(0, 3, size=64)  # half noise: val_loss falls, then rises
    return train, tf.data.Dataset.from_tensor_slices((val_x, val_y)).batch(64)


def make_callbacks(out: pathlib.Path, *, csv_append: bool = False):
    return {
        "early": keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=3, restore_best_weights=True
        ),
        "plateau": keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=1, cooldown=1
        ),
        "best": keras.callbacks.ModelCheckpoint(
            str(out / "best.keras"), monitor="val_loss", save_best_only=True
        ),
        "csv": keras.callbacks.CSVLogger(str(out / "log.csv"), append=csv_append),
    }


def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.005),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def run(
    out: pathlib.Path,
    *,
    kill_after_batches: int = 0,
    crash_after_batches: int = 0,
    finite: bool = False,
    save_freq=3,
    strategy=None,
    csv_append: bool = False,
    extra_callbacks=(),
    preemption=None,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    if strategy is None:
        model = build_model()
    else:
        with strategy.scope():
            model = build_model()
    train, val = datasets(finite)
    named = make_callbacks(out, csv_append=csv_append)
    callbacks = [*named.values(), *extra_callbacks]
    if kill_after_batches:
        callbacks.insert(0, KillAfterBatches(kill_after_batches))
    if crash_after_batches:
        callbacks.insert(0, CrashAfterBatches(crash_after_batches))
    history = tfdist.resumable.fit(
        model,
        train,
        epochs=EPOCHS,
        steps_per_epoch=None if finite else STEPS_PER_EPOCH,
        save_freq=save_freq,
        backup_dir=str(out / "backup"),
        callbacks=callbacks,
        validation_data=val,
        verbose=0,
        preemption=preemption,
    )
    model.save(tfdist.resumable.write_path(str(out / "model.keras")))
    early, plateau = named["early"], named["plateau"]
    result = {
        "learning_rate": float(model.optimizer.learning_rate.numpy()),
        "early_stopping": {
            "wait": early.wait,
            "best": early.best,
            "stopped_epoch": early.stopped_epoch,
            "best_epoch": early.best_epoch,
        },
        "plateau": {
            "wait": plateau.wait,
            "best": plateau.best,
            "cooldown_counter": plateau.cooldown_counter,
        },
        "checkpoint_best": named["best"].best,
        "history": {"epoch": history.epoch, "history": history.history},
        "iterations": int(model.optimizer.iterations.numpy()),
    }
    path = pathlib.Path(tfdist.resumable.write_path(str(out / "result.json")))
    path.write_text(json.dumps(result, indent=1, default=float))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--kill_after_batches", type=int, default=0)
    parser.add_argument("--finite", action="store_true")
    parser.add_argument("--multiworker", action="store_true")
    args = parser.parse_args()
    strategy = tfdist.resumable.strategy_from_environment() if args.multiworker else None
    run(
        args.out,
        kill_after_batches=args.kill_after_batches,
        finite=args.finite,
        strategy=strategy,
        csv_append=args.multiworker,
        preemption=tfdist.preemption.PreemptionOptions(),
    )


if __name__ == "__main__":
    main()
