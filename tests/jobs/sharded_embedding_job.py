"""A parameter-server job whose model has a `ShardedEmbedding`, run once per task.

    python tests/jobs/sharded_embedding_job.py --out=DIR

The chief trains 2 epochs of 10 steps and writes `<out>/placement.json`: the
device of every embedding block, `iterations`, and the loss per epoch. Worker
and ps tasks serve until the chief is gone.
"""

import argparse
import json
import os
import pathlib

import numpy as np

from tfdist.distribute.cluster import resolve_cluster

VOCABULARY = 1000
NUM_SHARDS = 4


def _dataset():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCABULARY, size=(512, 3)).astype(np.int32)
    targets = (ids.sum(axis=1, keepdims=True) / (3 * VOCABULARY)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, targets)).repeat().batch(32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cluster = resolve_cluster(os.environ)

    from tfdist import parameter_server  # pylint: disable=g-import-not-at-top

    if cluster.task_type != "chief":
        parameter_server.serve(cluster, parameter_server.ServeOptions(chief_gone_seconds=3.0))
        return
    import keras  # pylint: disable=g-import-not-at-top

    strategy = parameter_server.make_parameter_server_strategy(cluster)
    with strategy.scope():
        embedding = parameter_server.ShardedEmbedding(VOCABULARY, 8, num_shards=NUM_SHARDS)
        model = keras.Sequential(
            [
                keras.Input((3,), dtype="int32"),
                embedding,
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = parameter_server.ParameterServerTrainer(model).fit(
        lambda _: _dataset(), epochs=2, steps_per_epoch=10, verbose=0
    )
    pathlib.Path(args.out, "placement.json").write_text(
        json.dumps(
            {
                "devices": [block.value.device for block in embedding.blocks],
                "iterations": int(model.optimizer.iterations.numpy()),
                "loss": history.history["loss"],
            }
        )
    )


if __name__ == "__main__":
    main()
