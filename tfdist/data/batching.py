"""Variable-length features: how a task asks tfdist to pad or bucket its batches.

A task whose examples hold features of different lengths (token ids from a
generator with `TensorSpec((None,))`, ragged slices) declares how to batch
them with an optional `batching()` method:

    def batching(self):
        return tfdist.data.batching.PadToLongest()           # pad to each batch's longest
        return tfdist.data.batching.PadToShape(features=(128,))  # pad to a declared shape
        return tfdist.data.batching.BucketByLength(boundaries=(32, 64, 128))

Every mode keeps the stream deterministic: padding changes no order, and
bucketing (`tf.data.Dataset.bucket_by_sequence_length`) groups the one seeded
stream of examples the same way in every process, worker and restart, each
batch still of exactly `--global_batch_size` examples.

Ragged and sparse components are made dense per example before batching (only
when a batching is declared); undeclared variable lengths get one error line.
"""

import dataclasses
from typing import Callable

import tensorflow as tf

from tfdist import data as data_lib
from tfdist.errors import UsageError

__all__ = [
    "PadToLongest",
    "PadToShape",
    "BucketByLength",
    "Batching",
    "BATCHINGS",
    "declared_batching",
    "check_declared",
    "undeclared_message",
    "variable_components",
    "densify",
    "batch_function",
    "padded_training_batches",
    "padded_evaluation_batches",
    "bucketed_training_batches",
]


@dataclasses.dataclass(frozen=True)
class PadToLongest:
    """Pads each batch's variable dimensions to the batch's longest example.

    Attributes:
        padding_value: Fills the padding of every component (0: Keras's
            `mask_zero` convention for token ids).
    """

    padding_value: float = 0


@dataclasses.dataclass(frozen=True)
class PadToShape:
    """Pads the features to a declared shape (labels and weights to the batch's longest).

    Attributes:
        features: The padded shape of one example's features (a tuple, or a
            dict of tuples for dict features); `None` entries pad to the batch's
            longest. An example longer than the shape fails the input pipeline.
        padding_value: Fills the padding.
    """

    features: tuple | dict
    padding_value: float = 0

    def __post_init__(self):
        shapes = self.features.values() if isinstance(self.features, dict) else [self.features]
        for shape in shapes:
            if not isinstance(shape, (tuple, list)) or not all(
                d is None or (isinstance(d, int) and d > 0) for d in shape
            ):
                raise UsageError(
                    f"PadToShape(features={self.features!r}): expected a tuple "
                    f"of positive ints or None per feature, e.g. (128,)"
                )


@dataclasses.dataclass(frozen=True)
class BucketByLength:
    """Groups examples of similar length, then pads each batch to its longest.

    `tf.data`'s `bucket_by_sequence_length` over the endless seeded stream:
    an example of length `n` goes to the bucket of the first boundary above
    `n`; a bucket yields a batch once it holds a global batch. Steps per epoch
    stay the examples over the global batch. A resume reads the stream from its
    start up to the resumed step (bucketing ties each batch to all earlier
    examples), so its cost grows with the step.

    Attributes:
        boundaries: Increasing lengths that separate the buckets.
        length_of: Which feature's first dimension is the length: a dict key,
            or None for the features themselves (or the first variable-length
            one of a dict).
        padding_value: Fills the padding.
    """

    boundaries: tuple
    length_of: str | None = None
    padding_value: float = 0

    def __post_init__(self):
        bounds = tuple(self.boundaries)
        if (
            not bounds
            or any(not isinstance(b, int) or b <= 0 for b in bounds)
            or list(bounds) != sorted(set(bounds))
        ):
            raise UsageError(
                f"BucketByLength(boundaries={self.boundaries!r}): expected "
                f"increasing positive ints, e.g. (32, 64, 128)"
            )


Batching = PadToLongest | PadToShape | BucketByLength
BATCHINGS = (PadToLongest, PadToShape, BucketByLength)


