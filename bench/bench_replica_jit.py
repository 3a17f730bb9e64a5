"""XLA per replica under MirroredStrategy on this CPU: `jit_compile=True` against no XLA.

With `tfdist.keras_compat.apply()`, `model.compile(jit_compile=True)` under
MirroredStrategy compiles each replica's forward and backward pass with XLA
(the all-reduce and the optimizer update stay outside). This measures whether
that pays on this machine's CPU, for the `trainer.tasks.models` `mlp` and `cnn` on
the synthetic data (global batch 64, SGD with momentum), with MirroredStrategy
on 1 device and on 2 logical CPUs (`--num_cpu_devices=2`, the tests' setup).

Each run is a fresh process; runs alternate (xla, plain, plain, xla, ...);
examples/s are timed between the first and the last `on_train_batch_end`
(tracing and XLA compilation excluded). Reports medians, their ratio and the
load average before and after.

    python bench/bench_replica_jit.py                     # mlp and cnn, 1 and 2 devices
    python bench/bench_replica_jit.py --models=cnn --devices=2 --pairs=5
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import two_workers
from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
SIDES = ("xla", "plain")

_PAIRS = flags.DEFINE_integer("pairs", 3, "XLA/plain run pairs per configuration.", lower_bound=1)
_MODELS = flags.DEFINE_list("models", ["mlp", "cnn"], "trainer.tasks.models names.")
_DEVICES = flags.DEFINE_list("devices", ["1", "2"], "MirroredStrategy CPU device counts.")
_STEPS = flags.DEFINE_integer("steps", 300, "Timed training steps per run.", lower_bound=2)
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "Global batch size.", lower_bound=2)
_SIDE = flags.DEFINE_enum("side", None, ["run"], "run: one timed run (internal).")
_JIT = flags.DEFINE_bool("jit", False, "With --side=run: compile with jit_compile=True.")
_MODEL = flags.DEFINE_string("model", "mlp", "With --side=run: the model.")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 1, "With --side=run: CPU devices.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the results as JSON here.")


def run_side() -> None:
    """One run in this process; prints examples/s as a JSON line."""
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top
    from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
    from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top

    options = strategy_lib.StrategyOptions(
        num_cpu_devices=_NUM_DEVICES.value if _NUM_DEVICES.value > 1 else 0
    )
    strategy = strategy_lib.make_strategy("mirrored", resolve_cluster({}), options)
    keras_compat.apply()

    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    task = BuiltinTask(model=_MODEL.value, dataset="synthetic", num_examples=8192)
    train = training_batches(
        task.build_inputs(True), global_batch_size=_BATCH.value, seed=0, num_examples=8192
    )
    with strategy.scope():
        model = task.build_model()
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=_JIT.value,
        )
    ends = []
    timer = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append((batch, time.perf_counter()))
    )
    model.fit(
        train,
        epochs=1,
        steps_per_epoch=_STEPS.value + 1,
        verbose=0,
        shuffle=False,
        callbacks=[timer],
    )
    (first_batch, first_time), (last_batch, last_time) = ends[0], ends[-1]
    steps_per_second = (last_batch - first_batch) / (last_time - first_time)
    print(
        json.dumps(
            {
                "examples_per_second": steps_per_second * _BATCH.value,
                "num_replicas": strategy.num_replicas_in_sync,
            }
        ),
        flush=True,
    )


def run(model: str, devices: int, side: str) -> float:
    command = [
        sys.executable,
        str(pathlib.Path(__file__).resolve()),
        "--side=run",
        f"--model={model}",
        f"--num_devices={devices}",
        f"--steps={_STEPS.value}",
        f"--global_batch_size={_BATCH.value}",
        "--jit" if side == "xla" else "--nojit",
    ]
    completed = subprocess.run(
        command,
        cwd=REPO,
        env=two_workers.child_environ(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"{model} {side} exited {completed.returncode}:\n{completed.stderr[-3000:]}"
        )
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    if result["num_replicas"] != devices:
        raise RuntimeError(f"expected {devices} replicas, got {result['num_replicas']}")
    return float(result["examples_per_second"])


def _load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv) -> None:
    del argv
    if _SIDE.value == "run":
        run_side()
        return
    load_before = _load_average()
    rows = []
    for model in _MODELS.value:
        for devices in (int(value) for value in _DEVICES.value):
            results = {side: [] for side in SIDES}
            for pair in range(_PAIRS.value):
                for side in SIDES if pair % 2 == 0 else SIDES[::-1]:
                    results[side].append(run(model, devices, side))
                    print(
                        f"{model} {devices} device(s) pair {pair + 1}: {side:5s} "
                        f"{results[side][-1]:9.1f} examples/s",
                        file=sys.stderr,
                        flush=True,
                    )
            medians = {side: statistics.median(values) for side, values in results.items()}
            rows.append(
                {
                    "model": model,
                    "devices": devices,
                    "median_examples_per_second": medians,
                    "ratio_xla_over_plain": medians["xla"] / medians["plain"],
                    "runs": results,
                }
            )
    summary = {
        "rows": rows,
        "global_batch_size": _BATCH.value,
        "timed_steps": _STEPS.value,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
    }
    print(json.dumps(summary), flush=True)
    if _OUTPUT.value:
        pathlib.Path(_OUTPUT.value).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
