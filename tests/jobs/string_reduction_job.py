"""Keras 3 `fit` of a string model under MirroredStrategy on 2 logical CPUs.

    python tests/jobs/string_reduction_job.py --out=FILE [--corrected]

Without `--corrected` only the other keras_compat corrections are installed,
so Keras's own symbolic build averages the first batch across replicas
(tensorflow#80951). Writes `{"error": null | "<type>: <first line>",
"steps": N}` to FILE. Splitting the CPU must precede TensorFlow's start, hence
a fresh process.
"""

import argparse
import json
import pathlib
import sys

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--corrected", action="store_true")
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import keras  # pylint: disable=g-import-not-at-top

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    corrections = (
        keras_compat.CORRECTIONS
        if args.corrected
        else tuple(c for c in keras_compat.CORRECTIONS if c != "string_symbolic_build")
    )
    keras_compat.apply(corrections)
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    words = np.array(["red", "green", "blue", "pink"] * 16)
    labels = np.array([0, 1, 0, 1] * 16, np.int32)
    with strategy.scope():
        inputs = keras.Input((), dtype="string")
        lookup = keras.layers.StringLookup(vocabulary=["red", "green", "blue", "pink"])(inputs)
        outputs = keras.layers.Dense(2)(keras.layers.Embedding(5, 4)(lookup))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    dataset = tf.data.Dataset.from_tensor_slices((words, labels)).batch(16)
    error = None
    try:
        model.fit(dataset, epochs=1, verbose=0)
    except Exception as raised:  # pylint: disable=broad-except  (recorded for the test)
        first = (str(raised).strip().splitlines() or [""])[0]
        error = f"{type(raised).__name__}: {first}"
    steps = int(model.optimizer.iterations.numpy())
    pathlib.Path(args.out).write_text(json.dumps({"error": error, "steps": steps}))


if __name__ == "__main__":
    main()
