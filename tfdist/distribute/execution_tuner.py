"""`steps_per_execution="auto"`: measure a few values at the start, keep the fastest.

Keras 3 dropped tf_keras's `StepsPerExecutionTuner` (a thread that rescaled a
`steps_per_execution` variable by x1.5 or x0.5 every few seconds while
training ran). In Keras 3 the number is fixed for a `fit` call and baked into
the traced train function, so this module tunes *before* training instead:
"probe with rollback".

1. Snapshot every model variable (Keras seed-generator state included) and
   every optimizer variable (loss scale included).
2. For each candidate (by default the largest valid divisors up to 1, 4, 16,
   64), run a few executions through the model's own `fit` on a separate
   stream of the same batches, and time them (the first, which traces, is
   left out).
3. Restore every variable exactly, set `model.steps_per_execution` to the
   largest candidate within `tolerance` of the fastest, and keep its traced
   train function (so `fit` does not trace again).

Exactness: a candidate is valid only when it divides the steps of an epoch,
the backup interval, and the steps already done in a resumed epoch, so no
execution ever crosses an epoch end, a backup step or the end of training, and
a restart can choose another value. An execution is kept under
`max_execution_seconds` so that a preemption notice, checked after every
execution, is noticed quickly.

Bounded: probing costs at most `MAX_PROBE_FRACTION` (5%) of the run's
estimated time or `MIN_PROBE_BUDGET_SECONDS` (3 s), whichever is larger
(the run estimated from the steps left and the first measured step time).
A probe stops after the execution that reaches the budget, and a candidate is
not started when its predicted cost (its steps at the best measured rate,
plus the first execution's tracing as measured at the previous candidate)
would exceed what is left. The first execution of the first candidate, which
traces the training step, is always run.

Multi-worker: every worker runs the same probes in lockstep (they contain
collectives); after each candidate the first replica's measurement is
broadcast, so every worker makes the same decisions and the same choice.
"""

import dataclasses
import math
import statistics
import time
from typing import Sequence

import keras
import tensorflow as tf
from absl import logging

__all__ = [
    "DEFAULT_TARGETS",
    "MAX_EXECUTION_SECONDS",
    "TOLERANCE",
    "MIN_TIMED_STEPS",
    "MIN_TIMED_EXECUTIONS",
    "MAX_PROBE_FRACTION",
    "MIN_PROBE_BUDGET_SECONDS",
    "TuningResult",
    "step_granularity",
    "candidate_values",
    "tune_steps_per_execution",
    "MAX_PARAMETER_SERVER_STEPS",
    "parameter_server_steps_per_execution",
]

# Targets of the search; each is replaced by the largest valid divisor not above it.
DEFAULT_TARGETS = (1, 4, 16, 64)
# A preemption notice waits at most about this long for the running execution.
MAX_EXECUTION_SECONDS = 1.0
# Keep the largest value whose step time is within this fraction of the best.
TOLERANCE = 0.05
# Steps timed at each candidate at least (more executions for small values).
MIN_TIMED_STEPS = 32
MIN_TIMED_EXECUTIONS = 3
# Probing costs at most this fraction of the estimated run, or the seconds below.
MAX_PROBE_FRACTION = 0.05
MIN_PROBE_BUDGET_SECONDS = 3.0


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """What `tune_steps_per_execution` chose and why.

    Attributes:
        steps_per_execution: The value set on the model.
        step_seconds: Median seconds per step measured at each probed value.
        candidates: Values that were allowed (divisors of `granularity`).
        granularity: Every candidate divides this number of steps.
        probe_seconds: Wall time the probes took (tracing included).
        reason: One sentence for the log.
        probed_steps: Training steps the probes ran (all rolled back).
        budget_seconds: The probing budget (see `MAX_PROBE_FRACTION`).
    """

    steps_per_execution: int
    step_seconds: dict
    candidates: tuple
    granularity: int
    probe_seconds: float
    reason: str
    probed_steps: int = 0
    budget_seconds: float = 0.0


