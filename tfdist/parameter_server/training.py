"""A `fit`-like training loop for Keras 3 models under `ParameterServerStrategy`.

Keras 3 `fit` does not run under `ParameterServerStrategy` (keras#18624). This
loop runs on the chief (the coordinator) and drives the workers through
`tf.distribute.coordinator.ClusterCoordinator`:

- each worker runs its own copy of the input pipeline
  (`create_per_worker_dataset`), repeated so that it never runs out;
- steps are scheduled asynchronously: any idle worker takes the next one, and
  a step lost with a failed worker is scheduled again;
- every step is the model's own `train_step` (so the compiled loss, metrics
  and optimizer are used as given, and an overridden `train_step` too);
- the loop waits for all scheduled steps (`join`) every `steps_per_sync`
  steps and at each epoch end. Those sync points are where batch-level
  callbacks run, metrics are read, and backups are consistent.

Exact accounting: increments of `optimizer.iterations` are atomic on the ps
and each metric's updates run one at a time under a lock on its ps
(`tfdist.keras_compat.make_parameter_server_updates_exact`), and after every sync point
`iterations` is checked against the steps the coordinator saw complete.
Updates are asynchronous: a worker computes its gradients from weights that
other workers may update before its own update lands (staleness of up to
about one step per other worker).
"""

import contextlib
import dataclasses
import logging
import re
import time

import keras
import numpy as np
import tensorflow as tf

from tfdist import keras_compat
from tfdist._internal.peers import (
    PEER_FAILURES,  # what a call on the coordinator raises when a ps is gone
)
from tfdist._internal.preconditions import check_whole_number, require
from tfdist.errors import UsageError

__all__ = [
    "PS_FAILURES",
    "ParameterServerLostError",
    "describe_ps_failure",
    "FitPlan",
    "ps_failures_explained",
    "ParameterServerTrainer",
    "fit",
    "evaluate",
]

_log = logging.getLogger(__name__)

# What scheduled steps also raise when a ps came back empty (its variables
# lost with its old process). Only `join` maps these: elsewhere they can mean
# a missing file.
PS_FAILURES = PEER_FAILURES + (tf.errors.NotFoundError, tf.errors.FailedPreconditionError)


class ParameterServerLostError(tf.errors.UnavailableError):
    """A parameter server failed; the job must restart from its last backup.

    An `UnavailableError`, so code that treats a lost peer as "exit non-zero
    and let the job restart" handles it without knowing about it.
    """

    def __init__(self, message: str):
        super().__init__(None, None, message)


_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")


def describe_ps_failure(error: Exception) -> str:
    """One line naming the parameter server(s) an error came from, and what to do."""
    text = str(error)
    tasks = sorted({f"ps:{index}" for index in _PS_TASK.findall(text)})
    who = (
        f"parameter server {', '.join(tasks)}"
        if tasks
        else "a parameter server or the connection to it"
    )
    unreachable = "failed to connect" in text.lower() or "connection refused" in text.lower()
    return (
        f"parameter-server training stopped: {who} "
        f"{'is unreachable' if unreachable else 'failed'} ({type(error).__name__}); the "
        f"variables it held are gone, so restart the job to resume from the last backup"
    )


def _check_positive(name: str, value, hint: str) -> int:
    return check_whole_number(name, value, minimum=1, hint=hint)


def _dataset_fn(data, argument: str):
    """`input_context -> tf.data.Dataset` for a dataset or a dataset function."""
    if isinstance(data, tf.data.Dataset):
        return lambda input_context: data
    if callable(data):
        return data
    raise UsageError(
        f"{argument} is a {type(data).__name__}, expected a tf.data.Dataset of batches or a "
        f"function input_context -> tf.data.Dataset; wrap arrays with "
        f"tf.data.Dataset.from_tensor_slices(...).batch(batch_size)"
    )


def _first_batch(dataset_fn):
    dataset = dataset_fn(tf.distribute.InputContext())
    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(
            f"the dataset function returned a {type(dataset).__name__}, expected a tf.data.Dataset"
        )
    for batch in dataset.take(1):
        return batch
    raise UsageError("the dataset is empty, expected at least one batch")


