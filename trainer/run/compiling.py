"""Compile decisions: the strategy's limits, XLA, the optimizer and steps per execution.

`check_settings_for_strategy` refuses settings the strategy cannot honour
before any peer is contacted; `resolve_jit_compile` says whether XLA compiles
the step and why; `build_model` compiles the task's model and runs it once
on the first batch; `tune_steps_per_execution` measures `auto` once the
restore point is known.
"""

import keras
import tensorflow as tf
from absl import logging

from tfdist import keras_compat
from tfdist import tasks as tasks_lib
from tfdist.distribute import execution_tuner
from tfdist.errors import UsageError
from tfdist.tasks import first_batch_check, weighting
from trainer.config import AUTO, ExperimentConfig
from trainer.optimization import build_optimizer
from trainer.run.inputs import Inputs
from trainer.run.restarts import Plan
from trainer.tasks import LoadedTask


def check_settings_for_strategy(config: ExperimentConfig, strategy_name: str) -> None:
    """Refuses settings the chosen strategy cannot honour; call before any peer is contacted.

    Raises:
        UsageError: `--deterministic` or `--jit_compile=true` under parameter servers.
    """
    if strategy_name != "parameter_server":
        return
    if config.deterministic:
        raise UsageError(
            "--deterministic was given with parameter-server training, whose workers update "
            "the variables asynchronously in an order no flag can fix; drop --deterministic "
            "(or use a synchronous strategy for reproducible runs)"
        )
    if config.jit_compile == "true":
        raise UsageError(
            "--jit_compile=true was given with parameter-server training, whose "
            "coordinator schedules uncompiled steps; use --jit_compile=auto or "
            "false"
        )


def resolve_jit_compile(config: ExperimentConfig, strategy_name: str) -> tuple[bool, str]:
    """Whether to compile the training step with XLA, and why.

    Measured here (docs/benchmarks.md): on CPU, XLA made the cnn 2-3x slower
    and the mlp no faster under a strategy, so `auto` never picks it on CPU.
    """
    if strategy_name == "parameter_server":
        return False, "parameter-server steps are not compiled with XLA"
    if config.jit_compile != "auto":
        return config.jit_compile == "true", f"--jit_compile={config.jit_compile}"
    if strategy_name == "tpu":
        return True, "TPUs always run XLA"
    if tf.config.list_physical_devices("GPU"):
        return True, "GPUs run the fused XLA step faster"
    return False, "on CPUs XLA was measured slower (cnn 0.3-0.4x) or no faster (mlp)"


def build_model(
    loaded: LoadedTask,
    config: ExperimentConfig,
    inputs: Inputs,
    *,
    for_training: bool = True,
    jit_compile: bool = False,
) -> keras.Model:
    """The task's model, built and compiled; call inside the strategy's scope.

    The model and its loss run once on the first training examples
    (`tfdist.tasks.first_batch_check`): a subclassed model gets every variable before
    a backup is restored into it, and mistakes in the task become one line.

    Args:
        loaded: The task.
        config: The experiment (optimizer, schedule, steps per execution).
        inputs: Sizes the learning-rate schedule and gives the sample.
        for_training: False compiles for evaluation only (no optimizer).
    """
    model = loaded.task.build_model()
    tasks_lib.check_model(model, loaded.spec)
    steps_per_epoch = inputs.steps_per_epoch if for_training else None
    compile_args = {
        "loss": loaded.task.loss(),
        "metrics": loaded.task.metrics(),
        "weighted_metrics": weighting.weighted_metrics_of(loaded.task),
    }
    if steps_per_epoch is None:
        model.compile(**compile_args)
    else:
        model.compile(
            optimizer=build_optimizer(config, steps_per_epoch=steps_per_epoch),
            steps_per_execution=explicit_steps_per_execution(config),
            jit_compile=jit_compile,
            **compile_args,
        )
        if config.all_reduce_dtype != "float32":
            keras_compat.set_gradient_all_reduce_dtype(model.optimizer, config.all_reduce_dtype)
    head = inputs.train.first_examples(first_batch_check.CHECK_BATCH)
    first_batch_check.check(
        model,
        first_batch_check.first_batch(
            head, inputs.batching, spec=loaded.spec, global_batch_size=inputs.global_batch_size
        ),
        loss=compile_args["loss"],
        spec=loaded.spec,
        element_spec=head.element_spec,
        global_batch_size=inputs.global_batch_size,
    )
    return model


def build_training_model(
    loaded: LoadedTask,
    config: ExperimentConfig,
    inputs: Inputs,
    *,
    strategy: tf.distribute.Strategy,
    strategy_name: str,
) -> keras.Model:
    """The model to train: XLA chosen for the strategy (and logged), built in its scope."""
    jit_compile, why = resolve_jit_compile(config, strategy_name)
    logging.info("XLA %s: %s.", "on" if jit_compile else "off", why)
    with strategy.scope():
        return build_model(loaded, config, inputs, jit_compile=jit_compile)


def explicit_steps_per_execution(config: ExperimentConfig) -> int:
    """The number to compile with: the configured one, or 1 until `tune` chooses."""
    return 1 if config.steps_per_execution == AUTO else config.steps_per_execution


def tune_steps_per_execution(
    config: ExperimentConfig,
    model: keras.Model,
    inputs: Inputs,
    todo: "Plan",
    *,
    num_workers: int = 1,
) -> int:
    """Sets `model.steps_per_execution` when it is `auto` (see `tfdist.distribute.execution_tuner`).

    Under parameter servers `auto` is computed, not probed: closures as large as
    keep `num_workers` workers evenly loaded
    (`execution_tuner.parameter_server_steps_per_execution`).
    """
    parameter_server = isinstance(
        model.distribute_strategy, tf.distribute.experimental.ParameterServerStrategy
    )
    if config.steps_per_execution != AUTO or todo.completed or not todo.segments:
        return int(model.steps_per_execution)
    first_step = todo.segments[0].first_step
    if parameter_server:
        granularity = execution_tuner.step_granularity(
            steps_per_epoch=inputs.steps_per_epoch,
            backup_every_steps=config.backup_every_steps,
            first_step=first_step,
        )
        chosen, reason = execution_tuner.parameter_server_steps_per_execution(
            granularity, num_workers
        )
        logging.info("%s.", reason)
        model.steps_per_execution = chosen
        return chosen
    return execution_tuner.tune_steps_per_execution(
        model,
        inputs.train_stream(first_step, model.distribute_strategy),
        steps_per_epoch=inputs.steps_per_epoch,
        backup_every_steps=config.backup_every_steps,
        first_step=first_step,
        other_step_counts=(config.validation_steps,) if config.validation_steps else (),
        run_steps=config.epochs * inputs.steps_per_epoch - first_step,
    ).steps_per_execution
