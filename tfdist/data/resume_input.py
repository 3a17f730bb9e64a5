"""A user's own training dataset, resumed from its saved iterator position.

`ResumableInput` wraps the `tf.data.Dataset` given to `tfdist.resumable.fit`
(and the trainer's stream of a task's own dataset, which never ends: `endless`):

- a finite dataset of known length becomes one stream across epochs
  (`repeat()`, `steps_per_epoch` = its length), so that the epoch count and a
  reshuffling shuffle's seed state live in one iterator's state;
- `experimental_symbolic_checkpoint` is set when no op of the pipeline holds a
  buffer and one replica reads it (several add a `RebatchDataset`, which has no
  symbolic checkpoint in TF 2.21): positions only, a few KB; otherwise the ops
  that hold a buffer are named in the log with the state's size;
- with every backup each worker's iterator state (`tfdist.keras_compat`'s
  `TrainingInput`) is gathered to the chief and committed in the same backup,
  under the same checksums, as `input-worker-<k>.state`; a backup missing one
  is unusable (the restore falls back to the previous backup);
- on restart each worker restores its own state: it decodes what its
  remaining steps need plus what its buffers refill, nothing it skipped.

Where that does not hold, one line says so at the first backup and a restart
skips the batches already taken (`dataset.skip`, which decodes them): a
`from_generator` pipeline (Python state), a state above `max_state_bytes`,
a restart on another number of workers. Where the position is restored but a
later pass may not be the uninterrupted run's, one line says so too (measured
on TF 2.21):

- an unseeded shuffle (no op seed, no global seed): the seeds of later passes
  come from the operating system (at the first backup);
- a reshuffling shuffle before a batch that ends each pass partial
  (`timeseries_dataset_from_array`): a state saved at that batch holds no
  seed state of the shuffle (at the first backup when the pass's length is
  known, else at the first backup whose state lacks it);
- shuffle seeds other than the backed-up run's (a seed drawn from NumPy by
  `image_dataset_from_directory(seed=None)` and its kin): at the restart,
  where it is first visible.

`fit(class_weight=...)` is saved as any other pipeline: the recorded iterator
is the one over Keras's class-weight map of the dataset.
"""

import json
import logging

import tensorflow as tf

from tfdist import keras_compat
from tfdist.errors import UsageError

