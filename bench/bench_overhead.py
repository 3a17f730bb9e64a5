"""Does the trainer cost throughput? `trainer.task` against plain Keras `model.fit`.

Both sides train the same model on the same data pipeline with the same seed,
each in a fresh process, and are timed the same way: `ThroughputMeter` counts
global examples per second over every training step except the first (which
includes tracing). Runs alternate (trainer, plain, plain, trainer, ...) so that
slow drifts in machine load hit both sides alike. The goal is a trainer/plain
ratio of at least 0.97.

    python bench/bench_overhead.py                 # 5 pairs, the defaults below
    python bench/bench_overhead.py --pairs=7 --steps_per_epoch=400

The plain side is what a Keras user writes by hand: build the model, compile
it with SGD, call `model.fit` with one callback (the meter) and `verbose=0`.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import two_workers
from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]

_PAIRS = flags.DEFINE_integer("pairs", 5, "Trainer/plain run pairs.", lower_bound=1)
_MODEL = flags.DEFINE_string("model", "mlp", "Built-in model name (trainer.tasks.models).")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Epochs per run.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 300, "Steps per epoch.", lower_bound=2)
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "Global batch size.", lower_bound=1)
_EXAMPLES = flags.DEFINE_integer("num_examples", 8192, "Synthetic training examples.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
_MOMENTUM = flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
_TRAINER_FLAGS = flags.DEFINE_list(
    "trainer_flags", [], "Extra flags for trainer.task, e.g. --trainer_flags=--model_dir=/tmp/m."
)
_TRAINER_MODEL_DIR = flags.DEFINE_bool(
    "trainer_model_dir",
    True,
    "Give the trainer a --model_dir (as users do; it also turns on its TensorBoard callback). "
    "--notrainer_model_dir reads examples/s from the trainer's stdout digest instead.",
)
_SIDE = flags.DEFINE_enum(
    "side",
    None,
    ["plain", "ablation"],
    "plain: run one plain-Keras side (internal). ablation: in one process, alternate plain "
    "fit with the trainer's extra fit arguments one by one, to find what costs throughput.",
)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Rounds of the ablation.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Also write the results as JSON here.")


def _common_flags() -> list[str]:
    return [
        f"--model={_MODEL.value}",
        f"--epochs={_EPOCHS.value}",
        f"--steps_per_epoch={_STEPS.value}",
        f"--global_batch_size={_BATCH.value}",
        f"--num_examples={_EXAMPLES.value}",
        f"--learning_rate={_LEARNING_RATE.value}",
        f"--momentum={_MOMENTUM.value}",
    ]


def _last_json_line(result: subprocess.CompletedProcess, what: str) -> dict:
    if result.returncode != 0:
        raise RuntimeError(f"{what} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_trainer() -> float:
    """Examples/s of `python -m trainer.task --strategy=default`, from its summary."""
    with tempfile.TemporaryDirectory() as model_dir:
        command = [
            sys.executable,
            "-m",
            "trainer.task",
            "--strategy=default",
            *([f"--model_dir={model_dir}"] if _TRAINER_MODEL_DIR.value else []),
            *_common_flags(),
            *_TRAINER_FLAGS.value,
        ]
        result = subprocess.run(
            command,
            cwd=REPO,
            env=two_workers.child_environ(),
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        summary = _last_json_line(result, "trainer.task")
        if _TRAINER_MODEL_DIR.value:
            summary = json.loads(pathlib.Path(model_dir, "summary.json").read_text())
    return float(summary["examples_per_second"])


def run_plain() -> float:
    """Examples/s of plain Keras `model.fit` on the same model and data (fresh process)."""
    command = [
        sys.executable,
        str(pathlib.Path(__file__).resolve()),
        "--side=plain",
        *_common_flags(),
    ]
    result = subprocess.run(
        command,
        cwd=REPO,
        env=two_workers.child_environ(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    return float(_last_json_line(result, "plain Keras")["examples_per_second"])


def plain_keras_side() -> None:
    """The plain side, in this process: what a Keras user writes by hand."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.run.throughput import ThroughputMeter  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    task = BuiltinTask(model=_MODEL.value, dataset="synthetic", num_examples=_EXAMPLES.value)
    train = training_batches(
        task.build_inputs(True),
        global_batch_size=_BATCH.value,
        seed=0,
        num_examples=_EXAMPLES.value,
    )
    model = task.build_model()
    model.compile(
        optimizer=keras.optimizers.SGD(_LEARNING_RATE.value, momentum=_MOMENTUM.value),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    meter = ThroughputMeter(global_batch_size=_BATCH.value)
    model.fit(
        train,
        epochs=_EPOCHS.value,
        steps_per_epoch=_STEPS.value,
        callbacks=[meter],
        verbose=0,
        shuffle=False,
    )
    print(json.dumps({"examples_per_second": meter.examples_per_second}), flush=True)


def _epoch_only_tensorboard():
    """Keras's TensorBoard without its per-batch `summary.scalar` calls.

    Keras 3.15's `TensorBoard.on_train_batch_end` calls `summary.scalar` for
    every log entry on every batch even with `update_freq="epoch"`: nothing is
    written (no writer is installed), but each batch pays for the eager ops.
    The fix the trainer now uses: `tfdist.callbacks.EpochTensorBoard`.
    """
    import keras  # pylint: disable=g-import-not-at-top

    class EpochOnlyTensorBoard(keras.callbacks.TensorBoard):
        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)

    return EpochOnlyTensorBoard


