"""The pieces of one run, written once and used by every strategy and role.

In order: `OutputDirs` (where things go), `Inputs` (the task's examples as
tfdist's deterministic streams), `build_model` (the task's model compiled with
the experiment's optimizer), `make_backup` and `plan` (where training resumes),
`training_callbacks`, then `Outcome` (what ran) into `build_summary` and
`write_outputs`.
"""

import dataclasses
import json
import math
import os
from typing import Mapping

from absl import logging
import keras
import tensorflow as tf

from tfdist.data import batching as batching_lib
from tfdist import data as data_lib
from tfdist.data import counts as data_counts
from tfdist.tasks import first_batch_check
from tfdist.tasks import weighting
from tfdist.outputs import export as export_lib
from tfdist.outputs import hypertune
from tfdist.distribute import execution_tuner
from tfdist import keras_compat
from tfdist import tasks as tasks_lib
from tfdist.callbacks import BackupAndRestore, EpochTensorBoard, NonFiniteGuard
from tfdist.backups import ResumePoint
from tfdist.backups.state import FitSegment
from tfdist.distribute.cluster import Cluster, has_evaluator
from tfdist.errors import UsageError
from tfdist.outputs.evaluation import CheckpointExporter
from tfdist._internal.files import write_json_atomically
from tfdist.preemption import PreemptionOptions
from trainer.config import AUTO, ExperimentConfig, check_steps_per_execution
from trainer.optimization import build_optimizer
from trainer.run.throughput import ThroughputMeter
from trainer.tasks import LoadedTask

MODEL_FILE = "model.keras"
SUMMARY_FILE = "summary.json"
CHECKPOINTS_SUBDIR = "checkpoints"
EVAL_SUBDIR = "eval"
# Evaluation checkpoints kept; the evaluator reads the newest.
EVALUATION_CHECKPOINTS_KEPT = 3


@dataclasses.dataclass(frozen=True)
class OutputDirs:
    """Model, backup and TensorBoard directories; Vertex's `AIP_*` are defaults."""

    model_dir: str
    backup_dir: str
    tensorboard_dir: str

    @classmethod
    def from_config(cls, config: ExperimentConfig, environ: Mapping[str, str]) -> "OutputDirs":
        """The directories; inside a tuning trial, `--model_dir`/`--backup_dir` get `/<trial>`.

        (Vertex's own `AIP_*` directories are already per trial.)
        """
        model_dir = (hypertune.trial_output_dir(config.model_dir, environ)
                     or environ.get("AIP_MODEL_DIR", ""))
        backup_dir = (hypertune.trial_output_dir(config.backup_dir, environ)
                      or environ.get("AIP_CHECKPOINT_DIR", ""))
        tensorboard_dir = (config.tensorboard_dir or environ.get("AIP_TENSORBOARD_LOG_DIR", "")
                           or (os.path.join(model_dir, "logs") if model_dir else ""))
        return cls(model_dir=model_dir, backup_dir=backup_dir, tensorboard_dir=tensorboard_dir)

    @property
    def checkpoints_dir(self) -> str:
        """Where the chief exports checkpoints for an evaluator task."""
        return os.path.join(self.model_dir, CHECKPOINTS_SUBDIR) if self.model_dir else ""

    @property
    def eval_dir(self) -> str:
        return os.path.join(self.model_dir, EVAL_SUBDIR) if self.model_dir else ""


def seed_everything(config: ExperimentConfig) -> None:
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()


