"""Training under the synchronous strategies: default, one_device, mirrored, multiworker, tpu.

Every worker runs this; `fit` keeps them in step, and only the chief writes.
"""

import time

import tensorflow as tf

from tfdist import strategy as strategy_lib
from tfdist.cluster import Cluster
from trainer.config import ExperimentConfig
from trainer.run import pipeline
from trainer.run.throughput import ThroughputMeter
from trainer.tasks import LoadedTask


def train(config: ExperimentConfig, cluster: Cluster, dirs: pipeline.OutputDirs,
          loaded: LoadedTask, *, strategy: tf.distribute.Strategy, strategy_name: str) -> dict:
    """Trains the task to the end (or from its backup) and returns the summary."""
    pipeline.seed_everything(config)
    inputs = pipeline.build_inputs(loaded, config)
    with strategy.scope():
        model = pipeline.build_model(loaded, config, steps_per_epoch=inputs.steps_per_epoch)
    backup = pipeline.make_backup(config, dirs, strategy, cluster)
    todo = pipeline.plan(backup, model, epochs=config.epochs,
                         steps_per_epoch=inputs.steps_per_epoch)
    num_replicas = int(strategy.num_replicas_in_sync)
    if todo.completed:
        return pipeline.already_completed(backup, dirs, strategy_name, num_replicas)

    exporter = (pipeline.evaluation_exporter(config, cluster, dirs)
                if cluster.is_chief else None)
    callbacks = pipeline.training_callbacks(config=config, cluster=cluster, dirs=dirs,
                                            backup=backup, exporter=exporter)
    meter = next(c for c in callbacks if isinstance(c, ThroughputMeter))
    validation = pipeline.validation_kwargs(config, inputs)
    started = time.perf_counter()
    train_logs = {}
    for segment in todo.segments:
        history = model.fit(inputs.train_stream(segment.first_step), callbacks=callbacks,
                            verbose=2 if cluster.is_chief else 0, shuffle=False,
                            **segment.fit_kwargs(),
                            **validation)
        train_logs = pipeline.epoch_logs(history)
    wall_seconds = time.perf_counter() - started
    eval_stream = inputs.eval_stream()
    evaluation = ({name: float(value) for name, value in
                   model.evaluate(eval_stream, verbose=0, return_dict=True).items()}
                  if eval_stream is not None else {})
    pipeline.finish_exports(exporter, model)

    summary = pipeline.build_summary(config, pipeline.Outcome(
        strategy=strategy_name, num_replicas=num_replicas, num_workers=cluster.num_workers,
        steps_per_epoch=inputs.steps_per_epoch,
        steps_completed=int(model.optimizer.iterations.numpy()), train_logs=train_logs,
        evaluation=evaluation, examples_per_second=meter.examples_per_second,
        wall_seconds=wall_seconds, resumed_from_step=todo.resumed_from_step))
    if cluster.is_chief:
        pipeline.write_outputs(model, summary, dirs)
    if backup is not None:
        backup.complete()  # only once the outputs exist: a restart before this re-writes them
    return summary
