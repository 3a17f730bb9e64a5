"""What a task may hand tfdist instead of a `tf.data.Dataset`: cheap records plus a preprocess.

After Grain (a random-access source, an index sampler, transformations applied
per example after sampling) and Model Garden's `input_reader.py` (files sharded
per input pipeline, decoding after shuffling records). tfdist decides the order
and the sharding on *records*; the task's `preprocess` runs only on the
examples this worker's replicas consume.

    class ImagesTask(tfdist.tasks.Task):
        def build_inputs(self, training):
            return tfdist.data.FileSource("gs://bucket/train-*.tfrecord", preprocess=decode)

Kinds:

- `RandomAccessSource(records, preprocess)`: anything with `__len__` and
  `__getitem__` (ArrayRecord, `tfds.data_source`, a Grain source, a list).
  Each pass is a seeded permutation of indices; every worker reads only the
  indices of its replicas; the global batch at step `s` is the one a single
  process would read; a resume at step `s` is index arithmetic.
- `ArraySource(arrays, preprocess)`: in-memory NumPy arrays, random access.
- `FileSource(files, preprocess, reader)`: record files without random access
  (TFRecord, text lines). Files are sharded per worker when there are at least
  as many files as workers; records are shuffled in a window bounded in bytes;
  a resume skips records, never decodes them. The order depends on the number
  of workers (a restart with another worker count is refused).

No TensorFlow is imported here: these are option bundles, checked when made.
"""

import dataclasses
import numbers
import os
from typing import Any, Callable, Sequence

from tfdist.errors import UsageError

__all__ = [
    "DEFAULT_SHUFFLE_BYTES",
    "DECODED_SHUFFLE_BYTES",
    "READERS",
    "RandomAccessSource",
    "ArraySource",
    "FileSource",
    "Source",
    "RANDOM_ACCESS",
    "is_source",
]

# The default byte budget of a file source's shuffle window of encoded records (measured:
# 64 MiB let peak memory grow 11% from 10k to 1M examples, 32 MiB 5%).
DEFAULT_SHUFFLE_BYTES = 32 * 2**20
# The same for a window of decoded examples (a task's own dataset).
DECODED_SHUFFLE_BYTES = 16 * 2**20
READERS = ("tfrecord", "text")


def _check_preprocess(preprocess, kind: str) -> None:
    if preprocess is not None and not callable(preprocess):
        raise UsageError(
            f"{kind}(preprocess=...) is a {type(preprocess).__name__}, expected a "
            f"function from one record to (features, labels[, sample_weights])"
        )


def _check_bytes(name: str, value) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{name} is {value!r}, expected a positive number of bytes")


@dataclasses.dataclass(frozen=True)
class RandomAccessSource:
    """Records read by index, shuffled by a seeded permutation per pass.

    Attributes:
        records: `len(records)` records; `records[i]` returns a record:
            bytes, a NumPy array, or a tuple/dict of them. Read on the
            worker's own host, in Python (so not under parameter-server
            training, whose workers run graphs only).
        preprocess: A TensorFlow function from one record (as tensors) to
            `(features, labels[, sample_weights])`; None when the records are
            already such tuples.
        name: What identifies the data in the backup's fingerprint.
        batched_reads: Read a step's records with one
            `records.__getitems__(indices)` call. Off by default: ArrayRecord's
            starts a thread pool per call (measured 75 ms of CPU per 1,000
            random records against 9 ms read one at a time).
    """

    records: Any
    preprocess: Callable | None = None
    name: str = ""
    batched_reads: bool = False

    def __post_init__(self):
        if not (hasattr(self.records, "__len__") and hasattr(self.records, "__getitem__")):
            raise UsageError(
                f"RandomAccessSource(records=...) is a {type(self.records).__name__}, expected "
                f"an object with __len__ and __getitem__ (ArrayRecord, tfds.data_source, a "
                f"Grain source); use FileSource for files without random access"
            )
        _check_preprocess(self.preprocess, "RandomAccessSource")

    def __len__(self) -> int:
        return len(self.records)

    def read(self, indices: Sequence[int]) -> list:
        """The records at `indices`, in that order (one batched read when the source has it)."""
        getitems = getattr(self.records, "__getitems__", None)
        if self.batched_reads and getitems is not None:
            return list(getitems([int(i) for i in indices]))
        return [self.records[int(i)] for i in indices]


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """In-memory arrays: example `i` is `tuple(array[i] for array in arrays)`.

    Attributes:
        arrays: NumPy arrays of one length: `(features, labels)` or
            `(features, labels, sample_weights)`, each of which may also be a
            dict of arrays.
        preprocess: A TensorFlow function applied to each example after
            sampling (augmentation, casting); None for none.
        name: What identifies the data in the backup's fingerprint.
    """

    arrays: tuple
    preprocess: Callable | None = None
    name: str = ""

    def __post_init__(self):
        import numpy as np  # pylint: disable=g-import-not-at-top

        if not isinstance(self.arrays, (tuple, list)) or len(self.arrays) not in (2, 3):
            raise UsageError(
                f"ArraySource(arrays=...) is a {type(self.arrays).__name__}, "
                f"expected a tuple (features, labels[, sample_weights])"
            )
        lengths = {len(leaf) for leaf in _leaves(self.arrays)}
        if len(lengths) != 1:
            raise UsageError(
                f"ArraySource arrays have lengths {sorted(lengths)}, expected one "
                f"length: example i is element i of every array"
            )
        object.__setattr__(self, "arrays", tuple(self.arrays))
        for leaf in _leaves(self.arrays):
            if not isinstance(leaf, np.ndarray):
                raise UsageError(
                    f"ArraySource holds a {type(leaf).__name__}, expected NumPy "
                    f"arrays (np.asarray them first)"
                )
        _check_preprocess(self.preprocess, "ArraySource")

    def __len__(self) -> int:
        return len(next(iter(_leaves(self.arrays))))

    def read(self, indices) -> tuple:
        """The examples at `indices`, stacked (one fancy-indexing read per array)."""
        return _map_leaves(lambda array: array[indices], self.arrays)


