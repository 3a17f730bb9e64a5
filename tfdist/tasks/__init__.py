"""The task contract: how a user brings their own model and data to tfdist.

After TF Model Garden's `official/core/base_task.py`: the task says *what* to
train, tfdist owns *how* — the strategy, shuffling, repetition, batching by the
global batch, sharding, prefetch, skipping on resume, backups and preemption —
so every guarantee of tfdist holds for every task.

    class MyTask(tfdist.tasks.Task):
        def __init__(self, hidden_units: int = 64):
            self.hidden_units = hidden_units

        def build_model(self):
            return keras.Sequential([...])          # uncompiled

        def build_inputs(self, training):
            return tf.data.Dataset.from_tensor_slices((features, labels))  # unbatched
            # or a source of cheap records, decoded only where consumed (docs/data.md):
            # return tfdist.data.FileSource("gs://bucket/train-*", preprocess=decode)

        def loss(self):
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

`python -m trainer.task --task=my_pkg.my_module:MyTask --task_config='{"hidden_units": 128}'`
runs it; `NAME` may also be a zero-argument factory (called with the
`--task_config` keyword arguments). A task need not subclass `Task`: any object
with the four methods works.
"""

import importlib
import inspect
import os
import re
from typing import Mapping

from tfdist._internal.json_input import load_json
from tfdist._internal.preconditions import quoted
from tfdist.errors import TaskError, UsageError

__all__ = [
    "REQUIRED_METHODS",
    "MAX_TASK_CONFIG_BYTES",
    "Task",
    "parse_task_config",
    "load_task",
    "check_interface",
    "check_model",
    "check_examples",
    "preflight",
]

REQUIRED_METHODS = ("build_model", "build_inputs", "loss", "metrics")
# A task config file larger than this is refused rather than read whole.
MAX_TASK_CONFIG_BYTES = 1 << 20
_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class Task:
    """Base class for tasks; override `build_model`, `build_inputs` and `loss`.

    Subclasses usually take their settings as keyword arguments of `__init__`,
    which `--task_config` fills.
    """

    def build_model(self):
        """Returns a new, uncompiled `keras.Model`.

        Called inside the strategy's scope: create every variable here.
        """
        raise NotImplementedError(f"{type(self).__name__}.build_model is not implemented")

    def build_inputs(self, training: bool):
        """Returns the examples of one split, or None for no evaluation data.

        Args:
            training: True for the training split, False for evaluation.

        Returns:
            A finite, deterministic `tf.data.Dataset` of **unbatched**
            `(features, labels)` or `(features, labels, sample_weights)`
            examples (one pass is one epoch); or a `tfdist.data` source
            (`RandomAccessSource`, `ArraySource`, `FileSource`) of records
            and a `preprocess` function that makes such an example of one
            record, which tfdist shuffles and shards before preprocessing;
            or None.
        """
        raise NotImplementedError(f"{type(self).__name__}.build_inputs is not implemented")

    def loss(self):
        """What `model.compile(loss=...)` takes."""
        raise NotImplementedError(f"{type(self).__name__}.loss is not implemented")

    def metrics(self) -> list:
        """What `model.compile(metrics=...)` takes; none by default."""
        return []


