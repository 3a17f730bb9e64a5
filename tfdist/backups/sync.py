"""Small cross-worker agreements between training steps.

Under a multi-worker `MultiWorkerMirroredStrategy` every worker must take the
same decisions at the same step (save now, stop now, which backup was
restored), or the workers' collectives stop matching and the job hangs. These
helpers gather one number from every worker with one collective; every worker
must call them at the same point, in the same order. In a single process they
cost nothing.
"""

import numpy as np
import tensorflow as tf

__all__ = ["WorkerSync"]


class WorkerSync:
    """Gathers one integer from each worker of a synchronous job.

    Args:
        strategy: The strategy training runs under; `None` for one process.
    """

    def __init__(self, strategy: tf.distribute.Strategy | None = None):
        self._strategy = strategy
        self._local_replicas = 1
        self.is_multi_worker = False
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self._local_replicas = max(1, len(strategy.extended.worker_devices))
            self.is_multi_worker = strategy.num_replicas_in_sync > self._local_replicas
        self._gather_fn = tf.function(self._gather_replicas) if self.is_multi_worker else None
        self._gather_bytes_fn = (
            tf.function(self._gather_rows, reduce_retracing=True) if self.is_multi_worker else None
        )

    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        """The strategy the workers train under (`None` for one process)."""
        return self._strategy

    @property
    def num_workers(self) -> int:
        if not self.is_multi_worker:
            return 1
        return self._strategy.num_replicas_in_sync // self._local_replicas

    def _gather_replicas(self, value):
        def replica_fn(local_value):
            context = tf.distribute.get_replica_context()
            return context.all_gather(tf.reshape(local_value, [1]), axis=0)

        gathered = self._strategy.run(replica_fn, args=(value,))
        return self._strategy.experimental_local_results(gathered)[0]

    def _gather_rows(self, row):
        def replica_fn(local_row):
            context = tf.distribute.get_replica_context()
            return context.all_gather(tf.expand_dims(local_row, 0), axis=0)

        gathered = self._strategy.run(replica_fn, args=(row,))
        return self._strategy.experimental_local_results(gathered)[0]

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every worker's `data`, in worker order; collective calls (two).

        The lengths are gathered first, then every worker's bytes padded to
        the longest: each worker holds `num_workers` times the longest.
        """
        if not self.is_multi_worker:
            return [bytes(data)]
        lengths = self.gather(len(data))
        longest = -(-max(max(lengths), 1) // 4) * 4  # collectives gather int32, not bytes
        padded = np.frombuffer(bytes(data) + b"\0" * (longest - len(data)), dtype="<i4")
        rows = self._gather_bytes_fn(tf.constant(padded)).numpy()[:: self._local_replicas]
        return [
            rows[index].astype("<i4").tobytes()[:length] for index, length in enumerate(lengths)
        ]

    def gather(self, value: int) -> list[int]:
        """Every worker's `value`, in worker order; a collective call."""
        if not self.is_multi_worker:
            return [int(value)]
        gathered = self._gather_fn(tf.constant(int(value), dtype=tf.int64)).numpy()
        # Replicas of one worker are adjacent and all carry the worker's value.
        return [int(item) for item in gathered[:: self._local_replicas]]

    def any(self, flag: bool) -> bool:
        """Whether any worker passed `True`; a collective call."""
        return any(self.gather(1 if flag else 0))

    def barrier(self) -> None:
        """Returns once every worker has reached it."""
        self.gather(0)