def _to_python(logs: dict) -> dict:
    """Scalars as floats; a metric with a vector result (`F1Score`) as a list of floats."""
    arrays = {name: np.asarray(value) for name, value in logs.items()}
    return {
        name: float(array) if array.ndim == 0 else array.astype(float).tolist()
        for name, array in arrays.items()
    }


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """The schedule of one `fit` call, validated before any task is contacted.

    Attributes:
        epochs: Index of the last epoch, as in Keras `fit`.
        initial_epoch: Epoch to start at.
        steps_per_epoch: Steps per epoch; required.
        steps_per_sync: Steps between two sync points (default: one epoch).
        validation_steps: Batches per validation, when validating.
        validation_freq: Validate after every this many epochs.
    """

    epochs: int = 1
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    steps_per_sync: int | None = None
    validation_steps: int | None = None
    validation_freq: int = 1
    has_validation_data: bool = False

    def __post_init__(self):
        if self.steps_per_epoch is None:
            raise UsageError(
                "steps_per_epoch is missing, expected a whole number > 0: under "
                "ParameterServerStrategy every worker reads its own endless copy of the data, "
                "so an epoch has no natural end; pass steps_per_epoch=N (e.g. examples // "
                "batch size)"
            )
        _check_positive("steps_per_epoch", self.steps_per_epoch, "pass the steps in one epoch")
        _check_positive("epochs", self.epochs, "pass the number of epochs to train")
        check_whole_number("initial_epoch", self.initial_epoch, minimum=0)
        require(
            self.initial_epoch <= self.epochs,
            f"initial_epoch is {self.initial_epoch!r}, expected a whole number from 0 to "
            f"epochs ({self.epochs})",
        )
        if self.steps_per_sync is None:
            object.__setattr__(self, "steps_per_sync", self.steps_per_epoch)
        _check_positive(
            "steps_per_sync",
            self.steps_per_sync,
            "pass how many steps to run between two sync points",
        )
        _check_positive("validation_freq", self.validation_freq, "validate every N epochs")
        if self.has_validation_data:
            _check_positive(
                "validation_steps",
                self.validation_steps,
                "pass how many batches each validation evaluates",
            )


@contextlib.contextmanager
def ps_failures_explained(errors=PEER_FAILURES):
    """Turns a lost-peer error on the coordinator into a `ParameterServerLostError`.

    The coordinator itself talks only to the ps tasks (it reads metrics and
    counters, saves checkpoints); lost workers are handled by the
    `ClusterCoordinator`. So a lost-peer error here means a lost ps.
    """
    try:
        yield
    except ParameterServerLostError:
        raise
    except errors as error:
        raise ParameterServerLostError(describe_ps_failure(error)) from error


