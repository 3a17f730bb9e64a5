"""NumPy arrays given to `fit` as Keras takes them: batches, a seeded shuffle per epoch, a split.

`keras.Model.fit(x, y, batch_size=32, shuffle=True, validation_split=0.1,
sample_weight=w)` cuts the last tenth off for validation (before shuffling),
then draws a new permutation of the rest every epoch and trains on batches of
`batch_size`, the last one partial. `FitArrays` does the same with a
permutation that is a function of `(seed, pass)` only
(`tf.random.experimental.index_shuffle`, as `tfdist.data.random_access`
draws its passes): step `s` is batch `s % steps_per_pass` of pass
`s // steps_per_pass`, so a restart builds the stream from any step by
arithmetic and every worker builds the same global batches; the strategy
splits each among the replicas (the `DATA` auto-shard policy of a dataset's
global batches). The arrays stay in host memory and are gathered per batch.
"""

import dataclasses
import math
import types

import numpy as np
import tensorflow as tf

from tfdist.data.streaming import with_shard_policy
from tfdist.errors import UsageError

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "is_arrays",
    "refuse_unsupported",
    "as_numpy",
    "FitArrays",
    "examples_of",
    "split_for_validation",
    "FitInputs",
    "fit_inputs",
    "default_seed",
]

DEFAULT_BATCH_SIZE = 32  # keras.Model.fit's default with arrays
# What a generator or Python sequence becomes to be resumable at a step.
_RESUMABLE_FORMS = (
    "NumPy arrays (or a dict of them) with batch_size=..., or a deterministic "
    "tf.data.Dataset of batches"
)


