"""One SGD step on 2 replicas (MirroredStrategy, 2 logical CPUs); prints the weights as JSON.

    python tests/jobs/reduced_precision_step.py [--all_reduce_dtype=bfloat16 ...]

Every example has x = 1 + 2**-10 and the loss is |w*x - 100| with w = 0, so
the gradient is -x exactly; a float32 all-reduce keeps the 2**-10, a
bfloat16 one (8 significant bits) rounds it away. One model takes the step
with Keras's own all-reduce ("keras"), then one more model (its own
optimizer) per `--all_reduce_dtype` given: `{"replicas": 2, "weight":
{"keras": w, "bfloat16": w}}`.
"""

import argparse
import json
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def reduced_precision_module():
    """The module that sets the gradient all-reduce dtype."""
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    return keras_compat


def _one_step(strategy, all_reduce_dtype: str) -> float:
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
        )
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mean_absolute_error")
    if all_reduce_dtype:
        reduced_precision_module().set_gradient_all_reduce_dtype(model.optimizer, all_reduce_dtype)
    x = np.full((4, 1), 1 + 2**-10, np.float32)
    y = np.full((4, 1), 100.0, np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    return float(model.get_weights()[0][0, 0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all_reduce_dtype", action="append", default=[])
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    weights = {"keras": _one_step(strategy, "")}
    for dtype in args.all_reduce_dtype:
        weights[dtype] = _one_step(strategy, dtype)
    print(json.dumps({"weight": weights, "replicas": strategy.num_replicas_in_sync}))


if __name__ == "__main__":
    main()