@dataclasses.dataclass(frozen=True)
class FileSource:
    """Record files read in sequence: TFRecord (default), text lines, or a reader of your own.

    Attributes:
        files: A glob pattern, a path, or a list of them; `gs://` and Vertex's
            `/gcs/` mount work through TensorFlow's file systems.
        preprocess: A TensorFlow function from one record (a scalar string) to
            `(features, labels[, sample_weights])`.
        reader: `"tfrecord"`, `"text"`, or a function from a file path (a
            string tensor) to a `tf.data.Dataset` of records.
        compression: TFRecord compression: `""`, `"GZIP"` or `"ZLIB"`.
        shuffle_bytes: The shuffle window's budget, in bytes of records.
        name: What identifies the data in the backup's fingerprint.
    """

    files: str | Sequence[str]
    preprocess: Callable | None = None
    reader: str | Callable = "tfrecord"
    compression: str = ""
    shuffle_bytes: int = DEFAULT_SHUFFLE_BYTES
    name: str = ""

    def __post_init__(self):
        patterns = [self.files] if isinstance(self.files, (str, os.PathLike)) else self.files
        if not patterns or not all(isinstance(p, (str, os.PathLike)) for p in patterns):
            raise UsageError(
                f"FileSource(files=...) is {self.files!r}, expected a path, a glob "
                f"pattern or a list of them"
            )
        object.__setattr__(self, "files", tuple(os.fspath(p) for p in patterns))
        if not callable(self.reader) and self.reader not in READERS:
            raise UsageError(
                f"FileSource(reader=...) is {self.reader!r}, expected one of "
                f"{', '.join(READERS)} or a function path -> tf.data.Dataset"
            )
        if self.compression not in ("", "GZIP", "ZLIB"):
            raise UsageError(
                f"FileSource(compression=...) is {self.compression!r}, expected "
                f"'', 'GZIP' or 'ZLIB'"
            )
        _check_preprocess(self.preprocess, "FileSource")
        _check_bytes("FileSource(shuffle_bytes=...)", self.shuffle_bytes)

    def paths(self) -> list[str]:
        """The matched files, sorted (the same list on every worker).

        Raises:
            UsageError: A pattern matches nothing.
        """
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        matched = set()
        for pattern in self.files:
            found = (
                tf.io.gfile.glob(pattern)
                if _is_glob(pattern)
                else ([pattern] if tf.io.gfile.exists(pattern) else [])
            )
            if not found:
                raise UsageError(
                    f"FileSource file pattern {pattern!r} matches no file; "
                    f"expected existing record files (check the path and the "
                    f"bucket's permissions)"
                )
            matched.update(found)
        return sorted(matched)


Source = RandomAccessSource | ArraySource | FileSource
RANDOM_ACCESS = (RandomAccessSource, ArraySource)


def is_source(value) -> bool:
    return isinstance(value, (RandomAccessSource, ArraySource, FileSource))


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def _leaves(structure):
    if isinstance(structure, dict):
        for key in sorted(structure):
            yield from _leaves(structure[key])
    elif isinstance(structure, (tuple, list)):
        for item in structure:
            yield from _leaves(item)
    else:
        yield structure


def _map_leaves(function, structure):
    if isinstance(structure, dict):
        return {key: _map_leaves(function, value) for key, value in structure.items()}
    if isinstance(structure, (tuple, list)):
        return tuple(_map_leaves(function, item) for item in structure)
    return function(structure)
