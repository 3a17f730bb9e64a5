"""Keras 3 `fit` under MirroredStrategy on 2 logical CPUs, with and without tfdist.keras_compat.

    python tests/jobs/keras_compat_job.py --out=DIR

Splitting the CPU into logical devices must happen before TensorFlow starts,
so the tests run this in a fresh process. It writes `<out>/results.json`:

- `upstream`: for each upstream bug, the error Keras raises without the
  corrections (`null` if it ran): `jit_compile` (`compile(jit_compile=True)`
  under MirroredStrategy) and `steps_per_execution` (`steps_per_execution=4`
  under MirroredStrategy's default `CollectiveAllReduce`);
- `runs`: for each corrected configuration, its final weights (`<name>.npz`)
  and per-batch logs, next to a reference run (`steps_per_execution=1`,
  no XLA).
"""

import argparse
import json
import pathlib

import numpy as np
import tensorflow as tf

CPUS = ["/cpu:0", "/cpu:1"]


def _split_cpu():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * len(CPUS)
    )


def _dataset():
    images = np.random.default_rng(0).random((512, 8, 8, 1), dtype=np.float32)
    labels = (images.reshape(512, -1).sum(axis=1) > 32).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(32).repeat()


def _train(
    model_name: str, *, jit_compile: bool, steps_per_execution: int, strategy
) -> tuple[list, list]:
    import keras  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    with strategy.scope():
        if model_name == "cnn":
            layers = [
                keras.layers.Conv2D(4, 3, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Flatten(),
            ]
        else:
            layers = [keras.layers.Flatten(), keras.layers.Dense(16, activation="relu")]
        model = keras.Sequential([keras.Input((8, 8, 1)), *layers, keras.layers.Dense(2)])
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=jit_compile,
            steps_per_execution=steps_per_execution,
        )
    batch_logs = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append(
            {"batch": batch, **{name: float(value) for name, value in logs.items()}}
        )
    )
    model.fit(_dataset(), epochs=1, steps_per_epoch=8, verbose=0, callbacks=[record])
    evaluation = model.evaluate(_dataset(), steps=4, verbose=0, return_dict=True)
    return model.get_weights(), batch_logs, evaluation


def _error_of(run) -> str | None:
    try:
        run()
    except Exception as error:  # pylint: disable=broad-except  (recorded for the test)
        return f"{type(error).__name__}: {error}"
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out)
    _split_cpu()
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    collective = tf.distribute.MirroredStrategy(CPUS)
    one_device_reduction = tf.distribute.MirroredStrategy(
        CPUS, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    keras_compat.remove()
    results = {
        "upstream": {
            "jit_compile": _error_of(
                lambda: _train(
                    "mlp", jit_compile=True, steps_per_execution=1, strategy=one_device_reduction
                )
            ),
            "steps_per_execution": _error_of(
                lambda: _train("mlp", jit_compile=False, steps_per_execution=4, strategy=collective)
            ),
        },
        "applied": keras_compat.apply(),
        "runs": {},
    }
    for name, model_name, jit_compile, steps_per_execution, strategy in (
        ("mlp_reference", "mlp", False, 1, collective),
        ("mlp_fused", "mlp", False, 4, collective),
        ("mlp_xla", "mlp", True, 4, collective),
        ("cnn_reference", "cnn", False, 1, collective),
        ("cnn_xla", "cnn", True, 1, one_device_reduction),
    ):
        weights, batch_logs, evaluation = _train(
            model_name,
            jit_compile=jit_compile,
            steps_per_execution=steps_per_execution,
            strategy=strategy,
        )
        np.savez(out / f"{name}.npz", *weights)
        results["runs"][name] = {"batch_logs": batch_logs, "evaluate": evaluation}
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