def declared_batching(task, spec: str = "the task") -> Batching | None:
    """The task's `batching()` (optional method; None when absent or returning None).

    Raises:
        UsageError: It returned something else.
    """
    method = getattr(task, "batching", None)
    declared = method() if callable(method) else None
    if declared is not None and not isinstance(declared, BATCHINGS):
        raise UsageError(
            f"--task {spec!r}: batching() returned {type(declared).__name__}, expected None, "
            f"tfdist.data.batching.PadToLongest(), PadToShape(features=...) or "
            f"BucketByLength(boundaries=...)"
        )
    return declared


def _variable_components(element_spec) -> list[str]:
    """Names (features/labels/sample_weights paths) of components not of one fixed shape."""
    names = ("features", "labels", "sample_weights")
    found = []
    for name, part in zip(names, element_spec):
        flat = (
            sorted(part.items())
            if isinstance(part, dict)
            else [(index, c) for index, c in enumerate(tf.nest.flatten(part))]
        )
        for path, component in flat:
            label = f"{name}[{path!r}]" if len(flat) > 1 or isinstance(part, dict) else name
            if not isinstance(component, tf.TensorSpec):
                found.append(f"{label} ({type(component).__name__})")
            elif not component.shape.is_fully_defined():
                found.append(f"{label} (shape {component.shape})")
    return found


def check_declared(
    examples: tf.data.Dataset, batching: Batching | None, spec: str = "the task"
) -> None:
    """Refuses ragged or sparse components when no batching is declared.

    Raises:
        UsageError: A ragged or sparse component and no `batching()`.
    """
    if batching is not None:
        return
    structural = [name for name in _variable_components(examples.element_spec) if "Spec)" in name]
    if structural:
        raise UsageError(undeclared_message(spec, structural))


def undeclared_message(spec: str, components: list[str]) -> str:
    return (
        f"--task {spec!r}: the examples have variable-length components "
        f"({', '.join(components)}) and the task declares no batching; pad or densify "
        f"them in build_inputs, or declare padding: add a batching() method returning "
        f"tfdist.data.batching.PadToLongest(), PadToShape(features=...) or "
        f"BucketByLength(boundaries=...) (docs/tasks.md)"
    )


def variable_components(examples: tf.data.Dataset) -> list[str]:
    """The components whose shape is not fixed (for messages)."""
    return _variable_components(examples.element_spec)


def _dense(value):
    if isinstance(value, tf.RaggedTensor):
        return value.to_tensor()
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value)
    return value