@dataclasses.dataclass(frozen=True)
class Inputs:
    """A task's examples or sources, and the streams tfdist makes of them.

    Attributes:
        train: The training split (`tfdist.data.TaskInput`).
        evaluation: The evaluation split, or None.
        num_train_examples: Examples in one training pass; None when not
            counted (`--steps_per_epoch` given and the size unknown without a pass).
        steps_per_epoch: Optimizer updates per epoch.
        global_batch_size: Examples per step across all replicas.
        seed: Fixes the order of every pass.
        batching: The task's declared padding or bucketing (`tfdist.data.batching`), or None.
    """

    train: data_lib.TaskInput
    evaluation: data_lib.TaskInput | None
    num_train_examples: int | None
    steps_per_epoch: int
    global_batch_size: int
    seed: int
    batching: object = None

    @property
    def eval_examples(self):
        return None if self.evaluation is None else self.evaluation.value

    @property
    def train_examples(self):
        return self.train.value

    def train_stream(self, first_step: int = 0,
                     strategy: tf.distribute.Strategy | None = None):
        """Global batches from step `first_step` on, the same in every process.

        A source under a strategy with several replicas comes back distributed:
        each worker builds only its replicas' part of every global batch.
        """
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            return batching_lib.training_batches(
                self.train.value, self.batching, global_batch_size=self.global_batch_size,
                seed=self.seed, num_examples=self.num_train_examples, first_step=first_step)
        return self.train.training_stream(
            strategy, global_batch_size=self.global_batch_size, seed=self.seed,
            first_step=first_step, num_examples=self.num_train_examples)

    def eval_stream(self) -> tf.data.Dataset | None:
        if self.evaluation is None:
            return None
        if self.batching is not None:  # variable lengths: tfdist.data.batching
            return batching_lib.evaluation_batches(self.evaluation.examples(), self.batching,
                                                   global_batch_size=self.global_batch_size)
        return self.evaluation.evaluation_stream(self.global_batch_size)


def build_inputs(loaded: LoadedTask, config: ExperimentConfig, num_workers: int = 1, *,
                 count_dir: str = "", is_chief: bool = True) -> Inputs:
    """Calls the task's `build_inputs` for both splits and sizes the epoch.

    The training data is counted only when `--steps_per_epoch` is not given and
    its size is unknown without a pass (a source's length is read; a file
    source's records are counted without decoding), and only once: the count
    is kept in `count_dir` (the backup directory) for restarts.

    Raises:
        UsageError: The task broke the contract, the data is smaller than one
            global batch, or `--steps_per_execution` does not divide the epoch.
    """
    train = data_lib.TaskInput(loaded.task.build_inputs(True))
    _check_split(train, loaded, training=True)
    evaluation_value = loaded.task.build_inputs(False)
    evaluation = None if evaluation_value is None else data_lib.TaskInput(evaluation_value)
    tasks_lib.check_examples(evaluation_value, loaded.spec, training=False)
    if evaluation is not None:
        _check_split(evaluation, loaded, training=False)
    # Declared padding/bucketing, class weights, already-batched data.
    batching = batching_lib.declared_batching(loaded.task, loaded.spec)
    if batching is not None and train.is_source:
        raise UsageError(
            f"--task {loaded.spec!r} declares batching() and returns a "
            f"{type(train.value).__name__}; declared padding applies to a tf.data.Dataset of "
            f"examples: return one, or pad in the source's preprocess to fixed shapes")
    if not train.is_source:
        batching_lib.check_declared(train.value, batching, loaded.spec)
    train = weighting.with_class_weight(
        train, weighting.class_weight_of(loaded.task, loaded.spec), loaded.spec)
    if batching is None:
        train = train.sharded_by_file(num_workers)
    if config.steps_per_epoch:
        num_examples = train.known_size()
        if not train.is_source and num_examples is not None:
            first_batch_check.refuse_batched_if_too_few(train.value, num_examples,
                                                        config.global_batch_size, loaded.spec)
        train.check_size(config.global_batch_size)
        steps_per_epoch = config.steps_per_epoch
    else:
        num_examples = data_counts.count_once(train, identity=loaded.identity,
                                              directory=count_dir, is_chief=is_chief)
        if not train.is_source:
            first_batch_check.refuse_batched_if_too_few(train.value, num_examples,
                                                        config.global_batch_size, loaded.spec)
        steps_per_epoch = data_lib.batches_per_pass(num_examples, config.global_batch_size)
    if config.steps_per_execution != AUTO:
        check_steps_per_execution(config.steps_per_execution, steps_per_epoch)
    logging.info("Input: %s.", train.describe(num_workers))
    return Inputs(train=train, evaluation=evaluation, num_train_examples=num_examples,
                  steps_per_epoch=steps_per_epoch, global_batch_size=config.global_batch_size,
                  seed=config.seed, batching=batching)