def is_arrays(value) -> bool:
    """Whether `value` is what Keras slices as arrays: arrays, tensors, or lists/dicts of them."""
    if isinstance(value, dict):
        return bool(value) and all(is_arrays(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return bool(value) and all(is_arrays(item) for item in value)
    return isinstance(value, (np.ndarray, tf.Tensor)) or _is_array_like(value)


def _is_array_like(value) -> bool:
    # pandas DataFrames and Series, JAX arrays: what np.asarray reads without copying per item.
    return hasattr(value, "__array__") and hasattr(value, "shape") and not isinstance(value, str)


def refuse_unsupported(x, name: str = "x") -> None:
    """One line for a form of `x` that `fit` cannot resume at a step.

    Raises:
        UsageError: A Python generator or iterator, a `keras.utils.PyDataset`
            (or `Sequence`), a framework's data loader, or anything else that
            is neither arrays nor a `tf.data.Dataset`.
    """
    if isinstance(x, tf.data.Dataset) or is_arrays(x):
        return
    kind = type(x).__name__
    if isinstance(x, (types.GeneratorType, map, filter, zip)) or (
        hasattr(x, "__next__") and hasattr(x, "__iter__")
    ):
        what = f"a Python generator or iterator ({kind}), which cannot be restarted at a step"
    elif hasattr(x, "__getitem__") and hasattr(x, "__len__") and hasattr(x, "on_epoch_end"):
        what = (
            f"a {kind} (keras.utils.PyDataset), whose batches tfdist cannot split among "
            f"workers or resume at a step"
        )
    elif x is None:
        what = "None"
    else:
        what = f"a {kind}, which is neither arrays nor a tf.data.Dataset"
    raise UsageError(
        f"tfdist.resumable.fit: {name} is {what}; pass {_RESUMABLE_FORMS} "
        f"(tf.data.Dataset.from_generator(..., output_signature=...) wraps a generator)"
    )


def _as_numpy(leaf) -> np.ndarray:
    array = np.asarray(leaf)
    if array.dtype.kind in "US" or (array.dtype.kind == "O" and array.size and _texts(array)):
        encoded = [
            item.encode("utf-8") if isinstance(item, str) else bytes(item)
            for item in array.reshape(-1)
        ]
        return np.array(encoded, dtype=object).reshape(array.shape)
    if array.dtype.kind == "O":
        raise UsageError(
            f"an input array has dtype object (shape {array.shape}), expected numbers, "
            f"booleans or strings; convert it with np.asarray(..., dtype=...)"
        )
    return array


def as_numpy(examples: tuple) -> tuple:
    """The examples with every leaf a NumPy array (strings as `bytes` objects)."""
    return tf.nest.map_structure(_as_numpy, tuple(examples))


def _texts(array: np.ndarray) -> bool:
    return all(isinstance(item, (str, bytes)) for item in array.reshape(-1)[:16])


def _dtype(array: np.ndarray) -> tf.DType:
    return tf.string if array.dtype.kind == "O" else tf.as_dtype(array.dtype)


@dataclasses.dataclass(frozen=True)
class FitArrays:
    """The arrays of one `fit` call, as Keras batches them.

    Attributes:
        arrays: `(x,)`, `(x, y)` or `(x, y, sample_weight)`; `x` and `y` may be
            arrays or lists/tuples/dicts of arrays, all of one length.
        batch_size: Examples per global batch (all replicas together).
        shuffle: A new seeded permutation every pass (else the arrays' order).
        seed: Fixes every pass's permutation.
    """

    arrays: tuple
    batch_size: int = DEFAULT_BATCH_SIZE
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self):
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise UsageError(f"batch_size is {self.batch_size!r}, expected a positive integer")
        if not isinstance(self.shuffle, bool):
            raise UsageError(
                f"shuffle is {self.shuffle!r}, expected True or False "
                f"(shuffle='batch' is not supported with tfdist.resumable.fit)"
            )
        arrays = as_numpy(self.arrays)
        lengths = sorted({len(leaf) if leaf.ndim else -1 for leaf in tf.nest.flatten(arrays)})
        if len(lengths) != 1 or lengths[0] < 1:
            raise UsageError(
                f"the arrays given to fit have first dimensions {lengths} (-1: a scalar), "
                f"expected one length of at least 1: example i is element i of x, y and "
                f"sample_weight"
            )
        object.__setattr__(self, "arrays", arrays)

    @property
    def num_examples(self) -> int:
        return len(tf.nest.flatten(self.arrays)[0])

    @property
    def steps_per_pass(self) -> int:
        """Batches in one pass, the last one partial as in Keras: ceil(examples / batch)."""
        return math.ceil(self.num_examples / self.batch_size)

    def run_settings(self) -> dict:
        """What a backup records of these arrays, so that a restart with others is refused."""
        return {
            "arrays_examples": self.num_examples,
            "arrays_batch_size": self.batch_size,
            "arrays_shuffle": self.shuffle,
            "arrays_seed": self.seed,
        }

    def _read(self, indices: tf.Tensor):
        """The examples at a vector of indices, stacked, in the arrays' structure."""
        leaves = tf.nest.flatten(self.arrays)

        def gather(positions):
            return [np.ascontiguousarray(leaf[positions]) for leaf in leaves]

        read = tf.numpy_function(gather, [indices], [_dtype(leaf) for leaf in leaves])
        read = [
            tf.ensure_shape(tensor, [None, *leaf.shape[1:]]) for tensor, leaf in zip(read, leaves)
        ]
        batch = tf.nest.pack_sequence_as(self.arrays, read)
        return batch[0] if len(batch) == 1 else batch

    def _positions(self, batch: tf.Tensor) -> tf.Tensor:
        first = batch * self.batch_size
        return tf.range(first, tf.minimum(first + self.batch_size, self.num_examples))

    def training_batches(self, first_step: int = 0) -> tf.data.Dataset:
        """The endless stream of global batches from step `first_step`, one pass after another."""
        per_pass = self.steps_per_pass
        last_index = self.num_examples - 1

        def indices(step):
            positions = self._positions(step % per_pass)
            if not self.shuffle:
                return positions
            return tf.random.experimental.index_shuffle(
                positions,
                tf.stack([tf.constant(self.seed, tf.int64), step // per_pass]),
                tf.fill(tf.shape(positions), tf.constant(last_index, tf.int64)),
            )

        steps = tf.data.Dataset.range(first_step, tf.int64.max)
        batches = steps.map(
            lambda step: self._read(indices(step)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return with_shard_policy(batches.prefetch(tf.data.AUTOTUNE))

    def evaluation_batches(self) -> tf.data.Dataset:
        """One pass in the arrays' order, in batches of `batch_size` (the last partial)."""
        batches = tf.data.Dataset.range(self.steps_per_pass).map(
            lambda batch: self._read(self._positions(batch)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return with_shard_policy(batches.prefetch(tf.data.AUTOTUNE))


def examples_of(x, y=None, sample_weight=None) -> tuple:
    """`(x[, y[, sample_weight]])`, the structure `FitArrays` takes."""
    if sample_weight is not None and y is None:
        raise UsageError(
            "sample_weight is given but y is not, expected y (the labels) with it; "
            "pass fit(model, x, y, sample_weight=...)"
        )
    return tuple(part for part in (x, y, sample_weight) if part is not None)


def split_for_validation(examples: tuple, validation_split: float) -> tuple[tuple, tuple]:
    """The first and the last `validation_split` of the examples, cut as Keras cuts them.

    Raises:
        UsageError: A fraction outside (0, 1), or too few examples to split.
    """
    if isinstance(validation_split, bool) or not (
        isinstance(validation_split, (int, float)) and 0 < validation_split < 1
    ):
        raise UsageError(
            f"validation_split is {validation_split!r}, expected a fraction between 0 and 1 "
            f"(the share of the examples, taken from the end, kept for validation)"
        )
    leaves = tf.nest.flatten(examples)
    num_examples = len(leaves[0])
    split_at = int(math.floor(num_examples * (1.0 - validation_split)))
    if split_at in (0, num_examples):
        raise UsageError(
            f"validation_split={validation_split} leaves no example on one side of "
            f"{num_examples}, expected at least one to train on and one to validate; "
            f"provide more data or change validation_split"
        )
    train = tf.nest.map_structure(lambda leaf: leaf[:split_at], examples)
    held_out = tf.nest.map_structure(lambda leaf: leaf[split_at:], examples)
    return train, held_out


@dataclasses.dataclass(frozen=True)
class FitInputs:
    """What `fit` trains and validates on, from `keras.Model.fit`'s arguments.

    Attributes:
        training: The training arrays, or None for a `tf.data.Dataset`.
        validation_data: What `model.fit` takes as `validation_data`: a
            dataset (validation arrays batched by the validation batch size)
            or None.
    """

    training: FitArrays | None
    validation_data: object = None


def fit_inputs(
    x,
    y=None,
    *,
    batch_size: int | None = None,
    shuffle: bool = True,
    sample_weight=None,
    validation_split: float = 0.0,
    validation_data=None,
    validation_batch_size: int | None = None,
    seed: int | None = None,
) -> FitInputs:
    """Keras's `fit` arguments as tfdist's inputs; a form it cannot resume gets one line.

    Args:
        x, y, batch_size, shuffle, sample_weight, validation_split,
            validation_data, validation_batch_size: As in `keras.Model.fit`
            (`shuffle` is ignored for a dataset, as Keras ignores it).
        seed: Fixes each epoch's permutation of arrays; None: TensorFlow's
            global seed (`keras.utils.set_random_seed`), else a fixed default.

    Raises:
        UsageError: An unsupported form, or an argument Keras would refuse.
    """
    refuse_unsupported(x)
    if isinstance(x, tf.data.Dataset):
        for name, value in (
            ("y", y),
            ("sample_weight", sample_weight),
            ("batch_size", batch_size),
        ):
            if value is not None:
                raise UsageError(
                    f"tfdist.resumable.fit: {name}=... is given with a tf.data.Dataset x, "
                    f"which already holds batches of (features, labels[, weights]); "
                    f"remove {name}, or pass NumPy arrays as x"
                )
        if validation_split:
            raise UsageError(
                f"tfdist.resumable.fit: validation_split={validation_split} needs arrays, "
                f"but x is a tf.data.Dataset; pass validation_data=a dataset instead"
            )
        return FitInputs(None, _validation(validation_data, validation_batch_size or batch_size))
    if y is not None and not is_arrays(y):
        refuse_unsupported(y, "y")
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    examples = as_numpy(examples_of(x, y, sample_weight))
    if validation_split and validation_data is None:
        examples, validation_data = split_for_validation(examples, validation_split)
    seed = default_seed() if seed is None else seed
    training = FitArrays(examples, batch_size=batch_size, shuffle=shuffle, seed=seed)
    return FitInputs(training, _validation(validation_data, validation_batch_size or batch_size))


def default_seed() -> int:
    """TensorFlow's global seed (set by `keras.utils.set_random_seed`), else its fixed default.

    Read without drawing an operation seed, so the program's own random ops
    are unchanged; the same in every worker and restart of the same script.
    """
    return int(tf.compat.v1.random.get_seed(0)[0])


def _validation(validation_data, batch_size: int | None):
    """`validation_data` for `model.fit`: arrays become a dataset of batches; None stays."""
    if validation_data is None or isinstance(validation_data, tf.data.Dataset):
        return validation_data
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise UsageError(
            f"validation_data is a {type(validation_data).__name__}, expected a "
            f"tf.data.Dataset or a tuple (x_val, y_val[, val_sample_weight]) of arrays"
        )
    for part in validation_data:
        if part is not None:
            refuse_unsupported(part, "validation_data")
    arrays = FitArrays(
        tuple(validation_data),
        batch_size=DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
        shuffle=False,
    )
    return arrays.evaluation_batches()
