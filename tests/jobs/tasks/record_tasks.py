"""Image tasks that read JPEG records from files, as users write them (not a test module).

`RecordImages(pattern, kind=...)` reads the same records three ways:

- `dataset`: `TFRecordDataset(files).map(decode)`, the way every TF guide shows;
- `files`: `tfdist.data.FileSource(pattern, preprocess=decode)`;
- `array_record`: `tfdist.data.RandomAccessSource(ArrayRecordDataSource(paths), decode)`.

With `count_dir`, every process writes how many records it decoded to
`<count_dir>/decodes-<pid>.json` when it exits. With `mark_dir`, every decode
writes an empty file `<mark_dir>/<example id>-<random>` with graph ops, so
decodes are counted on parameter-server workers too (which run no Python). With `kill_after`, the process
SIGKILLs itself after that many decodes, once (a `kill_marker` file records
it, so the restarted run trains to the end): a crash mid-epoch at a point
fixed by the data, not by a timer.
"""

import atexit
import glob
import json
import os
import signal

import keras
import numpy as np
import tensorflow as tf

import tfdist.data
from tfdist.tasks import Task

SIZE = 8
NUM_CLASSES = 4
_decodes = {"count": 0}
_kill = {"after": 0, "marker": ""}


def _example(image: np.ndarray, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image, quality=95).numpy()])
        ),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def examples(num_examples: int, seed: int = 0) -> list[bytes]:
    """Learnable records: the label is the brightest of four image quadrants."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(num_examples):
        label = int(rng.integers(NUM_CLASSES))
        image = rng.integers(0, 90, size=(SIZE, SIZE, 3)).astype(np.uint8)
        half = SIZE // 2
        rows, cols = divmod(label, 2)
        image[rows * half : (rows + 1) * half, cols * half : (cols + 1) * half] += 150
        records.append(_example(image, label))
    return records


def write_tfrecords(directory: str, num_examples: int, num_files: int, seed: int = 0) -> str:
    """Writes the records round-robin into `num_files` TFRecord files; returns their glob."""
    tf.io.gfile.makedirs(directory)
    records = examples(num_examples, seed)
    writers = [
        tf.io.TFRecordWriter(f"{directory}/train-{i:05d}-of-{num_files:05d}.tfrecord")
        for i in range(num_files)
    ]
    for index, record in enumerate(records):
        writers[index % num_files].write(record)
    for writer in writers:
        writer.close()
    return f"{directory}/train-*.tfrecord"


def write_array_records(
    directory: str, num_examples: int, num_files: int = 2, seed: int = 0
) -> str:
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    os.makedirs(directory, exist_ok=True)
    records = examples(num_examples, seed)
    per_file = -(-num_examples // num_files)
    for i in range(num_files):
        writer = array_record_module.ArrayRecordWriter(
            f"{directory}/train-{i:05d}.array_record", "group_size:1"
        )
        for record in records[i * per_file : (i + 1) * per_file]:
            writer.write(record)
        writer.close()
    return f"{directory}/train-*.array_record"


def _count(batch_size):
    _decodes["count"] += int(batch_size)
    if (
        _kill["after"]
        and _decodes["count"] >= _kill["after"]
        and not os.path.exists(_kill["marker"])
    ):
        with open(_kill["marker"], "w") as handle:
            handle.write(str(_decodes["count"]))
        os.kill(os.getpid(), signal.SIGKILL)
    return np.int64(0)


def _write_count(count_dir: str) -> None:
    with open(os.path.join(count_dir, f"decodes-{os.getpid()}.json"), "w") as handle:
        json.dump({"decodes": _decodes["count"]}, handle)


def decoder(count: bool, mark_dir: str = ""):
    """Parses one `tf.train.Example` and decodes its JPEG (counting or marking decodes if asked)."""
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(record):
        parsed = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(parsed["image"], channels=3)
        if count:
            tick = tf.numpy_function(_count, [tf.constant(1)], tf.int64, stateful=True)
            image = tf.identity(image) + tf.cast(tick, tf.uint8)
        if mark_dir:
            example_id = tf.strings.to_hash_bucket_fast(parsed["image"], 2**62)
            # Seeded random ops repeat in every process: the clock tells processes apart.
            unique = tf.strings.join(
                [
                    tf.strings.as_string(tf.timestamp(), precision=6),
                    tf.strings.as_string(tf.random.uniform([], maxval=2**62, dtype=tf.int64)),
                ]
            )
            name = tf.strings.join([tf.strings.as_string(example_id), unique], "-")
            with tf.control_dependencies([tf.io.write_file(mark_dir + "/" + name, "")]):
                image = tf.identity(image)
        image = tf.ensure_shape(tf.cast(image, tf.float32) / 255.0, (SIZE, SIZE, 3))
        return image, tf.cast(parsed["label"], tf.int32)

    return decode


class RecordImages(Task):
    """Four-class images from JPEG records; `kind` picks how the task hands them over."""

    def __init__(
        self,
        pattern: str,
        kind: str = "dataset",
        count_dir: str = "",
        mark_dir: str = "",
        evaluation: bool = False,
        kill_after: int = 0,
        kill_marker: str = "",
    ):
        self.pattern, self.kind, self.count_dir = pattern, kind, count_dir
        self.mark_dir = mark_dir
        self.evaluation = evaluation
        _kill.update(after=kill_after, marker=kill_marker)
        if count_dir:
            atexit.register(_write_count, count_dir)

    def build_model(self):
        return keras.Sequential(
            [
                keras.Input((SIZE, SIZE, 3)),
                keras.layers.Flatten(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(NUM_CLASSES),
            ]
        )

    def build_inputs(self, training):
        if not training and not self.evaluation:
            return None
        decode = decoder(
            count=(bool(self.count_dir) or bool(_kill["after"])) and training,
            mark_dir=self.mark_dir if training else "",
        )
        if self.kind == "dataset":
            return tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(self.pattern))).map(decode)
        if self.kind == "files":
            return tfdist.data.FileSource(self.pattern, preprocess=decode)
        if self.kind == "array_record":
            from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

            source = array_record_data_source.ArrayRecordDataSource(sorted(glob.glob(self.pattern)))
            return tfdist.data.RandomAccessSource(
                source, preprocess=decode, name=f"array_record:{self.pattern}"
            )
        raise ValueError(f"kind is {self.kind!r}, expected dataset, files or array_record")

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
