"""A task's optional `weighted_metrics()` and `class_weight()`.

`weighted_metrics()` returns what `model.compile(weighted_metrics=...)` takes:
metrics computed with the examples' sample weights (`metrics()` ignore them).
`class_weight()` returns `{class_id: weight}`, as `model.fit(class_weight=...)`
takes it; tfdist applies it in the input pipeline, to the training split
only (as Keras does): each example's weight is multiplied by its class's
weight (a class not listed weighs 1). Both default to none.
"""

import math

import tensorflow as tf

from tfdist.errors import UsageError

__all__ = [
    "weighted_metrics_of",
    "class_weight_of",
    "apply_class_weight",
    "with_class_weight",
    "class_weigher",
]


def weighted_metrics_of(task) -> list | None:
    """The task's `weighted_metrics()`, or None when it has none."""
    method = getattr(task, "weighted_metrics", None)
    return method() if callable(method) else None


def class_weight_of(task, spec: str = "the task") -> dict[int, float] | None:
    """The task's `class_weight()`, checked; None when it has none.

    Raises:
        UsageError: Not a dict of non-negative integer class ids to finite,
            non-negative weights.
    """
    method = getattr(task, "class_weight", None)
    weights = method() if callable(method) else None
    if weights is None:
        return None
    if (
        not isinstance(weights, dict)
        or not weights
        or not all(
            isinstance(k, int)
            and not isinstance(k, bool)
            and k >= 0
            and isinstance(v, (int, float))
            and math.isfinite(v)
            and v >= 0
            for k, v in weights.items()
        )
    ):
        raise UsageError(
            f"--task {spec!r}: class_weight() returned {weights!r:.100}, expected "
            f"a dict of class ids (ints >= 0) to weights (finite numbers >= 0), "
            f"e.g. {{0: 1.0, 1: 3.0}}"
        )
    return {int(k): float(v) for k, v in weights.items()}


def apply_class_weight(
    examples: tf.data.Dataset, class_weight: dict[int, float] | None, spec: str = "the task"
) -> tf.data.Dataset:
    """`(x, y[, w])` examples as `(x, y, w * class_weight[y])`.

    Labels are class ids (a scalar or shape `(1,)`) or one-hot / probability
    vectors (the class is the argmax, as in Keras).

    Raises:
        UsageError: Labels that are not numbers, or a dict of labels.
    """
    if class_weight is None:
        return examples
    weigh = class_weigher(examples.element_spec[1], class_weight, spec)
    return examples.map(weigh, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def with_class_weight(split, class_weight: dict[int, float] | None, spec: str = "the task"):
    """A `tfdist.data.TaskInput` whose examples carry the class weights.

    A task's dataset is mapped; a source's `preprocess` is followed by the
    weighting, so it still runs only on the examples a worker consumes.
    """
    import dataclasses  # pylint: disable=g-import-not-at-top

    if class_weight is None:
        return split
    if not split.is_source:
        return dataclasses.replace(split, value=apply_class_weight(split.value, class_weight, spec))
    weigh = class_weigher(split.element_spec()[1], class_weight, spec)
    source = split.value
    preprocess = source.preprocess

    def weighted(*record):
        example = preprocess(*record) if preprocess is not None else record
        return weigh(*example)

    return dataclasses.replace(split, value=dataclasses.replace(source, preprocess=weighted))


def class_weigher(label_spec, class_weight: dict[int, float], spec: str = "the task"):
    """The function `(x, y[, w]) -> (x, y, w * class_weight[y])` for labels of `label_spec`.

    Raises:
        UsageError: Labels that are not numbers, or a dict of labels.
    """
    if not isinstance(label_spec, tf.TensorSpec) or not (
        label_spec.dtype.is_integer or label_spec.dtype.is_floating
    ):
        raise UsageError(
            f"--task {spec!r}: class_weight() needs numeric labels (class ids or "
            f"one-hot), got labels {label_spec}; map them to class ids in "
            f"build_inputs"
        )
    one_hot = (
        label_spec.shape.rank is not None
        and label_spec.shape.rank >= 1
        and (label_spec.shape[-1] is None or label_spec.shape[-1] > 1)
    )
    table = tf.constant(
        [class_weight.get(i, 1.0) for i in range(max(class_weight) + 1)], tf.float32
    )

    def weigh(features, labels, weights=None):
        if one_hot:
            ids = tf.argmax(labels, axis=-1, output_type=tf.int32)
        else:
            ids = tf.reshape(tf.cast(labels, tf.int32), tf.shape(labels)[:0])
        # Classes above the table weigh 1, like the unlisted ones below it.
        known = tf.logical_and(ids >= 0, ids < tf.size(table))
        weight = tf.where(
            known, tf.gather(table, tf.clip_by_value(ids, 0, tf.size(table) - 1)), 1.0
        )
        if weights is not None:
            weight = tf.cast(weights, tf.float32) * weight
        return features, labels, weight

    return weigh
