"""Input at scale (issue 18): decodes, restart, memory and throughput per worker.

Five input pipelines, each as worker 0 of 2 builds it (built in-process: that
is the pipeline a worker builds; nothing else differs), global batch 64, so 32
examples per worker per step, over JPEG images in TFRecord / ArrayRecord files:

(a) `files`:   `tfdist.data.FileSource(pattern, preprocess=decode)` through
               `tfdist.data.files.replica_batches(shard=Shard(0, 2))`;
(b) `random`:  `tfdist.data.RandomAccessSource(ArrayRecordDataSource, decode)`
               through `tfdist.data.random_access.replica_batches`;
(b') `random1`: the same over a wrapper of the ArrayRecordDataSource that has
               no `__getitems__`, so records are read one by one with
               `__getitem__` (ArrayRecord's batched read starts a thread pool
               per call: see docs/benchmarks.md);
(c) `dataset`: today's path for a task that returns
               `TFRecordDataset(files).map(decode)`: `streaming.training_batches`
               (as the trainer calls it with `--steps_per_epoch`: no count), of
               which worker 0 keeps the first 32 of each global batch (what the
               DATA auto-shard policy does);
(c') `dataset_files`: the same task dataset as tfdist shards it by file when it
               reads at least as many files as workers
               (`streaming.file_sharded_batches(shard=Shard(0, 2))`);
(d) `plain`:   TF's multi-worker guide, FILE-sharded by hand:
               `TFRecordDataset(files[0::2]) -> shuffle -> map(decode) ->
               batch(32) -> prefetch`;
(e) `grain`:   Grain 0.2 `MapDataset` over `grain.sources.ArrayRecordDataSource`:
               shuffle(seed) -> repeat -> [0::2] -> map(PIL decode) ->
               to_iter_dataset(ReadOptions(threads, prefetch)) -> batch(32).

Every decode runs through a counter (a `tf.numpy_function` incrementing a
Python counter in the tf.data decoders, a Python increment in Grain's), so the
figures are counts: decodes per step (slope between step 100 and 200), decodes
before the first batch (when it arrives, and once the read-ahead settles),
decodes of a restart at `--restart_step`. Peak RSS is VmHWM of a child process
that runs one pipeline for `--rss_steps` steps; throughput (examples/s per
worker, input only, decoders without the counter) alternates the pipelines
for `--rounds` rounds and reports medians, each round's ratio to (d), and the
CPU milliseconds spent per 1000 examples (less sensitive to a busy machine).

Data (written once into `--cache_dir`, reused): `--examples` records of
`--image_size`² x 3 JPEG (default 10k of 64x64) in 16 files of each format,
and, for the size comparison, 10k and `--large_examples` (default 1M) records
of 16x16 JPEG (writing 1M 64x64 JPEG records would take ~10 GB and minutes).
Records repeat a pool of 1024 distinct encoded examples: decoding costs the
same, writing is fast.

    python bench/bench_data_scale.py                 # everything, a few minutes on 2 cores
    python bench/bench_data_scale.py --part=counts   # counts | rss | throughput
    python bench/bench_data_scale.py --smoke         # tiny sizes, one RSS child (the test)
"""

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

GLOBAL_BATCH = 64
WORKERS = 2
PER_WORKER = GLOBAL_BATCH // WORKERS
NUM_FILES = 16
POOL = 1024
SMALL_SIZE = 16
KINDS = ("files", "random", "random1", "dataset", "dataset_files", "plain", "grain")
LABELS = {
    "files": "(a) tfdist FileSource",
    "random": "(b) tfdist RandomAccessSource (ArrayRecord)",
    "random1": "(b') the same, records read one by one (no __getitems__)",
    "dataset": "(c) task's TFRecordDataset.map(decode) via tfdist",
    "dataset_files": "(c') the same dataset sharded by file (streaming.file_sharded_batches)",
    "plain": "(d) plain tf.data, FILE-sharded (TF guide)",
    "grain": "(e) Grain MapDataset (ArrayRecord)",
}

_decodes = [0]


def _count(n):
    _decodes[0] += int(n)
    return __import__("numpy").int64(0)


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# ---------------------------------------------------------------- data