def _check_split(split: data_lib.TaskInput, loaded: LoadedTask, *, training: bool) -> None:
    tasks_lib.check_examples(split.value, loaded.spec, training=training,
                             element_spec=split.element_spec() if split.is_source else None)


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
            "(or use a synchronous strategy for reproducible runs)")
    if config.jit_compile == "true":
        raise UsageError("--jit_compile=true was given with parameter-server training, whose "
                         "coordinator schedules uncompiled steps; use --jit_compile=auto or "
                         "false")


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


def build_model(loaded: LoadedTask, config: ExperimentConfig, inputs: Inputs, *,
                for_training: bool = True, jit_compile: bool = False) -> keras.Model:
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
    compile_args = {"loss": loaded.task.loss(), "metrics": loaded.task.metrics(),
                    "weighted_metrics": weighting.weighted_metrics_of(loaded.task)}
    if steps_per_epoch is None:
        model.compile(**compile_args)
    else:
        model.compile(optimizer=build_optimizer(config, steps_per_epoch=steps_per_epoch),
                      steps_per_execution=explicit_steps_per_execution(config),
                      jit_compile=jit_compile, **compile_args)
        if config.all_reduce_dtype != "float32":
            keras_compat.set_gradient_all_reduce_dtype(model.optimizer, config.all_reduce_dtype)
    head = inputs.train.first_examples(first_batch_check.CHECK_BATCH)
    first_batch_check.check(
        model, first_batch_check.first_batch(head, inputs.batching, spec=loaded.spec,
                                             global_batch_size=inputs.global_batch_size),
        loss=compile_args["loss"], spec=loaded.spec, element_spec=head.element_spec,
        global_batch_size=inputs.global_batch_size)
    return model


def explicit_steps_per_execution(config: ExperimentConfig) -> int:
    """The number to compile with: the configured one, or 1 until `tune` chooses."""
    return 1 if config.steps_per_execution == AUTO else config.steps_per_execution


def tune_steps_per_execution(config: ExperimentConfig, model: keras.Model, inputs: Inputs,
                             todo: "Plan") -> int:
    """Sets `model.steps_per_execution` when it is `auto` (see `tfdist.distribute.execution_tuner`).

    Parameter-server training schedules single steps (auto means 1 there).
    """
    parameter_server = isinstance(model.distribute_strategy,
                                  tf.distribute.experimental.ParameterServerStrategy)
    if (config.steps_per_execution != AUTO or todo.completed or not todo.segments
            or parameter_server):
        return int(model.steps_per_execution)
    first_step = todo.segments[0].first_step
    return execution_tuner.tune_steps_per_execution(
        model, inputs.train_stream(first_step, model.distribute_strategy), steps_per_epoch=inputs.steps_per_epoch,
        backup_every_steps=config.backup_every_steps, first_step=first_step,
        other_step_counts=(config.validation_steps,) if config.validation_steps else (),
        run_steps=config.epochs * inputs.steps_per_epoch - first_step,
    ).steps_per_execution


# What decides the steps a run computes, recorded in every backup. The model's
# variables, the optimizer's class and variables and the dtype policy are
# recorded by the backup itself.
_SCHEDULE_FIELDS = ("learning_rate", "momentum", "weight_decay", "lr_scaling",
                    "reference_batch_size", "warmup_epochs", "warmup_steps", "lr_decay",
                    "decay_power", "decay_boundaries", "decay_rate",
                    "exclude_from_weight_decay", "exclude_from_layer_adaptation")
