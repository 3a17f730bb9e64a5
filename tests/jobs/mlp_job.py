"""One training run of a small MLP, in Keras 3 + tfdist or in tf_keras, for tests/multiprocess/test_peers.py.

    python tests/jobs/mlp_job.py --framework=keras3 --initial=INIT.npz --out=DIR

Under `TF_CONFIG` it trains under MultiWorkerMirroredStrategy, without it in one
process. Both frameworks get the same initial weights (`--initial`, arrays
`arr_0..arr_3`: hidden kernel and bias, output kernel and bias), the same data
in the same order (built here from a fixed seed, batched by the global batch,
sharded by data) and the same optimizer settings; each trains one model with
SGD and one with Adam for `--steps` steps. Every task writes
`<out>/<optimizer>-<task>.npz` with the final weights in the same order.
"""

import argparse
import json
import os
import pathlib

import numpy as np

NUM_FEATURES = 8
NUM_CLASSES = 3
GLOBAL_BATCH_SIZE = 64
OPTIMIZERS = {"sgd": 0.1, "adam": 0.01}  # name: learning rate


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", required=True, choices=("keras3", "tf_keras"))
    parser.add_argument("--initial", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=30)
    return parser.parse_args()


def _dataset(tf, steps: int):
    rng = np.random.default_rng(7)
    features = rng.normal(size=(GLOBAL_BATCH_SIZE * steps, NUM_FEATURES)).astype(np.float32)
    labels = np.argmax(features[:, :NUM_CLASSES], axis=1).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_SIZE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _framework(name: str):
    """The Keras to use, with tfdist's compatibility layer for Keras 3."""
    if name == "tf_keras":
        import tf_keras  # pylint: disable=g-import-not-at-top

        return tf_keras
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    keras_compat.apply()
    return keras


def main():
    args = _parse_args()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    keras_module = _framework(args.framework)
    multi_worker = "TF_CONFIG" in os.environ
    # The strategy comes first: it must exist before any other TensorFlow op.
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy()
        if multi_worker
        else tf.distribute.get_strategy()
    )
    task = "single"
    if multi_worker:
        task_spec = json.loads(os.environ["TF_CONFIG"])["task"]
        task = f"{task_spec['type']}{task_spec['index']}"
    with np.load(args.initial, allow_pickle=False) as archive:
        initial = [archive[f"arr_{i}"] for i in range(4)]
    out = pathlib.Path(args.out)
    layers = keras_module.layers
    for optimizer_name, learning_rate in OPTIMIZERS.items():
        with strategy.scope():
            model = keras_module.Sequential(
                [
                    layers.Input((NUM_FEATURES,)),
                    layers.Dense(16, activation="relu"),
                    layers.Dense(NUM_CLASSES),
                ]
            )
            model.set_weights(initial)
            optimizer = {"sgd": keras_module.optimizers.SGD, "adam": keras_module.optimizers.Adam}[
                optimizer_name
            ]
            model.compile(
                optimizer=optimizer(learning_rate),
                loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(
            _dataset(tf, args.steps), epochs=1, steps_per_epoch=args.steps, verbose=0, shuffle=False
        )
        np.savez(out / f"{optimizer_name}-{task}.npz", *model.get_weights())
        print(
            json.dumps(
                {
                    "task": task,
                    "optimizer": optimizer_name,
                    "steps": int(model.optimizer.iterations.numpy()),
                    "replicas": strategy.num_replicas_in_sync,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