def data_dir(cache_dir: str, num_examples: int, size: int) -> str:
    return os.path.join(cache_dir, f"jpeg{size}-{num_examples}")


def _pool(size: int, count: int) -> list[bytes]:
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    rng = np.random.default_rng(size)
    pool = []
    for index in range(count):
        image = rng.integers(0, 90, size=(size, size, 3)).astype(np.uint8)
        image[: size // 2, : size // 2] += 150
        feature = {
            "image": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image, quality=95).numpy()])
            ),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[index % 4])),
        }
        pool.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return pool


def ensure_data(cache_dir: str, num_examples: int, size: int) -> str:
    """Writes `num_examples` records as 16 TFRecord and 16 ArrayRecord files, once."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    directory = data_dir(cache_dir, num_examples, size)
    done = os.path.join(directory, "DONE")
    if os.path.exists(done):
        return directory
    os.makedirs(directory, exist_ok=True)
    started = time.time()
    pool = _pool(size, min(POOL, num_examples))
    tf_writers = [
        tf.io.TFRecordWriter(f"{directory}/train-{i:05d}-of-{NUM_FILES:05d}.tfrecord")
        for i in range(NUM_FILES)
    ]
    ar_writers = [
        array_record_module.ArrayRecordWriter(
            f"{directory}/train-{i:05d}-of-{NUM_FILES:05d}.array_record", "group_size:1"
        )
        for i in range(NUM_FILES)
    ]
    per_file = -(-num_examples // NUM_FILES)
    for index in range(num_examples):
        record = pool[index % len(pool)]
        tf_writers[index % NUM_FILES].write(record)
        ar_writers[index // per_file].write(record)
    for writer in tf_writers + ar_writers:
        writer.close()
    with open(done, "w") as handle:
        handle.write(str(num_examples))
    print(
        f"# wrote {num_examples} records of {size}x{size} JPEG to {directory} in "
        f"{time.time() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return directory


def tfrecord_paths(directory):
    import glob  # pylint: disable=g-import-not-at-top

    return sorted(glob.glob(f"{directory}/*.tfrecord"))


def array_record_paths(directory):
    import glob  # pylint: disable=g-import-not-at-top

    return sorted(glob.glob(f"{directory}/*.array_record"))


# ---------------------------------------------------------------- decoders


def tf_decoder(size: int, count: bool):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

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
        image = tf.ensure_shape(tf.cast(image, tf.float32) / 255.0, (size, size, 3))
        return image, tf.cast(parsed["label"], tf.int32)

    return decode


def grain_decoder(count: bool):
    import numpy as np  # pylint: disable=g-import-not-at-top
    from PIL import Image  # pylint: disable=g-import-not-at-top
    from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top

    def decode(record):
        example = example_pb2.Example.FromString(record)
        jpeg = example.features.feature["image"].bytes_list.value[0]
        label = example.features.feature["label"].int64_list.value[0]
        image = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float32) / 255.0
        if count:
            _decodes[0] += 1
        return image, np.int32(label)

    return decode


# ---------------------------------------------------------------- pipelines


class OneByOne:
    """A random-access source without `__getitems__`: tfdist then reads `records[i]` per index."""

    def __init__(self, records):
        self._records = records

    def __len__(self):
        return len(self._records)

    def __getitem__(self, index):
        return self._records[index]


def build(
    kind: str,
    directory: str,
    size: int,
    *,
    first_step: int = 0,
    count: bool = True,
    plain_shuffle: int = 10000,
    grain_threads: int = 2,
    grain_prefetch: int = 64,
    shuffle_bytes: int = 0,
):
    """An iterator of worker 0's per-step batches (32 examples) for pipeline `kind`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.data import files as files_lib  # pylint: disable=g-import-not-at-top
    from tfdist.data import random_access, streaming  # pylint: disable=g-import-not-at-top
    from tfdist.data.shards import Shard  # pylint: disable=g-import-not-at-top
    from tfdist.data.sources import FileSource, RandomAccessSource  # pylint: disable=g-import-not-at-top

    shard = Shard(index=0, count=WORKERS, local_replicas=1)
    if kind == "files":
        window = {"shuffle_bytes": shuffle_bytes} if shuffle_bytes else {}
        source = FileSource(f"{directory}/*.tfrecord", preprocess=tf_decoder(size, count), **window)
        return iter(
            files_lib.replica_batches(
                source, global_batch_size=GLOBAL_BATCH, seed=0, first_step=first_step, shard=shard
            )
        )
    if kind in ("random", "random1"):
        from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

        records = array_record_data_source.ArrayRecordDataSource(array_record_paths(directory))
        if kind == "random1":
            records = OneByOne(records)
        source = RandomAccessSource(records, preprocess=tf_decoder(size, count))
        return iter(
            random_access.replica_batches(
                source, global_batch_size=GLOBAL_BATCH, seed=0, first_step=first_step, shard=shard
            )
        )
    if kind == "dataset":
        examples = tf.data.TFRecordDataset(tfrecord_paths(directory)).map(tf_decoder(size, count))
        batches = streaming.training_batches(
            examples,
            global_batch_size=GLOBAL_BATCH,
            seed=0,
            num_examples=None,
            first_step=first_step,
        )
        return iter(batches.map(lambda x, y: (x[:PER_WORKER], y[:PER_WORKER])))
    if kind == "dataset_files":
        examples = tf.data.TFRecordDataset(tfrecord_paths(directory)).map(tf_decoder(size, count))
        return iter(
            streaming.file_sharded_batches(
                examples, shard=shard, seed=0, global_batch_size=GLOBAL_BATCH, first_step=first_step
            )
        )
    if kind == "plain":
        mine = tfrecord_paths(directory)[0::WORKERS]
        dataset = (
            tf.data.TFRecordDataset(mine)
            .shuffle(plain_shuffle, seed=0)
            .repeat()
            .map(tf_decoder(size, count), num_parallel_calls=tf.data.AUTOTUNE)
            .batch(PER_WORKER, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        if first_step:
            dataset = dataset.skip(first_step)
        return iter(dataset)
    if kind == "grain":
        import grain  # pylint: disable=g-import-not-at-top

        source = grain.sources.ArrayRecordDataSource(array_record_paths(directory))
        dataset = grain.MapDataset.source(source).shuffle(seed=0).repeat()[0::WORKERS]
        dataset = dataset.map(grain_decoder(count))[first_step * PER_WORKER :]
        options = grain.ReadOptions(num_threads=grain_threads, prefetch_buffer_size=grain_prefetch)
        return iter(dataset.to_iter_dataset(options).batch(PER_WORKER, drop_remainder=True))
    raise ValueError(kind)


QUIET_SECONDS = [1.0]


def settled_count(timeout: float = 10.0) -> int:
    """The counter once the pipeline's read-ahead stops (unchanged for QUIET_SECONDS)."""
    quiet = QUIET_SECONDS[0]
    deadline = time.time() + timeout
    last, since = _decodes[0], time.time()
    while time.time() < deadline:
        time.sleep(0.05)
        if _decodes[0] != last:
            last, since = _decodes[0], time.time()
        elif time.time() - since >= quiet:
            break
    return last


# ---------------------------------------------------------------- parts


def part_counts(args, kinds, main_dir, small_dirs) -> dict:
    """Decodes per step, before the first batch (10k and large) and of a restart."""
    results = {}
    for kind in kinds:
        row = {}
        _decodes[0] = 0
        iterator = build(kind, main_dir, args.image_size, plain_shuffle=args.plain_shuffle)
        next(iterator)
        row["first_batch"] = _decodes[0]
        row["first_settled"] = settled_count()
        for _ in range(args.slope_steps - 1):
            next(iterator)
        at_a = _decodes[0]
        for _ in range(args.slope_steps):
            next(iterator)
        row["per_step"] = round((_decodes[0] - at_a) / args.slope_steps, 2)
        del iterator
        if kind != "plain":
            _decodes[0] = 0
            started = time.time()
            iterator = build(kind, main_dir, args.image_size, first_step=args.restart_step)
            next(iterator)
            row["restart_first_batch"] = _decodes[0]
            row["restart_seconds"] = round(time.time() - started, 2)
            row["restart_settled"] = settled_count()
            del iterator
        if kind in ("random", "random1", "grain", "files", "plain"):
            for label, directory in small_dirs.items():
                _decodes[0] = 0
                iterator = build(kind, directory, SMALL_SIZE, plain_shuffle=args.plain_shuffle)
                next(iterator)
                row[f"first_batch_{label}"] = _decodes[0]
                row[f"first_settled_{label}"] = settled_count()
                del iterator
        results[kind] = row
        print(json.dumps({"part": "counts", "kind": kind, **row}), flush=True)
    return results


def child_rss(
    kind: str, directory: str, size: int, steps: int, plain_shuffle: int, shuffle_bytes: int = 0
) -> dict:
    """Runs one pipeline for `steps` steps in a fresh process; its VmHWM."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--child_dir",
        directory,
        "--image_size",
        str(size),
        "--rss_steps",
        str(steps),
        "--plain_shuffle",
        str(plain_shuffle),
        "--shuffle_mb",
        str(shuffle_bytes / 2**20),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO}
    )
    output, _ = process.communicate(timeout=600)
    if process.returncode:
        raise RuntimeError(f"child {kind} failed with {process.returncode}")
    return json.loads(output.strip().splitlines()[-1])


def run_child(args) -> None:
    """The child: import, build, run `--rss_steps` steps, then report /proc/PID/status."""
    if args.child == "baseline":
        import grain  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
        import tensorflow as tf  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

        steps_done = 0
    else:
        iterator = build(
            args.child,
            args.child_dir,
            args.image_size,
            count=False,
            plain_shuffle=args.plain_shuffle,
            shuffle_bytes=_shuffle_bytes(args),
        )
        for steps_done in range(1, args.rss_steps + 1):  # noqa: B007  (read after the loop)
            next(iterator)
    status = {}
    with open(f"/proc/{os.getpid()}/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                status[key] = int(value.split()[0]) // 1024
    print(
        json.dumps(
            {
                "kind": args.child,
                "steps": steps_done,
                "peak_mb": status["VmHWM"],
                "rss_mb": status["VmRSS"],
            }
        )
    )


def _shuffle_bytes(args) -> int:
    return int(args.shuffle_mb * 2**20)


def part_rss(args, kinds, main_dir, small_dirs) -> dict:
    results = {}
    if not args.smoke:
        results["baseline"] = child_rss("baseline", main_dir, args.image_size, 0, 0)["peak_mb"]
        print(
            json.dumps(
                {
                    "part": "rss",
                    "kind": "baseline (import tf + grain)",
                    "peak_mb": results["baseline"],
                }
            ),
            flush=True,
        )
    for kind in kinds[:1] if args.smoke else kinds:
        row = {
            "main": child_rss(
                kind,
                main_dir,
                args.image_size,
                args.rss_steps,
                args.plain_shuffle,
                _shuffle_bytes(args),
            )["peak_mb"]
        }
        for label, directory in {} if args.smoke else small_dirs.items():
            row[label] = child_rss(
                kind,
                directory,
                SMALL_SIZE,
                args.rss_steps,
                args.plain_shuffle,
                _shuffle_bytes(args),
            )["peak_mb"]
        results[kind] = row
        print(json.dumps({"part": "rss", "kind": kind, **row}), flush=True)
    return results


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, all its threads (tf.data's included)."""
    import resource  # pylint: disable=g-import-not-at-top

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def part_throughput(args, kinds, main_dir) -> dict:
    """Examples/s per worker, input only, pipelines alternated round by round.

    Also the process's CPU time per 1000 examples during the timed steps: on a
    shared machine the wall-clock rate follows the neighbours' load, the CPU
    spent per example much less.
    """
    rates = {kind: [] for kind in kinds}
    cpu = {kind: [] for kind in kinds}
    for round_index in range(args.rounds):
        order = kinds if round_index % 2 == 0 else tuple(reversed(kinds))
        for kind in order:
            iterator = build(
                kind, main_dir, args.image_size, count=False, plain_shuffle=args.plain_shuffle
            )
            for _ in range(args.warmup_steps):
                next(iterator)
            started, cpu_started = time.perf_counter(), _cpu_seconds()
            for _ in range(args.throughput_steps):
                next(iterator)
            examples = args.throughput_steps * PER_WORKER
            rates[kind].append(examples / (time.perf_counter() - started))
            cpu[kind].append(1000 * 1000 * (_cpu_seconds() - cpu_started) / examples)
            del iterator
        print(
            json.dumps(
                {
                    "part": "throughput",
                    "round": round_index,
                    "load": load_average(),
                    **{kind: round(values[-1]) for kind, values in rates.items()},
                }
            ),
            flush=True,
        )
    medians = {kind: round(statistics.median(values)) for kind, values in rates.items()}
    # Each round's ratio to the plain pipeline of the same round, then their median: the
    # pairing cancels most of the drift of a shared machine's load.
    ratios = (
        {}
        if "plain" not in rates
        else {
            kind: round(statistics.median(a / b for a, b in zip(values, rates["plain"])), 2)
            for kind, values in rates.items()
        }
    )
    print(
        json.dumps({"part": "throughput", "median": medians, "ratio_vs_plain": ratios}), flush=True
    )
    cpu_medians = {kind: round(statistics.median(values), 1) for kind, values in cpu.items()}
    print(json.dumps({"part": "throughput", "cpu_ms_per_1000_examples": cpu_medians}), flush=True)
    return {
        "median": medians,
        "ratio_vs_plain": ratios,
        "cpu_ms_per_1000_examples": cpu_medians,
        "cpu_all": {k: [round(v, 1) for v in vs] for k, vs in cpu.items()},
        "all": {k: [round(v) for v in vs] for k, vs in rates.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="all", choices=("all", "counts", "rss", "throughput"))
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated subset of: "
        + "; ".join(f"{kind} {label}" for kind, label in LABELS.items()),
    )
    parser.add_argument("--cache_dir", default="/tmp/tfdist-bench-data-scale")
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--small_examples", type=int, default=10000)
    parser.add_argument(
        "--large_examples",
        type=int,
        default=1000000,
        help="records of 16x16 JPEG for the size comparison; 0 for none",
    )
    parser.add_argument("--slope_steps", type=int, default=100)
    parser.add_argument("--restart_step", type=int, default=5000)
    parser.add_argument("--rss_steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=20)
    parser.add_argument("--throughput_steps", type=int, default=150)
    parser.add_argument(
        "--plain_shuffle",
        type=int,
        default=10000,
        help="the plain pipeline's shuffle buffer, in records",
    )
    parser.add_argument(
        "--shuffle_mb",
        type=float,
        default=0,
        help="(a)'s FileSource(shuffle_bytes=...) in MiB; 0 for tfdist's default",
    )
    parser.add_argument("--json", default="", help="also write the results to this file")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and step counts: checks that everything runs",
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child_dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    if args.smoke:
        # One child process (RSS of the first kind only), no 16x16 sets: ~15 s.
        args.examples, args.small_examples, args.large_examples = 256, 0, 0
        QUIET_SECONDS[0] = 0.1
        args.slope_steps, args.restart_step, args.rss_steps = 3, 9, 3
        args.rounds, args.warmup_steps, args.throughput_steps = 1, 1, 3
        args.plain_shuffle = 64
    kinds = tuple(kind for kind in args.kinds.split(",") if kind)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds has {','.join(unknown)}, expected some of {','.join(KINDS)}")
    main_dir = ensure_data(args.cache_dir, args.examples, args.image_size)
    small_dirs = {}
    if args.small_examples:
        small_dirs[f"{args.small_examples}"] = ensure_data(
            args.cache_dir, args.small_examples, SMALL_SIZE
        )
    if args.large_examples:
        small_dirs[f"{args.large_examples}"] = ensure_data(
            args.cache_dir, args.large_examples, SMALL_SIZE
        )
    results = {
        "load_before": load_average(),
        "cpus": os.cpu_count(),
        "config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
    }
    if args.part in ("all", "counts"):
        results["counts"] = part_counts(args, kinds, main_dir, small_dirs)
    if args.part in ("all", "rss"):
        results["rss"] = part_rss(args, kinds, main_dir, small_dirs)
    if args.part in ("all", "throughput"):
        results["throughput"] = part_throughput(args, kinds, main_dir)
    results["load_after"] = load_average()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    print(json.dumps({"summary": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
