"""The TensorFlow tutorial's parameter-server job in tf_keras, the peer of bench_parameter_server.py.

Every task of a `python -m tfdist.launch --chief --workers N --ps M` cluster runs

    python bench/ps_tf_keras_job.py --out=DIR --steps_per_execution=10

The chief trains with tf_keras's own `Model.fit` under `ParameterServerStrategy`
(a `DatasetCreator`, `steps_per_execution` as the tutorial sets it) the model and
data of `trainer.task --model=mlp --dataset=synthetic`; workers and ps tasks serve
until the chief has gone (tfdist's `serve`, the same TensorFlow server the trainer
runs). The chief writes `<out>/summary.json` with `examples_per_second`, timed as
the trainer times it: all steps but those of the first sync point (here: epoch 1,
which holds the tracing).
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28, 1)


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps_per_execution", type=int, default=10)
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=150)
    parser.add_argument("--num_examples", type=int, default=4096)
    return parser.parse_args()


def _synthetic(num_examples: int):
    rng = np.random.default_rng(0)
    templates = rng.normal(size=(NUM_CLASSES,) + IMAGE_SHAPE).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=num_examples).astype(np.int32)
    images = templates[labels] + rng.normal(size=(num_examples,) + IMAGE_SHAPE).astype(np.float32)
    return images, labels


class _Timer:
    def __init__(self, tf_keras):
        timer = self

        class Callback(tf_keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                timer.ends.append(time.perf_counter())

        self.ends: list[float] = []
        self.callback = Callback()


def _chief(args, resolver) -> None:
    import tf_keras  # pylint: disable=g-import-not-at-top

    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    images, labels = _synthetic(args.num_examples)

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(args.global_batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(1024).repeat()
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.batch(batch, drop_remainder=True).prefetch(2)

    with strategy.scope():
        model = tf_keras.Sequential(
            [
                tf_keras.Input(IMAGE_SHAPE),
                tf_keras.layers.Flatten(),
                tf_keras.layers.Dense(128, activation="relu"),
                tf_keras.layers.Dense(64, activation="relu"),
                tf_keras.layers.Dense(NUM_CLASSES),
            ]
        )
        model.compile(
            optimizer=tf_keras.optimizers.SGD(0.05),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
        )
    timer = _Timer(tf_keras)
    model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[timer.callback],
        verbose=0,
    )
    timed_steps = (args.epochs - 1) * args.steps_per_epoch
    seconds = timer.ends[-1] - timer.ends[0]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "steps_completed": int(model.optimizer.iterations.numpy()),
                "examples_per_second": timed_steps * args.global_batch_size / seconds,
            }
        )
    )


def main() -> None:
    args = _parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top
        from tfdist.parameter_server import serve  # pylint: disable=g-import-not-at-top

        serve(resolve_cluster(os.environ))
        return
    _chief(args, resolver)


if __name__ == "__main__":
    main()
