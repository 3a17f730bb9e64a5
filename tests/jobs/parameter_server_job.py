"""A tiny parameter-server job for multi-process tests, run once per task.

    python tests/jobs/parameter_server_job.py --out=DIR [--epochs=2 --steps_per_epoch=20]

Every task runs this same command; `TF_CONFIG` decides the role:

- chief: trains a small regression model with `tfdist.parameter_server.fit`
  (`steps_per_sync` steps between sync points), exports checkpoints to
  `<out>/checkpoints` at every epoch end, and writes `<out>/summary.json`
  (`steps_completed`, `iterations`, per-epoch `loss` and `val_loss` (3
  validation batches on the workers), and the examples the loss metric had
  counted in the last epoch at its last sync point). After the first sync point it writes `<out>/underway` and,
  with `--hold_after_first_sync`, waits until `<out>/release` exists, so a test
  can kill a task at a known point. With `--mark_batches` every batch a worker
  reads also leaves a file in `<out>/batches`, so a test can tell that steps
  are running right now.
- worker and ps: `tfdist.parameter_server.serve` (chief gone for 3 s: exit 0).
- evaluator: `SidecarEvaluator` on the exported checkpoints, metrics under
  `<out>/eval`.

With `--count_metrics` the model ends in a sigmoid, every target is 1, and it
is compiled with `Precision`, `Recall`, `AUC`, `F1Score`, `IoU` (thresholds
that count every example) and `ExampleCount`, a metric written as
`keras.metrics.Metric`'s docstring shows (`v.assign(v + x)`). `summary.json`
then holds `metric_counts`: how many examples each metric's state had counted
in the last epoch at its last sync point (the sum of its confusion-matrix
entries).

Exit codes: 0 done; 3 when a parameter server was lost (message on stderr).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

from tfdist.distribute.cluster import resolve_cluster

BATCH_SIZE = 16
NUM_FEATURES = 8
HOLD_TIMEOUT_SECONDS = 120


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=20)
    parser.add_argument("--steps_per_sync", type=int, default=0)
    parser.add_argument("--hold_after_first_sync", action="store_true")
    parser.add_argument("--mark_batches", action="store_true")
    parser.add_argument("--min_shard_bytes", type=int, default=0)
    parser.add_argument("--max_shards", type=int, default=1)
    parser.add_argument("--count_metrics", action="store_true")
    return parser.parse_args()


def _arrays(seed: int):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(512, NUM_FEATURES)).astype(np.float32)
    weights = np.arange(1, NUM_FEATURES + 1, dtype=np.float32)[:, None] / NUM_FEATURES
    return features, features @ weights


def _dataset(mark_dir: str = "", ones: bool = False):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    features, targets = _arrays(0)
    if ones:
        targets = np.ones_like(targets)
    # No fixed seed: each worker's copy of the pipeline shuffles differently.
    dataset = (
        tf.data.Dataset.from_tensor_slices((features, targets))
        .shuffle(512)
        .batch(BATCH_SIZE, drop_remainder=True)
    )
    if not mark_dir:
        return dataset

    def mark(batch_x, batch_y):
        # Runs on the worker that reads the batch: a file per batch read shows
        # a test that steps are being executed right now.
        name = tf.strings.as_string(tf.random.uniform([], maxval=2**62, dtype=tf.int64))
        with tf.control_dependencies([tf.io.write_file(mark_dir + "/" + name, "")]):
            return tf.identity(batch_x), batch_y

    return dataset.map(mark)


def _example_count_metric():
    import keras  # pylint: disable=g-import-not-at-top
    from keras import ops  # pylint: disable=g-import-not-at-top

    class ExampleCount(keras.metrics.Metric):
        """Counts examples the way keras.metrics.Metric's docstring updates state."""

        def __init__(self, name="example_count", **kwargs):
            super().__init__(name=name, **kwargs)
            self.count = self.add_variable(shape=(), initializer="zeros", name="count")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.count.assign(self.count + ops.cast(ops.shape(y_true)[0], self.dtype))

        def result(self):
            return self.count

    return ExampleCount()


def _counting_metrics():
    import keras  # pylint: disable=g-import-not-at-top

    # Every target is 1 and every prediction a sigmoid > 0: each metric's
    # confusion entries below add up to the examples it saw.
    return [
        keras.metrics.Precision(thresholds=0.0, name="precision"),
        keras.metrics.Recall(thresholds=0.0, name="recall"),
        keras.metrics.AUC(num_thresholds=3, name="auc"),
        keras.metrics.F1Score(threshold=1e-30, name="f1"),
        keras.metrics.IoU(num_classes=2, target_class_ids=[1], name="iou"),
        _example_count_metric(),
    ]


def _metric_counts(model) -> dict:
    metrics = {metric.name: metric for metric in model.compiled_metrics_objects}

    def total(metric, *names):
        return float(
            sum(
                np.sum(variable.numpy()[..., 0] if "auc" == metric else variable.numpy())
                for variable in metrics[metric].variables
                if variable.name in names
            )
        )

    return {
        "precision": total("precision", "true_positives", "false_positives"),
        "recall": total("recall", "true_positives", "false_negatives"),
        "auc": total(
            "auc", "true_positives", "false_positives", "true_negatives", "false_negatives"
        ),
        "f1": total("f1", "true_positives", "false_negatives"),
        "iou": total("iou", "total_confusion_matrix"),
        "example_count": total("example_count", "count"),
    }


