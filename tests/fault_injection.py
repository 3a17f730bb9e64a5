"""Keras callbacks that break a run on purpose (not a test module)."""

import keras


class CrashAfterBatches(keras.callbacks.Callback):
    """Raises after `at` batches of this process, like a crash mid-epoch."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            raise RuntimeError("simulated crash")