_SAME_GLOBAL_BATCH = ("every step still averages the same global batch of the same examples, "
                      "so it computes the same update")


def run_settings(config: ExperimentConfig, loaded: LoadedTask, inputs: Inputs,
                 cluster: Cluster, strategy_name: str) -> dict:
    """The run's fingerprint beyond its variables, as `BackupAndRestore(run_settings=)` takes it."""
    settings = {
        "task": loaded.identity,
        "num_train_examples": inputs.num_train_examples,
        "input": inputs.train.kind,
        "global_batch_size": config.global_batch_size,
        "seed": config.seed,
        "steps_per_epoch": inputs.steps_per_epoch,
        "steps_per_execution": config.steps_per_execution,
        "epochs": config.epochs,
        "strategy": strategy_name,
        "num_workers": cluster.num_workers,
        "all_reduce_dtype": config.all_reduce_dtype,
    }
    for name in _SCHEDULE_FIELDS:
        value = getattr(config, name)
        settings[name] = list(value) if isinstance(value, tuple) else value
    return settings


def changeable_settings(config: ExperimentConfig, inputs: Inputs | None = None) -> dict:
    """Settings a restart may change, each with why the change is safe (it is logged).

    Files sharded per worker are read in an order that depends on the number
    of workers: a restart with another number cannot resume exactly.
    """
    changeable = {
        "steps_per_execution": "an execution only groups steps; each step is the same",
    }
    if inputs is None or not inputs.train.order_depends_on_workers():
        changeable["num_workers"] = _SAME_GLOBAL_BATCH
        changeable["strategy"] = _SAME_GLOBAL_BATCH
    if config.lr_decay == "constant":
        changeable["epochs"] = ("the learning rate does not decay, so no step depends on the "
                                "total number of steps")
    return changeable


def make_backup(config: ExperimentConfig, dirs: OutputDirs, strategy: tf.distribute.Strategy,
                cluster: Cluster, settings: dict,
                inputs: Inputs | None = None) -> BackupAndRestore | None:
    if not dirs.backup_dir:
        logging.warning("No --backup_dir (and no AIP_CHECKPOINT_DIR): training cannot resume "
                        "after a failure or preemption.")
        return None
    return BackupAndRestore(dirs.backup_dir, save_freq=config.backup_every_steps or "epoch",
                            delete_checkpoint=not config.keep_backup,
                            complete_on_train_end=False, strategy=strategy, cluster=cluster,
                            preemption=PreemptionOptions(
                                grace_period_seconds=config.preemption_grace_seconds),
                            run_settings=settings, changeable=changeable_settings(config, inputs))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is left to run.

    Attributes:
        segments: The `fit` calls that finish training exactly once.
        resumed_from_step: Steps already applied before this run (0 when fresh).
        completed: An earlier run finished the job, outputs included.
    """

    segments: tuple[FitSegment, ...]
    resumed_from_step: int = 0
    completed: bool = False


def plan(backup: BackupAndRestore | None, model: keras.Model, *, epochs: int,
         steps_per_epoch: int) -> Plan:
    """Restores the newest good backup into `model` and plans the rest of training."""
    if backup is None:
        return Plan(ResumePoint().segments(epochs=epochs, steps_per_epoch=steps_per_epoch))
    segments = backup.resume(model, epochs=epochs, steps_per_epoch=steps_per_epoch)
    return Plan(tuple(segments), backup.resumed_from_step, backup.completed)


def evaluation_exporter(config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs,
                        environ: Mapping[str, str]) -> CheckpointExporter | None:
    """The chief's exporter when an evaluator exists or one was asked for; else None."""
    if not dirs.model_dir or not (config.evaluation_checkpoints
                                  or has_evaluator(cluster, environ)):
        return None
    return CheckpointExporter(dirs.checkpoints_dir, max_to_keep=EVALUATION_CHECKPOINTS_KEPT)


