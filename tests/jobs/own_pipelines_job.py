"""Keras users' own tf.data pipelines, upgraded the documented way, one case after another.

    python tests/jobs/own_pipelines_job.py --data=DIR --out=DIR [--cases=a,b]

Every process runs every case in sequence on the same strategy
(`tfdist.resumable.strategy_from_environment()`: one process without
`TF_CONFIG`, MultiWorkerMirroredStrategy on a local cluster) and writes
`<out>/<case>-<task index>.json` with what a user can observe: the error (its
type and first line) or the steps of each epoch, the history, the evaluation
and how many examples this process decoded (a `numpy_function` counter in the
decode map). `write_data(DIR)` (pure Python, no TensorFlow) writes the files
the pipelines read; the test writes them once for every process.

The pipelines are the keras.io shapes: `timeseries_dataset_from_array`,
`from_generator` without full shapes, a `py_function` map, ragged and sparse
features in a dict, strings into `TextVectorization` (in the model and in
tf.data), and `TextLineDataset` of one file as training and validation data,
with a partial last batch and `weighted_metrics`.
"""

import argparse
import json
import logging
import os
import pathlib
import sys
import traceback

GLOBAL_BATCH = 32
# Examples of the files: the validation splits end with a partial global batch.
TRAIN_LINES = 256
VALIDATION_LINES = 100


def _line(index: int) -> str:
    """`label,weight,x0 .. x5`: deterministic numbers from the line's index."""
    values = [((index * 37 + k * 11) % 19) / 19.0 - 0.5 for k in range(6)]
    label = 1 if sum(values) > 0 else 0
    weight = 1 + index % 3
    return ",".join([str(label), str(weight), *(f"{v:.6f}" for v in values)])


def _write(path: pathlib.Path, lines: list[str]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(line + "\n" for line in lines))
    os.replace(temporary, path)