def step_granularity(
    *,
    steps_per_epoch: int,
    backup_every_steps: int = 0,
    first_step: int = 0,
    other_step_counts: Sequence[int] = (),
) -> int:
    """The number of steps every execution size must divide.

    Args:
        steps_per_epoch: Steps of one epoch (executions must not cross its end).
        backup_every_steps: The backup interval, 0 for none (backups land on it).
        first_step: Steps already applied before this run (a resume may start
            inside an epoch; the rest of that epoch must tile too).
        other_step_counts: Other step counts run with the same value, e.g.
            `fit(validation_steps=...)` (Keras runs whole executions there too).
    """
    if steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
    return math.gcd(
        steps_per_epoch,
        max(backup_every_steps, 0),
        first_step % steps_per_epoch,
        *(max(count, 0) for count in other_step_counts),
    )


def candidate_values(granularity: int, targets: Sequence[int] = DEFAULT_TARGETS) -> tuple:
    """For each target, the largest divisor of `granularity` not above it; sorted, unique.

    E.g. granularity 300 and targets (1, 4, 16, 64) give (1, 4, 15, 60).
    """
    divisors = [d for d in range(1, granularity + 1) if granularity % d == 0]
    return tuple(sorted({max(d for d in divisors if d <= max(target, 1)) for target in targets}))


# Under parameter servers an execution is one closure a worker runs on its own: at most this
# many steps, so that a failed worker's closure (run again elsewhere) redoes little.
MAX_PARAMETER_SERVER_STEPS = 64