__all__ = ["DEFAULT_MAX_STATE_BYTES", "state_file", "ResumableInput"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_STATE_BYTES = 128 << 20
# Why a state can lack a reshuffle's seed state, and the fix, in `fit`'s pipelines.
_PARTIAL_LAST_BATCH = (
    "saved after a pass's partial last batch, TF 2.21",
    "batch with drop_remainder=True, give a pass a whole number of batches, or "
    "shuffle with reshuffle_each_iteration=False.",
)


def _size(count: int) -> str:
    if count < 10_000:
        return f"{count} bytes"
    if count < 10 << 20:
        return f"{count / 1024:.1f} KB"
    return f"{count / (1 << 20):.1f} MB"


def state_file(worker_index: int) -> str:
    """The file of worker `worker_index`'s iterator state in a backup (beside the checkpoint)."""
    return f"input-worker-{worker_index}.state"


class ResumableInput:
    """The training dataset of `tfdist.resumable.fit` and its saved position.

    Args:
        dataset: The user's dataset of batches.
        steps_per_epoch: As given to `fit` (None: the dataset's length).
        strategy: The strategy `fit` runs under (its workers, this one's index).
        max_state_bytes: Largest iterator state saved per worker; above it
            no state is saved and a restart skips (one line says so).
        endless: The dataset never ends, whatever tf.data's cardinality says
            (the trainer's stream of passes, a `flat_map`): it is iterated as
            it is, without `repeat()`.
        lost_seed_state: `(why, fix)` of the warning given once when a state
            holds no seed state of a reshuffling shuffle; None: its later
            passes are never drawn (the trainer caches the first pass), no
            warning.
        bound_name: What the caller calls `max_state_bytes`, in the log lines
            that name the bound (the trainer's flag).
        worker_part: `dataset` is this worker's own per-replica batches (a
            task's dataset sharded by file, each worker reading its files):
            `fit` is given it distributed by `distribute_datasets_from_function`,
            with no rebatching.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        *,
        steps_per_epoch: int | None,
        strategy=None,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        endless: bool = False,
        lost_seed_state: tuple[str, str] | None = _PARTIAL_LAST_BATCH,
        worker_part: bool = False,
        bound_name: str = "max_input_state_bytes",
    ):
        if not isinstance(max_state_bytes, int) or max_state_bytes < 0:
            raise UsageError(
                f"max_input_state_bytes is {max_state_bytes!r}, expected a whole number of "
                f"bytes >= 0 (0: never save the input position, skip on restart)"
            )
        self._worker_index, self._num_workers = keras_compat.worker_of(strategy)
        self._max_state_bytes, self._bound_name = max_state_bytes, bound_name
        self.facts = keras_compat.pipeline_facts(dataset)
        cardinality = int(dataset.cardinality())
        self.endless = endless or cardinality == int(tf.data.INFINITE_CARDINALITY)
        self.steps_per_epoch = steps_per_epoch
        if not self.endless and self._saving_possible():
            # One iterator across epochs: the epoch count and the reshuffle seeds
            # are in its state. Keras ends each epoch after `steps_per_epoch`.
            if steps_per_epoch is None and cardinality > 0:
                steps_per_epoch = cardinality
            if steps_per_epoch is None:
                steps_per_epoch = int(dataset.reduce(0, lambda count, _: count + 1))
                _log.info(
                    "The training data's length is unknown to tf.data: counted one pass "
                    "(%d batches) to iterate it as one stream across epochs; pass "
                    "steps_per_epoch=%d to fit to spare the count.",
                    steps_per_epoch,
                    steps_per_epoch,
                )
            self.steps_per_epoch = steps_per_epoch
            dataset = dataset.repeat()
            self.endless = True
        # Several replicas put a RebatchDataset after the pipeline, which has no symbolic
        # checkpoint ("RebatchDataset does not support symbolic checkpointing", TF 2.21).
        replicas = 1 if strategy is None else int(strategy.num_replicas_in_sync)
        self.symbolic = not self.facts.buffers and (replicas == 1 or worker_part)
        self._strategy = strategy if worker_part else None
        options = tf.data.Options()
        options.experimental_symbolic_checkpoint = self.symbolic
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        self.dataset = dataset.with_options(options)
        self._compat = keras_compat.TrainingInput(self.dataset)
        self._said = False
        self._said_next_pass = lost_seed_state is None
        self._lost_seed_state = lost_seed_state or _PARTIAL_LAST_BATCH
        self._saving = self._saving_possible()

    def _saving_possible(self) -> bool:
        return (
            self._max_state_bytes > 0
            and keras_compat.input_state_supported()
            and "GeneratorDataset" not in self.facts.python_state
        )

    # ---------------------------------------------------------------- fit

    def capture(self):
        """Wrap every `fit` call over `self.dataset` in it."""
        return self._compat.capture()

    def dataset_for(self, skip: int):
        """What a `fit` call reads: the dataset, `skip` batches skipped (0: the restored stream).

        A `worker_part` comes back distributed.
        """
        dataset = self.dataset.skip(skip) if skip else self.dataset
        if self._strategy is not None:
            part = dataset
            dataset = self._strategy.distribute_datasets_from_function(lambda _context: part)
        self._compat.dataset = dataset
        return dataset

    def carry_over(self) -> None:
        """The next `fit` call's iterator continues where this one's stopped."""
        if self._compat.savable:
            self._compat.restore_into_next(self._compat.state())

    def training_started(self) -> None:
        self._compat.training_started()

    # ------------------------------------------------------------- backup

    def _say_once(self, level, message: str) -> None:
        _log.log(level, message)

    def backup(self, sync) -> tuple[dict, dict | None]:
        """Every worker's iterator state for the backup; every worker calls it.

        Returns:
            The files (name to bytes) and the metadata entry, or `({}, None)`
            when no state is saved.
        """
        first = not self._said
        self._said = True
        if not self._saving:
            if first and self._max_state_bytes == 0:
                _log.info(
                    "Not backing up the training data's position (%s is 0): a restart skips "
                    "the batches already taken, decoding them again.",
                    self._bound_name,
                )
            elif first:
                _log.warning(
                    "The training data cannot be restored to its position: %s holds Python "
                    "state (from_generator); a restart skips the batches already taken, "
                    "reading them again, and equals the uninterrupted run only if the "
                    "generator yields the same batches again.",
                    ", ".join(self.facts.python_state),
                )
            return {}, None
        state, refused = b"", ""
        if self._compat.savable:
            try:
                state = self._compat.state()
            except tf.errors.OpError as error:  # an op TensorFlow cannot checkpoint
                refused = str(error.message).splitlines()[0]
        sizes = sync.gather(len(state) if self._compat.savable and not refused else -1)
        if min(sizes) < 0:
            if first:
                _log.warning(
                    "The training data's iterator state could not be saved on every worker "
                    "(%s); a restart skips the batches already taken.",
                    refused or "no iterator recorded",
                )
            return {}, None
        largest = max(sizes)
        if largest > self._max_state_bytes:
            if first:
                _log.warning(
                    "The training data's iterator state is %s per worker (%s), above the "
                    "bound of %s (%s): not saved; a restart skips the "
                    "batches already taken, decoding them again. Shuffle encoded records "
                    "before decoding them, use a smaller buffer, or raise the bound.",
                    _size(largest),
                    self._buffers_text(),
                    _size(self._max_state_bytes),
                    self._bound_name,
                )
            return {}, None
        if first:
            self._describe(largest)
        self._check_next_pass(state, first)
        states = sync.gather_bytes(state)
        files = {state_file(index): data for index, data in enumerate(states)}
        # Per worker: a worker's own part of the data (its files) has its own seeds.
        seeds = sync.gather_bytes(json.dumps(self._shuffle_seeds()).encode())
        metadata = {
            "workers": len(states),
            "files": sorted(files),
            "symbolic": self.symbolic,
            "worker_shuffle_seeds": [json.loads(data) for data in seeds],
        }
        return files, metadata

    def _shuffle_seeds(self) -> list[list[int]]:
        return [list(seeds) for seeds in self.facts.shuffle_seeds]

    def _check_next_pass(self, state: bytes, first: bool) -> None:
        """Says once when a restart may shuffle a later pass otherwise than the run did."""
        if self._said_next_pass or not self.facts.reshuffles:
            return
        shuffle = next((op for op in self.facts.buffers if op.startswith("Shuffle")), "the shuffle")
        why, fix = self._lost_seed_state
        if first and self.facts.partial_passes:
            per_pass, batch = self.facts.partial_passes[0]
            _log.warning(
                "The training data's later passes may not resume exactly: %s reshuffles each "
                "pass and the batch after it ends each pass of %d examples with a partial "
                "batch of %d; a backup taken at that batch holds no seed state of the shuffle "
                "(TF 2.21), so a restart from it may differ from the uninterrupted run from "
                "the next pass on; %s",
                shuffle,
                per_pass,
                per_pass % batch,
                fix,
            )
        elif not keras_compat.holds_shuffle_seed_state(state, self.facts.reshuffles):
            _log.warning(
                "The training data's position in this backup holds no seed state of %s (%s): "
                "a restart from it may differ from the uninterrupted run from the next pass "
                "on; %s",
                shuffle,
                why,
                fix,
            )
        else:
            return
        self._said_next_pass = True

    def _buffers_text(self) -> str:
        if not self.facts.buffers:
            return "several replicas rebatch it (RebatchDataset has no symbolic checkpoint)"
        counts: dict[str, int] = {}
        for op in self.facts.buffers:
            counts[op] = counts.get(op, 0) + 1
        names = ", ".join(f"{op}" + (f" x{n}" if n > 1 else "") for op, n in counts.items())
        return f"buffers held by {names}"

    def _describe(self, largest: int) -> None:
        if self.symbolic:
            _log.info(
                "Backing up the training data's position with every backup (symbolic "
                "checkpoint, positions only): %s per worker.",
                _size(largest),
            )
        else:
            _log.info(
                "Backing up the training data's iterator state with every backup: %s per "
                "worker, not symbolic: %s (bound %s, %s).",
                _size(largest),
                self._buffers_text(),
                _size(self._max_state_bytes),
                self._bound_name,
            )
        if self.facts.unseeded_shuffles:
            _log.warning(
                "The training data shuffles without a seed (%d shuffle op(s), no global "
                "seed): a restart resumes the interrupted epoch exactly, but later epochs "
                "are reshuffled with new random seeds, so it differs from an uninterrupted "
                "run; build the dataset after tfdist.resumable.strategy_from_environment() "
                "(which sets a global seed when none is set) or pass shuffle(..., seed=N).",
                self.facts.unseeded_shuffles,
            )
        if self.facts.python_state:
            _log.warning(
                "The training data calls Python (%s): its position is restored, but any "
                "state the Python function keeps between calls is not.",
                ", ".join(self.facts.python_state),
            )

    # ------------------------------------------------------------ restore

    def restore_from(self, backup_path: str | None, metadata) -> bool:
        """Restores this worker's position from the backup; False: the caller skips.

        Every worker decides alike from the backup's metadata (no collective).
        """
        if not backup_path:
            return False
        if not metadata:
            _log.warning(
                "The backup holds no position of the training data; skipping the batches "
                "already taken (decoding them again)."
            )
            return False
        if metadata.get("workers") != self._num_workers:
            _log.warning(
                "The backup holds the training data's position of %s workers, this job has "
                "%d: skipping the batches already taken instead (decoding them again).",
                metadata.get("workers"),
                self._num_workers,
            )
            return False
        saved_seeds = metadata.get("worker_shuffle_seeds")  # absent in older backups: no comparison
        self._compare_seeds(None if saved_seeds is None else saved_seeds[self._worker_index])
        with tf.io.gfile.GFile(f"{backup_path}/{state_file(self._worker_index)}", "rb") as handle:
            self._compat.restore_into_next(handle.read())
        return True

    def _compare_seeds(self, saved) -> None:
        """Says so when this run's shuffle seeds are not the backed-up run's (None: an old backup)."""
        current = self._shuffle_seeds()
        if saved is None or saved == current:
            return
        _log.warning(
            "The training data's shuffle seeds differ from the backed-up run's (%s then, %s "
            "now): a seed drawn at random when the dataset was built (keras.utils."
            "image_dataset_from_directory, text_dataset_from_directory and "
            "timeseries_dataset_from_array with seed=None draw it from NumPy) gives the "
            "restart another order than the uninterrupted run; pass seed=N, or call "
            "keras.utils.set_random_seed(N) before building the dataset.",
            saved,
            current,
        )
