"""Users' own tf.data pipelines trained by `tfdist.resumable.fit`, crashed and resumed.

    python tests/jobs/resume_pipelines_job.py --data=DIR --out=DIR --backup=DIR
        [--crash_at=N] [--cases=a,b]

Every case trains 3 epochs in this process (one process, or every worker of a
local cluster) with backups every 2 steps into `<backup>/<case>`; with
`--crash_at=N` each case raises after its N-th batch of this run (an injected
crash mid-epoch, on every worker at the same step) and the next case starts.
Each writes `<out>/<case>-<task index>.json`: the weights (hex of their
float32 bytes), the decodes its map counted (a `tf.Variable`), the error.
The pipelines are keras.io's shapes: `TFRecordDataset(files).map(decode)
.shuffle(buffer)` unseeded and reshuffled each epoch, the same seeded,
`timeseries_dataset_from_array`, and `from_generator`.
"""

import argparse
import json
import logging
import os
import pathlib
import sys

FILES = 2
RECORDS_PER_FILE = 96
GLOBAL_BATCH = 16
EPOCHS = 3
BUFFER = 32
SAVE_FREQ = 2
CASES = ("tfrecord_unseeded", "tfrecord_seeded", "timeseries", "generator")


def _values(index: int) -> list[float]:
    return [((index * 37 + k * 11) % 19) / 19.0 - 0.5 for k in range(6)]


def write_data(directory: str) -> None:
    """The TFRecord files (needs TensorFlow; run once, before the workers start)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    root = pathlib.Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for number in range(FILES):
        path = root / f"train-{number}.tfrecord"
        with tf.io.TFRecordWriter(str(path) + ".tmp") as writer:
            for row in range(RECORDS_PER_FILE):
                values = _values(number * RECORDS_PER_FILE + row)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=values)),
                            "y": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[int(sum(values) > 0)])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())
        os.replace(str(path) + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--backup", required=True)
    parser.add_argument("--crash_at", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--write_data", action="store_true")
    args = parser.parse_args()
    if args.write_data and not list(pathlib.Path(args.data).glob("*.tfrecord")):
        write_data(args.data)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))

    import tfdist.resumable  # pylint: disable=g-import-not-at-top

    strategy = tfdist.resumable.strategy_from_environment()
    import keras  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tests.support.fault_injection import CrashAfterBatches  # pylint: disable=g-import-not-at-top

    task = int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)

    def decode(record):
        counter.assign_add(1)
        parsed = tf.io.parse_single_example(
            record,
            {"x": tf.io.FixedLenFeature([6], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)},
        )
        return parsed["x"], parsed["y"]

    files = sorted(str(path) for path in pathlib.Path(args.data).glob("*.tfrecord"))

    def tfrecords(seed):
        dataset = tf.data.TFRecordDataset(files).map(decode)
        return dataset.shuffle(BUFFER, seed=seed).batch(GLOBAL_BATCH)

    def timeseries():
        series = np.array([_values(i) for i in range(200)], dtype="float32")
        targets = (series.sum(axis=1) > 0).astype("int64")
        dataset = keras.utils.timeseries_dataset_from_array(
            series, targets, sequence_length=4, batch_size=GLOBAL_BATCH, shuffle=True, seed=7
        )
        return dataset.map(lambda x, y: (tf.reshape(x, [-1, 24]), y))

    def generator():
        def rows():
            for index in range(192):
                yield np.array(_values(index), "float32"), int(sum(_values(index)) > 0)

        spec = (tf.TensorSpec([6], tf.float32), tf.TensorSpec([], tf.int64))
        return tf.data.Dataset.from_generator(rows, output_signature=spec).batch(GLOBAL_BATCH)

    builders = {
        "tfrecord_unseeded": lambda: tfrecords(None),
        "tfrecord_seeded": lambda: tfrecords(11),
        "timeseries": timeseries,
        "generator": generator,
    }
    for case in args.cases.split(","):
        counter.assign(0)
        dataset = builders[case]()
        width = 24 if case == "timeseries" else 6
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((width,)),
                    keras.layers.Dense(
                        8, "relu", kernel_initializer=keras.initializers.GlorotUniform(1)
                    ),
                    keras.layers.Dense(2, kernel_initializer=keras.initializers.GlorotUniform(2)),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.05),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        callbacks = [CrashAfterBatches(args.crash_at)] if args.crash_at else []
        result = {"error": None}
        try:
            tfdist.resumable.fit(
                model,
                dataset,
                epochs=EPOCHS,
                backup_dir=f"{args.backup}/{case}",
                save_freq=SAVE_FREQ,
                callbacks=callbacks,
                verbose=0,
                preemption=None,
            )
        except RuntimeError as error:
            result["error"] = str(error).splitlines()[0]
        result["decodes"] = int(counter.numpy())
        result["weights"] = [
            np.asarray(w).astype("float32").tobytes().hex() for w in model.get_weights()
        ]
        (out / f"{case}-{task}.json").write_text(json.dumps(result))
    # Every task leaves together once all wrote their results: a task that exits first
    # makes its peer's coordination service report it crashed, and the peer's teardown
    # of TensorFlow's threads can then hang (seen with tasks forked from a preload server).
    if strategy.num_replicas_in_sync > 1:
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