def training_callbacks(*, config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs,
                       backup: BackupAndRestore | None,
                       exporter: CheckpointExporter | None,
                       steps_per_execution: int = 1) -> list:
    """The meter, the chief's TensorBoard and exporter, and the backup (last)."""
    callbacks = [ThroughputMeter(global_batch_size=config.global_batch_size,
                                 steps_per_execution=steps_per_execution)]
    if backup is None:
        callbacks.append(NonFiniteGuard())  # the backup checks the same itself
    if config.hparam_metric:
        callbacks.append(hypertune.HypertuneCallback(config.hparam_metric,
                                                     is_chief=cluster.is_chief))
    if cluster.is_chief:
        if dirs.tensorboard_dir:
            callbacks.append(EpochTensorBoard(dirs.tensorboard_dir))
        if exporter is not None:
            callbacks.append(exporter)
    if backup is not None:
        callbacks.append(backup)  # last: it may end the process after a preemption notice
    return callbacks


def epoch_logs(history, run: "Prepared") -> dict:
    """The last epoch's logs: of `history`, else (nothing ran) the backup's record of them."""
    if history is not None and history.history:
        return {name: float(values[-1]) for name, values in history.history.items()}
    return run.backup.epoch_logs if run.backup is not None else {}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one run did, as every strategy reports it."""

    strategy: str
    num_replicas: int
    num_workers: int
    steps_per_epoch: int
    steps_completed: int
    train_logs: Mapping[str, float]
    evaluation: Mapping[str, float]
    examples_per_second: float
    wall_seconds: float
    resumed_from_step: int
    num_ps: int = 0


def build_summary(config: ExperimentConfig, outcome: Outcome) -> dict:
    """`summary.json`: strict JSON (a non-finite number becomes null)."""
    final_loss = outcome.train_logs.get("loss", outcome.evaluation.get("loss"))
    summary = {
        "strategy": outcome.strategy,
        "num_replicas": outcome.num_replicas,
        "num_workers": outcome.num_workers,
        "global_batch_size": config.global_batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": outcome.steps_per_epoch,
        "steps_completed": outcome.steps_completed,
        "final_loss": final_loss,
        "metrics": {"train": dict(outcome.train_logs), "test": dict(outcome.evaluation)},
        "examples_per_second": outcome.examples_per_second,
        "wall_seconds": outcome.wall_seconds,
        "resumed_from_step": outcome.resumed_from_step,
    }
    if outcome.strategy == "parameter_server":
        summary["num_ps"] = outcome.num_ps
    return _finite_or_null(summary)


def _finite_or_null(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    return value


def write_outputs(model: keras.Model, summary: dict, dirs: OutputDirs,
                  export_format: str) -> None:
    """Writes the model (`model.keras`, a SavedModel or both), then `summary.json` last.

    Each replaces the old one atomically; `summary.json` appearing means the
    model files beside it are complete.
    """
    if not dirs.model_dir:
        logging.warning("No --model_dir (and no AIP_MODEL_DIR): the model and summary are "
                        "not saved.")
        return
    tf.io.gfile.makedirs(dirs.model_dir)
    written = []
    if export_lib.wants_keras(export_format):
        model_path = os.path.join(dirs.model_dir, MODEL_FILE)
        # Keras needs the .keras suffix; the rename keeps a previous model intact
        # until the new one is complete.
        temporary = os.path.join(dirs.model_dir, f".model.tmp-{os.getpid()}.keras")
        model.save(temporary)
        tf.io.gfile.rename(temporary, model_path, overwrite=True)
        written.append(model_path)
    if export_lib.wants_saved_model(export_format):
        written.append(export_lib.export_saved_model(model, dirs.model_dir))
    summary_path = os.path.join(dirs.model_dir, SUMMARY_FILE)
    write_json_atomically(summary_path, summary)
    logging.info("Wrote %s.", ", ".join([*written, summary_path]))


def read_summary(dirs: OutputDirs) -> dict | None:
    """The summary a finished run wrote, or None."""
    path = os.path.join(dirs.model_dir, SUMMARY_FILE) if dirs.model_dir else ""
    if not path or not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)


def already_completed(backup: BackupAndRestore, dirs: OutputDirs, strategy_name: str,
                      num_replicas: int) -> dict:
    """The summary of a job that had finished before this restart; trains nothing."""
    logging.warning("%s records that this job completed at step %d; not training again. "
                    "Use a new --backup_dir to train anew.", backup.backup_dir,
                    backup.resumed_from_step)
    return read_summary(dirs) or {
        "strategy": strategy_name, "num_replicas": num_replicas,
        "steps_completed": backup.resumed_from_step, "final_loss": None,
        "examples_per_second": 0.0, "resumed_from_step": backup.resumed_from_step}


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A run ready to train: its inputs, its model (restored), its backup and plan."""

    inputs: Inputs
    model: keras.Model
    backup: BackupAndRestore | None
    todo: Plan
    exporter: CheckpointExporter | None
    callbacks: tuple


