"""A Keras 3 training script: before.py is plain Keras, after.py adds tfdist in three lines.

    python examples/resumable_script/after.py OUTPUT_DIR   # run it again after any stop

after.py builds the strategy the cluster calls for (TF_CONFIG / CLUSTER_SPEC), backs up to
OUTPUT_DIR/backup, resumes at the exact step after a crash or restart, and after SIGTERM saves
at a step all workers agree on and exits with code 143.
"""

import sys

import keras
import numpy as np
import tensorflow as tf


def make_dataset(global_batch_size: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2048, 16)).astype(np.float32)
    labels = np.argmax(features[:, :4], axis=1).astype(np.int32)
    return (
        tf.data.Dataset.from_tensor_slices((features, labels))
        .shuffle(2048, seed=0, reshuffle_each_iteration=False)
        .repeat()
        .batch(global_batch_size, drop_remainder=True)
    )


def main(out: str) -> None:
    strategy = tf.distribute.MirroredStrategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    dataset = make_dataset(64)
    model.fit(dataset, epochs=4, steps_per_epoch=16)
    model.save(f"{out}/model.keras")


if __name__ == "__main__":
    main(sys.argv[1])
