"""The one-batch check: a forward pass and the loss on one real batch, before training.

Mistakes in a task's data or loss show up in Keras as 50-110-line tracebacks
deep in the first step (exit 1, which restart policies retry). Run on the
first examples of the training split, batched as training batches them, this
check turns them into one `UsageError` line (exit 2) that names what was
wrong, the value, what was expected and the fix:

- examples already batched by `build_inputs` (`looks_batched`);
- variable-length features with no declared batching;
- features the model cannot take (a wrong width, a wrong dtype);
- string labels for a numeric loss; one-hot labels for a sparse loss;
- `loss()` returning None for a model that does not compute its own loss.

Every task of a job runs the same check on the same examples, so every task
fails alike.
"""

import contextlib
import re
from typing import Callable

import keras
import tensorflow as tf

from tfdist.data import batching as batching_lib
from tfdist.errors import UsageError
from tfdist.tasks import custom_steps

__all__ = [
    "CHECK_BATCH",
    "looks_batched",
    "batched_message",
    "refuse_batched_if_too_few",
    "first_batch",
    "check",
]

# Examples in the checked batch at most (enough to see every shape).
CHECK_BATCH = 8
# Errors of the user's data or model, as Keras and TensorFlow raise them.
_MISTAKES = (ValueError, TypeError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)
_MESSAGE_LIMIT = 240
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m")


def _shapes(value) -> str:
    shapes = tf.nest.map_structure(lambda t: tuple(t.shape), value)
    return str(shapes)


def _first_line(error: Exception) -> str:
    """The line of a Keras/TensorFlow error that says what is wrong."""
    lines = [line.strip() for line in _TERMINAL_CODES.sub("", str(error)).splitlines()]
    useful = [
        line
        for line in lines
        if line
        and not line.startswith(
            ("Exception encountered", "Arguments received", "•", "[[", "Call arguments")
        )
    ]
    text = " ".join((useful or lines or [type(error).__name__])[0].split())
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + "..."


def _dtypes(value):
    return tf.nest.map_structure(lambda t: t.dtype.name, value)


@contextlib.contextmanager
def _mistakes_explained(batched: str | None, describe: Callable[[str], str]):
    """Turns a mistake in the task into one `UsageError` line.

    `batched` (the already-batched message) when given, else `describe` of the
    error's first line.
    """
    try:
        yield
    except _MISTAKES as error:
        raise UsageError(batched or describe(_first_line(error))) from None


def looks_batched(element_spec) -> bool:
    """Whether every component of the examples has one shared leading dimension.

    What `Dataset.batch` leaves: `(None, ...)` (or `(B, ...)` with
    `drop_remainder`) on features, labels and weights alike. Used only to
    explain a failure, never to refuse data that trains.
    """
    leading = []
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            return False
        leading.append(shape[0])
    return len(set(leading)) == 1


def batched_message(spec: str, element_spec, global_batch_size: int) -> str:
    shapes = ", ".join(str(tuple(s.shape)) for s in tf.nest.flatten(element_spec))
    return (
        f"--task {spec!r}: build_inputs(training=True) yields examples that are already "
        f"batched (every component has the same leading dimension: {shapes}); return "
        f"unbatched examples (drop the .batch(...) call, or add .unbatch()): tfdist "
        f"batches them by --global_batch_size={global_batch_size}"
    )


def refuse_batched_if_too_few(
    examples: tf.data.Dataset, num_examples: int, global_batch_size: int, spec: str = "the task"
) -> None:
    """Names an already batched dataset that is smaller than one global batch.

    Raises:
        UsageError: Fewer elements than one global batch, and they look batched.
    """
    if num_examples < global_batch_size and looks_batched(examples.element_spec):
        raise UsageError(
            batched_message(spec, examples.element_spec, global_batch_size)
            + f" (it yields {num_examples} elements, fewer than one global "
            f"batch)"
        )


def first_batch(
    examples: tf.data.Dataset,
    batching,
    *,
    spec: str = "the task",
    global_batch_size: int = CHECK_BATCH,
):
    """The first examples of `examples`, batched as training batches them.

    Raises:
        UsageError: They differ in shape and the task declares no batching.
    """
    size = min(CHECK_BATCH, global_batch_size)
    head = batching_lib.densify(examples).take(size) if batching else examples.take(size)
    pad = batching_lib.batch_function(batching)
    batched = pad(head, size, False) if pad else head.batch(size)
    iterator = iter(batched)
    try:
        return next(iterator)
    except tf.errors.InvalidArgumentError as error:
        if "Cannot batch tensors with different shapes" not in str(error):
            raise
        problem = batching_lib.variable_components(examples) or [_first_line(error)]
    # Outside the handler, so that the iterator (a generator's, maybe) is finalized now.
    del iterator
    raise UsageError(batching_lib.undeclared_message(spec, problem))