def parameter_server_steps_per_execution(
    granularity: int, num_workers: int, max_steps: int = MAX_PARAMETER_SERVER_STEPS
) -> tuple[int, str]:
    """What `auto` means under parameter servers: the value and one sentence of why.

    The chief schedules each sync point's steps as closures of this many steps
    (`tfdist.parameter_server.ParameterServerTrainer`), which idle workers take
    in turn. There is no probe: a closure's cost is its steps plus one round trip
    to the chief, so larger is faster up to the point where the workers no
    longer get equal shares. The choice is the largest divisor of `granularity`
    (see `step_granularity`) not above `max_steps` that gives every worker at
    least two closures per sync point, in equal numbers; failing that, the
    largest that gives each worker one.

    Args:
        granularity: Steps between sync points that every execution must divide.
        num_workers: Workers that run closures.
        max_steps: The most steps of one closure.
    """
    workers = max(1, num_workers)
    divisors = [d for d in range(1, min(granularity, max_steps) + 1) if granularity % d == 0]
    for closures_per_worker in (2, 1):
        balanced = [
            d
            for d in divisors
            if granularity // d >= closures_per_worker * workers
            and (granularity // d) % workers == 0
        ]
        if balanced:
            chosen = max(balanced)
            return chosen, (
                f"steps_per_execution=auto chose {chosen} under parameter servers: "
                f"{granularity // chosen} closures of {chosen} steps per sync point of "
                f"{granularity} steps, {granularity // chosen // workers} per worker of "
                f"{workers} (at most {max_steps} steps per closure)"
            )
    return 1, (
        f"steps_per_execution=auto chose 1 under parameter servers: {granularity} steps per "
        f"sync point cannot be split evenly among {workers} worker(s)"
    )


class _ExecutionClock(keras.callbacks.Callback):
    """Wall time between consecutive execution ends (the first execution is left out).

    Stops the probe (`model.stop_training`) after the execution that ends past
    `over_budget()`; counts the executions run.
    """

    def __init__(self, over_budget=lambda durations: False):
        super().__init__()
        self.durations = []
        self.executions = 0
        self.first_seconds = 0.0
        self.stopped = False
        self._over_budget = over_budget
        self._begin = None
        self._last = None

    def on_train_begin(self, logs=None):
        self._begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.executions += 1
        if self._last is not None:
            self.durations.append(now - self._last)
        else:
            self.first_seconds = now - self._begin
        self._last = now
        if self._over_budget(self.durations):
            self.stopped = True
            self.model.stop_training = True


def _snapshot(variables) -> list:
    return [
        tf.identity(variable.value if hasattr(variable, "value") else variable)
        for variable in variables
    ]


def _state_variables(model: keras.Model) -> list:
    variables = list(model.variables)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    # The same variable can be reached twice (e.g. shared layers).
    unique, seen = [], set()
    for variable in variables:
        if id(variable) not in seen:
            seen.add(id(variable))
            unique.append(variable)
    return unique


def _broadcast_first_replica(strategy: tf.distribute.Strategy, value: float) -> float:
    """The value measured by the first replica of the first worker, on every worker."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return value
    local = tf.constant(value, tf.float32)

    def contribute():
        context = tf.distribute.get_replica_context()
        mine = tf.where(tf.equal(context.replica_id_in_sync_group, 0), local, 0.0)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, mine)

    agreed = tf.function(lambda: strategy.run(contribute))()
    return float(strategy.experimental_local_results(agreed)[0].numpy())


def _broadcast_flag(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """The first replica's decision, on every worker (so all probes stop together)."""
    return _broadcast_first_replica(strategy, float(flag)) > 0.5


def tune_steps_per_execution(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps_per_epoch: int,
    backup_every_steps: int = 0,
    first_step: int = 0,
    other_step_counts: Sequence[int] = (),
    targets: Sequence[int] = DEFAULT_TARGETS,
    max_execution_seconds: float = MAX_EXECUTION_SECONDS,
    tolerance: float = TOLERANCE,
    run_steps: int | None = None,
    max_probe_fraction: float = MAX_PROBE_FRACTION,
    min_probe_budget_seconds: float = MIN_PROBE_BUDGET_SECONDS,
) -> TuningResult:
    """Measures candidate steps per execution and sets the best on `model`.

    The model must be compiled (with any `steps_per_execution`), its weights
    restored if resuming. On return every model and optimizer variable holds
    exactly the value it had on entry, `model.steps_per_execution` is the
    choice and `model.train_function` is the one traced for it.

    Args:
        model: A compiled Keras model (with an optimizer).
        dataset: Batches of the training stream; the probes read it from its
            start with their own iterator (pass the stream the run will train on).
        steps_per_epoch, backup_every_steps, first_step, other_step_counts: See
            `step_granularity`.
        targets: Values to try, before rounding down to valid divisors.
        max_execution_seconds: No execution may take longer (measured per step
            at the previous candidate); bounds the wait for a preemption check.
        tolerance: Choose the largest value whose step time is within this
            fraction of the fastest measured (no execution exceeds the bound).
        run_steps: Steps the run will train; None: unbounded probing.
        max_probe_fraction, min_probe_budget_seconds: Probing stops at this
            fraction of the estimated run time or these seconds, whichever is
            larger.

    Returns:
        What was chosen and why (also logged as one line).
    """
    started = time.perf_counter()
    granularity = step_granularity(
        steps_per_epoch=steps_per_epoch,
        backup_every_steps=backup_every_steps,
        first_step=first_step,
        other_step_counts=other_step_counts,
    )
    candidates = candidate_values(granularity, targets)
    strategy = model.distribute_strategy
    if model.optimizer is not None and not model.optimizer.built:
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
    state = _state_variables(model)
    saved = _snapshot(state)

    def budget(step_time: float) -> float:
        if run_steps is None:
            return math.inf
        return max(max_probe_fraction * run_steps * step_time, min_probe_budget_seconds)

    step_seconds, functions, stopped = {}, {}, ""
    probed_steps, first_seconds, traced_seconds = 0, 0.0, {}
    for value in candidates:
        if step_seconds:
            slowest = max(step_seconds.values())
            if value * slowest > max_execution_seconds:
                stopped = (
                    f"{value} would exceed the {max_execution_seconds:g} s bound per execution"
                )
                break
            best = min(step_seconds.values())
            executions = 1 + max(MIN_TIMED_EXECUTIONS, math.ceil(MIN_TIMED_STEPS / value))
            predicted = first_seconds + executions * value * best
            # Agreed on every worker: the inputs are broadcast measurements.
            if (time.perf_counter() - started) + predicted > budget(best):
                stopped = f"{value} would exceed the probing budget of {budget(best):.1f} s"
                break
        model.steps_per_execution = value
        model.make_train_function(force=True)

        def over_budget(durations, value=value):
            if not durations:
                return False
            step_time = min([*step_seconds.values(), statistics.median(durations) / value])
            # Stop before the next execution would end past the budget.
            spent = time.perf_counter() - started + value * step_time
            return _broadcast_flag(strategy, spent > budget(step_time))

        clock = _ExecutionClock(over_budget)
        executions = 1 + max(MIN_TIMED_EXECUTIONS, math.ceil(MIN_TIMED_STEPS / value))
        model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=executions * value,
            callbacks=[clock],
            verbose=0,
            shuffle=False,
        )
        probed_steps += clock.executions * value
        first_seconds = _broadcast_first_replica(strategy, clock.first_seconds)
        traced_seconds[value] = first_seconds
        if not clock.durations:
            continue
        functions[value] = model.train_function
        measured = statistics.median(clock.durations) / value
        step_seconds[value] = _broadcast_first_replica(strategy, measured)
        if clock.stopped:
            stopped = f"the probing budget of {budget(min(step_seconds.values())):.1f} s was spent"
            break

    for variable, value in zip(state, saved):
        variable.assign(value)
    if not step_seconds:  # not one timed execution: nothing to choose from
        step_seconds[candidates[0]] = first_seconds / candidates[0]
        functions[candidates[0]] = model.train_function
    best = min(step_seconds.values())
    # Per-execution overhead only shrinks with more steps per execution, so among values
    # measured within noise of the fastest, the largest is the better bet.
    chosen = max(c for c, seconds in step_seconds.items() if seconds <= (1 + tolerance) * best)
    model.steps_per_execution = chosen
    model.train_function = functions[chosen]
    probe_seconds = time.perf_counter() - started
    measured_text = ", ".join(f"{c}: {1e3 * s:.2f}" for c, s in step_seconds.items())
    reason = (
        f"steps_per_execution=auto chose {chosen}: ms/step measured {{{measured_text}}}; "
        f"the largest within {100 * tolerance:g}% of the fastest; candidates "
        f"{list(candidates)} divide {granularity} (epoch {steps_per_epoch}"
        + (f", backup every {backup_every_steps}" if backup_every_steps else "")
        + (f", resumed at step {first_step}" if first_step else "")
        + (f", also {list(other_step_counts)}" if other_step_counts else "")
        + f"); {'stopped: ' + stopped + '; ' if stopped else ''}an execution takes "
        f"~{1e3 * chosen * step_seconds[chosen]:.0f} ms; probing took {probe_seconds:.1f} s "
        f"({probed_steps} steps; {traced_seconds.get(chosen, 0.0):.1f} s of it tracing the "
        f"step that training reuses"
        + (
            f", budget {budget(best):.1f} s: {100 * max_probe_fraction:g}% of the "
            f"~{run_steps * best:.1f} s run or {min_probe_budget_seconds:g} s"
            if run_steps is not None
            else ""
        )
        + ")"
    )
    logging.info("%s", reason)
    return TuningResult(
        steps_per_execution=chosen,
        step_seconds=dict(step_seconds),
        candidates=candidates,
        granularity=granularity,
        probe_seconds=probe_seconds,
        reason=reason,
        probed_steps=probed_steps,
        budget_seconds=budget(best),
    )