def densify(examples: tf.data.Dataset) -> tf.data.Dataset:
    """Each example's ragged and sparse components as dense tensors."""
    if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(examples.element_spec)):
        return examples
    return examples.map(
        lambda *parts: tf.nest.map_structure(_dense, parts),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def _padded_shapes(element_spec, batching: Batching):
    shapes = tf.nest.map_structure(lambda s: s.shape, element_spec)
    if isinstance(batching, PadToShape):
        features = element_spec[0]
        declared = batching.features
        if isinstance(features, dict):
            if not isinstance(declared, dict):
                raise UsageError(
                    f"PadToShape(features={declared!r}): the features are a dict "
                    f"with keys {sorted(features)}, expected a dict of shapes"
                )
            feature_shapes = {
                k: tf.TensorShape(declared.get(k, v.shape)) for k, v in features.items()
            }
        else:
            feature_shapes = tf.TensorShape(declared)
            if feature_shapes.rank != features.shape.rank:
                raise UsageError(
                    f"PadToShape(features={declared!r}) has rank {feature_shapes.rank}, but "
                    f"one example's features have shape {features.shape}; declare a shape of "
                    f"rank {features.shape.rank}"
                )
        shapes = (feature_shapes, *shapes[1:])
    return shapes


def _padding_values(element_spec, value):
    def one(spec):
        if spec.dtype == tf.string:
            return tf.constant("", tf.string)
        return tf.cast(tf.constant(value), spec.dtype)

    return tf.nest.map_structure(one, element_spec)


def batch_function(batching: Batching | None) -> Callable | None:
    """`f(dataset, batch_size, drop_remainder) -> batches` for padding; None for `.batch`.

    For `BucketByLength` this pads to each batch's longest (the evaluation
    split; training uses `bucketed_training_batches`).
    """
    if batching is None:
        return None

    def pad(dataset, batch_size, drop_remainder):
        spec = dataset.element_spec
        return dataset.padded_batch(
            batch_size,
            padded_shapes=_padded_shapes(spec, batching),
            padding_values=_padding_values(spec, batching.padding_value),
            drop_remainder=drop_remainder,
        )

    return pad


def _length_function(element_spec, batching: BucketByLength):
    features = element_spec[0]
    if isinstance(features, dict):
        key = batching.length_of
        if key is None:
            variable = [k for k, s in features.items() if not s.shape.is_fully_defined()]
            key = (variable or sorted(features))[0]
        if key not in features:
            raise UsageError(
                f"BucketByLength(length_of={key!r}): the features have no such "
                f"key, expected one of {sorted(features)}"
            )
        return lambda *parts: tf.shape(parts[0][key])[0]
    if features.shape.rank == 0:
        raise UsageError(
            "BucketByLength: the features are scalars, which have no length; "
            "bucket a sequence feature (length_of=...) or use PadToLongest()"
        )
    return lambda *parts: tf.shape(parts[0])[0]


def padded_training_batches(
    examples: tf.data.Dataset,
    batching: Batching,
    *,
    global_batch_size: int,
    seed: int,
    num_examples: int,
    first_step: int = 0,
) -> tf.data.Dataset:
    """The endless, deterministic stream of padded (or bucketed) global batches.

    The examples follow tfdist's seeded passes (`tfdist.data.training_batches`),
    one pass after another with no remainder dropped, and are then padded in
    groups of `global_batch_size`: batch `s` holds examples `s*B` to `s*B+B-1`
    of that stream, in every process, worker and restart. A resume starts at
    example `first_step * B` at the cost of at most one pass.

    Args:
        examples: One pass of unbatched examples (ragged and sparse allowed).
        batching: The task's declared batching.
        global_batch_size, seed, num_examples, first_step: As in
            `tfdist.data.training_batches`.
    """
    dense = densify(examples)

    def examples_from(first_example: int) -> tf.data.Dataset:
        return data_lib.training_batches(
            dense,
            global_batch_size=1,
            seed=seed,
            num_examples=num_examples,
            first_step=first_example,
        ).unbatch()

    if isinstance(batching, BucketByLength):
        stream = bucketed_training_batches(
            examples_from(0), batching, global_batch_size=global_batch_size, first_step=first_step
        )
    else:
        stream = batch_function(batching)(
            examples_from(first_step * global_batch_size), global_batch_size, True
        )
    return data_lib.with_shard_policy(stream.prefetch(tf.data.AUTOTUNE))


def padded_evaluation_batches(
    examples: tf.data.Dataset, batching: Batching, *, global_batch_size: int
) -> tf.data.Dataset:
    """One pass over evaluation examples in padded global batches (the last may be partial)."""
    batches = batch_function(batching)(densify(examples), global_batch_size, False)
    return data_lib.with_shard_policy(batches.prefetch(tf.data.AUTOTUNE))


def bucketed_training_batches(
    stream_of_examples: tf.data.Dataset,
    batching: BucketByLength,
    *,
    global_batch_size: int,
    first_step: int,
) -> tf.data.Dataset:
    """Global batches of similar-length examples from the endless example stream.

    Args:
        stream_of_examples: The endless, seeded stream of (dense) examples,
            the same in every process.
        batching: The buckets.
        global_batch_size: Examples in every batch.
        first_step: Batches to skip (a resume).
    """
    spec = stream_of_examples.element_spec
    buckets = len(batching.boundaries) + 1
    batches = stream_of_examples.bucket_by_sequence_length(
        _length_function(spec, batching),
        bucket_boundaries=list(batching.boundaries),
        bucket_batch_sizes=[global_batch_size] * buckets,
        padded_shapes=_padded_shapes(spec, batching),
        padding_values=_padding_values(spec, batching.padding_value),
        drop_remainder=True,
    )
    return batches.skip(first_step) if first_step else batches