def _loss_name(loss) -> str:
    if isinstance(loss, str):
        return repr(loss)
    return getattr(loss, "name", None) or type(loss).__name__


def _is_sparse(loss) -> bool:
    name = loss if isinstance(loss, str) else type(loss).__name__
    name = (
        getattr(loss, "__name__", name)
        if callable(loss) and not isinstance(loss, keras.losses.Loss)
        else name
    )
    return "sparse" in name.lower()


def check(
    model: keras.Model,
    batch,
    *,
    loss,
    spec: str = "the task",
    element_spec=None,
    global_batch_size: int = 0,
) -> None:
    """Runs the model and its loss on `batch`; call inside the strategy's scope.

    Builds the model's variables as a side effect (as a first call would).

    Args:
        model: The task's model, compiled (its compiled loss is used).
        batch: `(features, labels[, sample_weights])`, from `first_batch`.
        loss: What the task's `loss()` returned (for messages).
        spec: How messages name the task.
        element_spec: The unbatched examples' structure (to name batched data).
        global_batch_size: For messages.

    Raises:
        UsageError: The batch does not fit the model or its loss.
    """
    features, labels = batch[0], batch[1]
    weights = batch[2] if len(batch) > 2 else None
    batched_hint = element_spec is not None and looks_batched(element_spec)
    own_loss = custom_steps.computes_own_loss(model)

    if loss is None and not own_loss:
        raise UsageError(
            f"--task {spec!r}: loss() returned None, expected a loss for "
            f"model.compile(loss=...) such as keras.losses.SparseCategoricalCrossentropy(); "
            f"return one, or override the model's train_step/compute_loss to compute it"
        )
    # Data that looks batched already explains any mistake better than the error does.
    batched = batched_message(spec, element_spec, global_batch_size) if batched_hint else None
    with _mistakes_explained(
        batched,
        lambda error: (
            f"--task {spec!r}: the model cannot take a batch of the training features "
            f"(shapes {_shapes(features)}, dtypes {_dtypes(features)}): {error}; "
            f"make build_inputs yield features the model's inputs accept, or change the "
            f"model's inputs"
        ),
    ):
        predictions = model(features, training=False)
    if own_loss and model.loss is None:
        return
    if isinstance(labels, tf.Tensor) and labels.dtype == tf.string:
        sample = labels.numpy().ravel()[:2].tolist()
        raise UsageError(
            f"--task {spec!r}: the labels are strings (e.g. {sample}), expected numbers for "
            f"the loss {_loss_name(loss)}; map them to class ids in build_inputs (e.g. with "
            f"tf.lookup.StaticHashTable or keras.layers.StringLookup)"
        )
    if (
        isinstance(labels, tf.Tensor)
        and isinstance(predictions, tf.Tensor)
        and _is_sparse(loss)
        and labels.shape.rank == predictions.shape.rank
        and labels.shape.rank >= 2
        and labels.shape[-1] == predictions.shape[-1]
        and labels.shape[-1] > 1
    ):
        raise UsageError(
            f"--task {spec!r}: the labels look one-hot (shape {tuple(labels.shape)}, like the "
            f"predictions {tuple(predictions.shape)}) but the loss {_loss_name(loss)} expects "
            f"class ids (shape {tuple(labels.shape[:-1])}); return integer class ids, or use "
            f"the non-sparse loss (e.g. CategoricalCrossentropy)"
        )
    with _mistakes_explained(
        batched,
        lambda error: (
            f"--task {spec!r}: the loss {_loss_name(loss)} cannot take the labels (shapes "
            f"{_shapes(labels)}, dtype {_dtypes(labels)}) against the predictions (shapes "
            f"{_shapes(predictions)}): {error}; make build_inputs yield the labels the loss "
            f"expects, or change loss()"
        ),
    ):
        value = model.compute_loss(
            x=features, y=labels, y_pred=predictions, sample_weight=weights, training=False
        )
    if value is None:
        raise UsageError(
            f"--task {spec!r}: the model computes no loss on a training batch; "
            f"return a loss from loss(), or compute one in compute_loss"
        )