def write_data(directory: str) -> None:
    """The CSV-like text files every case reads."""
    root = pathlib.Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "train.csv", [_line(i) for i in range(TRAIN_LINES)])
    _write(root / "validation.csv", [_line(10_000 + i) for i in range(VALIDATION_LINES)])
    words = ["red", "green", "blue", "pink", "gray", "cyan"]
    _write(
        root / "text.txt",
        [
            f"{i % 2}\t" + " ".join(words[(i * k + i // 3) % 6] for k in range(1 + i % 5))
            for i in range(TRAIN_LINES)
        ],
    )


_decodes = {"train": 0, "validation": 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="")
    args = parser.parse_args()
    sys.path.insert(
        0, os.environ.get("TFDIST_ROOT") or str(pathlib.Path(__file__).resolve().parents[2])
    )
    import tfdist.resumable  # pylint: disable=g-import-not-at-top

    # tfdist's own INFO lines (the sharding chosen), none of TensorFlow's.
    tfdist_log = logging.getLogger("tfdist")
    tfdist_log.addHandler(logging.StreamHandler(sys.stdout))
    tfdist_log.setLevel(logging.INFO)
    tfdist_log.propagate = False

    strategy = tfdist.resumable.strategy_from_environment()
    import keras  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task_index = config.get("task", {}).get("index", 0)
    data = pathlib.Path(args.data)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def count(role):
        def tick(batch):
            _decodes[role] += int(batch)
            return np.int64(0)

        return tick

    def decode(role):
        """One CSV line -> (x, y, weight), counted."""

        def parse(line):
            fields = tf.io.decode_csv(line, [0.0] * 8)
            tick = tf.numpy_function(count(role), [tf.constant(1)], tf.int64, stateful=True)
            with tf.control_dependencies([tick]):
                return tf.stack(fields[2:]), fields[0], fields[1]

        return parse

    def lines(name, role):
        return tf.data.TextLineDataset(str(data / name)).map(decode(role))

    def dense_model(inputs, features):
        hidden = keras.layers.Dense(8, activation="relu")(features)
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))

    def compile_model(model, learning_rate=0.05, weighted=False):
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate),
            loss="binary_crossentropy",
            metrics=[keras.metrics.BinaryAccuracy(name="accuracy"), keras.metrics.AUC(name="auc")],
            weighted_metrics=[keras.metrics.BinaryAccuracy(name="weighted_accuracy")]
            if weighted
            else None,
        )
        return model

    def timeseries():
        series = np.stack(
            [np.sin(np.arange(400) * (k + 1) / 17.0) for k in range(7)], axis=1
        ).astype("float32")
        targets = (series[20:, 0] > 0).astype("float32")
        train = keras.utils.timeseries_dataset_from_array(
            series[:-20], targets, sequence_length=20, batch_size=GLOBAL_BATCH
        )
        inputs = keras.Input((20, 7))
        model = compile_model(dense_model(inputs, keras.layers.Flatten()(inputs)))
        return model, train, train

    def generator():
        def examples():
            for i in range(TRAIN_LINES):
                values = [((i * 37 + k * 11) % 19) / 19.0 - 0.5 for k in range(6)]
                yield np.array(values, np.float32), np.float32(sum(values) > 0)

        train = tf.data.Dataset.from_generator(
            examples,
            output_signature=(
                tf.TensorSpec((None,), tf.float32),
                tf.TensorSpec((), tf.float32),
            ),
        ).batch(GLOBAL_BATCH)
        inputs = keras.Input((6,))
        return compile_model(dense_model(inputs, inputs)), train, train

    def py_function():
        def parse(line):
            fields = np.array(line.numpy().decode().split(","), np.float32)
            return fields[2:], fields[0]

        train = (
            tf.data.TextLineDataset(str(data / "train.csv"))
            .map(lambda line: tf.py_function(parse, [line], (tf.float32, tf.float32)))
            .map(lambda x, y: (tf.reshape(x, [-1]), tf.reshape(y, [])))
            .batch(GLOBAL_BATCH)
        )
        inputs = keras.Input((6,))
        return compile_model(dense_model(inputs, inputs)), train, train

    class RowMean(keras.layers.Layer):
        """The mean of each row, ragged or dense."""

        def call(self, values):
            return tf.expand_dims(tf.reduce_mean(values, axis=1), -1)

    def ragged():
        def parse(line):
            parts = tf.strings.split(line, "\t")
            label, words = parts[0], parts[1]
            lengths = tf.cast(tf.strings.length(tf.strings.split(words, " ")), tf.float32)
            return lengths, tf.strings.to_number(label)

        train = (
            tf.data.TextLineDataset(str(data / "text.txt")).map(parse).ragged_batch(GLOBAL_BATCH)
        )
        inputs = keras.Input((None,), ragged=True)
        return compile_model(dense_model(inputs, RowMean()(inputs))), train, train

    def sparse_dict():
        def parse(line):
            x, y, _ = decode("train")(line)
            return {"values": x[:3], "counts": tf.sparse.from_dense(tf.nn.relu(x[3:]))}, y

        train = tf.data.TextLineDataset(str(data / "train.csv")).map(parse).batch(GLOBAL_BATCH)
        values = keras.Input((3,), name="values")
        counts = keras.Input((3,), sparse=True, name="counts")
        joined = keras.layers.Concatenate()([values, keras.layers.Dense(3)(counts)])
        model = dense_model({"values": values, "counts": counts}, joined)
        return compile_model(model), train, train

    vocabulary = ["red", "green", "blue", "pink", "gray", "cyan"]

    def text_lines():
        def parse(line):
            parts = tf.strings.split(line, "\t")
            label, words = parts[0], parts[1]
            return words, tf.strings.to_number(label)

        return tf.data.TextLineDataset(str(data / "text.txt")).map(parse)

    def strings():
        """Words into `TextVectorization` in the model, and word ids made by it in tf.data."""
        vectorize = keras.layers.TextVectorization(vocabulary=vocabulary)
        train = (
            text_lines()
            .batch(GLOBAL_BATCH)
            .map(lambda words, y: ({"words": words, "ids": vectorize(words)}, y))
        )
        words = keras.Input((), dtype="string", name="words")
        ids = keras.Input((None,), dtype="int64", name="ids")
        tokens = keras.layers.TextVectorization(vocabulary=vocabulary, output_sequence_length=6)(
            words
        )
        embed = keras.layers.Embedding(8, 4)
        pooled = keras.layers.Concatenate()(
            [
                keras.layers.GlobalAveragePooling1D()(embed(tokens)),
                keras.layers.GlobalAveragePooling1D()(embed(ids)),
            ]
        )
        return compile_model(dense_model({"words": words, "ids": ids}, pooled)), train, train

    def one_file():
        train = lines("train.csv", "train").batch(GLOBAL_BATCH)
        validation = lines("validation.csv", "validation").batch(GLOBAL_BATCH)
        inputs = keras.Input((6,))
        model = compile_model(dense_model(inputs, inputs), weighted=True)
        return model, train, validation

    cases = {
        "timeseries": timeseries,
        "generator": generator,
        "py_function": py_function,
        "ragged": ragged,
        "sparse_dict": sparse_dict,
        "strings": strings,
        "one_file": one_file,
    }
    chosen = [name for name in args.cases.split(",") if name] or list(cases)

    class StepCounter(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.steps[-1] += 1

    for name in chosen:
        keras.utils.set_random_seed(7)
        _decodes.update(train=0, validation=0)
        result = {"error": None}
        try:
            with strategy.scope():
                model, train, validation = cases[name]()
            counter = StepCounter()
            counter.steps = []
            history = model.fit(
                train, validation_data=validation, epochs=1, verbose=0, callbacks=[counter]
            )
            result["steps"] = counter.steps
            result["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
            decodes_before = _decodes["validation"]
            result["evaluate"] = {
                k: float(v)
                for k, v in model.evaluate(validation, verbose=0, return_dict=True).items()
            }
            result["evaluate_decodes"] = _decodes["validation"] - decodes_before
        except Exception as raised:  # pylint: disable=broad-except  (recorded for the test)
            first = (str(raised).strip().splitlines() or [""])[0]
            result["error"] = f"{type(raised).__name__}: {first}"
            result["traceback"] = traceback.format_exc()[-3000:]
        result["decodes"] = dict(_decodes)
        (out / f"{name}-{task_index}.json").write_text(json.dumps(result, indent=1))
        print(f"case {name}: {result['error'] or 'ok'}", flush=True)
    # Every task leaves together once all wrote their results (a task that exits
    # first makes its peer's coordination service report it crashed), without
    # the interpreter's teardown of TensorFlow's threads.
    if strategy.num_replicas_in_sync > 1:
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
