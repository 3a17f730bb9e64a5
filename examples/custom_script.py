"""Your own Keras training script, with tfdist's strategy flags added.

Only the lines marked `# tfdist` are tfdist's; the rest is a plain absl + Keras
script. Run it like the trainer, under any strategy:

    python examples/custom_script.py --strategy=default
    python examples/custom_script.py --strategy=mirrored --num_cpu_devices=2
    python -m tfdist.launch --workers 2 -- python examples/custom_script.py --strategy=multiworker

A bad `--strategy` or a malformed `TF_CONFIG` exits with code 2 and one
`error:` line, before the script tries to reach any other task.
"""

import json

import keras
import numpy as np
import tensorflow as tf
from absl import flags

from tfdist.data import per_replica_batch_size, with_shard_policy  # tfdist
from tfdist.distribute import flags as tfdist_flags  # tfdist

tfdist_flags.define_strategy_flags()  # tfdist: --strategy, --all_reduce, --num_cpu_devices, --tpu

_EPOCHS = flags.DEFINE_integer("epochs", 2, "Training epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 20, "Steps per epoch.", lower_bound=1)
_BATCH = flags.DEFINE_integer(
    "global_batch_size", 32, "Examples per step, all replicas.", lower_bound=1
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed for the weights and the data.")

NUM_FEATURES = 8
NUM_CLASSES = 3


def make_dataset(global_batch_size: int, seed: int) -> tf.data.Dataset:
    """Points whose class is the index of their largest of the first 3 features."""
    features = np.random.default_rng(seed).normal(size=(1024, NUM_FEATURES)).astype(np.float32)
    labels = np.argmax(features[:, :NUM_CLASSES], axis=1).astype(np.int32)
    dataset = (
        tf.data.Dataset.from_tensor_slices((features, labels))
        .repeat()
        .batch(global_batch_size, drop_remainder=True)
    )
    # Every worker builds the same pipeline and keeps its share of each batch.
    return with_shard_policy(dataset)  # tfdist


def main(argv):
    del argv
    # Build the strategy before any other TensorFlow operation.
    strategy = tfdist_flags.strategy_from_flags()  # tfdist
    per_replica_batch_size(_BATCH.value, strategy.num_replicas_in_sync)  # tfdist: exit 2 if not

    keras.utils.set_random_seed(_SEED.value)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((NUM_FEATURES,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(NUM_CLASSES),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(
        make_dataset(_BATCH.value, _SEED.value),
        epochs=_EPOCHS.value,
        steps_per_epoch=_STEPS.value,
        verbose=0,
    )
    print(
        json.dumps(
            {
                "strategy": type(strategy).__name__,
                "num_replicas": strategy.num_replicas_in_sync,
                "steps_completed": int(model.optimizer.iterations.numpy()),
                "loss": float(history.history["loss"][-1]),
                "accuracy": float(history.history["accuracy"][-1]),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    tfdist_flags.run(main)  # tfdist: usage errors become one line and exit code 2
