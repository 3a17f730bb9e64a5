"""A `tfdist.resumable.fit` script that trains until stopped, for the lost-peer tests.

    python tests/jobs/lost_peer_script.py BACKUP_DIR

Prints "training" once its first step ran, so a test knows when to kill a peer.
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist.resumable


class SayTraining(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            print("training", flush=True)


def main(backup_dir: str) -> None:
    strategy = tfdist.resumable.strategy_from_environment("multiworker")
    features = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    dataset = (
        tf.data.Dataset.from_tensor_slices((features, features[:, :1]))
        .repeat()
        .batch(32, drop_remainder=True)
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    tfdist.resumable.fit(
        model,
        dataset,
        backup_dir=backup_dir,
        epochs=1,
        steps_per_epoch=1_000_000,
        save_freq=1000,
        callbacks=[SayTraining()],
        verbose=0,
    )


if __name__ == "__main__":
    main(sys.argv[1])
