"""A small training task for multi-process tests, run once per task.

    python tests/jobs/multiworker_task.py --strategy=multiworker --out=DIR [--compat=full]

Trains the `mlp` on the synthetic data, then evaluates and predicts on a test
set whose last batch is partial. The chief writes `weights.npz`,
`evaluate.json` and `predict.npy` into `--out`. `--marker_step=N` writes
`<out>/started-<task>` after step N, so a test can act once training runs.
`--compat=none` leaves Keras unpatched (to show the upstream failure);
`--compat=build_only` corrects only the first of the two upstream reductions;
`--compat=no_steps_per_execution` corrects both but not the multi-step loop;
`--compat=each_upstream` tries `fit` under each of those three in turn (each
adds its corrections to the last, as the failures come in that order) and
writes `<out>/upstream-<task>.json`: `{setting: the error fit raised, or null}`.
`--record` makes every task write `<out>/batch_logs-<task>.json` (the logs
each `on_train_batch_end` saw) and the chief `<out>/history.json` and
`<out>/train_graph.json` (whether one call of the train function runs its
steps in one graph: a `While` loop whose body reaches the collective
all-reduce). `--jit_compile` compiles the model with `jit_compile=True`.
"""

import argparse
import json
import os
import pathlib

import numpy as np

from tfdist import keras_compat
from tfdist.data import with_shard_policy
from tfdist.distribute import strategy as strategy_lib
from tfdist.distribute.cluster import resolve_cluster


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="multiworker")
    parser.add_argument(
        "--compat",
        default="full",
        choices=("full", "none", "build_only", "no_steps_per_execution", "each_upstream"),
    )
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--marker_step", type=int, default=0)
    parser.add_argument("--num_cpu_devices", type=int, default=0)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--jit_compile", action="store_true")
    return parser.parse_args()


def _make_strategy(args, cluster):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if args.strategy == "multiworker" and args.compat != "full":
        if args.compat == "build_only":
            keras_compat.apply(corrections=("symbolic_build",))
        elif args.compat == "no_steps_per_execution":
            keras_compat.apply(corrections=("symbolic_build", "reduce_per_replica"))
        resolver = strategy_lib.cluster_resolver(cluster, ("chief", "worker"))
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    # make_strategy applies the corrections under `multiworker` only; they also
    # serve `mirrored` (steps_per_execution with collectives, jit_compile).
    keras_compat.apply()
    options = strategy_lib.StrategyOptions(num_cpu_devices=args.num_cpu_devices)
    return strategy_lib.make_strategy(args.strategy, cluster, options)


class _Marker:
    """Keras callback factory that writes a file after a given step."""

    @staticmethod
    def make(path: pathlib.Path, step: int):
        import keras  # pylint: disable=g-import-not-at-top

        class Marker(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch + 1 == step:
                    path.write_text("started")

        return Marker()


class _BatchLogRecorder:
    """Keras callback factory that keeps every `on_train_batch_end` log."""

    @staticmethod
    def make(records: list):
        import keras  # pylint: disable=g-import-not-at-top

        class BatchLogRecorder(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                records.append(
                    {"batch": batch, **{name: float(value) for name, value in (logs or {}).items()}}
                )

        return BatchLogRecorder()


def _reaches(library: dict, function_name: str, op_type: str, seen: set) -> bool:
    """Whether the function, or one it calls, holds an op of `op_type`."""
    if function_name in seen or function_name not in library:
        return False
    seen.add(function_name)
    for node in library[function_name].node_def:
        if node.op == op_type:
            return True
        called = [node.op] + [
            value.func.name for value in node.attr.values() if value.HasField("func")
        ]
        if any(_reaches(library, name, op_type, seen) for name in called):
            return True
    return False


def _train_graph_report(model, strategy, dataset) -> dict:
    """Whether `model.train_function` runs several steps in one graph with the all-reduce."""
    fused = getattr(model.train_function, "fused_function", None)
    if fused is None:
        return {"fused": False, "while_reaches_all_reduce": False}
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    graph_def = fused.get_concrete_function(iterator).graph.as_graph_def()
    library = {function.signature.name: function for function in graph_def.library.function}
    bodies = [
        node.attr["body"].func.name
        for node in graph_def.node
        if node.op in ("While", "StatelessWhile")
    ]
    return {
        "fused": True,
        "while_reaches_all_reduce": any(
            _reaches(library, body, "CollectiveReduceV2", set()) for body in bodies
        ),
    }


def _compiled_model_and_data(args, strategy):
    """The compiled mlp, its training batches, the test set and its images."""
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.tasks import datasets  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    task = BuiltinTask(model="mlp", dataset="synthetic", num_examples=2048)
    train = training_batches(
        task.build_inputs(True), global_batch_size=64, seed=0, num_examples=2048
    )
    test_images, test_labels = datasets.synthetic_arrays(100, 0, "test")
    test = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(64)
    test = with_shard_policy(test)
    with strategy.scope():
        model = task.build_model()
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
            jit_compile=args.jit_compile,
        )
    return model, train, test, test_images


# The upstream settings `--compat=each_upstream` tries, in order, with the corrections
# each adds to the last.
UPSTREAM_SETTINGS = (
    ("none", ()),
    ("build_only", ("symbolic_build",)),
    ("no_steps_per_execution", ("reduce_per_replica",)),
)


def _try_each_upstream_setting(args, cluster, strategy, out: pathlib.Path) -> None:
    errors = {}
    for name, corrections in UPSTREAM_SETTINGS:
        if corrections:
            keras_compat.apply(corrections=corrections)
        model, train, _, _ = _compiled_model_and_data(args, strategy)
        try:
            model.fit(train, epochs=1, steps_per_epoch=args.steps, verbose=0, shuffle=False)
        except Exception as error:  # pylint: disable=broad-except  (recorded for the test)
            errors[name] = f"{type(error).__name__}: {error}"
        else:
            errors[name] = None
    task = f"{cluster.task_type}-{cluster.task_index}"
    (out / f"upstream-{task}.json").write_text(json.dumps(errors))


def main():
    args = _parse_args()
    out = pathlib.Path(args.out)
    cluster = resolve_cluster(os.environ)
    strategy = _make_strategy(args, cluster)

    if args.compat == "each_upstream":
        _try_each_upstream_setting(args, cluster, strategy, out)
        return
    model, train, test, test_images = _compiled_model_and_data(args, strategy)
    callbacks = []
    if args.marker_step:
        task = f"{cluster.task_type}-{cluster.task_index}"
        callbacks.append(_Marker.make(out / f"started-{task}", args.marker_step))
    batch_logs = []
    if args.record:
        callbacks.append(_BatchLogRecorder.make(batch_logs))
    history = model.fit(
        train, epochs=1, steps_per_epoch=args.steps, verbose=0, shuffle=False, callbacks=callbacks
    )
    if args.record:
        task = f"{cluster.task_type}-{cluster.task_index}" if cluster.task_type else "single"
        (out / f"batch_logs-{task}.json").write_text(json.dumps(batch_logs))
        if cluster.is_chief:
            (out / "history.json").write_text(json.dumps(history.history))
            (out / "train_graph.json").write_text(
                json.dumps(_train_graph_report(model, strategy, train))
            )
    evaluation = model.evaluate(test, verbose=0, return_dict=True)
    predictions = model.predict(test_images, batch_size=64, verbose=0)
    if cluster.is_chief:
        np.savez(out / "weights.npz", *model.get_weights())
        (out / "evaluate.json").write_text(json.dumps(evaluation))
        np.save(out / "predict.npy", predictions, allow_pickle=False)


if __name__ == "__main__":
    main()
