"""Measures training throughput the way `summary.json` reports it."""

import time

import keras


class ThroughputMeter(keras.callbacks.Callback):
    """Counts global examples over the wall time of training steps.

    The first step of the run is left out: it includes tracing. Time spent in
    validation and between epochs is not counted.
    """

    def __init__(self, *, global_batch_size: int, steps_per_execution: int = 1):
        super().__init__()
        self._examples_per_call = global_batch_size * steps_per_execution
        self._timed_seconds = 0.0
        self._timed_examples = 0
        self._epoch_clock = None
        self._seen_first_call = False

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._epoch_clock is not None:
            self._timed_seconds += now - self._epoch_clock
            self._timed_examples += self._examples_per_call
        self._seen_first_call = True
        self._epoch_clock = now

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_clock = time.perf_counter() if self._seen_first_call else None

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_clock = None

    @property
    def examples_per_second(self) -> float:
        """Measured throughput; 0.0 when fewer than two steps ran."""
        if not self._timed_seconds:
            return 0.0
        return self._timed_examples / self._timed_seconds
