"""Corrections of Keras 3 under tf.distribute strategies, installed on request.

The one package of tfdist that touches private Keras internals. Upstream Keras
3 (through 3.15) fails or falls short here, in
`keras/src/backend/tensorflow/trainer.py` unless named otherwise:

1. `symbolic_build` (keras-team/keras#20585, tensorflow#80951): under any
   strategy `TensorFlowTrainer._maybe_symbolic_build` reads a batch from an
   iterator that `fit` then discards (the input pipeline starts twice: a
   shuffle window fills twice) and averages it with
   `strategy.reduce("MEAN", batch)` to learn its shapes, which a multi-worker
   strategy cannot do eagerly ("Attempt to convert a value (PerReplica...)")
   and no strategy can do on strings (AddN on strings under
   MirroredStrategy with 2 devices). We build from stand-in tensors made from
   the dataset's element spec instead (unknown dimensions stay unknown): only
   shapes and dtypes matter.
2. `reduce_per_replica`: `reduce_per_replica(..., "mean")` reduces every step
   output with `strategy.reduce("MEAN", value, axis=0)`; for scalar metrics
   axis 0 does not exist ("Invalid reduction dimension 0"). We average across
   replicas only (`axis=None`), which is what the single-worker path computes.
3. `steps_per_execution`: with `steps_per_execution > 1`, `_make_function`
   calls the compiled step inside a `tf.cond` in a `tf.while_loop`. Under
   MultiWorkerMirroredStrategy, and under MirroredStrategy on several CPUs
   (whose default all-reduce is `CollectiveAllReduce`), the step's
   collectives get their instance keys as call-time captures
   (`FuncGraph.capture_call_time_value`), which a `tf.cond` branch never
   feeds ("You must feed a value for placeholder tensor
   'while/cond/Placeholder'"). We run the same steps in one `tf.while_loop`
   whose body calls the step outside any `tf.cond`
   (`_multiworker.make_fused_function`).
4. `replica_jit`: `model.compile(jit_compile=True)` under MirroredStrategy or
   MultiWorkerMirroredStrategy XLA-compiles a function that holds every
   replica and the all-reduce, which fails ("Trying to access resource
   .../replica_1/... located in device CPU:1 from device CPU:0"). We compile
   each replica's forward and backward pass instead and keep the all-reduce,
   the optimizer update and the metric updates outside (`_replica_jit`).
   (`jit_compile="auto"` stays off under strategies, as in Keras.)
5. `string_symbolic_build` (tensorflow#80951, closed as stale): under any
   strategy with several replicas (MirroredStrategy on 2 devices included),
   the same `strategy.reduce("MEAN", batch)` fails on string features
   ("Value for attr 'T' of string is not in the list of allowed values",
   AddN), so every `StringLookup`/`TextVectorization` model fails. We build
   from the first local replica's batch there too.
6. Under ParameterServerStrategy (which Keras `fit` does not run; tfdist's
   `ParameterServerTrainer` does), workers update the same metric variables
   concurrently, and every Keras variable update is a read then a write, so
   updates are lost. `make_parameter_server_updates_exact(model)` runs each
   tracked metric's whole `update_state` under a lock on its ps and makes the
   optimizer's step counter increment atomically (`_parameter_server`). It
   changes only the given model's metric and counter objects, and it is not
   version-gated: read-then-write metric updates are Keras's documented way
   of writing metrics, not a bug upstream will fix.

6. Not Keras: tracing a dataset function before the strategy exists starts
   TensorFlow's eager runtime, after which MultiWorkerMirroredStrategy cannot
   configure its collectives. `runtime_left_unstarted()` resets the eager
   context after such a build (`_eager_runtime`).

7. Not Keras either: no public op gives one input pipeline its share of the
   files of a task's own `tf.data` pipeline; `shard_by_file` uses the
   rewrite behind `experimental_distribute_dataset`'s FILE policy
   (`_file_sharding`).

8. `worker_sharding`: Keras hands a user's dataset to
   `experimental_distribute_dataset`, whose `AUTO` policy fails with fewer
   files than workers ("Could not apply FILE based sharding: the dataset only
   has 1 file(s)", at the end of epoch 1 for validation data) and, for
   evaluation, makes every worker decode every example. Under a multi-worker
   strategy `TFEpochIterator` gets the dataset sharded per worker first:
   by file, by record after its reader (evaluation), or `DATA`
   (`_epoch_sharding`, `_record_sharding`). The stand-in batch of
   `symbolic_build` is the element spec itself, unknown dimensions kept
   (a batch of 1s was refused: "expected shape=(None, 20, 7), found
   shape=(1, 1, 7)").

9. Not Keras: `MultiWorkerMirroredStrategy` lets nobody choose the
   coordination service's heartbeat timeout, the bound within which a frozen
   peer is noticed; `configure_peer_heartbeats` configures the service
   first, as the strategy would, with that bound (`_coordination`).

`apply()` installs the corrections once, only on Keras versions that need
them; each one hands every call under any other strategy (and any model that
does not need it) to the original Keras code unchanged. Nothing happens at
import time. `tests/multiprocess/test_keras_compat.py` (one process) and
`tests/multiprocess/test_multiworker.py::test_upstream_keras_still_fails_without_the_compat_layer`
(two processes) run the unpatched path to show each upstream bug still
exists, so this package can be retired when upstream fixes them.
"""

import keras
from keras.src.backend.tensorflow import trainer as tf_trainer

