"""How far each parameter-server worker has read its own input stream, and streams that start there.

Steps go to whichever worker is free, so workers do not advance at the same
pace, and a resume that assumed so would replay one worker's batches and skip
another's. `WorkerPositions` counts, on the parameter servers, the batches each
worker has consumed: every scheduled train function adds its step count to the
slot of the worker that ran it (`experimental_get_current_worker_index()`),
after its steps, so a step lost with a failed worker is not counted. It is a
variable like the weights, so a backup holds it in the same checkpoint, and a
restart starts each worker where it stood.

`per_worker_dataset_fn` gives each worker the stream `make_batches(worker,
first_batch)` of its own index, from the position it had when `fit` began. (A
worker restarted by the `ClusterCoordinator` while a `fit` runs re-reads its
stream from that position; the job's next restart resumes from the counts.)
"""

from typing import Callable, Sequence

import tensorflow as tf

__all__ = ["WorkerPositions", "per_worker_dataset_fn"]


class WorkerPositions:
    """Batches each worker has consumed, kept on the parameter servers.

    Args:
        strategy: The `ParameterServerStrategy` (the counts are created in its scope).
        num_workers: Workers that take steps.
    """

    def __init__(self, strategy: tf.distribute.Strategy, num_workers: int):
        self.num_workers = int(num_workers)
        with strategy.scope():
            self.variable = tf.Variable(
                tf.zeros([self.num_workers], tf.int64),
                trainable=False,
                name="tfdist_worker_positions",
            )

    def advance(self, num_steps) -> None:
        """Adds `num_steps` to the running worker's count; call inside a scheduled function."""
        index = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
        self.variable.scatter_add(
            tf.IndexedSlices(tf.reshape(tf.cast(num_steps, tf.int64), [1]), tf.reshape(index, [1]))
        )

    def read(self) -> list[int]:
        """Each worker's count (read on the coordinator)."""
        return [int(value) for value in self.variable.numpy()]


def per_worker_dataset_fn(
    make_batches: Callable[[int, int], tf.data.Dataset],
    first_batches: Sequence[int],
    sample: Callable[[], tf.data.Dataset] | None = None,
) -> Callable:
    """`input_context -> dataset`: on worker `w`, `make_batches(w, first_batches[w])`.

    The worker index is known only when the function runs on a worker, as a
    tensor: the dataset is chosen by `tf.switch_case` among one pipeline per
    worker (only the chosen one is created). Called outside a worker (the
    coordinator's look at one batch, to build the variables), it is
    `sample()`, or worker 0's stream without one.
    """
    starts = [int(start) for start in first_batches]

    def dataset_fn(input_context=None):
        del input_context  # Parameter-server input contexts do not tell workers apart.
        if not tf.inside_function():
            return sample() if sample is not None else make_batches(0, starts[0])
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        return tf.switch_case(
            tf.cast(index, tf.int32),
            [
                (lambda worker=worker, start=start: make_batches(worker, start))
                for worker, start in enumerate(starts)
            ],
        )

    return dataset_fn