def _model(count_metrics: bool = False):
    import keras  # pylint: disable=g-import-not-at-top

    model = keras.Sequential(
        [
            keras.Input((NUM_FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid" if count_metrics else None),
        ]
    )
    metrics = _counting_metrics() if count_metrics else ["mae"]
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=metrics)
    # A plain list is not tracked as more model metrics (they stay compiled metrics only).
    object.__setattr__(model, "compiled_metrics_objects", metrics)
    return model


def _hold_callback(out: pathlib.Path, hold: bool):
    import keras  # pylint: disable=g-import-not-at-top

    class Hold(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.fired = False

        def on_train_batch_end(self, batch, logs=None):
            if self.fired:
                return
            self.fired = True
            (out / "underway").write_text(str(batch + 1))
            if not hold:
                return
            deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
            while not (out / "release").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("no release file within the hold timeout")
                time.sleep(0.05)

    return Hold()


def _count_recorder():
    import keras  # pylint: disable=g-import-not-at-top

    class CountRecorder(keras.callbacks.Callback):
        """Examples the loss metric has counted this epoch, at each sync point."""

        def __init__(self):
            super().__init__()
            self.counts = []

        def on_train_batch_end(self, batch, logs=None):
            tracker = next(metric for metric in self.model.metrics if metric.name == "loss")
            self.counts.append(float(tracker.variables[1].numpy()))

    return CountRecorder()


def _metric_count_recorder():
    import keras  # pylint: disable=g-import-not-at-top

    class MetricCountRecorder(keras.callbacks.Callback):
        """`_metric_counts` at each sync point of training."""

        def __init__(self):
            super().__init__()
            self.counts = []

        def on_train_batch_end(self, batch, logs=None):
            self.counts.append(_metric_counts(self.model))

    return MetricCountRecorder()


def _chief(args, cluster, out: pathlib.Path) -> int:
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist import (
        callbacks,  # pylint: disable=g-import-not-at-top
        parameter_server,  # pylint: disable=g-import-not-at-top
    )

    strategy = parameter_server.make_parameter_server_strategy(
        cluster, min_shard_bytes=args.min_shard_bytes, max_shards=args.max_shards
    )
    with strategy.scope():
        model = _model(args.count_metrics)
    trainer = parameter_server.ParameterServerTrainer(model)
    counter = _count_recorder()
    metric_counter = _metric_count_recorder()
    exporter = callbacks.CheckpointExporter(str(out / "checkpoints"))
    mark_dir = ""
    if args.mark_batches:
        mark_dir = str(out / "batches")
        os.makedirs(mark_dir, exist_ok=True)
    try:
        history = trainer.fit(
            _dataset(mark_dir, ones=args.count_metrics),
            epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            steps_per_sync=args.steps_per_sync or None,
            verbose=2,
            validation_data=_dataset(ones=args.count_metrics),
            validation_steps=3,
            callbacks=[
                _hold_callback(out, args.hold_after_first_sync),
                exporter,
                counter,
                *([metric_counter] if args.count_metrics else []),
            ],
        )
    except parameter_server.ParameterServerLostError as error:
        sys.stderr.write(f"error: {error}\n")
        return 3
    exporter.finish()
    summary = {
        "steps_completed": trainer.steps_completed,
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": [float(value) for value in history.history["loss"]],
        "val_loss": [float(value) for value in history.history["val_loss"]],
        "examples_counted_at_last_sync": counter.counts[-1],
        "num_partitioned_variables": sum(
            1 for variable in model.variables if type(variable.value).__name__ == "ShardedVariable"
        ),
    }
    if args.count_metrics:
        summary["metric_counts"] = metric_counter.counts[-1]
    (out / "summary.json").write_text(json.dumps(summary))
    keras.backend.clear_session()
    return 0


def _evaluator(out: pathlib.Path, cluster) -> int:
    from tfdist import parameter_server  # pylint: disable=g-import-not-at-top
    from tfdist.outputs import evaluation  # pylint: disable=g-import-not-at-top

    model = _model()
    model.build((None, NUM_FEATURES))
    alive = None
    if cluster.count("chief"):  # Vertex and tfdist.launch tell the evaluator where it is.
        watch = parameter_server.ChiefWatch(
            parameter_server.chief_address(cluster), gone_seconds=3.0
        )
        alive = lambda: not watch.gone()  # noqa: E731
    evaluator = evaluation.SidecarEvaluator(
        model,
        _dataset(),
        checkpoint_dir=str(out / "checkpoints"),
        output_dir=str(out / "eval"),
        poll_seconds=0.2,
        is_training_alive=alive,
        give_up_seconds=5.0,
    )
    evaluator.run()
    return 0


def main() -> int:
    args = _parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = resolve_cluster(os.environ)
    if cluster.task_type in ("worker", "ps"):
        from tfdist import parameter_server  # pylint: disable=g-import-not-at-top

        parameter_server.serve(
            cluster,
            parameter_server.ServeOptions(
                chief_gone_seconds=3.0, poll_seconds=0.2, chief_start_timeout=120.0
            ),
        )
        return 0
    if cluster.task_type == "evaluator":
        return _evaluator(out, cluster)
    return _chief(args, cluster, out)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A TensorFlow gRPC server cannot be shut down; skip interpreter teardown.
    os._exit(code)