def prepare(config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs, loaded: LoadedTask,
            strategy: tf.distribute.Strategy, strategy_name: str,
            environ: Mapping[str, str]) -> Prepared:
    """Inputs, model, restore and callbacks: everything before the first step."""
    seed_everything(config)
    # Parameter-server workers cannot tell themselves apart: each reads all of the input.
    pipelines = 1 if strategy_name == "parameter_server" else cluster.num_workers
    inputs = build_inputs(loaded, config, num_workers=pipelines, count_dir=dirs.backup_dir,
                          is_chief=cluster.is_chief)
    jit_compile, why = resolve_jit_compile(config, strategy_name)
    logging.info("XLA %s: %s.", "on" if jit_compile else "off", why)
    with strategy.scope():
        model = build_model(loaded, config, inputs, jit_compile=jit_compile)
    backup = make_backup(config, dirs, strategy, cluster,
                         run_settings(config, loaded, inputs, cluster, strategy_name), inputs)
    todo = plan(backup, model, epochs=config.epochs, steps_per_epoch=inputs.steps_per_epoch)
    steps_per_execution = tune_steps_per_execution(config, model, inputs, todo)
    exporter = evaluation_exporter(config, cluster, dirs, environ) if cluster.is_chief else None
    callbacks = training_callbacks(config=config, cluster=cluster, dirs=dirs, backup=backup,
                                   exporter=exporter, steps_per_execution=steps_per_execution)
    return Prepared(inputs, model, backup, todo, exporter, tuple(callbacks))


def conclude(config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs, run: Prepared,
             outcome: "Outcome", environ: Mapping[str, str]) -> dict:
    """Final exports, `summary.json` and `model.keras` (chief), then completion."""
    finish_exports(run.exporter, run.model)
    summary = build_summary(config, outcome)
    if cluster.is_chief:
        write_outputs(run.model, summary, dirs,
                      config.export or export_lib.default_export_format(environ))
    if run.backup is not None:
        run.backup.complete()  # only once the outputs exist: a restart before this re-writes them
    return summary


def finish_exports(exporter: CheckpointExporter | None, model: keras.Model) -> None:
    """Exports the final checkpoint and marks training done for the evaluator.

    Works also when no `fit` ran in this process (a restart after the last step).
    """
    if exporter is None:
        return
    if exporter.model is None:
        exporter.set_model(model)
        exporter.on_train_begin()
    exporter.finish()


def validation_kwargs(config: ExperimentConfig, inputs: Inputs) -> dict:
    """`fit`'s validation arguments: `--validation_steps` batches of the evaluation split."""
    stream = inputs.eval_stream()
    if not config.validation_steps or stream is None:
        return {}
    return {"validation_data": stream, "validation_steps": config.validation_steps}
