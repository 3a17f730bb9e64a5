"""Keras callbacks that break a run on purpose (not a test module)."""

import os
import signal

import keras


class AfterBatches(keras.callbacks.Callback):
    """Calls `act()` once, at the end of this process's `at`-th batch."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            self.act()

    def act(self) -> None:
        raise NotImplementedError


class CrashAfterBatches(AfterBatches):
    """Raises after `at` batches of this process, like a crash mid-epoch."""

    def act(self) -> None:
        raise RuntimeError("simulated crash")


class KillAfterBatches(AfterBatches):
    """Kills its own process with SIGKILL after `at` batches of this process (kill -9).

    Put it first among the callbacks: the kill lands at the end of that step,
    before any other callback sees it (no backup of it, no log row).
    """

    def act(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)