def ablation() -> None:
    """Times plain `fit` against the trainer's `fit` extras, in one process.

    One model, one pipeline; each variant runs one epoch of `--steps_per_epoch`
    steps per round, in rotating order. Separate processes vary by more than the
    effects measured here on a shared machine.
    """
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.run.throughput import ThroughputMeter  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    task = BuiltinTask(model=_MODEL.value, dataset="synthetic", num_examples=_EXAMPLES.value)
    train = training_batches(
        task.build_inputs(True),
        global_batch_size=_BATCH.value,
        seed=0,
        num_examples=_EXAMPLES.value,
    )
    model = task.build_model()
    model.compile(
        optimizer=keras.optimizers.SGD(_LEARNING_RATE.value, momentum=_MOMENTUM.value),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    with tempfile.TemporaryDirectory() as logs:
        variants = {
            "plain (verbose=0)": dict(verbose=0, tensorboard=None),
            "verbose=2": dict(verbose=2, tensorboard=None),
            "verbose=2 + TensorBoard (trainer)": dict(
                verbose=2, tensorboard=keras.callbacks.TensorBoard
            ),
            "verbose=2 + epoch-only TensorBoard": dict(
                verbose=2, tensorboard=_epoch_only_tensorboard()
            ),
        }
        names = list(variants)
        results = {name: [] for name in names}
        cpu_per_step = {name: [] for name in names}
        model.fit(train, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)  # warm up
        for round_index in range(_ROUNDS.value):
            for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
                meter = ThroughputMeter(global_batch_size=_BATCH.value)
                callbacks = [meter]
                if variants[name]["tensorboard"]:
                    callbacks.append(variants[name]["tensorboard"](logs))
                cpu_started = time.process_time()
                model.fit(
                    train,
                    epochs=1,
                    steps_per_epoch=_STEPS.value,
                    callbacks=callbacks,
                    verbose=variants[name]["verbose"],
                    shuffle=False,
                )
                cpu_per_step[name].append((time.process_time() - cpu_started) / _STEPS.value)
                results[name].append(meter.examples_per_second)
    base = statistics.median(results[names[0]])
    base_cpu = statistics.median(cpu_per_step[names[0]])
    summary = {
        name: {
            "median_examples_per_second": statistics.median(values),
            "ratio_to_plain": statistics.median(values) / base,
            "median_cpu_ms_per_step": 1e3 * statistics.median(cpu_per_step[name]),
            "cpu_ratio_plain_over_variant": (base_cpu / statistics.median(cpu_per_step[name])),
            "runs": values,
        }
        for name, values in results.items()
    }
    for name, row in summary.items():
        print(
            f"{name:36s} {row['median_examples_per_second']:10.1f} examples/s  "
            f"ratio {row['ratio_to_plain']:.3f}  |  {row['median_cpu_ms_per_step']:.3f} "
            f"CPU ms/step, plain/variant {row['cpu_ratio_plain_over_variant']:.3f}",
            file=sys.stderr,
        )
    print(json.dumps(summary), flush=True)


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv) -> None:
    del argv
    if _SIDE.value == "plain":
        plain_keras_side()
        return
    if _SIDE.value == "ablation":
        ablation()
        return
    load_before = _load_average()
    trainer_runs, plain_runs = [], []
    for pair in range(_PAIRS.value):
        # Alternate which side goes first so drifts in load hit both alike.
        order = (("trainer", run_trainer), ("plain", run_plain))
        for side, run in order if pair % 2 == 0 else order[::-1]:
            value = run()
            (trainer_runs if side == "trainer" else plain_runs).append(value)
            print(f"pair {pair + 1}/{_PAIRS.value}: {side:7s} {value:10.1f} examples/s", flush=True)
    pair_ratios = [t / p for t, p in zip(trainer_runs, plain_runs)]
    results = {
        "config": {
            "model": _MODEL.value,
            "epochs": _EPOCHS.value,
            "steps_per_epoch": _STEPS.value,
            "global_batch_size": _BATCH.value,
            "num_examples": _EXAMPLES.value,
            "trainer_flags": _TRAINER_FLAGS.value,
            "trainer_model_dir": _TRAINER_MODEL_DIR.value,
        },
        "trainer_examples_per_second": trainer_runs,
        "plain_examples_per_second": plain_runs,
        "trainer_median": statistics.median(trainer_runs),
        "plain_median": statistics.median(plain_runs),
        "ratio_of_medians": statistics.median(trainer_runs) / statistics.median(plain_runs),
        "median_pair_ratio": statistics.median(pair_ratios),
        # The least disturbed run of each side: on a shared machine slowdowns only add.
        "ratio_of_bests": max(trainer_runs) / max(plain_runs),
        "pair_ratios": pair_ratios,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "cpu_count": os.cpu_count(),
    }
    print(
        f"trainer median {results['trainer_median']:.1f} examples/s, plain Keras median "
        f"{results['plain_median']:.1f} examples/s: ratio {results['ratio_of_medians']:.3f} "
        f"(median of pair ratios {results['median_pair_ratio']:.3f}, ratio of best runs "
        f"{results['ratio_of_bests']:.3f}; goal >= 0.97); load "
        f"average {load_before} -> {results['load_average_after']}"
    )
    print(json.dumps(results), flush=True)
    if _OUTPUT.value:
        pathlib.Path(_OUTPUT.value).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    app.run(main)
