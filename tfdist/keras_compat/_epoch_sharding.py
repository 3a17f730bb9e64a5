"""How each worker reads a user's `tf.data.Dataset` given to Keras `fit`/`evaluate`/`predict`.

Keras hands the dataset to `strategy.experimental_distribute_dataset`, whose
default `AUTO` policy shards by file and, with fewer files than workers,
fails at the first read ("Could not apply FILE based sharding: the dataset
only has 1 file(s)"). Under a multi-worker strategy, when the user did not
choose a policy, tfdist chooses one that reads each example once per epoch:

| the pipeline | training | evaluation |
|---|---|---|
| reads >= 1 file per worker | by file (TensorFlow's `FILE`) | by file |
| fewer files, a chain of per-element ops after its reader | `DATA`: every worker decodes each global batch and keeps its part (== one process) | by record after the reader: each worker decodes only its records |
| anything else (no files, `from_generator`, ...) | `DATA` | `DATA` |

`predict` keeps `DATA` unless the files suffice (rows in input order). A
dataset with a `worker_shard(num_workers, index)` attribute (tfdist's own
evaluation batches of a random-access source) is evaluated from that. Each
choice is logged once per process.
"""

import logging

import tensorflow as tf

from tfdist.keras_compat import _record_sharding

_log = logging.getLogger(__name__)
_Policy = tf.data.experimental.AutoShardPolicy

TRAINING, EVALUATION, PREDICTION = "training", "evaluation", "prediction"
_logged: set[str] = set()


def role_of(iterator_kwargs: dict) -> str:
    """Which split Keras builds an epoch iterator for, from the arguments it passes.

    Keras 3.15's `fit` passes `class_weight` for the training data only;
    evaluation iterators (`fit`'s validation data, `evaluate`) pass `y`;
    `predict` passes neither.
    """
    if "class_weight" in iterator_kwargs:
        return TRAINING
    if "y" in iterator_kwargs:
        return EVALUATION
    return PREDICTION


def _with_policy(dataset: tf.data.Dataset, policy) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def _say_once(message: str) -> None:
    if message in _logged:
        return
    _logged.add(message)
    _log.info(message)


def worker_dataset(dataset: tf.data.Dataset, *, role: str, num_workers: int, worker_index: int):
    """`dataset` with the sharding this worker applies (see the module docstring).

    Returns the dataset itself when the user chose a policy, and when the
    pipeline reads at least a file per worker (TensorFlow shards it by file).
    """
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if policy == _Policy.OFF and not _record_sharding.shards_itself(dataset):
        message = (
            f"The {role} data's auto_shard_policy is OFF and it does not shard itself: each "
            f"of the {num_workers} workers reads all of it, so an epoch sees every example "
            f"{num_workers} times (the steps of one process at 1/{num_workers} of the batch); "
            f"leave the policy unset to have each example once."
        )
        if message not in _logged:
            _logged.add(message)
            _log.warning(message)
    if policy != _Policy.AUTO:
        return dataset
    worker_shard = getattr(dataset, "worker_shard", None)
    if role == EVALUATION and worker_shard is not None:
        _say_once(
            f"The {role} data is a tfdist.data source: each of the {num_workers} workers reads "
            f"and decodes only its share."
        )
        return _with_policy(worker_shard(num_workers, worker_index), _Policy.OFF)
    if _record_sharding.enough_files_to_shard(dataset, num_workers):
        _say_once(f"The {role} data is sharded by file among {num_workers} workers.")
        return dataset
    if role == EVALUATION:
        mine = _record_sharding.shard_by_record(dataset, num_workers, worker_index)
        if mine is not None:
            _say_once(
                f"The {role} data reads fewer files than the {num_workers} workers: each worker "
                f"reads every record and decodes only its own share (sharded by record)."
            )
            return _with_policy(mine, _Policy.OFF)
    _say_once(
        f"The {role} data reads fewer files than the {num_workers} workers (or none): every "
        f"worker decodes each whole global batch and keeps its part (the DATA shard policy); "
        f"give it at least {num_workers} files so that each worker decodes only its own "
        f"(docs/data.md)."
    )
    return _with_policy(dataset, _Policy.DATA)
