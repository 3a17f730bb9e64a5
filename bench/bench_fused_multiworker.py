"""Fused `steps_per_execution` under MultiWorkerMirroredStrategy: one graph per execution.

Two local workers (`tfdist.launch`, loopback) train the `mlp` with
`steps_per_execution=N` in two ways, each in fresh processes:

- `fused`: `tfdist.keras_compat` as shipped: the N steps of one execution run
  in one `tf.while_loop` (one graph execution);
- `python_loop`: what keras_compat did before: the execution is a Python
  loop calling the compiled single step N times (the baseline is set as the
  model's `train_function`, which Keras's `fit` then uses as is).

Runs alternate (fused, loop, loop, fused, ...) so that slow drifts in machine
load hit both sides alike; the chief times the steps between the first and
the last `on_train_batch_end` (tracing excluded). Reports medians, their
ratio, and the load average before and after.

    python bench/bench_fused_multiworker.py                  # 5 pairs
    python bench/bench_fused_multiworker.py --pairs=7 --steps_per_execution=4
"""

import json
import os
import pathlib
import statistics
import sys
import time

import two_workers
from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = ("fused", "python_loop")

_PAIRS = flags.DEFINE_integer("pairs", 5, "Fused/loop run pairs.", lower_bound=1)
_MODEL = flags.DEFINE_string("model", "mlp", "trainer.tasks.models name.")
_STEPS = flags.DEFINE_integer("steps", 400, "Timed training steps per run.", lower_bound=2)
_SPE = flags.DEFINE_integer("steps_per_execution", 10, "Steps per execution.", lower_bound=2)
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "Global batch size.", lower_bound=2)
_SIDE = flags.DEFINE_enum("side", None, ["worker"], "worker: one task of one run (internal).")
_MODE = flags.DEFINE_enum("mode", "fused", MODES, "With --side=worker: which loop.")
_RESULT = flags.DEFINE_string("result", None, "With --side=worker: the chief writes JSON here.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the results as JSON here.")


def _python_loop_function(model):
    """The pre-fusion keras_compat loop: one compiled single step per call."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from keras.src.backend.tensorflow import trainer as tf_trainer  # pylint: disable=g-import-not-at-top

    strategy = model.distribute_strategy

    @tf.function(reduce_retracing=True)
    def one_step_on_data(data):
        outputs = strategy.run(model.train_step, args=(data,))
        return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    def function(iterator):
        outputs = None
        for _ in range(model.steps_per_execution):
            next_batch = iterator.get_next_as_optional()
            if not next_batch.has_value():
                break
            outputs = one_step_on_data(next_batch.get_value())
        if outputs is None:
            raise StopIteration
        return outputs

    return function


def worker_side() -> None:
    """One task of a 2-worker run; the chief writes steps/s to --result."""
    from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
    from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top

    cluster = resolve_cluster(os.environ)
    strategy = strategy_lib.make_strategy("multiworker", cluster, strategy_lib.StrategyOptions())

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
            steps_per_execution=_SPE.value,
        )
    if _MODE.value == "python_loop":
        model.train_function = _python_loop_function(model)
    ends = []
    timer = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append((batch, time.perf_counter()))
    )
    steps = _STEPS.value + _SPE.value  # the first execution (tracing) is not timed
    model.fit(train, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False, callbacks=[timer])
    (first_batch, first_time), (last_batch, last_time) = ends[0], ends[-1]
    if cluster.is_chief:
        pathlib.Path(_RESULT.value).write_text(
            json.dumps({"steps_per_second": (last_batch - first_batch) / (last_time - first_time)})
        )


def run(mode: str) -> float:
    """Steps/s of one fresh 2-worker run."""
    result = two_workers.run_two_workers(
        str(pathlib.Path(__file__).resolve()),
        f"--mode={mode}",
        f"--model={_MODEL.value}",
        f"--steps={_STEPS.value}",
        f"--steps_per_execution={_SPE.value}",
        f"--global_batch_size={_BATCH.value}",
        what=f"{mode} run",
    )
    return float(result["steps_per_second"])


def _load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv) -> None:
    del argv
    if _SIDE.value == "worker":
        worker_side()
        return
    load_before = _load_average()
    results = {mode: [] for mode in MODES}
    for pair in range(_PAIRS.value):
        order = MODES if pair % 2 == 0 else MODES[::-1]
        for mode in order:
            results[mode].append(run(mode))
            print(
                f"pair {pair + 1}: {mode:12s} {results[mode][-1]:8.1f} steps/s",
                file=sys.stderr,
                flush=True,
            )
    medians = {mode: statistics.median(values) for mode, values in results.items()}
    summary = {
        "model": _MODEL.value,
        "steps_per_execution": _SPE.value,
        "timed_steps": _STEPS.value,
        "global_batch_size": _BATCH.value,
        "workers": 2,
        "median_steps_per_second": medians,
        "ratio_fused_over_python_loop": medians["fused"] / medians["python_loop"],
        "runs": results,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
    }
    print(json.dumps(summary), flush=True)
    if _OUTPUT.value:
        pathlib.Path(_OUTPUT.value).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