from tfdist.keras_compat import _multiworker, _parameter_server, _patching, _replica_jit
from tfdist.keras_compat._coordination import (
    configure_peer_heartbeats,  # noqa: F401
    heartbeat_timeout_ms,  # noqa: F401
)
from tfdist.keras_compat._eager_runtime import (
    runtime_initialized,  # noqa: F401
    runtime_left_unstarted,  # noqa: F401
)
from tfdist.keras_compat._file_sharding import (
    can_shard_by_file,  # noqa: F401
    shard_by_file,  # noqa: F401
)
from tfdist.keras_compat._input_state import (
    PipelineFacts,  # noqa: F401
    TrainingInput,  # noqa: F401
    global_seed_is_set,  # noqa: F401
    holds_shuffle_seed_state,  # noqa: F401
    pipeline_facts,  # noqa: F401
    worker_of,  # noqa: F401
)
from tfdist.keras_compat._input_state import supported as input_state_supported  # noqa: F401
from tfdist.keras_compat._record_sharding import enough_files_to_shard  # noqa: F401

# Re-exported: the public names of the reduced-precision gradient all-reduce.
from tfdist.keras_compat._reduced_precision import (
    REDUCED_DTYPES,  # noqa: F401
    gradient_all_reduce_dtype,  # noqa: F401
    set_gradient_all_reduce_dtype,  # noqa: F401
)

__all__ = [
    "configure_peer_heartbeats",
    "heartbeat_timeout_ms",
    "runtime_initialized",
    "runtime_left_unstarted",
    "can_shard_by_file",
    "enough_files_to_shard",
    "shard_by_file",
    "REDUCED_DTYPES",
    "gradient_all_reduce_dtype",
    "set_gradient_all_reduce_dtype",
    "FIRST_FIXED_KERAS",
    "CORRECTIONS",
    "keras_version",
    "needs_patch",
    "is_applied",
    "apply",
    "make_parameter_server_updates_exact",
    "parameter_server_state_variables",
    "remove",
    "PipelineFacts",
    "TrainingInput",
    "global_seed_is_set",
    "holds_shuffle_seed_state",
    "input_state_supported",
    "pipeline_facts",
    "worker_of",
]

# First Keras release assumed fixed; raise it while the upstream test still fails.
FIRST_FIXED_KERAS = (3, 16)
CORRECTIONS = (
    "symbolic_build",
    "reduce_per_replica",
    "steps_per_execution",
    "replica_jit",
    "string_symbolic_build",
    "worker_sharding",
)


def keras_version() -> tuple[int, int]:
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def needs_patch() -> bool:
    """Whether this Keras version has the upstream bugs corrected here."""
    return (3, 0) <= keras_version() < FIRST_FIXED_KERAS


def is_applied() -> bool:
    return _patching.any_enabled()


def _make_function(self, step_function):
    original = _patching.original(tf_trainer.TensorFlowTrainer, "_make_function")
    replica_jit = _patching.enabled("replica_jit") and _replica_jit.applies(self)
    fused = (
        _patching.enabled("steps_per_execution")
        and self.steps_per_execution > 1
        and not self.run_eagerly
        and _multiworker.step_holds_collectives(self.distribute_strategy)
    )
    if not replica_jit and not fused:
        return original(self, step_function)
    if replica_jit:
        step_function = _replica_jit.replica_step(self, step_function)
        # Keras reads `jit_compile` only while building; the step compiles itself.
        jit_compile = self._jit_compile  # pylint: disable=protected-access
        self._jit_compile = False  # pylint: disable=protected-access
        try:
            keras_function = original(self, step_function)
        finally:
            self._jit_compile = jit_compile  # pylint: disable=protected-access
    else:
        keras_function = original(self, step_function)
    if not fused:
        return keras_function
    return _multiworker.make_fused_function(self, step_function, keras_function)


def apply(corrections: tuple[str, ...] = CORRECTIONS) -> bool:
    """Installs the corrections if this Keras needs them. Idempotent.

    Args:
        corrections: Which corrections to install (names in `CORRECTIONS`);
            tests install a subset to show each upstream failure on its own.

    Returns:
        Whether any correction is installed.
    """
    unknown = sorted(set(corrections) - set(CORRECTIONS))
    if unknown:
        raise ValueError(f"unknown corrections {unknown}, expected names from {CORRECTIONS}")
    if not needs_patch():
        return False
    trainer = tf_trainer.TensorFlowTrainer
    if "symbolic_build" in corrections or "string_symbolic_build" in corrections:
        _patching.install(trainer, "_maybe_symbolic_build", _multiworker.maybe_symbolic_build)
    if "worker_sharding" in corrections:
        _patching.install(tf_trainer.TFEpochIterator, "__init__", _multiworker.epoch_iterator_init)
    if "reduce_per_replica" in corrections:
        _patching.install(tf_trainer, "reduce_per_replica", _multiworker.reduce_per_replica)
    if "steps_per_execution" in corrections or "replica_jit" in corrections:
        _patching.install(trainer, "_make_function", _make_function)
    for correction in corrections:
        _patching.enable(correction)
    return is_applied()


def make_parameter_server_updates_exact(model) -> None:
    """Makes `model`'s metric updates and optimizer step counts exact on parameter servers.

    Call it once, on the coordinator, after the model's metrics and optimizer
    variables exist (after the first build) and before steps are scheduled.
    Idempotent. See `_parameter_server` for what it does and what it cannot
    cover.
    """
    _parameter_server.make_updates_exact(model)


def parameter_server_state_variables(model) -> list:
    """The variables `make_parameter_server_updates_exact` protects (counters, metric state)."""
    return _parameter_server.counter_variables(model) + _parameter_server.metric_variables(model)


def remove() -> None:
    """Restores the original Keras functions (for tests of the upstream bugs)."""
    _patching.remove_all()