def parse_task_config(value: str | Mapping | None) -> dict:
    """Reads `--task_config`: a JSON object, a path to a JSON file, or empty.

    Raises:
        TaskError: Not a JSON object, a missing or oversized file.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    text = value.strip()
    source = "--task_config"
    if os.path.isfile(text):
        if os.path.getsize(text) > MAX_TASK_CONFIG_BYTES:
            raise TaskError(
                f"--task_config file {quoted(text)} is larger than "
                f"{MAX_TASK_CONFIG_BYTES} bytes, expected a small JSON object"
            )
        source = f"--task_config file {quoted(text)}"
        with open(text, "rb") as handle:
            text = handle.read(MAX_TASK_CONFIG_BYTES + 1)
    elif not text.startswith(("{", "[", '"')):
        raise TaskError(
            f"--task_config is {quoted(value)}, which is neither a JSON object nor an "
            f"existing file; pass '{{\"name\": value}}' or the path of a JSON file"
        )
    parsed = load_json(
        text,
        source=source,
        error=TaskError,
        hint="expected a JSON object of keyword arguments",
        max_bytes=MAX_TASK_CONFIG_BYTES,
    )
    if not isinstance(parsed, dict):
        raise TaskError(
            f"{source} holds a JSON {type(parsed).__name__}, expected an object "
            f"of keyword arguments for the task"
        )
    return parsed


def load_task(spec: str, task_config: str | Mapping | None = None):
    """Imports `MODULE:NAME` and calls it with the task config's keyword arguments.

    Checks the interface only (the four methods exist and are callable); what
    they return is checked by `check_model` and `check_examples`.

    Raises:
        TaskError: A malformed spec, a module that fails to import, a missing
            name, keyword arguments the task does not take, a missing method.
    """
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise TaskError(
            f"--task is {quoted(spec)}, expected MODULE:NAME such as 'my_pkg.my_module:MyTask'"
        )
    module_name, name = spec.split(":")
    kwargs = parse_task_config(task_config)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # Any failure of the user's module is the user's to fix.
        detail = " ".join(str(error).split())[:200]
        raise TaskError(
            f"--task module {module_name!r} cannot be imported ({type(error).__name__}: "
            f"{detail}); expected an importable module: install your package or add its "
            f"directory to PYTHONPATH"
        ) from None
    factory = getattr(module, name, None)
    if factory is None or not callable(factory):
        raise TaskError(
            f"--task {spec!r}: module {module_name!r} has no callable {name!r}, "
            f"expected a Task class or a zero-argument factory"
        )
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as error:
        raise TaskError(
            f"--task {spec!r} does not accept the --task_config arguments "
            f"{sorted(kwargs)} ({error}); pass only its keyword arguments"
        ) from None
    except ValueError:
        pass  # No signature to check (a builtin); the call below decides.
    task = factory(**kwargs)
    check_interface(task, spec)
    return task


def check_interface(task, spec: str = "the task") -> None:
    """Raises `TaskError` unless `task` has the four methods of the contract."""
    missing = [method for method in REQUIRED_METHODS if not callable(getattr(task, method, None))]
    if missing:
        raise TaskError(
            f"--task {spec!r} made a {type(task).__name__} without {', '.join(missing)}, "
            f"expected the methods {', '.join(REQUIRED_METHODS)}; subclass "
            f"tfdist.tasks.Task or add them"
        )


def check_model(model, spec: str = "the task") -> None:
    """Raises `TaskError` unless `model` is an uncompiled `keras.Model`."""
    import keras  # pylint: disable=g-import-not-at-top

    if not isinstance(model, keras.Model):
        raise TaskError(
            f"--task {spec!r}: build_model() returned {type(model).__name__}, "
            f"expected a keras.Model (Sequential, functional or subclassed)"
        )
    if getattr(model, "compiled", False):
        raise TaskError(
            f"--task {spec!r}: build_model() returned a compiled model, expected an uncompiled "
            f"one: tfdist compiles it with --optimizer and the task's loss(), metrics() and "
            f"weighted_metrics(), and would otherwise replace your compile settings; drop the "
            f"model.compile(...) call and return its loss and metrics from the task"
        )


def check_examples(
    dataset, spec: str = "the task", *, training: bool, element_spec=None
) -> tuple | None:
    """Checks what `build_inputs(training)` returned.

    Args:
        dataset: A `tf.data.Dataset`, a `tfdist.data` source, or None.
        spec: The task, for messages.
        training: Which split.
        element_spec: A source's example structure once read (None: a
            source is checked for its type only, as before the strategy exists).

    Returns:
        The examples' structure, `(features, labels[, sample_weights])` specs,
        or None when `dataset` is None (allowed for evaluation only) or is a
        source whose examples were not read yet.

    Raises:
        TaskError: Not a `tf.data.Dataset` or source; None for training; elements
            that are not `(features, labels[, sample_weights])`; an infinite dataset.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.data import sources  # pylint: disable=g-import-not-at-top

    split = "build_inputs(training=True)" if training else "build_inputs(training=False)"
    if dataset is None:
        if training:
            raise TaskError(
                f"--task {spec!r}: {split} returned None, expected a "
                f"tf.data.Dataset of training examples"
            )
        return None
    if sources.is_source(dataset):
        if element_spec is None:
            return None
        element = element_spec
    elif not isinstance(dataset, tf.data.Dataset):
        raise TaskError(
            f"--task {spec!r}: {split} returned {type(dataset).__name__}, "
            f"expected a tf.data.Dataset of (features, labels) examples or a "
            f"tfdist.data source (RandomAccessSource, ArraySource, FileSource)"
        )
    else:
        element = dataset.element_spec
    what = "preprocess makes" if sources.is_source(dataset) else "yields"
    if not isinstance(element, tuple) or len(element) not in (2, 3):
        raise TaskError(
            f"--task {spec!r}: {split} {what} {_describe(element)}, expected tuples "
            f"(features, labels) or (features, labels, sample_weights)"
        )
    # Known eagerly; in `preflight`'s graph only when TensorFlow can fold it.
    if (
        isinstance(dataset, tf.data.Dataset)
        and tf.get_static_value(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
    ):
        raise TaskError(
            f"--task {spec!r}: {split} is infinite (it repeats), expected one "
            f"pass over the examples: tfdist repeats and shuffles it"
        )
    return element


def _describe(element) -> str:
    if isinstance(element, tuple):
        return f"tuples of {len(element)}"
    if isinstance(element, dict):
        return f"dicts with keys {sorted(element)}"
    return type(element).__name__


def preflight(task, spec: str = "the task") -> None:
    """Checks what the task builds, before the strategy exists.

    Builds the model and both splits in a throwaway graph (no eager op runs,
    and no peer has been contacted), checks their types, then resets Keras's
    global state (layer-name counters, dtype policy), so the real build names
    its layers as a fresh process would. Tracing a dataset function there
    starts TensorFlow's runtime, which is then reset
    (`keras_compat.runtime_left_unstarted`): a multi-worker strategy can still
    be configured afterwards.

    Raises:
        TaskError: A wrong return type or example structure.
    """
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    with keras_compat.runtime_left_unstarted():
        try:
            with tf.Graph().as_default():
                built = (
                    _graph_build(task.build_model),
                    _graph_build(task.build_inputs, True),
                    _graph_build(task.build_inputs, False),
                )
                if built[0] is not _UNCHECKED:
                    check_model(built[0], spec)
                if built[1] is not _UNCHECKED:
                    check_examples(built[1], spec, training=True)
                if built[2] is not _UNCHECKED:
                    check_examples(built[2], spec, training=False)
        finally:
            keras.backend.clear_session(free_memory=False)


_UNCHECKED = object()


def _graph_build(method, *args):
    """Calls a task method in graph mode; code that only runs eagerly is checked later.

    The real build (`check_model`, `check_examples` after the strategy exists)
    repeats every check, so nothing is missed; this only moves errors earlier.
    """
    try:
        return method(*args)
    except UsageError:  # A TaskError, or a tfdist.data source made with bad arguments.
        raise
    except Exception:  # pylint: disable=broad-except
        return _UNCHECKED
