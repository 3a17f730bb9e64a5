"""Does the input pipeline bound the step? Input-only against training throughput.

(a) `throughput`: examples/s of iterating `tfdist.data.training_batches` alone
    (nothing else in the process), against examples/s of Keras `fit` of the
    `mlp` and the `cnn` on the same stream (steps per execution 1 and 16), for
    two data sets: the trainer's `synthetic` (float32 arrays in memory) and a
    tfds-shaped image set built offline (28x28x1 uint8 images stored as PNG
    bytes, decoded and scaled in a parallel map, as `trainer.tasks.datasets`
    does with a real tfds set). Also the pipeline without caching and parallel
    batching ("serial"), as tfdist had it before.
(b) `restart`: seconds from building the stream to its first batch at
    `first_step` 0 and 100 000 (the pipeline part of a restart), and for the
    old linear pipeline (repeat -> shuffle -> batch -> skip) at steps it can
    reach in reasonable time.

    python bench/bench_input.py                 # both parts
    python bench/bench_input.py --part=restart --rounds=3
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

BATCH = 64
SYNTHETIC_EXAMPLES = 8192
IMAGE_EXAMPLES = 16384


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def synthetic_examples():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from trainer.tasks import datasets  # pylint: disable=g-import-not-at-top

    return (
        tf.data.Dataset.from_tensor_slices(
            datasets.synthetic_arrays(SYNTHETIC_EXAMPLES, 0, "train")
        ),
        SYNTHETIC_EXAMPLES,
    )


_PNG_CACHE = {}


def image_examples():
    """A tfds-shaped image set: PNG-encoded uint8 images, decoded like tfds does."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if "png" not in _PNG_CACHE:
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, size=(IMAGE_EXAMPLES, 28, 28, 1), dtype=np.uint8)
        encoded = [tf.io.encode_png(image).numpy() for image in images]
        _PNG_CACHE["png"] = (encoded, rng.integers(0, 10, IMAGE_EXAMPLES).astype(np.int64))
    encoded, labels = _PNG_CACHE["png"]
    dataset = tf.data.Dataset.from_tensor_slices((encoded, labels)).map(
        lambda png, label: (tf.ensure_shape(tf.io.decode_png(png, channels=1), (28, 28, 1)), label),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    # What trainer.tasks.datasets.tfds_examples does after tfds decodes.
    dataset = dataset.map(
        lambda image, label: (tf.cast(image, tf.float32) / 255.0, tf.cast(label, tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset, IMAGE_EXAMPLES


def serial_batches(examples, *, num_examples, first_step=0):
    """tfdist's stream before this change: no cache, serial batching, batch-level skip."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist import data as data_lib  # pylint: disable=g-import-not-at-top
    from tfdist.data import streaming  # pylint: disable=g-import-not-at-top

    per_pass = num_examples // BATCH
    first_pass, offset = divmod(first_step, per_pass)
    buffer = min(num_examples, data_lib.MAX_SHUFFLE_BUFFER)

    def one_pass(pass_index):
        return streaming._seeded_shuffle(examples, buffer, 0, pass_index).batch(  # pylint: disable=protected-access
            BATCH, drop_remainder=True
        )

    return (
        tf.data.Dataset.range(first_pass, tf.int64.max)
        .flat_map(one_pass)
        .skip(offset)
        .prefetch(tf.data.AUTOTUNE)
    )


def linear_batches(examples, *, num_examples, first_step=0):
    """The original pipeline: repeat -> shuffle -> batch -> skip(first_step)."""
    return (
        examples.repeat()
        .shuffle(min(num_examples, 8192), seed=0)
        .batch(BATCH, drop_remainder=True)
        .skip(first_step)
    )


def tfdist_batches(examples, *, num_examples, first_step=0):
    from tfdist import data as data_lib  # pylint: disable=g-import-not-at-top

    return data_lib.training_batches(
        examples, global_batch_size=BATCH, seed=0, num_examples=num_examples, first_step=first_step
    )


PIPELINES = {"tfdist": tfdist_batches, "serial": serial_batches, "linear": linear_batches}
DATASETS = {"synthetic": synthetic_examples, "images": image_examples}


def input_only(dataset_name: str, pipeline: str, steps: int) -> float:
    """Examples/s of iterating the stream alone (the first batch is left out)."""
    examples, count = DATASETS[dataset_name]()
    iterator = iter(PIPELINES[pipeline](examples, num_examples=count))
    next(iterator)
    started = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    return steps * BATCH / (time.perf_counter() - started)


def training(dataset_name: str, model_name: str, steps_per_execution: int, steps: int) -> float:
    """Examples/s of Keras `fit` on the tfdist stream (first execution left out)."""
    import keras  # pylint: disable=g-import-not-at-top

    from trainer.run.throughput import ThroughputMeter  # pylint: disable=g-import-not-at-top
    from trainer.tasks import models  # pylint: disable=g-import-not-at-top

    examples, count = DATASETS[dataset_name]()
    keras.utils.set_random_seed(0)
    model = models.MODELS[model_name]((28, 28, 1), 10)
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
    )
    meter = ThroughputMeter(global_batch_size=BATCH, steps_per_execution=steps_per_execution)
    model.fit(
        tfdist_batches(examples, num_examples=count),
        epochs=1,
        steps_per_epoch=steps,
        callbacks=[meter],
        verbose=0,
        shuffle=False,
    )
    return meter.examples_per_second


def first_batch_seconds(dataset_name: str, pipeline: str, first_step: int) -> float:
    """Seconds from building the stream at `first_step` to holding its first batch."""
    examples, count = DATASETS[dataset_name]()
    started = time.perf_counter()
    next(iter(PIPELINES[pipeline](examples, num_examples=count, first_step=first_step)))
    return time.perf_counter() - started


def throughput_part(rounds: int, steps: int, quick: bool = False) -> dict:
    cases = []
    for dataset_name in DATASETS:
        for pipeline in ("tfdist", "serial"):
            cases.append(("input", dataset_name, pipeline, None, None))
        for model_name in ("mlp", "cnn"):
            for spe in (1, 16):
                if quick and spe == 1:
                    continue
                cases.append(("train", dataset_name, None, model_name, spe))
    results = {case: [] for case in cases}
    for round_index in range(rounds):
        order = cases if round_index % 2 == 0 else cases[::-1]
        for case in order:
            kind, dataset_name, pipeline, model_name, spe = case
            if kind == "input":
                value = input_only(dataset_name, pipeline, steps)
            else:
                value = training(dataset_name, model_name, spe, steps)
            results[case].append(value)
            print(f"round {round_index + 1}: {case} {value:.0f} examples/s", file=sys.stderr)
    rows = []
    for case, values in results.items():
        kind, dataset_name, pipeline, model_name, spe = case
        rows.append(
            {
                "kind": kind,
                "dataset": dataset_name,
                "pipeline": pipeline,
                "model": model_name,
                "steps_per_execution": spe,
                "median_examples_per_second": statistics.median(values),
                "runs": values,
            }
        )
    return {"rows": rows}


def restart_part(rounds: int, quick: bool = False) -> dict:
    cases = [
        ("tfdist", 0),
        ("tfdist", 100_000),
        ("serial", 100_000),
        ("linear", 0),
        ("linear", 1_000 if quick else 10_000),
    ]
    rows = []
    for dataset_name in DATASETS:
        results = {case: [] for case in cases}
        for round_index in range(rounds):
            for case in cases if round_index % 2 == 0 else cases[::-1]:
                results[case].append(first_batch_seconds(dataset_name, *case))
        for (pipeline, step), values in results.items():
            rows.append(
                {
                    "dataset": dataset_name,
                    "pipeline": pipeline,
                    "first_step": step,
                    "median_seconds": statistics.median(values),
                    "runs": values,
                }
            )
            print(
                f"{dataset_name} {pipeline} step {step}: {statistics.median(values):.3f} s",
                file=sys.stderr,
            )
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("throughput", "restart", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    results = {"load_average_before": load_average()}
    if args.part in ("throughput", "both"):
        results["throughput"] = throughput_part(args.rounds, args.steps, args.quick)
    if args.part in ("restart", "both"):
        results["restart"] = restart_part(args.rounds, args.quick)
    results["load_average_after"] = load_average()
    print(json.dumps(results))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