class ParameterServerTrainer:
    """Trains and evaluates a compiled Keras model from the coordinator.

    Build and compile the model inside `strategy.scope()` of a
    `tf.distribute.ParameterServerStrategy`, then:

        trainer = ParameterServerTrainer(model)
        history = trainer.fit(dataset_fn, epochs=3, steps_per_epoch=100)

    Args:
        model: A compiled Keras model created in the strategy's scope.
        coordinator: The `ClusterCoordinator`; one is made for the model's
            strategy when not given.
        positions: A `tfdist.parameter_server.WorkerPositions`: every train
            function adds its steps to the count of the worker that ran it
            (what a resume starts each worker's stream at).

    Raises:
        UsageError: The model is not compiled, was not created under a
            `ParameterServerStrategy`, or accumulates gradients.
    """

    def __init__(self, model: keras.Model, *, coordinator=None, positions=None):
        strategy = getattr(model, "distribute_strategy", None)
        if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
            raise UsageError(
                f"model {model.name!r} was created under {type(strategy).__name__}, expected "
                f"a tf.distribute.ParameterServerStrategy; create and compile the model inside "
                f"`with strategy.scope():`"
            )
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise UsageError(
                f"model {model.name!r} is not compiled, expected model.compile(optimizer=..., "
                f"loss=...) inside strategy.scope() before training"
            )
        if getattr(optimizer, "gradient_accumulation_steps", None):
            raise UsageError(
                f"the optimizer accumulates gradients (gradient_accumulation_steps="
                f"{optimizer.gradient_accumulation_steps}), which asynchronous parameter-server "
                f"training cannot do consistently; remove gradient_accumulation_steps"
            )
        self.model = model
        self.strategy = strategy
        self.coordinator = coordinator or tf.distribute.coordinator.ClusterCoordinator(strategy)
        self.positions = positions
        self._built = False
        self._train_function = None
        self._test_function = None
        self._eval_iterators = {}
        self.steps_completed = 0
        self.timed_steps = 0
        self.timed_seconds = 0.0
        self._all_seconds = 0.0

    # ---------------------------------------------------------------- build

    def _build(self, sample_batch) -> None:
        """Creates every variable on the coordinator before any step is traced."""
        if self._built:
            return
        model = self.model
        with self.strategy.scope():
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(sample_batch)
            y_pred = model(x, training=False)
            model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            model.reset_metrics()
        sharded = [
            variable.path
            for variable in model.variables
            if type(variable.value).__name__ == "ShardedVariable"
        ]
        if sharded:
            raise UsageError(
                f"variables {sharded[:3]} were partitioned into shards (the strategy's "
                f"variable_partitioner, min_shard_bytes > 0), which Keras 3's train_step cannot "
                f"differentiate ('ShardedVariable' object has no attribute 'handle'); build the "
                f"strategy with min_shard_bytes=0, or train with a custom step on tf.Variables"
            )
        counters = keras_compat.parameter_server_state_variables(model)
        local = [
            variable.path
            for variable in counters
            if "/job:ps" not in (getattr(variable.value, "device", "") or "/job:ps")
        ]
        if local:
            raise UsageError(
                f"variables {local[:3]} are not on the parameter servers, expected every "
                f"variable of the model, its optimizer and metrics to be created in the "
                f"strategy's scope; call model.compile(...) inside strategy.scope()"
            )
        keras_compat.make_parameter_server_updates_exact(model)
        self._built = True

    def _make_train_function(self):
        strategy, model, positions = self.strategy, self.model, self.positions

        @tf.function
        def train_function(iterator, num_steps):
            for _ in tf.range(num_steps):
                strategy.run(model.train_step, args=(next(iterator),))
            if positions is not None:  # after the steps: a failed closure counts none
                positions.advance(num_steps)

        return train_function

    def _make_test_function(self):
        strategy, model = self.strategy, self.model

        @tf.function
        def test_function(iterator):
            strategy.run(model.test_step, args=(next(iterator),))

        return test_function

    def _per_worker_iterator(self, data):
        """An iterator over each worker's own copy of `data`, repeated."""
        if isinstance(data, tf.data.Dataset):
            # Sent to the workers as a graph; an eagerly made dataset cannot be
            # captured by a function that runs elsewhere.
            distributed = self.strategy.experimental_distribute_dataset(data.repeat())
        else:
            distributed = self.strategy.distribute_datasets_from_function(
                lambda input_context: data(input_context).repeat()
            )
        return iter(self.coordinator.create_per_worker_dataset(distributed))

    # ------------------------------------------------------------- running

    def _join(self) -> None:
        with ps_failures_explained(PS_FAILURES):
            self.coordinator.join()

    def _run_train_steps(self, iterator, num_steps: int, steps_per_execution: int) -> None:
        if self._train_function is None:
            self._train_function = self._make_train_function()
        scheduled = 0
        while scheduled < num_steps:
            chunk = min(steps_per_execution, num_steps - scheduled)
            self.coordinator.schedule(self._train_function, args=(iterator, chunk))
            scheduled += chunk
        self._join()

    def _check_iterations(self, expected: int) -> None:
        iterations = self.model.optimizer.iterations
        counted = int(iterations.numpy())
        if counted != expected:
            cause = (
                "a step whose worker failed after its update landed was run again"
                if counted > expected
                else "increments were lost"
            )
            _log.warning(
                "optimizer.iterations was %d after %d steps (%s); setting it to %d.",
                counted,
                expected,
                cause,
                expected,
            )
            iterations.assign(expected)

    def _metric_logs(self) -> dict:
        return _to_python(self.model.get_metrics_result())

    def fit(
        self,
        x,
        *,
        epochs: int = 1,
        initial_epoch: int = 0,
        steps_per_epoch: int = None,
        steps_per_sync: int | None = None,
        callbacks=None,
        validation_data=None,
        validation_steps: int | None = None,
        validation_freq: int = 1,
        verbose="auto",
    ) -> keras.callbacks.History:
        """Trains for `epochs - initial_epoch` epochs of `steps_per_epoch` steps.

        Args:
            x: A `tf.data.Dataset` of `(x, y)` or `(x, y, sample_weight)` batches,
                or a function `input_context -> tf.data.Dataset`. Every worker
                runs its own copy (repeated forever); shuffle without a fixed
                seed, or shard by something other than the worker, so that
                workers see different batches.
            epochs: Index of the last epoch, as in Keras `fit`.
            initial_epoch: Epoch to start at (when resuming).
            steps_per_epoch: Steps per epoch; required, because the workers'
                input streams have no common end.
            steps_per_sync: Wait for all scheduled steps every this many steps
                (default: once per epoch). Batch-level callbacks (progress,
                backups every N steps) run at these points only.
            callbacks: Keras callbacks. They run on the coordinator at sync
                points; `on_train_batch_end(batch, logs)` gets the index of the
                last step done and the metrics so far.
            validation_data: Like `x`; evaluated every `validation_freq` epochs.
            validation_steps: Batches per validation; required with
                `validation_data`.
            validation_freq: Validate after every this many epochs.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto" 1.

        Returns:
            The `History` of epoch-level logs.

        Raises:
            UsageError: A missing or bad argument.
            ParameterServerLostError: A parameter server failed.
        """
        plan = FitPlan(
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            steps_per_sync=steps_per_sync,
            validation_steps=validation_steps,
            validation_freq=validation_freq,
            has_validation_data=validation_data is not None,
        )
        with ps_failures_explained():
            return self._fit(
                x, plan, callbacks=callbacks, validation_data=validation_data, verbose=verbose
            )

    def _fit(self, x, plan: "FitPlan", *, callbacks, validation_data, verbose):
        epochs, initial_epoch = plan.epochs, plan.initial_epoch
        steps_per_epoch, steps_per_sync = plan.steps_per_epoch, plan.steps_per_sync
        validation_steps, validation_freq = plan.validation_steps, plan.validation_freq
        train_fn = _dataset_fn(x, "x")
        self._build(_first_batch(train_fn))
        steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        iterator = self._per_worker_iterator(x)
        model = self.model
        verbose = 1 if verbose == "auto" else verbose
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            model=model,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
        )
        history = next(
            callback
            for callback in callback_list.callbacks
            if isinstance(callback, keras.callbacks.History)
        )
        model.stop_training = False
        base_iterations = int(model.optimizer.iterations.numpy())
        steps_this_fit = 0
        first_sync_done = False
        callback_list.on_train_begin()
        epoch_logs = {}
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callback_list.on_epoch_begin(epoch)
            done = 0
            while done < steps_per_epoch and not model.stop_training:
                num_steps = min(steps_per_sync, steps_per_epoch - done)
                callback_list.on_train_batch_begin(done)
                started = time.perf_counter()
                self._run_train_steps(iterator, num_steps, steps_per_execution)
                elapsed = time.perf_counter() - started
                self._all_seconds += elapsed
                if first_sync_done:  # the first sync point includes tracing
                    self.timed_seconds += elapsed
                    self.timed_steps += num_steps
                first_sync_done = True
                done += num_steps
                steps_this_fit += num_steps
                self.steps_completed += num_steps
                self._check_iterations(base_iterations + steps_this_fit)
                callback_list.on_train_batch_end(done - 1, self._metric_logs())
            epoch_logs = self._metric_logs()
            if validation_data is not None and (epoch + 1) % validation_freq == 0:
                validation_logs = self.evaluate(validation_data, steps=validation_steps)
                epoch_logs.update({f"val_{name}": value for name, value in validation_logs.items()})
            callback_list.on_epoch_end(epoch, epoch_logs)
            if model.stop_training:
                break
        callback_list.on_train_end(epoch_logs)
        return history

    def evaluate(self, x, *, steps: int = None, callbacks=None) -> dict:
        """Evaluates `steps` batches on the workers; returns the metrics.

        Each worker reads its own copy of `x` (repeated), and the `steps`
        batches go to whichever workers are free, so `steps` batches are
        evaluated exactly, but not necessarily a full pass over the data.
        The iterator is kept, so a later call continues the stream.

        Args:
            x: Like `fit`'s `x`.
            steps: Batches to evaluate; required.
            callbacks: Keras callbacks; `on_test_begin`/`on_test_end` run.

        Returns:
            Metric name to value, like `model.evaluate(..., return_dict=True)`.
        """
        with ps_failures_explained():
            return self._evaluate(x, steps=steps, callbacks=callbacks)

    def _evaluate(self, x, *, steps, callbacks) -> dict:
        if steps is None:
            raise UsageError(
                "steps is missing, expected a whole number > 0 of batches to evaluate: under "
                "ParameterServerStrategy each worker reads its own endless copy of the data; "
                "pass steps=N"
            )
        _check_positive("steps", steps, "pass the number of batches to evaluate")
        eval_fn = _dataset_fn(x, "x")
        self._build(_first_batch(eval_fn))
        key = id(x)
        if key not in self._eval_iterators:
            # Keep the dataset object alive so that its id is not reused.
            self._eval_iterators[key] = (x, self._per_worker_iterator(x))
        iterator = self._eval_iterators[key][1]
        if self._test_function is None:
            self._test_function = self._make_test_function()
        callback_list = (
            keras.callbacks.CallbackList(callbacks, model=self.model, steps=steps)
            if callbacks
            else None
        )
        if callback_list:
            callback_list.on_test_begin()
        self.model.reset_metrics()
        for _ in range(steps):
            self.coordinator.schedule(self._test_function, args=(iterator,))
        self._join()
        logs = self._metric_logs()
        if callback_list:
            callback_list.on_test_end(logs)
        return logs

    def evaluate_on_coordinator(self, dataset: tf.data.Dataset) -> dict:
        """One exact pass over a finite `dataset`, computed on the coordinator.

        The coordinator reads the current weights from the parameter servers
        and runs `test_step` itself, so every batch counts once (unlike
        `evaluate`, whose workers each read their own copy of the data).
        """
        with ps_failures_explained():
            return self._evaluate_on_coordinator(dataset)

    def _evaluate_on_coordinator(self, dataset: tf.data.Dataset) -> dict:
        if not isinstance(dataset, tf.data.Dataset):
            raise UsageError(
                f"dataset is a {type(dataset).__name__}, expected a finite "
                f"tf.data.Dataset of batches"
            )
        self._build(_first_batch(lambda input_context: dataset))
        test_step = tf.function(self.model.test_step)
        self.model.reset_metrics()
        for batch in dataset:
            test_step(batch)
        return self._metric_logs()

    @property
    def steps_per_second(self) -> float:
        """Training steps per second after the first sync point (which includes tracing).

        With a single sync point, over all steps, tracing included; 0.0 before training.
        """
        if self.timed_seconds:
            return self.timed_steps / self.timed_seconds
        return self.steps_completed / self._all_seconds if self._all_seconds else 0.0


def fit(
    model: keras.Model,
    x,
    *,
    epochs: int = 1,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    steps_per_sync: int | None = None,
    validation_data=None,
    validation_steps: int | None = None,
    validation_freq: int = 1,
    **kwargs,
) -> keras.callbacks.History:
    """`ParameterServerTrainer(model).fit(x, ...)`; see there.

    The schedule is checked first, so a missing `steps_per_epoch` is reported
    before anything else.
    """
    FitPlan(
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        steps_per_sync=steps_per_sync,
        validation_steps=validation_steps,
        validation_freq=validation_freq,
        has_validation_data=validation_data is not None,
    )
    return ParameterServerTrainer(model).fit(
        x,
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        steps_per_sync=steps_per_sync,
        validation_data=validation_data,
        validation_steps=validation_steps,
        validation_freq=validation_freq,
        **kwargs,
    )


def evaluate(model: keras.Model, x, **kwargs) -> dict:
    """`ParameterServerTrainer(model).evaluate(x, **kwargs)`; see there."""
    return ParameterServerTrainer(model).evaluate(x, **kwargs)
